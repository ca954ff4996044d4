"""The model cache: one EFS file system shared by every node, so the weights are
downloaded once and every node sees them at the same path (vLLM requires the
same model path on all nodes).

- Encrypted at rest (set at creation; it cannot be turned on later).
- Elastic throughput: about 1,500 MiB/s per client for reads, against about
  100 MiB/s for a small Bursting file system; a 140 GB model loads in minutes,
  not tens of minutes.
- One mount target, in the node subnet, admitting NFS only from the cluster group.
- An access point that pins the POSIX owner and a directory, so the nodes never
  write as root onto the file system's root: the model tree and its warm-up cache,
  which every node reads and only gang 0's nodes write (the model's staging, vLLM's
  compiled pieces), through their roles' ClientWrite (components/compute.py): what
  another node could write there, the next node would load and run as root.
- A second access point for the wheelhouse (the nodes' locked wheels), a tree of its
  own that the model tree's clients cannot reach. Every node may read it; only the
  wheelhouse writer (gang 0's head, whose role alone may ClientWrite through it,
  components/compute.py) may write it: a node that is compromised cannot plant or
  swap the files the others install from.
- A file-system policy that refuses any access without TLS, and lets clients in only
  through these access points, to read. EFS allows an action when either this policy
  or the client's role allows it
  (https://docs.aws.amazon.com/efs/latest/ug/iam-access-control-nfs-efs.html), so
  the roles' own policies are the only way to write the model tree or the wheelhouse.
- retainModelCache keeps the file system (and the models on it) on destroy.
- modelCacheFileSystemId reuses an existing file system (a kept cache): the stack then
  declares no FileSystem, only its own mount target, access point and policy on it, so
  destroying the stack never deletes that file system.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.tagging import renamed_from, tags

# The Deep Learning AMI's default user (ubuntu) owns the cache, so the services and
# an admin logged in over SSH read and write it with the same identity.
MODEL_CACHE_UID = 1000
MODEL_CACHE_GID = 1000
MODEL_CACHE_DIRECTORY = "/models"
# Beside the model tree, not inside it: an access point confines its clients to its
# root directory (https://docs.aws.amazon.com/efs/latest/ug/efs-access-points.html),
# so the model tree's clients, who may write, never see the wheelhouse.
WHEELHOUSE_DIRECTORY = "/wheelhouse"


@dataclass(frozen=True)
class ExistingFileSystem:
    """A file system the stack reuses (modelCacheFileSystemId), as the program looked it up."""

    file_system_id: str
    arn: str
    dns_name: str


@dataclass
class ModelStorageArgs:
    subnet_id: pulumi.Input[str]
    efs_group_id: pulumi.Input[str]
    retain_on_destroy: bool
    # None: the stack creates its own file system.
    existing: ExistingFileSystem | None = None


def file_system_policy(file_system_arn: str, models_access_point_arn: str, wheelhouse_access_point_arn: str) -> str:
    """Deny anything not over TLS; let clients that come through a mount target read
    the model tree and the wheelhouse through their access points. Nothing here allows
    writing either (ClientWrite): only the writers' roles do, so a client that mounts
    without IAM, or with another role, reads and nothing more."""
    through_mount_target = {"elasticfilesystem:AccessedViaMountTarget": "true"}
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyWithoutTls",
                    "Effect": "Deny",
                    "Principal": {"AWS": "*"},
                    "Action": "*",
                    "Resource": file_system_arn,
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                },
                {
                    "Sid": "AllowReadingTheModelTreeThroughMountTarget",
                    "Effect": "Allow",
                    "Principal": {"AWS": "*"},
                    "Action": ["elasticfilesystem:ClientMount"],
                    "Resource": file_system_arn,
                    "Condition": {
                        "Bool": through_mount_target,
                        "StringEquals": {"elasticfilesystem:AccessPointArn": models_access_point_arn},
                    },
                },
                {
                    "Sid": "AllowReadingTheWheelhouseThroughMountTarget",
                    "Effect": "Allow",
                    "Principal": {"AWS": "*"},
                    "Action": ["elasticfilesystem:ClientMount"],
                    "Resource": file_system_arn,
                    "Condition": {
                        "Bool": through_mount_target,
                        "StringEquals": {"elasticfilesystem:AccessPointArn": wheelhouse_access_point_arn},
                    },
                },
            ],
        },
        sort_keys=True,
    )


class ModelStorage(pulumi.ComponentResource):
    file_system_id: pulumi.Output[str]
    file_system_arn: pulumi.Output[str]
    dns_name: pulumi.Output[str]
    access_point_id: pulumi.Output[str]
    access_point_arn: pulumi.Output[str]
    wheelhouse_access_point_id: pulumi.Output[str]
    wheelhouse_access_point_arn: pulumi.Output[str]
    mount_target_id: pulumi.Output[str]
    # The nodes mount at boot: the mount target and the policy must exist first.
    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: ModelStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:ModelStorage", name, None, opts)
        file_system_id, file_system_arn, dns_name = self._file_system(name, args)
        mount_target = aws.efs.MountTarget(
            f"{name}-model-cache-mount",
            file_system_id=file_system_id,
            subnet_id=args.subnet_id,
            security_groups=[args.efs_group_id],
            opts=renamed_from(f"{name}-mount", parent=self),
        )
        access_point = self._access_point(
            f"{name}-model-cache-access-point",
            file_system_id,
            MODEL_CACHE_DIRECTORY,
            renamed_from(f"{name}-models", parent=self),
        )
        wheelhouse_access_point = self._access_point(
            f"{name}-wheelhouse-access-point",
            file_system_id,
            WHEELHOUSE_DIRECTORY,
            pulumi.ResourceOptions(parent=self),
        )
        policy = self._policy(name, args, file_system_id, file_system_arn, access_point, wheelhouse_access_point)

        self.file_system_id = file_system_id
        self.file_system_arn = file_system_arn
        self.dns_name = dns_name
        self.access_point_id = access_point.id
        self.access_point_arn = access_point.arn
        self.wheelhouse_access_point_id = wheelhouse_access_point.id
        self.wheelhouse_access_point_arn = wheelhouse_access_point.arn
        self.mount_target_id = mount_target.id
        self.ready = [mount_target, policy]
        self.register_outputs(
            {
                "fileSystemId": self.file_system_id,
                "fileSystemArn": self.file_system_arn,
                "dnsName": self.dns_name,
                "accessPointId": self.access_point_id,
                "accessPointArn": self.access_point_arn,
                "wheelhouseAccessPointId": self.wheelhouse_access_point_id,
                "wheelhouseAccessPointArn": self.wheelhouse_access_point_arn,
                "mountTargetId": self.mount_target_id,
            }
        )

    def _file_system(
        self, name: str, args: ModelStorageArgs
    ) -> tuple[pulumi.Output[str], pulumi.Output[str], pulumi.Output[str]]:
        """The file system's id, ARN and DNS name: the stack's own, or the one it reuses
        (modelCacheFileSystemId)."""
        if args.existing is None:
            file_system = aws.efs.FileSystem(
                f"{name}-model-cache",
                encrypted=True,
                throughput_mode="elastic",
                performance_mode="generalPurpose",
                tags=tags(f"{name}-model-cache"),
                opts=renamed_from(f"{name}-fs", parent=self, retain_on_delete=args.retain_on_destroy),
            )
            return file_system.id, file_system.arn, file_system.dns_name
        # Not the stack's: nothing here can delete it, whatever retainModelCache says.
        return (
            pulumi.Output.from_input(args.existing.file_system_id),
            pulumi.Output.from_input(args.existing.arn),
            pulumi.Output.from_input(args.existing.dns_name),
        )

    def _policy(
        self,
        name: str,
        args: ModelStorageArgs,
        file_system_id: pulumi.Output[str],
        file_system_arn: pulumi.Output[str],
        access_point: aws.efs.AccessPoint,
        wheelhouse_access_point: aws.efs.AccessPoint,
    ) -> aws.efs.FileSystemPolicy:
        """The file system's policy (file_system_policy): TLS only, through the stack's
        mount target and access points."""
        return aws.efs.FileSystemPolicy(
            f"{name}-model-cache-tls-only",
            file_system_id=file_system_id,
            policy=pulumi.Output.all(file_system_arn, access_point.arn, wheelhouse_access_point.arn).apply(
                lambda arns: file_system_policy(*arns)
            ),
            # A file system that outlives the stack keeps its policy: without one EFS lets
            # any client of a mount target in, TLS or not. This one names only the stack's
            # access points, so it admits nobody until a stack reuses the cache.
            opts=renamed_from(
                f"{name}-tls-only",
                parent=self,
                retain_on_delete=args.retain_on_destroy or args.existing is not None,
            ),
        )

    @staticmethod
    def _access_point(
        name: str, file_system_id: pulumi.Input[str], directory: str, opts: pulumi.ResourceOptions
    ) -> aws.efs.AccessPoint:
        """A tree of the file system that its clients see as their root, owned by the
        image's default user, whom every client acts as."""
        return aws.efs.AccessPoint(
            name,
            file_system_id=file_system_id,
            posix_user={"uid": MODEL_CACHE_UID, "gid": MODEL_CACHE_GID},
            root_directory={
                "path": directory,
                "creation_info": {
                    "owner_uid": MODEL_CACHE_UID,
                    "owner_gid": MODEL_CACHE_GID,
                    "permissions": "0755",
                },
            },
            tags=tags(name),
            opts=opts,
        )
