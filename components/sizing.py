"""Sizing arithmetic for the planner: does the model fit, how much context the KV
cache holds, what the cluster costs, how long a cold `pulumi up` takes to the
first token. Pure functions over plain values; every assumption is a named
constant with where it comes from, and the planner prints each one it used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from components import catalog, fabric, models, versions
from components.catalog import InstanceType
from components.image import NVME_MOUNT
from components.models import DTYPE_BYTES, ModelInfo

GIB = 2**30
GB = 10**9
MIB = 2**20

# vLLM's default --gpu-memory-utilization.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Per GPU, outside weights and KV cache: CUDA context, activations at the profiled
# batch, CUDA graphs, NCCL buffers. vLLM measures this at start-up; 2 GiB is a
# typical figure for these GPUs (an estimate, shown as such).
RUNTIME_OVERHEAD_GIB = 2.0

# us-east-1 on-demand list prices (aws.amazon.com/vpc/pricing, /ec2/pricing,
# /efs/pricing), checked 2026-01-21.
GATEWAY_PRICE_PER_HOUR = {"t3.small": 0.0208, "t3.micro": 0.0104, "t3.medium": 0.0416, "t4g.small": 0.0168}
NAT_GATEWAY_PER_HOUR = 0.045
EFS_STANDARD_GB_MONTH = 0.30
HOURS_PER_MONTH = 730

# Cold `pulumi up` to first token: the terms and the figures they assume.
INSTANCE_BOOT_SECONDS = 180  # launch to SSH for a GPU instance on the DLAMI (SkyPilot 101-147 s; ParallelCluster 294 s)
# The nodes' software: one locked environment (components/node_env.py), fetched once into
# the wheelhouse on EFS, then installed offline by every node in parallel. Measured on
# 2026-11-30 with `make bench-install` on the 2-core test machine: the local hosts' lock,
# 1.01 GB of wheels, downloaded by pip in 68.8 s (14.6 MB/s) and installed from the
# wheelhouse by uv (byte-compiled) in 93.8 s. The GPU nodes' lock is 4.40 GB of wheels
# (`python tools/wheelhouse_size.py`, the same day). Installing is unpacking and
# byte-compiling, spread over the cores: a GPU node's 32+ cores make it shorter than this
# upper bound.
GPU_WHEELHOUSE_GB = 4.40
INDEX_DOWNLOAD_MB_S = 14.6
WHEELHOUSE_INSTALL_SECONDS_PER_GB = 93.8 / 1.01
# Not measured (no AWS here): amazon-efs-utils is built from source at first boot, as AWS
# documents for Ubuntu; an estimate.
EFS_UTILS_BUILD_SECONDS = 60
# A baked node image (nodeImage bake, components/node_image.py): the node launches with the
# software, and setup only checks the virtualenv against the lock. Measured on 2026-12-05 on
# the 2-core test machine: `node-env check` of a virtualenv that is the local hosts' lock
# (170 packages) took 0.14-0.15 s over three runs.
SOFTWARE_CHECK_SECONDS = 0.15
# Not measured (no AWS here): Image Builder's own steps around the install (launching its
# builder, AWSTOE, stopping it, snapshotting the root volume and registering the AMI); an
# estimate.
IMAGE_BUILDER_OVERHEAD_SECONDS = 900
# components/node_image.py BUILDER_INSTANCE_TYPE, c6i.2xlarge: 8 vCPUs (aws.amazon.com/ec2/instance-types/c6i).
BUILDER_VCPUS = 8
ENGINE_START_BASE_SECONDS = 60  # vLLM process, Ray placement, P2P check
ENGINE_START_SECONDS_PER_B = 2.5  # compile and CUDA graphs grow with size: 70B TP 8 ~ 3-4 min (vllm #19824)

# vLLM's API server waits VLLM_ENGINE_READY_TIMEOUT_S for its engine (loading the weights,
# profiling, CUDA graphs) and gives up after it; systemd then restarts it, which loops
# when the model needs longer. 600 s is vLLM's default (vllm/envs.py of the pinned vLLM), kept as the
# floor; above it, a generous multiple of the estimate, so that a slow start that is
# still making progress is not killed.
ENGINE_READY_TIMEOUT_FLOOR_SECONDS = 600
ENGINE_READY_TIMEOUT_FACTOR = 3

# The head's start-vllm tells a slow start from a stuck one by vllm.service's journal
# (scripts/node/vllm-cluster-node wait_vllm): it fails a start that wrote no line for this
# long. vLLM writes a line when each stage of its start ends (weights loaded, graphs
# compiled, CUDA graphs captured: about a minute each for a 70B at TP 8, vllm #19824), and
# its progress bars end their line only when they finish, so a start that makes progress
# is silent at most for its longest stage: the weights' load or the engine's start as
# estimated above, whole. The same factor and floor as the engine's own timeout: a
# generous multiple, never below vLLM's default wait for its whole engine (600 s), so
# that first-use compiles the estimate leaves out do not fail a start that progresses.
ENGINE_START_STALL_FACTOR = ENGINE_READY_TIMEOUT_FACTOR
ENGINE_START_STALL_FLOOR_SECONDS = ENGINE_READY_TIMEOUT_FLOOR_SECONDS

# Every spelling of a weight type that `plan --dtype` and the stack's vllmExtraArgs accept,
# and the canonical name it stands for (a key of models.DTYPE_BYTES, or auto: the model's
# own type). vLLM's spellings are those of its --dtype; the short ones are the planner's.
DTYPE_SPELLINGS = {
    "auto": "auto",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "int4",
}
# What `vllm serve --dtype` accepts (vllm.config.model.ModelDType, checked against vLLM's
# API reference for vllm.config.model, 2026-12).
VLLM_DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# The spelling vLLM takes for each canonical type it can load weights as. fp8, int8 and int4
# have none: quantized weights come from a quantized checkpoint or --quantization, never --dtype.
VLLM_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def canonical_dtype(text: str, source: str) -> str:
    """The canonical name of a dtype spelling, case and surrounding spaces aside:
    'bfloat16' and 'BF16' -> 'bf16', 'half' -> 'fp16'. `source` names where the value came
    from (a flag, a config key) for the error, which lists every accepted spelling."""
    canonical = DTYPE_SPELLINGS.get(text.strip().lower()) if isinstance(text, str) else None
    if canonical is None:
        raise ValueError(f"{source} {text!r} is not a weight type; accepted: {', '.join(DTYPE_SPELLINGS)}")
    return canonical


def vllm_dtype(canonical: str) -> str | None:
    """How vLLM's --dtype spells a canonical dtype; None for the quantized ones it does not take."""
    return VLLM_DTYPES.get(canonical)


@dataclass(frozen=True)
class ModelSize:
    """What the planner knows of a model: from the table, or --params-b/--dtype."""

    name: str
    params_b: float
    dtype: str
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    max_context: int | None = None
    # vLLM's KV cache takes the model's dtype ("auto"), 16-bit for quantized weights,
    # unless --kv-cache-dtype fp8 asks for 8 bits.
    kv_cache_dtype: str | None = None

    @property
    def kv_dtype(self) -> str:
        if self.kv_cache_dtype:
            return self.kv_cache_dtype
        return self.dtype if self.dtype in ("bf16", "fp16", "fp32") else "bf16"

    @classmethod
    def of(
        cls, info: ModelInfo | None, name: str, params_b: float | None = None, dtype: str | None = None
    ) -> "ModelSize":
        """`dtype` as --dtype gave it, in any accepted spelling; unset or auto: the table's
        type for the model, else bf16."""
        if info is None and params_b is None:
            raise ValueError(f"{name} is not in the model table (components/models.py): give --params-b and --dtype")
        chosen_dtype = canonical_dtype(dtype, "--dtype") if dtype else "auto"
        if chosen_dtype == "auto":
            chosen_dtype = info.dtype if info else "bf16"
        if info is None or params_b is not None:
            # A size given by hand is another model than the table's: no architecture.
            return cls(name, float(params_b), chosen_dtype)
        return cls(
            name,
            float(params_b if params_b is not None else info.params_b),
            chosen_dtype,
            info.layers,
            info.kv_heads,
            info.head_dim,
            info.max_context,
        )

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * DTYPE_BYTES[self.dtype]

    def kv_bytes_per_token_per_rank(self, tp: int, pp: int) -> float | None:
        """K and V, for this rank's layers (1/PP of them) and KV heads (1/TP of them; a
        head is replicated when TP exceeds the KV heads)."""
        if self.layers is None or self.kv_heads is None or self.head_dim is None:
            return None
        layers = math.ceil(self.layers / pp)
        heads = max(1.0, self.kv_heads / tp)
        return 2 * layers * heads * self.head_dim * DTYPE_BYTES[self.kv_dtype]

    def weight_bytes_per_rank(self, tp: int, pp: int) -> float:
        """The rank of the largest pipeline stage: stages split layers unevenly."""
        if self.layers is None:
            return self.weight_bytes / (tp * pp)
        largest = max(end - start for start, end in stage_layers(self.layers, pp))
        return self.weight_bytes * largest / self.layers / tp


# vllm serve flags that change what the GPUs hold in ways this arithmetic does not model:
# quantized weights, weights offloaded to CPU memory, a KV cache of a set size, an
# overridden config (rope scaling lengthens the context vLLM derives). With any of them the
# spec cannot tell whether vLLM would start, so it warns instead of refusing.
UNMODELLED_MEMORY_FLAGS = {
    "--quantization": "weights quantized at load",
    "-q": "weights quantized at load",
    "--cpu-offload-gb": "weights partly in CPU memory",
    "--kv-cache-memory-bytes": "a KV cache of a set size",
    "--hf-overrides": "the model's config overridden",
    "--rope-scaling": "the context lengthened by rope scaling",
    "--speculative-config": "a draft model beside the served one",
}


def flag_value(args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of `flag` among vllm serve's words (`--flag value` or `--flag=value`)."""
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def unmodelled_memory_flags(args: tuple[str, ...] | list[str]) -> list[str]:
    """The flags of UNMODELLED_MEMORY_FLAGS among `args`, in their order."""
    found = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in UNMODELLED_MEMORY_FLAGS and flag not in found:
            found.append(flag)
    return found


def served_size(model_name: str, extra_args: tuple[str, ...] | list[str]) -> ModelSize | None:
    """What vLLM loads for a model of the table with these serve args: the weights in the
    --dtype they name (the model's own without one), the KV cache in fp8 with
    --kv-cache-dtype fp8*. None for a model outside the table."""
    info = models.lookup(model_name)
    if info is None:
        return None
    model = ModelSize.of(info, model_name, None, flag_value(extra_args, "--dtype"))
    if (flag_value(extra_args, "--kv-cache-dtype") or "").startswith("fp8"):
        model = ModelSize(**{**model.__dict__, "kv_cache_dtype": "fp8"})
    return model


@dataclass(frozen=True)
class Fit:
    weights_gb: float
    weights_per_rank_gib: float
    gpu_memory_gib: float
    usable_per_rank_gib: float  # at gpuMemoryUtilization
    kv_room_per_rank_gib: float
    context_tokens: int | None  # tokens of KV cache the cluster holds; None when the architecture is unknown
    max_model_len: int | None
    fits: bool
    reason: str


def fit(
    model: ModelSize, instance: InstanceType, tp: int, pp: int, utilization: float | None, max_model_len: int | None
) -> Fit:
    weights_per_rank = model.weight_bytes_per_rank(tp, pp)
    gpu_bytes = instance.gpu_memory_gib * GIB
    usable = (utilization or DEFAULT_GPU_MEMORY_UTILIZATION) * gpu_bytes
    room = usable - weights_per_rank - RUNTIME_OVERHEAD_GIB * GIB
    per_token = model.kv_bytes_per_token_per_rank(tp, pp)
    tokens = int(room // per_token) if per_token and room > 0 else (0 if per_token else None)
    context = max_model_len or model.max_context
    if room <= 0:
        fits, reason = (
            False,
            (
                f"weights need {weights_per_rank / GIB:.1f} GiB per GPU, {usable / GIB:.1f} GiB usable "
                f"less {RUNTIME_OVERHEAD_GIB:g} GiB runtime leaves no room"
            ),
        )
    elif tokens is not None and context is not None and tokens < context:
        fits, reason = (
            False,
            (
                f"the KV cache holds {tokens} tokens, fewer than one sequence of max-model-len {context}; "
                "vLLM refuses to start (lower maxModelLen or add GPUs)"
            ),
        )
    else:
        fits, reason = True, f"{room / GIB:.1f} GiB per GPU left for the KV cache"
    return Fit(
        weights_gb=model.weight_bytes / GB,
        weights_per_rank_gib=weights_per_rank / GIB,
        gpu_memory_gib=instance.gpu_memory_gib,
        usable_per_rank_gib=usable / GIB,
        kv_room_per_rank_gib=max(room, 0) / GIB,
        context_tokens=tokens,
        max_model_len=context,
        fits=fits,
        reason=reason,
    )


@dataclass(frozen=True)
class Option:
    instance_type: str
    nodes: int
    tp: int
    pp: int
    cost_per_hour: float


def smallest_fit(
    model: ModelSize, utilization: float | None, max_model_len: int | None, max_nodes: int = 16
) -> Option | None:
    """The cheapest catalog configuration (TP = a node's GPUs, PP = nodes) that fits."""
    best = None
    for name in catalog.known_instance_types():
        instance = catalog.CATALOG[name]
        for nodes in range(1, max_nodes + 1):
            if fit(model, instance, instance.gpus, nodes, utilization, max_model_len).fits:
                option = Option(name, nodes, instance.gpus, nodes, instance.price_per_hour_usd * nodes)
                if best is None or (option.cost_per_hour, option.nodes) < (best.cost_per_hour, best.nodes):
                    best = option
                break
    return best


@dataclass(frozen=True)
class Cost:
    gpu_nodes: float
    gateway: float
    nat_gateway: float
    model_cache: float

    @property
    def per_hour(self) -> float:
        return self.gpu_nodes + self.gateway + self.nat_gateway + self.model_cache

    @property
    def per_day(self) -> float:
        return self.per_hour * 24


def cost(instance: InstanceType, nodes: int, gateway_type: str, weights_gb: float) -> Cost:
    return Cost(
        gpu_nodes=instance.price_per_hour_usd * nodes,
        gateway=GATEWAY_PRICE_PER_HOUR.get(gateway_type, GATEWAY_PRICE_PER_HOUR["t3.small"]),
        nat_gateway=NAT_GATEWAY_PER_HOUR,
        model_cache=weights_gb * EFS_STANDARD_GB_MONTH / HOURS_PER_MONTH,
    )


@dataclass(frozen=True)
class Term:
    name: str
    seconds: float
    assumes: str


# ---------------------------------------------------------------------------------------
# The model's bytes on the critical path (issue 20): from the Hub into the EFS cache once,
# then, per node, either a copy of its pipeline stage to local NVMe that the engine reads,
# or the engine reading from the cache.
#
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
    client, client_source = efs_client_rate(efs_utils_version)
    shared = EFS_ELASTIC_FS_READ_MIB_S / (readers or nodes)
    efs_mib_s, efs_source = float(client), client_source
    if shared < client:
        efs_mib_s = shared
        efs_source = (
            f"{client_source}, shared: {readers or nodes} nodes read at once within the file system's "
            f"{EFS_ELASTIC_FS_READ_MIB_S} MiB/s (Elastic, the table's low end)"
        )
    local, reason = local_disk_decision(model, instance, nodes, pp)
    out = []
    for share in node_shares(model, nodes, pp):
        if local:
            nvme_mib_s, nvme_source = nvme_read_rate(instance)
            out.append(
                NodeLoad(
                    share.node,
                    share.stages,
                    share.copied,
                    share.layers,
                    share.bytes,
                    share.estimate,
                    True,
                    reason,
                    share.bytes,
                    efs_mib_s,
                    efs_source,
                    share.bytes / (efs_mib_s * MIB),
                    share.bytes,
                    f"local NVMe ({NVME_MOUNT})",
                    nvme_mib_s,
                    nvme_source,
                    share.bytes / (nvme_mib_s * MIB),
                )
            )
            continue
        # Every file in every worker (see above): the whole model per node, once while the
        # node's memory holds it in the page cache, else up to once per worker (one per GPU:
        # TP x PP fills every GPU of the gang).
        reads = 1 if model.weight_bytes <= instance.memory_gib * GIB else instance.gpus
        pulled = model.weight_bytes * reads
        out.append(
            NodeLoad(
                share.node,
                share.stages,
                share.copied,
                share.layers,
                share.bytes,
                share.estimate,
                False,
                reason,
                pulled,
                efs_mib_s,
                efs_source,
                0.0,
                pulled,
                "the EFS cache",
                efs_mib_s,
                efs_source
                + (
                    "; vLLM reads every file in every worker, once per node through the page cache"
                    if reads == 1
                    else f"; the model exceeds the node's {instance.memory_gib} GiB: up to once per worker"
                ),
                pulled / (efs_mib_s * MIB),
            )
        )
    return out


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


def model_load_seconds(model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None) -> float:
    """The engine's read of the weights on the slowest node: its stage from local NVMe with
    the local copy, else the whole model from the EFS cache."""
    return max(load.load_seconds for load in node_loads(model, instance, nodes, pp))


def engine_start_seconds(params_b: float) -> float:
    return ENGINE_START_BASE_SECONDS + ENGINE_START_SECONDS_PER_B * params_b


def engine_ready_timeout_seconds(model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """VLLM_ENGINE_READY_TIMEOUT_S for this model: the factor times the estimated load
    and start, never below vLLM's own default. The copy to local NVMe comes before vLLM
    starts, so it is not in it."""
    estimate = model_load_seconds(model, instance, nodes, pp) + engine_start_seconds(model.params_b)
    return max(ENGINE_READY_TIMEOUT_FLOOR_SECONDS, math.ceil(ENGINE_READY_TIMEOUT_FACTOR * estimate))


def engine_start_stall_seconds(model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """How long the engine's start may go without a line in its journal before start-vllm
    calls it stuck: the factor times its longest silent stage (the weights' load on the
    slowest node, or the engine start), never below the floor."""
    longest = max(model_load_seconds(model, instance, nodes, pp), engine_start_seconds(model.params_b))
    return max(ENGINE_START_STALL_FLOOR_SECONDS, math.ceil(ENGINE_START_STALL_FACTOR * longest))


def served_model_size(model_name: str, instance: InstanceType, nodes: int) -> ModelSize:
    """The model's size from the table; for a model outside it, the largest bf16 model the
    cluster's GPUs could hold, an upper bound that errs towards waiting longer."""
    info = models.lookup(model_name)
    if info is not None:
        return ModelSize.of(info, model_name)
    gpu_bytes = nodes * instance.gpus * instance.gpu_memory_gib * GIB
    return ModelSize(model_name, gpu_bytes / DTYPE_BYTES["bf16"] / 1e9, "bf16")


def engine_ready_timeout_for(model_name: str, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """What the head's vllm.env sets, from the config alone (the planner shows the same).
    Without `pp`, one stage per node."""
    return engine_ready_timeout_seconds(served_model_size(model_name, instance, nodes), instance, nodes, pp)


def engine_start_stall_for(model_name: str, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """What the head's start-vllm is handed (--stall-seconds), from the config alone, as
    engine_ready_timeout_for."""
    return engine_start_stall_seconds(served_model_size(model_name, instance, nodes), instance, nodes, pp)


def software_terms(on_builder: bool = False) -> list[Term]:
    """Installing the node software: on every node at its first setup, or once on the image's
    builder (its own wheelhouse, fetched straight from the index)."""
    where = "on the image's builder" if on_builder else "at first boot"
    return [
        Term("efs-utils build", EFS_UTILS_BUILD_SECONDS, f"estimate: the EFS mount helper built {where}"),
        Term(
            "wheel fetch",
            GPU_WHEELHOUSE_GB * 1000 / INDEX_DOWNLOAD_MB_S,
            f"{GPU_WHEELHOUSE_GB} GB of locked wheels at {INDEX_DOWNLOAD_MB_S} MB/s "
            "(make bench-install), once per lock",
        ),
        Term(
            "software install",
            GPU_WHEELHOUSE_GB * WHEELHOUSE_INSTALL_SECONDS_PER_GB,
            f"{GPU_WHEELHOUSE_GB} GB from the wheelhouse at {WHEELHOUSE_INSTALL_SECONDS_PER_GB:.0f} s/GB "
            "(make bench-install, 2 cores: an upper bound), "
            + (f"on the builder ({BUILDER_VCPUS} vCPUs)" if on_builder else "nodes in parallel"),
        ),
    ]


def image_bake() -> list[Term]:
    """The node image's bake (components/node_image.py), once per lock and base image: the
    same install on Image Builder's builder, and Image Builder's own steps."""
    return [
        *software_terms(on_builder=True),
        Term(
            "image builder",
            IMAGE_BUILDER_OVERHEAD_SECONDS,
            "estimate, not measured: the builder's launch, AWSTOE, the root volume's snapshot and the AMI",
        ),
    ]


def time_to_first_token(
    model: ModelSize,
    instance: InstanceType,
    nodes: int,
    pp: int | None = None,
    efs_utils_version: str | None = None,
    readers: int | None = None,
    baked_image: bool = False,
) -> list[Term]:
    """The terms of a cold `pulumi up` to the first token, each with its assumption. With a
    baked image the software is in it (image_bake, shown apart) and setup only checks it."""
    download = model_download(model, nodes, efs_utils_version)
    loads = node_loads(model, instance, nodes, pp, efs_utils_version, readers)
    slowest_copy = max(loads, key=lambda load: load.copy_seconds)
    slowest_load = max(loads, key=lambda load: load.load_seconds)
    if slowest_copy.local:
        # Gang 0's nodes copy each file of their stage as soon as it lands on the cache
        # (vllm-cluster-node prepare-serve --model-landing), so the copy runs beside the
        # download and the two cost the slower of them, not their sum.
        fetch = Term(
            "download+stage",
            max(download.seconds, slowest_copy.copy_seconds),
            f"the download and each node's copy of its stage overlap (each file copied as it lands), the slower "
            f"of: download {download.seconds:.0f} s ({download.assumes}); stage copy "
            f"{slowest_copy.copy_seconds:.0f} s (largest stage ~{slowest_copy.efs_bytes / GB:.1f} GB from the EFS "
            f"cache to {NVME_MOUNT} at {slowest_copy.efs_mib_s:.0f} MiB/s, nodes in parallel; EFS's per-client "
            "limit taken per direction, the download writing while the copy reads: not measured)",
        )
    else:
        fetch = Term("model download", download.seconds, f"{download.assumes}; no stage copy: {slowest_copy.reason}")
    software = software_terms()
    if baked_image:
        software = [
            Term(
                "software check",
                SOFTWARE_CHECK_SECONDS,
                f"the baked image holds the lock's environment: setup checks it ({SOFTWARE_CHECK_SECONDS} s for "
                "170 packages, node-env check, measured on the test machine)",
            )
        ]
    return [
        Term("instance boot", INSTANCE_BOOT_SECONDS, "launch to SSH on the Deep Learning AMI"),
        *software,
        fetch,
        *(
            [
                Term(
                    "fabric check",
                    fabric.check_seconds(instance, nodes),
                    f"{fabric.SETUP_SECONDS} s to set up, then {fabric.NCCL_WARMUP + fabric.NCCL_ITERATIONS} "
                    f"all-reduces of {fabric.NCCL_BYTES // 2**20} MiB per GPU over {nodes} nodes at the network's "
                    f"{fabric.line_rate_gbps(instance):g} GB/s (components/fabric.py; the gate fails below "
                    f"{fabric.floor(instance, gloo=False).gbps:g} GB/s)",
                )
            ]
            if fabric.gated(nodes)
            else []
        ),
        Term(
            "model load",
            slowest_load.load_seconds,
            f"the engine reads ~{slowest_load.load_bytes / GB:.1f} GB per node from {slowest_load.load_from} "
            f"at {slowest_load.load_mib_s:.0f} MiB/s ({slowest_load.load_source})",
        ),
        Term(
            "engine start",
            engine_start_seconds(model.params_b),
            f"{ENGINE_START_BASE_SECONDS} s + {ENGINE_START_SECONDS_PER_B} s per billion parameters",
        ),
    ]


def stage_layers(layers: int, pp: int) -> list[tuple[int, int]]:
    """[start, end) of each pipeline stage's layers, split as vLLM's get_pp_indices
    does: evenly, the remainder going to the stages before the last."""
    partitions = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        partitions[-i] += 1
    ranges, start = [], 0
    for size in partitions:
        ranges.append((start, start + size))
        start += size
    return ranges


def warnings_for(model: ModelSize, instance: InstanceType, tp: int, the_fit: Fit) -> list[str]:
    """The planner's own warnings; the spec's (several nodes without EFA) come with the spec."""
    warnings = []
    if tp > instance.gpus:
        warnings.append(
            f"tensor parallelism {tp} spans nodes ({instance.gpus} GPUs each): TP traffic crosses the network"
        )
    if model.weight_bytes > instance.gpus * instance.gpu_memory_gib * GIB:
        warnings.append(
            f"the weights ({model.weight_bytes / GB:.0f} GB) exceed one node's GPU memory "
            f"({instance.gpus} x {instance.gpu_memory_gib:g} GiB): the model needs pipeline stages on several nodes"
        )
    if not the_fit.fits:
        warnings.append(f"does not fit: {the_fit.reason}")
    return warnings
