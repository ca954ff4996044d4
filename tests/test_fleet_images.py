"""The fleet's images build in the background from the start of a run (tests/conftest.py):
whoever waits gets the build's outcome, and a run that ends early waits for the build
instead of leaving it running. The build itself is replaced here by a slow function.
`make test` runs the two fleets in two pytest workers that both reach for the images at
once on a new machine: one builds, the other waits for it and finds it built."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localhosts import cluster


class FakeBuild:
    """In place of the real build: it runs once `go` is set (or 10 s have passed), and
    records its calls and whether it ran to its end."""

    def __init__(self) -> None:
        self.go, self.ran, self.calls = threading.Event(), threading.Event(), 0

    def __call__(self) -> None:
        self.calls += 1
        if self.go.wait(10):
            self.ran.set()


@pytest.fixture
def fake_build(monkeypatch):
    build = FakeBuild()
    monkeypatch.setattr(cluster, "_images", None)
    monkeypatch.setattr(cluster, "_build_images", build)
    yield build
    build.go.set()  # no build thread left waiting


def test_the_build_starts_once_and_waiting_returns_when_it_has_ended(fake_build):
    first = cluster.images_in_background()
    assert cluster.images_in_background() is first
    # Started in the background: the caller goes on while the build waits for `go`.
    assert not first.done() and not fake_build.ran.is_set()
    threading.Timer(0.3, fake_build.go.set).start()
    cluster.wait_for_images()
    assert fake_build.ran.is_set() and first.done() and first.result() is None
    assert fake_build.calls == 1


def test_a_failed_build_is_raised_to_whoever_waits_for_the_images(monkeypatch):
    def broken() -> None:
        raise RuntimeError("debootstrap exited 1")

    monkeypatch.setattr(cluster, "_images", None)
    monkeypatch.setattr(cluster, "_build_images", broken)
    with pytest.raises(RuntimeError, match="debootstrap exited 1"):
        cluster.images_in_background().result(timeout=5)
    cluster.wait_for_images()  # an ended build, even a failed one, is not waited on again


def test_without_a_build_started_there_is_nothing_to_wait_for(fake_build, monkeypatch):
    waited = []
    monkeypatch.setattr(cluster, "wait", lambda *args, **kwargs: waited.append(args))
    started = time.monotonic()
    cluster.wait_for_images()
    assert waited == [] and fake_build.calls == 0  # no build started, none waited for
    assert time.monotonic() - started < 5


# Another pytest worker building the fleet's virtualenv: it holds the item's lock until
# 1.5 s after the waiter asked (however long that one took to start on a busy
# machine), and marks the virtualenv complete just before it lets go.
OTHER_BUILDER = """
import sys, time
from localhosts.fleet import CACHE_DIR, building, fleet_venv_dir
target = fleet_venv_dir()
with building("venv"):
    print("building", flush=True)
    while not (CACHE_DIR / "asked").exists():
        time.sleep(0.05)
    time.sleep(1.5)
    target.mkdir(parents=True)
    (target / ".complete").write_text("ok")
"""

# This worker asking for it meanwhile: any build step of its own is refused.
WAITER = """
import time
from localhosts import fleet
def refuse(*args):
    raise SystemExit(f"built again: {args}")
fleet.fleet_wheelhouse = fleet._run = refuse
asked = time.monotonic()
(fleet.CACHE_DIR / "asked").touch()
print(fleet.fleet_venv(), f"{time.monotonic() - asked:.2f}")
"""


def test_a_build_another_process_has_under_way_is_waited_for_and_not_done_again(tmp_path):
    # Both sides in processes of their own, on a cache of the test's: nothing of this
    # process's (where the real images may be building) is touched.
    run = {"cwd": cluster.ROOT, "env": {**os.environ, "VLLM_CLUSTER_TESTBED_CACHE": str(tmp_path)}, "text": True}
    other = subprocess.Popen([sys.executable, "-c", OTHER_BUILDER], stdout=subprocess.PIPE, **run)
    try:
        assert other.stdout.readline() == "building\n"
        waiter = subprocess.run([sys.executable, "-c", WAITER], capture_output=True, timeout=60, **run)
        # It waited for the other builder (1.5 s with the lock after it asked), then had nothing to build.
        assert waiter.returncode == 0, waiter.stderr
        path, waited = waiter.stdout.split()
        assert Path(path).parent == tmp_path and (Path(path) / ".complete").exists()
        assert float(waited) > 1.0
    finally:
        other.wait(timeout=30)
        other.stdout.close()


def test_a_fleet_links_the_wheelhouse_only_while_no_other_fleet_refreshes_it(tmp_path, monkeypatch):
    """Each fleet's start refreshes the cached wheelhouse (it renames files into it) and
    then links it into its own hosts' shared directory. With two fleets starting at once
    the copy listed a file the other fleet renamed away before it linked it, and `cp`
    failed the whole fleet: the copy waits for the wheelhouse's lock."""
    from localhosts import fleet

    monkeypatch.setattr(fleet, "CACHE_DIR", tmp_path / "cache")
    house = tmp_path / "cache" / "wheelhouse"
    house.mkdir(parents=True)
    (house / "old.whl").write_text("wheel")
    copy = tmp_path / "hosts" / "wheelhouse"
    copy.parent.mkdir()
    linked = threading.Event()
    linker = threading.Thread(target=lambda: (fleet.link_wheelhouse(house, copy), linked.set()))
    with fleet.building("wheelhouse"):  # the other fleet, refreshing the cache
        linker.start()
        assert not linked.wait(1.0)
        (house / "old.whl").rename(house / "new.whl")
    linker.join(timeout=10)
    assert linked.is_set() and os.listdir(copy) == ["new.whl"]
    assert (copy / "new.whl").stat().st_ino == (house / "new.whl").stat().st_ino  # hard links, no copy


def test_the_fleets_virtualenv_is_installed_byte_compiled_as_a_node_installs_it(tmp_path, monkeypatch):
    """A node's `node-env install` byte-compiles (scripts/node/node-env). The fleet's
    virtualenv did not, so the first `import vllm` of test_model_stage compiled vLLM,
    torch and transformers itself and, beside two booting fleets, passed its 300 s
    (CI, exit 2 after 2293 s)."""
    from localhosts import fleet

    monkeypatch.setattr(fleet, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(fleet, "fleet_wheelhouse", lambda: tmp_path / "wheelhouse")
    commands = []

    def run(*command):
        commands.append(command)
        if command[1] == "venv":
            Path(command[-1]).mkdir()

    monkeypatch.setattr(fleet, "_run", run)
    assert (fleet.fleet_venv() / ".complete").exists()
    sync = next(command for command in commands if command[1:3] == ("pip", "sync"))
    node_env = (cluster.ROOT / "scripts" / "node" / "node-env").read_text()
    assert '"--compile-bytecode"' in node_env  # what the node does, which the fleet follows
    assert "--compile-bytecode" in sync and "--require-hashes" in sync and "--offline" in sync
