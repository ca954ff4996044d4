"""TEST DOUBLE: vLLM's CPU platform with Ray's GPU resource as its device."""

from vllm.platforms.cpu import CpuPlatform


class FleetGpuPlatform(CpuPlatform):
    # vLLM's Ray executor asks Ray for this resource per worker and reads the IDs Ray
    # assigned; the CPU platform has none ("does not support ray").
    ray_device_key: str = "GPU"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        # Shared memory within a host only, as CUDA IPC within a node (communicator.py).
        return "vllm_gpu_platform_double.communicator.NodeLocalShmCpuCommunicator"
