"""The cluster shape: the GPU nodes (instanceType, or own hosts' gpusPerNode and
gpuMemoryGiB), how many per gang (nodes) and how many gangs (replicas), how the model's
ranks lie over them (tensorParallelSize, pipelineParallelSize), EFA between them, and the
bus bandwidth a gang's all-reduce must reach (fabricFloorGBps).
"""

from __future__ import annotations

from dataclasses import dataclass

from components import catalog
from components.catalog import InstanceType
from components.config_keys import MAX_FABRIC_FLOOR_GBPS, MAX_REPLICAS, NAMESPACE
from components.spec.own_hosts import OwnHosts, host_instance_type, hosts_listed, own_hosts_shape
from components.spec.reader import Reader

# EFA is supported only on the instance types this page lists.
EFA_INSTANCE_TYPES_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types"


@dataclass(frozen=True)
class ClusterShape:
    """The GPU nodes and how the model's ranks are laid over them."""

    instance: InstanceType | None
    nodes: int | None
    replicas: int | None
    tensor_parallel_size: int | None
    pipeline_parallel_size: int | None
    efa: bool


def _check_instance_type(reader: Reader, own: OwnHosts | None) -> InstanceType | None:
    name = reader.string("instanceType")
    if own is not None and name is None:
        return None if reader.present("instanceType") else _own_host_type(reader)
    if own is None and name is None:
        if reader.present("instanceType"):
            return None  # of the wrong type: already a problem
        reader.fail(
            "instanceType",
            "is required: the GPU instance type of every node (or list the machines you already have in hosts). "
            f"Fix: pulumi config set {NAMESPACE}:instanceType g5.12xlarge",
        )
        return None
    for key in ("gpusPerNode", "gpuMemoryGiB"):
        # Read first: a value of the wrong type is that problem alone.
        if reader.integer(key) is not None:
            reader.fail(
                key,
                f"describes hosts of no catalog type, but instanceType is set and says it. Fix: pulumi config rm "
                f"{NAMESPACE}:{key}, or pulumi config rm {NAMESPACE}:instanceType",
            )
    instance = catalog.lookup(name)
    if name is not None and instance is None:
        reader.fail(
            "instanceType",
            f"is not in the catalog. Known types: {', '.join(catalog.known_instance_types())}. "
            "Fix: pick one, or add a row to components/catalog.py after checking it with "
            "aws ec2 describe-instance-types",
        )
    return instance


def _own_host_type(reader: Reader) -> InstanceType | None:
    """The hosts' GPUs when no catalog type describes them (gpusPerNode, gpuMemoryGiB): the
    rank layout, the engine's fit and preflight need both. No price: the stack pays for none."""
    gpus, memory = reader.integer("gpusPerNode"), reader.integer("gpuMemoryGiB")
    for key, value, example in (("gpusPerNode", gpus, 8), ("gpuMemoryGiB", memory, 80)):
        if value is None or value < 1:
            reader.fail(
                key,
                "is needed with hosts when instanceType is not set: the GPUs of each host lay out the model's "
                f"ranks, and preflight checks them. Fix: pulumi config set {NAMESPACE}:{key} {example}, or "
                f"pulumi config set {NAMESPACE}:instanceType to the catalog type with your hosts' GPUs",
                raw=value,
            )
    if gpus is None or memory is None or gpus < 1 or memory < 1:
        return None
    return host_instance_type(gpus, memory)


def _check_nodes(reader: Reader) -> int | None:
    nodes = reader.integer("nodes")
    if nodes is not None and nodes < 1:
        reader.fail("nodes", f"must be at least 1. Fix: pulumi config set {NAMESPACE}:nodes 1")
        return None
    return nodes


def _check_replicas(reader: Reader, nodes: int | None) -> int | None:
    replicas = reader.integer("replicas")
    if replicas is None:
        return None
    if not 0 <= replicas <= MAX_REPLICAS:
        reader.fail(
            "replicas",
            f"must be between 0 and {MAX_REPLICAS}: each replica is a gang of `nodes` GPU nodes serving its own "
            f"copy of the model (0: every gang may sleep, with maxReplicas and idleStopMinutes). Fix: pulumi config "
            f"set {NAMESPACE}:replicas 2",
        )
        return None
    if replicas <= 1:
        # 0 and 1: one gang's placement at most here; more gangs by maxReplicas are
        # checked with it (check_max_replicas).
        return replicas
    if reader.string("placementGroupName") is not None:
        if reader.string("capacityReservationId") is not None:
            # A reservation made in a cluster placement group serves only that group: the
            # other gangs' groups could not launch into it.
            fix = (
                f"pulumi config set {NAMESPACE}:replicas 1 (a reservation in a placement group serves that one "
                "group), or reserve capacity outside a placement group and remove placementGroupName"
            )
        else:
            fix = (
                f"pulumi config rm {NAMESPACE}:placementGroupName (the stack then makes one group per gang), "
                f"or pulumi config set {NAMESPACE}:replicas 1"
            )
        reader.fail(
            "replicas",
            f"is {replicas}, but placementGroupName names one existing group, and each gang needs a cluster "
            f"placement group of its own (a failure of one group's capacity must not take every gang). Fix: {fix}",
        )
        return None
    if reader.string("capacityReservationId") is not None:
        reader.warn(
            f"{replicas} replicas of {nodes or 1} node(s) launch into capacityReservationId: the "
            "reservation must hold every gang's nodes (nodes x replicas instances); this cannot be checked offline."
        )
    return replicas


def _check_parallel_sizes(reader: Reader) -> tuple[int | None, int | None]:
    """tensorParallelSize and pipelineParallelSize as set; None for unset (derived) or refused."""
    sizes = []
    for key in ("tensorParallelSize", "pipelineParallelSize"):
        size = reader.integer(key)
        if size is not None and size < 1:
            reader.fail(key, "must be at least 1")
            size = None
        sizes.append(size)
    return sizes[0], sizes[1]


def _check_rank_layout(
    reader: Reader, instance: InstanceType, nodes: int, tp: int | None, pp: int | None
) -> tuple[int, int]:
    """Every GPU holds one rank, and no tensor-parallel group straddles two nodes.
    Unset sizes are derived: TP the GPUs of one node, PP the number of nodes."""
    gpus = instance.gpus
    tp_value = tp if tp is not None else gpus
    pp_value = pp if pp is not None else nodes
    if tp_value > gpus:
        reader.fail(
            "tensorParallelSize",
            f"is larger than the {gpus} GPU(s) of one {instance.name}; tensor parallelism stays inside a node "
            f"(NVLink), pipeline parallelism spans nodes. Fix: tensorParallelSize {gpus}, pipelineParallelSize "
            f"{nodes}",
            raw=tp_value,
        )
    elif gpus % tp_value:
        reader.fail(
            "tensorParallelSize",
            f"must divide the {gpus} GPUs of a {instance.name} so that no tensor-parallel group straddles two "
            f"nodes. Fix: one of {', '.join(str(d) for d in range(1, gpus + 1) if gpus % d == 0)}",
            raw=tp_value,
        )
    elif tp_value * pp_value != nodes * gpus:
        need_pp = nodes * gpus // tp_value
        reader.fail(
            "pipelineParallelSize" if pp is not None else "tensorParallelSize",
            f"tensorParallelSize {tp_value} x pipelineParallelSize {pp_value} = {tp_value * pp_value} GPU(s), "
            f"but {nodes} node(s) x {gpus} GPU(s) = {nodes * gpus}: every GPU must hold one rank. "
            f"Fix: pipelineParallelSize {need_pp} with tensorParallelSize {tp_value}",
            raw=pp_value if pp is not None else tp_value,
        )
    return tp_value, pp_value


def _check_efa(reader: Reader, instance: InstanceType, nodes: int, own: OwnHosts | None) -> bool:
    """EFA where the type has it and there is traffic between nodes, unless the config says."""
    efa = reader.boolean("efa")
    if own is not None:
        # EFA is a network interface the stack attaches when it launches an instance.
        if efa:
            reader.fail(
                "efa",
                "is true, but with hosts the stack launches no instance, and EFA interfaces are attached at "
                f"launch: NCCL uses the hosts' own network. Fix: pulumi config rm {NAMESPACE}:efa",
            )
        return False
    if efa is None:
        efa = instance.efa_supported and nodes > 1
    elif efa and not instance.efa_supported:
        efa_types = [t for t in catalog.known_instance_types() if catalog.CATALOG[t].efa_supported]
        reader.fail(
            "efa",
            f"is true, but {instance.name} has no EFA. Fix: set efa false, or use one of {', '.join(efa_types)} "
            f"(EFA-capable types: {EFA_INSTANCE_TYPES_DOC})",
        )
    if nodes > 1 and not efa:
        reader.warn(
            f"{nodes} nodes without EFA: traffic between pipeline stages goes over TCP on the primary "
            f"interface, which is slower and the usual cause of multi-node hangs when the NIC is wrong. "
            f"Set {NAMESPACE}:efa true on an EFA instance type for production."
        )
    return efa


def check_cluster_shape(reader: Reader, own: OwnHosts | None) -> ClusterShape:
    if own is None and hosts_listed(reader):
        # hosts is refused (own_hosts.check_own_hosts): no shape to check it against, and no instanceType to ask for.
        return ClusterShape(None, None, None, None, None, False)
    instance = _check_instance_type(reader, own)
    if own is not None:
        nodes, replicas = own_hosts_shape(reader, own)
    else:
        nodes = _check_nodes(reader)
        replicas = _check_replicas(reader, nodes)
    tp, pp = _check_parallel_sizes(reader)
    if instance is None or nodes is None:
        # Nothing to lay the ranks over; the instance type or node count is already a problem.
        return ClusterShape(instance, nodes, replicas, tp, pp, bool(reader.boolean("efa")))
    tp, pp = _check_rank_layout(reader, instance, nodes, tp, pp)
    return ClusterShape(instance, nodes, replicas, tp, pp, _check_efa(reader, instance, nodes, own))


def check_fabric_floor(reader: Reader) -> float | None:
    """fabricFloorGBps: a bus bandwidth in GB/s above 0 and at most MAX_FABRIC_FLOOR_GBPS."""
    floor = reader.number("fabricFloorGBps")
    if floor is None:
        return None
    if not 0 < floor <= MAX_FABRIC_FLOOR_GBPS:
        reader.fail(
            "fabricFloorGBps",
            f"must be a bus bandwidth in GB/s above 0 and at most {MAX_FABRIC_FLOOR_GBPS} (GB/s, not Gbps: "
            "p5.48xlarge's 3200 Gbps is 400 GB/s). Fix: pulumi config set "
            f"{NAMESPACE}:fabricFloorGBps 12.5, or pulumi config rm {NAMESPACE}:fabricFloorGBps for the instance "
            "type's floor",
        )
        return None
    return floor
