"""Sizing arithmetic for the planner: does the model fit, how much context the KV
cache holds, what the cluster costs, how long a cold `pulumi up` takes to the
first token. Pure functions over plain values; every assumption is a named
constant with where it comes from, and the planner prints each one it used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components import catalog, models
from components.catalog import InstanceType
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
EFS_ELASTIC_CLIENT_MIB_S = 1500  # Elastic throughput, per client (AWS EFS User Guide, "Amazon EFS performance")
ENGINE_START_BASE_SECONDS = 60  # vLLM process, Ray placement, P2P check
ENGINE_START_SECONDS_PER_B = 2.5  # compile and CUDA graphs grow with size: 70B TP 8 ~ 3-4 min (vllm #19824)

# vLLM's API server waits VLLM_ENGINE_READY_TIMEOUT_S for its engine (loading the weights,
# profiling, CUDA graphs) and gives up after it; systemd then restarts it, which loops
# when the model needs longer. 600 s is vLLM's default (vllm/envs.py of the pinned vLLM), kept as the
# floor; above it, a generous multiple of the estimate, so that a slow start that is
# still making progress is not killed.
ENGINE_READY_TIMEOUT_FLOOR_SECONDS = 600
ENGINE_READY_TIMEOUT_FACTOR = 3

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


def model_load_seconds(model: ModelSize, nodes: int) -> float:
    """Each node reads its share of the weights from the EFS cache."""
    return model.weight_bytes / nodes / (EFS_ELASTIC_CLIENT_MIB_S * MIB)


def engine_start_seconds(params_b: float) -> float:
    return ENGINE_START_BASE_SECONDS + ENGINE_START_SECONDS_PER_B * params_b


def engine_ready_timeout_seconds(model: ModelSize, nodes: int) -> int:
    """VLLM_ENGINE_READY_TIMEOUT_S for this model: the factor times the estimated load
    and start, never below vLLM's own default."""
    estimate = model_load_seconds(model, nodes) + engine_start_seconds(model.params_b)
    return max(ENGINE_READY_TIMEOUT_FLOOR_SECONDS, math.ceil(ENGINE_READY_TIMEOUT_FACTOR * estimate))


def served_model_size(model_name: str, instance: InstanceType, nodes: int) -> ModelSize:
    """The model's size from the table; for a model outside it, the largest bf16 model the
    cluster's GPUs could hold, an upper bound that errs towards waiting longer."""
    info = models.lookup(model_name)
    if info is not None:
        return ModelSize.of(info, model_name)
    gpu_bytes = nodes * instance.gpus * instance.gpu_memory_gib * GIB
    return ModelSize(model_name, gpu_bytes / DTYPE_BYTES["bf16"] / 1e9, "bf16")


def engine_ready_timeout_for(model_name: str, instance: InstanceType, nodes: int) -> int:
    """What the head's vllm.env sets, from the config alone (the planner shows the same)."""
    return engine_ready_timeout_seconds(served_model_size(model_name, instance, nodes), nodes)


def time_to_first_token(model: ModelSize, nodes: int, params_b: float) -> list[Term]:
    """The terms of a cold `pulumi up` to the first token, each with its assumption."""
    download = model.weight_bytes / (EFS_ELASTIC_CLIENT_MIB_S * MIB)
    load = model_load_seconds(model, nodes)
    engine = engine_start_seconds(params_b)
    return [
        Term("instance boot", INSTANCE_BOOT_SECONDS, "launch to SSH on the Deep Learning AMI"),
        Term("efs-utils build", EFS_UTILS_BUILD_SECONDS, "estimate: the EFS mount helper built at first boot"),
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
            "(make bench-install, 2 cores: an upper bound), nodes in parallel",
        ),
        Term(
            "model download",
            download,
            f"{model.weight_bytes / GB:.1f} GB at EFS Elastic's {EFS_ELASTIC_CLIENT_MIB_S} MiB/s per client",
        ),
        Term("model load", load, f"each node reads its 1/{nodes} at {EFS_ELASTIC_CLIENT_MIB_S} MiB/s"),
        Term(
            "engine start",
            engine,
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
