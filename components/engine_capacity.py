"""How many requests one gang's engine runs at once: vLLM's max_num_seqs, as the stack's
vllmExtraArgs set it or as vLLM picks it for the gang's GPUs. Two readers: the gateway's
sizing (how many streams it must hold) and the waker's scale-in (whether the load fits on
one gang fewer). Pure: reads the spec only.
"""

from __future__ import annotations

from components.api_routes import flag_values

# vLLM's defaults when --max-num-seqs is not given, for `vllm serve` (the OpenAI API
# server's usage context): 1024 on a GPU of at least 70 GiB whose name does not say A100
# (H100, H200, MI300x), 256 on every other GPU (vllm/engine/arg_utils.py,
# EngineArgs.get_batch_defaults: "if device_memory >= 70 * GiB_bytes and 'a100' not in
# device_name: ... default_max_num_seqs = {..., UsageContext.OPENAI_API_SERVER: 1024}",
# else 256; the A100 is left out on purpose, vLLM PR #17885).
VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_LARGE_GPU_MAX_NUM_SEQS = 1024
VLLM_LARGE_GPU_MEMORY_GIB = 70
MAX_NUM_SEQS_FLAG = "--max-num-seqs"


def default_max_num_seqs(gpu_model: str, gpu_memory_gib: float) -> int:
    """vLLM's max_num_seqs for `vllm serve` on this GPU when the flag is not given."""
    if gpu_memory_gib >= VLLM_LARGE_GPU_MEMORY_GIB and "a100" not in gpu_model.lower():
        return VLLM_LARGE_GPU_MAX_NUM_SEQS
    return VLLM_DEFAULT_MAX_NUM_SEQS


def gang_max_num_seqs(vllm_extra_args: tuple[str, ...] | list[str], gpu_model: str, gpu_memory_gib: float) -> int:
    """The requests one gang runs at once: --max-num-seqs from vllmExtraArgs when it is a
    whole number above 0 (the last one given, as vLLM's argparse takes it), else vLLM's
    default for the GPU. A gang is one engine whatever its TP x PP: the scheduler on its
    head runs the batch."""
    given = flag_values(vllm_extra_args).get(MAX_NUM_SEQS_FLAG, "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return default_max_num_seqs(gpu_model, gpu_memory_gib)


def spec_gang_max_num_seqs(spec) -> int:
    """gang_max_num_seqs for a ClusterSpec."""
    return gang_max_num_seqs(spec.vllm_extra_args, spec.instance.gpu_model, spec.instance.gpu_memory_gib)
