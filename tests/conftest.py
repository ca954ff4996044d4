"""Puts the repository root on sys.path so tests import `components` as the program does,
runs the local fleet's tests last, and ends a run naming the tests it skipped
(tests/not_run.py)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from not_run import pytest_terminal_summary  # noqa: E402,F401  (a hook: pytest finds it here)

# The modules that boot a fleet each, in the order they run: last, after every other test.
FLEET_TESTS = ("test_fleet.py", "test_fleet_replicas.py")


def pytest_collection_modifyitems(session, config, items):
    """The fleet's tests last: they take most of a run, and the others report first."""
    fleet = sorted(
        (item for item in items if item.path.name in FLEET_TESTS), key=lambda item: FLEET_TESTS.index(item.path.name)
    )
    items[:] = [item for item in items if item.path.name not in FLEET_TESTS] + fleet


def pytest_collection_finish(session):
    """When the fleet's tests will run, its images start building now, beside the other
    tests (minutes on a new machine, mostly downloads and disk)."""
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
