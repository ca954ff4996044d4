"""Replicas under Pulumi's mock runtime: `replicas: 1` (or no `replicas` key) declares
exactly what stacks deployed before replicas existed, so their `pulumi up` replaces
nothing; more replicas add whole gangs, each with its own placement group and Ray
cluster, behind the one gateway."""

import hashlib
import json

import pytest
from pulumi_mocks import ROOT, ec2_stack_names, engine_urns, run_stack, unsecret

from components import engine_capacity, gateway_capacity

STACKS = ec2_stack_names()
GOLDEN = ROOT / "tests" / "golden"
COMMAND = "command:remote:Command"


BUCKET_OBJECT = "aws:s3/bucketObjectv2:BucketObjectv2"


def resource_identities(run, stack: str) -> dict[str, str]:
    """Engine URN -> a digest of what the engine compares on `pulumi up`: the inputs
    (but those it is told to ignore, such as a host's first-boot user data, and remote
    commands' inputs, whose scripts change with any script edit and only re-run a
    command, and for the same reason the node image's bake script, which an edit only
    uploads again: the image is baked once per lock and base image) and the dependencies."""
    engine = engine_urns(run, stack)
    identities = {}
    for resource in run.resources:
        ignored = set(resource.ignore_changes)
        if resource.type == BUCKET_OBJECT:
            ignored.add("content")
        inputs = {} if resource.type == COMMAND else {k: v for k, v in resource.inputs.items() if k not in ignored}
        document = {
            "inputs": inputs,
            "dependencies": sorted(engine.get(d, d) for d in resource.dependencies),
            "deleteBeforeReplace": resource.delete_before_replace,
            "ignoreChanges": sorted(resource.ignore_changes),
        }
        encoded = json.dumps(document, sort_keys=True, default=str).encode()
        identities[engine[resource.urn]] = hashlib.sha256(encoded).hexdigest()[:16]
    return identities


def golden_identities(stack: str) -> dict[str, str]:
    """tests/golden/resources-<stack>.txt, recorded from the program before replicas."""
    lines = (GOLDEN / f"resources-{stack}.txt").read_text().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize("stack", STACKS)
def test_one_replica_declares_exactly_what_stacks_deployed_before_replicas(stack):
    run = run_stack(stack, {"replicas": None})
    assert run.error is None, run.error
    identities = resource_identities(run, stack)
    golden = golden_identities(stack)
    assert sorted(set(identities) - set(golden)) == [], "new resources with one replica"
    assert sorted(set(golden) - set(identities)) == [], "resources gone with one replica"
    changed = sorted(urn for urn in golden if golden[urn] != identities[urn])
    assert changed == [], "resources whose inputs or options changed with one replica"


@pytest.mark.parametrize("stack", STACKS)
def test_replicas_one_set_explicitly_is_the_same_as_unset(stack):
    unset, explicit = run_stack(stack, {"replicas": None}), run_stack(stack, {"replicas": 1})
    assert explicit.error is None, explicit.error
    assert resource_identities(explicit, stack) == resource_identities(unset, stack)
    commands = {r.name: r.inputs for r in unset.of_type(COMMAND)}
    assert {r.name: r.inputs for r in explicit.of_type(COMMAND)} == commands
    # One gang rolls over nothing: no drain, no return to a pool.
    assert not [name for name in commands if name.endswith(("-drain", "-return"))]


# --- two gangs ----------------------------------------------------------------------------

INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
GROUP = "aws:ec2/placementGroup:PlacementGroup"


@pytest.fixture(scope="module")
def two_gangs():
    """prod (two p4d nodes, TP 8 x PP 2) as two gangs: four GPU nodes."""
    run = run_stack("prod", {"replicas": 2})
    assert run.error is None, run.error
    return run


def command(run, name):
    return run.named(f"vllm-{name}", COMMAND)


def depends_on(run, resource, name) -> bool:
    return run.named(name).urn in resource.dependencies


def test_each_gang_has_its_own_placement_group_template_and_nodes(two_gangs):
    run = two_gangs
    assert sorted(r.name for r in run.of_type(GROUP)) == [
        "vllm-gang1-node-placement-group",
        "vllm-node-placement-group",
    ]
    assert sorted(r.name for r in run.of_type(INSTANCE)) == [
        "vllm-gang1-head",
        "vllm-gang1-worker-1",
        "vllm-gateway-host",
        "vllm-head",
        "vllm-worker-1",
    ]
    for prefix in ("", "gang1-"):
        template = run.named(f"vllm-{prefix}template", TEMPLATE)
        group = run.named(f"vllm-{prefix}node-placement-group", GROUP)
        assert depends_on(run, template, group.name)
        for node in ("head", "worker-1"):
            instance = run.named(f"vllm-{prefix}{node}", INSTANCE)
            assert instance.inputs["launchTemplate"]["id"] == run.id_of(template)
    # A gang's placement group is its own: the two templates name different groups.
    groups = {run.named(f"vllm-{p}template", TEMPLATE).inputs["placement"]["groupName"] for p in ("", "gang1-")}
    assert len(groups) == 2


def test_a_gangs_workers_join_their_own_head_under_the_gangs_names(two_gangs):
    from localhosts.replay import user_data_of

    run = two_gangs
    scripts = user_data_of(run)
    head_ip = {prefix: MockIp.of(run, f"vllm-{prefix}head") for prefix in ("", "gang1-")}
    assert head_ip[""] != head_ip["gang1-"]
    for prefix in ("", "gang1-"):
        head, worker = scripts[f"vllm-{prefix}head"], scripts[f"vllm-{prefix}worker-1"]
        assert f"NODE_NAME={prefix}head" in head and f"NODE_NAME={prefix}worker-1" in worker
        assert f"HEAD_IP={head_ip[prefix]}" in worker


class MockIp:
    @staticmethod
    def of(run, instance_name: str) -> str:
        """The private IP the mock cloud gave an instance, as the gangs output shows it."""
        for gang in run.outputs["gangs"]:
            for node in gang["nodes"]:
                if f"vllm-{node['name']}" == instance_name:
                    return node["ip"]
        raise KeyError(instance_name)


def test_the_gangs_output_lists_every_gang_head_first(two_gangs):
    gangs = two_gangs.outputs["gangs"]
    assert [g["name"] for g in gangs] == ["gang0", "gang1"]
    assert [[n["name"] for n in g["nodes"]] for g in gangs] == [["head", "worker-1"], ["gang1-head", "gang1-worker-1"]]
    assert gangs[0]["nodes"][0]["ip"] == two_gangs.outputs["headPrivateIp"]
    assert two_gangs.outputs["topology"]["replicas"] == 2


def test_the_gateway_pools_every_gang_head(two_gangs):
    proxy = command(two_gangs, "gateway-proxy")
    heads = [g["nodes"][0]["ip"] for g in two_gangs.outputs["gangs"]]
    pool = f"gang0={heads[0]}:8000,gang1={heads[1]}:8000"
    # nginx.conf's limits for two gangs of prod's A100s at vLLM's default batch, 256
    # (components/engine_capacity.py, components/gateway_capacity.py).
    sized = gateway_capacity.capacity(2, engine_capacity.VLLM_DEFAULT_MAX_NUM_SEQS)
    limits = f"--connections {sized.worker_connections} --open-files {sized.open_files}"
    assert proxy.inputs["create"].endswith(f"configure --keep-old-heads {limits} --gangs {pool}")


def test_each_gang_is_its_own_ray_cluster_with_its_own_vllm(two_gangs):
    run = two_gangs
    for prefix in ("", "gang1-"):
        names = ("head", "worker-1")
        ready = command(run, f"{prefix}cluster-ready")
        assert all(depends_on(run, ready, f"vllm-ray-{prefix}{n}") for n in names)
        assert f"--expect {prefix}head=" in ready.inputs["create"] and "--gpus 16" in ready.inputs["create"]
        vllm = command(run, f"{prefix}vllm")
        assert "--pipeline-parallel-size 2" in vllm.inputs["stdin"]
        assert f"EXPECTED_NODES={prefix}head=" in vllm.inputs["stdin"]
        preflight = command(run, f"{prefix}preflight")
        assert f"--nodes {prefix}head,{prefix}worker-1" in preflight.inputs["create"]
    # The model cache is shared: the model is staged once, by gang 0's nodes (a part each).
    staged = sorted(r.name for r in run.of_type(COMMAND) if r.name.startswith("vllm-model"))
    assert staged == ["vllm-model", "vllm-model-part-worker-1"]
    assert depends_on(run, command(run, "prepare-gang1-head"), "vllm-model")
    assert depends_on(run, command(run, "preflight-gang1-head"), "vllm-prepare-gang1-head")


def test_gang_0_copies_its_stages_while_the_model_lands_and_later_gangs_the_staged_model(two_gangs):
    run = two_gangs
    for node in ("head", "worker-1"):
        # Gang 0's nodes download the model: their copies run beside it, each file as it lands.
        prepare = command(run, f"prepare-{node}")
        assert "--model-landing true" in prepare.inputs["create"]
        assert not depends_on(run, prepare, "vllm-model")
        assert depends_on(run, prepare, f"vllm-setup-{node}")
        # A later gang's copy the staged model, after it is whole and checked.
        later = command(run, f"prepare-gang1-{node}")
        assert "--model-landing" not in later.inputs["create"] and depends_on(run, later, "vllm-model")
    # vLLM still starts only once the whole model is checked, and every stage is copied.
    assert depends_on(run, command(run, "vllm"), "vllm-model")
    for node in ("head", "worker-1"):
        facts = command(run, f"preflight-{node}")
        assert depends_on(run, facts, f"vllm-prepare-{node}") and depends_on(run, facts, "vllm-model")


def ray_token_given(run, node: str) -> str:
    """The Ray token a node's install-secrets receives on its (secret) stdin."""
    stdin = unsecret(command(run, f"secrets-{node}").inputs["stdin"])
    return next(line.split("=", 1)[1] for line in stdin.splitlines() if line.startswith("RAY_AUTH_TOKEN="))


def test_each_gang_has_its_own_ray_token(two_gangs):
    """A gang is its own Ray cluster: a node of one gang started against another gang's
    head (a wrong IP, a stale node) must not join it, nor may a client holding one
    gang's token reach another gang's GCS or Jobs API."""
    run = two_gangs
    gang0 = {ray_token_given(run, node) for node in ("head", "worker-1")}
    gang1 = {ray_token_given(run, node) for node in ("gang1-head", "gang1-worker-1")}
    assert len(gang0) == len(gang1) == 1, (gang0, gang1)  # one token within a gang
    assert gang0 != gang1
    # rayToken stays gang 0's: the dashboard's (dashboardUrl is gang 0's head).
    assert gang0 == {unsecret(run.outputs["rayToken"])}
    # A gang's token restarts that gang: its drain's triggers carry its own, not the other's.
    for gang, own, other in (("gang0", gang0, gang1), ("gang1", gang1, gang0)):
        triggers = unsecret(command(run, f"{gang}-drain").inputs["triggers"])
        assert own <= {unsecret(t) for t in triggers} and not other & {unsecret(t) for t in triggers}, gang


def test_a_gang_is_drained_before_anything_of_it_restarts_and_returns_once_it_serves(two_gangs):
    run = two_gangs
    for gang, prefix in (("gang0", ""), ("gang1", "gang1-")):
        drain, back = command(run, f"{gang}-drain"), command(run, f"{gang}-return")
        assert f"drain --gang {gang} " in drain.inputs["create"]
        assert f"return --gang {gang} --address " in back.inputs["create"]
        for node in ("head", "worker-1"):
            assert depends_on(run, command(run, f"setup-{prefix}{node}"), drain.name)
        assert depends_on(run, back, f"vllm-{prefix}vllm")
        assert depends_on(run, command(run, f"{prefix}readiness"), back.name)
        # What restarts the gang's Ray or vLLM drains it again, and returns it; so does
        # any change of the drain's own line.
        assert unsecret(back.inputs["triggers"]) == [*unsecret(drain.inputs["triggers"]), drain.inputs["create"]]
    # The gangs take the rolling lease in order: gang 0's chain stages the model.
    assert depends_on(run, command(run, "gang1-drain"), "vllm-gang0-drain")


def test_new_vllm_settings_drain_and_return_every_gang(two_gangs):
    changed = run_stack("prod", {"replicas": 2, "gpuMemoryUtilization": "0.8"})
    before = {r.name: r.inputs for r in two_gangs.of_type(COMMAND)}
    rerun = {r.name for r in changed.of_type(COMMAND) if before.get(r.name) != r.inputs}
    assert rerun == {
        f"vllm-{name}"
        for name in (
            "gang0-drain",
            "gang1-drain",
            "vllm",
            "gang1-vllm",
            "gang0-return",
            "gang1-return",
            "readiness",
            "gang1-readiness",
        )
    } | {
        # The restarted engines' compile cache is kept again (its key is unchanged: the
        # memory share does not change the graphs, engine_cache.warmup_key), by gang 0's
        # nodes alone, which alone write the warm-up cache (issue 33, point 3).
        f"vllm-warmup-{node}"
        for node in ("head", "worker-1")
    }


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"replicas": 0}, "replicas"),
        ({"replicas": 17}, "replicas"),
        ({"replicas": 2, "placementGroupName": "my-cluster-group"}, "replicas"),
    ],
)
def test_bad_replicas_are_refused_before_any_resource(overrides, key):
    run = run_stack("prod", overrides)
    assert run.error is not None and f"vllm-cluster:{key} = " in str(run.error)
    assert "Fix:" in str(run.error) and run.resources == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"gpuMemoryUtilization": "0.8"},
        {"apiReadTimeoutSeconds": 900},
        {"replicas": 3},
        {"model": "Qwen/Qwen2.5-7B-Instruct"},
        {"maxModelLen": 8192},
    ],
)
def test_whenever_a_gang_is_drained_again_it_is_returned_again(two_gangs, overrides):
    """A drain that runs without its return would leave the gang out of the pool for
    good (and the next gang waiting for the lease)."""
    changed = run_stack("prod", {"replicas": 2, **overrides})
    assert changed.error is None, changed.error
    before = {r.name: r.inputs for r in two_gangs.of_type(COMMAND)}
    rerun = {r.name for r in changed.of_type(COMMAND) if before.get(r.name) != r.inputs}
    for gang in ("gang0", "gang1", "gang2"):
        if f"vllm-{gang}-drain" in rerun:
            assert f"vllm-{gang}-return" in rerun, (gang, sorted(rerun))
    assert rerun & {"vllm-gang0-drain", "vllm-gang1-drain", "vllm-gang2-drain"} or overrides.get("replicas")


# A reservation serves one zone: the stack names it (prod's region is us-east-1).
RESERVATION = {"capacityReservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1a"}


def test_a_reservation_in_a_named_group_cannot_hold_several_gangs():
    run = run_stack(
        "prod",
        {"replicas": 2, "placementGroupName": "reserved-group", **RESERVATION},
    )
    assert run.error is not None and run.resources == []
    assert 'vllm-cluster:replicas = "2"' in str(run.error) and "1 problem(s)" in str(run.error)
    assert "replicas 1 (a reservation in a placement group serves that one group)" in str(run.error)


def test_replicas_in_a_reservation_warn_that_it_must_hold_every_gang():
    run = run_stack("prod", {"replicas": 2, **RESERVATION})
    assert run.error is None, run.error
    assert any("nodes x replicas instances" in warning for warning in run.warnings), run.warnings
