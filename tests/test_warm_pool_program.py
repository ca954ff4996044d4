"""The warm pool (maxReplicas, issue 36) under Pulumi's mock runtime: the stack declares
maxReplicas gangs, each created, set up and made ready like any gang (so a later wake is
only a power-on), with its own instances, security group, Ray token and commands; the
waker is told every gang; the warm gangs' nodes keep only a backstop idle rule (the waker
parks them); and the stack's last gateway command parks the warm gangs after the
readiness checks. A stack without maxReplicas declares what it did before."""

import json

import pytest
from pulumi_mocks import run_stack, unsecret
from test_replicas_program import command, depends_on

from components import idle_stop
from components.bootstrap import GATEWAY_COMMAND
from components.scale_out import SCALE_IN_FRACTION

COMMAND = "command:remote:Command"
INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
GROUP = "aws:ec2/securityGroup:SecurityGroup"
PASSWORD = "random:index/randomPassword:RandomPassword"
PARK = "vllm-gateway-park"
# dev: one g6.xlarge node a gang, idleStopMinutes 30.
IDLE_MINUTES = 30


@pytest.fixture(scope="module")
def warm():
    """dev with one always-on gang and one warm gang."""
    run = run_stack("dev", {"replicas": 1, "maxReplicas": 2})
    assert run.error is None, run.error
    return run


def ray_token_given(run, node: str) -> str:
    stdin = unsecret(command(run, f"secrets-{node}").inputs["stdin"])
    return next(line.split("=", 1)[1] for line in stdin.splitlines() if line.startswith("RAY_AUTH_TOKEN="))


def waker_told(run) -> dict:
    """The JSON the gateway's waker command hands `vllm-cluster-gateway waker-config`."""
    script = unsecret(command(run, "gateway-waker").inputs["stdin"])
    body = script.split(f"{GATEWAY_COMMAND} waker-config <<'", 1)[1]
    delimiter, rest = body.split("'\n", 1)
    return json.loads(rest.split(f"\n{delimiter}", 1)[0])


def test_every_declared_gang_has_its_instances(warm):
    assert sorted(r.name for r in warm.of_type(INSTANCE)) == ["vllm-gang1-head", "vllm-gateway-host", "vllm-head"]
    # Each gang launches from a template of its own (its own placement and cluster group).
    assert sorted(r.name for r in warm.of_type(TEMPLATE)) == ["vllm-gang1-template", "vllm-template"]
    # The warm gang's instance carries its gang's tag, which the gateway's waker starts it by.
    tags = warm.named("vllm-gang1-head", INSTANCE).inputs["tags"]
    assert tags["vllm-cluster:gang"] == "gang1"


def test_each_declared_gang_has_its_own_ray_token(warm):
    assert {"vllm-ray-token", "vllm-gang1-ray-token"} <= {r.name for r in warm.of_type(PASSWORD)}
    assert ray_token_given(warm, "head") != ray_token_given(warm, "gang1-head")


def test_each_declared_gang_has_its_own_cluster_security_group(warm):
    groups = {r.name for r in warm.of_type(GROUP)}
    assert {"vllm-cluster-sg", "vllm-gang1-cluster-sg"} <= groups
    gang1_group = warm.id_of(warm.named("vllm-gang1-cluster-sg", GROUP))
    interfaces = warm.named("vllm-gang1-template", TEMPLATE).inputs["networkInterfaces"]
    assert all(gang1_group in interface["securityGroups"] for interface in interfaces)
    gang0_group = warm.id_of(warm.named("vllm-cluster-sg", GROUP))
    assert all(gang0_group not in interface["securityGroups"] for interface in interfaces)


def test_the_warm_gang_is_set_up_and_made_ready_like_any_gang(warm):
    """Its software and model stage must be on its disks, so a later wake is a power-on."""
    for step in ("setup-gang1-head", "prepare-gang1-head", "gang1-vllm", "gang1-return", "gang1-readiness"):
        command(warm, step)
    assert depends_on(warm, command(warm, "gang1-readiness"), "vllm-gang1-return")


def test_the_waker_is_told_every_gang_and_which_always_serve(warm):
    told = waker_told(warm)
    ids = {name: warm.id_of(warm.named(name, INSTANCE)) for name in ("vllm-head", "vllm-gang1-head")}
    assert told["gangs"] == {"gang0": [ids["vllm-head"]], "gang1": [ids["vllm-gang1-head"]]}
    assert (told["replicas"], told["max_replicas"]) == (1, 2)


def test_the_waker_drains_a_gang_for_as_long_as_a_request_may_run():
    """A park's drain waits for the gang's requests in flight: as long as the API lets one
    run (apiReadTimeoutSeconds), or it would cut the longest generations."""
    run = run_stack("dev", {"replicas": 1, "maxReplicas": 2, "apiReadTimeoutSeconds": 900})
    assert run.error is None, run.error
    assert waker_told(run)["drain_timeout_seconds"] == 900


def test_the_waker_measures_the_load_against_what_one_gang_runs_at_once(warm):
    """The scale-in parks a warm gang when the load fits in a share of one gang fewer's
    slots: the waker is told vLLM's max_num_seqs for the stack's gangs, vLLM's default for
    dev's L4 (256) or what vllmExtraArgs set, and the share (components/scale_out.py)."""
    assert (waker_told(warm)["gang_max_num_seqs"], waker_told(warm)["scale_in_fraction"]) == (256, SCALE_IN_FRACTION)
    run = run_stack("dev", {"replicas": 1, "maxReplicas": 2, "vllmExtraArgs": ["--max-num-seqs", "64"]})
    assert run.error is None, run.error
    assert waker_told(run)["gang_max_num_seqs"] == 64


def test_prometheus_on_the_gateway_gets_the_pools_alert(warm):
    """VllmPoolAtMaxReplicas ships with warm gangs only (stacks without keep their rules)."""
    assert "VllmPoolAtMaxReplicas" in unsecret(command(warm, "gateway-metrics").inputs["stdin"])
    without = run_stack("dev", {})
    assert "VllmPoolAtMaxReplicas" not in unsecret(command(without, "gateway-metrics").inputs["stdin"])


def test_always_on_gangs_never_idle_stop_and_warm_ones_keep_the_backstop(warm):
    always_on = command(warm, "idle-stop-head").inputs["create"]
    assert "idle-stop-config --minutes 0" in always_on
    backstop = idle_stop.gang_idle_minutes(1, 1, 2, IDLE_MINUTES)
    assert backstop > 0
    assert f"idle-stop-config --minutes {backstop} " in command(warm, "idle-stop-gang1-head").inputs["create"]


def test_the_park_command_runs_on_the_gateway_as_its_other_commands_do(warm):
    park = command(warm, "gateway-park")
    assert park.inputs["create"] == f"sudo {GATEWAY_COMMAND} park"
    # The same connection as every gateway command: its address, login and pinned host key.
    assert park.inputs["connection"] == command(warm, "gateway-waker").inputs["connection"]
    assert unsecret(park.inputs["connection"])["hostKey"]


def test_the_park_command_comes_last_after_every_readiness_and_the_waker(warm):
    park = command(warm, "gateway-park")
    for name in ("readiness", "gang1-readiness", "gateway-waker", "idle-stop-head", "idle-stop-gang1-head"):
        assert depends_on(warm, park, f"vllm-{name}"), name
    # Nothing waits for it: no command could reach a warm gang it stopped.
    assert not [r.name for r in warm.resources if park.urn in r.dependencies]
    # Every other command of the stack is done before it.
    others = {r.urn for r in warm.of_type(COMMAND) if r.name != PARK}
    assert others <= set(park.dependencies)


def test_the_park_command_reruns_with_every_readiness_check(warm):
    park = unsecret(command(warm, "gateway-park").inputs["triggers"])
    for readiness in ("readiness", "gang1-readiness"):
        for trigger in unsecret(command(warm, readiness).inputs["triggers"]):
            assert trigger in park, readiness
    # And with a new gateway instance (a fresh waker), as every gateway command.
    assert warm.id_of(warm.named("vllm-gateway-host", INSTANCE)) in park


def rerun(before, after) -> set[str]:
    inputs = {r.name: r.inputs for r in before.of_type(COMMAND)}
    return {r.name for r in after.of_type(COMMAND) if inputs.get(r.name) != r.inputs}


def test_a_change_that_rechecks_readiness_parks_again_and_one_that_does_not_does_not(warm):
    engine = run_stack("dev", {"replicas": 1, "maxReplicas": 2, "gpuMemoryUtilization": "0.8"})
    assert engine.error is None, engine.error
    assert {"vllm-readiness", "vllm-gang1-readiness", PARK} <= rerun(warm, engine)
    site = run_stack("dev", {"replicas": 1, "maxReplicas": 2, "apiRateLimitPerSecond": 7})
    assert site.error is None, site.error
    changed = rerun(warm, site)
    assert "vllm-gateway-proxy" in changed and not {"vllm-readiness", PARK} & changed


def test_the_outputs_list_every_gang_with_its_role(warm):
    gangs = warm.outputs["gangs"]
    assert [(g["name"], g["role"]) for g in gangs] == [("gang0", "always-on"), ("gang1", "warm")]
    assert [[n["name"] for n in g["nodes"]] for g in gangs] == [["head"], ["gang1-head"]]
    topology = warm.outputs["topology"]
    assert (topology["replicas"], topology["maxReplicas"], topology["gangs"]) == (1, 2, ["gang0", "gang1"])
    # The operator's ssh pins the warm gang's node too.
    assert gangs[1]["nodes"][0]["ip"] in warm.outputs["sshKnownHosts"]


def test_replicas_0_declares_every_gang_warm_and_parks_them():
    run = run_stack("dev", {"replicas": 0, "maxReplicas": 2})
    assert run.error is None, run.error
    assert sorted(r.name for r in run.of_type(INSTANCE)) == ["vllm-gang1-head", "vllm-gateway-host", "vllm-head"]
    assert [(g["name"], g["role"]) for g in run.outputs["gangs"]] == [("gang0", "warm"), ("gang1", "warm")]
    for node, gang in (("head", 0), ("gang1-head", 1)):
        minutes = idle_stop.gang_idle_minutes(gang, 0, 2, IDLE_MINUTES)
        assert minutes > 0
        assert f"--minutes {minutes} " in command(run, f"idle-stop-{node}").inputs["create"]
    assert (waker_told(run)["replicas"], waker_told(run)["max_replicas"]) == (0, 2)
    command(run, "gateway-park")


def test_replicas_0_of_one_gang_declares_that_gang_and_parks_it():
    run = run_stack("dev", {"replicas": 0, "maxReplicas": 1})
    assert run.error is None, run.error
    assert sorted(r.name for r in run.of_type(INSTANCE)) == ["vllm-gateway-host", "vllm-head"]
    park = command(run, "gateway-park")
    assert depends_on(run, park, "vllm-readiness")


@pytest.mark.parametrize("stack, overrides", [("dev", {}), ("prod", {"replicas": 2})])
def test_max_replicas_equal_to_replicas_declares_what_replicas_alone_did(stack, overrides):
    """No warm gang: no park command, and every resource and command as without the key."""
    plain = run_stack(stack, overrides)
    same = run_stack(stack, {**overrides, "maxReplicas": overrides.get("replicas", 1)})
    assert same.error is None, same.error
    assert not [r.name for r in same.of_type(COMMAND) if r.name == PARK]
    declared = {(r.type, r.name): r.inputs for r in same.resources}
    assert declared == {(r.type, r.name): r.inputs for r in plain.resources}
    assert same.outputs == plain.outputs


def test_the_fleet_has_a_host_for_every_declared_gang():
    """The local fleet stands in for maxReplicas gangs of instances, not replicas."""
    from localhosts.cluster import MAIN_NETWORK, fleet_gangs, instance_ips

    assert fleet_gangs({"replicas": 1, "maxReplicas": 2}) == 2
    assert fleet_gangs({"replicas": 0, "maxReplicas": 1}) == 1
    assert fleet_gangs({"replicas": 2}) == 2 and fleet_gangs({}) == 1
    ips = instance_ips(1, fleet_gangs({"replicas": 1, "maxReplicas": 2}), MAIN_NETWORK)
    assert {"vllm-head", "vllm-gang1-head"} <= set(ips)
