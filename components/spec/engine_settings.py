"""The engine settings: vLLM's settings beyond the parallelism (vllmExtraArgs,
maxModelLen, gpuMemoryUtilization). Each extra arg is one word of `vllm serve`, none of the
flags the program sets from its own keys, and says the model's task as vLLM takes it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from components import api_routes, sizing
from components.spec.reader import Reader, injection_note

# Flags the program sets itself from dedicated keys; letting vllmExtraArgs set them
# too would make two sources of truth (and --api-key would put the key on a command line).
MANAGED_VLLM_FLAGS = {
    "--tensor-parallel-size": "tensorParallelSize",
    "-tp": "tensorParallelSize",
    "--pipeline-parallel-size": "pipelineParallelSize",
    "-pp": "pipelineParallelSize",
    "--distributed-executor-backend": "(set by the program: always ray)",
    "--max-model-len": "maxModelLen",
    "--gpu-memory-utilization": "gpuMemoryUtilization",
    "--served-model-name": "servedModelName",
    "--api-key": "apiKey (it is passed through a root-only env file, never a command line)",
    "--host": "(set by the program: the head's primary IP)",
    "--port": "(set by the program)",
    "--model": "model",
}
_SAFE_ARG = re.compile(r"^[A-Za-z0-9._:/=,@+%-]+$")


@dataclass(frozen=True)
class EngineSettings:
    """vLLM settings beyond the parallelism."""

    vllm_extra_args: tuple[str, ...]
    max_model_len: int | None
    gpu_memory_utilization: float | None


def _check_extra_args(reader: Reader) -> tuple[str, ...]:
    """Each item is one word of `vllm serve`: no shell characters, and none of the flags
    the program sets from its own keys."""
    extra_args = reader.string_list("vllmExtraArgs") or []
    for arg in extra_args:
        if not _SAFE_ARG.match(arg):
            reader.fail(
                "vllmExtraArgs",
                f"item {json.dumps(arg)} may only hold letters, digits and . _ : / = , @ + % -"
                + injection_note(arg)
                + '. Put each word in its own item, e.g. ["--max-num-seqs", "64"]',
            )
            continue
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_VLLM_FLAGS:
            reader.fail("vllmExtraArgs", f"item {arg} is managed by the program; use {MANAGED_VLLM_FLAGS[flag]}")
    _check_model_task(reader, extra_args)
    return _with_vllm_dtype(reader, extra_args)


# How to say a pooling model's task, for the messages below.
_TASK_FIX = (
    'Fix: say the task as vLLM takes it, e.g. ["--runner", "pooling", "--pooler-config.task", "embed"] for an '
    "embedding model (/v1/embeddings), classify for a classifier or cross-encoder reranker (/classify, "
    '/v1/score, /v1/rerank), token_embed for late interaction (/v1/score, /v1/rerank); or ["--convert", "embed"] '
    "(or classify) to adapt a generative model"
)


def _check_model_task(reader: Reader, extra_args: list[str]) -> None:
    """vllmExtraArgs must say what the model serves, as vLLM takes it: its routes and the
    stack's probe follow the task (components/api_routes.py, with the vLLM sources), and
    a pooling model serves no completion."""
    if api_routes.names_the_removed_task_flag(extra_args):
        reader.fail(
            "vllmExtraArgs",
            "holds --task, which is no vllm serve option: vLLM 0.22 to 0.33 exit with 'unrecognized arguments: "
            f"--task' (vllm/engine/arg_utils.py has none). {_TASK_FIX}",
        )
        return
    convert = api_routes.flag_values(extra_args).get("--convert")
    if convert is not None and convert not in api_routes.VLLM_CONVERTS:
        reader.fail(
            "vllmExtraArgs",
            f"--convert {convert!r} is not one vLLM takes: {', '.join(api_routes.VLLM_CONVERTS)} "
            "(vllm/config/model.py ConvertOption; a reward model is a pooling model of its own, no conversion). "
            f"{_TASK_FIX}",
        )
        return
    task = api_routes.model_task(extra_args)
    if task is None:
        reader.fail(
            "vllmExtraArgs",
            "do not say both that the model is a pooling one (--runner pooling, or --convert) and its task "
            "(--pooler-config.task, or --convert), which decide its routes and the request the stack sends to see "
            "that it serves; vLLM would take what is missing from the model's own config, which the stack cannot "
            f"read before the model is there. {_TASK_FIX}",
        )
    elif task not in api_routes.SERVED_TASKS:
        known = task in api_routes.VLLM_POOLING_TASKS
        reader.fail(
            "vllmExtraArgs",
            (
                f"--pooler-config.task {task}: vLLM serves that task only at /pooling "
                "(vllm/entrypoints/pooling/factories.py), a route the gateway does not forward (it takes any "
                "pooling task in the request). "
                if known
                else f"--pooler-config.task {task!r} is not a pooling task vLLM takes "
                f"({', '.join(api_routes.VLLM_POOLING_TASKS)}; vllm/tasks.py). "
            )
            + f"The gateway serves the tasks {', '.join(api_routes.SERVED_POOLING_TASKS)}. {_TASK_FIX}",
        )


def _vllm_dtype_spelling(reader: Reader, value: str) -> str:
    """`value` of --dtype as vLLM spells it: its own spellings pass as written, the short
    ones (bf16 ...) are translated, since vLLM would refuse them."""
    if value in sizing.VLLM_DTYPE_CHOICES:
        return value
    try:
        canonical = sizing.canonical_dtype(value, "--dtype")
    except ValueError:
        # Not the planner's full list: the quantized types are no value for vLLM's --dtype.
        accepted = [spelling for spelling, name in sizing.DTYPE_SPELLINGS.items() if sizing.vllm_dtype(name)]
        reader.fail(
            "vllmExtraArgs",
            f"--dtype {value!r} is not a weight type vLLM takes; accepted: {', '.join(accepted)}. "
            "Fix: one of these after --dtype, or no --dtype for the model's own",
        )
        return value
    spelling = sizing.vllm_dtype(canonical)
    if spelling is None:
        reader.fail(
            "vllmExtraArgs",
            f"--dtype {value} is a quantized weight type; vLLM's --dtype takes only "
            f"{', '.join(sizing.VLLM_DTYPE_CHOICES)}. Quantized weights come from a quantized checkpoint "
            "(a model id that names its quantization) or --quantization. "
            'Fix: ["--quantization", "fp8"] in place of the --dtype, or drop it',
        )
        return value
    return spelling


def _with_vllm_dtype(reader: Reader, args: list[str]) -> tuple[str, ...]:
    """The args with any --dtype value (`--dtype X` or `--dtype=X`) in vLLM's spelling."""
    out = list(args)
    for i, arg in enumerate(args):
        if arg == "--dtype":
            if i + 1 == len(args):
                reader.fail("vllmExtraArgs", 'ends with --dtype and no value. Fix: ["--dtype", "bfloat16"]')
            else:
                out[i + 1] = _vllm_dtype_spelling(reader, args[i + 1])
        elif arg.startswith("--dtype="):
            out[i] = "--dtype=" + _vllm_dtype_spelling(reader, arg.split("=", 1)[1])
    return tuple(out)


def check_engine_settings(reader: Reader) -> EngineSettings:
    extra_args = _check_extra_args(reader)
    max_model_len = reader.integer("maxModelLen")
    if max_model_len is not None and max_model_len < 1:
        reader.fail("maxModelLen", "must be a positive number of tokens, e.g. 8192")
    gpu_memory_utilization = reader.number("gpuMemoryUtilization")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        reader.fail("gpuMemoryUtilization", "must be greater than 0 and at most 1, e.g. 0.90")
        gpu_memory_utilization = None
    return EngineSettings(extra_args, max_model_len, gpu_memory_utilization)
