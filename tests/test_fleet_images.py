"""The fleet's images build in the background from the start of a run (tests/conftest.py):
whoever waits gets the build's outcome, and a run that ends early waits for the build
instead of leaving it running. The build itself is replaced here by a slow function.
`make test` runs two pytest workers that may both reach for an image no one built yet:
one builds, the other waits for it and finds it built."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from localhosts import cluster, fleet


@pytest.fixture
def fake_build(monkeypatch):
    """A build that takes 0.3 s and records that it ran, in place of the real one."""
    ran = threading.Event()

    def build() -> None:
        time.sleep(0.3)
        ran.set()

    monkeypatch.setattr(cluster, "_images", None)
    monkeypatch.setattr(cluster, "_build_images", build)
    return ran


def test_the_build_starts_once_and_waiting_returns_when_it_has_ended(fake_build):
    first = cluster.images_in_background()
    assert cluster.images_in_background() is first
    assert not fake_build.is_set()  # started in the background: the caller goes on
    cluster.wait_for_images()
    assert fake_build.is_set() and first.done() and first.result() is None


def test_a_failed_build_is_raised_to_whoever_waits_for_the_images(monkeypatch):
    def broken() -> None:
        raise RuntimeError("debootstrap exited 1")

    monkeypatch.setattr(cluster, "_images", None)
    monkeypatch.setattr(cluster, "_build_images", broken)
    with pytest.raises(RuntimeError, match="debootstrap exited 1"):
        cluster.images_in_background().result(timeout=5)
    cluster.wait_for_images()  # an ended build, even a failed one, is not waited on again


def test_without_a_build_started_there_is_nothing_to_wait_for(monkeypatch):
    monkeypatch.setattr(cluster, "_images", None)
    started = time.monotonic()
    cluster.wait_for_images()
    assert time.monotonic() - started < 0.1


# Another pytest worker building the fleet's virtualenv: it holds the item's lock, and
# marks the virtualenv complete just before it lets go.
OTHER_BUILDER = """
import sys, time
from pathlib import Path
from localhosts.fleet import building
target = Path(sys.argv[1])
with building("venv"):
    print("building", flush=True)
    time.sleep(1.5)
    target.mkdir(parents=True)
    (target / ".complete").write_text("ok")
"""


def test_a_build_another_process_has_under_way_is_waited_for_and_not_done_again(monkeypatch, tmp_path):
    monkeypatch.setattr(fleet, "CACHE_DIR", tmp_path)
    target = fleet.fleet_venv_dir()
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_BUILDER, str(target)],
        cwd=cluster.ROOT,
        env={**os.environ, "VLLM_CLUSTER_TESTBED_CACHE": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout.readline() == "building\n"
        builds = []
        monkeypatch.setattr(fleet, "fleet_wheelhouse", lambda: builds.append("wheelhouse") or tmp_path)
        monkeypatch.setattr(fleet, "_run", lambda *command: builds.append(command))
        asked = time.monotonic()
        assert fleet.fleet_venv() == target
        # It waited for the other builder (1.5 s with the lock), then had nothing to build.
        assert time.monotonic() - asked > 1.0
        assert builds == []
    finally:
        other.wait(timeout=30)
        other.stdout.close()
