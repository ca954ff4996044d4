"""AWS's contract (components/aws_contract.py) on what every resource really receives:
every stack file and generated configs that push the limits pass it, and every rule
catches a resource broken on purpose (one step past AWS's limit) while letting the
same resource at the limit through, so no rule passes by accident."""

import base64
import copy
import gzip
import json
import os

import pytest
from pulumi_mocks import ec2_stack_names, run_program, run_stack, stack_config

from components import aws_contract
from components.aws_contract import (
    EGRESS,
    EIP,
    FILE_SYSTEM,
    INGRESS,
    INSTANCE,
    INSTANCE_PROFILE,
    ROLE,
    SECURITY_GROUP,
    TEMPLATE,
)
from components.config_keys import MAX_REPLICAS

STACKS = ec2_stack_names()
RESERVED = {"capacityReservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b"}
EXISTING = {
    "vpcId": "vpc-0123456789abcdef0",
    "publicSubnetId": "subnet-0aaaaaaaaaaaaaaaa",
    "privateSubnetId": "subnet-0bbbbbbbbbbbbbbbb",
}
# Pulumi refuses longer stack names: "stack names are limited to 100 characters and may
# only contain alphanumeric, hyphens, underscores, or periods" (pulumi/pulumi
# pkg/backend/diy, ParseReference). The project name is fixed: Pulumi.yaml's `name` is
# the config namespace the program reads (vllm-cluster).
LONGEST_STACK_NAME = ("prod-" + "x" * 100)[:100]


def contract_of(run):
    return aws_contract.check(run.resources, run.id_of)


def shown(findings) -> str:
    return "\n".join(str(f) for f in findings) or "(none)"


# --- Every stack, and configs at the limits ------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_resource_of_every_stack_is_within_aws_limits(stack):
    run = run_stack(stack)
    assert run.error is None, run.error
    contract = contract_of(run)
    assert contract.errors == [], f"AWS would refuse stack {stack}:\n{shown(contract.errors)}"
    assert contract.warnings == [], shown(contract.warnings)


GENERATED = {
    "prod-16-replicas": ("prod", {"replicas": MAX_REPLICAS}),
    "h100-16-replicas": ("h100", {"replicas": MAX_REPLICAS}),
    "prod-existing-vpc": ("prod", EXISTING),
    "prod-reservation": ("prod", RESERVED),
    "h100-capacity-block": ("h100", {**RESERVED, "capacityBlock": True}),
    "h100-reserved-pg": ("h100", {**RESERVED, "placementGroupName": "reserved-pg"}),
    "h100-largest-root-volume": ("h100", {"rootVolumeGiB": 16384}),
    "dev-smallest-root-volume": ("dev", {"rootVolumeGiB": 150}),
    "prod-ipv6-clients": ("prod", {"apiAllowedCidrs": ["2001:db8::/48", "203.0.113.0/24"]}),
    "h100-all-at-once": ("h100", {"replicas": MAX_REPLICAS, **EXISTING, **RESERVED}),
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_configs_that_push_the_limits_are_within_aws_limits(name):
    stack, overrides = GENERATED[name]
    run = run_stack(stack, overrides)
    assert run.error is None, run.error
    contract = contract_of(run)
    assert contract.errors == [], f"AWS would refuse {name}:\n{shown(contract.errors)}"


def test_the_longest_stack_name_pulumi_allows_is_within_aws_limits():
    """The stack name is in every resource's tags; with 16 gangs of p5 on an existing VPC."""
    assert len(LONGEST_STACK_NAME) == 100
    config = {**stack_config("h100"), "vllm-cluster:replicas": MAX_REPLICAS, **_namespaced(EXISTING)}
    run = run_program(config, stack=LONGEST_STACK_NAME)
    assert run.error is None, run.error
    tagged = [r for r in run.resources if isinstance(r.inputs.get("tags"), dict)]
    assert tagged and all(r.inputs["tags"]["vllm-cluster:stack"] == LONGEST_STACK_NAME for r in tagged)
    contract = contract_of(run)
    assert contract.errors == [], shown(contract.errors)


def _namespaced(overrides):
    return {f"vllm-cluster:{key}": value for key, value in overrides.items()}


def test_p5_templates_carry_32_efa_interfaces_and_pass():
    """The rule on interfaces is exercised on the stack that fills every network card."""
    run = run_stack("h100", {"replicas": 2})
    templates = run.of_type(TEMPLATE)
    assert len(templates) == 2
    for template in templates:
        interfaces = template.inputs["networkInterfaces"]
        assert sum(i["interfaceType"] == "efa-only" for i in interfaces) == 32
        assert {i["networkCardIndex"] for i in interfaces} == set(range(32))
    assert contract_of(run).errors == []


def test_the_gateway_user_data_is_measured_as_ec2_decodes_it():
    """What the gateway really receives, decoded as EC2 does, is under 16 KB raw."""
    run = run_stack("prod")
    gateway = run.named("vllm-gateway-host", INSTANCE)
    inputs = aws_contract.plain(gateway.inputs)
    if "userDataBase64" in inputs:
        raw = base64.b64decode(inputs["userDataBase64"])
    else:
        raw = inputs["userData"].encode()
    assert len(raw) <= aws_contract.USER_DATA_LIMIT_BYTES


def test_the_longest_cidr_lists_the_spec_accepts_fit_the_gateways_group():
    """28 admin CIDRs (2 rules each), two API CIDRs and the nodes' two rules (the
    readiness completion, Ray's dashboards reading Prometheus) are the gateway group's
    60 inbound IPv4 rules: accepted, and within AWS's quota."""
    admins = [f"198.51.100.{i}/32" for i in range(28)]
    run = run_stack("dev", {"adminCidrs": admins, "apiAllowedCidrs": ["203.0.113.0/25", "203.0.113.128/25"]})
    assert run.error is None, run.error
    assert contract_of(run).errors == [], shown(contract_of(run).errors)


@pytest.mark.parametrize(
    "overrides",
    [
        {"adminCidrs": [f"198.51.100.{i}/32" for i in range(30)]},
        {"adminCidrs": [f"198.51.100.{i}/32" for i in range(29)]},
        {"apiAllowedCidrs": [f"203.0.113.{i}/32" for i in range(59)]},
        {"adminCidrs": [f"2001:db8::{i:x}/128" for i in range(30)]},
    ],
)
def test_cidr_lists_that_would_overflow_the_gateways_rule_quota_are_refused_before_any_resource(overrides):
    """EC2 refuses the 61st inbound rule of a group (per family), after the rest of the
    stack exists: the spec refuses such lists first, naming the keys and the quota."""
    run = run_stack("dev", overrides)
    assert run.error is not None and run.resources == []
    message = str(run.error)
    assert "60" in message and aws_contract.VPC_QUOTAS_SOURCE in message
    assert all(f"vllm-cluster:{key}" in message for key in overrides)


# --- Each rule, broken on purpose ----------------------------------------------------


@pytest.fixture(scope="module")
def dev():
    run = run_stack("dev")
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module")
def h100():
    run = run_stack("h100")
    assert run.error is None, run.error
    return run


def changed(resource, logical=None, **inputs):
    """A copy of a declared resource with some inputs set (None removes one), and
    another logical name when `logical` is given."""
    copied = copy.deepcopy(resource)
    if logical is not None:
        copied.name = logical
    for key, value in inputs.items():
        if value is None:
            copied.inputs.pop(key, None)
        else:
            copied.inputs[key] = value
    return copied


def caught(resources, rule, run=None):
    """The findings of `rule` among the errors and warnings of `resources`."""
    contract = aws_contract.check(resources, run.id_of if run is not None else None)
    return [f for f in contract.errors + contract.warnings if f.rule == rule]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# User data


def test_instance_user_data_text_over_16_kb_is_caught(dev):
    gateway = dev.named("vllm-gateway-host", INSTANCE)
    at_limit = changed(gateway, userDataBase64=None, userData="#" * 16384)
    over = changed(gateway, userDataBase64=None, userData="#" * 16385)
    assert caught([at_limit], "user-data-size") == []
    [finding] = caught([over], "user-data-size")
    assert (finding.resource, finding.input) == ("vllm-gateway-host", "userData")
    assert "16,385 bytes" in finding.value and "16,384" in finding.limit
    assert finding.source == aws_contract.USER_DATA_SOURCE


def test_multibyte_user_data_is_counted_in_bytes(dev):
    gateway = dev.named("vllm-gateway-host", INSTANCE)
    # 8,193 characters of two bytes each: 16,386 bytes.
    assert caught([changed(gateway, userDataBase64=None, userData="é" * 8193)], "user-data-size")


def test_instance_user_data_base64_counts_the_decoded_gzip_bytes(dev):
    head = dev.named("vllm-head", INSTANCE)
    random_bytes = os.urandom(17000)  # incompressible: its gzip is over 16 KB too
    over = changed(head, userDataBase64=b64(gzip.compress(random_bytes)))
    [finding] = caught([over], "user-data-size")
    assert finding.input == "userDataBase64" and "after base64 decoding" in finding.value
    # 21,000 characters of base64 that decode to 15,750 bytes: within the limit.
    assert caught([changed(head, userDataBase64=b64(b"x" * 15750))], "user-data-size") == []
    # The gzip of a long compressible script is what counts, not the script.
    assert caught([changed(head, userDataBase64=b64(gzip.compress(b"echo hi\n" * 10000)))], "user-data-size") == []


def test_launch_template_user_data_is_decoded_and_must_be_base64(dev):
    template = dev.of_type(TEMPLATE)[0]
    assert caught([changed(template, userData=b64(b"#" * 16384))], "user-data-size") == []
    [finding] = caught([changed(template, userData=b64(b"#" * 16385))], "user-data-size")
    assert finding.input == "userData" and finding.type == TEMPLATE
    [bad] = caught([changed(template, userData="#!/bin/bash\necho not base64\n")], "user-data-base64")
    assert bad.input == "userData"


def test_secret_user_data_is_measured_unwrapped(dev):
    gateway = dev.named("vllm-gateway-host", INSTANCE)
    secret = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": "#" * 16385}
    assert caught([changed(gateway, userDataBase64=None, userData=secret)], "user-data-size")


# Tags


def test_more_than_50_tags_are_caught(dev):
    vpc = dev.named("vllm-vpc")
    tags = dict(vpc.inputs["tags"])
    fifty = {**tags, **{f"extra-{i}": "x" for i in range(50 - len(tags))}}
    assert caught([changed(vpc, tags=fifty)], "tag-count") == []
    [finding] = caught([changed(vpc, tags={**fifty, "one-more": "x"})], "tag-count")
    assert finding.value == "51 tags" and finding.source == aws_contract.EC2_TAGS_SOURCE


def test_tag_keys_over_128_and_values_over_256_characters_are_caught(dev):
    vpc = dev.named("vllm-vpc")
    ok = changed(vpc, tags={"k" * 128: "v" * 256})
    assert caught([ok], "tag-key-length") == [] and caught([ok], "tag-value-length") == []
    assert caught([changed(vpc, tags={"k" * 129: "v"})], "tag-key-length")
    [finding] = caught([changed(vpc, tags={"Name": "v" * 257})], "tag-value-length")
    assert finding.input == "tags[Name]" and finding.value == "a value of 257 characters"


def test_the_aws_prefix_is_caught_in_any_case(dev):
    vpc = dev.named("vllm-vpc")
    assert caught([changed(vpc, tags={"AWS:Owner": "me"})], "tag-key-prefix")
    assert caught([changed(vpc, tags={"aws:owner": "me"})], "tag-key-prefix")
    assert caught([changed(vpc, tags={"owner-aws:": "me"})], "tag-key-prefix") == []


def test_tags_inside_a_launch_templates_tag_specifications_are_checked(dev):
    template = dev.of_type(TEMPLATE)[0]
    specs = copy.deepcopy(template.inputs["tagSpecifications"])
    specs[1]["tags"]["aws:cloudformation:stack-name"] = "x"
    [finding] = caught([changed(template, tagSpecifications=specs)], "tag-key-prefix")
    assert finding.input.startswith("tagSpecifications[1].tags")


def test_iam_tags_allow_only_iams_characters(dev):
    role = dev.named("vllm-node-role", ROLE)
    vpc = dev.named("vllm-vpc")
    [finding] = caught([changed(role, tags={"team": "gpu's"})], "tag-characters")
    assert finding.source == aws_contract.IAM_TAGS_SOURCE
    assert caught([changed(vpc, tags={"team": "gpu's"})], "tag-characters") == []  # EC2 takes any character


def test_an_inline_role_policy_over_iams_10240_characters_is_caught(dev):
    """The gateway's wake policy (dev sets idleStopMinutes) as the role receives it, and the
    same padded past IAM's quota; whitespace does not count."""
    policy = dev.named("vllm-gateway-role-wake", "aws:iam/rolePolicy:RolePolicy")
    assert caught([policy], "inline-policy-size") == []
    document = json.loads(policy.inputs["policy"])
    document["Statement"][1]["Sid"] = "x" * 10240
    [finding] = caught([changed(policy, policy=json.dumps(document, indent=8))], "inline-policy-size")
    assert finding.source == aws_contract.IAM_QUOTAS_SOURCE and "whitespace not counted" in finding.value
    assert caught([changed(policy, policy=policy.inputs["policy"] + " " * 20000)], "inline-policy-size") == []


def test_a_roles_inline_policies_are_counted_together_against_iams_quota(dev):
    """IAM's 10,240 characters are for all of a role's inline policies: the node role's
    Session Manager and model cache policies, each within it, are caught together."""
    node_policies = [p for p in dev.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.startswith("vllm-node-role-")]
    assert {p.name for p in node_policies} == {"vllm-node-role-session-manager", "vllm-node-role-model-cache"}
    assert caught(node_policies, "inline-policy-size") == []
    halves = []
    for policy in node_policies:
        document = json.loads(policy.inputs["policy"])
        document["Statement"][0]["Sid"] = "x" * 5200
        halves.append(changed(policy, policy=json.dumps(document)))
    assert all(aws_contract.inline_policy_size(h.inputs["policy"]) < 10240 for h in halves)
    [finding] = caught(halves, "inline-policy-size")
    assert finding.source == aws_contract.IAM_QUOTAS_SOURCE and "2 inline policies" in finding.value
    # Another role's policy of the same size is not counted with them.
    other = changed(halves[0], role="another-role")
    assert caught([other, halves[1]], "inline-policy-size") == []


# Security groups


def test_group_descriptions_over_255_characters_are_caught(dev):
    group = dev.named("vllm-gateway-sg", SECURITY_GROUP)
    assert caught([changed(group, description="d" * 255)], "description-length") == []
    [finding] = caught([changed(group, description="d" * 256)], "description-length")
    assert finding.source == aws_contract.GROUP_DESCRIPTION_SOURCE


def test_characters_outside_ec2s_set_are_caught_in_group_and_rule_descriptions(dev):
    group = dev.named("vllm-gateway-sg", SECURITY_GROUP)
    rule = dev.of_type(INGRESS)[0]
    allowed = "a-z A-Z 0-9 ._-:/()#,@[]+=&;{}!$*"
    assert (
        caught([changed(group, description=allowed), changed(rule, description=allowed)], "description-characters")
        == []
    )
    findings = caught(
        [changed(group, description="each gang's nodes"), changed(rule, description="vLLM → head")],
        "description-characters",
    )
    assert {(f.resource, f.source) for f in findings} == {
        ("vllm-gateway-sg", aws_contract.GROUP_DESCRIPTION_SOURCE),
        (rule.name, aws_contract.RULE_DESCRIPTION_SOURCE),
    }
    [on_group] = [f for f in findings if f.resource == "vllm-gateway-sg"]
    assert on_group.input == "description" and 'holds "\'"' in on_group.value


def test_rule_descriptions_over_255_characters_are_caught(dev):
    rule = dev.of_type(EGRESS)[0]
    assert caught([changed(rule, description="r" * 255)], "description-length") == []
    assert caught([changed(rule, description="r" * 256)], "description-length")


def _rules_for(run, group_name, type_, count, family="cidrIpv4"):
    """`count` copies of one of the group's real rules, each its own CIDR, as if other
    components (other gangs) had declared them."""
    group_id = run.id_of(run.named(group_name, SECURITY_GROUP))
    template = next(r for r in run.of_type(type_) if r.inputs["securityGroupId"] == group_id)
    rules = []
    for i in range(count):
        rule = changed(template, logical=f"{template.name}-copy-{family}-{i}", cidrIpv4=None, cidrIpv6=None)
        rule.inputs.pop("referencedSecurityGroupId", None)
        rule.inputs[family] = f"10.{i // 256}.{i % 256}.0/24" if family == "cidrIpv4" else f"2001:db8:{i:x}::/48"
        rules.append(rule)
    return rules


def test_more_than_60_inbound_rules_on_one_group_across_the_stack_are_caught(dev):
    group_id = dev.id_of(dev.named("vllm-gateway-sg", SECURITY_GROUP))
    own = [r for r in dev.of_type(INGRESS) if r.inputs["securityGroupId"] == group_id]
    # The gateway's own rules name a group (counted in both families) or an IPv4 CIDR.
    to_sixty = _rules_for(dev, "vllm-gateway-sg", INGRESS, 60 - len(own))
    assert caught(dev.resources + to_sixty, "rules-per-group", dev) == []
    over = _rules_for(dev, "vllm-gateway-sg", INGRESS, 61 - len(own))
    [finding] = caught(dev.resources + over, "rules-per-group", dev)
    assert finding.resource == "vllm-gateway-sg" and finding.input == "inbound IPv4 rules"
    assert finding.value == "61 rules across the stack" and finding.source == aws_contract.VPC_QUOTAS_SOURCE


def test_ipv4_and_ipv6_rules_are_counted_apart(dev):
    v4 = _rules_for(dev, "vllm-nodes-sg", EGRESS, 50)
    v6 = _rules_for(dev, "vllm-nodes-sg", EGRESS, 50, family="cidrIpv6")
    assert caught(dev.resources + v4 + v6, "rules-per-group", dev) == []
    more = _rules_for(dev, "vllm-nodes-sg", EGRESS, 60, family="cidrIpv6")
    [finding] = caught(dev.resources + more, "rules-per-group", dev)
    assert finding.input == "outbound IPv6 rules"


def test_more_than_5_groups_on_an_interface_are_caught(dev):
    template = dev.of_type(TEMPLATE)[0]
    interfaces = copy.deepcopy(template.inputs["networkInterfaces"])
    interfaces[0]["securityGroups"] = [f"sg-{i}" for i in range(5)]
    assert caught([changed(template, networkInterfaces=interfaces)], "groups-per-interface") == []
    interfaces[0]["securityGroups"].append("sg-5")
    [finding] = caught([changed(template, networkInterfaces=interfaces)], "groups-per-interface")
    assert finding.input == "networkInterfaces[0].securityGroups"


# Names after Pulumi's auto-naming


@pytest.mark.parametrize(
    "type_,name,limit",
    [
        (ROLE, "vllm-node-role", 64),
        (INSTANCE_PROFILE, "vllm-node-instance-profile", 128),
        (TEMPLATE, None, 128),
    ],
)
def test_auto_named_names_are_measured_with_pulumis_suffix(dev, type_, name, limit):
    resource = dev.named(name, type_) if name else dev.of_type(type_)[0]
    fits = changed(resource, logical="n" * (limit - 8))  # "-" and 7 hex digits make it the limit
    assert caught([fits], "name-length") == []
    [finding] = caught([changed(resource, logical="n" * (limit - 7))], "name-length")
    assert "auto-named" in finding.input and finding.value == f"{limit + 1} characters"
    assert aws_contract.AUTONAME_SOURCE in finding.source


def test_efs_creation_token_is_auto_named_within_64(dev):
    file_system = dev.named("vllm-model-cache", FILE_SYSTEM)
    assert caught([changed(file_system, logical="f" * 56)], "name-length") == []
    [finding] = caught([changed(file_system, logical="f" * 57)], "name-length")
    assert finding.input.startswith("creationToken")


def test_a_name_set_explicitly_is_checked_as_given(dev):
    role = dev.named("vllm-node-role", ROLE)
    template = dev.of_type(TEMPLATE)[0]
    assert caught([changed(role, logical="r" * 200, name="r" * 64)], "name-length") == []
    assert caught([changed(role, **{"name": "r" * 65})], "name-length")
    assert caught([changed(role, **{"name": "node role"})], "name-characters")
    assert caught([changed(template, **{"name": "ab"})], "name-length")
    assert caught([changed(template, **{"name": "vllm:template"})], "name-characters")
    assert caught([changed(template, **{"name": "vllm(1)/x_y.z-w"})], "name-characters") == []


# EBS gp3


def _with_root(template, **ebs):
    mappings = copy.deepcopy(template.inputs["blockDeviceMappings"])
    mappings[0]["ebs"].update(ebs)
    return changed(template, blockDeviceMappings=mappings)


def test_gp3_size_iops_and_throughput_bounds_are_caught(dev):
    template = dev.of_type(TEMPLATE)[0]
    assert caught([_with_root(template, volumeSize=65536, iops=80000, throughput=2000)], "gp3-volumeSize") == []
    assert caught([_with_root(template, volumeSize=65537)], "gp3-volumeSize")
    assert caught([_with_root(template, volumeSize=0)], "gp3-volumeSize")
    assert caught([_with_root(template, volumeSize=200, iops=80001)], "gp3-iops")
    assert caught([_with_root(template, iops=2999)], "gp3-iops")
    assert caught([_with_root(template, iops=8000, throughput=2001)], "gp3-throughput")
    assert caught([_with_root(template, throughput=124)], "gp3-throughput")


def test_gp3_ratios_are_caught(dev):
    template = dev.of_type(TEMPLATE)[0]
    assert caught([_with_root(template, volumeSize=32, iops=16000)], "gp3-iops-per-gib") == []
    [finding] = caught([_with_root(template, volumeSize=31, iops=16000)], "gp3-iops-per-gib")
    assert finding.input == "blockDeviceMappings[0].ebs.iops" and finding.source == aws_contract.GP3_RATIO_SOURCE
    assert caught([_with_root(template, iops=8000, throughput=2000)], "gp3-throughput-per-iops") == []
    # No IOPS given: the baseline 3,000 allows 750 MiB/s.
    assert caught([_with_root(template, throughput=750)], "gp3-throughput-per-iops") == []
    assert caught([_with_root(template, throughput=751)], "gp3-throughput-per-iops")
    # A small volume keeps its free baseline of 3,000 IOPS.
    assert caught([_with_root(template, volumeSize=1)], "gp3-iops-per-gib") == []


def test_an_instances_root_block_device_is_checked(dev):
    gateway = dev.named("vllm-gateway-host", INSTANCE)
    root = dict(gateway.inputs["rootBlockDevice"], volumeSize=70000)
    [finding] = caught([changed(gateway, rootBlockDevice=root)], "gp3-volumeSize")
    assert finding.input == "rootBlockDevice.volumeSize"


# Network interfaces


def test_a_network_card_the_type_does_not_have_is_caught(h100):
    template = h100.of_type(TEMPLATE)[0]
    interfaces = copy.deepcopy(template.inputs["networkInterfaces"])
    assert caught([template], "network-card-index") == [] and caught([template], "efa-count") == []
    extra = dict(interfaces[-1], networkCardIndex=32)
    found = caught([changed(template, networkInterfaces=interfaces + [extra])], "network-card-index")
    assert found and "p5.48xlarge has 32 network card(s)" in found[0].limit
    assert caught([changed(template, networkInterfaces=interfaces + [extra])], "efa-count")


def test_two_efa_interfaces_on_one_card_and_a_reused_slot_are_caught(h100):
    template = h100.of_type(TEMPLATE)[0]
    interfaces = copy.deepcopy(template.inputs["networkInterfaces"])
    second = dict(interfaces[-1], deviceIndex=1)  # card 31, device 1: a second EFA on card 31
    assert caught([changed(template, networkInterfaces=interfaces + [second])], "efa-per-card")
    assert caught([changed(template, networkInterfaces=interfaces + [dict(interfaces[-1])])], "interface-slot")


def test_efa_on_a_type_without_efa_is_caught(dev):
    template = dev.of_type(TEMPLATE)[0]
    assert template.inputs["instanceType"] == "g6.xlarge"
    interfaces = copy.deepcopy(template.inputs["networkInterfaces"])
    efa = dict(interfaces[0], deviceIndex=1, interfaceType="efa-only")
    [finding] = caught([changed(template, networkInterfaces=interfaces + [efa])], "efa-count")
    assert "at most 0" in finding.limit


# Elastic IPs


def test_more_than_5_elastic_ips_is_a_warning_naming_the_quota(dev):
    eips = dev.of_type(EIP)
    assert len(eips) == 2
    five = eips + [changed(eips[0], logical=f"extra-ip-{i}") for i in range(3)]
    assert caught(five, "eips-per-region") == []
    six = five + [changed(eips[0], logical="extra-ip-3")]
    contract = aws_contract.check(six)
    assert contract.ok and contract.errors == []
    [warning] = contract.warnings
    assert warning.rule == "eips-per-region" and "6 Elastic IPs" in warning.value
    assert "default quota is 5 per region" in warning.limit and warning.source == aws_contract.EIP_SOURCE


def test_security_group_names_are_checked_given_or_auto_named(dev):
    group = dev.named("vllm-gateway-sg", SECURITY_GROUP)
    assert caught([changed(group, logical="g" * 247)], "name-length") == []  # + "-" and 7 hex: 255
    [finding] = caught([changed(group, logical="g" * 248)], "name-length")
    assert finding.input == "name (auto-named)" and finding.value == "256 characters"
    assert caught([changed(group, name="sg-gateway")], "name-prefix")


def test_inline_and_classic_rules_count_against_their_group(dev):
    group = dev.named("vllm-gateway-sg", SECURITY_GROUP)
    sixty = [{"protocol": "tcp", "fromPort": 443, "toPort": 443, "cidrBlocks": [f"10.0.{i}.0/24" for i in range(60)]}]
    assert caught([changed(group, ingress=sixty)], "rules-per-group") == []
    classic = changed(
        dev.of_type(INGRESS)[0],
        logical="classic-rule",
        type="ingress",
        securityGroupId=group.name,  # without ids, a group is known by its name
        cidrBlocks=["10.1.0.0/24"],
    )
    classic.type = aws_contract.CLASSIC_RULE
    [finding] = caught([changed(group, ingress=sixty), classic], "rules-per-group")
    assert finding.resource == "vllm-gateway-sg" and finding.value == "61 rules across the stack"


def test_more_than_5_groups_on_an_instance_are_caught(dev):
    gateway = dev.named("vllm-gateway-host", INSTANCE)
    assert caught([changed(gateway, vpcSecurityGroupIds=[f"sg-{i}" for i in range(5)])], "groups-per-interface") == []
    [finding] = caught([changed(gateway, vpcSecurityGroupIds=[f"sg-{i}" for i in range(6)])], "groups-per-interface")
    assert finding.input == "vpcSecurityGroupIds"
