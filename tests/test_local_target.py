"""`make local` and `make local-down` where they cannot or need not act: the whole
bring-up and teardown run in tests/test_fleet.py (its cluster is `make local`'s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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
