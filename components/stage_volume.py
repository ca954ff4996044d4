"""A stage that survives a stop (issue 35 point 3): a gp3 data volume per GPU node, sized
for its stage, that keeps the node's copy of its pipeline stages across an EC2 stop and
start, so a wake reads the weights from it instead of copying them from the EFS cache
again (the instance store comes back empty after a stop).

stageVolume chooses it: instance-store (the stage on the instance store, copied again at
each wake), ebs (the gp3 volume), or auto, the default: ebs when idleStopMinutes is set,
the stack serves from a local copy of its stage and the plan's wake with the volume is the
faster, else the instance store. Each instance declares the volume under ignoreChanges
(components/compute.py), and each node decides at boot from what it was launched with
(vllm-cluster-node stage_volume_launched): a change of the choice reaches nodes created
from then on, and replaces no running node nor restarts its engine.

The figures and their sources are here; the gp3 input limits AWS enforces are in
components/aws_contract.py (GP3_*), which this sizes within.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components import aws_contract, sizing
from components.catalog import InstanceType

STAGE_VOLUME_AUTO = "auto"
STAGE_VOLUME_INSTANCE_STORE = "instance-store"
STAGE_VOLUME_EBS = "ebs"
STAGE_VOLUME_CHOICES = (STAGE_VOLUME_AUTO, STAGE_VOLUME_INSTANCE_STORE, STAGE_VOLUME_EBS)

# Where a node mounts its stage volume: the program's own path, not the image's (the
# Deep Learning AMI mounts its instance store at image.NVME_MOUNT at every boot). vLLM never
# reads this path: the node binds the volume's models directory onto the instance store's
# (bootstrap.LOCAL_MODEL_ROOT), so the stage's path, and with it vLLM's command, is the same
# whichever disk holds it, and a change of stageVolume restarts no engine.
STAGE_VOLUME_MOUNT = "/opt/vllm-cluster/stage"
# The device name each instance maps it to (aws.ec2.Instance ebs_block_devices; not the launch
# template, whose new version would replace every node). On Nitro instances EBS volumes are
# NVMe devices whose kernel names (nvme1n1, ...) follow discovery order, not this name, so the
# node finds the volume by its serial, the volume id, which udev links as
# STAGE_VOLUME_BY_ID_PREFIX<id> ("Amazon EBS and NVMe":
# https://docs.aws.amazon.com/ebs/latest/userguide/identify-nvme-ebs-device.html), and takes
# the one EBS volume that does not hold the root file system.
STAGE_VOLUME_DEVICE_NAME = "/dev/sdf"
STAGE_VOLUME_BY_ID_PREFIX = "nvme-Amazon_Elastic_Block_Store_vol"
# Whether a node was launched with its stage volume: the instance metadata lists, under
# block-device-mapping/, an ebsN entry for each EBS volume "present at launch time or when the
# instance was last started", its value the device name it was mapped to (EC2 User Guide,
# "Instance metadata categories",
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html; the
# node accepts the name with or without /dev/). A node running before its stack chose the
# volume has no such entry, and keeps its stage on the instance store. Read with an IMDSv2
# token (the launch template requires one: compute.py metadata_options), from
# image.INSTANCE_METADATA_URL.
IMDS_BLOCK_DEVICE_MAPPING = "/latest/meta-data/block-device-mapping/"
IMDS_TOKEN_PATH = "/latest/api/token"
# The file system's label: formatted once, when the volume is blank; mounted by it after.
STAGE_VOLUME_LABEL = "vllm-stage"

# Room beyond the stage's estimated bytes: a stage is whole files, up to a shard more at
# each boundary (sizing.node_shares), and ext4's own metadata.
STAGE_VOLUME_HEADROOM = 0.15

# gp3 as far as AWS allows since September 2025 (aws_contract.GP3_SOURCE): the highest
# throughput, and the IOPS it needs at 0.25 MiB/s per IOPS; the size at least what those
# IOPS need at 500 IOPS per GiB (aws_contract.GP3_RATIO_SOURCE).
STAGE_VOLUME_THROUGHPUT_MIB_S = aws_contract.GP3_THROUGHPUT[1]
STAGE_VOLUME_IOPS = max(
    aws_contract.GP3_IOPS[0], math.ceil(STAGE_VOLUME_THROUGHPUT_MIB_S / aws_contract.GP3_MIBS_PER_IOPS)
)
STAGE_VOLUME_MIN_GIB = math.ceil(STAGE_VOLUME_IOPS / aws_contract.GP3_IOPS_PER_GIB)

# [ebs-pricing] gp3 in us-east-1, https://aws.amazon.com/ebs/pricing/ (its gp3 example;
# the figures as AWS lists them, read 2026-12-05 through secondary copies, not the page
# itself): $0.08 per GB-month of storage, $0.005 per provisioned IOPS-month above the
# free 3,000, $0.040 per provisioned MB/s-month above the free 125; billed while the
# volume exists, the instance running or stopped.
EBS_PRICING_SOURCE = "https://aws.amazon.com/ebs/pricing/ (us-east-1, gp3)"
GP3_GB_MONTH_USD = 0.08
GP3_IOPS_MONTH_USD = 0.005
GP3_MIB_S_MONTH_USD = 0.040
GP3_FREE_IOPS = aws_contract.GP3_IOPS[0]
GP3_FREE_MIB_S = aws_contract.GP3_THROUGHPUT[0]


@dataclass(frozen=True)
class StageVolume:
    """One node's gp3 stage volume: what each instance declares, and what it costs."""

    size_gib: int
    iops: int
    throughput_mib_s: int

    @property
    def month_usd(self) -> float:
        return (
            self.size_gib * GP3_GB_MONTH_USD
            + max(0, self.iops - GP3_FREE_IOPS) * GP3_IOPS_MONTH_USD
            + max(0, self.throughput_mib_s - GP3_FREE_MIB_S) * GP3_MIB_S_MONTH_USD
        )

    @property
    def hour_usd(self) -> float:
        return self.month_usd / sizing.HOURS_PER_MONTH

    def cost_breakdown(self) -> str:
        return (
            f"{self.size_gib} GiB x ${GP3_GB_MONTH_USD}/GB-month + "
            f"{self.iops - GP3_FREE_IOPS:,} IOPS above {GP3_FREE_IOPS:,} x ${GP3_IOPS_MONTH_USD} + "
            f"{self.throughput_mib_s - GP3_FREE_MIB_S:,} MiB/s above {GP3_FREE_MIB_S} x ${GP3_MIB_S_MONTH_USD}"
        )


def stage_volume_for(model_name: str, instance: InstanceType, nodes: int, pp: int | None = None) -> StageVolume:
    """The volume every node of the stack gets: sized for the largest node's copied stages
    plus headroom, at gp3's highest throughput."""
    model = sizing.served_model_size(model_name, instance, nodes)
    largest = max(share.bytes for share in sizing.node_shares(model, nodes, pp or nodes))
    size = max(STAGE_VOLUME_MIN_GIB, math.ceil(largest * (1 + STAGE_VOLUME_HEADROOM) / sizing.GIB))
    return StageVolume(size, STAGE_VOLUME_IOPS, STAGE_VOLUME_THROUGHPUT_MIB_S)


def volume_read_source(volume: StageVolume) -> str:
    return (
        f"the gp3 stage volume's provisioned {volume.throughput_mib_s:,} MiB/s ({aws_contract.GP3_SOURCE}); "
        "the instance's own EBS bandwidth is assumed not lower (not in the catalog)"
    )
