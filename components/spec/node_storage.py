"""Node storage: the image a node boots (amiId, nodeImage), its root volume
(rootVolumeGiB), the EFS model cache (retainModelCache, modelCacheFileSystemId) and where
each node keeps its stage (stageVolume); and what keeps an existing file system, looked up
by the program, from serving as the stack's model cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components import stage_volume
from components.config_keys import NAMESPACE
from components.spec.own_hosts import hosts_listed
from components.spec.reader import Problem, Reader, show

# The Deep Learning Base AMI's own snapshot is about 100 GiB; the virtualenv with
# vLLM and its CUDA wheels adds about 10 GiB more.
MIN_ROOT_VOLUME_GIB = 150
MAX_ROOT_VOLUME_GIB = 16384
# nodeImage: the node software baked into an image by the stack (components/node_image.py),
# or none (every node installs it at its first setup); else an AMI id the user brings.
NODE_IMAGE_BAKE = "bake"
NODE_IMAGE_NONE = "none"
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")
_FILE_SYSTEM = re.compile(r"^fs-[0-9a-f]{8,17}$")


@dataclass(frozen=True)
class NodeStorage:
    ami_id: str | None
    root_volume_gib: int
    retain_model_cache: bool
    # An existing file system to reuse as the model cache (modelCacheFileSystemId).
    model_cache_file_system_id: str | None
    # nodeImage: NODE_IMAGE_BAKE, NODE_IMAGE_NONE or an AMI id launched as is.
    node_image: str = NODE_IMAGE_BAKE


def check_node_storage(reader: Reader) -> NodeStorage:
    ami_id = reader.string("amiId")
    if ami_id is not None and not _AMI.match(ami_id):
        reader.fail("amiId", "is not an AMI id such as ami-0123456789abcdef0")
    root_volume_gib = reader.integer("rootVolumeGiB")
    if root_volume_gib is not None and not MIN_ROOT_VOLUME_GIB <= root_volume_gib <= MAX_ROOT_VOLUME_GIB:
        reader.fail(
            "rootVolumeGiB",
            f"must be from {MIN_ROOT_VOLUME_GIB} to {MAX_ROOT_VOLUME_GIB}: the Deep Learning AMI and the vLLM "
            f"virtualenv need about {MIN_ROOT_VOLUME_GIB} GiB",
        )
    file_system_id = reader.string("modelCacheFileSystemId")
    if file_system_id is not None and not _FILE_SYSTEM.match(file_system_id):
        reader.fail(
            "modelCacheFileSystemId",
            "is not an EFS file system id such as fs-0123456789abcdef0. Fix: the id aws efs describe-file-systems "
            "shows (a destroyed stack's kept cache: the command scripts/destroy printed)",
        )
        file_system_id = None
    node_image = _check_node_image(reader, ami_id)
    return NodeStorage(ami_id, root_volume_gib, bool(reader.boolean("retainModelCache")), file_system_id, node_image)


def _check_node_image(reader: Reader, ami_id: str | None) -> str:
    """nodeImage: bake (the default), none, or an AMI id launched as is. An AMI id beside
    amiId is refused: amiId is the base an image is baked on, nodeImage's id is launched as
    it is, and a node launches from one image."""
    value = reader.string("nodeImage")
    if value is None:
        return NODE_IMAGE_BAKE
    if value in (NODE_IMAGE_BAKE, NODE_IMAGE_NONE):
        return value
    if not _AMI.match(value):
        reader.fail(
            "nodeImage",
            f"is neither {NODE_IMAGE_BAKE}, {NODE_IMAGE_NONE} nor an AMI id such as ami-0123456789abcdef0. Fix: "
            f"pulumi config set {NAMESPACE}:nodeImage {NODE_IMAGE_BAKE} (the stack bakes the node software into an "
            f"image), {NODE_IMAGE_NONE} (every node installs it), or the id of an image you baked",
        )
        return NODE_IMAGE_BAKE
    if ami_id is not None:
        reader.fail(
            "nodeImage",
            f"is an AMI id while amiId is {ami_id}: amiId is the base image the stack bakes on (or launches with "
            f"nodeImage {NODE_IMAGE_NONE}), nodeImage's id an image launched as is. Fix: pulumi config rm "
            f"{NAMESPACE}:amiId, or set nodeImage to {NODE_IMAGE_BAKE} or {NODE_IMAGE_NONE}",
        )
    return value


def check_stage_volume(reader: Reader) -> str | None:
    """stageVolume: auto (None here: resolved once the spec is whole), instance-store or ebs.
    Refused with hosts: machines of the user's own get no EC2 volume, and their stage goes
    where modelCacheDir's host puts it."""
    value = reader.string("stageVolume")
    if value is None or value == stage_volume.STAGE_VOLUME_AUTO:
        return None
    if value not in stage_volume.STAGE_VOLUME_CHOICES:
        reader.fail(
            "stageVolume",
            f"is neither {', '.join(stage_volume.STAGE_VOLUME_CHOICES)}: where each GPU node keeps its copy of its "
            f"pipeline stages. Fix: pulumi config set {NAMESPACE}:stageVolume {stage_volume.STAGE_VOLUME_AUTO} "
            "(a gp3 volume that a stop keeps when idleStopMinutes is set and it wakes faster), "
            f"{stage_volume.STAGE_VOLUME_EBS} or {stage_volume.STAGE_VOLUME_INSTANCE_STORE}",
        )
        return None
    if hosts_listed(reader):
        reader.fail(
            "stageVolume",
            f"is {value} with {NAMESPACE}:hosts set: those are machines of your own, which get no EC2 volume and no "
            f"instance store from the stack. Fix: pulumi config rm {NAMESPACE}:stageVolume",
        )
        return None
    return value


# EFS: "you can create mount targets for a file system in only one VPC, and there can be only
# one mount target per Availability Zone"; a One Zone file system takes its one mount target only
# in its own zone (aws efs create-mount-target,
# https://docs.aws.amazon.com/cli/latest/reference/efs/create-mount-target.html).
EFS_MOUNT_TARGETS_DOC = "https://docs.aws.amazon.com/efs/latest/ug/manage-fs-access-create-delete-mount-targets.html"


@dataclass(frozen=True)
class ExistingMountTarget:
    mount_target_id: str
    vpc_id: str
    availability_zone: str
    # The stack's own (its interface carries the stack's efs group): made by an earlier
    # `pulumi up` of this stack, which this one updates.
    own: bool = False


def model_cache_sharing_problems(file_system_id: str, foreign_access_points: list[str]) -> list[Problem]:
    """An existing file system (modelCacheFileSystemId) that others reach through access
    points of their own: the stack replaces its file system policy with one that lets
    clients in only through the stack's access points (components/storage.py), which would
    lock them out."""
    if not foreign_access_points:
        return []
    first = sorted(foreign_access_points)[0]
    return [
        Problem(
            "modelCacheFileSystemId",
            show("modelCacheFileSystemId", file_system_id),
            f"has access points this stack does not own ({', '.join(sorted(foreign_access_points))}: another "
            "stack's or user's, by their tags): the stack would replace the file system's policy with one that "
            "admits clients only through its own access points, and lock them out. Fix: give this stack a file "
            f"system of its own (pulumi config rm {NAMESPACE}:modelCacheFileSystemId), or remove those access "
            f"points if nothing uses them (aws efs delete-access-point --access-point-id {first})",
        )
    ]


def model_cache_problems(
    file_system_id: str,
    one_zone: str | None,
    mount_targets: list[ExistingMountTarget],
    stack_vpc_id: str | None,
    stack_zone: str,
) -> list[Problem]:
    """What keeps an existing file system (modelCacheFileSystemId, looked up by the program)
    from taking the stack's own mount target in the node subnet. `stack_vpc_id` is None for
    a VPC the stack creates, in which no mount target can be yet."""
    problems = []
    shown = show("modelCacheFileSystemId", file_system_id)
    mount_targets = [target for target in mount_targets if not target.own]
    if one_zone is not None and one_zone != stack_zone:
        problems.append(
            Problem(
                "modelCacheFileSystemId",
                shown,
                f"is a One Zone file system in {one_zone}, but the nodes run in {stack_zone}: EFS creates its mount "
                f"target only in its own zone. Fix: pulumi config set {NAMESPACE}:availabilityZone {one_zone} "
                f"(or the private subnet of that zone with vpcId), or pulumi config rm {NAMESPACE}:"
                f"modelCacheFileSystemId for a new file system (see {EFS_MOUNT_TARGETS_DOC})",
            )
        )
    elsewhere = [t for t in mount_targets if t.vpc_id != stack_vpc_id]
    if elsewhere:
        where = ", ".join(f"{t.mount_target_id} in {t.vpc_id}" for t in elsewhere)
        vpc = stack_vpc_id or "the VPC this stack creates"
        problems.append(
            Problem(
                "modelCacheFileSystemId",
                shown,
                f"has mount targets in another VPC ({where}), and EFS gives a file system mount targets in one VPC "
                f"only: the stack's in {vpc} would be refused. Fix: aws efs delete-mount-target --mount-target-id "
                f"{elsewhere[0].mount_target_id} for each (if nothing there uses it), or deploy into that VPC with "
                f"vpcId (see {EFS_MOUNT_TARGETS_DOC})",
            )
        )
    same_zone = [t for t in mount_targets if t.vpc_id == stack_vpc_id and t.availability_zone == stack_zone]
    for target in same_zone:
        problems.append(
            Problem(
                "modelCacheFileSystemId",
                shown,
                f"already has mount target {target.mount_target_id} in {stack_zone}, the nodes' zone, and EFS allows "
                f"one mount target per zone: the stack's own would be refused. Fix: aws efs delete-mount-target "
                f"--mount-target-id {target.mount_target_id} (if nothing else mounts through it), or another "
                f"availabilityZone (see {EFS_MOUNT_TARGETS_DOC})",
            )
        )
    return problems
