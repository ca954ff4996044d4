"""Whether the model fits the shape: its weights and one sequence of maxModelLen in the
GPUs of one gang, and maxModelLen within the model's context (components/sizing/memory_fit.py's
figures, the same that `scripts/vllm-cluster plan` prints).
"""

from __future__ import annotations

from components import catalog, sizing
from components.catalog import InstanceType
from components.config_keys import NAMESPACE
from components.spec.cluster_shape import ClusterShape
from components.spec.engine_settings import EngineSettings
from components.spec.model_source import ModelSource
from components.spec.reader import Reader

# What vLLM would refuse at its start: it checks both at start-up, after every resource exists
# and the weights are downloaded:
# - vllm/config/model.py: "User-specified max_model_len (X) is greater than the derived
#   max_model_len (max_position_embeddings=Y ...)" unless VLLM_ALLOW_LONG_MAX_MODEL_LEN;
# - vllm/v1/core/kv_cache_utils.py: "To serve at least one request with the models's max seq
#   len (X), (Y GiB KV cache is needed, which is larger than the available KV cache memory".
# And weights that exceed a GPU's memory fail with CUDA out of memory while loading. The
# spec refuses these before any resource where the model table knows the model; the
# figures are components/sizing/memory_fit.py's, the same that `scripts/vllm-cluster plan` prints.
_FIT_KEYS = (
    "model",
    "instanceType",
    "nodes",
    "tensorParallelSize",
    "pipelineParallelSize",
    "maxModelLen",
    "gpuMemoryUtilization",
    "vllmExtraArgs",
)


def _shape_words(instance: InstanceType, nodes: int, tp: int, pp: int) -> str:
    return f"instanceType {instance.name}, nodes {nodes}, tensorParallelSize {tp}, pipelineParallelSize {pp}"


def _smallest_fit_fix(model: sizing.ModelSize, utilization: float | None, length: int) -> str:
    option = sizing.smallest_fit(model, utilization, length)
    if option is None:
        return (
            "no configuration of the catalog up to 16 nodes holds it: serve a smaller or quantized model "
            "(scripts/vllm-cluster plan sizes one)"
        )
    return (
        f"{_shape_words(catalog.CATALOG[option.instance_type], option.nodes, option.tp, option.pp)} "
        f"(the smallest fit scripts/vllm-cluster plan finds, ${option.cost_per_hour:.2f}/h per gang), "
        "or a smaller model"
    )


def _longest_context_that_fits(tokens: int) -> int:
    """A round length at most `tokens`: whole thousands of 1,024 tokens where there are any."""
    return tokens - tokens % 1024 if tokens >= 1024 else tokens


def check_engine_fit(reader: Reader, source: ModelSource, engine: EngineSettings, shape: ClusterShape) -> None:
    """The model's weights and one sequence of maxModelLen in the GPUs of one gang, and
    maxModelLen within the model's context. Checked only when the keys it reads are sound and
    the model table knows the model; with a flag whose effect on memory is not modelled, a
    warning says the fit was not checked."""
    model = _model_to_fit(reader, source, engine, shape)
    if model is None:
        return
    instance, tp, pp = shape.instance, shape.tensor_parallel_size, shape.pipeline_parallel_size
    length = _check_max_model_len_in_context(reader, source.model, model, engine.max_model_len)
    the_fit = sizing.fit(model, instance, tp, pp, engine.gpu_memory_utilization, length)
    if the_fit.fits:
        return
    shape_words = _shape_words(instance, shape.nodes, tp, pp)
    if the_fit.kv_room_per_rank_gib <= 0:
        utilization = engine.gpu_memory_utilization or sizing.DEFAULT_GPU_MEMORY_UTILIZATION
        reader.fail(
            "model",
            f"does not fit {shape_words}: its weights ({model.dtype}) need {the_fit.weights_per_rank_gib:.1f} GiB "
            f"per GPU, and a {instance.name} GPU has {instance.gpu_memory_gib:g} GiB, "
            f"{the_fit.usable_per_rank_gib:.1f} GiB usable at gpuMemoryUtilization {utilization:g}, less "
            f"{sizing.RUNTIME_OVERHEAD_GIB:g} GiB of runtime: vLLM would run out of GPU memory loading it. "
            f"Fix: {_smallest_fit_fix(model, engine.gpu_memory_utilization, length)}",
        )
        return
    _refuse_a_sequence_beyond_the_kv_cache(reader, source.model, model, engine, shape_words, the_fit, length)


def _model_to_fit(
    reader: Reader, source: ModelSource, engine: EngineSettings, shape: ClusterShape
) -> sizing.ModelSize | None:
    """The served model's size, when its fit can be checked: every key the fit reads is
    sound, the model table knows the model, and vllmExtraArgs holds no flag whose effect on
    memory the sizing does not model (a warning says so)."""
    if any(p.key in _FIT_KEYS for p in reader.problems) or None in (
        source.model,
        shape.instance,
        shape.nodes,
        shape.tensor_parallel_size,
        shape.pipeline_parallel_size,
    ):
        return None
    model = sizing.served_size(source.model, engine.vllm_extra_args)
    if model is None:
        return None  # not in the table: `plan --params-b` sizes it, and warns when it does not fit
    unmodelled = sizing.unmodelled_memory_flags(engine.vllm_extra_args)
    if unmodelled:
        reasons = "; ".join(f"{flag}: {sizing.UNMODELLED_MEMORY_FLAGS[flag]}" for flag in unmodelled)
        reader.warn(
            f"whether {source.model} fits was not checked: vllmExtraArgs holds {reasons}, which the sizing "
            "does not model. vLLM itself checks at its start."
        )
        return None
    return model


def _check_max_model_len_in_context(
    reader: Reader, model_id: str, model: sizing.ModelSize, asked: int | None
) -> int | None:
    """maxModelLen within the model's context; the sequence length the fit is sized for
    (maxModelLen, or the model's own context where that is shorter or maxModelLen unset)."""
    context = model.max_context
    if asked is not None and context is not None and asked > context:
        reader.fail(
            "maxModelLen",
            f"is above {model_id}'s context of {context} tokens (max_position_embeddings in its config.json): "
            f"vLLM refuses a longer max-model-len at its start, after every resource exists. "
            f"Fix: pulumi config set {NAMESPACE}:maxModelLen {context}, or pulumi config rm {NAMESPACE}:maxModelLen "
            "for the model's own",
        )
    return min(asked or context, context) if context is not None else asked


def _refuse_a_sequence_beyond_the_kv_cache(
    reader: Reader,
    model_id: str,
    model: sizing.ModelSize,
    engine: EngineSettings,
    shape_words: str,
    the_fit: sizing.Fit,
    length: int | None,
) -> None:
    """The weights fit, but the KV cache left beside them holds less than one sequence of
    `length`: the fix is a shorter maxModelLen (where any fits) or more GPUs."""
    asked = engine.max_model_len
    held = the_fit.context_tokens or 0
    which = (
        f"maxModelLen ({length} tokens)"
        if asked is not None and length == asked
        else f"the model's own context ({length} tokens; maxModelLen is not set or above it)"
    )
    fixes = []
    if held >= 1:
        fixes.append(f"pulumi config set {NAMESPACE}:maxModelLen {_longest_context_that_fits(held)}")
    fixes.append(f"more GPUs: {_smallest_fit_fix(model, engine.gpu_memory_utilization, length)}")
    reader.fail(
        "maxModelLen",
        f"{model_id} on {shape_words}: the KV cache holds about {held} tokens per gang "
        f"({the_fit.kv_room_per_rank_gib:.1f} GiB per GPU after {the_fit.weights_per_rank_gib:.1f} GiB of weights), "
        f"fewer than one sequence of {which}, and vLLM refuses to start. Fix: {'; or '.join(fixes)}",
        raw=asked,
    )
