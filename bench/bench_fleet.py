"""Bring-up time on the local fleet: from hosts started (as EC2 reports an instance
running: still booting, refusing logins for a while, the gateway's first-boot apt
holding the package lists lock) to the first successful completion through the
gateway, for 2 and 4 GPU-node hosts, running the program's real user data and
remote commands (localhosts/cluster.py) and the real vLLM engine (its CPU build,
one pipeline stage per node). Beside it, the engine's own start from its log
(process start to "Application startup complete") and the difference: what the
orchestration (boot, bootstrap, Ray, staging, waits) adds to the engine.

    make bench-fleet    (or: venv/bin/python bench/bench_fleet.py [--sizes 2 4] [--runs 1]
                         [--hosts baked unbaked])

Each size with node hosts booted from the host image, into which the node's install step
ran once per lock (localhosts/fleet.py host_image), and then from the base image, each node
installing the lock itself at setup. Needs what the fleet needs (root, systemd-nspawn,
debootstrap). Workers join in parallel, so 4 nodes should take at most 1.5 x the time of 2.
Ends, for each kind of hosts, with the line `bring-up (baked hosts): 2 nodes A s, 4 nodes B s,
ratio R` and then `overhead (baked hosts): 2 nodes X s, 4 nodes Y s`, and the setup of a node
(its longest) `setup (baked hosts): 2 nodes S s, 4 nodes T s`.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localhosts.cluster import serving_cluster  # noqa: E402
from localhosts.fleet import why_no_fleet  # noqa: E402


def bring_up(nodes: int, baked: bool) -> tuple[float, float, dict, float]:
    """(seconds to the first completion, the engine's own start, when each command finished,
    the longest node setup)."""
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as workdir:
        with serving_cluster(Path(workdir), nodes=nodes, baked_hosts=baked) as cluster:
            cluster.wait_for_completion(timeout=120)
            seconds = time.monotonic() - cluster.booted_at
            engine = cluster.engine_start_seconds()
            stages = {name: round(o.finished - cluster.booted_at, 1) for name, o in cluster.outcomes.items()}
            setup = max(o.seconds for name, o in cluster.outcomes.items() if name.startswith("vllm-setup-"))
    return seconds, engine, stages, setup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[2, 4], metavar=("SMALL", "LARGE"))
    parser.add_argument("--runs", type=int, default=1, help="bring-ups per size; the median is reported")
    parser.add_argument("--hosts", nargs="+", choices=["baked", "unbaked"], default=["baked", "unbaked"])
    args = parser.parse_args()
    reason = why_no_fleet()
    if reason:
        print(f"cannot host the fleet: {reason}", file=sys.stderr)
        return 1
    summary = []
    for hosts in args.hosts:
        medians, overheads, setups = {}, {}, {}
        for nodes in args.sizes:
            times, overhead, setup = [], [], []
            for run in range(args.runs):
                seconds, engine, stages, longest_setup = bring_up(nodes, baked=hosts == "baked")
                times.append(seconds)
                overhead.append(seconds - engine)
                setup.append(longest_setup)
                done = ", ".join(
                    f"{name.removeprefix('vllm-')} {at}" for name, at in sorted(stages.items(), key=lambda kv: kv[1])
                )
                print(
                    f"{nodes} nodes ({hosts} hosts), run {run + 1}: {seconds:.1f} s to the first completion, of "
                    f"which the engine's own start {engine:.1f} s; finished at (s): {done}",
                    flush=True,
                )
            medians[nodes], overheads[nodes] = statistics.median(times), statistics.median(overhead)
            setups[nodes] = statistics.median(setup)
        small, large = args.sizes
        summary += [
            f"bring-up ({hosts} hosts): {small} nodes {medians[small]:.1f} s, {large} nodes {medians[large]:.1f} s, "
            f"ratio {medians[large] / medians[small]:.2f}",
            f"overhead ({hosts} hosts): {small} nodes {overheads[small]:.1f} s, {large} nodes {overheads[large]:.1f} s",
            f"setup ({hosts} hosts): {small} nodes {setups[small]:.1f} s, {large} nodes {setups[large]:.1f} s",
        ]
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
