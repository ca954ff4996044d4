"""The network: a VPC with, in one Availability Zone, a public subnet (gateway and
NAT gateway) and a private subnet that holds every GPU node; or an existing VPC
and subnets named in config.

One AZ on purpose: EFA and cluster placement groups do not span zones, and the
EFS mount target the nodes use lives in the same zone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from components.spec import ExistingNetwork
from components.tagging import renamed_from, tags
from components.topology import plan_subnets


@dataclass
class NetworkArgs:
    vpc_cidr: str
    instance_type: str
    # The zone from config, or None to pick the first zone that offers instance_type.
    availability_zone: str | None
    existing: ExistingNetwork | None


def first_zone(instance_type: str, locations: list[str]) -> str:
    """The zone the nodes run in when config names none: the first of those that offer
    the type (getInstanceTypeOfferings' locations), sorted so the choice is stable from
    one run to the next. The model cache's check before any resource (__main__.py)
    picks it the same way."""
    if not locations:
        raise pulumi.RunError(
            f"no Availability Zone of this region offers {instance_type}; "
            "set vllm-cluster:availabilityZone or aws:region to one that does"
        )
    return sorted(locations)[0]


def _first_zone_offering(instance_type: str) -> pulumi.Output[str]:
    offerings = aws.ec2.get_instance_type_offerings_output(
        location_type="availability-zone",
        filters=[{"name": "instance-type", "values": [instance_type]}],
    )
    return offerings.locations.apply(lambda locations: first_zone(instance_type, locations))


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    public_subnet_id: pulumi.Output[str]
    private_subnet_id: pulumi.Output[str]
    # The nodes find their primary interface as the one with an address in here.
    private_subnet_cidr: pulumi.Output[str]
    availability_zone: pulumi.Output[str]
    # What must exist before an instance boots and reaches the internet: routes and
    # their associations. Instances wait for these so cloud-init's downloads work.
    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:Network", name, None, opts)
        if args.existing is not None:
            self._use_existing(args.existing)
        else:
            self._create(name, args)

        self.register_outputs(
            {
                "vpcId": self.vpc_id,
                "publicSubnetId": self.public_subnet_id,
                "privateSubnetId": self.private_subnet_id,
                "privateSubnetCidr": self.private_subnet_cidr,
                "availabilityZone": self.availability_zone,
            }
        )

    def _use_existing(self, existing: ExistingNetwork) -> None:
        self.ready = []  # the existing subnets already route
        # The nodes go where the private subnet is: its zone decides the placement.
        private = aws.ec2.get_subnet_output(id=existing.private_subnet_id)
        self.vpc_id = pulumi.Output.from_input(existing.vpc_id)
        self.public_subnet_id = pulumi.Output.from_input(existing.public_subnet_id)
        self.private_subnet_id = pulumi.Output.from_input(existing.private_subnet_id)
        self.private_subnet_cidr = private.cidr_block
        self.availability_zone = private.availability_zone

    def _create(self, name: str, args: NetworkArgs) -> None:
        subnets = plan_subnets(args.vpc_cidr)
        zone = args.availability_zone or _first_zone_offering(args.instance_type)

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.vpc_cidr,
            # The EFS mount target is reached by its DNS name.
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags=tags(f"{name}-vpc"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        public = self._subnet(name, "public", vpc, subnets.public, zone)
        private = self._subnet(name, "private", vpc, subnets.private, zone)
        internet_gateway = aws.ec2.InternetGateway(
            f"{name}-internet-gateway",
            vpc_id=vpc.id,
            tags=tags(f"{name}-internet-gateway"),
            opts=renamed_from(f"{name}-igw", parent=self),
        )
        nat_ip = aws.ec2.Eip(
            f"{name}-nat-ip", domain="vpc", tags=tags(f"{name}-nat-ip"), opts=pulumi.ResourceOptions(parent=self)
        )
        # The GPU nodes have no public IP; they reach the package index and Hugging
        # Face through this NAT gateway, which needs the internet gateway first.
        nat_gateway = aws.ec2.NatGateway(
            f"{name}-nat-gateway",
            allocation_id=nat_ip.allocation_id,
            subnet_id=public.id,
            tags=tags(f"{name}-nat-gateway"),
            opts=renamed_from(f"{name}-nat", parent=self, depends_on=[internet_gateway]),
        )

        self.ready = [
            *self._default_route(name, "public", vpc, public, gateway_id=internet_gateway.id),
            *self._default_route(name, "private", vpc, private, nat_gateway_id=nat_gateway.id),
        ]

        self.vpc_id = vpc.id
        self.public_subnet_id = public.id
        self.private_subnet_id = private.id
        self.private_subnet_cidr = pulumi.Output.from_input(subnets.private)
        self.availability_zone = public.availability_zone

    def _subnet(self, name: str, tier: str, vpc: aws.ec2.Vpc, cidr: str, zone: pulumi.Input[str]) -> aws.ec2.Subnet:
        return aws.ec2.Subnet(
            f"{name}-{tier}-subnet",
            vpc_id=vpc.id,
            cidr_block=cidr,
            availability_zone=zone,
            # Nothing gets a public IP by accident: the gateway asks for one explicitly.
            map_public_ip_on_launch=False,
            tags=tags(f"{name}-{tier}-subnet", **{"vllm-cluster:tier": tier}),
            opts=renamed_from(f"{name}-{tier}", parent=self),
        )

    def _default_route(self, name: str, tier: str, vpc, subnet, **target) -> list[pulumi.Resource]:
        """A route table for one subnet whose default route goes to `target`
        (the internet gateway for the public tier, the NAT gateway for the private one)."""
        table = aws.ec2.RouteTable(
            f"{name}-{tier}-route-table",
            vpc_id=vpc.id,
            tags=tags(f"{name}-{tier}-route-table"),
            opts=renamed_from(f"{name}-{tier}", parent=self),
        )
        route = aws.ec2.Route(
            f"{name}-{tier}-default-route",
            route_table_id=table.id,
            destination_cidr_block="0.0.0.0/0",
            **target,
            opts=renamed_from(f"{name}-{tier}-default", parent=self),
        )
        association = aws.ec2.RouteTableAssociation(
            f"{name}-{tier}-route-table-association",
            subnet_id=subnet.id,
            route_table_id=table.id,
            opts=renamed_from(f"{name}-{tier}", parent=self),
        )
        return [route, association]
