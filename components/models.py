"""A small checked-in table of common models: what sizing needs to know about each
(parameters, layers, KV heads, head size, context). From each model's config.json
on the Hugging Face Hub; parameters as the model cards state them.

Pure data. For a model not listed, the planner takes --params-b and --dtype and
estimates what it can without the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes per weight (or KV-cache element) by dtype.
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class ModelInfo:
    name: str
    params_b: float  # billions of parameters
    layers: int
    kv_heads: int
    head_dim: int
    max_context: int  # max_position_embeddings
    dtype: str = "bf16"


MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo("Qwen/Qwen2.5-0.5B-Instruct", 0.49, 24, 2, 64, 32768),
        ModelInfo("Qwen/Qwen2.5-1.5B-Instruct", 1.54, 28, 2, 128, 32768),
        ModelInfo("Qwen/Qwen2.5-7B-Instruct", 7.61, 28, 4, 128, 32768),
        ModelInfo("Qwen/Qwen2.5-72B-Instruct", 72.7, 80, 8, 128, 32768),
        ModelInfo("meta-llama/Llama-3.1-8B-Instruct", 8.03, 32, 8, 128, 131072),
        ModelInfo("meta-llama/Llama-3.1-70B-Instruct", 70.6, 80, 8, 128, 131072),
        ModelInfo("meta-llama/Llama-3.1-405B-Instruct", 405.9, 126, 8, 128, 131072),
        ModelInfo("meta-llama/Llama-3.3-70B-Instruct", 70.6, 80, 8, 128, 131072),
        ModelInfo("mistralai/Mistral-7B-Instruct-v0.3", 7.25, 32, 8, 128, 32768),
        ModelInfo("mistralai/Mixtral-8x7B-Instruct-v0.1", 46.7, 32, 8, 128, 32768),
    )
}


def lookup(model: str) -> ModelInfo | None:
    return MODELS.get(model)
