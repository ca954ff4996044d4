"""Idle stop and wake (issue 23), the program's side: what idleStopMinutes declares (the
nodes' shutdown behaviour, the gateway's role, the idle-stop and waker commands), what
it leaves alone without it, what a change of it re-runs, and the pure pieces behind it
(components/idle_stop.py): the policy, the waker's JSON, the wake time, the idle hour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fleet_ec2 import fed_waker_config
from pulumi_mocks import run_stack, unsecret

from components import config_keys, idle_stop, metrics, ports, scale_out, sizing
from components.catalog import CATALOG
from tests.doubles.ec2_api import policy_allows

COMMAND = "command:remote:Command"
INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
GATEWAY_RESOURCES = {"vllm-gateway-role", "vllm-gateway-role-wake", "vllm-gateway-instance-profile"}
NODE = "sudo /opt/vllm-cluster/bin/vllm-cluster-node"
GATEWAY = "sudo /opt/vllm-cluster/bin/vllm-cluster-gateway"


@pytest.fixture(scope="module")
def idle():
    run = run_stack("prod", {"idleStopMinutes": 30})
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module")
def never():
    run = run_stack("prod", {"idleStopMinutes": None})
    assert run.error is None, run.error
    return run


def gpu_nodes(run):
    return [r for r in run.of_type(INSTANCE) if r.parent_type == "vllm-cluster:index:GpuNodes"]


def commands(run):
    return {c.name: c for c in run.of_type(COMMAND)}


def by_urn(run):
    return {r.urn: r for r in run.resources}


def test_an_idle_time_shorter_than_a_wake_is_warned_at_deploy_saying_what_it_costs():
    """idleStopMinutes 1 on prod (2 x p4d.24xlarge, a 70B model) is accepted, but a wake
    takes longer than that: `pulumi up` warns, naming the key, the wake and its price."""
    # stageVolume auto chose the gp3 stage volume for prod with idle stop (tests/test_stage_volume.py).
    wake = idle_stop.expected_wake_seconds("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2, 2, True)
    assert wake > 60
    short = run_stack("prod", {"idleStopMinutes": 1})
    assert short.error is None, short.error
    warned = [w for w in short.warnings if "idleStopMinutes is 1 min" in w]
    assert len(warned) == 1, short.warnings
    billed = 2 * CATALOG["p4d.24xlarge"].price_per_hour_usd * wake / 3600
    for words in (f"about {wake / 60:.1f} min", "a stop and a wake", "503", f"${billed:.2f} a wake"):
        assert words in warned[0], warned[0]
    # At the wake's length or more: no warning.
    enough = run_stack("prod", {"idleStopMinutes": -(-wake // 60)})
    assert enough.error is None and not [w for w in enough.warnings if "idleStopMinutes" in w], enough.warnings


# --- what the key declares, and what it leaves alone without it ---------------------------------


def test_without_the_key_no_role_no_waker_and_every_node_is_told_never(never):
    """The nodes' idle-stop commands are there with 0: a command that vanished when the key
    was unset would leave a node's timer on."""
    names = {r.name for r in never.resources}
    assert not names & GATEWAY_RESOURCES
    assert not [n for n in names if "waker" in n]
    assert [c.inputs["create"] for c in never.of_type(COMMAND) if "idle-stop" in c.name] == [
        f"{NODE} idle-stop-config --minutes 0"
    ] * 2
    assert "iamInstanceProfile" not in never.named("vllm-gateway-host").inputs
    assert "instanceInitiatedShutdownBehavior" not in never.of_type(TEMPLATE)[0].inputs
    assert not [n for n in gpu_nodes(never) if "instanceInitiatedShutdownBehavior" in n.inputs]
    assert "vllm_waker" not in never.named("vllm-gateway-proxy", COMMAND).inputs["stdin"]


def test_with_the_key_a_node_that_powers_off_is_stopped_not_terminated(idle):
    """On the instance, which the provider changes in place: in the launch template it would
    be a new version, which replaces the instances."""
    assert [n.inputs["instanceInitiatedShutdownBehavior"] for n in gpu_nodes(idle)] == ["stop", "stop"]
    assert "instanceInitiatedShutdownBehavior" not in idle.of_type(TEMPLATE)[0].inputs


def test_only_the_nodes_the_role_and_the_gateways_commands_differ_from_a_stack_without_it(idle, never):
    """The gateway keeps its instance (an instance profile is associated in place), the
    nodes theirs (their shutdown behaviour changes in place, and the gp3 stage volume
    stageVolume auto now chooses is under their ignoreChanges: tests/test_stage_volume.py);
    nothing else of the graph changes."""
    before = {(r.type, r.name): r.inputs for r in never.resources}
    after = {(r.type, r.name): r.inputs for r in idle.resources}
    added = {name for _, name in set(after) - set(before)}
    assert set(before) <= set(after)
    assert added == GATEWAY_RESOURCES | {"vllm-gateway-waker"}
    changed = {name for key, name in before if before[(key, name)] != after[(key, name)]}
    # The nodes (in place), the gateway (its profile, in place), the idle time, and nginx's
    # site, which hands the waker what no gang could take.
    assert changed == {
        "vllm-head",
        "vllm-worker-1",
        "vllm-gateway-host",
        "vllm-idle-stop-head",
        "vllm-idle-stop-worker-1",
        "vllm-gateway-proxy",
        "vllm-gateway-metrics",
    }
    assert "error_page 502 504 = @vllm_waker;" in idle.named("vllm-gateway-proxy", COMMAND).inputs["stdin"]
    gateway = {k: v for k, v in after[(INSTANCE, "vllm-gateway-host")].items() if k != "iamInstanceProfile"}
    assert gateway == before[(INSTANCE, "vllm-gateway-host")]


def test_every_gpu_node_carries_the_tags_the_gateway_may_start_it_by(idle):
    for node in gpu_nodes(idle):
        assert node.inputs["tags"][idle_stop.STACK_TAG] == "prod"
        assert node.inputs["tags"][idle_stop.PROJECT_TAG] == "vllm-cluster"


# --- the gateway's role -------------------------------------------------------------------------


def wake_policy(run) -> tuple[str, dict]:
    policy = run.named("vllm-gateway-role-wake", ROLE_POLICY)
    text = unsecret(policy.inputs["policy"])
    return text, json.loads(text)


def allows(policy: dict, action: str, resource: str, tags: dict[str, str], region: str = "us-east-1") -> bool:
    """IAM's reading of the declared document, as the EC2 double evaluates it per request
    (tests/doubles/ec2_api.py policy_allows): the resource's tags as aws:ResourceTag/KEY and
    the request's region as aws:RequestedRegion; a key the request lacks fails its condition."""
    context = {f"aws:ResourceTag/{key}": value for key, value in tags.items()}
    return policy_allows(policy, action, resource, {**context, "aws:RequestedRegion": region})


def stack_id_of(run) -> str:
    (node, *_) = gpu_nodes(run)
    return node.inputs["tags"][idle_stop.STACK_ID_TAG]


@pytest.mark.parametrize("action", ["ec2:StartInstances", "ec2:StopInstances"])
def test_the_gateway_may_start_and_stop_only_instances_of_its_own_stack_in_its_own_region(idle, action):
    """Issue 33 point 5: the stack's and project's tags are readable and repeatable (another
    user's stack named prod carries the same): the role also needs the stack's random id,
    and a request to this region. Issue 34: it may stop them too (a wake that never served
    is given up and what it started stopped), under the same conditions."""
    _, policy = wake_policy(idle)
    arn = "arn:aws:ec2:us-east-1:123456789012:instance/i-0123456789abcdef0"
    own = {
        idle_stop.STACK_TAG: "prod",
        idle_stop.PROJECT_TAG: "vllm-cluster",
        idle_stop.STACK_ID_TAG: stack_id_of(idle),
    }
    assert allows(policy, action, arn, own)
    assert not allows(policy, action, arn, {**own, idle_stop.STACK_TAG: "dev"})
    assert not allows(policy, action, arn, {idle_stop.STACK_TAG: "prod"})
    same_names = {idle_stop.STACK_TAG: "prod", idle_stop.PROJECT_TAG: "vllm-cluster"}
    assert not allows(policy, action, arn, same_names), "another stack named prod"
    assert not allows(policy, action, arn, {**own, idle_stop.STACK_ID_TAG: "0" * 32})
    assert not allows(policy, action, arn, own, region="eu-west-1")
    assert not allows(policy, action, arn.replace("123456789012", "210987654321"), own)
    assert not allows(policy, "ec2:TerminateInstances", arn, own)
    assert not allows(policy, "ec2:RunInstances", arn, own)
    # DescribeInstances has no resource-level permission: "*", and it only reads, here.
    assert allows(policy, "ec2:DescribeInstances", "*", {})
    assert not allows(policy, "ec2:DescribeInstances", "*", {}, region="eu-west-1")
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert actions == {"ec2:StartInstances", "ec2:StopInstances", "ec2:DescribeInstances"}


def test_with_a_customer_managed_default_ebs_key_the_waker_may_use_it_through_ec2_only():
    """Issue 34, point 2: the stack's volumes are encrypted under the account's default EBS
    key. When that is a customer managed key, StartInstances by a caller without the key's
    permissions is accepted and the instance falls back to stopped (Client.InternalError):
    the waker's role gets what starting needs on that key, through EC2 in the region only."""
    run = run_stack("prod", {"idleStopMinutes": 30}, ebs_key_manager="CUSTOMER")
    assert run.error is None, run.error
    _, policy = wake_policy(run)
    key = "arn:aws:kms:us-east-1:123456789012:key/mock-customer-key"
    via_ec2 = {"kms:ViaService": "ec2.us-east-1.amazonaws.com"}
    for action in idle_stop.EBS_KEY_ACTIONS:
        action = action.replace("*", "Encrypt")
        assert policy_allows(policy, action, key, via_ec2), action
        assert not policy_allows(policy, action, key, {"kms:ViaService": "s3.us-east-1.amazonaws.com"}), action
    assert not policy_allows(policy, "kms:Decrypt", key.replace("mock-customer-key", "another-key"), via_ec2)
    assert not policy_allows(policy, "kms:ScheduleKeyDeletion", key, via_ec2)


def test_with_the_aws_managed_ebs_key_the_waker_gets_no_kms_permission(idle):
    _, policy = wake_policy(idle)
    assert not [s for s in policy["Statement"] if any(a.startswith("kms:") for a in s["Action"])]


def test_the_stack_id_is_128_random_bits_of_the_stacks_own(idle):
    assert idle.named("vllm-stack-id", "random:index/randomId:RandomId").inputs["byteLength"] == 16
    assert len(stack_id_of(idle)) == 32
    assert {node.inputs["tags"][idle_stop.STACK_ID_TAG] for node in gpu_nodes(idle)} == {stack_id_of(idle)}


def test_the_gpu_nodes_tags_satisfy_the_policy_the_gateway_holds(idle):
    _, policy = wake_policy(idle)
    for node in gpu_nodes(idle):
        arn = f"arn:aws:ec2:us-east-1:123456789012:instance/{idle.id_of(node)}"
        assert allows(policy, "ec2:StartInstances", arn, node.inputs["tags"]), node.name


def test_the_policy_the_role_receives_is_within_iams_limits(idle):
    text, _ = wake_policy(idle)
    assert idle_stop.policy_size_problems(text) == []
    assert len("".join(text.split())) <= idle_stop.INLINE_ROLE_POLICY_MAX_CHARS
    # The longest stack and project names Pulumi takes still fit.
    long = idle_stop.policy_text(
        idle_stop.gateway_wake_policy("aws-us-gov", "us-gov-west-1", "1" * 12, "p" * 100, "s" * 100, "f" * 32)
    )
    assert idle_stop.policy_size_problems(long) == []
    assert idle_stop.policy_size_problems("x" * 10241) != []


def test_the_role_is_the_gateways_and_only_ec2_may_assume_it(idle):
    role = idle.named("vllm-gateway-role", "aws:iam/role:Role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    profile = idle.named("vllm-gateway-instance-profile")
    assert profile.inputs["role"] == role.name
    assert idle.named("vllm-gateway-host").inputs["iamInstanceProfile"] == profile.name
    assert idle.named("vllm-gateway-host").parent_type == role.parent_type == "vllm-cluster:index:Gateway"


# --- the commands -------------------------------------------------------------------------------


def test_each_node_turns_idle_stop_on_after_its_setup_and_destroy_never_needs_it(idle):
    """No delete: `pulumi destroy` of a stack whose nodes are stopped must not wait for them."""
    named = commands(idle)
    urns = by_urn(idle)
    for node in ("head", "worker-1"):
        command = named[f"vllm-idle-stop-{node}"]
        # And a boot whose gang never serves ends past the waker's bound (issue 34).
        # stageVolume auto chose the gp3 stage volume for prod with idle stop (tests/test_stage_volume.py).
        wake = idle_stop.expected_wake_seconds("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2, 2, True)
        grace = idle_stop.never_served_grace_seconds(wake)
        assert grace > idle_stop.wake_give_up_seconds(wake)
        assert command.inputs["create"] == f"{NODE} idle-stop-config --minutes 30 --grace-seconds {grace}"
        assert not command.inputs.get("delete")
        waits_for = {urns[d].name for d in command.dependencies if d in urns}
        assert f"vllm-setup-{node}" in waits_for
        assert (
            unsecret(command.inputs["connection"])["host"]
            == unsecret(named[f"vllm-setup-{node}"].inputs["connection"])["host"]
        )


def test_the_gateway_waker_is_told_every_gangs_instances_head_first(idle):
    named = commands(idle)
    waker = named["vllm-gateway-waker"]
    assert waker.inputs["create"] == "sudo bash -s"
    assert waker.inputs["delete"] == f"{GATEWAY} waker-config --off"
    # The waker itself travels with its configuration (the gateway's user data has no room).
    assert "install -D -m 0755 /dev/stdin /opt/vllm-cluster/bin/vllm-cluster-waker" in unsecret(waker.inputs["stdin"])
    waits_for = {by_urn(idle)[d].name for d in waker.dependencies if d in by_urn(idle)}
    assert {"vllm-gateway-setup", "vllm-head", "vllm-worker-1"} <= waits_for
    config = fed_waker_config(unsecret(waker.inputs["stdin"]))
    head, worker = idle.named("vllm-head", INSTANCE), idle.named("vllm-worker-1", INSTANCE)
    # stageVolume auto chose the gp3 stage volume for prod with idle stop (tests/test_stage_volume.py).
    wake = idle_stop.expected_wake_seconds("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2, 2, True)
    assert config == {
        "region": "us-east-1",
        "endpoint": "https://ec2.us-east-1.amazonaws.com",
        "stack": "prod",
        "project": "vllm-cluster",
        "gangs": {"gang0": [idle.id_of(head), idle.id_of(worker)]},
        "idle_stop_minutes": 30,
        "retry_after_seconds": idle_stop.RETRY_AFTER_SECONDS,
        "expected_wake_seconds": wake,
        # Three expected wakes (590 s), past the 15-minute floor.
        "give_up_seconds": 3 * wake,
    }
    assert config["give_up_seconds"] > idle_stop.GIVE_UP_MIN_SECONDS


def test_a_give_up_bound_set_by_the_user_reaches_the_waker_and_each_nodes_guard():
    """wakeGiveUpMinutes replaces the derived bound in what the waker is told, and the nodes'
    never-served guard stays its margin past it."""
    run = run_stack("prod", {"idleStopMinutes": 30, "wakeGiveUpMinutes": 45})
    assert run.error is None, run.error
    config = fed_waker_config(unsecret(commands(run)["vllm-gateway-waker"].inputs["stdin"]))
    assert config["give_up_seconds"] == 45 * 60
    grace = 45 * 60 + idle_stop.NODE_GUARD_MARGIN_SECONDS
    idle_commands = [c.inputs["create"] for c in run.of_type(COMMAND) if "idle-stop" in c.name]
    assert idle_commands and all(f"--grace-seconds {grace}" in c for c in idle_commands), idle_commands


def test_with_replicas_each_gang_has_its_instances_in_gang_order():
    run = run_stack("prod", {"idleStopMinutes": 30, "replicas": 2})
    assert run.error is None, run.error
    config = fed_waker_config(unsecret(commands(run)["vllm-gateway-waker"].inputs["stdin"]))
    ids = {r.name: run.id_of(r) for r in gpu_nodes(run)}
    assert list(config["gangs"]) == ["gang0", "gang1"]
    assert config["gangs"]["gang0"] == [ids["vllm-head"], ids["vllm-worker-1"]]
    assert config["gangs"]["gang1"] == [ids["vllm-gang1-head"], ids["vllm-gang1-worker-1"]]
    assert {"vllm-idle-stop-gang1-head", "vllm-idle-stop-gang1-worker-1"} <= set(commands(run))


def test_a_new_idle_time_re_runs_the_idle_commands_only_never_ray_or_vllm(idle):
    """Changing idleStopMinutes re-runs what reads it: each node's idle-stop and the waker."""
    after = run_stack("prod", {"idleStopMinutes": 60})
    assert after.error is None, after.error
    before_inputs = {(r.type, r.name): r.inputs for r in idle.resources}
    after_inputs = {(r.type, r.name): r.inputs for r in after.resources}
    assert set(before_inputs) == set(after_inputs)
    changed = {name for key, name in before_inputs if before_inputs[(key, name)] != after_inputs[(key, name)]}
    assert changed == {"vllm-idle-stop-head", "vllm-idle-stop-worker-1", "vllm-gateway-waker"}


def test_a_stack_of_your_own_hosts_refuses_the_key_and_declares_nothing():
    run = run_stack("own-hosts", {"idleStopMinutes": 30})
    assert run.error is not None and run.resources == []
    assert "vllm-cluster:idleStopMinutes" in str(run.error) and "vllm-cluster:hosts" in str(run.error)


# --- the pure pieces ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "region, suffix, endpoint",
    [
        ("us-east-1", "amazonaws.com", "https://ec2.us-east-1.amazonaws.com"),
        ("cn-north-1", "amazonaws.com.cn", "https://ec2.cn-north-1.amazonaws.com.cn"),
    ],
)
def test_the_ec2_endpoint_is_the_regions_in_its_partition(region, suffix, endpoint):
    assert idle_stop.ec2_endpoint(region, suffix) == endpoint


def test_a_wake_is_boot_ray_the_stage_copy_the_load_and_the_engine_but_no_install_or_download():
    terms = idle_stop.wake_terms("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2, 2)
    assert [t.name for t in terms] == ["instance start", "ray start", "stage copy", "model load", "engine start"]
    cold = sizing.time_to_first_token(
        sizing.served_model_size("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2),
        CATALOG["p4d.24xlarge"],
        2,
        2,
    )
    by_name = {t.name: t.seconds for t in cold}
    wake = {t.name: t.seconds for t in terms}
    # The same figures as the cold start's where the step is the same; a cold start's copy
    # runs beside the download (its download+stage term), a wake's alone.
    loads = sizing.node_loads(
        sizing.served_model_size("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2),
        CATALOG["p4d.24xlarge"],
        2,
        2,
    )
    assert wake["instance start"] == by_name["instance boot"]
    assert wake["stage copy"] == max(load.copy_seconds for load in loads) <= by_name["download+stage"]
    assert wake["engine start"] == by_name["engine start"]
    assert idle_stop.expected_wake_seconds("meta-llama/Llama-3.1-70B-Instruct", CATALOG["p4d.24xlarge"], 2, 2) < sum(
        by_name.values()
    )


def test_an_idle_hour_with_idle_stop_pays_no_gpu_instance_but_every_volume():
    hour = idle_stop.idle_hour(CATALOG["p4d.24xlarge"], 2, "t3.small", 141.2, 300, 20)
    assert hour.without_stop - hour.with_stop == pytest.approx(2 * CATALOG["p4d.24xlarge"].price_per_hour_usd)
    assert hour.ebs == pytest.approx((2 * 300 + 20) * idle_stop.EBS_GP3_GB_MONTH / sizing.HOURS_PER_MONTH)
    assert hour.with_stop == pytest.approx(hour.gateway + hour.nat_gateway + hour.model_cache + hour.ebs)
    assert hour.with_stop < 0.2 < 40 < hour.without_stop


def test_the_waker_json_has_the_contracts_fields():
    text = idle_stop.waker_config(
        region="us-east-1",
        endpoint="https://ec2.us-east-1.amazonaws.com",
        stack="dev",
        project="vllm-cluster",
        gangs={"gang0": ["i-1", "i-2"]},
        idle_stop_minutes=30,
        expected_wake_seconds=300,
    )
    assert json.loads(text) == {
        "region": "us-east-1",
        "endpoint": "https://ec2.us-east-1.amazonaws.com",
        "stack": "dev",
        "project": "vllm-cluster",
        "gangs": {"gang0": ["i-1", "i-2"]},
        "idle_stop_minutes": 30,
        "retry_after_seconds": 30,
        "expected_wake_seconds": 300,
        # A short wake still gets 15 minutes before the waker gives up.
        "give_up_seconds": 900,
    }


def test_the_plan_shows_the_wake_time_the_waker_is_told_and_both_idle_hours():
    from cli import plan

    document = plan.build_plan("dev")
    shown = document["idleStop"]
    run = run_stack("dev")
    told = fed_waker_config(unsecret(commands(run)["vllm-gateway-waker"].inputs["stdin"]))
    assert shown["idleStopMinutes"] == told["idle_stop_minutes"] == 30
    assert shown["wakeSeconds"] == told["expected_wake_seconds"]
    assert shown["giveUpSeconds"] == told["give_up_seconds"]
    assert shown["idleHourWithoutUsd"] == pytest.approx(shown["idleHourWithUsd"] + shown["gpuNodes"], abs=1e-3)
    printed = plan.render(document)
    assert f"${shown['idleHourWithUsd']:.4f}/h with it" in printed and f"~{shown['wakeSeconds']} s" in printed
    assert f"a wake not serving after {told['give_up_seconds']} s" in printed
    assert plan.build_plan("own-hosts")["idleStop"] is None


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_readmes_idle_hours_are_the_plans(stack):
    from cli import plan

    readme = (Path(__file__).resolve().parent.parent / "docs" / "idle-stop.md").read_text()
    shown = plan.build_plan(stack)["idleStop"]
    row = next(line for line in readme.splitlines() if line.startswith(f"| `{stack}` (") and "idle" not in line)
    assert f"| ${shown['idleHourWithoutUsd']:.2f} | ${shown['idleHourWithUsd']:.2f}:" in row


def test_the_readmes_wake_time_of_dev_is_the_plans():
    from cli import plan

    readme = (Path(__file__).resolve().parent.parent / "docs" / "idle-stop.md").read_text()
    assert f"{plan.build_plan('dev')['idleStop']['wakeSeconds']} s for `dev`" in readme


# --- warm gangs (maxReplicas, issue 36) -----------------------------------------------------


def warm_waker_config(**scaling) -> str:
    return idle_stop.waker_config(
        region="us-east-1",
        endpoint="https://ec2.us-east-1.amazonaws.com",
        stack="prod",
        project="vllm-cluster",
        gangs={"gang0": ["i-0a000000000000001"], "gang1": ["i-0b000000000000001"]},
        idle_stop_minutes=30,
        expected_wake_seconds=600,
        **scaling,
    )


def test_the_waker_is_told_to_scale_only_with_warm_gangs_and_reads_what_it_is_told():
    from tests.test_waker import waker

    plain = waker.parse_config(warm_waker_config())
    assert not waker.scales(plain)
    assert not waker.scales(waker.parse_config(warm_waker_config(replicas=2, max_replicas=2)))
    told = waker.parse_config(warm_waker_config(replicas=1, max_replicas=2, gang_max_num_seqs=64))
    assert waker.scales(told)
    assert (told["replicas"], told["max_replicas"]) == (1, 2)
    assert told["scale_out_hold_seconds"] == scale_out.SCALE_OUT_HOLD_SECONDS
    assert told["scale_out_waiting_per_gang"] == scale_out.SCALE_OUT_WAITING_PER_GANG
    # The scale-in's measure: the share of one gang fewer's slots the load must fit in.
    assert (told["scale_in_fraction"], told["gang_max_num_seqs"]) == (scale_out.SCALE_IN_FRACTION, 64)
    # Prometheus on the gateway's loopback, under its route prefix (components/metrics.py).
    assert told["prometheus"] == f"http://127.0.0.1:{ports.PROMETHEUS}{metrics.ROUTE_PREFIX}"
    # A park's drain waits for requests in flight as long as nginx lets one run.
    assert told["drain_timeout_seconds"] == config_keys.DEFAULT_API_READ_TIMEOUT_SECONDS
    longer = waker.parse_config(
        warm_waker_config(replicas=1, max_replicas=2, gang_max_num_seqs=64, drain_timeout_seconds=1800)
    )
    assert longer["drain_timeout_seconds"] == 1800
    # Warm gangs without the gangs' capacity: the program's mistake, said at once.
    with pytest.raises(ValueError, match="need gang_max_num_seqs"):
        warm_waker_config(replicas=1, max_replicas=2)


def test_with_warm_gangs_the_always_on_gangs_never_stop_for_idleness_and_the_waker_parks_the_warm_ones():
    """replicas 2, maxReplicas 4: gangs 0 and 1 always serve (their nodes are told 0, never),
    gangs 2 and 3 are parked by the gateway's waker after 30 idle minutes (drained first),
    their nodes' own rule only a backstop at twice that, for a gateway that is down. Without
    warm gangs every gang keeps the idle time, and with replicas 0 every gang is warm."""
    assert [idle_stop.gang_idle_minutes(gang, 2, 4, 30) for gang in range(4)] == [0, 0, 60, 60]
    assert [idle_stop.gang_idle_minutes(gang, 2, 2, 30) for gang in range(2)] == [30, 30]
    assert [idle_stop.gang_idle_minutes(gang, 2, None, 30) for gang in range(2)] == [30, 30]
    assert [idle_stop.gang_idle_minutes(gang, 0, 2, 30) for gang in range(2)] == [60, 60]
