"""make test's three pytest workers (tests/conftest.py): each local fleet's tests are one
unit of work that a worker of its own takes from the start, in file order (the two fleets
run side by side, each on its own network); every other test runs in the third worker
meanwhile, at a lower priority. Checked on a small suite of the same shape, with the real
conftest's hooks, under the real pytest-xdist, by the order of what its tests did: no
margin of time (the third worker runs niced, and a loaded machine starves it)."""

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

# Each test and fixture appends what it did, where and when, to events.jsonl. A test waits
# for what the schedule promises runs in another worker meanwhile: in the right schedule it
# comes, however slow the machine; in a wrong one it is queued behind the test waiting for it,
# so the wait gives up (all waits at once: the first to give up leaves gave_up) and says so.
RECORD = """
import json, os, time
from pathlib import Path
import pytest

HERE = Path(__file__).parent
GIVE_UP = 120  # seconds

def record(what):
    line = {
        "what": what,
        "worker": os.environ["PYTEST_XDIST_WORKER"],
        "at": time.monotonic(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    with open(HERE / "events.jsonl", "a") as events:
        events.write(json.dumps(line) + "\\n")

def events():
    try:
        text = (HERE / "events.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\\n")]

def wait_for(what, done):
    deadline = time.monotonic() + GIVE_UP
    while not (HERE / "gave_up").exists():
        if done(events()):
            return
        if time.monotonic() > deadline:
            (HERE / "gave_up").touch()
        time.sleep(0.02)
    record(f"gave up waiting for {what}")

def fleets_up(events):
    return {e["what"] for e in events} >= {"fleet up", "replicas up"}
"""

# A fleet's last test waits for the other fleet to be up, and for a test outside both fleets
# to have run in a worker of neither: the fleets overlap, and the rest runs beside them.
FLEET = (
    RECORD
    + """
@pytest.fixture(scope="module")
def bridge():
    record("{name} up")
    yield
    record("{name} down")

def test_0(bridge):
    record("{name} 0")

def test_1(bridge):
    record("{name} 1")

def test_2(bridge):
    record("{name} 2")

def beside(events):
    fleet_workers = {e["worker"] for e in events if e["what"] in ("fleet up", "replicas up")}
    return any(e["what"].split()[0] in ("other", "zeta") and e["worker"] not in fleet_workers for e in events)

def test_3(bridge):
    wait_for("{other} up", lambda events: "{other} up" in {e["what"] for e in events})
    wait_for("a test beside the fleets", beside)
    record("{name} 3")
"""
)

# Every other test waits for both fleets to be up: they start first.
OTHERS = RECORD + "".join(
    f"def test_{i}():\n    wait_for('both fleets up', fleets_up)\n    record('other {i}')\n\n" for i in range(12)
)


def test_each_fleet_runs_in_a_worker_of_its_own_from_the_start_and_the_rest_beside_them(tmp_path):
    (tmp_path / "conftest.py").write_text(HOOKS)
    (tmp_path / "test_aws.py").write_text(OTHERS)
    (tmp_path / "test_fleet.py").write_text(FLEET.replace("{name}", "fleet").replace("{other}", "replicas"))
    (tmp_path / "test_fleet_replicas.py").write_text(FLEET.replace("{name}", "replicas").replace("{other}", "fleet"))
    (tmp_path / "test_zeta.py").write_text(OTHERS.replace("other", "zeta"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,  # a hang's guard only: a niced run on a loaded machine takes minutes
    )
    assert run.returncode == 0, run.stdout + run.stderr
    events = sorted(
        (json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()), key=lambda e: e["at"]
    )
    others = [e for e in events if e["what"].split()[0] in ("other", "zeta")]
    fleets = {name: [e for e in events if e["what"].split()[0] == name] for name in ("fleet", "replicas")}
    # Each fleet in one worker, in file order; the two in different workers.
    for name, fleet in fleets.items():
        assert len({e["worker"] for e in fleet}) == 1, fleet
        assert [e["what"] for e in fleet] == [f"{name} up", *(f"{name} {i}" for i in range(4)), f"{name} down"]
    fleet_workers = {fleet[0]["worker"] for fleet in fleets.values()}
    assert len(fleet_workers) == 2, events
    beside = [e["at"] for e in others if e["worker"] not in fleet_workers]
    assert beside, events
    for (name, fleet), other_fleet in zip(fleets.items(), reversed(fleets.values()), strict=True):
        worker = [e for e in events if e["worker"] == fleet[0]["worker"]]
        # From the start: its worker's first test is the fleet's.
        assert worker[0]["what"] == f"{name} up", worker
        # Side by side: the fleet comes up before the other one's done.
        assert fleet[0]["at"] < other_fleet[-1]["at"], events
        # The rest beside it: the third worker runs tests after it came up and before its last test.
        assert fleet[0]["at"] < max(beside), events
        assert min(beside) < fleet[-2]["at"], events
        # xdist refills a worker whose queue is down to two tests (loadscope's _reschedule): a
        # fleet's worker may take other tests, after its fleet's last one (here the fleets end
        # soon after the third worker's first test; in make test they outlast the rest).
        assert all(e["at"] > fleet[-1]["at"] for e in worker if e not in fleet), worker
    assert len(others) == 24
    assert not [e for e in events if e["what"].startswith("gave up")], events
    # The others give the CPU way to the fleets, whose workers (and the hosts they boot) keep
    # the default priority; lowering a niceness needs root (this test may run at 10 itself).
    assert {e["nice"] for e in others} == {10}
    default = 0 if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0)
    assert {e["nice"] for fleet in fleets.values() for e in fleet} == {default}
