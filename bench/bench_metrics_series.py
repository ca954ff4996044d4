"""The metric series one node gives Prometheus, measured on this machine (issue 21): what
components/prometheus_sizing.py sizes the gateway's Prometheus by.

    venv/bin/python bench/bench_metrics_series.py [--completions 8]

On loopback only, with the fleet's virtualenv (vLLM's CPU build and Ray, the local
hosts' lock: localhosts/fleet.py fleet_venv) and the tiny model (tests/tiny_model.py):
1. a Ray head as the nodes start it (scripts/node/units/ray-head.service), plus
   `--metrics-export-port` on a free port, every other port of its free too, and one
   logical GPU (the fleet's GPU-build double, tests/doubles/vllm_gpu_build, places
   vLLM's worker on Ray's GPU resource as on EC2); its dashboard agent's endpoint is
   counted once the count holds still (idle Ray). No real GPU here: Ray's per-GPU
   series (utilisation, memory) are not in the figure;
2. vLLM's OpenAI server on that Ray (`--distributed-executor-backend ray`, the serve
   arguments components/bootstrap.py vllm_serve_args gives the fleet's stack, the tiny
   model's folder and a free port in place of the head's); after a few completions
   (plain and chat, streamed and not, some cut by max_tokens, some stopped: a series
   appears only once used) its /metrics is counted, and Ray's endpoint again, which now
   also holds the engine's Ray worker.

A series is a line of the Prometheus text format that is not a comment or blank, by its
name and labels (each histogram bucket is one). Prometheus adds per target its own
(`up`, `scrape_*`): components/prometheus_sizing.py counts those, not this script.

Every process this starts is started in a session of its own and ended by its PID (the
session's processes, found by their session id, SIGTERM then SIGKILL) on the way out,
failure included. Ends with `metrics series: ray node N, vllm head M` (N: Ray's endpoint
with the engine's worker on the node; the idle figure is printed above it).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.bootstrap import serving_directory, vllm_serve_args  # noqa: E402
from components.spec import load_spec  # noqa: E402
from localhosts.cluster import MODEL, fleet_config, tiny_model  # noqa: E402
from localhosts.fleet import fleet_venv  # noqa: E402

LOOPBACK = "127.0.0.1"
# vLLM's CPU build compiles its graphs at start on 2 cores: minutes, not seconds.
VLLM_START_TIMEOUT = 600
RAY_START_TIMEOUT = 120
# Ray's agent reports its node's metrics every few seconds and a worker's once it runs:
# counted when three polls in a row agree.
SETTLE_POLLS, SETTLE_EVERY, SETTLE_TIMEOUT = 3, 5.0, 120


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def series(text: str) -> set[str]:
    """The series of one scrape in Prometheus's text format: every line that is not a
    comment or blank, by name and labels (the value and any timestamp dropped)."""
    keys = set()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keys.add(line[: line.rindex("}") + 1] if "{" in line else line.split()[0])
    return keys


def family(key: str) -> str:
    name = key.split("{", 1)[0]
    for suffix in ("_bucket", "_sum", "_count", "_created", "_total"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def scrape(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return series(response.read().decode())


def settled_count(url: str) -> set[str]:
    """The endpoint's series once the count holds still for SETTLE_POLLS polls."""
    deadline, counts, last = time.monotonic() + SETTLE_TIMEOUT, [], set()
    while time.monotonic() < deadline:
        last = scrape(url)
        counts.append(len(last))
        if len(counts) >= SETTLE_POLLS and len(set(counts[-SETTLE_POLLS:])) == 1:
            return last
        time.sleep(SETTLE_EVERY)
    print(f"  (the count at {url} did not settle in {SETTLE_TIMEOUT} s: {counts}; the last is used)")
    return last


def wait_for(url: str, timeout: float, process: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(2)
    raise RuntimeError(f"{what}: {url} did not answer within {timeout} s")


class Sessions:
    """Processes started each in a session of its own; stop() ends every process of
    those sessions by PID (Ray's raylet and workers, vLLM's engine core are children)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=log.parent
            )
        self.started.append(process)
        return process

    def pids(self) -> list[int]:
        sessions = {process.pid for process in self.started}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone since the listing
                continue
            # Field 6 is the session id; fields after the command's ")" are space separated.
            if int(stat.rsplit(")", 1)[1].split()[3]) in sessions:
                found.append(int(entry.name))
        return found

    def stop(self) -> list[int]:
        """SIGTERM to every process of the sessions, SIGKILL to what is left after 30 s;
        returns the PIDs still alive after that (none, or something is wrong)."""
        for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    continue
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self.pids():
                for process in self.started:
                    process.poll()  # reap our own children
                time.sleep(0.5)
        for process in self.started:
            process.poll()
        return self.pids()


def ray_head(sessions: Sessions, venv: Path, work: Path) -> tuple[subprocess.Popen, str, str]:
    """Ray's head as ray-head.service starts it, on loopback, every port free; returns
    (process, GCS address, metrics URL)."""
    ports = {
        name: free_port()
        for name in (
            "port",
            "dashboard-port",
            "metrics-export-port",
            "ray-client-server-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "node-manager-port",
            "object-manager-port",
        )
    }
    args = [str(venv / "bin" / "ray"), "start", "--head", "--block", f"--node-ip-address={LOOPBACK}"]
    args += [f"--dashboard-host={LOOPBACK}", "--disable-usage-stats", f"--temp-dir={work / 'ray'}", "--num-gpus=1"]
    args += [f"--{name}={port}" for name, port in ports.items()]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    process = sessions.start(args, work / "ray.log", env)
    metrics = f"http://{LOOPBACK}:{ports['metrics-export-port']}/metrics"
    wait_for(metrics, RAY_START_TIMEOUT, process, "ray start --head")
    return process, f"{LOOPBACK}:{ports['port']}", metrics


def vllm_server(
    sessions: Sessions, venv: Path, work: Path, model: Path, gcs: str
) -> tuple[subprocess.Popen, str, list[str]]:
    """vLLM's OpenAI server with the serve arguments the fleet's stack gives the head
    (the tiny model's folder for the serving directory, a free port for vLLM's)."""
    spec = load_spec(fleet_config(1), stack="bench")
    args = vllm_serve_args(spec, LOOPBACK)
    assert args[0] == serving_directory(spec)
    args[0] = str(model)
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    env = {
        **os.environ,
        "RAY_ADDRESS": gcs,
        "VLLM_HOST_IP": LOOPBACK,
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # Its compile caches in our folder, removed with it: nothing left in ~/.cache or /tmp.
        "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "TRITON_CACHE_DIR": str(work / "triton"),
    }
    process = sessions.start([str(venv / "bin" / "vllm"), "serve", *args], work / "vllm.log", env)
    base = f"http://{LOOPBACK}:{port}"
    wait_for(f"{base}/health", VLLM_START_TIMEOUT, process, "vllm serve")
    return process, base, args


def post(url: str, body: dict) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()  # a streamed answer is read to its end


def completions(base: str, count: int) -> None:
    """Plain and chat, streamed and not; max_tokens of 1 to 32 so some stop on length and
    some (the tiny model's noise reaching </s>, or a stop string) earlier."""
    for i in range(count):
        stream = i % 2 == 1
        tokens = 1 + (i * 7) % 32
        if i % 4 < 2:
            post(
                f"{base}/v1/completions",
                {"model": MODEL, "prompt": f"Count to {i}:", "max_tokens": tokens, "stream": stream, "stop": ["e"]},
            )
        else:
            messages = [{"role": "user", "content": f"Say {i} words."}]
            post(
                f"{base}/v1/chat/completions",
                {"model": MODEL, "messages": messages, "max_tokens": tokens, "stream": stream},
            )


def largest_families(keys: set[str], top: int = 8) -> str:
    counts = Counter(family(key) for key in keys)
    return ", ".join(f"{name} {n}" for name, n in counts.most_common(top))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--completions", type=int, default=8)
    options = parser.parse_args()
    venv, model = fleet_venv(), tiny_model()
    versions = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ray, vllm; print(ray.__version__, vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    print(f"ray {versions[0]}, vllm {versions[1]} ({venv}); model {model}")
    sessions = Sessions()
    work = Path(tempfile.mkdtemp(prefix="vmb-"))  # short: Ray's socket paths must fit 107 bytes
    ok = False
    try:
        started = time.monotonic()
        _ray, gcs, ray_metrics = ray_head(sessions, venv, work)
        idle = settled_count(ray_metrics)
        print(f"ray node, idle: {len(idle)} series ({largest_families(idle)})")
        _vllm, base, args = vllm_server(sessions, venv, work, model, gcs)
        print(f"vllm serve up after {time.monotonic() - started:.0f} s: vllm serve {' '.join(args)}")
        completions(base, options.completions)
        time.sleep(SETTLE_EVERY)  # the last request's histograms observed
        vllm_keys = scrape(f"{base}/metrics")
        print(f"vllm head after {options.completions} completions: {len(vllm_keys)} series")
        print(f"  largest: {largest_families(vllm_keys)}")
        ray_keys = settled_count(ray_metrics)
        print(f"ray node, serving (the engine's worker on it): {len(ray_keys)} series")
        print(f"  largest: {largest_families(ray_keys)}")
        print(f"metrics series: ray node {len(ray_keys)}, vllm head {len(vllm_keys)}")
        ok = True
    finally:
        left = sessions.stop()
        if left:
            print(f"processes still running after SIGKILL: {left}", file=sys.stderr)
            ok = False
        if ok:
            subprocess.run(["rm", "-rf", str(work)], check=False)
        else:
            print(f"logs kept in {work} (ray.log, vllm.log)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
