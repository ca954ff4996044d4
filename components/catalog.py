"""The GPU instance catalog: a checked-in table, so validation and planning work offline.

Hardware figures are those `aws ec2 describe-instance-types` reports
(`GpuInfo`, `VCpuInfo`, `MemoryInfo`, `NetworkInfo.EfaInfo.MaximumEfaInterfaces`,
`NetworkInfo.MaximumNetworkCards`). Prices are us-east-1 Linux on-demand list prices;
each row says when and where its price was read. Check a new row against
`describe-instance-types` before adding it: a wrong EFA maximum makes a launch
template that EC2 rejects.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICE_SOURCE_PUBLISHED = "AWS EC2 on-demand pricing, us-east-1, Linux"


@dataclass(frozen=True)
class InstanceType:
    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gib: float
    vcpus: int
    memory_gib: int
    efa_supported: bool
    max_efa_interfaces: int
    network_cards: int
    network_gbps: int
    price_per_hour_usd: float
    price_date: str
    price_source: str = PRICE_SOURCE_PUBLISHED

    @property
    def total_gpu_memory_gib(self) -> float:
        return self.gpus * self.gpu_memory_gib


def _row(name, gpus, gpu_model, gpu_memory_gib, vcpus, memory_gib, max_efa, cards, gbps, price, date):
    return InstanceType(
        name=name,
        gpus=gpus,
        gpu_model=gpu_model,
        gpu_memory_gib=gpu_memory_gib,
        vcpus=vcpus,
        memory_gib=memory_gib,
        efa_supported=max_efa > 0,
        max_efa_interfaces=max_efa,
        network_cards=cards,
        network_gbps=gbps,
        price_per_hour_usd=price,
        price_date=date,
    )


# fmt: off
# name, GPUs, GPU model, GiB per GPU, vCPU, RAM GiB, max EFA interfaces, network cards, Gbps, $/h, price read on
_ROWS = (
    _row("g5.xlarge",      1, "NVIDIA A10G",  24,   4,   16,  0,  1,   10,  1.006,  "2025-06-01"),
    _row("g6.xlarge",      1, "NVIDIA L4",    24,   4,   16,  0,  1,   10,  0.8048, "2025-06-01"),
    _row("g5.12xlarge",    4, "NVIDIA A10G",  24,  48,  192,  1,  1,   40,  5.672,  "2026-01-21"),
    _row("g5.48xlarge",    8, "NVIDIA A10G",  24, 192,  768,  1,  1,  100, 16.288,  "2025-06-01"),
    _row("g6e.12xlarge",   4, "NVIDIA L40S",  48,  48,  384,  1,  1,  100, 10.493,  "2026-01-21"),
    _row("g6e.48xlarge",   8, "NVIDIA L40S",  48, 192, 1536,  1,  1,  400, 30.131,  "2026-01-21"),
    _row("p4d.24xlarge",   8, "NVIDIA A100",  40,  96, 1152,  4,  4,  400, 21.958,  "2026-01-21"),
    _row("p4de.24xlarge",  8, "NVIDIA A100",  80,  96, 1152,  4,  4,  400, 27.447,  "2026-01-21"),
    _row("p5.48xlarge",    8, "NVIDIA H100",  80, 192, 2048, 32, 32, 3200, 55.04,   "2026-01-21"),
    _row("p5en.48xlarge",  8, "NVIDIA H200", 141, 192, 2048, 16, 16, 3200, 63.296,  "2026-01-21"),
)
# fmt: on

CATALOG: dict[str, InstanceType] = {row.name: row for row in _ROWS}


def known_instance_types() -> list[str]:
    """Sorted so that error messages and plans are deterministic."""
    return sorted(CATALOG)


def lookup(name: str) -> InstanceType | None:
    return CATALOG.get(name)
