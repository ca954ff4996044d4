"""The gateway: a small instance in the public subnet with an Elastic IP, the one
host reachable from outside. It terminates TLS for the API and the dashboard and
is the SSH jump host to the GPU nodes. Its user data installs nginx and the gateway
command (gzipped: the script is over EC2's 16 KiB as text); the certificate and the
proxy site come from ClusterServices' commands."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_aws as aws
import pulumi_tls as tls

from components import host_keys, idle_stop
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
    # The first-boot script as text (bootstrap.gateway_user_data); the instance gets it
    # gzipped, beside its SSH host key (components/host_keys.py).
    user_data: str
    # Routes and security group rules that must exist before the gateway boots.
    boot_after: Sequence[pulumi.Resource] = ()
    # idleStopMinutes is set: the gateway's role may start the stack's stopped GPU instances
    # (components/idle_stop.py). Without it the gateway has no role at all, as before.
    may_wake_nodes: bool = False
    # The stack's random id its GPU instances carry (components/compute.py): the only ones
    # the role may start.
    stack_id: pulumi.Input[str] | None = None


class Gateway(pulumi.ComponentResource):
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    instance_id: pulumi.Output[str]
    # The gateway's instance profile with idleStopMinutes (it may start the stack's instances).
    wake_profile_arn: pulumi.Output[str] | None
    # Remote commands wait for both: the host, and the address they reach it by.
    resources: list[pulumi.Resource]
    # The gateway's SSH host key (public, authorized_keys form): every connection to it pins it.
    host_key: pulumi.Output[str]

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
        profile = self._wake_profile(name, args.stack_id) if args.may_wake_nodes else None
        # Kept when the instance is replaced: a new gateway behind the same Elastic IP answers
        # with the key the stack and the operator tools pin.
        host_key = tls.PrivateKey(
            f"{name}-gateway-host-key", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self)
        )
        # Secret: the host key's private half is in it (encrypted in state).
        user_data = pulumi.Output.secret(
            pulumi.Output.all(host_key.private_key_openssh, host_key.public_key_openssh).apply(
                lambda key: compress_user_data(
                    host_keys.multipart_user_data(args.user_data, host_keys.host_key_cloud_config(key[0], key[1]))
                )
            )
        )
        instance = self._instance(name, args, image.id, profile, user_data)
        address = aws.ec2.Eip(
            f"{name}-gateway-ip",
            domain="vpc",
            instance=instance.id,
            tags=tags(f"{name}-gateway-ip"),
            opts=renamed_from(f"{name}-ip", parent=self),
        )

        self.wake_profile_arn = profile.arn if profile is not None else None
        self.public_ip = address.public_ip
        self.private_ip = instance.private_ip
        self.instance_id = instance.id
        self.resources = [instance, address]
        self.host_key = host_key.public_key_openssh.apply(lambda key: host_keys.parse_public_key(key).authorized)
        self.register_outputs(
            {
                "publicIp": self.public_ip,
                "privateIp": self.private_ip,
                "instanceId": self.instance_id,
                "wakeProfileArn": self.wake_profile_arn,
                "hostKey": self.host_key,
            }
        )

    def _instance(
        self,
        name: str,
        args: GatewayArgs,
        image_id: pulumi.Input[str],
        profile: aws.iam.InstanceProfile | None,
        user_data: pulumi.Output[str],
    ) -> aws.ec2.Instance:
        """The gateway's host in the public subnet, from Ubuntu's image and its gzipped user data."""
        return aws.ec2.Instance(
            f"{name}-gateway-host",
            ami=image_id,
            instance_type=args.instance_type,
            subnet_id=args.subnet_id,
            vpc_security_group_ids=[args.gateway_group_id],
            key_name=args.key_pair_name,
            # A public IP at boot lets cloud-init reach the package mirrors before the
            # Elastic IP is attached; the Elastic IP then replaces it.
            associate_public_ip_address=True,
            # The waker reads the role's credentials from IMDSv2 on the gateway itself: one hop.
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required", "http_put_response_hop_limit": 1},
            # An instance profile is associated in place (the provider updates iam_instance_profile
            # without replacing the instance), so setting idleStopMinutes later keeps the gateway.
            iam_instance_profile=profile.name if profile is not None else None,
            root_block_device={"volume_type": "gp3", "volume_size": GATEWAY_ROOT_GIB, "encrypted": True},
            # EC2 takes 16 KiB of user data "in raw form, before it is base64-encoded"
            # (EC2 User Guide, instancedata-add-user-data); the gateway script is about
            # 31 KiB as text and about 11 KiB gzipped. cloud-init unpacks gzip by itself.
            user_data_base64=user_data,
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

    def _wake_profile(self, name: str, stack_id: pulumi.Input[str]) -> aws.iam.InstanceProfile:
        """A role for the gateway's waker: start this stack's GPU instances, see which are
        stopped, nothing else (idle_stop.gateway_wake_policy)."""
        role = aws.iam.Role(
            f"{name}-gateway-role",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            description="vllm-cluster gateway: start this stack's stopped GPU instances, nothing else",
            tags=tags(f"{name}-gateway-role"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        invoke = pulumi.InvokeOptions(parent=self)
        partition = aws.get_partition_output(opts=invoke).partition
        region = aws.get_region_output(opts=invoke).region
        account = aws.get_caller_identity_output(opts=invoke).account_id
        project, stack = pulumi.get_project(), pulumi.get_stack()
        # The stack's volumes are encrypted under the account's default EBS key (no key is
        # named): a customer managed one needs the waker's role on it to start them.
        default_key = aws.ebs.get_default_kms_key_output(opts=invoke)
        ebs_key = aws.kms.get_key_output(key_id=default_key.key_arn, opts=invoke)
        customer_key = pulumi.Output.all(ebs_key.key_manager, ebs_key.arn).apply(
            lambda values: values[1] if values[0] == "CUSTOMER" else None
        )
        aws.iam.RolePolicy(
            f"{name}-gateway-role-wake",
            role=role.id,
            policy=pulumi.Output.all(partition, region, account, stack_id, customer_key).apply(
                lambda values: idle_stop.policy_text(
                    idle_stop.gateway_wake_policy(values[0], values[1], values[2], project, stack, values[3], values[4])
                )
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return aws.iam.InstanceProfile(
            f"{name}-gateway-instance-profile",
            role=role.name,
            tags=tags(f"{name}-gateway-instance-profile"),
            opts=pulumi.ResourceOptions(parent=self),
        )
