"""EC2's On-Demand vCPU quotas: which quota each of the stack's instances counts against,
what the stack needs of each, and what a `pulumi up` must refuse or warn of.

Pure Python. EC2 limits running On-Demand instances by vCPUs per quota, one quota per
group of instance families, per region: "Running On-Demand P instances", "... G and VT
instances", "... Standard (A, C, D, H, I, M, R, T, Z) instances", among others
(https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html). A new
account's P and G quotas are often 0 or a few vCPUs, so the first `pulumi up` of a GPU
stack fails at the instances, after the network, the cache and the gateway were created,
with VcpuLimitExceeded. The program reads the quotas first (Service Quotas'
GetServiceQuota, service code "ec2") and refuses a stack that cannot run before anything
is created.

What is not counted: the account's other running instances, which use the same quotas
(Service Quotas gives the limit, not the use; the use is a CloudWatch metric,
AWS/Usage ResourceCount). A stack the quota admits can still fail on an account that runs
other instances of the family: the refusal and the warning say so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from components import catalog

SERVICE_CODE = "ec2"
QUOTAS_DOC = "https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html"


@dataclass(frozen=True)
class Quota:
    code: str
    name: str


# Quota codes as Service Quotas lists them (`aws service-quotas list-service-quotas
# --service-code ec2`). L-1216C47A with its name: the AWS CLI's example of
# get-aws-default-service-quota (docs.aws.amazon.com/cli, service-quotas examples); the P
# and G codes are the ones the Service Quotas console links to for these names (its URLs
# .../servicequotas/home/services/ec2/quotas/L-417A185B and .../L-DB2E81BA) [secondary:
# read in third-party guides, not on an AWS page here].
STANDARD = Quota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
G_AND_VT = Quota("L-DB2E81BA", "Running On-Demand G and VT instances")
P = Quota("L-417A185B", "Running On-Demand P instances")

# An instance type's family letters (before its generation digit) -> its quota (QUOTAS_DOC).
_FAMILY_QUOTAS = {
    "p": P,
    "g": G_AND_VT,
    "vt": G_AND_VT,
    **{letter: STANDARD for letter in "acdhimrtz"},
}

# The gateway types the stack prices (components/sizing/cost.py): all two vCPUs
# (https://aws.amazon.com/ec2/instance-types/t3/, .../t4/ and .../c7i/: t3.micro, t3.small,
# t3.medium, t4g.small and c7i.large each 2 vCPUs).
GATEWAY_VCPUS = {"t3.micro": 2, "t3.small": 2, "t3.medium": 2, "t4g.small": 2, "c7i.large": 2}


def quota_of(instance_type: str) -> Quota | None:
    """The On-Demand quota `instance_type` counts against; None for a family whose quota
    the stack does not know (Inf, Trn, DL, F, X, high memory)."""
    match = re.match(r"([a-z]+)\d", instance_type)
    return _FAMILY_QUOTAS.get(match.group(1)) if match else None


@dataclass(frozen=True)
class Need:
    """What the stack needs of one quota, in vCPUs: running, and while its GPU nodes are
    replaced (the new nodes come up before the old ones go, so both run for a while)."""

    quota: Quota
    vcpus: int
    replacing_vcpus: int
    counted: tuple[str, ...]  # what makes it up, for a person

    def as_dict(self) -> dict:
        return {
            "quotaCode": self.quota.code,
            "quotaName": self.quota.name,
            "vcpus": self.vcpus,
            "replacingVcpus": self.replacing_vcpus,
            "counted": list(self.counted),
        }


def needs(instance_type: str, total_nodes: int, gateway_instance_type: str) -> tuple[list[Need], list[str]]:
    """The stack's needs per quota (GPU nodes and gateway), and what could not be counted."""
    uncounted = []
    parts: dict[Quota, list[tuple[int, int, str]]] = {}
    instance = catalog.lookup(instance_type)
    gpu_quota = quota_of(instance_type)
    if instance is None or gpu_quota is None:
        uncounted.append(f"{instance_type}: no known On-Demand quota or vCPU count")
    else:
        vcpus = total_nodes * instance.vcpus
        parts.setdefault(gpu_quota, []).append(
            (vcpus, 2 * vcpus, f"{total_nodes} x {instance_type} ({instance.vcpus} vCPUs each)")
        )
    gateway_quota, gateway_vcpus = quota_of(gateway_instance_type), GATEWAY_VCPUS.get(gateway_instance_type)
    if gateway_quota is None or gateway_vcpus is None:
        uncounted.append(f"the gateway's {gateway_instance_type}: no known On-Demand quota or vCPU count")
    else:
        # The gateway is not replaced with the nodes: it counts once in both.
        parts.setdefault(gateway_quota, []).append(
            (gateway_vcpus, gateway_vcpus, f"the gateway's {gateway_instance_type} ({gateway_vcpus} vCPUs)")
        )
    found = [
        Need(quota, sum(p[0] for p in items), sum(p[1] for p in items), tuple(p[2] for p in items))
        for quota, items in parts.items()
    ]
    return sorted(found, key=lambda need: need.quota.code), uncounted


def _increase(service_code: str, code: str, value: int, region: str | None = None) -> str:
    """The AWS CLI line that asks Service Quotas for `value` of quota `code`."""
    where = f"--region {region} " if region else ""
    return (
        f"aws service-quotas request-service-quota-increase {where}--service-code {service_code} "
        f"--quota-code {code} --desired-value {value}"
    )


def judge(needs_: list[Need], limits: dict[str, float], region: str) -> tuple[list[str], list[str]]:
    """(refusals, warnings): a need over its quota's limit is refused (EC2 would refuse the
    instances with VcpuLimitExceeded after the rest of the stack was created); a need that
    fits but whose replacement would not is warned. `limits`: quota code -> the account's
    value in the region (Service Quotas' Value), as read."""
    refusals, warnings = [], []
    for need in needs_:
        limit = limits.get(need.quota.code)
        if limit is None:
            continue
        allowed = math.floor(limit)
        if need.vcpus > allowed:
            ask = _increase(SERVICE_CODE, need.quota.code, need.replacing_vcpus, region)
            refusals.append(
                f"the stack needs {need.vcpus} vCPUs of '{need.quota.name}' ({need.quota.code}) in {region}: "
                f"{'; '.join(need.counted)}, and the account's quota there is {allowed}. EC2 would refuse the "
                f"instances with VcpuLimitExceeded after the rest of the stack was created. Fix: ask for at least "
                f"{need.replacing_vcpus} (room for a node replacement too): {ask} "
                f"(or in the Service Quotas console), or choose a smaller instanceType or fewer nodes or replicas; "
                "the account's other running instances of these families count against it too"
            )
        elif need.replacing_vcpus > allowed:
            warnings.append(
                f"'{need.quota.name}' ({need.quota.code}) in {region} is {allowed} vCPUs: the stack needs "
                f"{need.vcpus}, but {need.replacing_vcpus} while its GPU nodes are replaced (the new ones start "
                f"before the old ones go), so a replacement would fail with VcpuLimitExceeded. Fix: "
                f"{_increase(SERVICE_CODE, need.quota.code, need.replacing_vcpus, region)}"
            )
    return refusals, warnings


# --- counts the stack adds to what the account holds ---------------------------------------


@dataclass(frozen=True)
class CountQuota:
    service_code: str
    code: str
    name: str
    default: int  # the quota a new account has, for when the account's cannot be read


# Default 5 each: "By default, all AWS accounts have a quota of five (5) Elastic IP
# addresses per Region" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/elastic-ip-addresses-eip.html);
# VPCs per Region 5, NAT gateways per Availability Zone 5
# (https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html). Codes as
# Service Quotas lists them [secondary: read in third-party quota checkers, not on an AWS page here].
ELASTIC_IPS = CountQuota("ec2", "L-0263D0A3", "EC2-VPC Elastic IPs", 5)
VPCS = CountQuota("vpc", "L-F678F1CE", "VPCs per Region", 5)
NAT_GATEWAYS = CountQuota("vpc", "L-FE5A380F", "NAT gateways per Availability Zone", 5)


def stack_adds(creates_network: bool) -> dict[CountQuota, int]:
    """What the stack holds of each: the gateway's Elastic IP (components/gateway.py), and
    with a network of its own its VPC, its NAT gateway and the NAT's Elastic IP
    (components/network.py). Internet gateways (5 per region too) are not counted: no
    lookup lists them (pulumi-aws has only the singular getInternetGateway), and a VPC
    holds one at the most, so the VPC count warns first in the usual account."""
    if not creates_network:
        return {ELASTIC_IPS: 1}
    return {ELASTIC_IPS: 2, VPCS: 1, NAT_GATEWAYS: 1}


def count_warnings(
    adds: dict[CountQuota, int], others: dict[str, int], limits: dict[str, float], where: dict[str, str]
) -> list[str]:
    """A warning for each quota the account's own (`others`: code -> what the account holds
    that is not this stack's) plus the stack's would pass. `limits`: code -> the account's
    quota (the default where it could not be read); `where`: code -> "in us-east-1" or
    "in us-east-1a"."""
    warnings = []
    for quota, count in adds.items():
        held, limit = others.get(quota.code, 0), math.floor(limits.get(quota.code, quota.default))
        if held + count > limit:
            warnings.append(
                f"'{quota.name}' ({quota.code}) {where.get(quota.code, '')}: the account holds {held} outside this "
                f"stack and the stack adds {count}, past the quota of {limit}: AWS would refuse the stack's. Fix: "
                f"{_increase(quota.service_code, quota.code, held + count)}, or free some"
            )
    return warnings
