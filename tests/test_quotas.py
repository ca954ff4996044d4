"""EC2's On-Demand vCPU quotas (issue 34, point 2): which quota each instance counts
against, what the stack needs of it, and a `pulumi up` that reads the account's quotas
first: a stack they cannot hold is refused before any resource is declared; one whose
node replacement they cannot hold is warned."""

import pytest
from pulumi_mocks import ec2_stack_names, run_stack, stack_config

from components import quotas

PROD_P_VCPUS = 2 * 96  # stacks/Pulumi.prod.yaml: 2 x p4d.24xlarge, 96 vCPUs each (catalog)


@pytest.mark.parametrize(
    ("instance_type", "quota"),
    [
        ("p4d.24xlarge", quotas.P),
        ("p5en.48xlarge", quotas.P),
        ("g5.12xlarge", quotas.G_AND_VT),
        ("g6e.48xlarge", quotas.G_AND_VT),
        ("vt1.3xlarge", quotas.G_AND_VT),
        ("t3.small", quotas.STANDARD),
        ("m7i.large", quotas.STANDARD),
        ("inf2.xlarge", None),
        ("trn1.32xlarge", None),
    ],
)
def test_each_family_counts_against_its_quota(instance_type, quota):
    assert quotas.quota_of(instance_type) == quota


def test_the_gpu_nodes_count_twice_while_they_are_replaced_and_the_gateway_once():
    needs, uncounted = quotas.needs("p4d.24xlarge", 2, "t3.small")
    assert uncounted == []
    by_code = {need.quota.code: need for need in needs}
    assert (by_code["L-417A185B"].vcpus, by_code["L-417A185B"].replacing_vcpus) == (192, 384)
    assert (by_code["L-1216C47A"].vcpus, by_code["L-1216C47A"].replacing_vcpus) == (2, 2)


def test_a_type_of_no_known_quota_is_said_not_guessed():
    needs, uncounted = quotas.needs("p4d.24xlarge", 1, "c8x.unknown")
    assert [need.quota for need in needs] == [quotas.P]
    assert uncounted == ["the gateway's c8x.unknown: no known On-Demand quota or vCPU count"]


def test_a_stack_over_its_quota_is_refused_before_any_resource_naming_the_quota_the_numbers_and_the_fix():
    """A new account's P quota is often small: EC2 would refuse the instances with
    VcpuLimitExceeded once the network, the cache and the gateway were created."""
    run = run_stack("prod", quotas={"L-417A185B": 96})
    assert run.error is not None
    message = str(run.error)
    assert "Running On-Demand P instances" in message and "L-417A185B" in message
    assert f"needs {PROD_P_VCPUS} vCPUs" in message and "quota there is 96" in message
    assert (
        "aws service-quotas request-service-quota-increase --region us-east-1 --service-code ec2 "
        f"--quota-code L-417A185B --desired-value {2 * PROD_P_VCPUS}" in message
    )
    assert run.resources == []


def test_a_stack_whose_node_replacement_would_pass_its_quota_is_warned():
    run = run_stack("prod", quotas={"L-417A185B": PROD_P_VCPUS})
    assert run.error is None, run.error
    warned = [w for w in run.warnings if "L-417A185B" in w]
    assert len(warned) == 1 and f"{2 * PROD_P_VCPUS} while its GPU nodes are replaced" in warned[0], run.warnings


def test_a_quota_within_room_for_a_replacement_says_nothing():
    run = run_stack("prod", quotas={"L-417A185B": 2 * PROD_P_VCPUS})
    assert run.error is None, run.error
    assert not [w for w in run.warnings if "vCPU" in w], run.warnings


def test_a_quota_that_cannot_be_read_is_said_and_the_stack_goes_on():
    run = run_stack("prod", quotas={"L-417A185B": RuntimeError("AccessDeniedException: not authorized")})
    assert run.error is None, run.error
    warned = [w for w in run.warnings if "could not read 'Running On-Demand P instances'" in w]
    assert len(warned) == 1 and "servicequotas:GetServiceQuota" in warned[0], run.warnings


@pytest.mark.parametrize("stack", ec2_stack_names())
def test_every_stack_file_reads_the_quotas_of_what_it_runs_on_ec2(stack):
    run = run_stack(stack)
    assert run.error is None, run.error
    asked = {args["quotaCode"] for token, args in run.invokes if token.startswith("aws:servicequotas/")}
    gpu = quotas.quota_of(stack_config(stack)["vllm-cluster:instanceType"])
    vcpu_codes = {quotas.P.code, quotas.G_AND_VT.code, quotas.STANDARD.code}
    assert asked & vcpu_codes == {gpu.code, quotas.STANDARD.code}


def test_the_plan_shows_the_vcpus_each_quota_must_hold_running_and_during_a_replacement():
    from cli.plan import build_plan, render

    plan = build_plan("prod")
    needs = {need["quotaCode"]: need for need in plan["vcpuQuotas"]["needs"]}
    assert (needs["L-417A185B"]["vcpus"], needs["L-417A185B"]["replacingVcpus"]) == (192, 384)
    assert (
        "  Running On-Demand P instances (L-417A185B): 192 vCPUs, 384 while the GPU nodes are replaced: "
        "2 x p4d.24xlarge (96 vCPUs each)" in render(plan).splitlines()
    )


def test_a_stack_of_your_own_hosts_reads_no_quota():
    run = run_stack("own-hosts")
    assert run.error is None, run.error
    assert not [token for token, _ in run.invokes if token.startswith("aws:servicequotas/")]


# --- what the stack adds to the account's Elastic IPs, VPCs and NAT gateways -----------------


def test_an_account_whose_elastic_ips_and_vpcs_the_stack_would_overrun_is_warned_naming_each_quota():
    """The stack adds two Elastic IPs (the gateway's, the NAT's), a VPC and a NAT gateway:
    with 4 of the default 5 held, EC2 refuses the second address at `pulumi up`."""
    run = run_stack("prod", account={"eips": 4, "vpcs": 5, "natGateways": 1})
    assert run.error is None, run.error
    eips = [w for w in run.warnings if "'EC2-VPC Elastic IPs' (L-0263D0A3) in us-east-1" in w]
    assert len(eips) == 1 and "holds 4 outside this stack and the stack adds 2, past the quota of 5" in eips[0]
    assert "--service-code ec2 --quota-code L-0263D0A3 --desired-value 6" in eips[0]
    vpcs = [w for w in run.warnings if "'VPCs per Region' (L-F678F1CE)" in w]
    assert len(vpcs) == 1 and "holds 5 outside this stack and the stack adds 1" in vpcs[0]
    assert not [w for w in run.warnings if "L-FE5A380F" in w], run.warnings


def test_the_stacks_own_addresses_are_not_counted_twice_on_a_later_pulumi_up():
    run = run_stack("prod", account={"eips": 3, "ownEips": 2, "vpcs": 4, "ownVpcs": 1})
    assert run.error is None, run.error
    assert not [w for w in run.warnings if "L-0263D0A3" in w or "L-F678F1CE" in w], run.warnings


def test_the_quota_the_account_was_given_is_the_one_judged():
    run = run_stack("prod", account={"eips": 4}, quotas={"L-0263D0A3": 10})
    assert not [w for w in run.warnings if "L-0263D0A3" in w], run.warnings


def test_nat_gateways_are_counted_in_the_stacks_zone():
    run = run_stack("prod", account={"natGateways": 5})
    warned = [w for w in run.warnings if "'NAT gateways per Availability Zone' (L-FE5A380F) in us-east-1" in w]
    assert len(warned) == 1 and "holds 5 outside this stack and the stack adds 1" in warned[0], run.warnings
    subnets = [args for token, args in run.invokes if token == "aws:ec2/getSubnets:getSubnets"]
    assert subnets and subnets[0]["filters"][0]["name"] == "availability-zone"
