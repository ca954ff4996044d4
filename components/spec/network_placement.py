"""Network placement: the nodes' Availability Zone, and a new VPC (vpcCidr) or an existing
network (vpcId, publicSubnetId, privateSubnetId); and what an existing VPC, looked up by
the program, lacks for the model cache.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from components.config_keys import DEFAULT_VPC_CIDR
from components.spec.reader import Problem, Reader, show

# "The code for an Availability Zone is its Region code followed by a letter identifier."
AVAILABILITY_ZONES_DOC = "https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html"
# "The smallest VPC you can create uses a /28 netmask ..., and the largest uses a /16 netmask."
CREATE_VPC_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateVpc.html"
_AZ = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d[a-z]$")
_VPC = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")


@dataclass(frozen=True)
class ExistingNetwork:
    vpc_id: str
    public_subnet_id: str
    private_subnet_id: str


@dataclass(frozen=True)
class NetworkPlacement:
    """Where the nodes go: a zone, and a new VPC or an existing network."""

    availability_zone: str | None
    vpc_cidr: str
    existing_network: ExistingNetwork | None


def _check_zone(reader: Reader, region: str | None) -> str | None:
    """A zone's name is its region's and one letter; the nodes launch in aws:region, where a
    zone of another region does not exist. Without the region (a caller that holds no
    stack) only the name's shape is checked."""
    zone = reader.string("availabilityZone")
    if zone is None:
        return None
    if not _AZ.match(zone):
        reader.fail(
            "availabilityZone",
            f"is not an Availability Zone name such as us-east-1a (its region's name and a letter; "
            f"see {AVAILABILITY_ZONES_DOC})",
        )
    elif region and zone[:-1] != region:
        reader.fail(
            "availabilityZone",
            f"is not in the stack's region {region} (aws:region): a zone's name is its region's and a letter. "
            f"Fix: a zone such as {region}a, or change aws:region (see {AVAILABILITY_ZONES_DOC})",
        )
    return zone


def _check_vpc_cidr(reader: Reader) -> str:
    vpc_cidr = reader.string("vpcCidr") or DEFAULT_VPC_CIDR
    try:
        network = ipaddress.ip_network(vpc_cidr, strict=True)
    except ValueError:
        reader.fail("vpcCidr", "is not a CIDR such as 10.42.0.0/16")
        return vpc_cidr
    if network.version != 4 or not 16 <= network.prefixlen <= 24:
        reader.fail(
            "vpcCidr",
            f"must be an IPv4 CIDR from /16 to /24, e.g. 10.42.0.0/16 (EC2 creates no VPC larger than a /16: "
            f"see {CREATE_VPC_DOC})",
        )
    elif not network.is_private:
        reader.fail("vpcCidr", "must be a private range (RFC 1918), e.g. 10.42.0.0/16")
    return vpc_cidr


def _check_existing_network(reader: Reader, vpc_cidr: str) -> ExistingNetwork | None:
    """vpcId, publicSubnetId and privateSubnetId: all three or none."""
    shapes = {
        "vpcId": (_VPC, "vpc-0abc12345def67890"),
        "publicSubnetId": (_SUBNET, "subnet-0abc12345def67890"),
        "privateSubnetId": (_SUBNET, "subnet-0abc12345def67890"),
    }
    ids = {key: reader.string(key) for key in shapes}
    if not any(ids.values()):
        return None
    missing = [key for key, value in ids.items() if not value]
    for key in missing:
        reader.fail(key, "must be set together with vpcId, publicSubnetId and privateSubnetId (all or none)")
    for key, value in ids.items():
        pattern, example = shapes[key]
        if value and not pattern.match(value):
            reader.fail(key, f"is not an id such as {example}")
    if vpc_cidr != DEFAULT_VPC_CIDR:
        reader.fail("vpcCidr", "applies only to a new VPC; remove it when vpcId is set")
    if missing:
        return None
    return ExistingNetwork(ids["vpcId"], ids["publicSubnetId"], ids["privateSubnetId"])


def check_network(reader: Reader, region: str | None) -> NetworkPlacement:
    zone = _check_zone(reader, region)
    vpc_cidr = _check_vpc_cidr(reader)
    return NetworkPlacement(zone, vpc_cidr, _check_existing_network(reader, vpc_cidr))


# The EFS page that states it: mounting by the file system's DNS name needs the Amazon
# DNS server and DNS hostnames in the client's VPC.
EFS_DNS_NAME_DOC = "https://docs.aws.amazon.com/efs/latest/ug/mounting-fs-mount-cmd-dns-name.html"


def existing_vpc_problems(vpc_id: str, dns_support: bool, dns_hostnames: bool) -> list[Problem]:
    """What an existing VPC (vpcId, looked up by the program) lacks for the model cache:
    the nodes mount EFS by its DNS name, which resolves only with the VPC's DNS support
    and DNS hostnames on. Support first: hostnames cannot be enabled without it."""
    missing = [
        ("enableDnsSupport", "DNS resolution", "--enable-dns-support", dns_support),
        ("enableDnsHostnames", "DNS hostnames", "--enable-dns-hostnames", dns_hostnames),
    ]
    return [
        Problem(
            "vpcId",
            show("vpcId", vpc_id),
            f"has {attribute} off ({label}): the nodes mount the EFS model cache by its DNS name, which never "
            "resolves in this VPC, so node setup would wait ten minutes and fail. "
            f"Fix: aws ec2 modify-vpc-attribute --vpc-id {vpc_id} {flag} (see {EFS_DNS_NAME_DOC})",
        )
        for attribute, label, flag, enabled in missing
        if not enabled
    ]
