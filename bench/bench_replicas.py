"""Capacity of the gang pool on the local fleet, measured with vLLM's own benchmark
client (`vllm bench serve`): one gang and two, each loaded up to the concurrency where
its throughput stops rising. One bring-up of two gangs of one node each
(localhosts/cluster.py: the program's real user data and remote commands, the real
vLLM engine, its CPU build); the one-gang figures are taken with gang 1 drained from
the gateway's pool (`vllm-cluster-gateway drain`, as a rolling update does), so both
come from the same hosts, engines and gateway.

    make bench-replicas    (or: venv/bin/python bench/bench_replicas.py [--concurrency 1 4 16 64 256 512] [--seconds 20]
                            [--gang-share 0.7])

The client is the one the community compares serving systems with: streaming chat
completions (the tiny test model has a chat template, tests/tiny_model.py), its random
dataset with a fixed seed (INPUT_TOKENS in, OUTPUT_TOKENS out, end-of-sequence
ignored), a closed loop of N requests in flight (`--max-concurrency`), run from the
fleet's engine environment (localhosts/fleet.py fleet_venv), which has the same vLLM
as the nodes. It reads the API key from OPENAI_API_KEY (vllm/benchmarks/lib/
endpoint_request_func.py, _get_headers) and trusts the gateway's certificate through
SSL_CERT_FILE (aiohttp's verified context is ssl.create_default_context()), so
neither is on a command line. The engines serve with vLLM's default batch: the fleet
tests' `--max-num-seqs=2` (a full engine on demand, for the watchdog tests) is not
what a stack runs, and would cap every gang at two sequences. The gateway's per-client
rate limit is off (apiRateLimitPerSecond 0): the client's one address stands for many
clients, and the default of 20 a second capped the earlier bench's figures at about 20 req/s.

Per pool size the sweep goes up the concurrency levels until one adds less than
RISE_FACTOR to the best throughput so far; the best point is the saturated one. During
each run the CPU time of every process is read from /proc: each gang's host (its
network namespace), the gateway's, the client's, and the rest of the machine. On this
machine each node host has one core of its own (as each EC2 instance has its GPUs),
capped at --gang-share of it (GANG_SHARE) so that the client and the gateway, which
share those cores, find room beside two busy engines: where a gang host did not get its
share while the machine was busy, or the client used a whole core, the machine or the
client is the limit, not the gangs, and the summary says so instead of a ratio.

Then the same client, from the gateway's network namespace (the only address the
heads' firewall admits besides the gang's), once through the gateway's TLS endpoint
and once at the head's vLLM directly (with the heads' own key, read from the head),
at the one-gang saturated concurrency: what nginx costs.

The same pair of runs at 256 and 1,000 in flight (GATEWAY_SHARE_CONCURRENCIES): the load
a gang's full batch and the gateway's stream capacity ask of nginx, with the requests that
failed through it and where its cost goes (gateway_cpu_line: nginx's cores, and the share
with the engine's CPU evened out, since here nginx and the engine share two cores).

Needs what the fleet needs (root, systemd-nspawn, debootstrap). Ends with a
`gateway: X of direct throughput, TTFT +Y ms` and a `gateway at concurrency C: ...` line
per concurrency, and then the line
`replicas: 1 gang A req/s, 2 gangs B req/s, ratio R (saturated at concurrency C1, C2)`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.bootstrap import CONFIG_DIR, GATEWAY_COMMAND  # noqa: E402
from components.ports import VLLM_API  # noqa: E402
from localhosts.cluster import KV_CACHE_BYTES, serving_cluster, tiny_model  # noqa: E402
from localhosts.fleet import Fleet, fleet_venv, why_no_fleet  # noqa: E402

# A fixed workload: the random dataset's prompts and lengths follow from these alone.
INPUT_TOKENS = 128
OUTPUT_TOKENS = 64
SEED = 0
# Up to four times vLLM's default batch on its CPU platform (max_num_seqs 128 for the API
# server, vllm/engine/arg_utils.py): at 256 two gangs' batches are just full and one
# gang's queue; a pool saturates only once requests queue, so 512 is the step that shows
# whether two gangs stopped rising (2026-12-06: both pools still rose by 11-24% from 64
# to 256).
CONCURRENCY_LEVELS = (1, 4, 16, 64, 256, 512)
# A step of the sweep that adds less than this to the best throughput so far ends it:
# more requests in flight only queue.
RISE_FACTOR = 1.10
# At least this many requests per slot of concurrency in a run, so the ramp-up and the
# tail, where fewer are in flight, are a small part of it.
ROUNDS_PER_RUN = 4
# A process group that used this share of what it may use or more had all the CPU it
# could get (a node host is pinned to one core and capped at GANG_SHARE of it; the client
# is one asyncio process).
FULL_CORE = 0.9
# Each gang host's cap, in cores (a CPU cgroup's quota over its period). vLLM's CPU
# engine keeps a core full while it serves, so uncapped, two gang hosts want both of this
# machine's cores, and the client and the gateway take theirs from the engines: the
# two-gang figure then measures the machine, not the pool. Capped, two gangs take 1.4
# cores and leave the rest to the client and the gateway (0.47 of a core at 256 in flight
# to two gangs, measured with this bench on 2026-12-06, when a cap of 0.8 still left the
# machine the limit), and a gang host at its cap is the limit at either pool size, so the
# ratio compares like with like.
GANG_SHARE = 0.7
CPU_PERIOD_US = 100_000
# The machine counts as busy with this share of all its cores in use.
BUSY_MACHINE = 0.9
# What `vllm bench serve` prints as its measured run starts and once it is over
# (vllm/benchmarks/serve.py): the CPU is read between the two.
# Runs at the gateway and at the head, each, taken in turns.
PAIR_ROUNDS = 2
# Besides the one-gang saturated concurrency, the gateway's cost is measured at these: a
# full batch of a GPU gang at vLLM's default (256, max_num_seqs on most GPUs) and the
# 1,000 streams in flight that Debian's nginx defaults reset (issue 48).
GATEWAY_SHARE_CONCURRENCIES = (256, 1000)
GATEWAY_SHARE_ROUNDS = 2
RUN_STARTS = "Starting main benchmark run..."
RUN_ENDS = "Serving Benchmark Result"
CLIENT = "client"
GATEWAY = "gateway"
OTHER = "other"


def gang_group(gang: int) -> str:
    return f"gang{gang} host"


# --- pure logic ------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """One run of the client at one concurrency: what vLLM's result JSON says, and the
    cores each process group used while it ran."""

    concurrency: int
    completed: int
    failed: int
    request_rate: float  # req/s
    output_rate: float  # output tok/s
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    cpu: Mapping[str, float] = field(default_factory=dict)


RESULT_KEYS = {
    "concurrency": "max_concurrency",
    "completed": "completed",
    "failed": "failed",
    "request_rate": "request_throughput",
    "output_rate": "output_throughput",
    "ttft_p50_ms": "p50_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "itl_p50_ms": "p50_itl_ms",
    "itl_p99_ms": "p99_itl_ms",
}


def point_from_result(result: Mapping, cpu: Mapping[str, float] | None = None) -> Point:
    """A Point from `vllm bench serve --save-result`'s JSON, run with
    `--percentile-metrics ttft,itl --metric-percentiles 50,99`."""
    missing = [key for key in RESULT_KEYS.values() if result.get(key) is None]
    if missing:
        raise ValueError(
            f"vllm bench serve's result has no {', '.join(missing)}: run it with --max-concurrency, "
            "--percentile-metrics ttft,itl and --metric-percentiles 50,99"
        )
    values = {name: result[key] for name, key in RESULT_KEYS.items()}
    for name in ("concurrency", "completed", "failed"):
        values[name] = int(values[name])
    return Point(**values, cpu=dict(cpu or {}))


def saturated(points: list[Point], rise: float = RISE_FACTOR) -> Point | None:
    """The saturated point of a sweep in rising concurrency: once the last step added less
    than `rise` to the best throughput before it, the best point; None while it still rises."""
    if len(points) < 2:
        return None
    best_before = max(points[:-1], key=lambda p: p.request_rate)
    if points[-1].request_rate >= best_before.request_rate * rise:
        return None
    return max(points, key=lambda p: p.request_rate)


@dataclass(frozen=True)
class Sweep:
    """A pool size's sweep: its saturated point, or its best one if it still rose at the end."""

    best: Point
    saturated: bool


def prompts_for(concurrency: int, best_rate: float, seconds: float, rounds: int = ROUNDS_PER_RUN) -> int:
    """Requests for a run at `concurrency`: about `seconds` at the best throughput seen so
    far, and at least `rounds` per slot."""
    return max(rounds * concurrency, math.ceil(best_rate * seconds))


def process_ticks(stat: str) -> int:
    """utime + stime (clock ticks, every thread) from /proc/PID/stat; the name in
    parentheses may hold spaces and parentheses, so fields are counted after the last ')'."""
    fields = stat[stat.rindex(")") + 2 :].split()
    # proc(5): utime and stime are fields 14 and 15; after the name, state is field 3.
    return int(fields[11]) + int(fields[12])


def machine_ticks(stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of every core from /proc/stat's first line; idle and
    iowait are not busy, guest time is already in user (proc(5))."""
    name, *numbers = stat.splitlines()[0].split()
    if name != "cpu":
        raise ValueError(f"/proc/stat does not start with the cpu line: {name!r}")
    ticks = [int(n) for n in numbers[:8]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


@dataclass(frozen=True)
class CpuSnapshot:
    at: float  # time.monotonic()
    machine_busy: int
    per_pid: Mapping[int, int]  # ticks
    groups: Mapping[str, frozenset[int]]


def cores_used(before: CpuSnapshot, after: CpuSnapshot, ticks_per_second: float) -> dict[str, float]:
    """Cores each group used between the snapshots (a process born in between counts from
    its birth, one that ended in between is lost), the rest of the machine as OTHER, and
    the machine as a whole as "machine"."""
    seconds = after.at - before.at
    if seconds <= 0:
        raise ValueError("the CPU snapshots are not in order")
    used = {}
    for group, pids in after.groups.items():
        ticks = sum(after.per_pid[pid] - before.per_pid.get(pid, 0) for pid in pids if pid in after.per_pid)
        used[group] = ticks / ticks_per_second / seconds
    machine = (after.machine_busy - before.machine_busy) / ticks_per_second / seconds
    used[OTHER] = max(0.0, machine - sum(used.values()))
    used["machine"] = machine
    return used


def limit_of(cpu: Mapping[str, float], serving_gangs: int, cores: int, gang_share: float = 1.0) -> str:
    """What held the throughput at a saturated point, from its CPU figures: the load
    generator ("client": its one process had a whole core), the gangs ("engines": each
    serving gang's host had all of its share of a core, `gang_share`), the machine
    ("machine": its cores were busy and a gang host did not get its share), or none of
    these ("not the CPU")."""
    if cpu[CLIENT] >= FULL_CORE:
        return "client"
    if all(cpu[gang_group(gang)] >= FULL_CORE * gang_share for gang in range(serving_gangs)):
        return "engines"
    if cpu["machine"] >= BUSY_MACHINE * cores:
        return "machine"
    return "not the CPU"


def cpu_figures(cpu: Mapping[str, float], cores: int) -> str:
    groups = ", ".join(f"{name} {cpu[name]:.2f}" for name in cpu if name != "machine")
    return f"{groups}; machine {cpu['machine']:.2f} of {cores}"


def pool_line(gangs: int, sweep: Sweep, cores: int, gang_share: float = 1.0) -> str:
    point = sweep.best
    state = "saturated at" if sweep.saturated else "still rising, best at"
    return (
        f"{gangs} gang{'s' if gangs > 1 else ''}: {state} concurrency {point.concurrency}: "
        f"{point.request_rate:.2f} req/s, {point.output_rate:.0f} output tok/s, "
        f"TTFT p50 {point.ttft_p50_ms:.1f} ms p99 {point.ttft_p99_ms:.1f} ms, "
        f"ITL p50 {point.itl_p50_ms:.1f} ms p99 {point.itl_p99_ms:.1f} ms, {point.failed} failed; "
        f"limit: {limit_of(point.cpu, gangs, cores, gang_share)}; cores used: {cpu_figures(point.cpu, cores)}"
    )


LIMIT_WORDS = {
    "client": "the client (one process) used a whole core",
    "machine": "the machine's cores were busy and a gang host did not get its share",
    "not the CPU": "no CPU was full (a limit elsewhere: the network, nginx, the engine's batch)",
}


def replicas_line(one: Sweep, two: Sweep, cores: int, gang_share: float = 1.0) -> str:
    """The summary: both saturated throughputs and their ratio where both sweeps saturated
    and the gangs were the limit at both pool sizes; otherwise the best figures and why
    they give no ratio (still rising, or the client or the machine the limit), instead of a
    ratio that means nothing."""
    head = f"replicas: 1 gang {one.best.request_rate:.2f} req/s, 2 gangs {two.best.request_rate:.2f} req/s"
    reasons = []
    for gangs, sweep in ((1, one), (2, two)):
        pool = f"{gangs} gang{'s' if gangs > 1 else ''}"
        if not sweep.saturated:
            reasons.append(f"{pool} still rising at concurrency {sweep.best.concurrency}")
        limit = limit_of(sweep.best.cpu, gangs, cores, gang_share)
        if limit != "engines":
            reasons.append(f"at {pool} {LIMIT_WORDS[limit]}")
    concurrencies = f"{one.best.concurrency}, {two.best.concurrency}"
    if not reasons:
        ratio = two.best.request_rate / one.best.request_rate
        return f"{head}, ratio {ratio:.2f} (saturated at concurrency {concurrencies})"
    return f"{head}, no ratio: {'; '.join(reasons)} (best at concurrency {concurrencies})"


def gateway_line(through_gateway: list[Point], direct: list[Point]) -> str:
    """nginx's cost from runs taken in turns at one concurrency: the mean throughput
    through the gateway as a share of the mean direct one, and the mean p50 TTFT added."""
    if not through_gateway or not direct:
        raise ValueError("the gateway's cost needs runs through the gateway and direct ones")

    def mean(points: list[Point], value: Callable[[Point], float]) -> float:
        return sum(value(p) for p in points) / len(points)

    rate_gateway, rate_direct = mean(through_gateway, lambda p: p.request_rate), mean(direct, lambda p: p.request_rate)
    extra = mean(through_gateway, lambda p: p.ttft_p50_ms) - mean(direct, lambda p: p.ttft_p50_ms)
    return (
        f"gateway: {rate_gateway / rate_direct:.0%} of direct throughput, TTFT {extra:+.1f} ms "
        f"(concurrency {direct[0].concurrency}, p50, mean of {len(direct)} runs each; "
        f"{rate_gateway:.2f} vs {rate_direct:.2f} req/s)"
    )


def gateway_cpu_line(through_gateway: list[Point], direct: list[Point], cores: int) -> str:
    """Where the gateway's cost goes at one concurrency, from the same runs as gateway_line:
    the requests that failed through it (a reset is one), the cores nginx used, and the
    engine's (gang 0's host) cores through the gateway and direct. On this machine nginx's
    TLS and proxying take their CPU from the same two cores as the engine; on EC2 the
    gateway is an instance of its own. So the throughput through the gateway is also given
    as if the engine had had the CPU it had in the direct runs (rate x engine cores direct /
    engine cores through the gateway, when the machine was busy): what is left of the gap is
    the gateway's own (connection setup, TLS, buffering), not this machine's."""

    def mean(points: list[Point], value: Callable[[Point], float]) -> float:
        return sum(value(p) for p in points) / len(points)

    engine = gang_group(0)
    rate_gateway, rate_direct = mean(through_gateway, lambda p: p.request_rate), mean(direct, lambda p: p.request_rate)
    engine_gateway = mean(through_gateway, lambda p: p.cpu.get(engine, 0.0))
    engine_direct = mean(direct, lambda p: p.cpu.get(engine, 0.0))
    nginx = mean(through_gateway, lambda p: p.cpu.get(GATEWAY, 0.0))
    busy = mean(through_gateway, lambda p: p.cpu.get("machine", 0.0))
    failed = sum(p.failed for p in through_gateway)
    sent = sum(p.completed + p.failed for p in through_gateway)
    line = (
        f"gateway at concurrency {direct[0].concurrency}: {failed} of {sent} failed through it; nginx used "
        f"{nginx:.2f} cores, the engine {engine_gateway:.2f} through it vs {engine_direct:.2f} direct, "
        f"machine {busy:.2f} of {cores}"
    )
    if busy >= BUSY_MACHINE * cores and 0 < engine_gateway < engine_direct:
        evened = rate_gateway * engine_direct / engine_gateway / rate_direct
        line += f"; with the engine's CPU evened out: {evened:.0%} of direct (the rest of the gap is this machine's)"
    return line


def cpu_quota(share: float, period_us: int = CPU_PERIOD_US) -> int:
    """The CFS quota (µs per period) that holds a group to `share` of a core."""
    if not 0 < share <= 1:
        raise ValueError(f"--gang-share {share:g}: a gang host's share of its core is over 0 and at most 1")
    return round(share * period_us)


# --- measuring -------------------------------------------------------------------------


@dataclass
class CpuCap:
    """A CPU cgroup that holds the processes put in it to `share` of a core (cgroup v1's
    cpu controller: cpu.cfs_quota_us over cpu.cfs_period_us; v2: cpu.max), made here and
    removed again, its processes handed back to the root group, even when the bench fails.
    A process forked inside inherits its parent's group, so a host moved once stays capped."""

    name: str
    share: float
    root: Path = field(default_factory=lambda: CpuCap.controller_root())
    path: Path | None = None

    @staticmethod
    def controller_root() -> Path:
        v1 = Path("/sys/fs/cgroup/cpu")
        if (v1 / "cpu.cfs_period_us").exists():
            return v1
        v2 = Path("/sys/fs/cgroup")
        delegated = v2 / "cgroup.subtree_control"
        if delegated.exists() and "cpu" in delegated.read_text().split():
            return v2
        raise RuntimeError(
            "no CPU cgroup to cap the gang hosts with: neither cgroup v1's cpu controller at /sys/fs/cgroup/cpu "
            "nor cgroup v2's cpu in /sys/fs/cgroup/cgroup.subtree_control. Fix: run with --gang-share 1 (uncapped)"
        )

    def __enter__(self) -> "CpuCap":
        self.path = self.root / self.name
        self.path.mkdir()
        quota = cpu_quota(self.share)
        if (self.path / "cpu.cfs_quota_us").exists():
            (self.path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (self.path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        return self

    def hold(self, pids: Callable[[], list[int]]) -> None:
        """Move every process `pids()` names into the group, again until a listing finds
        none outside it (a process forked between the listing and the move stays behind)."""
        for _ in range(10):
            outside = [pid for pid in pids() if pid not in self.members()]
            if not outside:
                return
            for pid in outside:
                try:
                    (self.path / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    continue  # it exited: nothing to cap
        raise RuntimeError(f"processes keep appearing outside {self.path}")

    def members(self) -> set[int]:
        return {int(pid) for pid in (self.path / "cgroup.procs").read_text().split()}

    def __exit__(self, *exc) -> None:
        for pid in self.members():
            try:
                (self.root / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                continue  # exited meanwhile
        self.path.rmdir()


def read_ticks(pid: int) -> int | None:
    """The process's CPU ticks, or None once it has exited (its /proc entry gone)."""
    try:
        return process_ticks(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None


def descendants(pid: int) -> set[int]:
    """`pid` and every process under it, from each process's parent in /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue  # it exited while the list was read: not one of ours any more
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    found, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent and child not in found]
        found.update(children)
        frontier.extend(children)
    return found


def snapshot(groups: Mapping[str, set[int]]) -> CpuSnapshot:
    busy, _ = machine_ticks(Path("/proc/stat").read_text())
    per_pid = {}
    for pids in groups.values():
        for pid in pids:
            ticks = read_ticks(pid)
            if ticks is not None:
                per_pid[pid] = ticks
    return CpuSnapshot(time.monotonic(), busy, per_pid, {g: frozenset(p) for g, p in groups.items()})


def client_command(
    vllm: Path, base_url: str, model: str, tokenizer: Path, concurrency: int, prompts: int, results: Path, name: str
) -> list[str]:
    """`vllm bench serve` with the fixed workload: streaming chat completions of the random
    dataset (seeded), `concurrency` requests in flight, its result JSON as results/NAME.json."""
    command = [str(vllm), "bench", "serve", "--backend", "openai-chat", "--base-url", base_url]
    command += ["--endpoint", "/v1/chat/completions", "--model", model, "--tokenizer", str(tokenizer)]
    command += ["--dataset-name", "random", "--seed", str(SEED), "--ignore-eos"]
    command += ["--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS)]
    command += ["--num-prompts", str(prompts), "--max-concurrency", str(concurrency)]
    command += ["--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99", "--disable-tqdm"]
    command += ["--save-result", "--result-dir", str(results), "--result-filename", f"{name}.json"]
    return command


@dataclass
class Client:
    """`vllm bench serve` from the fleet's engine environment against one server."""

    venv: Path
    tokenizer: Path
    model: str
    workdir: Path
    # Process groups besides the client to account for: name -> its PIDs now.
    groups: Callable[[], dict[str, set[int]]]
    runs: int = 0

    def run(
        self, base_url: str, key: str, concurrency: int, prompts: int, cert: Path | None = None, netns: str = ""
    ) -> Point:
        self.runs += 1
        name = f"run{self.runs:02d}-c{concurrency}"
        command = client_command(
            self.venv / "bin" / "vllm", base_url, self.model, self.tokenizer, concurrency, prompts, self.workdir, name
        )
        if netns:
            command = ["ip", "netns", "exec", netns, *command]
        # The key and the CA in the environment, as vllm bench reads them; never in argv.
        env = {**os.environ, "OPENAI_API_KEY": key, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
        if cert is not None:
            env["SSL_CERT_FILE"] = str(cert)
        before = after = None
        with open(self.workdir / f"{name}.log", "w") as log:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=self.workdir
            )
            for line in process.stdout:
                log.write(line)
                if RUN_STARTS in line or RUN_ENDS in line:
                    groups = self.groups()
                    client = descendants(process.pid)
                    groups = {g: pids - client for g, pids in groups.items()}
                    groups[CLIENT] = client
                    if RUN_STARTS in line:
                        before = snapshot(groups)
                    else:
                        after = snapshot(groups)
            status = process.wait()
        if status != 0 or before is None or after is None:
            raise RuntimeError(f"vllm bench serve exited {status} (log: {self.workdir / f'{name}.log'})")
        result = json.loads((self.workdir / f"{name}.json").read_text())
        return point_from_result(result, cores_used(before, after, os.sysconf("SC_CLK_TCK")))


def sweep(client: Client, levels: list[int], seconds: float, print_point, **target) -> Sweep:
    """Runs at each concurrency in `levels` until the throughput stops rising."""
    points: list[Point] = []
    for concurrency in levels:
        best = max((p.request_rate for p in points), default=0.0)
        point = client.run(concurrency=concurrency, prompts=prompts_for(concurrency, best, seconds), **target)
        points.append(point)
        print_point(point)
        found = saturated(points)
        if found is not None:
            return Sweep(found, saturated=True)
    return Sweep(max(points, key=lambda p: p.request_rate), saturated=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY_LEVELS))
    parser.add_argument("--seconds", type=float, default=20, help="about how long each run takes")
    parser.add_argument(
        "--gang-share", type=float, default=GANG_SHARE, help="each gang host's cap, in cores (1: uncapped)"
    )
    args = parser.parse_args()
    cpu_quota(args.gang_share)  # refused before anything boots
    reason = why_no_fleet()
    if reason:
        print(f"cannot host the fleet: {reason}", file=sys.stderr)
        return 1
    cores = len(os.sched_getaffinity(0))
    venv, tokenizer = fleet_venv(), tiny_model()
    saturation = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as workdir:
        # The engine's KV cache size as the fleet gives it, and vLLM's default batch. No
        # per-client rate limit at the gateway (apiRateLimitPerSecond 0, the default since
        # issue 48; said here as well): a limit per address would cap the one address the
        # client sends from, which stands for many clients here.
        extra = [f"--kv-cache-memory-bytes={KV_CACHE_BYTES}"]
        with (
            serving_cluster(
                Path(workdir), nodes=1, replicas=2, vllmExtraArgs=extra, apiRateLimitPerSecond=0
            ) as cluster,
            contextlib.ExitStack() as caps,
        ):
            cluster.wait_for_completion(timeout=120)
            fleet = cluster.fleet
            if args.gang_share < 1:
                for node in fleet.nodes:
                    cap = caps.enter_context(CpuCap(f"vllm-bench-{node.name}-{os.getpid()}", args.gang_share))
                    cap.hold(lambda node=node: Fleet.processes_of(node))
                print(f"each gang host capped at {args.gang_share:g} of its core ({cap.root})", flush=True)

            def gateway(command: str) -> str:
                return fleet.ssh(fleet.gateway, f"sudo {GATEWAY_COMMAND} {command}").stdout

            def groups() -> dict[str, set[int]]:
                found = {gang_group(i): set(Fleet.processes_of(node)) for i, node in enumerate(fleet.nodes)}
                found[GATEWAY] = set(Fleet.processes_of(fleet.gateway))
                return found

            cert = Path(workdir) / "gateway-ca.pem"
            cert.write_text(cluster.run.outputs["tlsCertificate"])
            client = Client(venv, tokenizer, cluster.served_model, Path(workdir), groups)
            through_gateway = {"base_url": cluster.endpoint.removesuffix("/v1"), "key": cluster.api_key, "cert": cert}

            def show(point: Point, label: str = "") -> None:
                print(
                    f"  {label + ' ' if label else ''}concurrency {point.concurrency}: {point.request_rate:.2f} req/s, "
                    f"{point.output_rate:.0f} tok/s, TTFT p50 {point.ttft_p50_ms:.1f} ms, "
                    f"{point.completed} completed, {point.failed} failed; cores: {cpu_figures(point.cpu, cores)}",
                    flush=True,
                )

            # Both engines and the gateway warmed with the sweep's largest batches (the CPU
            # engine's first batch of a new size is slow).
            most = max(args.concurrency)
            client.run(concurrency=most, prompts=2 * most, **through_gateway)
            gateway("drain --gang gang1 --timeout 60 --wait 60")
            print(gateway("pool").strip(), flush=True)
            saturation[1] = sweep(client, args.concurrency, args.seconds, show, **through_gateway)
            print(pool_line(1, saturation[1], cores, args.gang_share), flush=True)
            # nginx's cost: the same client at the head directly and through the gateway,
            # both from the gateway's network namespace (the heads' firewall admits it).
            heads_env = fleet.ssh(fleet.nodes[0], f"sudo cat {CONFIG_DIR}/secrets/vllm-api.env").stdout
            heads_key = next(
                line.split("=", 1)[1] for line in heads_env.splitlines() if line.startswith("VLLM_API_KEY=")
            )
            rate = saturation[1].best.request_rate
            at_head = {"base_url": f"http://{fleet.nodes[0].ip}:{VLLM_API}", "key": heads_key}
            pairs = {}
            # At the saturated concurrency and at the loads the gateway must hold
            # (GATEWAY_SHARE_CONCURRENCIES), in turns, so a drift of the machine's load over
            # the runs falls on both.
            for at in sorted({saturation[1].best.concurrency, *GATEWAY_SHARE_CONCURRENCIES}):
                # Above saturation every slot past the engine's batch only queues: two rounds
                # per slot keep a run at 1,000 in flight under two minutes here.
                rounds = ROUNDS_PER_RUN if at == saturation[1].best.concurrency else GATEWAY_SHARE_ROUNDS
                pair = {"concurrency": at, "prompts": prompts_for(at, rate, args.seconds, rounds)}
                direct, proxied = pairs.setdefault(at, ([], []))
                for _ in range(PAIR_ROUNDS):
                    direct.append(client.run(**at_head, netns=fleet.gateway.netns, **pair))
                    show(direct[-1], "direct")
                    proxied.append(client.run(**through_gateway, netns=fleet.gateway.netns, **pair))
                    show(proxied[-1], "gateway")
                print(gateway_line(proxied, direct), flush=True)
                print(gateway_cpu_line(proxied, direct, cores), flush=True)
            gateway("return --gang gang1")
            print(gateway("pool").strip(), flush=True)
            saturation[2] = sweep(client, args.concurrency, args.seconds, show, **through_gateway)
            print(pool_line(2, saturation[2], cores, args.gang_share), flush=True)
    for direct, proxied in pairs.values():
        print(gateway_line(proxied, direct))
        print(gateway_cpu_line(proxied, direct, cores))
    print(replicas_line(saturation[1], saturation[2], cores, args.gang_share))
    return 0


if __name__ == "__main__":
    sys.exit(main())
