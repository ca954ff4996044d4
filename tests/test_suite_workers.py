"""make test's two pytest workers (tests/conftest.py): the local fleet's tests are one unit
of work that one worker takes from the start, in file order, each fleet's module fixture
torn down before the next one's is set up (they share the bridge); every other test runs
in the other worker meanwhile. Checked on a small suite of the same shape, with the real
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


def test_the_fleets_run_in_one_worker_from_the_start_and_the_rest_beside_them(tmp_path):
    (tmp_path / "conftest.py").write_text(HOOKS)
    (tmp_path / "test_aws.py").write_text(OTHERS)
    (tmp_path / "test_fleet.py").write_text(FLEET.replace("{name}", "fleet"))
    (tmp_path / "test_fleet_replicas.py").write_text(FLEET.replace("{name}", "replicas"))
    (tmp_path / "test_zeta.py").write_text(OTHERS.replace("other", "zeta"))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    fleet = [e for e in events if e["what"].split()[0] in ("fleet", "replicas")]
    others = [e for e in events if e["what"].split()[0] in ("other", "zeta")]
    # One worker, in file order, the first fleet's fixture down before the second's is up.
    assert len({e["worker"] for e in fleet}) == 1
    assert [e["what"] for e in fleet] == [
        "fleet up",
        *(f"fleet {i}" for i in range(4)),
        "fleet down",
        "replicas up",
        *(f"replicas {i}" for i in range(4)),
        "replicas down",
    ]
    # The fleet started at once, and the other worker ran the rest while it ran.
    assert fleet[0]["at"] < min(e["at"] for e in others) + 0.5
    beside = [e for e in others if e["worker"] != fleet[0]["worker"]]
    assert len(beside) == len(others) == 24
    assert max(e["at"] for e in beside) < fleet[-1]["at"]
    # The others give the CPU way to the fleet, whose worker (and the hosts it boots) keeps
    # the default priority; lowering a niceness needs root (this test may run at 10 itself).
    assert {e["nice"] for e in others} == {10}
    assert {e["nice"] for e in fleet} == {0 if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0)}
