"""make test's three pytest workers (tests/conftest.py): each local fleet's tests are one
unit of work that a worker of its own takes from the start, in file order (the two fleets
run side by side, each on its own network); every other test runs in the third worker
meanwhile, at a lower priority. Checked on a small suite of the same shape, with the real
conftest's hooks, under the real pytest-xdist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HOOKS = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("suite_conftest", {str(ROOT / "tests" / "conftest.py")!r})
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
pytest_collection_modifyitems = real.pytest_collection_modifyitems
pytest_xdist_make_scheduler = real.pytest_xdist_make_scheduler
pytest_runtest_setup = real.pytest_runtest_setup
"""

# Each test and fixture appends what it did, where and when, to events.jsonl.
RECORD = """
import json, os, time
from pathlib import Path
import pytest

def record(what):
    line = {
        "what": what,
        "worker": os.environ["PYTEST_XDIST_WORKER"],
        "at": time.monotonic(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    with open(Path(__file__).parent / "events.jsonl", "a") as events:
        events.write(json.dumps(line) + "\\n")
"""

FLEET = (
    RECORD
    + """
@pytest.fixture(scope="module")
def bridge():
    record("{name} up")
    yield
    record("{name} down")

"""
    + "".join(f"def test_{i}(bridge):\n    record('{{name}} {i}')\n    time.sleep(0.4)\n\n" for i in range(4))
)

OTHERS = RECORD + "".join(f"def test_{i}():\n    record('other {i}')\n    time.sleep(0.05)\n\n" for i in range(12))


def test_each_fleet_runs_in_a_worker_of_its_own_from_the_start_and_the_rest_beside_them(tmp_path):
    (tmp_path / "conftest.py").write_text(HOOKS)
    (tmp_path / "test_aws.py").write_text(OTHERS)
    (tmp_path / "test_fleet.py").write_text(FLEET.replace("{name}", "fleet"))
    (tmp_path / "test_fleet_replicas.py").write_text(FLEET.replace("{name}", "replicas"))
    (tmp_path / "test_zeta.py").write_text(OTHERS.replace("other", "zeta"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    others = [e for e in events if e["what"].split()[0] in ("other", "zeta")]
    fleets = {name: [e for e in events if e["what"].split()[0] == name] for name in ("fleet", "replicas")}
    # Each fleet in one worker, in file order; the two in different workers.
    for name, fleet in fleets.items():
        assert len({e["worker"] for e in fleet}) == 1, fleet
        assert [e["what"] for e in fleet] == [f"{name} up", *(f"{name} {i}" for i in range(4)), f"{name} down"]
    fleet_workers = {fleet[0]["worker"] for fleet in fleets.values()}
    assert len(fleet_workers) == 2
    # Both fleets started at once, side by side, and the third worker ran the rest meanwhile.
    first_other = min(e["at"] for e in others)
    assert all(fleet[0]["at"] < first_other + 0.5 for fleet in fleets.values())
    assert fleets["replicas"][0]["at"] < fleets["fleet"][-1]["at"]
    assert fleets["fleet"][0]["at"] < fleets["replicas"][-1]["at"]
    beside = [e for e in others if e["worker"] not in fleet_workers]
    assert max(e["at"] for e in beside) < max(fleet[-1]["at"] for fleet in fleets.values())
    # xdist refills a worker whose queue is down to two tests (loadscope's _reschedule): a
    # fleet's worker may take other tests, run after its fleet's last one (here the fleets
    # take about as long as the rest; in make test they take many times longer).
    for fleet in fleets.values():
        after = [e for e in others if e["worker"] == fleet[0]["worker"]]
        assert all(e["at"] > fleet[-2]["at"] for e in after), after
    assert len(others) == 24
    # The others give the CPU way to the fleets, whose workers (and the hosts they boot) keep
    # the default priority; lowering a niceness needs root (this test may run at 10 itself).
    assert {e["nice"] for e in others} == {10}
    default = 0 if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0)
    assert {e["nice"] for fleet in fleets.values() for e in fleet} == {default}
