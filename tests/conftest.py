"""Puts the repository root on sys.path so tests import `components` as the program does,
runs the local fleets' tests last (in make test's three pytest-xdist workers: each fleet
in a worker of its own, from the start), and ends a run naming the tests it skipped
(tests/not_run.py)."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from not_run import pytest_terminal_summary  # noqa: E402,F401  (a hook: pytest finds it here)

# The modules that boot a fleet each (on networks of their own: localhosts/fleet.py
# Network), in the order they run in one process: last, after every other test.
FLEET_TESTS = ("test_fleet.py", "test_fleet_replicas.py")


def pytest_collection_modifyitems(session, config, items):
    """The fleet's tests last: they take most of a run, and the others report first."""
    fleet = sorted(
        (item for item in items if item.path.name in FLEET_TESTS), key=lambda item: FLEET_TESTS.index(item.path.name)
    )
    items[:] = [item for item in items if item.path.name not in FLEET_TESTS] + fleet


def pytest_collection_finish(session):
    """When the fleet's tests will run, its images start building now, beside the other
    tests (minutes on a new machine, mostly downloads and disk). Not in make test's
    workers: there the fleets' tests start at once, their first fixtures build the images
    (one builds, the other waits: localhosts/fleet.py building), and another worker runs
    the rest beside them."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any(item.path.name in FLEET_TESTS for item in session.items):
        from localhosts.fleet import why_no_fleet

        if why_no_fleet() is None:
            from localhosts.cluster import images_in_background

            images_in_background()


def pytest_sessionfinish(session):
    """A run that ends before the fleet's tests (a failure under -x, Ctrl-C) waits for the
    images' build it started rather than leave it running."""
    if "localhosts.cluster" in sys.modules:
        sys.modules["localhosts.cluster"].wait_for_images()


# In make test's workers the fleets' tests come first: the fleets' workers are the run's
# critical path (their bring-ups and engine starts take both cores at times), and the other
# tests finish long before them either way. So the worker that runs the others yields the
# CPU to them: a niceness of 10 weighs about a tenth of the default in the kernel's scheduler,
# and holds for what that worker starts too (nginx, uvicorn, promtool). Only the priority
# changes: no test's timeout does.
OTHER_TESTS_NICENESS = 10


@pytest.hookimpl(tryfirst=True)  # before the fixtures' setup: the hosts a fleet boots inherit it
def pytest_runtest_setup(item):
    """In make test's workers: a test outside the fleet's runs at OTHER_TESTS_NICENESS, the
    fleet's (and the hosts it boots) at the default 0."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    wanted = 0 if item.path.name in FLEET_TESTS else OTHER_TESTS_NICENESS
    now = os.getpriority(os.PRIO_PROCESS, 0)
    # Lowering it needs root; without root the fleet's tests skip, and start nothing.
    if wanted != now and (wanted > now or os.geteuid() == 0):
        os.setpriority(os.PRIO_PROCESS, 0, wanted)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: unknown without it
def pytest_xdist_make_scheduler(config, log):
    """make test's workers (pytest -n 3): each fleet's tests are one unit of work, in file
    order, which a worker takes first (xdist hands out the largest units first, one a
    worker); every other test is a unit of its own for the third worker. The two fleets
    run side by side, each on its own bridge and addresses: together they keep both
    cores busier than one after the other, whose hosts often wait (on boots, timers and
    engines). (pytest-xdist's own xdist_group marks change test ids, which pytest 9.2 no
    longer lets a plugin do: pytest-xdist issue 1386.)"""
    if config.getvalue("dist") != "load":  # -n's default; another --dist asked for is kept
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EachFleetInOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0].rsplit("/", 1)[-1]
            return f"fleet {module}" if module in FLEET_TESTS else nodeid

    return EachFleetInOneWorker(config, log)
