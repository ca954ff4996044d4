"""bench/bench_replicas.py: reading vLLM's benchmark results, finding where a sweep
saturates, accounting the CPU of each process, and the summary lines built from them."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_replicas", ROOT / "bench" / "bench_replicas.py")
bench = importlib.util.module_from_spec(spec)
# Registered before it runs: its dataclasses look their module up by name.
sys.modules[spec.name] = bench
spec.loader.exec_module(bench)

CORES = 2


def result(concurrency=16, completed=200, failed=0, rate=10.0, tokens=640.0, ttft=(40.0, 90.0), itl=(5.0, 20.0)):
    """What `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py), the keys the bench reads."""
    return {
        "max_concurrency": concurrency,
        "completed": completed,
        "failed": failed,
        "request_throughput": rate,
        "output_throughput": tokens,
        "p50_ttft_ms": ttft[0],
        "p99_ttft_ms": ttft[1],
        "p50_itl_ms": itl[0],
        "p99_itl_ms": itl[1],
        "mean_ttft_ms": 999.0,
        "median_ttft_ms": 998.0,
    }


def cpu(gang0=0.95, gang1=0.0, gateway=0.2, client=0.3, machine=1.5):
    return {
        bench.gang_group(0): gang0,
        bench.gang_group(1): gang1,
        bench.GATEWAY: gateway,
        bench.CLIENT: client,
        bench.OTHER: 0.05,
        "machine": machine,
    }


def point(concurrency, rate, **kw):
    return bench.point_from_result(result(concurrency=concurrency, rate=rate), kw.get("cpu", cpu()))


# --- vLLM's result JSON -------------------------------------------------------------------


def test_a_point_takes_the_percentiles_and_throughputs_from_vllms_result():
    found = bench.point_from_result(result(concurrency=4, completed=64, failed=2, rate=7.5, tokens=480.0))
    assert (found.concurrency, found.completed, found.failed) == (4, 64, 2)
    assert (found.request_rate, found.output_rate) == (7.5, 480.0)
    # p50 is the 50th percentile the run asked for, not the mean or vLLM's median key.
    assert (found.ttft_p50_ms, found.ttft_p99_ms, found.itl_p50_ms, found.itl_p99_ms) == (40.0, 90.0, 5.0, 20.0)


def test_a_result_without_the_asked_percentiles_names_the_flag_that_gives_them():
    partial = result()
    del partial["p50_itl_ms"]
    with pytest.raises(ValueError, match=r"p50_itl_ms.*--metric-percentiles 50,99"):
        bench.point_from_result(partial)


# --- the sweep --------------------------------------------------------------------------


def test_a_sweep_that_still_rises_is_not_saturated():
    assert bench.saturated([point(1, 2.0)]) is None
    assert bench.saturated([point(1, 2.0), point(4, 7.0), point(16, 12.0)]) is None


def test_a_sweep_saturates_at_its_best_point_once_a_step_adds_less_than_the_rise():
    # 16 -> 64 adds 5%: saturated, and the best point is the one reported.
    sweep = [point(1, 2.0), point(4, 7.0), point(16, 12.0), point(64, 12.6)]
    assert bench.saturated(sweep).concurrency == 64
    # Throughput that falls past the knee: the knee.
    sweep = [point(1, 2.0), point(4, 7.0), point(16, 12.0), point(64, 9.0)]
    assert bench.saturated(sweep).concurrency == 16


def test_a_step_is_compared_with_the_best_before_it_not_only_the_last():
    # 4 was a dip; 16 is below 1's best by more than the rise allows to count as rising.
    sweep = [point(1, 10.0), point(4, 6.0), point(16, 10.5)]
    assert bench.saturated(sweep).concurrency == 16


def test_each_run_lasts_about_the_asked_seconds_with_enough_rounds_per_slot():
    assert bench.prompts_for(1, 0.0, 20) == bench.ROUNDS_PER_RUN
    assert bench.prompts_for(4, 10.0, 20) == 200
    assert bench.prompts_for(64, 10.0, 20) == 64 * bench.ROUNDS_PER_RUN


def test_the_sweep_stops_at_saturation_and_sizes_each_run_from_the_best_rate():
    rates = {1: 2.0, 4: 7.0, 16: 7.2, 64: 30.0}
    asked = []

    class ScriptedClient:
        def run(self, concurrency, prompts, **target):
            asked.append((concurrency, prompts, target))
            return point(concurrency, rates[concurrency])

    found = bench.sweep(ScriptedClient(), [1, 4, 16, 64], 20, lambda p: None, base_url="https://gw", key="k")
    assert found.saturated and found.best.concurrency == 16
    assert [a[0] for a in asked] == [1, 4, 16], "64 runs only if 16 still rose"
    assert [a[1] for a in asked] == [bench.ROUNDS_PER_RUN, 40, 140]
    assert all(a[2] == {"base_url": "https://gw", "key": "k"} for a in asked)


# --- CPU accounting -----------------------------------------------------------------------


def test_process_ticks_are_user_plus_system_even_with_parentheses_in_the_name():
    stat = "4242 (vllm (bench) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 8 9 20 0 7 0 100 0 0"
    assert bench.process_ticks(stat) == 1234 + 567


def test_process_ticks_of_a_real_process_grow_with_its_work():
    before = bench.read_ticks(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert bench.read_ticks(os.getpid()) - before >= 0.2 * os.sysconf("SC_CLK_TCK")


def test_machine_ticks_leave_idle_and_iowait_out_of_busy():
    busy, total = bench.machine_ticks("cpu  100 10 50 1000 40 5 5 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert (busy, total) == (170, 1210)
    with pytest.raises(ValueError):
        bench.machine_ticks("intr 1 2 3\n")


def test_cores_used_per_group_and_the_rest_of_the_machine_as_other():
    groups = {"engine": frozenset({10, 11}), bench.CLIENT: frozenset({20})}
    before = bench.CpuSnapshot(at=100.0, machine_busy=1000, per_pid={10: 500, 11: 100, 20: 50}, groups=groups)
    # 10 s at 100 ticks/s; 12 was born in between (it counts whole), 11 ended (it is lost).
    groups_after = {"engine": frozenset({10, 12}), bench.CLIENT: frozenset({20})}
    after = bench.CpuSnapshot(at=110.0, machine_busy=2800, per_pid={10: 1300, 12: 100, 20: 550}, groups=groups_after)
    used = bench.cores_used(before, after, 100)
    assert used["engine"] == pytest.approx(0.9)
    assert used[bench.CLIENT] == pytest.approx(0.5)
    assert used["machine"] == pytest.approx(1.8)
    assert used[bench.OTHER] == pytest.approx(0.4)


def test_descendants_are_the_client_and_what_it_started():
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '5'])"])
    try:
        deadline = time.monotonic() + 10
        while len(found := bench.descendants(child.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in found and len(found) == 2
        assert os.getpid() not in found
    finally:
        child.kill()
        child.wait()


# --- what limited a point -----------------------------------------------------------------


def test_the_engines_are_the_limit_when_each_serving_gang_host_had_its_core():
    assert bench.limit_of(cpu(gang0=0.97, gang1=0.0), serving_gangs=1, cores=CORES) == "engines"
    assert bench.limit_of(cpu(gang0=0.97, gang1=0.93, machine=1.99), serving_gangs=2, cores=CORES) == "engines"


def test_the_machine_is_the_limit_when_it_was_busy_and_a_gang_host_went_short():
    assert bench.limit_of(cpu(gang0=0.97, gang1=0.6, machine=1.95), serving_gangs=2, cores=CORES) == "machine"


def test_the_client_is_the_limit_when_its_process_had_a_whole_core():
    assert bench.limit_of(cpu(gang0=0.7, gang1=0.7, client=0.98, machine=1.99), 2, CORES) == "client"


def test_neither_when_no_cpu_was_full():
    assert bench.limit_of(cpu(gang0=0.5, gang1=0.5, client=0.3, machine=1.3), 2, CORES) == "not the CPU"


def test_a_gang_host_at_its_cap_is_the_engines_limit_and_one_short_of_it_is_the_machines():
    """Capped at 0.8 of a core (GANG_SHARE), a gang host using 0.78 had all it may have:
    the gangs are the limit; at 0.6 with the machine full, the machine is."""
    assert bench.limit_of(cpu(gang0=0.78, gang1=0.77, machine=1.9), 2, CORES, gang_share=0.8) == "engines"
    assert bench.limit_of(cpu(gang0=0.78, gang1=0.6, machine=1.9), 2, CORES, gang_share=0.8) == "machine"
    assert bench.limit_of(cpu(gang0=0.78, gang1=0.77, machine=1.9), 2, CORES) == "machine"


def test_a_cap_outside_a_core_is_refused_naming_the_option():
    assert bench.cpu_quota(0.8) == 80_000
    for share in (0, 1.5, -0.2):
        with pytest.raises(ValueError, match=r"--gang-share"):
            bench.cpu_quota(share)


def cpu_cgroup_root():
    try:
        return bench.CpuCap.controller_root()
    except (RuntimeError, OSError):
        return None


@pytest.mark.skipif(os.geteuid() != 0 or cpu_cgroup_root() is None, reason="needs root and a CPU cgroup controller")
def test_a_cap_holds_every_process_it_is_given_and_leaves_nothing_behind():
    """The real cgroup: a process and its child are moved in, the quota is the share, and
    leaving hands them back to the root group and removes the group, even on an error."""
    child = subprocess.Popen(["sh", "-c", "sleep 60 & wait"])
    try:
        time.sleep(0.2)  # its `sleep` forked
        group = bench.descendants(child.pid)
        name = f"vllm-bench-test-{os.getpid()}"
        with pytest.raises(RuntimeError, match="the bench failed"):
            with bench.CpuCap(name, 0.25) as cap:
                cap.hold(lambda: sorted(group))
                assert cap.members() == group
                quota = cap.path / "cpu.cfs_quota_us"
                assert (
                    quota.read_text() if quota.exists() else (cap.path / "cpu.max").read_text().split()[0]
                ).strip() == "25000"
                raise RuntimeError("the bench failed")
        assert not (cap.root / name).exists()
        assert group <= {int(pid) for pid in (cap.root / "cgroup.procs").read_text().split()}
    finally:
        child.kill()
        child.wait()


# --- the summary lines --------------------------------------------------------------------


def test_a_sweep_that_rises_to_its_last_level_gives_its_best_point_unsaturated():
    class ScriptedClient:
        def run(self, concurrency, prompts, **target):
            return point(concurrency, {1: 2.0, 4: 7.0}[concurrency])

    found = bench.sweep(ScriptedClient(), [1, 4], 20, lambda p: None)
    assert not found.saturated and found.best.concurrency == 4


def saturated_at(point):
    return bench.Sweep(point, saturated=True)


def test_the_replicas_line_gives_the_ratio_and_both_concurrencies_when_the_gangs_were_the_limit():
    one = bench.point_from_result(result(concurrency=16, rate=10.0), cpu(gang0=0.98))
    two = bench.point_from_result(result(concurrency=64, rate=19.0), cpu(gang0=0.97, gang1=0.96, machine=1.99))
    assert bench.replicas_line(saturated_at(one), saturated_at(two), CORES) == (
        "replicas: 1 gang 10.00 req/s, 2 gangs 19.00 req/s, ratio 1.90 (saturated at concurrency 16, 64)"
    )


def test_the_replicas_line_gives_no_ratio_where_the_machine_was_the_limit():
    one = bench.point_from_result(result(concurrency=16, rate=10.0), cpu(gang0=0.98))
    two = bench.point_from_result(result(concurrency=16, rate=11.0), cpu(gang0=0.7, gang1=0.65, machine=1.97))
    line = bench.replicas_line(saturated_at(one), saturated_at(two), CORES)
    assert line.startswith("replicas: 1 gang 10.00 req/s, 2 gangs 11.00 req/s, no ratio")
    assert "at 2 gangs the machine's cores were busy" in line and "at 1 gang" not in line
    assert "ratio 1.10" not in line and line.endswith("(best at concurrency 16, 16)")
    assert "\n" not in line


def test_the_replicas_line_names_the_client_when_it_was_the_limit_at_one_gang():
    one = bench.point_from_result(result(concurrency=4, rate=20.0), cpu(gang0=0.6, client=0.99))
    two = bench.point_from_result(result(concurrency=4, rate=20.4), cpu(gang0=0.97, gang1=0.95, machine=1.99))
    assert "no ratio: at 1 gang the client (one process)" in bench.replicas_line(
        saturated_at(one), saturated_at(two), CORES
    )


def test_the_replicas_line_says_which_pool_did_not_saturate_and_what_limited_it():
    one = bench.point_from_result(result(concurrency=16, rate=10.0), cpu(gang0=0.98))
    two = bench.point_from_result(result(concurrency=256, rate=12.0), cpu(gang0=0.57, gang1=0.57, machine=2.0))
    assert bench.replicas_line(saturated_at(one), bench.Sweep(two, saturated=False), CORES) == (
        "replicas: 1 gang 10.00 req/s, 2 gangs 12.00 req/s, no ratio: 2 gangs still rising at concurrency 256; "
        "at 2 gangs the machine's cores were busy and a gang host did not get its share (best at concurrency 16, 256)"
    )


def test_the_pool_line_gives_the_figures_at_saturation_and_the_limit():
    one = bench.point_from_result(result(concurrency=16, rate=10.0, tokens=640.0, failed=0), cpu(gang0=0.98))
    line = bench.pool_line(1, saturated_at(one), CORES)
    assert line.startswith("1 gang: saturated at concurrency 16: 10.00 req/s, 640 output tok/s, ")
    rising = bench.pool_line(2, bench.Sweep(one, saturated=False), CORES)
    assert rising.startswith("2 gangs: still rising, best at concurrency 16: ")
    assert "TTFT p50 40.0 ms p99 90.0 ms, ITL p50 5.0 ms p99 20.0 ms, 0 failed; limit: engines" in line
    assert "gang0 host 0.98" in line and "machine 1.50 of 2" in line


def test_the_gateway_line_is_the_share_of_direct_throughput_and_the_added_ttft():
    direct = [bench.point_from_result(result(concurrency=16, rate=10.0, ttft=(40.0, 90.0)))]
    through = [bench.point_from_result(result(concurrency=16, rate=9.3, ttft=(44.5, 99.0)))]
    assert bench.gateway_line(through, direct).startswith("gateway: 93% of direct throughput, TTFT +4.5 ms ")


def test_the_gateway_line_takes_the_mean_of_the_runs_in_turns():
    direct = [point_with(rate=10.0, ttft=30.0), point_with(rate=12.0, ttft=50.0)]
    through = [point_with(rate=9.0, ttft=35.0), point_with(rate=13.0, ttft=65.0)]
    line = bench.gateway_line(through, direct)
    assert line.startswith("gateway: 100% of direct throughput, TTFT +10.0 ms (concurrency 16, p50, mean of 2 runs")
    with pytest.raises(ValueError):
        bench.gateway_line([], direct)


def test_the_gateways_cpu_line_counts_failures_and_evens_out_the_engines_cpu_on_a_busy_machine():
    direct = [point(256, 20.0, cpu=cpu(gang0=0.70, gateway=0.0, machine=1.95))]
    through = [
        bench.point_from_result(
            {**result(concurrency=256, rate=16.0, completed=990, failed=10)},
            cpu(gang0=0.56, gateway=0.40, machine=1.96),
        )
    ]
    line = bench.gateway_cpu_line(through, direct, CORES)
    assert line.startswith("gateway at concurrency 256: 10 of 1000 failed through it; nginx used 0.40 cores")
    assert "the engine 0.56 through it vs 0.70 direct" in line
    # 16 req/s with 0.56 of a core is 20 req/s with 0.70: the gap was the engine's CPU.
    assert line.endswith("with the engine's CPU evened out: 100% of direct (the rest of the gap is this machine's)")


def test_the_gateways_cpu_line_evens_out_nothing_on_a_machine_with_room():
    direct = [point(256, 20.0, cpu=cpu(gang0=0.70, machine=1.2))]
    through = [point(256, 16.0, cpu=cpu(gang0=0.56, gateway=0.4, machine=1.3))]
    assert "evened out" not in bench.gateway_cpu_line(through, direct, CORES)


def point_with(rate, ttft):
    return bench.point_from_result(result(concurrency=16, rate=rate, ttft=(ttft, ttft * 2)))


# --- the client's command -----------------------------------------------------------------

VLLM_DOUBLE = r"""#!{python}
# A test double of `vllm bench serve`: records what it was given, prints vLLM's markers,
# writes a result as vLLM's --save-result does.
import json, os, sys, time
args = sys.argv[1:]
record = {{"argv": args, "key": os.environ.get("OPENAI_API_KEY"), "ca": os.environ.get("SSL_CERT_FILE")}}
json.dump(record, open({record!r}, "w"))
print("Starting main benchmark run...", flush=True)
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
print("{{s:{{c}}^{{n}}}}".format(s=" Serving Benchmark Result ", n=50, c="="), flush=True)
out = os.path.join(args[args.index("--result-dir") + 1], args[args.index("--result-filename") + 1])
json.dump({result}, open(out, "w"))
"""


def test_the_client_gets_the_key_and_the_ca_from_its_environment_and_is_measured(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    record = tmp_path / "record.json"
    double = venv / "bin" / "vllm"
    double.write_text(VLLM_DOUBLE.format(python=sys.executable, record=str(record), result=result(concurrency=4)))
    double.chmod(0o755)
    client = bench.Client(venv, tmp_path / "tokenizer", "org/model", tmp_path, groups=lambda: {"engine": set()})
    found = client.run("https://gw.example", "secret-api-key-1", 4, 32, cert=tmp_path / "ca.pem")
    seen = json.loads(record.read_text())
    assert seen["key"] == "secret-api-key-1" and seen["ca"] == str(tmp_path / "ca.pem")
    assert not any("secret-api-key-1" in arg for arg in seen["argv"])
    assert found.concurrency == 4 and found.request_rate == 10.0
    # The double's half second of CPU, between the markers, is the client's: a share of a
    # core that only a window of over 10 s (a very busy machine) would take under 0.05, and
    # 0 if the client's process were not counted.
    assert found.cpu[bench.CLIENT] >= 0.05
    assert found.cpu["engine"] == 0.0


def fleet_vllm() -> Path:
    """The fleet's engine environment, where vLLM's benchmark client lives. On a machine that
    can host the fleet it is built here when no fleet built it yet (or waited for, while a
    fleet's worker builds it: localhosts/fleet.py building): on a fresh machine this test
    runs before the fleets' fixtures would have made it."""
    from localhosts.fleet import fleet_venv, fleet_venv_dir, why_no_fleet

    venv = fleet_venv_dir()
    if not (venv / ".complete").exists():
        reason = why_no_fleet()
        if reason is not None:
            pytest.skip(f"no fleet engine environment at {venv}, and none can be built here: {reason}")
        venv = fleet_venv()
    return venv / "bin" / "python"


def test_vllms_own_parser_takes_the_clients_command(tmp_path):
    """The flags as the installed vLLM defines them (vllm/benchmarks/serve.py add_cli_args),
    not as remembered: a renamed or removed flag fails here, not an hour into a fleet run."""
    command = bench.client_command(
        Path("vllm"), "https://gw.example", "org/model", tmp_path, 16, 128, tmp_path, "run01-c16"
    )
    assert command[1:3] == ["bench", "serve"]
    check = (
        "import json, sys\n"
        "from vllm.benchmarks.serve import add_cli_args\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = FlexibleArgumentParser()\n"
        "add_cli_args(parser)\n"
        "args = parser.parse_args(sys.argv[1:])\n"
        "print(json.dumps({k: getattr(args, k) for k in ('backend', 'endpoint', 'dataset_name', 'seed',"
        " 'random_input_len', 'random_output_len', 'ignore_eos', 'max_concurrency', 'num_prompts',"
        " 'metric_percentiles', 'percentile_metrics', 'save_result')}))\n"
    )
    done = subprocess.run([str(fleet_vllm()), "-c", check, *command[3:]], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    parsed = json.loads(done.stdout.strip().splitlines()[-1])
    assert parsed == {
        "backend": "openai-chat",
        "endpoint": "/v1/chat/completions",
        "dataset_name": "random",
        "seed": bench.SEED,
        "random_input_len": bench.INPUT_TOKENS,
        "random_output_len": bench.OUTPUT_TOKENS,
        "ignore_eos": True,
        "max_concurrency": 16,
        "num_prompts": 128,
        "metric_percentiles": "50,99",
        "percentile_metrics": "ttft,itl",
        "save_result": True,
    }
