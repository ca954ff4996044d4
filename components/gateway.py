"""The gateway: a small instance in the public subnet with an Elastic IP, the one
host reachable from outside. It terminates TLS for the API and the dashboard and
is the SSH jump host to the GPU nodes. Its user data installs nginx and the gateway
command (gzipped: the script is over EC2's 16 KiB as text); the certificate and the
proxy site come from ClusterServices' commands."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_aws as aws

from components.bootstrap import compress_user_data
from components.tagging import renamed_from, tags

CANONICAL_OWNER = "099720109477"
UBUNTU_NAME_PATTERN = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-{arch}-server-*"
GATEWAY_ROOT_GIB = 20


def gateway_architecture(instance_type: str) -> str:
    """Graviton families carry a 'g' among the letters after the generation digit
    (t4g, m7g, c7gn); everything else on offer for a gateway is x86_64."""
    family = instance_type.split(".", 1)[0]
    match = re.match(r"^[a-z]+\d+([a-z-]*)$", family)
    return "arm64" if match and "g" in match.group(1) else "amd64"


@dataclass
class GatewayArgs:
    instance_type: str
    subnet_id: pulumi.Input[str]
    gateway_group_id: pulumi.Input[str]
    key_pair_name: pulumi.Input[str]
    # The first-boot script as text (bootstrap.gateway_user_data); the instance gets it gzipped.
    user_data: str | None = None
    # Routes and security group rules that must exist before the gateway boots.
    boot_after: Sequence[pulumi.Resource] = ()


class Gateway(pulumi.ComponentResource):
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    instance_id: pulumi.Output[str]
    # Remote commands wait for both: the host, and the address they reach it by.
    resources: list[pulumi.Resource]

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:Gateway", name, None, opts)

        image = aws.ec2.get_ami_output(
            most_recent=True,
            owners=[CANONICAL_OWNER],
            filters=[
                {"name": "name", "values": [UBUNTU_NAME_PATTERN.format(arch=gateway_architecture(args.instance_type))]},
                {"name": "state", "values": ["available"]},
            ],
            opts=pulumi.InvokeOptions(parent=self),
        )
        instance = aws.ec2.Instance(
            f"{name}-gateway-host",
            ami=image.id,
            instance_type=args.instance_type,
            subnet_id=args.subnet_id,
            vpc_security_group_ids=[args.gateway_group_id],
            key_name=args.key_pair_name,
            # A public IP at boot lets cloud-init reach the package mirrors before the
            # Elastic IP is attached; the Elastic IP then replaces it.
            associate_public_ip_address=True,
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1},
            root_block_device={"volume_type": "gp3", "volume_size": GATEWAY_ROOT_GIB, "encrypted": True},
            # EC2 takes 16 KiB of user data "in raw form, before it is base64-encoded"
            # (EC2 User Guide, instancedata-add-user-data); the gateway script is about
            # 31 KiB as text and about 11 KiB gzipped. cloud-init unpacks gzip by itself.
            user_data_base64=compress_user_data(args.user_data) if args.user_data is not None else None,
            tags=tags(f"{name}-gateway-host", **{"vllm-cluster:role": "gateway"}),
            # A newer Ubuntu image must not replace the gateway (and its TLS setup) on an
            # unrelated `pulumi up`; security updates come from unattended-upgrades.
            # Changed user data reaches the running gateway through its setup command.
            opts=renamed_from(
                f"{name}-host",
                parent=self,
                ignore_changes=["ami", "userData", "userDataBase64"],
                depends_on=list(args.boot_after),
            ),
        )
        address = aws.ec2.Eip(
            f"{name}-gateway-ip",
            domain="vpc",
            instance=instance.id,
            tags=tags(f"{name}-gateway-ip"),
            opts=renamed_from(f"{name}-ip", parent=self),
        )

        self.public_ip = address.public_ip
        self.private_ip = instance.private_ip
        self.instance_id = instance.id
        self.resources = [instance, address]
        self.register_outputs(
            {"publicIp": self.public_ip, "privateIp": self.private_ip, "instanceId": self.instance_id}
        )
