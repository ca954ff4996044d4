"""What EC2, IAM and EFS would refuse, checked on the inputs each resource really
receives, before anything exists.

The mock runtime (cli/mock_runtime.py) accepts any input; the cloud does not. This
module holds AWS's own rules, each with the page (or the upstream source, for
Pulumi's auto-naming) it comes from, and applies them to the resources a program
run declared: their type, their logical name and their inputs as the engine sees
them (camelCase keys, secrets wrapped, base64 where the API takes base64). It
returns errors (AWS refuses the call) and warnings (a default quota the stack
alone would exceed; the account may have a raised one).

Pure: plain data in, findings out; no Pulumi import. `plan` and the tests run it
over every resource of every stack (tests/test_aws_contract.py).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from components.catalog import CATALOG, InstanceType

INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
CLASSIC_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ROLE = "aws:iam/role:Role"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"
FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
EIP = "aws:ec2/eip:Eip"
IMAGE_COMPONENT = "aws:imagebuilder/component:Component"
IMAGE_RECIPE = "aws:imagebuilder/imageRecipe:ImageRecipe"
IMAGE_INFRASTRUCTURE = "aws:imagebuilder/infrastructureConfiguration:InfrastructureConfiguration"

# --- Sources -----------------------------------------------------------------------
# EC2 Image Builder's request shapes (CreateComponent, CreateImageRecipe,
# CreateInfrastructureConfiguration): a name is a ResourceName, pattern
# ^[-_A-Za-z-0-9][-_A-Za-z0-9 ]{1,126}[-_A-Za-z-0-9]$ (3-128 characters); a version a
# VersionNumber, ^[0-9]+\.[0-9]+\.[0-9]+$; a component's inline document
# (InlineComponentData) 1-16,000 characters (botocore's model of the API,
# botocore/data/imagebuilder/2019-12-02/service-2.json, as installed here).
IMAGE_BUILDER_SOURCE = "https://docs.aws.amazon.com/imagebuilder/latest/APIReference/API_CreateComponent.html"
IMAGE_BUILDER_NAME = re.compile(r"^[-_A-Za-z0-9][-_A-Za-z0-9 ]{1,126}[-_A-Za-z0-9]$")
IMAGE_BUILDER_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
COMPONENT_DATA_MAX_CHARS = 16000
# "User data is limited to 16 KB, in raw form, before it is base64-encoded."
USER_DATA_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html"
USER_DATA_LIMIT_BYTES = 16 * 1024
# Tag restrictions: 50 tags per resource, keys up to 128 and values up to 256 Unicode
# characters, the aws: prefix reserved (EC2 allows any character in tags).
EC2_TAGS_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions"
# IAM's Tag type: key 1-128, value 0-256, both of Unicode letters, separators and
# numbers and _ . : / = + - @ only.
IAM_TAGS_SOURCE = "https://docs.aws.amazon.com/IAM/latest/APIReference/API_Tag.html"
# The same limits for every other service's tags (AWS's common tag restrictions).
TAGS_SOURCE = "https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html"
MAX_TAGS = 50
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
IAM_TAG_CHARACTERS = re.compile(r"^[\w\s.:/=+\-@]*$")  # \w: letters, numbers and _ in Unicode
# CreateSecurityGroup's GroupDescription (and GroupName): "Up to 255 characters in
# length. Valid characters: a-z, A-Z, 0-9, spaces, and ._-:/()#,@[]+=&;{}!$*".
GROUP_DESCRIPTION_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html"
# A rule's Description (IpRange, Ipv6Range, UserIdGroupPair, PrefixListId): the same
# 255 characters of the same set.
RULE_DESCRIPTION_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_IpRange.html"
MAX_DESCRIPTION = 255
EC2_DESCRIPTION_CHARACTERS = re.compile(r"^[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]*$")
# Amazon VPC quotas: inbound or outbound rules per security group, 60 each by default,
# "enforced separately for IPv4 rules and IPv6 rules"; security groups per network
# interface, 5 by default.
VPC_QUOTAS_SOURCE = "https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html#vpc-limits-security-groups"
RULES_PER_GROUP = 60
GROUPS_PER_INTERFACE = 5
# Pulumi's auto-name: the logical name, "-" and 7 random hex digits
# (pulumi-terraform-bridge pkg/tfbridge/names.go, AutoName: Randlen 7). pulumi-aws
# declares it for iam.Role's name with a cap of 64 and, by default, for every other
# `name` and for efs.FileSystem's creationToken with a cap of 255 (provider/resources.go,
# provider/autonaming.go): that cap is not AWS's limit, so a long logical name passes
# Pulumi and fails at AWS.
AUTONAME_SOURCE = "https://github.com/pulumi/pulumi-aws/blob/master/provider/resources.go"
AUTONAME_SUFFIX = len("-") + 7
IAM_ROLE_SOURCE = "https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateRole.html"
IAM_PROFILE_SOURCE = "https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreateInstanceProfile.html"
IAM_NAME_CHARACTERS = re.compile(r"^[\w+=,.@-]+$")
TEMPLATE_NAME_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_LaunchTemplate.html"
TEMPLATE_NAME_CHARACTERS = re.compile(r"^[a-zA-Z0-9().\-/_]+$")
CREATION_TOKEN_SOURCE = "https://docs.aws.amazon.com/efs/latest/ug/API_CreateFileSystem.html"
# gp3 since AWS raised its limits in September 2025: 1 GiB-64 TiB, 3,000-80,000 IOPS,
# 125-2,000 MiB/s (announcement below; terraform-provider-aws#44604 raised its launch
# template check to 2,000 MiB/s). Provisioned IOPS at most 500 per GiB, provisioned
# throughput at most 0.25 MiB/s per IOPS (EBS User Guide, gp3 volumes).
GP3_SOURCE = "https://aws.amazon.com/about-aws/whats-new/2025/09/amazon-ebs-size-provisioned-performance-gp3-volumes/"
GP3_RATIO_SOURCE = "https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp3-ebs-volume-type"
GP3_SIZE_GIB = (1, 65536)
GP3_IOPS = (3000, 80000)
GP3_THROUGHPUT = (125, 2000)
GP3_IOPS_PER_GIB = 500
GP3_MIBS_PER_IOPS = 0.25
# Network cards and EFA interfaces per type: components/catalog.py, whose rows name
# their sources; one EFA (or EFA-only) interface per network card.
INTERFACES_SOURCE = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html"
# "By default, all AWS accounts have a quota of five (5) Elastic IP addresses per Region."
EIP_SOURCE = (
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/elastic-ip-addresses-eip.html#using-instance-addressing-limit"
)
EIPS_PER_REGION = 5
# IAM quotas: a role's inline policies hold at most 10,240 characters together, whitespace
# not counted ("Role policy size ... 10,240 characters"; role_policy_findings sums them per role).
IAM_QUOTAS_SOURCE = "https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html"
INLINE_ROLE_POLICY_MAX_CHARS = 10240

# How the SDK marks a secret value on the wire (pulumi.runtime.rpc): its plain value
# is what AWS receives.
_SECRET_KEY = "4dabf18193072939515e22adb298388d"


class Declared(Protocol):
    """What the checks read of a declared resource (cli.mock_runtime.DeclaredResource)."""

    type: str
    name: str
    inputs: dict


@dataclass(frozen=True)
class Finding:
    """One rule broken by one resource: which input, its value or size, AWS's limit
    and where AWS says so."""

    rule: str
    resource: str
    type: str
    input: str
    value: str
    limit: str
    source: str

    def __str__(self) -> str:
        kind = self.type.rsplit(":", 1)[-1] if self.type else "stack"
        return f"{self.resource} ({kind}) {self.input}: {self.value}; {self.limit} ({self.source})"


@dataclass
class Contract:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def plain(value: Any) -> Any:
    """The value AWS receives: secrets unwrapped, at any depth."""
    if isinstance(value, dict):
        if _SECRET_KEY in value:
            return plain(value.get("value"))
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def _finding(rule: str, resource: Declared, input_: str, value: str, limit: str, source: str) -> Finding:
    return Finding(rule, resource.name, resource.type, input_, value, limit, source)


# --- IAM policies ------------------------------------------------------------------


def inline_policy_size(text: str) -> int:
    """A policy's size as IAM counts it against its quota: whitespace is not counted."""
    return len("".join(text.split()))


def role_policy_findings(resources: list[tuple[Declared, dict]]) -> list[Finding]:
    """IAM counts a role's inline policies together against its quota (IAM_QUOTAS_SOURCE):
    the sum per role (its `role` input), reported on the role's largest policy."""
    by_role: dict[str, list[tuple[int, Declared]]] = defaultdict(list)
    for resource, inputs in resources:
        if resource.type == ROLE_POLICY and isinstance(inputs.get("policy"), str):
            by_role[str(inputs.get("role"))].append((inline_policy_size(inputs["policy"]), resource))
    found = []
    for _, policies in sorted(by_role.items()):
        size = sum(s for s, _ in policies)
        if size <= INLINE_ROLE_POLICY_MAX_CHARS:
            continue
        largest = max(policies, key=lambda p: p[0])[1]
        found.append(
            _finding(
                "inline-policy-size",
                largest,
                "policy",
                f"{size} characters in the role's {len(policies)} inline policies (whitespace not counted)",
                f"at most {INLINE_ROLE_POLICY_MAX_CHARS} in a role's inline policies",
                IAM_QUOTAS_SOURCE,
            )
        )
    return found


# --- User data ---------------------------------------------------------------------


def _decoded(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def user_data_findings(resource: Declared, inputs: Mapping[str, Any]) -> list[Finding]:
    """An Instance's userData is sent as its text's bytes, its userDataBase64 and a
    launch template's userData are base64 that EC2 decodes: the decoded bytes (gzip
    bytes when gzipped) are the raw form the 16 KB limit counts."""
    found = []
    candidates = []
    if resource.type == INSTANCE:
        if isinstance(inputs.get("userData"), str):
            candidates.append(("userData", inputs["userData"].encode(), "text"))
        if isinstance(inputs.get("userDataBase64"), str):
            candidates.append(("userDataBase64", inputs["userDataBase64"], "base64"))
    elif resource.type == TEMPLATE and isinstance(inputs.get("userData"), str):
        candidates.append(("userData", inputs["userData"], "base64"))
    for key, data, form in candidates:
        if form == "base64":
            raw = _decoded(data)
            if raw is None:
                found.append(
                    _finding(
                        "user-data-base64",
                        resource,
                        key,
                        f"{len(data):,} characters that are not valid base64",
                        "EC2 takes this input base64-encoded",
                        USER_DATA_SOURCE,
                    )
                )
                continue
            data = raw
        if len(data) > USER_DATA_LIMIT_BYTES:
            found.append(
                _finding(
                    "user-data-size",
                    resource,
                    key,
                    f"{len(data):,} bytes raw" + (" (after base64 decoding)" if form == "base64" else ""),
                    f"EC2 limits user data to 16 KB ({USER_DATA_LIMIT_BYTES:,} bytes) raw",
                    USER_DATA_SOURCE,
                )
            )
    return found


# --- Tags --------------------------------------------------------------------------


def _tag_source(type_: str) -> str:
    if type_.startswith(("aws:ec2/", "aws:vpc/")):
        return EC2_TAGS_SOURCE
    if type_.startswith("aws:iam/"):
        return IAM_TAGS_SOURCE
    return TAGS_SOURCE


def tag_findings(resource: Declared, where: str, tags: Any) -> list[Finding]:
    if not isinstance(tags, dict):
        return []
    source = _tag_source(resource.type)
    found = []
    if len(tags) > MAX_TAGS:
        found.append(
            _finding("tag-count", resource, where, f"{len(tags)} tags", f"at most {MAX_TAGS} per resource", source)
        )
    for key, value in tags.items():
        key, value = str(key), "" if value is None else str(value)
        if len(key) > MAX_TAG_KEY:
            found.append(
                _finding(
                    "tag-key-length",
                    resource,
                    f"{where}[{key[:40]}...]",
                    f"a key of {len(key)} characters",
                    f"keys up to {MAX_TAG_KEY} characters",
                    source,
                )
            )
        if len(value) > MAX_TAG_VALUE:
            found.append(
                _finding(
                    "tag-value-length",
                    resource,
                    f"{where}[{key}]",
                    f"a value of {len(value)} characters",
                    f"values up to {MAX_TAG_VALUE} characters",
                    source,
                )
            )
        if key.lower().startswith("aws:"):
            found.append(
                _finding("tag-key-prefix", resource, f"{where}[{key}]", repr(key), "the aws: prefix is AWS's", source)
            )
        if resource.type.startswith("aws:iam/"):
            for part, text in (("key", key), ("value", value)):
                if not IAM_TAG_CHARACTERS.match(text):
                    found.append(
                        _finding(
                            "tag-characters",
                            resource,
                            f"{where}[{key}]",
                            f"the {part} {text!r}",
                            "IAM tags: letters, numbers, spaces and _ . : / = + - @ only",
                            source,
                        )
                    )
    return found


def tags_of(resource: Declared, inputs: Mapping[str, Any]) -> list[Finding]:
    if not resource.type.startswith("aws:"):
        return []
    found = tag_findings(resource, "tags", inputs.get("tags"))
    if resource.type == TEMPLATE:
        for i, spec in enumerate(inputs.get("tagSpecifications") or []):
            if isinstance(spec, dict):
                found += tag_findings(resource, f"tagSpecifications[{i}].tags", spec.get("tags"))
    return found


# --- Security groups ---------------------------------------------------------------


def description_findings(resource: Declared, where: str, text: Any, source: str) -> list[Finding]:
    if not isinstance(text, str):
        return []
    found = []
    if len(text) > MAX_DESCRIPTION:
        found.append(
            _finding(
                "description-length",
                resource,
                where,
                f"{len(text)} characters",
                f"EC2 takes up to {MAX_DESCRIPTION}",
                source,
            )
        )
    bad = sorted({c for c in text if not EC2_DESCRIPTION_CHARACTERS.match(c)})
    if bad:
        found.append(
            _finding(
                "description-characters",
                resource,
                where,
                f"{text[:60]!r}{'...' if len(text) > 60 else ''} holds {' '.join(repr(c) for c in bad)}",
                "EC2 allows a-z, A-Z, 0-9, spaces and ._-:/()#,@[]+=&;{}!$* only",
                source,
            )
        )
    return found


def _families(rule: Mapping[str, Any]) -> list[str]:
    """The address families a rule counts against. A CIDR rule counts in its own; a
    rule naming a security group or a prefix list is counted in both, the stricter
    reading (the quota is per family, and such a rule admits either)."""
    if rule.get("cidrIpv4"):
        return ["IPv4"]
    if rule.get("cidrIpv6"):
        return ["IPv6"]
    return ["IPv4", "IPv6"]


def _inline_rule_count(rule: Mapping[str, Any]) -> Counter:
    """An inline rule (SecurityGroup ingress/egress, SecurityGroupRule) is one rule
    per CIDR and one for the groups or prefix lists it names."""
    counts: Counter = Counter()
    counts["IPv4"] += len(rule.get("cidrBlocks") or [])
    counts["IPv6"] += len(rule.get("ipv6CidrBlocks") or [])
    others = len(rule.get("securityGroups") or []) + len(rule.get("prefixListIds") or [])
    others += 1 if rule.get("self") or rule.get("sourceSecurityGroupId") else 0
    counts["IPv4"] += others
    counts["IPv6"] += others
    return counts


def security_group_findings(resources: list[tuple[Declared, dict]], id_of: Callable[[Declared], str]) -> list[Finding]:
    found = []
    groups = {id_of(r): r for r, _ in resources if r.type == SECURITY_GROUP}
    # (group id, direction) -> family -> count, across every resource of the stack.
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for resource, inputs in resources:
        if resource.type == SECURITY_GROUP:
            found += description_findings(resource, "description", inputs.get("description"), GROUP_DESCRIPTION_SOURCE)
            found += _group_name_findings(resource, inputs)
            for direction, key in (("inbound", "ingress"), ("outbound", "egress")):
                for i, rule in enumerate(inputs.get(key) or []):
                    found += description_findings(
                        resource, f"{key}[{i}].description", rule.get("description"), RULE_DESCRIPTION_SOURCE
                    )
                    counts[(id_of(resource), direction)] += _inline_rule_count(rule)
        elif resource.type in (INGRESS, EGRESS):
            found += description_findings(resource, "description", inputs.get("description"), RULE_DESCRIPTION_SOURCE)
            direction = "inbound" if resource.type == INGRESS else "outbound"
            for family in _families(inputs):
                counts[(str(inputs.get("securityGroupId")), direction)][family] += 1
        elif resource.type == CLASSIC_RULE:
            found += description_findings(resource, "description", inputs.get("description"), RULE_DESCRIPTION_SOURCE)
            direction = "inbound" if inputs.get("type") == "ingress" else "outbound"
            counts[(str(inputs.get("securityGroupId")), direction)] += _inline_rule_count(inputs)
    for (group_id, direction), families in sorted(counts.items()):
        for family, count in sorted(families.items()):
            if count > RULES_PER_GROUP:
                group = groups.get(group_id)
                found.append(
                    Finding(
                        "rules-per-group",
                        group.name if group else group_id,
                        SECURITY_GROUP,
                        f"{direction} {family} rules",
                        f"{count} rules across the stack",
                        f"the default quota is {RULES_PER_GROUP} {direction} rules per group and family",
                        VPC_QUOTAS_SOURCE,
                    )
                )
    return found


def _group_name_findings(resource: Declared, inputs: Mapping[str, Any]) -> list[Finding]:
    name = inputs.get("name")
    given = isinstance(name, str)
    name = name if given else resource.name + "-" + "0" * (AUTONAME_SUFFIX - 1)
    found = []
    if len(name) > MAX_DESCRIPTION:
        found.append(
            _finding(
                "name-length",
                resource,
                "name" if given else "name (auto-named)",
                f"{len(name)} characters",
                f"EC2 takes group names up to {MAX_DESCRIPTION}",
                GROUP_DESCRIPTION_SOURCE,
            )
        )
    if given and name.startswith("sg-"):
        found.append(
            _finding(
                "name-prefix", resource, "name", repr(name), "no group name starts with sg-", GROUP_DESCRIPTION_SOURCE
            )
        )
    return found


# --- Names after Pulumi's auto-naming ------------------------------------------------


@dataclass(frozen=True)
class NameRule:
    input: str
    minimum: int
    maximum: int
    characters: re.Pattern | None
    allowed: str
    source: str


NAME_RULES = {
    ROLE: NameRule("name", 1, 64, IAM_NAME_CHARACTERS, "letters, numbers and _+=,.@-", IAM_ROLE_SOURCE),
    INSTANCE_PROFILE: NameRule("name", 1, 128, IAM_NAME_CHARACTERS, "letters, numbers and _+=,.@-", IAM_PROFILE_SOURCE),
    TEMPLATE: NameRule("name", 3, 128, TEMPLATE_NAME_CHARACTERS, "a-z, A-Z, 0-9 and ().-/_", TEMPLATE_NAME_SOURCE),
    FILE_SYSTEM: NameRule("creationToken", 1, 64, None, "any", CREATION_TOKEN_SOURCE),
}


def auto_name(logical_name: str) -> str:
    """The shape of the name Pulumi gives a resource whose name is not set: the
    logical name, '-' and 7 hex digits (the digits are random; their count is not)."""
    return f"{logical_name}-{'0' * (AUTONAME_SUFFIX - 1)}"


def name_findings(resource: Declared, inputs: Mapping[str, Any]) -> list[Finding]:
    rule = NAME_RULES.get(resource.type)
    if rule is None:
        return []
    given = inputs.get(rule.input)
    name = given if isinstance(given, str) else auto_name(resource.name)
    where = rule.input if isinstance(given, str) else f"{rule.input} (auto-named: {resource.name} + 8 characters)"
    found = []
    if not rule.minimum <= len(name) <= rule.maximum:
        found.append(
            _finding(
                "name-length",
                resource,
                where,
                f"{len(name)} characters",
                f"{rule.minimum}-{rule.maximum} characters",
                rule.source if isinstance(given, str) else f"{rule.source}; {AUTONAME_SOURCE}",
            )
        )
    if rule.characters is not None and not rule.characters.match(name):
        found.append(_finding("name-characters", resource, where, repr(name), f"{rule.allowed} only", rule.source))
    return found


# --- EC2 Image Builder ---------------------------------------------------------------


def image_builder_findings(resource: Declared, inputs: Mapping[str, Any]) -> list[Finding]:
    if resource.type not in (IMAGE_COMPONENT, IMAGE_RECIPE, IMAGE_INFRASTRUCTURE):
        return []
    found = []
    name = inputs.get("name")
    if isinstance(name, str) and not IMAGE_BUILDER_NAME.match(name):
        found.append(
            _finding(
                "image-builder-name",
                resource,
                "name",
                repr(name),
                "3-128 of letters, digits, - and _ (spaces inside)",
                IMAGE_BUILDER_SOURCE,
            )
        )
    version = inputs.get("version")
    if resource.type != IMAGE_INFRASTRUCTURE and isinstance(version, str) and not IMAGE_BUILDER_VERSION.match(version):
        found.append(
            _finding(
                "image-builder-version", resource, "version", repr(version), "major.minor.patch", IMAGE_BUILDER_SOURCE
            )
        )
    data = inputs.get("data")
    if resource.type == IMAGE_COMPONENT and isinstance(data, str) and not 1 <= len(data) <= COMPONENT_DATA_MAX_CHARS:
        found.append(
            _finding(
                "component-data-size",
                resource,
                "data",
                f"{len(data)} characters",
                f"1-{COMPONENT_DATA_MAX_CHARS} characters (a larger document goes to S3: uri)",
                IMAGE_BUILDER_SOURCE,
            )
        )
    return found


# --- EBS gp3 -------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def gp3_findings(resource: Declared, where: str, volume: Any) -> list[Finding]:
    if not isinstance(volume, dict) or volume.get("volumeType") != "gp3":
        return []
    found = []
    size, iops, throughput = (_number(volume.get(k)) for k in ("volumeSize", "iops", "throughput"))

    def out_of(key: str, value: float | None, bounds: tuple[int, int], unit: str) -> None:
        if value is not None and not bounds[0] <= value <= bounds[1]:
            found.append(
                _finding(
                    f"gp3-{key}",
                    resource,
                    f"{where}.{key}",
                    f"{value:g} {unit}",
                    f"gp3 takes {bounds[0]:,}-{bounds[1]:,} {unit}",
                    GP3_SOURCE,
                )
            )

    out_of("volumeSize", size, GP3_SIZE_GIB, "GiB")
    out_of("iops", iops, GP3_IOPS, "IOPS")
    out_of("throughput", throughput, GP3_THROUGHPUT, "MiB/s")
    # The baseline (3,000 IOPS, 125 MiB/s) comes with any size; the ratios bound what is provisioned above it.
    if iops is not None and size is not None and iops > GP3_IOPS[0] and iops > GP3_IOPS_PER_GIB * size:
        found.append(
            _finding(
                "gp3-iops-per-gib",
                resource,
                f"{where}.iops",
                f"{iops:g} IOPS on {size:g} GiB",
                f"at most {GP3_IOPS_PER_GIB} IOPS per GiB ({GP3_IOPS_PER_GIB * size:g})",
                GP3_RATIO_SOURCE,
            )
        )
    effective_iops = iops if iops is not None else GP3_IOPS[0]
    if throughput is not None and throughput > GP3_THROUGHPUT[0] and throughput > GP3_MIBS_PER_IOPS * effective_iops:
        found.append(
            _finding(
                "gp3-throughput-per-iops",
                resource,
                f"{where}.throughput",
                f"{throughput:g} MiB/s with {effective_iops:g} IOPS",
                f"at most {GP3_MIBS_PER_IOPS} MiB/s per IOPS ({GP3_MIBS_PER_IOPS * effective_iops:g})",
                GP3_RATIO_SOURCE,
            )
        )
    return found


def volume_findings(resource: Declared, inputs: Mapping[str, Any]) -> list[Finding]:
    found = []
    if resource.type in (TEMPLATE, IMAGE_RECIPE):
        for i, mapping in enumerate(inputs.get("blockDeviceMappings") or []):
            if isinstance(mapping, dict):
                found += gp3_findings(resource, f"blockDeviceMappings[{i}].ebs", mapping.get("ebs"))
    elif resource.type == INSTANCE:
        found += gp3_findings(resource, "rootBlockDevice", inputs.get("rootBlockDevice"))
        for i, device in enumerate(inputs.get("ebsBlockDevices") or []):
            found += gp3_findings(resource, f"ebsBlockDevices[{i}]", device)
    return found


# --- Network interfaces --------------------------------------------------------------


def interface_findings(
    resource: Declared, inputs: Mapping[str, Any], catalog: Mapping[str, InstanceType]
) -> list[Finding]:
    """A launch template's interfaces against its type's network cards and EFA maximum
    (components/catalog.py), and each interface's groups against the VPC quota."""
    if resource.type not in (TEMPLATE, INSTANCE):
        return []
    found = []
    if resource.type == INSTANCE:
        groups = inputs.get("vpcSecurityGroupIds") or []
        if len(groups) > GROUPS_PER_INTERFACE:
            found.append(_groups_finding(resource, "vpcSecurityGroupIds", len(groups)))
        return found
    interfaces = [i for i in inputs.get("networkInterfaces") or [] if isinstance(i, dict)]
    groups = inputs.get("vpcSecurityGroupIds") or []
    if len(groups) > GROUPS_PER_INTERFACE:
        found.append(_groups_finding(resource, "vpcSecurityGroupIds", len(groups)))
    for i, interface in enumerate(interfaces):
        if len(interface.get("securityGroups") or []) > GROUPS_PER_INTERFACE:
            found.append(
                _groups_finding(resource, f"networkInterfaces[{i}].securityGroups", len(interface["securityGroups"]))
            )
    instance = catalog.get(str(inputs.get("instanceType")))
    if instance is None or not interfaces:
        return found
    return found + _card_findings(resource, interfaces, instance)


def _card_findings(resource: Declared, interfaces: list[dict], instance: InstanceType) -> list[Finding]:
    """The interfaces against the type's network cards: each on a card it has, one per
    card and device index, at most one EFA interface per card and the type's EFA maximum."""
    found = []
    efa_per_card: Counter = Counter()
    slots: Counter = Counter()
    for i, interface in enumerate(interfaces):
        card = int(_number(interface.get("networkCardIndex")) or 0)
        device = int(_number(interface.get("deviceIndex")) or 0)
        slots[(card, device)] += 1
        if card >= instance.network_cards:
            found.append(
                _finding(
                    "network-card-index",
                    resource,
                    f"networkInterfaces[{i}].networkCardIndex",
                    str(card),
                    f"{instance.name} has {instance.network_cards} network card(s), "
                    f"index 0-{instance.network_cards - 1}",
                    instance.figures_source or INTERFACES_SOURCE,
                )
            )
        if interface.get("interfaceType") in ("efa", "efa-only"):
            efa_per_card[card] += 1
    for (card, device), count in sorted(slots.items()):
        if count > 1:
            found.append(
                _finding(
                    "interface-slot",
                    resource,
                    "networkInterfaces",
                    f"{count} interfaces at network card {card}, device {device}",
                    "one interface per card and device index",
                    INTERFACES_SOURCE,
                )
            )
    return found + _efa_findings(resource, efa_per_card, instance)


def _efa_findings(resource: Declared, efa_per_card: Counter, instance: InstanceType) -> list[Finding]:
    found = []
    for card, count in sorted(efa_per_card.items()):
        if count > 1:
            found.append(
                _finding(
                    "efa-per-card",
                    resource,
                    "networkInterfaces",
                    f"{count} EFA interfaces on network card {card}",
                    "one EFA interface per network card",
                    INTERFACES_SOURCE,
                )
            )
    total_efa = sum(efa_per_card.values())
    if total_efa > instance.max_efa_interfaces:
        found.append(
            _finding(
                "efa-count",
                resource,
                "networkInterfaces",
                f"{total_efa} EFA interfaces",
                f"{instance.name} takes at most {instance.max_efa_interfaces}",
                instance.figures_source or INTERFACES_SOURCE,
            )
        )
    return found


def _groups_finding(resource: Declared, where: str, count: int) -> Finding:
    return _finding(
        "groups-per-interface",
        resource,
        where,
        f"{count} security groups",
        f"the default quota is {GROUPS_PER_INTERFACE} per network interface",
        VPC_QUOTAS_SOURCE,
    )


# --- The whole stack -----------------------------------------------------------------


def eip_warnings(resources: list[tuple[Declared, dict]]) -> list[Finding]:
    eips = [r for r, _ in resources if r.type == EIP]
    if len(eips) <= EIPS_PER_REGION:
        return []
    return [
        Finding(
            "eips-per-region",
            "(stack)",
            "",
            "Elastic IPs",
            f"{len(eips)} Elastic IPs ({', '.join(sorted(r.name for r in eips))})",
            f"the default quota is {EIPS_PER_REGION} per region, before any the account already holds; "
            "ask for more under Service Quotas, Amazon EC2, 'EC2-VPC Elastic IPs'",
            EIP_SOURCE,
        )
    ]


def check(
    resources: Iterable[Declared],
    id_of: Callable[[Declared], str] | None = None,
    catalog: Mapping[str, InstanceType] = CATALOG,
) -> Contract:
    """Every rule over every resource. `id_of` gives the id the cloud would give a
    resource (the mock runtime's ids), so rules declared apart are counted against
    the group they name; without it, a group's id is its name."""
    id_of = id_of or (lambda resource: resource.name)
    declared = [(r, plain(r.inputs or {})) for r in resources]
    contract = Contract()
    for resource, inputs in declared:
        contract.errors += user_data_findings(resource, inputs)
        contract.errors += tags_of(resource, inputs)
        contract.errors += name_findings(resource, inputs)
        contract.errors += volume_findings(resource, inputs)
        contract.errors += interface_findings(resource, inputs, catalog)
        contract.errors += image_builder_findings(resource, inputs)
    contract.errors += role_policy_findings(declared)
    contract.errors += security_group_findings(declared, id_of)
    contract.warnings += eip_warnings(declared)
    return contract
