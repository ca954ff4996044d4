"""The GPU instance catalog: a checked-in table, so validation and planning work offline.

Hardware figures are those `aws ec2 describe-instance-types` reports
(`GpuInfo`, `VCpuInfo`, `MemoryInfo`, `NetworkInfo.EfaInfo.MaximumEfaInterfaces`,
`NetworkInfo.MaximumNetworkCards`). Every row names where its figures were read and
when (`figures_source`); a figure no AWS page confirmed is named in `unverified`, with
what it rests on, so it can be checked with `describe-instance-types` before it matters.
The local NVMe instance store is `describe-instance-types`' `InstanceStorageInfo`
(`TotalSizeInGB`, `Disks`): 0 GB and 0 disks for a type without one. Its source is per row
(`instance_store_source`), like the other figures; where AWS publishes it, the store's
100% random-read IOPS at 4 KiB (`instance_store_read_iops`, 0 where no AWS page read here
gives it). Prices are us-east-1 Linux on-demand list prices; each row says when and where
its price was read. Check a new row against `describe-instance-types` before adding it: a wrong
EFA maximum makes a launch template that EC2 rejects.
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
    figures_source: str = ""
    unverified: str = ""  # the figures no AWS page read here confirmed, and what backs them
    price_source: str = PRICE_SOURCE_PUBLISHED
    # InstanceStorageInfo: TotalSizeInGB (decimal GB, as EC2 reports it) and the disk count;
    # 0 and 0 without an instance store.
    instance_store_gb: int = 0
    instance_store_disks: int = 0
    # The store's 100% random-read IOPS at 4 KiB, all its disks together, as AWS's table of
    # SSD instance store I/O performance gives it; 0 where no AWS page read here does.
    instance_store_read_iops: int = 0
    instance_store_source: str = ""

    @property
    def total_gpu_memory_gib(self) -> float:
        return self.gpus * self.gpu_memory_gib

    @property
    def instance_store_disk_gb(self) -> int:
        """One disk's size (EC2 gives every disk of a type the same size)."""
        return self.instance_store_gb // self.instance_store_disks if self.instance_store_disks else 0


def _row(
    name,
    gpus,
    gpu_model,
    gpu_memory_gib,
    vcpus,
    memory_gib,
    max_efa,
    cards,
    gbps,
    price,
    date,
    source,
    unverified="",
    *,
    store=(0, 0),
    store_read_iops=0,
    store_source="",
):
    """`store` is (disks, GB per disk) of the instance store, as InstanceStorageInfo.Disks lists it."""
    disks, disk_gb = store
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
        figures_source=source,
        unverified=unverified,
        instance_store_gb=disks * disk_gb,
        instance_store_disks=disks,
        instance_store_read_iops=store_read_iops,
        instance_store_source=store_source,
    )


# Where the figures were read, all on 2026-11-30.
READ_ON = "read 2026-11-30"
# GPUs, GPU memory, vCPUs, memory and network bandwidth of G4-G6 types (AWS Batch User Guide).
BATCH_GPU_TABLE = "https://docs.aws.amazon.com/batch/latest/userguide/gpu-jobs.html"
# The EC2 User Guide's own source as archived in June 2023 (awsdocs/amazon-ec2-user-guide at
# e3707c4): hardware and network tables (accelerated-computing-instances.md), EFA-capable
# types and "one EFA per network card; other types one EFA" (efa.md), multi-card types
# (using-eni.md). Live pages: efa.html#efa-instance-types, using-eni.html#network-cards.
EC2_GUIDE_2023 = (
    "https://github.com/awsdocs/amazon-ec2-user-guide/tree/e3707c431483ec0ffffcabebd36cf799ba682cd0/doc_source"
)
# P5: the multi-card EFA layout, a request of 32 EFA devices, one per network card.
EFA_MULTI_CARD = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html"
# Secondary (not AWS): TorchX's AWS named resources (vCPU, memory, GPUs, EFA devices).
TORCHX_AWS = "https://github.com/meta-pytorch/torchx/blob/main/torchx/specs/named_resources_aws.py"
# Secondary (not AWS): dstack's AWS offers for p5en.48xlarge, from the EC2 API.
DSTACK_P5EN = "https://github.com/dstackai/dstack/pull/4110"
# Instance store volumes per type ("Instance store volumes" table, accelerated computing:
# disks x GB, NVMe SSD) and their I/O ("SSD-based instance store volume I/O performance":
# 100% random-read IOPS at 4 KiB, all volumes used), in the same archived guide.
EC2_STORE_2023 = (
    f"{EC2_GUIDE_2023}/InstanceStorage.md (instance store volumes); "
    f"{EC2_GUIDE_2023}/accelerated-computing-instances.md#accelerated-computing-ssd-perf (random-read IOPS); "
    "read 2026-12-02"
)
# The instance store of the types no AWS page read here lists: AWS's product pages give it,
# unread here; check InstanceStorageInfo with describe-instance-types before relying on it.
STORE_UNREAD = "unverified (AWS's product page, not read here; check InstanceStorageInfo)"
# AWS's Price List offer file for EC2 (us-east-1, version 20260910195514): the `storage`
# attribute of each type, read here as a public test fixture quotes it (second-hand).
EC2_OFFER_FILE = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json"


# fmt: off
# name, GPUs, GPU model, GiB per GPU, vCPU, RAM GiB, max EFA interfaces, network cards, Gbps, $/h, price read on,
# where the figures come from, and which of them no AWS page read here confirmed.
_ROWS = (
    _row("g5.xlarge",      1, "NVIDIA A10G",  24,   4,   16,  0,  1,   10,  1.006,  "2025-06-01",
         f"{BATCH_GPU_TABLE} (1 GPU, 24 GiB, 4 vCPU, 16 GiB, up to 10 Gbps); {EC2_GUIDE_2023} (no EFA, one card); "
         f"{READ_ON}",
         store=(1, 250), store_read_iops=40_625, store_source=EC2_STORE_2023),
    _row("g6.xlarge",      1, "NVIDIA L4",    24,   4,   16,  0,  1,   10,  0.8048, "2025-06-01",
         f"{BATCH_GPU_TABLE} (1 GPU, 24 GiB, 4 vCPU, 16 GiB, up to 10 Gbps); {READ_ON}",
         "no EFA and one network card: G6 postdates the archived EFA and network-card lists, and no AWS page "
         "read here states either (single-node use does not depend on them); the instance store is read second-hand",
         store=(1, 250), store_source=f'{EC2_OFFER_FILE} ("1 x 250 GB NVMe SSD"; second-hand; read 2026-12-02)'),
    # One GPU and EFA: the smallest type on which a pipeline spans EFA-connected nodes
    # (the local fleet's configuration, one pipeline stage per node).
    _row("g5.8xlarge",     1, "NVIDIA A10G",  24,  32,  128,  1,  1,   25,  2.448,  "2025-06-01",
         f"{BATCH_GPU_TABLE} (1 GPU, 24 GiB, 32 vCPU, 128 GiB, 25 Gbps); {EC2_GUIDE_2023} (EFA; "
         f"one card, so one EFA); {READ_ON}",
         store=(1, 900), store_read_iops=250_000, store_source=EC2_STORE_2023),
    _row("g5.12xlarge",    4, "NVIDIA A10G",  24,  48,  192,  1,  1,   40,  5.672,  "2026-01-21",
         f"{BATCH_GPU_TABLE} (4 GPUs, 96 GiB, 48 vCPU, 192 GiB, 40 Gbps); {EC2_GUIDE_2023} (EFA; "
         f"one card, so one EFA); {READ_ON}",
         store=(1, 3800), store_read_iops=312_500, store_source=EC2_STORE_2023),
    _row("g5.48xlarge",    8, "NVIDIA A10G",  24, 192,  768,  1,  1,  100, 16.288,  "2025-06-01",
         f"{BATCH_GPU_TABLE} (8 GPUs, 192 GiB, 192 vCPU, 768 GiB, 100 Gbps); {EC2_GUIDE_2023} (EFA; "
         f"one card, so one EFA); {READ_ON}",
         store=(2, 3800), store_read_iops=625_000, store_source=EC2_STORE_2023),
    _row("g6e.12xlarge",   4, "NVIDIA L40S",  48,  48,  384,  1,  1,  100, 10.493,  "2026-01-21",
         f"{TORCHX_AWS} (4 GPUs, 48 vCPU, 384 GiB; secondary); {READ_ON}",
         "every figure: no AWS page read here lists G6e. The EFA maximum of 1 is the one to check "
         "(aws ec2 describe-instance-types --instance-types g6e.12xlarge): TorchX lists no EFA device for this size",
         store=(2, 1900), store_source=STORE_UNREAD),
    _row("g6e.48xlarge",   8, "NVIDIA L40S",  48, 192, 1536,  4,  4,  400, 30.131,  "2026-01-21",
         f"{TORCHX_AWS} (8 GPUs, 192 vCPU, 1536 GiB, 4 EFA devices; secondary); "
         f"{EC2_GUIDE_2023} (one EFA per network card); {READ_ON}",
         "every figure: no AWS page read here lists G6e. 4 EFA interfaces on 4 network cards (was 1 and 1 here) "
         "rests on TorchX and on 400 Gbps being 4 cards of 100; check with aws ec2 describe-instance-types "
         "--instance-types g6e.48xlarge before relying on it",
         store=(4, 1900), store_source=STORE_UNREAD),
    _row("p4d.24xlarge",   8, "NVIDIA A100",  40,  96, 1152,  4,  4,  400, 21.958,  "2026-01-21",
         f"{EC2_GUIDE_2023} (8 GPUs, 96 vCPU, 1152 GiB, 4 x 100 Gbps, EFA, 4 network cards, one EFA each); {READ_ON}",
         "40 GiB per GPU: the guide says only that P4de has the 80 GB A100s (P4d's 40 GB part is on the P4 product "
         "page, not read here)",
         store=(8, 1000), store_read_iops=2_000_000, store_source=EC2_STORE_2023),
    _row("p4de.24xlarge",  8, "NVIDIA A100",  80,  96, 1152,  4,  4,  400, 27.447,  "2026-01-21",
         f"{EC2_GUIDE_2023} (8 GPUs, 96 vCPU, 1152 GiB, 4 x 100 Gbps, EFA, 4 network cards, one EFA each; "
         f"80 GB A100s); {READ_ON}",
         store=(8, 1000), store_read_iops=2_000_000, store_source=EC2_STORE_2023),
    _row("p5.48xlarge",    8, "NVIDIA H100",  80, 192, 2048, 32, 32, 3200, 55.04,   "2026-01-21",
         f"{EFA_MULTI_CARD} (32 EFA devices, one per network card); {TORCHX_AWS} (8 GPUs, 192 vCPU, 2048 GiB; "
         f"secondary); {READ_ON}",
         "80 GiB per GPU, 192 vCPU, 2048 GiB and 3200 Gbps: no AWS page read here states them (TorchX agrees on "
         "vCPU and memory); the instance store is read second-hand",
         store=(8, 3840), store_source=f'{EC2_OFFER_FILE} ("8 x 3840 GB SSD"; second-hand; read 2026-12-02)'),
    _row("p5en.48xlarge",  8, "NVIDIA H200", 141, 192, 2048, 16, 16, 3200, 63.296,  "2026-01-21",
         f"{TORCHX_AWS} (192 vCPU, 2048 GiB, 16 EFA devices; secondary); "
         f"{DSTACK_P5EN} (8 x H200 141 GB, 192 vCPU, 2048 GB; secondary); {READ_ON}",
         "every figure: no AWS page read here lists P5en; "
         "16 EFA on 16 network cards and 3200 Gbps rest on the secondary sources",
         store=(8, 3840), store_source=STORE_UNREAD),
)
# fmt: on

CATALOG: dict[str, InstanceType] = {row.name: row for row in _ROWS}


def known_instance_types() -> list[str]:
    """Sorted so that error messages and plans are deterministic."""
    return sorted(CATALOG)


def lookup(name: str) -> InstanceType | None:
    return CATALOG.get(name)
