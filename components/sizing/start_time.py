"""How long a cold `pulumi up` takes to the first token, term by term with the figure
each assumes (instance boot, the node software, the model's download and stage copy, the
fabric check, the model's load, the engine's start); the node image's bake; and the
bounds the head's engine start is held to (VLLM_ENGINE_READY_TIMEOUT_S, start-vllm's
stall limit), which follow from the same estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from components import fabric
from components.catalog import InstanceType
from components.image import NVME_MOUNT
from components.sizing.model_bytes import Download, NodeLoad, model_download, node_loads
from components.sizing.model_size import GB, ModelSize, served_model_size

# Cold `pulumi up` to first token: the terms and the figures they assume.
INSTANCE_BOOT_SECONDS = 180  # launch to SSH for a GPU instance on the DLAMI (SkyPilot 101-147 s; ParallelCluster 294 s)
# The nodes' software: one locked environment (components/node_env.py), fetched once into
# the wheelhouse on EFS, then installed offline by every node in parallel. Measured on
# 2026-11-30 with `make bench-install` on the 2-core test machine: the local hosts' lock,
# 1.01 GB of wheels, downloaded by pip in 68.8 s (14.6 MB/s) and installed from the
# wheelhouse by uv (byte-compiled) in 93.8 s. The GPU nodes' lock is 4.40 GB of wheels
# (`python tools/wheelhouse_size.py`, the same day). Installing is unpacking and
# byte-compiling, spread over the cores: a GPU node's 32+ cores make it shorter than this
# upper bound.
GPU_WHEELHOUSE_GB = 4.40
INDEX_DOWNLOAD_MB_S = 14.6
WHEELHOUSE_INSTALL_SECONDS_PER_GB = 93.8 / 1.01
# Not measured (no AWS here): amazon-efs-utils is built from source at first boot, as AWS
# documents for Ubuntu; an estimate.
EFS_UTILS_BUILD_SECONDS = 60
# A baked node image (nodeImage bake, components/node_image.py): the node launches with the
# software, and setup only checks the virtualenv against the lock. Measured on 2026-12-05 on
# the 2-core test machine: `node-env check` of a virtualenv that is the local hosts' lock
# (170 packages) took 0.14-0.15 s over three runs.
SOFTWARE_CHECK_SECONDS = 0.15
# Not measured (no AWS here): Image Builder's own steps around the install (launching its
# builder, AWSTOE, stopping it, snapshotting the root volume and registering the AMI); an
# estimate.
IMAGE_BUILDER_OVERHEAD_SECONDS = 900
# components/node_image.py BUILDER_INSTANCE_TYPE, c6i.2xlarge: 8 vCPUs (aws.amazon.com/ec2/instance-types/c6i).
BUILDER_VCPUS = 8
ENGINE_START_BASE_SECONDS = 60  # vLLM process, Ray placement, P2P check
ENGINE_START_SECONDS_PER_B = 2.5  # compile and CUDA graphs grow with size: 70B TP 8 ~ 3-4 min (vllm #19824)

# vLLM's API server waits VLLM_ENGINE_READY_TIMEOUT_S for its engine (loading the weights,
# profiling, CUDA graphs) and gives up after it; systemd then restarts it, which loops
# when the model needs longer. 600 s is vLLM's default (vllm/envs.py of the pinned vLLM), kept as the
# floor; above it, a generous multiple of the estimate, so that a slow start that is
# still making progress is not killed.
ENGINE_READY_TIMEOUT_FLOOR_SECONDS = 600
ENGINE_READY_TIMEOUT_FACTOR = 3

# The head's start-vllm tells a slow start from a stuck one by vllm.service's journal
# (scripts/node/vllm-cluster-node wait_vllm): it fails a start that wrote no line for this
# long. vLLM writes a line when each stage of its start ends (weights loaded, graphs
# compiled, CUDA graphs captured: about a minute each for a 70B at TP 8, vllm #19824), and
# its progress bars end their line only when they finish, so a start that makes progress
# is silent at most for its longest stage: the weights' load or the engine's start as
# estimated above, whole. The same factor and floor as the engine's own timeout: a
# generous multiple, never below vLLM's default wait for its whole engine (600 s), so
# that first-use compiles the estimate leaves out do not fail a start that progresses.
ENGINE_START_STALL_FACTOR = ENGINE_READY_TIMEOUT_FACTOR
ENGINE_START_STALL_FLOOR_SECONDS = ENGINE_READY_TIMEOUT_FLOOR_SECONDS


@dataclass(frozen=True)
class Term:
    name: str
    seconds: float
    assumes: str


def model_load_seconds(model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None) -> float:
    """The engine's read of the weights on the slowest node: its stage from local NVMe with
    the local copy, else the whole model from the EFS cache."""
    return max(load.load_seconds for load in node_loads(model, instance, nodes, pp))


def engine_start_seconds(params_b: float) -> float:
    return ENGINE_START_BASE_SECONDS + ENGINE_START_SECONDS_PER_B * params_b


def engine_ready_timeout_seconds(model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """VLLM_ENGINE_READY_TIMEOUT_S for this model: the factor times the estimated load
    and start, never below vLLM's own default. The copy to local NVMe comes before vLLM
    starts, so it is not in it."""
    estimate = model_load_seconds(model, instance, nodes, pp) + engine_start_seconds(model.params_b)
    return max(ENGINE_READY_TIMEOUT_FLOOR_SECONDS, math.ceil(ENGINE_READY_TIMEOUT_FACTOR * estimate))


def engine_start_stall_seconds(model: ModelSize, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """How long the engine's start may go without a line in its journal before start-vllm
    calls it stuck: the factor times its longest silent stage (the weights' load on the
    slowest node, or the engine start), never below the floor."""
    longest = max(model_load_seconds(model, instance, nodes, pp), engine_start_seconds(model.params_b))
    return max(ENGINE_START_STALL_FLOOR_SECONDS, math.ceil(ENGINE_START_STALL_FACTOR * longest))


def engine_ready_timeout_for(model_name: str, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """What the head's vllm.env sets, from the config alone (the planner shows the same).
    Without `pp`, one stage per node."""
    return engine_ready_timeout_seconds(served_model_size(model_name, instance, nodes), instance, nodes, pp)


def engine_start_stall_for(model_name: str, instance: InstanceType, nodes: int, pp: int | None = None) -> int:
    """What the head's start-vllm is handed (--stall-seconds), from the config alone, as
    engine_ready_timeout_for."""
    return engine_start_stall_seconds(served_model_size(model_name, instance, nodes), instance, nodes, pp)


def software_terms(on_builder: bool = False) -> list[Term]:
    """Installing the node software: on every node at its first setup, or once on the image's
    builder (its own wheelhouse, fetched straight from the index)."""
    where = "on the image's builder" if on_builder else "at first boot"
    return [
        Term("efs-utils build", EFS_UTILS_BUILD_SECONDS, f"estimate: the EFS mount helper built {where}"),
        Term(
            "wheel fetch",
            GPU_WHEELHOUSE_GB * 1000 / INDEX_DOWNLOAD_MB_S,
            f"{GPU_WHEELHOUSE_GB} GB of locked wheels at {INDEX_DOWNLOAD_MB_S} MB/s "
            "(make bench-install), once per lock",
        ),
        Term(
            "software install",
            GPU_WHEELHOUSE_GB * WHEELHOUSE_INSTALL_SECONDS_PER_GB,
            f"{GPU_WHEELHOUSE_GB} GB from the wheelhouse at {WHEELHOUSE_INSTALL_SECONDS_PER_GB:.0f} s/GB "
            "(make bench-install, 2 cores: an upper bound), "
            + (f"on the builder ({BUILDER_VCPUS} vCPUs)" if on_builder else "nodes in parallel"),
        ),
    ]


def image_bake() -> list[Term]:
    """The node image's bake (components/node_image.py), once per lock and base image: the
    same install on Image Builder's builder, and Image Builder's own steps."""
    return [
        *software_terms(on_builder=True),
        Term(
            "image builder",
            IMAGE_BUILDER_OVERHEAD_SECONDS,
            "estimate, not measured: the builder's launch, AWSTOE, the root volume's snapshot and the AMI",
        ),
    ]


def time_to_first_token(
    model: ModelSize,
    instance: InstanceType,
    nodes: int,
    pp: int | None = None,
    efs_utils_version: str | None = None,
    readers: int | None = None,
    baked_image: bool = False,
) -> list[Term]:
    """The terms of a cold `pulumi up` to the first token, each with its assumption. With a
    baked image the software is in it (image_bake, shown apart) and setup only checks it."""
    loads = node_loads(model, instance, nodes, pp, efs_utils_version, readers)
    slowest_load = max(loads, key=lambda load: load.load_seconds)
    return [
        Term("instance boot", INSTANCE_BOOT_SECONDS, "launch to SSH on the Deep Learning AMI"),
        *(_software_check_terms() if baked_image else software_terms()),
        _model_fetch_term(model_download(model, nodes, efs_utils_version), loads),
        *_fabric_check_terms(instance, nodes),
        Term(
            "model load",
            slowest_load.load_seconds,
            f"the engine reads ~{slowest_load.load_bytes / GB:.1f} GB per node from {slowest_load.load_from} "
            f"at {slowest_load.load_mib_s:.0f} MiB/s ({slowest_load.load_source})",
        ),
        Term(
            "engine start",
            engine_start_seconds(model.params_b),
            f"{ENGINE_START_BASE_SECONDS} s + {ENGINE_START_SECONDS_PER_B} s per billion parameters",
        ),
    ]


def _software_check_terms() -> list[Term]:
    """With a baked image: setup checks the image's environment against the lock."""
    return [
        Term(
            "software check",
            SOFTWARE_CHECK_SECONDS,
            f"the baked image holds the lock's environment: setup checks it ({SOFTWARE_CHECK_SECONDS} s for "
            "170 packages, node-env check, measured on the test machine)",
        )
    ]


def _model_fetch_term(download: Download, loads: list[NodeLoad]) -> Term:
    """The model's way onto the nodes before the engine reads it: the download, and with a
    local copy each node's copy of its stage beside it."""
    slowest_copy = max(loads, key=lambda load: load.copy_seconds)
    if not slowest_copy.local:
        return Term("model download", download.seconds, f"{download.assumes}; no stage copy: {slowest_copy.reason}")
    # Gang 0's nodes copy each file of their stage as soon as it lands on the cache
    # (vllm-cluster-node prepare-serve --model-landing), so the copy runs beside the
    # download and the two cost the slower of them, not their sum.
    return Term(
        "download+stage",
        max(download.seconds, slowest_copy.copy_seconds),
        f"the download and each node's copy of its stage overlap (each file copied as it lands), the slower "
        f"of: download {download.seconds:.0f} s ({download.assumes}); stage copy "
        f"{slowest_copy.copy_seconds:.0f} s (largest stage ~{slowest_copy.efs_bytes / GB:.1f} GB from the EFS "
        f"cache to {NVME_MOUNT} at {slowest_copy.efs_mib_s:.0f} MiB/s, nodes in parallel; EFS's per-client "
        "limit taken per direction, the download writing while the copy reads: not measured)",
    )


def _fabric_check_terms(instance: InstanceType, nodes: int) -> list[Term]:
    """The gang's all-reduce check of its network (components/fabric.py), when it is gated."""
    if not fabric.gated(nodes):
        return []
    return [
        Term(
            "fabric check",
            fabric.check_seconds(instance, nodes),
            f"{fabric.SETUP_SECONDS} s to set up, then {fabric.NCCL_WARMUP + fabric.NCCL_ITERATIONS} "
            f"all-reduces of {fabric.NCCL_BYTES // 2**20} MiB per GPU over {nodes} nodes at the network's "
            f"{fabric.line_rate_gbps(instance):g} GB/s (components/fabric.py; the gate fails below "
            f"{fabric.floor(instance, gloo=False).gbps:g} GB/s)",
        )
    ]
