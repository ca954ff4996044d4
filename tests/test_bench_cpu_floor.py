"""bench/bench_cpu_floor.py: the CPU work of a run, per test module, and its floor."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_cpu_floor", ROOT / "bench" / "bench_cpu_floor.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

# A "module" that pytest names before its dots, then two seconds of one busy core.
BUSY_MODULE = (
    "import time\n"
    "print('tests/test_busy.py ', end='', flush=True)\n"
    "end = time.monotonic() + 2\n"
    "while time.monotonic() < end: pass\n"
    "print('.')\n"
)


def test_the_work_of_a_module_is_counted_while_its_line_is_still_open():
    status, phases = bench.run_and_sample([sys.executable, "-c", BUSY_MODULE], interval=0.2)
    assert status == 0
    wall, busy = phases["tests/test_busy.py"]
    assert 1.5 <= wall <= 4 and busy >= 1.5  # one core busy all along (other processes may add)


def test_the_floor_is_the_work_over_the_cores():
    lines = bench.report({"before pytest": [60.0, 30.0], "tests/test_x.py": [600.0, 960.0]}, cores=2)
    assert lines[-1] == "cpu floor: 2 cores, wall 11.0 min, work 16.5 core-min, floor 8.2 min"
    assert "80%" in lines[2] and lines[2].startswith("tests/test_x.py")


# What pytest-xdist prints once its workers collected, then two seconds of one busy core.
BUSY_WORKERS = (
    "import time\n"
    "print('created: 2/2 workers')\n"
    "print('2 workers [1650 items]', flush=True)\n"
    "end = time.monotonic() + 2\n"
    "while time.monotonic() < end: pass\n"
    "print('.')\n"
)


def test_a_run_in_pytest_workers_is_counted_as_one_phase():
    status, phases = bench.run_and_sample([sys.executable, "-c", BUSY_WORKERS], interval=0.2)
    assert status == 0
    wall, busy = phases["2 pytest workers"]
    assert 1.5 <= wall <= 4 and busy >= 1.5
