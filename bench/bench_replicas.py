"""Throughput of the gang pool on the local fleet: completions per second through the
gateway with one gang and with two, side by side in one run. One bring-up of two gangs
of one node each (localhosts/cluster.py: the program's real user data and remote
commands, the real vLLM engine, its CPU build); the one-gang figure is taken with
gang 1 drained from the gateway's pool (`vllm-cluster-gateway drain`, as a rolling
update does), so both figures come from the same hosts, engines and gateway.

    make bench-replicas    (or: venv/bin/python bench/bench_replicas.py [--clients 4] [--seconds 60])

Each client sends one completion after the other (the same prompt, a fixed number of
tokens) through the gateway's TLS endpoint, as an application would; a failed request
is counted and reported, not timed. Needs what the fleet needs (root, systemd-nspawn,
debootstrap). On this machine each node host has one core of its own (as each EC2
instance has its GPUs), so two gangs can double the throughput of one only where the
gateway and the clients, which share those cores, are not the limit.
Ends with the line `replicas: 1 gang A req/s, 2 gangs B req/s, ratio R`.
"""

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.bootstrap import GATEWAY_COMMAND  # noqa: E402
from localhosts.cluster import serving_cluster  # noqa: E402
from localhosts.fleet import why_no_fleet  # noqa: E402

MAX_TOKENS = 16


def throughput(cluster, clients: int, seconds: float) -> tuple[float, int, int]:
    """(completions per second, completed, failed) over `seconds` with `clients` in parallel."""
    completed, failed = [0], [0]
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client() -> None:
        while time.monotonic() < deadline:
            try:
                code, _ = cluster.request(
                    "/v1/completions",
                    {"model": cluster.served_model, "prompt": "Hello", "max_tokens": MAX_TOKENS, "ignore_eos": True},
                    timeout=120,
                )
            except OSError:
                code = 0
            with lock:
                if code == 200:
                    completed[0] += 1
                else:
                    failed[0] += 1

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return completed[0] / (time.monotonic() - started), completed[0], failed[0]


def gateway(cluster, command: str) -> str:
    return cluster.fleet.ssh(cluster.fleet.gateway, f"sudo {GATEWAY_COMMAND} {command}").stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4, help="requests in flight at once")
    parser.add_argument("--seconds", type=float, default=60, help="measured time per pool size")
    args = parser.parse_args()
    reason = why_no_fleet()
    if reason:
        print(f"cannot host the fleet: {reason}", file=sys.stderr)
        return 1
    rates = {}
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as workdir:
        with serving_cluster(Path(workdir), nodes=1, replicas=2) as cluster:
            cluster.wait_for_completion(timeout=120)
            throughput(cluster, args.clients, 10)  # warm both engines and the gateway's connections
            gateway(cluster, "drain --gang gang1 --timeout 60 --wait 60")
            print(gateway(cluster, "pool").strip(), flush=True)
            rates[1], done, failed = throughput(cluster, args.clients, args.seconds)
            print(f"1 gang: {done} completions in {args.seconds:g} s, {failed} failed", flush=True)
            gateway(cluster, "return --gang gang1")
            print(gateway(cluster, "pool").strip(), flush=True)
            rates[2], done, failed = throughput(cluster, args.clients, args.seconds)
            print(f"2 gangs: {done} completions in {args.seconds:g} s, {failed} failed", flush=True)
    print(f"replicas: 1 gang {rates[1]:.2f} req/s, 2 gangs {rates[2]:.2f} req/s, ratio {rates[2] / rates[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
