"""What the planner sizes: a model's parameters, weight type and architecture
(ModelSize), from the model table (components/models.py) or as `plan --params-b/--dtype`
and the stack's vllm serve arguments give them; the weight types' spellings; the
pipeline stages' layers; and the units every part of the sizing counts in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components import models
from components.catalog import InstanceType
from components.models import DTYPE_BYTES, ModelInfo

GIB = 2**30
GB = 10**9
MIB = 2**20


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


def served_model_size(model_name: str, instance: InstanceType, nodes: int) -> ModelSize:
    """The model's size from the table; for a model outside it, the largest bf16 model the
    cluster's GPUs could hold, an upper bound that errs towards waiting longer."""
    info = models.lookup(model_name)
    if info is not None:
        return ModelSize.of(info, model_name)
    gpu_bytes = nodes * instance.gpus * instance.gpu_memory_gib * GIB
    return ModelSize(model_name, gpu_bytes / DTYPE_BYTES["bf16"] / 1e9, "bf16")


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
