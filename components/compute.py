"""The GPU nodes: an instance role, and per gang (maxReplicas of them, the always-on and
the warm ones alike: topology.gang_role) a cluster placement group, a launch template
and the head plus nodes - 1 workers, all in the private subnet without public IPs.
Gang 0's resources keep the names they had before replicas existed
(topology.gang_prefix), so a stack of one replica replaces nothing; the other gangs'
names carry their gang (vllm-gang1-head).

The launch template carries what every node shares: the Deep Learning Base AMI
(NVIDIA driver and EFA software preinstalled, so nothing compiles at boot), IMDSv2
only, an encrypted gp3 root volume, and the network interfaces laid out per
network card for EFA (components/topology.py). Security groups are set on each
interface: launch templates with interfaces reject top-level groups.

Each node's user data is its first-boot script (bootstrap.node_user_data), rendered
from NodeBootArgs; ClusterServices renders the setup script from the same value.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_aws as aws
import pulumi_random as random
import pulumi_tls as tls

from components import bootstrap, host_keys, idle_stop, image
from components.bootstrap import compress_user_data
from components.stage_volume import STAGE_VOLUME_DEVICE_NAME, StageVolume
from components.tagging import renamed_from, tags
from components.topology import (
    InterfaceSlot,
    gang_name,
    gang_prefix,
    node_name,
    node_role,
    writes_model_tree,
    writes_wheelhouse,
)


@dataclass
class NodeBootArgs:
    """What every GPU node is told at first boot (its user data) and again by its setup
    command: bootstrap.NodeBoot without the node's index and the head's IP, which
    node_boot adds per node. Plain values only; no secret goes to a node this way."""

    # The private subnet: a node finds its primary interface as the one with an address in
    # it. None on hosts the user has (own_hosts.py): each node's own address, as a /32.
    subnet_cidr: pulumi.Input[str] | None
    gpus: int
    efa: bool
    file_system_id: pulumi.Input[str]
    access_point_id: pulumi.Input[str]
    # The wheelhouse's access point: every node mounts it read-only, its writer read-write.
    wheelhouse_access_point_id: pulumi.Input[str]
    file_system_dns: pulumi.Input[str]
    ray_version: str
    vllm_version: str
    # The gateway's login probe (OpenSSH public key), which the node authorizes to print one word.
    login_probe_key: pulumi.Input[str]
    # The text of the lock every node installs (spec nodeLock).
    node_lock: str
    # The user the stack logs in as: the image's, or sshUser on hosts the user has.
    login_user: str = image.DEFAULT_USER
    # hosts: the shared directory bound as the model cache (modelCacheDir); "" mounts EFS.
    shared_model_dir: str = ""
    # The instance type has an instance store (bootstrap.NodeBoot.instance_store).
    instance_store: bool = False


def node_boot(
    boot: NodeBootArgs,
    index: int,
    head_ip: pulumi.Input[str] | None,
    gang: int = 0,
    node_ip: pulumi.Input[str] | None = None,
) -> pulumi.Output[bootstrap.NodeBoot]:
    """Node `index`'s NodeBoot in `gang`. The head gets no head IP (it learns its own at
    boot); a worker gets its gang head's private IP. `node_ip`: the node's own address,
    its subnet when the boot names none (hosts the user has)."""
    subnet = boot.subnet_cidr
    if subnet is None:
        subnet = pulumi.Output.from_input(node_ip).apply(lambda ip: f"{ip}/32")
    return pulumi.Output.all(
        head_ip if head_ip is not None else "",
        subnet,
        boot.file_system_id,
        boot.access_point_id,
        boot.file_system_dns,
        boot.login_probe_key,
        boot.wheelhouse_access_point_id,
    ).apply(
        lambda values: bootstrap.NodeBoot(
            index=index,
            head_ip=values[0],
            subnet_cidr=values[1],
            gpus=boot.gpus,
            efa=boot.efa,
            file_system_id=values[2],
            access_point_id=values[3],
            file_system_dns=values[4],
            ray_version=boot.ray_version,
            vllm_version=boot.vllm_version,
            login_probe_key=values[5],
            wheelhouse_access_point_id=values[6],
            node_lock=boot.node_lock,
            gang=gang,
            login_user=boot.login_user,
            shared_model_dir=boot.shared_model_dir,
            instance_store=boot.instance_store,
        )
    )


@dataclass
class GpuNodesArgs:
    """Plain values and Inputs, no spec and no callback: Pulumi's component guidance
    asks for flat args of Input types and no functions
    (https://www.pulumi.com/docs/iac/guides/building-extending/components/build-a-component/),
    and it keeps what decides the node count and layout visible at the call site."""

    instance_type: str
    node_count: int  # per gang: the head plus node_count - 1 workers
    # Every node's network interfaces, per network card (topology.interface_layout).
    interfaces: Sequence[InterfaceSlot]
    # The configured AMI, or None for the newest Deep Learning Base AMI.
    ami_id: str | None
    root_volume_gib: int
    capacity_reservation_id: str | None
    # capacity_reservation_id is a Capacity Block for ML.
    capacity_block: bool
    # An existing cluster placement group to launch into (placementGroupName), or None.
    placement_group_name: str | None
    # Whether the stack makes its own cluster placement group (several nodes or EFA, none named).
    create_placement_group: bool
    subnet_id: pulumi.Input[str]
    # Each gang's own cluster group (EFA, Ray, NCCL within the gang only), gang 0 first.
    cluster_group_ids: Sequence[pulumi.Input[str]]
    nodes_group_id: pulumi.Input[str]
    key_pair_name: pulumi.Input[str]
    model_cache_arn: pulumi.Input[str]
    # The model tree's and the wheelhouse's access points (components/storage.py): gang
    # 0's nodes write the first (topology.writes_model_tree); only gang 0's head, the
    # wheelhouse writer, the second. The other gangs' nodes write neither.
    model_cache_access_point_arn: pulumi.Input[str]
    wheelhouse_access_point_arn: pulumi.Input[str]
    boot: NodeBootArgs
    # Resources a node needs in place when it boots (routes, security group rules,
    # the EFS mount target): EC2 would otherwise start it before they exist.
    boot_after: Sequence[pulumi.Resource] = ()
    # Every gang the stack declares (maxReplicas: the always-on and the warm ones alike):
    # independent copies of the model, each node_count nodes in a placement group of its own.
    gang_count: int = 1
    # idleStopMinutes is set: a node that powers itself off is stopped, not terminated.
    stop_on_shutdown: bool = False
    # The image the nodes launch from when it is not ami_id's: the baked node image
    # (components/node_image.py), built on ami_id's image. None: ami_id's.
    launch_image_id: pulumi.Input[str] | None = None
    # stageVolume ebs: every node's gp3 stage volume (components/stage_volume.py), declared on
    # each instance beside the template's root; None: none.
    stage_volume: StageVolume | None = None


def node_image_query(ami_id: str | None) -> dict:
    """get_ami's arguments for the configured AMI, or the newest Deep Learning Base AMI
    (components/image.py: Ubuntu 24.04, NVIDIA driver, CUDA, EFA installer and aws-ofi-nccl)."""
    if ami_id is not None:
        return {"most_recent": True, "owners": None, "filters": [{"name": "image-id", "values": [ami_id]}]}
    return {
        "most_recent": True,
        "owners": [image.DLAMI_OWNER],
        "filters": [
            {"name": "name", "values": [image.DLAMI_NAME_PATTERN]},
            {"name": "architecture", "values": ["x86_64"]},
            {"name": "state", "values": ["available"]},
        ],
    }


def node_image(ami_id: str | None, opts: pulumi.InvokeOptions) -> pulumi.Output:
    """The configured AMI, or the newest Deep Learning Base AMI. Looked up either way
    because the root volume's device name comes from the image (a baked image keeps its
    base's)."""
    return aws.ec2.get_ami_output(**node_image_query(ami_id), opts=opts)


# What Session Manager needs on an instance and nothing else: the agent registers the
# instance (ssm:UpdateInstanceInformation) and opens the session's channels (ssmmessages).
# AWS's own minimal policy for it, the managed AWSCloud9SSMInstanceProfile
# (https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AWSCloud9SSMInstanceProfile.html;
# "Create a custom IAM instance profile for Session Manager",
# https://docs.aws.amazon.com/systems-manager/latest/userguide/getting-started-create-iam-instance-profile.html).
# No ssm:GetParameter*, ssm:GetDocument, ec2messages (Run Command) or S3.
SESSION_MANAGER_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "SessionManagerOnly",
            "Effect": "Allow",
            "Action": [
                "ssm:UpdateInstanceInformation",
                "ssmmessages:CreateControlChannel",
                "ssmmessages:CreateDataChannel",
                "ssmmessages:OpenControlChannel",
                "ssmmessages:OpenDataChannel",
            ],
            "Resource": "*",
        }
    ],
}


def efs_client_policy(file_system_arn: str, writable_access_point_arns: Sequence[str]) -> str:
    """Mount this one file system (read), and write it through these access points
    only: gang 0's nodes' role writes the model tree, the wheelhouse writer's role the
    wheelhouse too, the other gangs' role (no access points) nothing. EFS checks the
    access point a client mounted through against elasticfilesystem:AccessPointArn
    (https://docs.aws.amazon.com/efs/latest/ug/access-points-iam-policy.html); without
    ClientWrite a client may only read (ClientMount is read-only access,
    https://docs.aws.amazon.com/efs/latest/ug/iam-access-control-nfs-efs.html)."""
    statements = [
        {
            "Sid": "ModelCacheMount",
            "Effect": "Allow",
            "Action": ["elasticfilesystem:ClientMount"],
            "Resource": file_system_arn,
        }
    ]
    if writable_access_point_arns:
        statements.append(
            {
                "Sid": "ModelCacheWrite",
                "Effect": "Allow",
                "Action": ["elasticfilesystem:ClientWrite"],
                "Resource": file_system_arn,
                "Condition": {"StringEquals": {"elasticfilesystem:AccessPointArn": sorted(writable_access_point_arns)}},
            }
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)


def replacement_notice(reservation_id: str) -> str:
    """What `pulumi preview` says about replacing nodes that run in a reservation."""
    return (
        f"The GPU nodes launch into capacity reservation {reservation_id}, which has no spare slot: "
        "a change to the launch template (root volume, AMI, EFA interfaces) replaces every node, and "
        "each node stops and is deleted before its replacement starts. The service is down while "
        "its nodes are replaced."
    )


@dataclass
class Gang:
    """One copy of the model: a head and its workers, one Ray cluster, one placement group."""

    index: int
    head: aws.ec2.Instance
    workers: list[aws.ec2.Instance]
    # The group the gang launches into: the configured one, ours, or None for no group.
    placement_group_name: pulumi.Input[str] | None
    # Each node's SSH host key (public, authorized_keys form), head first: what every
    # connection to the node pins (components/host_keys.py).
    host_keys: list[pulumi.Output[str]]

    @property
    def name(self) -> str:
        return gang_name(self.index)

    @property
    def instances(self) -> list[aws.ec2.Instance]:
        return [self.head, *self.workers]


class GpuNodes(pulumi.ComponentResource):
    gangs: list[Gang]
    # Gang 0's, under the names these had before replicas.
    head: aws.ec2.Instance
    workers: list[aws.ec2.Instance]
    head_private_ip: pulumi.Output[str]
    worker_private_ips: pulumi.Output[list]
    launch_template_id: pulumi.Output[str]
    placement_group_name: pulumi.Input[str] | None
    # The stack's random id, the idle_stop.STACK_ID_TAG of every GPU instance.
    stack_id: pulumi.Output[str]

    def __init__(self, name: str, args: GpuNodesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:GpuNodes", name, None, opts)
        # A value of this stack nobody can guess, on every GPU instance: the gateway's role
        # starts only instances that carry it, not any with the same readable stack and
        # project tags (another account user's stack of the same name).
        self.stack_id = random.RandomId(
            f"{name}-stack-id", byte_length=16, opts=pulumi.ResourceOptions(parent=self)
        ).hex
        profile = self._instance_profile(name, "node", args, [args.model_cache_access_point_arn])
        # Gang 0's head fills the wheelhouse (scripts/node/node-env); no other node may write it.
        writer_profile = self._instance_profile(
            name, "wheelhouse-writer", args, [args.model_cache_access_point_arn, args.wheelhouse_access_point_arn]
        )
        # The other gangs' nodes read the model tree and write nothing on the cache: what
        # they could write there, gang 0's next node would load (topology.writes_model_tree).
        reader_profile = self._instance_profile(name, "reader", args, []) if args.gang_count > 1 else None
        if args.capacity_reservation_id is not None:
            pulumi.log.warn(replacement_notice(args.capacity_reservation_id), resource=self)
        templates = []
        self.gangs = []
        for gang in range(args.gang_count):
            # Per gang: the placement group is part of the launch template.
            placement_group_name = self._placement_group(name, gang, args)
            gang_profile = profile if writes_model_tree(gang) else reader_profile
            template = self._launch_template(name, gang, args, gang_profile, placement_group_name)
            head, head_key = self._node(
                name, gang, 0, template, args, None, writer_profile if writes_wheelhouse(0, gang) else None
            )
            workers, keys = [], [head_key]
            for index in range(1, args.node_count):
                worker, key = self._node(name, gang, index, template, args, head.private_ip)
                workers.append(worker)
                keys.append(key)
            templates.append(template)
            self.gangs.append(Gang(gang, head, workers, placement_group_name, keys))

        first = self.gangs[0]
        self.head, self.workers, self.placement_group_name = first.head, first.workers, first.placement_group_name
        self.head_private_ip = self.head.private_ip
        self.worker_private_ips = pulumi.Output.all(*[w.private_ip for w in self.workers])
        self.launch_template_id = templates[0].id
        self.register_outputs(
            {
                "headPrivateIp": self.head_private_ip,
                "workerPrivateIps": self.worker_private_ips,
                "launchTemplateId": self.launch_template_id,
                "placementGroupName": self.placement_group_name,
                "stackId": self.stack_id,
            }
        )

    def _placement_group(self, name: str, gang: int, args: GpuNodesArgs) -> pulumi.Input[str] | None:
        """An existing group by name (a reservation made in a cluster placement group serves
        only instances launched into that group; spec allows it with one gang only), or
        one of our own per gang when needed: a gang's EFA traffic stays in its group."""
        if not args.create_placement_group:
            return args.placement_group_name
        # "cluster": all nodes on one low-latency network spine in one zone, which EFA requires.
        group_name = f"{name}-{gang_prefix(gang)}node-placement-group"
        group = aws.ec2.PlacementGroup(
            group_name,
            strategy="cluster",
            tags=tags(group_name),
            opts=renamed_from(f"{name}-placement", parent=self) if gang == 0 else pulumi.ResourceOptions(parent=self),
        )
        return group.name

    def _instance_profile(
        self, name: str, kind: str, args: GpuNodesArgs, writable_access_points: list[pulumi.Input[str]]
    ) -> aws.iam.InstanceProfile:
        """A role and its instance profile: SSM core, mounting the model cache, and
        writing it through `writable_access_points` only. `kind` "node" is every node's
        (its resources keep the names they had before the renaming of issue 12);
        "wheelhouse-writer" is gang 0's head's, which may also write the wheelhouse;
        "reader" the other gangs' nodes', which write nothing."""
        is_node = kind == "node"

        def options(old_name: str) -> pulumi.ResourceOptions:
            return renamed_from(old_name, parent=self) if is_node else pulumi.ResourceOptions(parent=self)

        role = aws.iam.Role(
            f"{name}-{kind}-role",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": "ec2.amazonaws.com"},
                            "Action": "sts:AssumeRole",
                        }
                    ],
                }
            ),
            description={
                "node": "vllm-cluster GPU nodes: SSM Session Manager and the model cache, nothing else",
                "wheelhouse-writer": (
                    "vllm-cluster gang 0 head: SSM Session Manager, the model cache and writing its wheelhouse"
                ),
                "reader": "vllm-cluster GPU nodes of other gangs: SSM Session Manager, reading the model cache",
            }[kind],
            tags=tags(f"{name}-{kind}-role"),
            opts=options(f"{name}-role"),
        )
        # Session Manager as a second way in when SSH is unreachable, and nothing more of SSM:
        # AmazonSSMManagedInstanceCore would also let every node read the region's whole
        # Parameter Store (ssm:GetParameter(s) on "*") and fetch documents and patches.
        aws.iam.RolePolicy(
            f"{name}-{kind}-role-session-manager",
            role=role.id,
            policy=json.dumps(SESSION_MANAGER_POLICY, sort_keys=True, separators=(",", ":")),
            opts=pulumi.ResourceOptions(parent=self),
        )
        aws.iam.RolePolicy(
            f"{name}-{kind}-role-model-cache",
            role=role.id,
            policy=pulumi.Output.all(args.model_cache_arn, *writable_access_points).apply(
                lambda arns: efs_client_policy(arns[0], arns[1:])
            ),
            opts=options(f"{name}-model-cache"),
        )
        return aws.iam.InstanceProfile(
            f"{name}-{kind}-instance-profile",
            role=role.name,
            tags=tags(f"{name}-{kind}-instance-profile"),
            opts=options(f"{name}-profile"),
        )

    @staticmethod
    def _interfaces(args: GpuNodesArgs, gang: int) -> list[dict]:
        cluster_group_id = args.cluster_group_ids[gang]
        interfaces = []
        for slot in args.interfaces:
            interface = {
                "device_index": slot.device_index,
                "network_card_index": slot.network_card_index,
                "interface_type": slot.interface_type,
                "subnet_id": args.subnet_id,
                "delete_on_termination": "true",
                # Every interface is in its gang's EFA group; only the primary, which
                # carries the node's IP, also admits the gateway.
                "security_groups": ([cluster_group_id, args.nodes_group_id] if slot.is_primary else [cluster_group_id]),
            }
            if slot.is_primary:
                interface["associate_public_ip_address"] = "false"
            interfaces.append(interface)
        return interfaces

    @staticmethod
    def _stage_volume_devices(args: GpuNodesArgs) -> list[dict] | None:
        """The stage volume, made with each node and deleted with it; a stop keeps it, which
        is its point (components/stage_volume.py). On the instance, not in the launch
        template: the template maps the root alone, and EC2 adds a request's mapping of a
        device name the template does not map to the template's (FleetBlockDeviceMappingRequest:
        https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_FleetBlockDeviceMappingRequest.html)."""
        if args.stage_volume is None:
            return None
        return [
            {
                "device_name": STAGE_VOLUME_DEVICE_NAME,
                "volume_type": "gp3",
                "volume_size": args.stage_volume.size_gib,
                "iops": args.stage_volume.iops,
                "throughput": args.stage_volume.throughput_mib_s,
                "encrypted": True,
                "delete_on_termination": True,
            }
        ]

    def _launch_template(
        self,
        name: str,
        gang: int,
        args: GpuNodesArgs,
        profile: aws.iam.InstanceProfile,
        placement_group_name: pulumi.Input[str] | None,
    ) -> aws.ec2.LaunchTemplate:
        """What every node of a gang shares. Its name and every tag in it stay as first
        deployed: any change to the template's contents makes a new version, which
        replaces every GPU node of the gang."""
        node_ami = node_image(args.ami_id, pulumi.InvokeOptions(parent=self))
        return aws.ec2.LaunchTemplate(
            f"{name}-{gang_prefix(gang)}template",
            image_id=args.launch_image_id if args.launch_image_id is not None else node_ami.id,
            instance_type=args.instance_type,
            key_name=args.key_pair_name,
            iam_instance_profile={"arn": profile.arn},
            metadata_options={
                "http_endpoint": "enabled",
                # IMDSv2 only, one hop: a container on the node cannot reach the role's credentials.
                "http_tokens": "required",
                "http_put_response_hop_limit": 1,
            },
            block_device_mappings=[
                {
                    "device_name": node_ami.root_device_name,
                    "ebs": {
                        "volume_type": "gp3",
                        "volume_size": args.root_volume_gib,
                        "encrypted": "true",
                        "delete_on_termination": "true",
                    },
                },
            ],
            network_interfaces=self._interfaces(args, gang),
            placement={"group_name": placement_group_name} if placement_group_name is not None else None,
            # GPU capacity (p5 above all) usually comes from a reservation or a Capacity Block.
            capacity_reservation_specification=(
                {"capacity_reservation_target": {"capacity_reservation_id": args.capacity_reservation_id}}
                if args.capacity_reservation_id is not None
                else None
            ),
            tag_specifications=[
                {"resource_type": "volume", "tags": tags(f"{name}-{gang_prefix(gang)}volume")},
                {"resource_type": "network-interface", "tags": tags(f"{name}-{gang_prefix(gang)}interface")},
            ],
            tags=tags(f"{name}-{gang_prefix(gang)}template"),
            # A newer Deep Learning AMI must not replace running GPU nodes on an unrelated
            # `pulumi up`: the looked-up image is kept until the user pins amiId. So is an
            # image baked on it: a node whose lock changed since gets the new environment
            # from its setup, as on an image without the software.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["imageId"] if args.ami_id is None else None),
        )

    def _node(
        self,
        name: str,
        gang: int,
        index: int,
        template: aws.ec2.LaunchTemplate,
        args: GpuNodesArgs,
        head_ip,
        profile: aws.iam.InstanceProfile | None = None,
    ) -> tuple[aws.ec2.Instance, pulumi.Output[str]]:
        """One node from its gang's template, and its SSH host key's public half; `profile`
        overrides the template's (an instance's own iamInstanceProfile wins over its launch
        template's)."""
        host_key, user_data = self._host_key_and_user_data(name, gang, index, args, head_ip)
        instance = aws.ec2.Instance(
            f"{name}-{node_name(index, gang)}",
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            iam_instance_profile=profile.name if profile is not None else None,
            # Gzipped: the script and units exceed EC2's 16 KiB user data limit as text;
            # cloud-init unpacks gzip by itself.
            user_data_base64=user_data.apply(compress_user_data),
            # A Capacity Block is only usable with this market type.
            instance_market_options={"market_type": "capacity-block"} if args.capacity_block else None,
            # An idle node powers itself off (idleStopMinutes; components/idle_stop.py): "stop"
            # makes EC2 stop it, keeping its EBS root and billing no instance usage while stopped
            # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html).
            # On the instance, not its launch template: a template change is a new version and
            # the provider replaces an instance whose launch_template changes (ForceNew), while
            # this attribute it changes in place (ModifyInstanceAttribute; terraform-provider-aws
            # internal/service/ec2/ec2_instance.go, resourceInstanceUpdate), so turning idle stop
            # on or off replaces no GPU node. Left unset, EC2's default for an EBS-backed
            # instance is stop as well.
            instance_initiated_shutdown_behavior="stop" if args.stop_on_shutdown else None,
            # stageVolume ebs (components/stage_volume.py): each node's gp3 stage volume. Every
            # field of the provider's ebs_block_device is ForceNew (terraform-provider-aws
            # internal/service/ec2/ec2_instance.go, ResourceInstance's schema), so it is under
            # ignoreChanges below: the engine then puts the recorded value back in place of the
            # program's, and drops the program's when none was recorded (pulumi/pulumi
            # sdk/go/common/resource/properties_path.go, PropertyPath.Reset), so turning the
            # volume on or off (idleStopMinutes under stageVolume auto) replaces no running
            # node. A node created from then on gets what the program says; a node keeps what
            # it was created with, even when replaced under its own name for another reason
            # (the replacement is made from the same recorded inputs).
            ebs_block_devices=self._stage_volume_devices(args),
            tags=self._node_tags(name, gang, index, args),
            # User data is first-boot only (cloud-init runs it once per instance), and
            # changing it would stop and start a GPU node. Later changes reach running
            # nodes through the setup command, which sends the node's scripts and
            # cluster.env over SSH.
            # A reservation is usually full: its replacement node can only launch into the
            # slot the old node frees, so the old one goes first (see replacement_notice).
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=list(args.boot_after),
                ignore_changes=["userDataBase64", "ebsBlockDevices"],
                delete_before_replace=args.capacity_reservation_id is not None,
            ),
        )
        return instance, host_key.public_key_openssh.apply(lambda key: host_keys.parse_public_key(key).authorized)

    def _host_key_and_user_data(
        self, name: str, gang: int, index: int, args: GpuNodesArgs, head_ip
    ) -> tuple[tls.PrivateKey, pulumi.Output[str]]:
        """The node's SSH host key, and its user data: its first-boot script with that key."""
        # The node's own host key, kept when the instance is replaced (a new node in its place
        # answers with the key the stack pins), delivered in its user data (components/host_keys.py).
        host_key = tls.PrivateKey(
            f"{name}-{node_name(index, gang)}-host-key", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self)
        )
        # Secret: the host key's private half is in it (encrypted in state).
        user_data = pulumi.Output.secret(
            pulumi.Output.all(
                node_boot(args.boot, index, head_ip, gang), host_key.private_key_openssh, host_key.public_key_openssh
            ).apply(
                lambda values: host_keys.multipart_user_data(
                    bootstrap.node_user_data(values[0]), host_keys.host_key_cloud_config(values[1], values[2])
                )
            )
        )
        return host_key, user_data

    def _node_tags(self, name: str, gang: int, index: int, args: GpuNodesArgs) -> dict:
        """A node's tags: its name, role and index, its gang's name with replicas, and the stack's id."""
        role = node_role(index)
        gang_tag = {"vllm-cluster:gang": gang_name(gang)} if args.gang_count > 1 else {}
        return tags(
            f"{name}-{node_name(index, gang)}",
            **{"vllm-cluster:role": role, "vllm-cluster:node-index": str(index)},
            **gang_tag,
            # What the gateway's role may start it by (idle_stop.gateway_wake_policy).
            **{idle_stop.STACK_ID_TAG: self.stack_id},
        )
