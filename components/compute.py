"""The GPU nodes: a cluster placement group, an instance role, one launch template
and the head plus nodes - 1 workers, all in the private subnet without public IPs.

The launch template carries what every node shares: the Deep Learning Base AMI
(NVIDIA driver and EFA software preinstalled, so nothing compiles at boot), IMDSv2
only, an encrypted gp3 root volume, and the network interfaces laid out per
network card for EFA (components/topology.py). Security groups are set on each
interface: launch templates with interfaces reject top-level groups.
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import pulumi
import pulumi_aws as aws

from components import image
from components.spec import ClusterSpec
from components.tagging import tags
from components.topology import interface_layout, node_name, node_role


# Called with (node index, the head's private IP or None for the head) and returns
# the node's user data. The node bootstrap plugs in here.
UserDataFor = Callable[[int, Optional[pulumi.Output]], Optional[pulumi.Input[str]]]


@dataclass
class GpuNodesArgs:
    spec: ClusterSpec
    subnet_id: pulumi.Input[str]
    cluster_group_id: pulumi.Input[str]
    nodes_group_id: pulumi.Input[str]
    key_pair_name: pulumi.Input[str]
    model_cache_arn: pulumi.Input[str]
    user_data_for: UserDataFor | None = None
    # Resources a node needs in place when it boots (routes, security group rules,
    # the EFS mount target): EC2 would otherwise start it before they exist.
    boot_after: Sequence[pulumi.Resource] = ()


def node_image(ami_id: str | None, opts: pulumi.InvokeOptions) -> pulumi.Output:
    """The configured AMI, or the newest Deep Learning Base AMI (components/image.py:
    Ubuntu 24.04, NVIDIA driver, CUDA, EFA installer and aws-ofi-nccl). Looked up
    either way because the root volume's device name comes from the image."""
    if ami_id is not None:
        filters = [{"name": "image-id", "values": [ami_id]}]
        owners = None
    else:
        filters = [
            {"name": "name", "values": [image.DLAMI_NAME_PATTERN]},
            {"name": "architecture", "values": ["x86_64"]},
            {"name": "state", "values": ["available"]},
        ]
        owners = [image.DLAMI_OWNER]
    return aws.ec2.get_ami_output(most_recent=True, owners=owners, filters=filters, opts=opts)


def compress_user_data(text: str) -> str:
    """gzip (with a fixed timestamp, so the same script gives the same bytes) and base64."""
    return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()


def efs_client_policy(file_system_arn: str) -> str:
    """Mount and write this one file system; nothing else on EFS."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ModelCacheClient",
                    "Effect": "Allow",
                    "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
                    "Resource": file_system_arn,
                }
            ],
        },
        sort_keys=True,
    )


def replacement_notice(reservation_id: str) -> str:
    """What `pulumi preview` says about replacing nodes that run in a reservation."""
    return (
        f"The GPU nodes launch into capacity reservation {reservation_id}, which has no spare slot: "
        "a change to the launch template (root volume, AMI, EFA interfaces) replaces every node, and "
        "each node stops and is deleted before its replacement starts. The service is down while "
        "its nodes are replaced."
    )


class GpuNodes(pulumi.ComponentResource):
    head: aws.ec2.Instance
    workers: list[aws.ec2.Instance]
    head_private_ip: pulumi.Output[str]
    worker_private_ips: pulumi.Output[list]

    def __init__(self, name: str, args: GpuNodesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:GpuNodes", name, None, opts)
        spec = args.spec
        child = pulumi.ResourceOptions(parent=self)

        # An existing group by name (a reservation made in a cluster placement group serves
        # only instances launched into that group), or one of our own when needed.
        placement_group_name = spec.placement_group_name
        if spec.creates_placement_group:
            # "cluster": all nodes on one low-latency network spine in one zone, which EFA requires.
            placement_group_name = aws.ec2.PlacementGroup(
                f"{name}-placement", strategy="cluster", tags=tags(f"{name}-placement"), opts=child
            ).name

        profile = self._instance_profile(name, args.model_cache_arn, child)
        image = node_image(spec.ami_id, pulumi.InvokeOptions(parent=self))

        interfaces = []
        for slot in interface_layout(spec.instance, spec.efa):
            interface = {
                "device_index": slot.device_index,
                "network_card_index": slot.network_card_index,
                "interface_type": slot.interface_type,
                "subnet_id": args.subnet_id,
                "delete_on_termination": "true",
                # Every interface is in the EFA group; only the primary, which carries
                # the node's IP, also admits the gateway.
                "security_groups": (
                    [args.cluster_group_id, args.nodes_group_id] if slot.is_primary else [args.cluster_group_id]
                ),
            }
            if slot.is_primary:
                interface["associate_public_ip_address"] = "false"
            interfaces.append(interface)

        template = aws.ec2.LaunchTemplate(
            f"{name}-template",
            image_id=image.id,
            instance_type=spec.instance_type,
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
                    "device_name": image.root_device_name,
                    "ebs": {
                        "volume_type": "gp3",
                        "volume_size": spec.root_volume_gib,
                        "encrypted": "true",
                        "delete_on_termination": "true",
                    },
                }
            ],
            network_interfaces=interfaces,
            placement={"group_name": placement_group_name} if placement_group_name is not None else None,
            # GPU capacity (p5 above all) usually comes from a reservation or a Capacity Block.
            capacity_reservation_specification=(
                {"capacity_reservation_target": {"capacity_reservation_id": spec.capacity_reservation_id}}
                if spec.capacity_reservation_id is not None
                else None
            ),
            tag_specifications=[
                {"resource_type": "volume", "tags": tags(f"{name}-volume")},
                {"resource_type": "network-interface", "tags": tags(f"{name}-interface")},
            ],
            tags=tags(f"{name}-template"),
            # A newer Deep Learning AMI must not replace running GPU nodes on an unrelated
            # `pulumi up`: the looked-up image is kept until the user pins amiId.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["imageId"] if spec.ami_id is None else None),
        )

        if spec.capacity_reservation_id is not None:
            pulumi.log.warn(replacement_notice(spec.capacity_reservation_id), resource=self)
        self.head = self._node(name, 0, template, args, None)
        head_ip = self.head.private_ip
        self.workers = [self._node(name, index, template, args, head_ip) for index in range(1, spec.nodes)]

        self.head_private_ip = head_ip
        self.worker_private_ips = pulumi.Output.all(*[w.private_ip for w in self.workers])
        self.launch_template_id = template.id
        self.placement_group_name = placement_group_name
        self.register_outputs(
            {
                "headPrivateIp": self.head_private_ip,
                "workerPrivateIps": self.worker_private_ips,
                "launchTemplateId": template.id,
            }
        )

    def _instance_profile(self, name: str, model_cache_arn, child) -> aws.iam.InstanceProfile:
        role = aws.iam.Role(
            f"{name}-role",
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
            description="vllm-cluster GPU nodes: SSM Session Manager and the model cache, nothing else",
            tags=tags(f"{name}-role"),
            opts=child,
        )
        partition = aws.get_partition_output(opts=pulumi.InvokeOptions(parent=self)).partition
        # SSM core: Session Manager as a second way in when SSH is unreachable.
        aws.iam.RolePolicyAttachment(
            f"{name}-ssm",
            role=role.name,
            policy_arn=pulumi.Output.concat("arn:", partition, ":iam::aws:policy/AmazonSSMManagedInstanceCore"),
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-model-cache",
            role=role.id,
            policy=pulumi.Output.from_input(model_cache_arn).apply(efs_client_policy),
            opts=child,
        )
        return aws.iam.InstanceProfile(f"{name}-profile", role=role.name, tags=tags(f"{name}-profile"), opts=child)

    def _node(self, name: str, index: int, template, args: GpuNodesArgs, head_ip) -> aws.ec2.Instance:
        role = node_role(index)
        user_data = args.user_data_for(index, head_ip) if args.user_data_for is not None else None
        return aws.ec2.Instance(
            f"{name}-{node_name(index)}",
            launch_template={"id": template.id, "version": template.latest_version.apply(str)},
            # Gzipped: the script and units exceed EC2's 16 KiB user data limit as text;
            # cloud-init unpacks gzip by itself.
            user_data_base64=(
                pulumi.Output.from_input(user_data).apply(compress_user_data) if user_data is not None else None
            ),
            # A Capacity Block is only usable with this market type.
            instance_market_options={"market_type": "capacity-block"} if args.spec.capacity_block else None,
            tags=tags(
                f"{name}-{node_name(index)}",
                **{"vllm-cluster:role": role, "vllm-cluster:node-index": str(index)},
            ),
            # User data is first-boot only (cloud-init runs it once per instance), and
            # changing it would stop and start a GPU node. Later changes reach running
            # nodes through the setup command, which sends the node's scripts and
            # cluster.env over SSH.
            # A reservation is usually full: its replacement node can only launch into the
            # slot the old node frees, so the old one goes first (see replacement_notice).
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=list(args.boot_after),
                ignore_changes=["userDataBase64"],
                delete_before_replace=args.spec.capacity_reservation_id is not None,
            ),
        )
