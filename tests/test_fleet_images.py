"""The fleet's images build in the background from the start of a run (tests/conftest.py):
whoever waits gets the build's outcome, and a run that ends early waits for the build
instead of leaving it running. The build itself is replaced here by a slow function."""

from __future__ import annotations

import threading
import time

import pytest

from localhosts import cluster


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
