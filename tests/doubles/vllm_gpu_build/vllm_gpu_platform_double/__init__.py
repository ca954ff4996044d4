"""TEST DOUBLE: the platform vLLM runs on the local fleet's hosts, which have no GPU.

vLLM calls `activate()` through the `vllm.platform_plugins` entry point while it
picks its platform; the class it names is vLLM's own CPU platform with one change,
the one that stands in for the GPU: Ray's `GPU` resource is the device, as on vLLM's
CUDA platform. The fleet's Ray nodes advertise `--num-gpus` as on a GPU node (the
program sets it from the instance type), so vLLM's Ray executor places one worker on
each logical GPU, across the nodes, exactly as it does on EC2.
"""


def activate() -> str:
    return "vllm_gpu_platform_double.platform.FleetGpuPlatform"
