"""A stage that survives a stop (issue 35 point 3; components/stage_volume.py): the wake with
and without it, stageVolume's choice and refusals, and what the instances and their launch
template receive: a change of the choice must replace no running node and restart no engine."""

import dataclasses

import pytest
import yaml
from pulumi_mocks import run_stack, stack_config

from components import aws_contract, bootstrap, idle_stop, stage_volume
from components.catalog import CATALOG
from components.spec import SpecError, load_spec
from components.spec.loader import resolve_stage_volume

TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
COMMAND = "command:remote:Command"
LLAMA_70B = "meta-llama/Llama-3.1-70B-Instruct"


def stack_raw(stack: str, **changes) -> dict:
    config = {k.split(":", 1)[1]: v for k, v in stack_config(stack).items() if k.startswith("vllm-cluster:")}
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def spec_of(stack: str, **changes):
    return load_spec(stack_raw(stack, **changes), stack=stack)


def test_a_wake_from_the_stage_volume_copies_nothing_and_is_shorter_for_a_70b():
    """Prod's shape: the instance store is empty after a stop, so each node copies its
    ~70 GB stage again (135 s at EFS's 500 MiB/s); on the gp3 volume it is kept and read
    at 2,000 MiB/s."""
    p4d = CATALOG["p4d.24xlarge"]
    store = {t.name: t.seconds for t in idle_stop.wake_terms(LLAMA_70B, p4d, 2, 2)}
    ebs = {t.name: t.seconds for t in idle_stop.wake_terms(LLAMA_70B, p4d, 2, 2, on_stage_volume=True)}
    assert store["stage copy"] > 100 and ebs["stage copy"] == 0
    assert 30 < ebs["model load"] < 40  # ~70.6 GB at 2,000 MiB/s
    assert ebs["instance start"] == store["instance start"] and ebs["engine start"] == store["engine start"]
    faster = idle_stop.expected_wake_seconds(LLAMA_70B, p4d, 2, 2, True)
    assert faster < idle_stop.expected_wake_seconds(LLAMA_70B, p4d, 2, 2) - idle_stop.RETRY_AFTER_SECONDS
    assert idle_stop.stage_volume_wakes_faster(LLAMA_70B, p4d, 2, 2)


def test_the_volume_is_sized_for_the_stage_within_gp3s_limits_and_priced():
    volume = stage_volume.stage_volume_for(LLAMA_70B, CATALOG["p4d.24xlarge"], 2, 2)
    # ~70.6 GB of stage plus 15% headroom, in GiB.
    assert 70.6e9 / 2**30 < volume.size_gib <= 70.6e9 * 1.15 / 2**30 + 1
    assert volume.throughput_mib_s == aws_contract.GP3_THROUGHPUT[1] == 2000
    assert volume.throughput_mib_s <= volume.iops * aws_contract.GP3_MIBS_PER_IOPS
    assert volume.iops <= volume.size_gib * aws_contract.GP3_IOPS_PER_GIB
    # 76 GiB x $0.08 + (8,000 - 3,000) x $0.005 + (2,000 - 125) x $0.04
    assert volume.month_usd == pytest.approx(volume.size_gib * 0.08 + 5000 * 0.005 + 1875 * 0.04)
    # A tiny stage still gets the size its IOPS need (500 IOPS per GiB).
    small = stage_volume.stage_volume_for("Qwen/Qwen2.5-0.5B-Instruct", CATALOG["g6.xlarge"], 1)
    assert small.size_gib == stage_volume.STAGE_VOLUME_MIN_GIB == 16


def test_auto_chooses_the_stage_volume_only_with_idle_stop_and_a_wake_it_shortens():
    assert spec_of("prod").stage_volume == "instance-store"  # no idleStopMinutes: no wake to shorten
    prod = spec_of("prod", idleStopMinutes=30)
    assert prod.stage_volume == "ebs" and prod.on_stage_volume
    # dev's 1.5B copies in seconds: the volume would save less than a Retry-After.
    assert spec_of("dev", idleStopMinutes=30).stage_volume == "instance-store"
    assert spec_of("dev", idleStopMinutes=30, stageVolume="ebs").stage_volume == "ebs"
    assert spec_of("prod", idleStopMinutes=30, stageVolume="instance-store").stage_volume == "instance-store"


def test_the_wake_the_waker_is_told_is_the_chosen_stages():
    prod = spec_of("prod", idleStopMinutes=30)
    warned = [w for w in spec_of("prod", idleStopMinutes=7).warnings if "idleStopMinutes is 7" in w]
    wake = idle_stop.expected_wake_seconds(LLAMA_70B, prod.instance, prod.nodes, prod.pipeline_parallel_size, True)
    assert warned and f"about {wake / 60:.1f} min" in warned[0], warned


def test_a_stage_volume_value_that_is_none_of_the_choices_is_refused_naming_the_fix():
    with pytest.raises(SpecError) as caught:
        spec_of("prod", stageVolume="gp3")
    assert caught.value.keys == ["stageVolume"]
    message = str(caught.value)
    assert "gp3" in message and "pulumi config set vllm-cluster:stageVolume auto" in message


def test_a_stage_volume_on_a_stack_that_serves_from_the_efs_cache_is_refused_and_never_chosen():
    """Without a local copy of the stage (no instance store, or one too small for the stage)
    there is nothing for the volume to keep, and vLLM's path is the cache's: auto keeps it
    so, and ebs is refused. Every catalog type has a store that holds what its GPUs hold, so
    the spec is given one without."""
    seven_b = spec_of("dev", idleStopMinutes=30, model="Qwen/Qwen2.5-7B-Instruct")
    assert seven_b.stage_volume == "ebs"
    no_store = dataclasses.replace(seven_b, instance=dataclasses.replace(seven_b.instance, instance_store_gb=0))
    assert resolve_stage_volume(no_store, None) == "instance-store"
    with pytest.raises(SpecError) as caught:
        resolve_stage_volume(no_store, "ebs")
    assert caught.value.keys == ["stageVolume"]
    assert "serves from the EFS cache" in str(caught.value) and "pulumi config rm vllm-cluster:stageVolume" in str(
        caught.value
    )


def test_a_stage_volume_with_your_own_hosts_is_refused():
    own = yaml.safe_load(open("stacks/Pulumi.own-hosts.yaml"))["config"]
    config = {k.split(":", 1)[1]: v for k, v in own.items() if k.startswith("vllm-cluster:")}
    config["sshPrivateKey"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n"
    assert load_spec(config, stack="own-hosts").stage_volume == "instance-store"
    for value in ("ebs", "instance-store"):
        with pytest.raises(SpecError) as caught:
            load_spec({**config, "stageVolume": value}, stack="own-hosts")
        assert caught.value.keys == ["stageVolume"]
        assert "vllm-cluster:hosts" in str(caught.value) and "pulumi config rm vllm-cluster:stageVolume" in str(
            caught.value
        )


@pytest.fixture(scope="module")
def prod_with_idle_stop():
    run = run_stack("prod", {"vllm-cluster:idleStopMinutes": 30})
    assert run.error is None, run.error
    return run


@pytest.fixture(scope="module")
def prod_running():
    """prod as it runs without idle stop: stageVolume auto keeps the stage on the instance store."""
    run = run_stack("prod")
    assert run.error is None, run.error
    return run


def gpu_nodes(run):
    return [r for r in run.of_type(INSTANCE) if r.parent_type == "vllm-cluster:index:GpuNodes"]


def engine_commands(run) -> dict:
    """The commands whose inputs, changed, restart Ray or vLLM on a node."""
    return {
        c.name: c.inputs for c in run.of_type(COMMAND) if c.name.endswith(("-vllm", "-ray")) or "start-ray" in c.name
    }


def test_idle_stop_set_on_a_running_stack_replaces_no_node_and_restarts_no_engine(prod_running, prod_with_idle_stop):
    """auto turns to ebs for prod once idleStopMinutes is set; the running nodes must keep
    their instances (no new launch template version: its change is ForceNew on
    aws.ec2.Instance) and their engines (vLLM's model path and Ray's inputs unchanged)."""
    assert spec_of("prod").stage_volume == "instance-store"
    assert spec_of("prod", idleStopMinutes=30).stage_volume == "ebs"
    assert [t.inputs for t in prod_with_idle_stop.of_type(TEMPLATE)] == [
        t.inputs for t in prod_running.of_type(TEMPLATE)
    ]
    assert engine_commands(prod_with_idle_stop) == engine_commands(prod_running)
    assert engine_commands(prod_running), "no -ray/-vllm/start-ray command found: the check would prove nothing"


def test_each_node_declares_its_stage_volume_under_ignore_changes(prod_running, prod_with_idle_stop):
    """The volume is on each instance, where the engine keeps what the instance was created
    with (ignoreChanges): a running node is left as it is, either way, and a node created
    from then on gets it."""
    expected = stage_volume.stage_volume_for(LLAMA_70B, CATALOG["p4d.24xlarge"], 2, 2)
    for node in gpu_nodes(prod_with_idle_stop):
        assert "ebsBlockDevices" in node.ignore_changes
        assert node.inputs["ebsBlockDevices"] == [
            {
                "deviceName": "/dev/sdf",
                "volumeType": "gp3",
                "volumeSize": expected.size_gib,
                "iops": 8000,
                "throughput": 2000,
                "encrypted": True,
                "deleteOnTermination": True,
            }
        ]
    contract = aws_contract.check(gpu_nodes(prod_with_idle_stop))
    assert [f for f in contract.errors + contract.warnings if f.rule.startswith("gp3")] == []
    for node in gpu_nodes(prod_running):
        assert "ebsBlockDevices" in node.ignore_changes  # removing idle stop later keeps a node's volume too
        assert not node.inputs.get("ebsBlockDevices")


def test_the_template_maps_the_root_alone_whichever_disk_holds_the_stage(prod_running, prod_with_idle_stop):
    for run in (prod_running, prod_with_idle_stop):
        assert [len(t.inputs["blockDeviceMappings"]) for t in run.of_type(TEMPLATE)] == [1]


def test_the_stage_is_served_from_the_same_path_whichever_disk_holds_it():
    with_volume = bootstrap.serving_directory(spec_of("prod", idleStopMinutes=30))
    assert with_volume == bootstrap.serving_directory(spec_of("prod"))
    assert with_volume.startswith(f"{bootstrap.LOCAL_MODEL_ROOT}/")


def test_the_node_is_told_the_same_stage_volume_facts_whatever_the_choice():
    """cluster.env is in the user data and the setup command: what it says must not depend on
    the choice, or a flip would reach every node. The node decides from what it was launched
    with (vllm-cluster-node stage_volume_launched)."""
    from tests.test_bootstrap import boot, parse_env

    env = parse_env(bootstrap.cluster_env(boot(1)))
    assert env["STAGE_VOLUME_MOUNT"] == stage_volume.STAGE_VOLUME_MOUNT
    assert env["STAGE_VOLUME_DEVICE_NAME"] == stage_volume.STAGE_VOLUME_DEVICE_NAME
    assert env["STAGE_VOLUME_IMDS_MAPPINGS"] == stage_volume.IMDS_BLOCK_DEVICE_MAPPING
