"""A stage that survives a stop (issue 35 point 3; components/stage_volume.py): the wake with
and without it, stageVolume's choice and refusals, and what the launch template receives."""

import pytest
import yaml
from pulumi_mocks import run_stack, stack_config

from components import aws_contract, bootstrap, idle_stop, stage_volume
from components.catalog import CATALOG
from components.spec import SpecError, load_spec

TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
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


def test_the_stage_is_served_from_the_volumes_mount():
    prod = spec_of("prod", idleStopMinutes=30)
    assert bootstrap.serving_directory(prod).startswith(f"{stage_volume.STAGE_VOLUME_MOUNT}/vllm-cluster/models/")
    assert bootstrap.serving_directory(spec_of("prod")).startswith("/opt/dlami/nvme/")


@pytest.fixture(scope="module")
def prod_with_idle_stop():
    run = run_stack("prod", {"vllm-cluster:idleStopMinutes": 30})
    assert run.error is None, run.error
    return run


def test_the_launch_template_maps_each_nodes_stage_volume_beside_the_root(prod_with_idle_stop):
    """As AWS receives it: a second mapping, gp3 at 2,000 MiB/s with the IOPS that needs,
    encrypted, deleted with the instance (a stop keeps it), and no finding of the gp3 rules."""
    templates = prod_with_idle_stop.of_type(TEMPLATE)
    assert templates
    expected = stage_volume.stage_volume_for(LLAMA_70B, CATALOG["p4d.24xlarge"], 2, 2)
    for template in templates:
        root, stage = template.inputs["blockDeviceMappings"]
        assert root["ebs"]["volumeSize"] == stack_config("prod").get("vllm-cluster:rootVolumeGiB", 200)
        assert stage == {
            "deviceName": "/dev/sdf",
            "ebs": {
                "volumeType": "gp3",
                "volumeSize": expected.size_gib,
                "iops": 8000,
                "throughput": 2000,
                "encrypted": "true",
                "deleteOnTermination": "true",
            },
        }
    contract = aws_contract.check(templates)
    assert [f for f in contract.errors + contract.warnings if f.rule.startswith("gp3")] == []


def test_without_the_stage_volume_the_template_maps_the_root_alone():
    run = run_stack("prod")
    assert run.error is None, run.error
    assert [len(t.inputs["blockDeviceMappings"]) for t in run.of_type(TEMPLATE)] == [1]


def test_the_node_is_told_where_to_mount_the_stage_volume():
    from tests.test_bootstrap import boot, parse_env

    with_volume = parse_env(bootstrap.cluster_env(boot(1, stage_volume=True)))
    assert with_volume["STAGE_VOLUME_MOUNT"] == stage_volume.STAGE_VOLUME_MOUNT
    assert with_volume["STAGE_VOLUME_LABEL"] == "vllm-stage"
    assert parse_env(bootstrap.cluster_env(boot(1)))["STAGE_VOLUME_MOUNT"] == ""


def test_turning_idle_stop_on_with_auto_adds_the_volume_to_the_launch_template(prod_with_idle_stop):
    """What the README warns of: the template's new version replaces the GPU nodes (their
    stage then lands on the volume); stageVolume instance-store keeps them
    (tests/test_idle_stop.py: only in-place changes)."""
    never = run_stack("prod")
    assert never.error is None, never.error
    before = never.of_type(TEMPLATE)[0].inputs["blockDeviceMappings"]
    after = prod_with_idle_stop.of_type(TEMPLATE)[0].inputs["blockDeviceMappings"]
    assert after[:1] == before and len(after) == 2
