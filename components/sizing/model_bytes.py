"""The model's bytes on the way to each node's engine (issue 20): the first download
from the Hub into the EFS cache, each node's share of the pipeline stages, its copy to the
local NVMe (or none: serving from the cache) and the engine's read, each at a rate with
its source (EFS's per-client limit for the efs-utils the nodes build, the instance
store's IOPS). The facts of vLLM's loader these rest on are written below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components import models, versions
from components.catalog import InstanceType
from components.image import NVME_MOUNT
from components.models import DTYPE_BYTES
from components.sizing.model_size import GB, GIB, MIB, ModelSize, served_model_size, stage_layers

# What vLLM's loader reads (vllm 0.32.0 as installed here; vLLM 0.33's is the same per
# ../shared/FACTS.md section 13), for a model whose files sit in one directory:
# - DefaultModelLoader._get_weights_iterator (model_executor/model_loader/default_loader.py
#   265-340) hands every *.safetensors file of the directory to
#   safetensors_weights_iterator (model_executor/model_loader/weight_utils.py 1079-1207),
#   in every worker, whatever its pipeline stage. Shards are dropped before reading only for
#   models that define is_unused_checkpoint_weight (default_loader.py 297-300; MTP drafts,
#   not Llama or Qwen).
# - eager (the prod and h100 stacks): each worker reads each whole file,
#   `load(f.read())` (weight_utils.py 1170-1175); lazy: safe_open and get_tensor on every
#   name (1200-1206); the model's load_weights drops the other stages' tensors only after.
# - unset (vLLM's default): lazy, and on NFS (EFS is nfs4) with the checkpoint within 90%
#   of the free RAM each rank first prefetches a slice of the files into the page cache
#   (weight_utils.py 1100-1119, 1004-1021); the reads that follow touch every file anyway.
# So a node whose directory holds the whole model reads all of it, and its TP workers
# (one per GPU) read the same files: the page cache serves the node's second reader on,
# so the bytes cross the network once per node while the node's memory holds them (eager
# and lazy alike); beyond that, up to once per worker.
# A node whose directory holds only its stage's files (the local copy) reads just those.
#
# [efs-perf] AWS EFS User Guide, "Amazon EFS performance", performance table and footnote 4
# (read 2026-12-02): "The maximum combined read and write throughput is 1,500 MiBps for file
# systems using Elastic throughput and mounted using version 2.0 or later of the Amazon EFS
# client (amazon-efs-utils version) or the Amazon EFS CSI Driver (aws-efs-csi-driver). For
# all other file systems, the throughput limit is 500 MiBps." efs-utils 1.x encrypts through
# stunnel; 2.x through its efs-proxy. The same table, Regional file system with Elastic
# throughput (the model cache, components/storage.py): per file system, read 3-20 GiBps and
# write 1-5 GiBps by Region.
EFS_PERFORMANCE_PAGE = "https://docs.aws.amazon.com/efs/latest/ug/performance.html"
EFS_CLIENT_MIB_S_EFS_PROXY = 1500  # efs-utils 2.0 and later, Elastic throughput [efs-perf]
EFS_CLIENT_MIB_S_OTHER = 500  # every other client, so efs-utils 1.x (stunnel) [efs-perf]
EFS_PROXY_FIRST_MAJOR = 2
# The low end of the per-file-system range [efs-perf]: what every node together gets at worst.
EFS_ELASTIC_FS_READ_MIB_S = 3 * 1024
EFS_ELASTIC_FS_WRITE_MIB_S = 1 * 1024

# The local NVMe instance store (components/catalog.py). AWS gives its 100% random-read IOPS
# at 4 KiB; a load reads large sequential blocks, so IOPS x 4 KiB is a floor of its rate.
NVME_IO_BYTES = 4096
# For a type whose row has no AWS IOPS figure: an estimate, p4d's per-disk figure
# (2,000,000 IOPS over its 8 disks) times the type's disks.
NVME_ESTIMATE_IOPS_PER_DISK = 250_000
# AWS recommends leaving 10% of an SSD instance store unpartitioned for the controller's
# over-provisioning (EC2 User Guide, "SSD-based instance store volume I/O performance", in
# catalog.EC2_STORE_2023): a stage is copied only where it takes at most 90% of the store.
# The image mounts the store at NVME_MOUNT (its release notes' nvme_location); that it joins
# a type's several disks into that one mount is assumed, not read (the node checks its room).
NVME_USABLE_FRACTION = 0.9

# The input embedding and the output projection (lm_head): vocab_size x hidden_size each,
# one matrix in the checkpoint when tie_word_embeddings. From each model's config.json on
# the Hub (https://huggingface.co/<model>/blob/main/config.json); the Llama figures agree
# with oumi-ai/oumi configs/recipes/llama3_1/README.md and llama3_3/README.md (read
# 2026-12-02), the others are as their config.json reads, not re-read here. These belong
# beside the model table (components/models.py); they live here until it has the columns.
# model: (vocab_size, hidden_size, tie_word_embeddings)
MODEL_EMBEDDINGS: dict[str, tuple[int, int, bool]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": (151936, 896, True),
    "Qwen/Qwen2.5-1.5B-Instruct": (151936, 1536, True),
    "Qwen/Qwen2.5-7B-Instruct": (152064, 3584, False),
    "Qwen/Qwen2.5-72B-Instruct": (152064, 8192, False),
    "meta-llama/Llama-3.1-8B-Instruct": (128256, 4096, False),
    "meta-llama/Llama-3.1-70B-Instruct": (128256, 8192, False),
    "meta-llama/Llama-3.1-405B-Instruct": (128256, 16384, False),
    "meta-llama/Llama-3.3-70B-Instruct": (128256, 8192, False),
    "mistralai/Mistral-7B-Instruct-v0.3": (32768, 4096, False),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": (32000, 4096, False),
}


# Models whose vLLM class builds embed_tokens and lm_head on every pipeline stage, splitting
# only the layers: Mixtral (vllm model_executor/models/mixtral.py 316-319, 405-411 in 0.32.0;
# scripts/lib/model_stage.py LAYERS_ONLY). Every stage's copy holds both matrices.
EMBEDDINGS_ON_EVERY_STAGE = frozenset({"mistralai/Mixtral-8x7B-Instruct-v0.1"})


def efs_utils_major(version: str) -> int:
    """The major release of an efs-utils tag: 'v1.36.0' -> 1, '2.3.1' -> 2."""
    match = re.fullmatch(r"v?(\d+)(\.\d+)*", version.strip()) if isinstance(version, str) else None
    if match is None:
        raise ValueError(f"efs-utils version {version!r} is not a release tag such as v1.36.0")
    return int(match.group(1))


def efs_client_rate(efs_utils_version: str | None = None) -> tuple[int, str]:
    """EFS's per-client throughput in MiB/s for the nodes' efs-utils, and where that comes
    from. Without an argument: the release the nodes build (versions.EFS_UTILS_VERSION),
    so a bump of efs-utils changes the plan."""
    if efs_utils_version is None:
        efs_utils_version = versions.EFS_UTILS_VERSION
    if efs_utils_major(efs_utils_version) >= EFS_PROXY_FIRST_MAJOR:
        return EFS_CLIENT_MIB_S_EFS_PROXY, (
            f"EFS's per-client limit for efs-utils {efs_utils_version} (efs-proxy) on Elastic throughput "
            f"({EFS_PERFORMANCE_PAGE}, footnote 4)"
        )
    return EFS_CLIENT_MIB_S_OTHER, (
        f"EFS's per-client limit for efs-utils {efs_utils_version}, which encrypts through stunnel; "
        f"{EFS_CLIENT_MIB_S_EFS_PROXY:,} MiB/s needs efs-utils 2.x and its efs-proxy "
        f"({EFS_PERFORMANCE_PAGE}, footnote 4)"
    )


def efs_client_mib_s(efs_utils_version: str | None = None) -> int:
    return efs_client_rate(efs_utils_version)[0]


def nvme_read_rate(instance: InstanceType) -> tuple[float, str]:
    """The local NVMe's read rate in MiB/s and its source: AWS's random-read IOPS x 4 KiB
    (a floor), else a labelled estimate."""
    if instance.instance_store_read_iops:
        return instance.instance_store_read_iops * NVME_IO_BYTES / MIB, (
            f"AWS's {instance.instance_store_read_iops:,} random-read IOPS x 4 KiB for {instance.name} in the "
            "EC2 User Guide's SSD instance store I/O table, taken as a floor: a load reads large blocks"
        )
    iops = NVME_ESTIMATE_IOPS_PER_DISK * instance.instance_store_disks
    return iops * NVME_IO_BYTES / MIB, (
        f"estimate: {instance.instance_store_disks} disk(s) x p4d's {NVME_ESTIMATE_IOPS_PER_DISK:,} "
        "random-read IOPS per disk x 4 KiB; AWS gives no figure for this type"
    )


def loader_reads(strategy: str | None, workers: int) -> str:
    """What the node's vLLM workers read with this --safetensors-load-strategy (None: vLLM's
    default), and why the bytes still cross to the node once: the facts above."""
    every = (
        f"each of the node's {workers} worker{'s' if workers != 1 else ''} reads every weight file in the "
        "directory it serves from"
    )
    if strategy == "eager":
        how = "eager: whole files, load(f.read()) (vllm weight_utils.py 1170-1175)"
    elif strategy == "lazy":
        how = "lazy: get_tensor of every name (weight_utils.py 1200-1206)"
    elif strategy is None:
        how = (
            "unset, so lazy: get_tensor of every name (weight_utils.py 1200-1206); from the EFS cache (nfs4) "
            "a prefetch first when the files fit in 90% of free RAM (1100-1119)"
        )
    else:
        how = f"{strategy} (weight_utils.py 1079-1207)"
    return f"--safetensors-load-strategy {how}: {every}; the page cache makes it once per node"


def stages_by_node(nodes: int, pp: int) -> list[tuple[int, ...]]:
    """The pipeline stages each node holds: TP stays inside a node (components/topology.py),
    so each holds pp / nodes consecutive stages."""
    if pp % nodes:
        raise ValueError(f"PP {pp} does not split over {nodes} node(s)")
    per_node = pp // nodes
    return [tuple(range(node * per_node, (node + 1) * per_node)) for node in range(nodes)]


def copied_stages(nodes: int, pp: int) -> list[tuple[int, ...]]:
    """The stages each node copies to its local disk. The head's are known; vLLM gives the
    other nodes their ranks by Ray node ID (RayExecutorV2), unknown before the raylets run
    and changed when one restarts, so with two or more nodes after the head each of them
    copies every stage any of them may serve (scripts/lib/model_stage.py node_stages, as
    vllm-cluster-node prepare-serve calls it: a superset, bytes, never a missing tensor)."""
    served = stages_by_node(nodes, pp)
    if nodes <= 2:
        return served
    pool = tuple(sorted({stage for stages in served[1:] for stage in stages}))
    return [served[0], *([pool] * (nodes - 1))]


@dataclass(frozen=True)
class NodeShare:
    """The bytes of the tensors one node's copied stages need: what its local copy holds."""

    node: int
    stages: tuple[int, ...]  # the stages its workers serve
    copied: tuple[int, ...]  # the stages it copies (more than `stages` when vLLM's order is not known)
    layers: tuple[int, int] | None  # [start, end) of the copied stages' layers; None when not known
    bytes: float
    estimate: str  # how the bytes were estimated


def embedding_bytes(model: ModelSize) -> tuple[float, bool] | None:
    """One embedding matrix's bytes (vocab x hidden in the model's dtype) and whether the
    checkpoint ties lm_head to it; None when the table has no such figures."""
    figures = MODEL_EMBEDDINGS.get(model.name) if model.layers is not None else None
    if figures is None:
        return None
    vocab, hidden, tied = figures
    return vocab * hidden * DTYPE_BYTES[model.dtype], tied


def _share_bytes(model: ModelSize, stages: tuple[int, ...], pp: int) -> tuple[tuple[int, int] | None, float, str]:
    """The layers, bytes and how they were estimated of the consecutive `stages`."""
    if model.layers is None:
        return (
            None,
            model.weight_bytes * len(stages) / pp,
            f"estimated from the weight bytes / PP ({len(stages)}/{pp}): the model is outside the table",
        )
    ranges = stage_layers(model.layers, pp)
    start, end = ranges[stages[0]][0], ranges[stages[-1]][1]
    share = (end - start) / model.layers
    embeddings = embedding_bytes(model)
    if embeddings is None:
        return (
            (start, end),
            model.weight_bytes * share,
            f"its {end - start}/{model.layers} of the layers' bytes; the embeddings' size is not in the table",
        )
    matrix, tied = embeddings
    first, last = 0 in stages, pp - 1 in stages
    if model.name in EMBEDDINGS_ON_EVERY_STAGE:
        first = last = True  # every stage builds both
    holds = []
    if first or (last and tied):
        holds.append("the embedding")
    if last and not tied:
        holds.append("lm_head")
    vocab, hidden, _ = MODEL_EMBEDDINGS[model.name]
    layer_bytes = model.weight_bytes - (1 if tied else 2) * matrix
    how = f"{end - start}/{model.layers} of the layers' bytes"
    if holds:
        how += f" + {' and '.join(holds)}, {vocab} x {hidden} x {DTYPE_BYTES[model.dtype]:g} B each"
    return (start, end), layer_bytes * share + matrix * len(holds), how


def node_shares(model: ModelSize, nodes: int, pp: int | None = None) -> list[NodeShare]:
    """Each node's copied stages' bytes, an approximation from the model table's figures:
    their share of the layers' bytes, plus the input embedding on the first stage (and on
    the last too when tied: vLLM's last stage holds embed_tokens to tie lm_head to it) and
    lm_head on the last (vllm model_executor/models/llama.py 377-388, 502-517). A stage is
    whole files in practice: a shard that straddles two stages is copied by both nodes, so
    the real copy is larger by up to one shard at each boundary. Outside the table: weight
    bytes / PP per stage."""
    pp = pp or nodes
    shares = []
    for node, (stages, copied) in enumerate(zip(stages_by_node(nodes, pp), copied_stages(nodes, pp), strict=True)):
        layers, size, how = _share_bytes(model, copied, pp)
        if copied != stages:
            how += (
                f"; copies stages {copied[0]}-{copied[-1]}: vLLM orders the nodes after the head by Ray node ID, "
                "unknown when the copy runs"
            )
        if model.layers is not None:
            how += "; whole files in practice: up to a shard more at a stage boundary"
        shares.append(NodeShare(node, stages, copied, layers, size, how))
    return shares


def local_disk_decision(
    model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None
) -> tuple[bool, str]:
    """Whether each node copies its stage to the local NVMe and serves from it, and why."""
    pp = pp or nodes
    largest = max(share.bytes for share in node_shares(model, nodes, pp))
    if pp == 1:
        what = f"the model is ~{largest / GB:.0f} GB"
    elif nodes <= 2:
        what = f"each node's stage is ~{largest / GB:.0f} GB"
    else:
        what = f"the largest node's stages are ~{largest / GB:.0f} GB"
    if not instance.instance_store_gb:
        return False, f"{instance.name} has no local NVMe: serving from the EFS cache ({what})"
    store = (
        f"{instance.name} has {instance.instance_store_disks} x {instance.instance_store_disk_gb} GB NVMe "
        f"at {NVME_MOUNT}"
    )
    if largest > instance.instance_store_gb * GB * NVME_USABLE_FRACTION:
        return False, (
            f"{store}, too small: {what}, more than the {NVME_USABLE_FRACTION:.0%} of it to fill "
            "(AWS leaves 10% for over-provisioning): serving from the EFS cache"
        )
    return True, f"{store}; {what}"


def serves_from_local_disk(spec) -> tuple[bool, str]:
    """Where the stack's vLLM serves from: True (each node's local NVMe copy of its stage)
    when the instance type has an instance store with room for the stage, with the reason
    either way. Pure: the spec's model, instance type, nodes and PP decide it."""
    model = served_model_size(spec.model, spec.instance, spec.nodes)
    local, reason = local_disk_decision(model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
    if models.lookup(spec.model) is None:
        reason += " (a model outside the table, sized as the largest the GPUs hold)"
    return local, reason


@dataclass(frozen=True)
class NodeLoad:
    """One node's model bytes from the cache to the engine: what it pulls from the EFS
    cache, the copy to its local NVMe (none when it serves from the cache), the engine's
    read, each at its rate and with its source."""

    node: int
    stages: tuple[int, ...]  # served
    copied: tuple[int, ...]  # in its local copy (more than served when vLLM's order is unknown)
    layers: tuple[int, int] | None  # of the copied stages
    stage_bytes: float
    stage_estimate: str
    local: bool  # serves from its local NVMe copy
    reason: str
    efs_bytes: float  # pulled from the EFS cache, once per node
    efs_mib_s: float
    efs_source: str
    copy_seconds: float  # cache -> NVME_MOUNT; 0 when serving from the cache
    load_bytes: float  # what the engine's workers read, once per node through the page cache
    load_from: str
    load_mib_s: float
    load_source: str
    load_seconds: float


def node_loads(
    model: ModelSize,
    instance: InstanceType,
    nodes: int,
    pp: int | None = None,
    efs_utils_version: str | None = None,
    readers: int | None = None,
) -> list[NodeLoad]:
    """Per node of a gang. `readers` is how many nodes read the cache at once (every gang's
    on the first `pulumi up`; default one gang's): together they get at least the file
    system's low-end read rate [efs-perf]."""
    pp = pp or nodes
    efs_mib_s, efs_source = _efs_read_rate(efs_utils_version, readers or nodes)
    local, reason = local_disk_decision(model, instance, nodes, pp)
    load = _local_load if local else _cache_load
    return [load(share, reason, model, instance, efs_mib_s, efs_source) for share in node_shares(model, nodes, pp)]


def _efs_read_rate(efs_utils_version: str | None, readers: int) -> tuple[float, str]:
    """What one node reads from the EFS cache at, and why: its client's limit, or its part
    of the file system's low-end read rate when `readers` nodes together would pass it."""
    client, client_source = efs_client_rate(efs_utils_version)
    shared = EFS_ELASTIC_FS_READ_MIB_S / readers
    if shared >= client:
        return float(client), client_source
    return shared, (
        f"{client_source}, shared: {readers} nodes read at once within the file system's "
        f"{EFS_ELASTIC_FS_READ_MIB_S} MiB/s (Elastic, the table's low end)"
    )


def _local_load(
    share: NodeShare, reason: str, model: ModelSize, instance: InstanceType, efs_mib_s: float, efs_source: str
) -> NodeLoad:
    """A node that copies its stages from the EFS cache to its local NVMe, which the engine
    then reads."""
    nvme_mib_s, nvme_source = nvme_read_rate(instance)
    return _share_load(
        share,
        local=True,
        reason=reason,
        efs_bytes=share.bytes,
        efs_mib_s=efs_mib_s,
        efs_source=efs_source,
        copy_seconds=share.bytes / (efs_mib_s * MIB),
        load_bytes=share.bytes,
        load_from=f"local NVMe ({NVME_MOUNT})",
        load_mib_s=nvme_mib_s,
        load_source=nvme_source,
        load_seconds=share.bytes / (nvme_mib_s * MIB),
    )


def _cache_load(
    share: NodeShare, reason: str, model: ModelSize, instance: InstanceType, efs_mib_s: float, efs_source: str
) -> NodeLoad:
    """A node whose engine reads the EFS cache itself: every file in every worker (see
    above), so the whole model per node, once while the node's memory holds it in the page
    cache, else up to once per worker (one per GPU: TP x PP fills every GPU of the gang)."""
    reads = 1 if model.weight_bytes <= instance.memory_gib * GIB else instance.gpus
    pulled = model.weight_bytes * reads
    return _share_load(
        share,
        local=False,
        reason=reason,
        efs_bytes=pulled,
        efs_mib_s=efs_mib_s,
        efs_source=efs_source,
        copy_seconds=0.0,
        load_bytes=pulled,
        load_from="the EFS cache",
        load_mib_s=efs_mib_s,
        load_source=efs_source
        + (
            "; vLLM reads every file in every worker, once per node through the page cache"
            if reads == 1
            else f"; the model exceeds the node's {instance.memory_gib} GiB: up to once per worker"
        ),
        load_seconds=pulled / (efs_mib_s * MIB),
    )


def _share_load(share: NodeShare, **load) -> NodeLoad:
    """A node's load: its share of the stages, and how its bytes reach the engine."""
    return NodeLoad(
        node=share.node,
        stages=share.stages,
        copied=share.copied,
        layers=share.layers,
        stage_bytes=share.bytes,
        stage_estimate=share.estimate,
        **load,
    )


@dataclass(frozen=True)
class Download:
    """The first download from the Hub into the cache, by gang 0's nodes."""

    total_bytes: float
    nodes: int
    part_bytes: float  # the largest part one node downloads
    mib_s: float  # per node
    seconds: float
    assumes: str


def model_download(model: ModelSize, nodes: int, efs_utils_version: str | None = None) -> Download:
    """With more than one node the nodes download disjoint sets of files in parallel: the
    time is the largest part (balanced: about total / nodes) at a node's rate, its writes
    into the cache bounded by EFS's per-client limit, and all of them by the file system's
    write rate; the Hub and the NAT gateway are assumed not slower (not measured)."""
    client, client_source = efs_client_rate(efs_utils_version)
    part = model.weight_bytes / nodes
    seconds = max(part / (client * MIB), model.weight_bytes / (EFS_ELASTIC_FS_WRITE_MIB_S * MIB))
    how = (
        f"{model.weight_bytes / GB:.1f} GB from the Hub by {nodes} nodes in parallel, disjoint files: "
        f"~{part / GB:.1f} GB each"
        if nodes > 1
        else f"{model.weight_bytes / GB:.1f} GB from the Hub by one node"
    )
    capped = part / (client * MIB) < seconds
    return Download(
        model.weight_bytes,
        nodes,
        part,
        float(client),
        seconds,
        f"{how} at {client} MiB/s, {client_source}"
        + (
            f"; together within the file system's {EFS_ELASTIC_FS_WRITE_MIB_S} MiB/s of writes (Elastic, low end)"
            if capped
            else ""
        ),
    )
