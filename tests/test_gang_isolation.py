"""Gangs do not trust each other on the network: each gang's EFA/Ray/NCCL traffic is
admitted by a security group of its own, so a node of one gang cannot reach another
gang's vLLM port (past the gateway's route allowlist), its NCCL or its Ray ports.
Checked on the interfaces each launch template really declares and on the rules each
group really has, under the mock runtime."""

import pytest
from pulumi_mocks import run_stack

SG = "aws:ec2/securityGroup:SecurityGroup"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
GANGS = 3


@pytest.fixture(scope="module")
def three_gangs():
    run = run_stack("prod", {"replicas": GANGS})
    assert run.error is None, run.error
    return run


def group_ids(run) -> dict[str, str]:
    """Security group id -> its resource name."""
    return {run.id_of(group): group.name for group in run.of_type(SG)}


def template_groups(run, template) -> set[str]:
    """The groups on every interface of a launch template, by resource name."""
    names = group_ids(run)
    return {names[g] for interface in template.inputs["networkInterfaces"] for g in interface["securityGroups"]}


def admitted_peers(run, group_name: str) -> set[str]:
    """The groups a group admits traffic from (ingress rules that name a group)."""
    names = group_ids(run)
    target = next(gid for gid, name in names.items() if name == group_name)
    return {
        names[rule.inputs["referencedSecurityGroupId"]]
        for rule in run.of_type(INGRESS)
        if rule.inputs["securityGroupId"] == target and rule.inputs.get("referencedSecurityGroupId")
    }


def test_each_gangs_interfaces_carry_a_cluster_group_no_other_gang_has(three_gangs):
    templates = sorted(three_gangs.of_type(TEMPLATE), key=lambda t: t.name)
    assert len(templates) == GANGS
    per_template = {t.name: template_groups(three_gangs, t) for t in templates}
    shared = set.intersection(*per_template.values())
    # The nodes group (gateway -> node) is on every primary interface; nothing else is shared.
    assert shared == {"vllm-nodes-sg"}, per_template
    for name, groups in per_template.items():
        assert len(groups - shared) == 1, f"{name}: {groups}"


def test_a_gangs_cluster_group_admits_only_itself_and_is_admitted_by_the_model_cache(three_gangs):
    templates = sorted(three_gangs.of_type(TEMPLATE), key=lambda t: t.name)
    for template in templates:
        (cluster,) = template_groups(three_gangs, template) - {"vllm-nodes-sg"}
        assert admitted_peers(three_gangs, cluster) == {cluster}
        assert cluster in admitted_peers(three_gangs, "vllm-efs-sg")


def test_no_node_group_admits_another_gangs_nodes(three_gangs):
    """The nodes group, shared by every primary interface, admits the gateway only."""
    assert admitted_peers(three_gangs, "vllm-nodes-sg") == {"vllm-gateway-sg"}
