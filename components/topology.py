"""Cluster topology as plain data: which rank runs where, how each node's network
interfaces are laid out for EFA, and how the VPC is split into subnets.

No Pulumi here: these functions decide resource counts, so they must be plain
values that tests can check without a runtime.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from components.catalog import InstanceType

HEAD = "head"
WORKER = "worker"


@dataclass(frozen=True)
class RankPlacement:
    """One vLLM worker process. vLLM numbers ranks rank = pp_rank * TP + tp_rank and
    fills nodes in order, so a TP group (consecutive ranks) stays inside one node
    when TP divides the GPUs per node, and PP stages span nodes."""

    rank: int
    node: int
    gpu: int
    tp_rank: int
    pp_rank: int


def node_role(index: int) -> str:
    return HEAD if index == 0 else WORKER


def gang_name(gang: int) -> str:
    """gang0, gang1, ...: one copy of the model (a head and its workers, one Ray cluster)."""
    return f"gang{gang}"


# A gang's role (maxReplicas, issue 36): the first `replicas` gangs always serve; the rest
# are warm, kept stopped until the gateway's waker starts one for the queue. With
# replicas 0 every gang is warm. power.json and the stack's `gangs` output name them so.
ALWAYS_ON = "always-on"
WARM = "warm"


def gang_role(gang: int, replicas: int) -> str:
    """ALWAYS_ON for the first `replicas` gangs, WARM for every gang after them."""
    return ALWAYS_ON if gang < replicas else WARM


def gang_prefix(gang: int) -> str:
    """What a gang adds in front of its nodes' and its commands' names. Gang 0 adds
    nothing: a stack of one replica keeps the names it had before replicas existed
    (head, worker-1, vllm-ray-head), so `pulumi up` replaces nothing."""
    return "" if gang == 0 else f"{gang_name(gang)}-"


def writes_wheelhouse(index: int, gang: int = 0) -> bool:
    """The one node that fills the wheelhouse on the shared cache and may write it:
    gang 0's head (its role, components/compute.py; its setup, scripts/node/node-env).
    Every other node waits for it and reads."""
    return index == 0 and gang == 0


def writes_model_tree(gang: int) -> bool:
    """Whether a gang's nodes may write the model tree and its warm-up cache on the
    shared cache: gang 0's, which download the model (stage-model) and compile first
    (keep-warmup). Every other gang reads what they wrote and writes nothing there
    (its role, components/compute.py; its mounts, scripts/node/vllm-cluster-node): a
    node that is compromised cannot swap a file or a compiled piece another loads."""
    return gang == 0


def node_name(index: int, gang: int = 0) -> str:
    """head, worker-1, worker-2, ... in gang 0; gang1-head, gang1-worker-1, ... in the
    others: stable names, unique in the stack, used for resource names too."""
    return gang_prefix(gang) + (HEAD if index == 0 else f"{WORKER}-{index}")


def rank_layout(nodes: int, gpus_per_node: int, tp: int, pp: int) -> list[RankPlacement]:
    if tp * pp != nodes * gpus_per_node:
        raise ValueError(f"TP {tp} x PP {pp} does not use {nodes} node(s) x {gpus_per_node} GPU(s) exactly")
    if gpus_per_node % tp:
        raise ValueError(f"TP {tp} does not divide the {gpus_per_node} GPUs of a node")
    placements = []
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            rank = pp_rank * tp + tp_rank
            placements.append(
                RankPlacement(
                    rank=rank,
                    node=rank // gpus_per_node,
                    gpu=rank % gpus_per_node,
                    tp_rank=tp_rank,
                    pp_rank=pp_rank,
                )
            )
    return placements


def topology_summary(
    nodes: int, gpus_per_node: int, tp: int, pp: int, replicas: int = 1, max_replicas: int | None = None
) -> dict:
    """The `topology` stack output: per node of one gang its role, GPUs, ranks and
    pipeline stages, plus the flat rank list (node 0 is the head). Every gang has the
    same layout; `replicas` says how many always serve and `gangs` names every declared
    one (the keys only with more than one gang, so a stack of one replica keeps its output
    as it was); with warm gangs (`max_replicas` above replicas) `maxReplicas` says how many
    gangs there are in all."""
    layout = rank_layout(nodes, gpus_per_node, tp, pp)
    per_node = []
    for index in range(nodes):
        ranks = [p for p in layout if p.node == index]
        per_node.append(
            {
                "node": index,
                "name": node_name(index),
                "role": node_role(index),
                "gpus": gpus_per_node,
                "ranks": [p.rank for p in ranks],
                "pipelineStages": sorted({p.pp_rank for p in ranks}),
            }
        )
    summary = {
        "tensorParallelSize": tp,
        "pipelineParallelSize": pp,
        "worldSize": tp * pp,
        "nodes": per_node,
        "ranks": [
            {"rank": p.rank, "node": p.node, "gpu": p.gpu, "tpRank": p.tp_rank, "ppRank": p.pp_rank} for p in layout
        ],
    }
    declared = replicas if max_replicas is None else max_replicas
    if declared > 1 or declared > replicas:
        summary["replicas"] = replicas
        summary["gangs"] = [gang_name(gang) for gang in range(declared)]
    if declared > replicas:
        summary["maxReplicas"] = declared
    return summary


@dataclass(frozen=True)
class InterfaceSlot:
    """One entry of a launch template's network interface list."""

    network_card_index: int
    device_index: int
    # EC2's InterfaceType: "interface" (ENA) or "efa-only" (EFA without an IP address).
    interface_type: str

    @property
    def is_primary(self) -> bool:
        return self.network_card_index == 0 and self.device_index == 0

    @property
    def is_efa(self) -> bool:
        return self.interface_type in ("efa", "efa-only")


def interface_layout(instance: InstanceType, efa: bool) -> list[InterfaceSlot]:
    """Network interfaces per AWS's layout for EFA on multi-card instances
    (EC2 User Guide, "Maximize network bandwidth on Amazon EC2 instances with
    multiple network cards"):
      - card 0 device 0 is the primary interface, an ENA interface: it carries the
        node's IP, SSH, Ray and vLLM's TCP traffic. It is never efa-only.
      - card 0 device 1 is efa-only (card 0 supports EFA on every EFA type);
      - every further card gets an efa-only interface at device 0.
    efa-only interfaces have no IP address, so they add no routing ambiguity: the
    node's only IP stays on the primary interface, where NCCL_SOCKET_IFNAME points.
    The EFA count is capped at the type's MaximumEfaInterfaces.
    """
    primary = InterfaceSlot(network_card_index=0, device_index=0, interface_type="interface")
    if not efa:
        return [primary]
    if not instance.efa_supported:
        raise ValueError(f"{instance.name} does not support EFA")
    efa_count = min(instance.max_efa_interfaces, instance.network_cards)
    slots = [primary, InterfaceSlot(network_card_index=0, device_index=1, interface_type="efa-only")]
    for card in range(1, efa_count):
        slots.append(InterfaceSlot(network_card_index=card, device_index=0, interface_type="efa-only"))
    return slots


def efa_interface_count(instance: InstanceType, efa: bool) -> int:
    """How many EFA interfaces each node gets (0 with EFA off)."""
    return sum(1 for slot in interface_layout(instance, efa) if slot.is_efa)


@dataclass(frozen=True)
class SubnetPlan:
    public: str
    private: str


def plan_subnets(vpc_cidr: str) -> SubnetPlan:
    """Split the VPC: the first quarter is the public subnet (gateway, NAT gateway),
    the second half the private subnet that holds every GPU node. The private side
    is the larger one because only it grows with the cluster; the quarter left
    over is room for later subnets."""
    vpc = ipaddress.ip_network(vpc_cidr, strict=True)
    halves = list(vpc.subnets(prefixlen_diff=1))
    public = next(halves[0].subnets(prefixlen_diff=1))
    return SubnetPlan(public=str(public), private=str(halves[1]))
