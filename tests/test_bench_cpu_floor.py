"""bench/bench_cpu_floor.py: the CPU work of a run, per test module, and its floor."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_cpu_floor", ROOT / "bench" / "bench_cpu_floor.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

# What runs before pytest (1.5 s asleep), what pytest prints at the start of a phase, then
# two seconds of one busy core: a module named before its dots (its line still open while it
# runs), or pytest-xdist's line once its workers collected (no module named after it).
BEFORE = "import time\ntime.sleep(1.5)\n"
BUSY = "end = time.monotonic() + 2\nwhile time.monotonic() < end: pass\nprint('.')\n"
PHASE_STARTS = {
    "tests/test_busy.py": "print('tests/test_busy.py ', end='', flush=True)\n",
    "2 pytest workers": "print('created: 2/2 workers')\nprint('2 workers [1650 items]', flush=True)\n",
}


@pytest.mark.parametrize("phase", PHASE_STARTS)
def test_the_work_of_a_phase_is_counted_from_the_line_that_starts_it(phase):
    status, phases = bench.run_and_sample([sys.executable, "-c", BEFORE + PHASE_STARTS[phase] + BUSY], interval=0.2)
    assert status == 0
    wall, busy = phases[phase]
    # Lower bounds only, each half a second or more below what a late wake-up (CI's niced
    # worker: up to 0.5 s, and a child slow to start) can take off: the time before the line
    # counts before it (counted from the start, "before pytest" would hold one sample), the
    # two busy seconds after it count to the phase (counted from the line's end, as the
    # module's dots end it, the phase would hold a sample or two) with their CPU work
    # (other processes may add).
    assert phases[bench.BEFORE_PYTEST][0] >= 0.75, phases
    assert wall >= 1.0 and busy >= 1.0, phases


def test_the_floor_is_the_work_over_the_cores():
    lines = bench.report({"before pytest": [60.0, 30.0], "tests/test_x.py": [600.0, 960.0]}, cores=2)
    assert lines[-1] == "cpu floor: 2 cores, wall 11.0 min, work 16.5 core-min, floor 8.2 min"
    assert "80%" in lines[2] and lines[2].startswith("tests/test_x.py")
