"""`scripts/vllm-cluster plan` of a warm pool (maxReplicas above replicas, issue 36): the
cost of the range (every gang on, only `replicas` on, a day's mix with --busy-hours N) by
figures worked out by hand from the catalog's price, and the time to add a gang."""

import dataclasses
from pathlib import Path

import pytest

from cli import __main__ as cli_main
from cli import plan
from cli.stack_file import read_stack
from components import idle_stop, sizing, stage_volume
from components.catalog import CATALOG
from components.gateway import GATEWAY_ROOT_GIB
from components.warm_pool_cost import WarmPoolCost, parse_busy_hours

ROOT = Path(__file__).resolve().parent.parent

# --- the pure arithmetic, by hand ----------------------------------------------------------

# Two g6.xlarge nodes a gang at the catalog's price, 3 gangs of which 1 always on; every
# node's volumes $0.02/h, the gateway, NAT gateway and EFS $0.07/h.
G6_XLARGE = 0.8048
POOL = WarmPoolCost(replicas=1, max_replicas=3, nodes=2, node_hour=G6_XLARGE, node_volumes_hour=0.02, shared_hour=0.07)


def test_the_hand_figures_use_the_catalogs_price():
    assert CATALOG["g6.xlarge"].price_per_hour_usd == G6_XLARGE
    assert sizing.HOURS_PER_MONTH == 730


def test_every_gang_on_pays_every_gangs_instances_and_volumes():
    # 0.07 + 3 gangs x 2 nodes x 0.02 + 3 x 2 x 0.8048 = 0.07 + 0.12 + 4.8288
    assert POOL.all_on_hour == pytest.approx(5.0188)
    assert POOL.month(POOL.all_on_hour) == pytest.approx(3663.724)  # x 730


def test_only_replicas_on_still_pays_the_stopped_gangs_volumes():
    # 0.07 + 0.12 (all 3 gangs' volumes) + 1 x 2 x 0.8048
    assert POOL.replicas_hour == pytest.approx(1.7996)
    assert POOL.month(POOL.replicas_hour) == pytest.approx(1313.708)
    assert POOL.gang_volumes_hour == pytest.approx(0.04)  # what one stopped gang pays


def test_replicas_0_pays_no_instance_only_the_volumes_and_the_gateway():
    asleep = dataclasses.replace(POOL, replicas=0)
    assert asleep.replicas_hour == pytest.approx(0.19)
    assert asleep.month(asleep.replicas_hour) == pytest.approx(138.7)


def test_a_days_mix_is_busy_hours_at_every_gang_and_the_rest_at_replicas():
    # (8 x 5.0188 + 16 x 1.7996) / 24 x 730 = 68.944 / 24 x 730
    assert POOL.mix_day(8) == pytest.approx(68.944)
    assert POOL.mix_month(8) == pytest.approx(2097.0467, abs=1e-4)
    assert POOL.mix_month(0) == pytest.approx(POOL.month(POOL.replicas_hour))
    assert POOL.mix_month(24) == pytest.approx(POOL.month(POOL.all_on_hour))


@pytest.mark.parametrize("text, hours", [("0", 0), ("8", 8), ("24", 24), (" 12 ", 12)])
def test_busy_hours_are_whole_hours_of_a_day(text, hours):
    assert parse_busy_hours(text) == hours


@pytest.mark.parametrize("text", ["25", "-1", "8.5", "eight", ""])
def test_other_busy_hours_are_refused_naming_the_flag_the_value_and_the_fix(text):
    with pytest.raises(ValueError) as refused:
        parse_busy_hours(text)
    message = str(refused.value)
    assert message.startswith(f"--busy-hours {text!r}:") and "0 to 24" in message and "Fix: --busy-hours 8" in message


def test_the_cli_refuses_busy_hours_out_of_range_before_it_plans(capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main.main(["plan", "--stack", "dev", "--busy-hours", "25"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "argument --busy-hours: --busy-hours '25': " in error and "Fix: --busy-hours 8" in error


def test_busy_hours_on_a_stack_without_warm_gangs_is_refused_naming_the_fix(capsys):
    assert cli_main.main(["plan", "--stack", "dev", "--busy-hours", "8"]) == 2
    error = capsys.readouterr().err
    assert "--busy-hours 8: stack dev has no warm gang" in error
    assert "Fix: drop --busy-hours, or pulumi config set vllm-cluster:maxReplicas 2 or more (1 always on" in error


# --- the plan of a warm pool stack ---------------------------------------------------------


def _stack_file(tmp_path, stack: str, *lines: str) -> str:
    text = (ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()
    stack_file = tmp_path / f"Pulumi.{stack}.yaml"
    stack_file.write_text(text.replace("config:\n", "config:\n" + "".join(f"  {line}\n" for line in lines), 1))
    return str(stack_file)


def _dev_1_of_2(tmp_path) -> str:
    return _stack_file(tmp_path, "dev", "vllm-cluster:replicas: 1", "vllm-cluster:maxReplicas: 2")


def test_the_range_is_priced_as_idle_stop_prices_the_same_gangs(tmp_path):
    """All on is what an hour of both gangs costs without idle stop; replicas on is both
    gangs stopped (idle stop's figure, their EBS still billed) plus one gang's instances."""
    stack_file = _dev_1_of_2(tmp_path)
    spec = read_stack("dev", stack_file).spec
    document = plan.build_plan("dev", stack_file=stack_file, busy_hours=8)
    w = document["warmPool"]
    both = idle_stop.idle_hour(
        spec.instance, 2, spec.gateway_instance_type, document["weightsGB"], spec.root_volume_gib, GATEWAY_ROOT_GIB
    )
    assert (w["replicas"], w["maxReplicas"], w["nodesPerGang"]) == (1, 2, 1)
    assert w["allOn"]["hourUsd"] == pytest.approx(both.without_stop, abs=1e-4)
    assert w["replicasOn"]["hourUsd"] == pytest.approx(both.with_stop + G6_XLARGE, abs=1e-4)
    assert w["stoppedGangHourUsd"] == pytest.approx(200 * 0.08 / 730, abs=1e-4)  # dev: 200 GiB root, no stage volume
    # 8 h at both gangs, 16 h at one, through 730 h.
    expected = (8 * w["allOn"]["hourUsd"] + 16 * w["replicasOn"]["hourUsd"]) / 24 * 730
    assert w["busyHours"] == 8 and w["mixMonthUsd"] == pytest.approx(expected, abs=0.01)


def test_adding_a_gang_takes_the_scale_out_hold_and_a_wake(tmp_path):
    stack_file = _dev_1_of_2(tmp_path)
    spec = read_stack("dev", stack_file).spec
    w = plan.build_plan("dev", stack_file=stack_file)["warmPool"]
    wake = idle_stop.expected_wake_seconds(spec.model, spec.instance, spec.nodes, None, spec.on_stage_volume)
    assert w["wakeSeconds"] == wake and w["scaleOutHoldSeconds"] == idle_stop.SCALE_OUT_HOLD_SECONDS
    assert w["addGangSeconds"] == wake + idle_stop.SCALE_OUT_HOLD_SECONDS
    assert [t["term"] for t in w["wake"]] == [t["term"] for t in plan.build_plan("dev")["idleStop"]["wake"]]


def test_the_printed_plan_of_1_of_2_gangs(tmp_path, capsys):
    stack_file = _dev_1_of_2(tmp_path)
    assert cli_main.main(["plan", "--stack", "dev", "--stack-file", stack_file, "--busy-hours", "8"]) == 0
    printed = capsys.readouterr().out
    w = plan.build_plan("dev", stack_file=stack_file, busy_hours=8)["warmPool"]
    section = printed[printed.index("\nWarm pool") + 1 :].split("\n\n")[0].splitlines()
    assert section[0].startswith("Warm pool (maxReplicas 2, replicas 1: 1 gang always on, 1 warm: kept stopped")
    assert section[1].startswith(f"  all on         ${w['allOn']['hourUsd']:.4f}/h, ${w['allOn']['monthUsd']:,.2f}")
    assert section[2].startswith(f"  replicas on    ${w['replicasOn']['hourUsd']:.4f}/h")
    assert f"a stopped gang still pays its EBS, ${w['stoppedGangHourUsd']:.4f}/h (1 x 200 GiB root" in section[2]
    assert section[3] == (
        f"  busy 8 h/day   ${w['mixMonthUsd']:,.2f}/month: 8 h a day at 2 gangs, 16 h at 1 (--busy-hours 8)"
    )
    assert section[4].startswith(f"  add a gang     ~{w['addGangSeconds']} s") and "instance start 180 s" in section[4]
    assert section[5] == "  a month        730 h (as every monthly figure of the plan)"
    # The section sits after idle stop's, whose wake terms it sums.
    assert printed.index("\nIdle stop") < printed.index("\nWarm pool") < printed.index("\nMetrics on the gateway")


def test_without_busy_hours_the_plan_says_how_to_ask_for_a_days_mix(tmp_path):
    printed = plan.render(plan.build_plan("dev", stack_file=_dev_1_of_2(tmp_path)))
    assert (
        "  a day's mix    scripts/vllm-cluster plan --stack dev --busy-hours N (0-24): N hours a day at 2 gangs, "
        "the rest at 1, per month\n"
    ) in printed


def test_replicas_0_prices_no_gang_on_and_says_the_first_request_waits_a_wake(tmp_path):
    """replicas 0 (every gang may sleep), read from a stack file as the planner reads it."""
    stack_file = _stack_file(tmp_path, "dev", "vllm-cluster:replicas: 0", "vllm-cluster:maxReplicas: 2")
    document = plan.build_plan("dev", stack_file=stack_file)
    w = document["warmPool"]
    assert w["replicasOn"]["gangs"] == 0
    assert w["replicasOn"]["hourUsd"] == pytest.approx(w["sharedHourUsd"] + 2 * w["stoppedGangHourUsd"], abs=1e-4)
    printed = "\n".join(plan._warm_pool_lines(document))
    assert "  replicas on    $" in printed and "no gang on, GPU instances $0 + every gang's EBS" in printed
    assert (
        f"  first gang     ~{w['wakeSeconds']} s ({w['wakeSeconds'] / 60:.1f} min): with replicas 0 the first "
        "request wakes one gang at once; the gateway answers 503 with Retry-After: 30 until it serves"
    ) in printed


def test_a_stage_volume_is_part_of_what_a_stopped_gang_pays():
    spec = read_stack("dev").spec
    spec = dataclasses.replace(spec, replicas=1, max_replicas=3, stage_volume=stage_volume.STAGE_VOLUME_EBS)
    w = plan._warm_pool(spec, 3.1, None)
    volume = stage_volume.stage_volume_for(spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
    assert w["stoppedGangHourUsd"] == pytest.approx(spec.nodes * (200 * 0.08 / 730 + volume.hour_usd), abs=1e-4)
    assert w["stageVolumeGiBPerNode"] == volume.size_gib
    lines = plan._warm_pool_lines({"stack": "dev", "cluster": {"instanceType": "g6.xlarge"}, "warmPool": w})
    assert f"(1 x 200 GiB root + {volume.size_gib} GiB stage volume, billed stopped or not)" in "\n".join(lines)


@pytest.mark.parametrize("stack", ["dev", "prod", "h100", "own-hosts"])
def test_a_stack_without_warm_gangs_has_no_warm_pool_section(stack):
    document = plan.build_plan(stack)
    assert document["warmPool"] is None and "Warm pool" not in plan.render(document)
