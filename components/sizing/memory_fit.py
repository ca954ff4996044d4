"""Does the model fit the GPUs, and how much context does the KV cache hold: per rank,
the weights of the largest pipeline stage, vLLM's runtime overhead and the KV cache's
room at gpuMemoryUtilization; the cheapest catalog configuration that fits; the
planner's own warnings.
"""

from __future__ import annotations

from dataclasses import dataclass

from components import catalog
from components.catalog import InstanceType
from components.sizing.model_size import GB, GIB, ModelSize

# vLLM's default --gpu-memory-utilization.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Per GPU, outside weights and KV cache: CUDA context, activations at the profiled
# batch, CUDA graphs, NCCL buffers. vLLM measures this at start-up; 2 GiB is a
# typical figure for these GPUs (an estimate, shown as such).
RUNTIME_OVERHEAD_GIB = 2.0


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
