"""`make local` and `make local-down` where they cannot or need not act: the whole
bring-up and teardown run in tests/test_fleet.py (its cluster is `make local`'s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = [sys.executable, str(ROOT / "tools" / "local_target.py")]


def as_nobody(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the tool as an unprivileged user")
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *TOOL, *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


def test_without_root_make_local_says_what_it_needs_and_does_nothing():
    result = as_nobody("up")
    assert result.returncode == 1
    assert "needs root" in result.stderr and "systemd-nspawn" in result.stderr and "debootstrap" in result.stderr


def test_without_root_make_local_down_says_so():
    result = as_nobody("down")
    assert result.returncode == 1 and "needs root" in result.stderr


def test_local_down_with_nothing_running_removes_nothing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("make local-down needs root")
    env = {**os.environ, "VLLM_CLUSTER_LOCAL_DIR": str(tmp_path / "local")}
    result = subprocess.run([*TOOL, "down"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and "nothing to remove" in result.stdout
    assert not (tmp_path / "local").exists()


def test_bad_replicas_are_refused_naming_the_key_before_anything_is_made(tmp_path):
    from localhosts.fleet import why_no_fleet

    if why_no_fleet():
        pytest.skip(f"the local target cannot run here: {why_no_fleet()}")
    env = {**os.environ, "VLLM_CLUSTER_LOCAL_DIR": str(tmp_path / "local")}
    result = subprocess.run([*TOOL, "up", "--replicas", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "LOCAL_REPLICAS=0" in result.stderr and "vllm-cluster:replicas" in result.stderr
    assert "Fix:" in result.stderr and "booting" not in result.stdout
    assert not (tmp_path / "local").exists()


def test_several_gangs_are_listed_with_their_nodes_and_one_gang_adds_nothing():
    sys.path[:0] = [str(ROOT / "tools")]
    import local_target

    def gang(name, *nodes):
        return {"name": name, "nodes": [{"name": n, "ip": ip} for n, ip in nodes]}

    two = {"gangs": [gang("gang0", ("head", "10.99.128.1")), gang("gang1", ("gang1-head", "10.99.128.2"))]}
    assert local_target.gang_lines(two) == [
        "Gangs behind the gateway (each its own Ray cluster and vLLM):",
        "  gang0          head 10.99.128.1",
        "  gang1          gang1-head 10.99.128.2",
    ]
    assert (
        local_target.gang_lines({"gangs": [gang("gang0", ("head", "10.99.128.1"), ("worker-1", "10.99.128.2"))]}) == []
    )
    assert local_target.gang_lines({}) == []


def test_make_local_down_stops_a_host_booted_again_after_make_local_recorded_it(tmp_path):
    """A host powered off and booted again (a reboot, an idle stop and wake) runs in a new
    nspawn whose PID `make local` never recorded. The teardown finds it by the machine
    name of its run and waits for it to exit: the old check only saw the namespace empty
    and went on while that nspawn was still exiting (CI under load: a process left)."""
    from localhosts.fleet import AdoptedProcess, Fleet

    running = Fleet(tmp_path / "fleet", 2, authorized_key="", private_key="")
    host = running.nodes[1]
    recorded = running.state()

    # A stand-in with nspawn's name and the arguments the teardown reads (-D, -M); SIGTERM
    # ends it, as it makes systemd-nspawn power its container off and exit.
    def nspawn_stand_in(machine: str) -> subprocess.Popen:
        argv = ["systemd-nspawn", "-c", "import time; time.sleep(120)", "-D", str(host.root), "-M", machine]
        return subprocess.Popen(argv, executable=sys.executable)

    rebooted = nspawn_stand_in(running.machine(host))
    other_run = nspawn_stand_in(f"{host.name}-1{running.run_id}")
    try:
        deadline = time.monotonic() + 10  # until the stand-ins' argv is in /proc
        while "-M" not in Path(f"/proc/{other_run.pid}/cmdline").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        adopted = Fleet.adopt(recorded)
        found = {h.name: h.process.pid for h in adopted.hosts if h.process is not None}
        assert found == {host.name: rebooted.pid}
        adopted.stop()
        assert AdoptedProcess.start_time(rebooted.pid) == ""  # exited (a zombie until we reap it)
        assert rebooted.wait(timeout=5) == -15
        assert other_run.poll() is None  # another run's machine of the same name is not touched
    finally:
        for process in (rebooted, other_run):
            process.kill()
            process.wait()
