"""The GPU nodes' baked image (nodeImage bake): the node software installed once into a
machine image by EC2 Image Builder, from which every node of every stack with the same
lock and base image launches. Setup on such a node finds the environment already the
lock and only checks it (scripts/node/vllm-cluster-node install_software).

Why Image Builder, not a builder instance and AmiFromInstance: Image Builder runs the
build on an instance of its own (here in the stack's private subnet, with a role of its
own) and, before it snapshots, runs its cleanup, which takes the builder's SSH host keys,
cloud-init's instance state and its logs out of the image; AmiFromInstance would snapshot
whatever the builder instance held, and the program would have to reach, wait for and
stop that instance itself. ParallelCluster's `pcluster build-image` bakes the same way.
https://docs.aws.amazon.com/imagebuilder/latest/userguide/security-best-practices.html
(the cleanup script, "Remove SSH host keys" among its steps)

What the bake runs is the node's own install step: `vllm-cluster-node bake`, sent with
the node scripts and the lock as one script (components/bootstrap.py node_bake_script).
It is too big for a component's inline document (16,000 characters,
components/aws_contract.py), so it lies in an S3 bucket of the bake's own, which only the
builder's role may read; the component's document downloads and runs it.

Reuse: the image carries the tag NODE_IMAGE_TAG = "<lock digest>/<base AMI>"
(image_key). Before declaring anything, __main__.py looks the tag up among the account's
own images: found, the nodes launch from it and nothing is built; absent, this component
builds it. Once built, the next `pulumi up` of the same stack finds it too and drops the
Image Builder resources (an image build record, the recipe, the component, the bucket):
deleting them leaves the AMI, as deleting an Image Builder image "does not delete any
EC2 AMIs" (https://docs.aws.amazon.com/imagebuilder/latest/APIReference/API_DeleteImage.html).
So `pulumi destroy` of the stack that baked it never deregisters an image other stacks
launch from; it is deregistered by hand (docs/configuration.md, "The node image").
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components import bootstrap
from components.tagging import tags

# The tag that names a baked image by what it holds, and the ones that say so in words.
NODE_IMAGE_TAG = "vllm-cluster:node-image"
LOCK_TAG = "vllm-cluster:node-lock-sha256"
BASE_IMAGE_TAG = "vllm-cluster:base-ami"
BAKED_BY_TAG = "vllm-cluster:baked-by"

# The builder: no GPU is needed to install wheels, and the image runs on any x86_64 Nitro
# type. 8 vCPUs shorten the install (unpacking and byte-compiling spread over the cores,
# components/sizing/) at $0.34/h (us-east-1 on-demand, aws.amazon.com/ec2/pricing).
BUILDER_INSTANCE_TYPE = "c6i.2xlarge"

# What the builder's role needs. Image Builder's setup guide attaches two managed policies to
# a builder's instance profile, EC2InstanceProfileForImageBuilder (AWSTOE fetches its
# components and reports: imagebuilder:GetComponent, KMS and S3 scoped to Image Builder's own)
# and AmazonSSMManagedInstanceCore (Systems Manager runs the build's commands),
# https://docs.aws.amazon.com/imagebuilder/latest/userguide/image-builder-setting-up.html
# The first is kept. The second would also let the builder read the region's whole Parameter
# Store (ssm:GetParameter(s) on "*"), which the nodes' roles were refused for (issue 33
# point 5): in its place, what the Systems Manager agent needs to take and answer Run
# Command's commands (ec2messages, ssm:UpdateInstanceInformation) and open its channels
# (ssmmessages), the actions AmazonSSMManagedInstanceCore grants for that
# (https://docs.aws.amazon.com/aws-managed-policy/latest/reference/AmazonSSMManagedInstanceCore.html);
# and reading the bake script, one object. The role is the bake's alone.
BUILDER_MANAGED_POLICY = "arn:aws:iam::aws:policy/EC2InstanceProfileForImageBuilder"
RUN_COMMAND_ACTIONS = (
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
)

# The builder's way out: HTTPS (PyPI, GitHub for efs-utils, S3, Systems Manager and Image
# Builder's endpoints) and HTTP (Ubuntu's archive mirrors serve apt over http). Nothing in.
BUILDER_EGRESS = (
    (443, "bake: HTTPS to PyPI, GitHub, S3 and the Systems Manager and Image Builder endpoints"),
    (80, "bake: HTTP to the Ubuntu archive (apt)"),
)

# The component's document (AWSTOE's YAML: phases, steps, action modules S3Download and
# ExecuteBash, https://docs.aws.amazon.com/imagebuilder/latest/userguide/toe-action-modules.html).
BAKE_SCRIPT_PATH = "/tmp/vllm-cluster-bake.sh"
# The semantic version of the component and recipe (major.minor.patch): bumped when the
# way the image is baked changes, so that a new bake does not collide with an old name.
BAKE_VERSION = "1.0.0"


@dataclass(frozen=True)
class ImageKey:
    """What a baked image holds: the lock's content and the base image."""

    lock_sha256: str
    base_ami_id: str

    @property
    def tag(self) -> str:
        return f"{self.lock_sha256[:12]}/{self.base_ami_id}"

    @property
    def name(self) -> str:
        """The recipe's and component's name (Image Builder names the AMI after the
        recipe): letters, digits and -, as ResourceName allows."""
        return f"vllm-cluster-node-{self.lock_sha256[:12]}-{self.base_ami_id}"

    def ami_tags(self, baked_by: str) -> dict[str, str]:
        return {
            NODE_IMAGE_TAG: self.tag,
            LOCK_TAG: self.lock_sha256,
            BASE_IMAGE_TAG: self.base_ami_id,
            BAKED_BY_TAG: baked_by,
        }


def image_key(lock_text: str, base_ami_id: str) -> ImageKey:
    return ImageKey(bootstrap.lock_sha256(lock_text), base_ami_id)


def baked_image_filters(key: ImageKey) -> list[dict]:
    """The account's own available images baked for this key (ec2 DescribeImages filters
    tag:KEY and state, https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeImages.html)."""
    return [
        {"name": f"tag:{NODE_IMAGE_TAG}", "values": [key.tag]},
        {"name": "state", "values": ["available"]},
    ]


def component_document(bucket: str, object_key: str) -> str:
    """AWSTOE's document: download the bake script and run it as root (AWSTOE runs
    ExecuteBash as root)."""
    return json.dumps(
        {
            "name": "vllm-cluster-node-bake",
            "description": "The node's own install step: vllm-cluster-node bake",
            "schemaVersion": 1.0,
            "phases": [
                {
                    "name": "build",
                    "steps": [
                        {
                            "name": "DownloadBakeScript",
                            "action": "S3Download",
                            "inputs": [{"source": f"s3://{bucket}/{object_key}", "destination": BAKE_SCRIPT_PATH}],
                        },
                        {
                            "name": "Bake",
                            "action": "ExecuteBash",
                            "inputs": {"commands": [f"bash {BAKE_SCRIPT_PATH}", f"rm -f {BAKE_SCRIPT_PATH}"]},
                        },
                    ],
                }
            ],
        },
        indent=1,
    )


def builder_policy(object_arn: str) -> str:
    """The builder role's own policy: Run Command's agent, and the bake script."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                # The agent's channels and messages name no resource.
                {"Sid": "RunCommand", "Effect": "Allow", "Action": list(RUN_COMMAND_ACTIONS), "Resource": "*"},
                {"Sid": "BakeScript", "Effect": "Allow", "Action": ["s3:GetObject"], "Resource": object_arn},
            ],
        },
        sort_keys=True,
    )


@dataclass
class NodeImageArgs:
    key: ImageKey
    # The script the builder runs (bootstrap.node_bake_script): scripts and lock, no secret.
    bake_script: str
    # The base image's root device (the recipe sizes it).
    root_device_name: pulumi.Input[str]
    root_volume_gib: int
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    # Who baked it (project/stack), on the image's tags.
    baked_by: str
    # Resources the builder needs in place (the NAT route): it fetches from the internet.
    build_after: tuple[pulumi.Resource, ...] = ()


class NodeImage(pulumi.ComponentResource):
    image_id: pulumi.Output[str]

    def __init__(self, name: str, args: NodeImageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:NodeImage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # The component's own name says what it is (vllm-node-image): its children's start with it.
        prefix = name
        object_key = f"bake/{args.key.lock_sha256[:12]}/bake.sh"
        bucket, script = self._bake_script(prefix, args, object_key, child)
        profile, role_policies = self._builder_role(prefix, bucket, object_key, child)
        group, rules = self._builder_group(prefix, args, child)
        recipe = self._recipe(prefix, args, bucket, object_key, child)
        infrastructure = aws.imagebuilder.InfrastructureConfiguration(
            f"{prefix}-infrastructure",
            name=args.key.name,
            instance_types=[BUILDER_INSTANCE_TYPE],
            instance_profile_name=profile.name,
            subnet_id=args.subnet_id,
            security_group_ids=[group.id],
            # IMDSv2 only, as the nodes.
            instance_metadata_options={"http_tokens": "required", "http_put_response_hop_limit": 1},
            terminate_instance_on_failure=True,
            resource_tags=tags(f"{prefix}-builder"),
            tags=tags(f"{prefix}-infrastructure"),
            opts=child,
        )
        image = aws.imagebuilder.Image(
            f"{prefix}-image",
            image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=infrastructure.arn,
            # Image Builder's own test phase would launch the image once more; setup checks
            # the environment on every node anyway.
            image_tests_configuration={"image_tests_enabled": False},
            tags=tags(f"{prefix}-image"),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[script, *role_policies, *rules, *args.build_after]),
        )
        # The AMI the build made (one region: no distribution configuration).
        self.image_id = image.output_resources.apply(lambda resources: resources[0].amis[0].image)
        self.register_outputs({"imageId": self.image_id})

    def _bake_script(
        self, prefix: str, args: NodeImageArgs, object_key: str, child: pulumi.ResourceOptions
    ) -> tuple[aws.s3.Bucket, aws.s3.BucketObjectv2]:
        """A private bucket holding the bake script at `object_key`, where the builder fetches it."""
        bucket = aws.s3.Bucket(f"{prefix}-bucket", force_destroy=True, tags=tags(f"{prefix}-bucket"), opts=child)
        aws.s3.BucketPublicAccessBlock(
            f"{prefix}-bucket-private",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        script = aws.s3.BucketObjectv2(
            f"{prefix}-bake-script",
            bucket=bucket.id,
            key=object_key,
            content=args.bake_script,
            content_type="text/x-shellscript",
            tags=tags(f"{prefix}-bake-script"),
            opts=child,
        )
        return bucket, script

    def _builder_role(
        self, prefix: str, bucket: aws.s3.Bucket, object_key: str, child: pulumi.ResourceOptions
    ) -> tuple[aws.iam.InstanceProfile, list[pulumi.Resource]]:
        """The builder instance's profile, and its role's policies, which the build waits for:
        Image Builder's managed policy and the role's own (builder_policy)."""
        role = aws.iam.Role(
            f"{prefix}-builder-role",
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            description="vllm-cluster node image builder: Image Builder's instance needs and the bake script",
            tags=tags(f"{prefix}-builder-role"),
            opts=child,
        )
        attachment = aws.iam.RolePolicyAttachment(
            f"{prefix}-builder-image-builder", role=role.name, policy_arn=BUILDER_MANAGED_POLICY, opts=child
        )
        own_policy = aws.iam.RolePolicy(
            f"{prefix}-builder-policy",
            role=role.id,
            policy=pulumi.Output.concat(bucket.arn, "/", object_key).apply(builder_policy),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(
            f"{prefix}-builder-profile", role=role.name, tags=tags(f"{prefix}-builder-profile"), opts=child
        )
        return profile, [attachment, own_policy]

    def _builder_group(
        self, prefix: str, args: NodeImageArgs, child: pulumi.ResourceOptions
    ) -> tuple[aws.ec2.SecurityGroup, list[pulumi.Resource]]:
        """The builder's security group and its egress rules (BUILDER_EGRESS)."""
        group = aws.ec2.SecurityGroup(
            f"{prefix}-builder-sg",
            vpc_id=args.vpc_id,
            description="vllm-cluster node image builder: out to the package indexes, nothing in",
            tags=tags(f"{prefix}-builder-sg"),
            opts=child,
        )
        rules = [
            aws.vpc.SecurityGroupEgressRule(
                f"{prefix}-builder-out-{port}",
                security_group_id=group.id,
                description=why,
                ip_protocol="tcp",
                from_port=port,
                to_port=port,
                cidr_ipv4="0.0.0.0/0",
                opts=child,
            )
            for port, why in BUILDER_EGRESS
        ]
        return group, rules

    def _recipe(
        self, prefix: str, args: NodeImageArgs, bucket: aws.s3.Bucket, object_key: str, child: pulumi.ResourceOptions
    ) -> aws.imagebuilder.ImageRecipe:
        """The bake component (it runs the script from the bucket) on the base image, with
        the root volume the nodes launch with."""
        component = aws.imagebuilder.Component(
            f"{prefix}-component",
            name=args.key.name,
            version=BAKE_VERSION,
            platform="Linux",
            description="vllm-cluster-node bake: the locked environment, efs-utils, Python headers, iptables, nftables",
            data=bucket.id.apply(lambda bucket_name: component_document(bucket_name, object_key)),
            tags=tags(f"{prefix}-component"),
            opts=child,
        )
        return aws.imagebuilder.ImageRecipe(
            f"{prefix}-recipe",
            name=args.key.name,
            version=BAKE_VERSION,
            parent_image=args.key.base_ami_id,
            components=[{"component_arn": component.arn}],
            block_device_mappings=[
                {
                    "device_name": args.root_device_name,
                    "ebs": {
                        "volume_type": "gp3",
                        "volume_size": args.root_volume_gib,
                        "encrypted": "true",
                        "delete_on_termination": "true",
                    },
                }
            ],
            ami_tags=args.key.ami_tags(args.baked_by),
            description=f"vllm-cluster nodes: lock {args.key.lock_sha256[:12]} on {args.key.base_ami_id}",
            tags=tags(f"{prefix}-recipe"),
            opts=child,
        )
