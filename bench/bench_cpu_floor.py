"""How fast could the test suite be on this machine? Runs a command (by default the
suite, as CI runs it), samples the machine's CPU time while it runs, and prints per
test module the wall time, the CPU work done (core-minutes, every process on the
machine: the test hosts' engines, Ray and nginx included) and the floor: that work
divided by the machine's cores, the least wall time any schedule of it (any order,
any parallelism) could take here.

    make bench-cpu-floor    (or: venv/bin/python bench/bench_cpu_floor.py [--interval 5] [-- COMMAND ...])

The command's output passes through; the module is read from pytest's progress lines
(`tests/test_x.py ....`), and what runs before the first one (installs, lint, the
test venv) counts as "before pytest". A run in pytest-xdist's workers (`make test`: the
fleet's beside the rest) names no module: its time is one phase, "N pytest workers";
the default command runs the suite in one process, module by module. Run it with
nothing else busy: every process on the machine counts. Ends with the line
`cpu floor: N cores, wall W min, work B core-min, floor F min`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_COMMAND = ["venv/bin/python", "-m", "pytest"]
BEFORE_PYTEST = "before pytest"
MODULE_LINE = re.compile(r"^(tests/\S+\.py) ")
# pytest-xdist's line once its workers collected (`2 workers [1650 items]`).
WORKERS_LINE = re.compile(r"^(\d+) workers \[\d+ items?\]")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot, all cores (/proc/stat)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICKS, (idle + iowait) / TICKS


def run_and_sample(command: list[str], interval: float) -> tuple[int, dict[str, list[float]]]:
    """Runs command, passing its output through; returns its exit status and, per
    module, [wall seconds, busy core-seconds]."""
    current = [BEFORE_PYTEST]
    phases: dict[str, list[float]] = {}
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def follow_output() -> None:
        # Read as it comes, not by line: pytest names a module at the start of a line
        # whose dots end it only when the module (or 80 columns of it) is done.
        line = ""
        while chunk := os.read(process.stdout.fileno(), 4096).decode(errors="replace"):
            sys.stdout.write(chunk)
            sys.stdout.flush()
            for part in re.split(r"(\n)", chunk):
                line = "" if part == "\n" else line + part
                matched = MODULE_LINE.match(line)
                if matched:
                    current[0] = matched.group(1)
                workers = WORKERS_LINE.match(line)
                if workers:
                    current[0] = f"{workers.group(1)} pytest workers"

    reader = threading.Thread(target=follow_output, daemon=True)
    reader.start()
    last_time, (last_busy, _) = time.monotonic(), cpu_seconds()
    while True:
        finished = process.poll() is not None
        if not finished:
            time.sleep(interval)
        now, (busy, _) = time.monotonic(), cpu_seconds()
        phase = phases.setdefault(current[0], [0.0, 0.0])
        phase[0] += now - last_time
        phase[1] += busy - last_busy
        last_time, last_busy = now, busy
        if finished:
            break
    reader.join(timeout=10)
    return process.returncode, phases


def report(phases: dict[str, list[float]], cores: int) -> list[str]:
    lines = [f"{'module':34s} {'wall min':>9s} {'work core-min':>14s} {'busy':>6s} {'floor min':>10s}"]
    for name, (wall, busy) in phases.items():
        share = 100 * busy / (wall * cores) if wall else 0.0
        lines.append(f"{name:34s} {wall / 60:9.1f} {busy / 60:14.1f} {share:5.0f}% {busy / cores / 60:10.1f}")
    wall, busy = sum(p[0] for p in phases.values()), sum(p[1] for p in phases.values())
    lines.append(
        f"cpu floor: {cores} cores, wall {wall / 60:.1f} min, work {busy / 60:.1f} core-min, "
        f"floor {busy / cores / 60:.1f} min"
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=5, help="seconds between CPU samples")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ... (default: the test suite)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    status, phases = run_and_sample(command or DEFAULT_COMMAND, args.interval)
    print("\n".join(report(phases, os.cpu_count() or 1)))
    return status


if __name__ == "__main__":
    sys.exit(main())
