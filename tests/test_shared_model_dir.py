"""On hosts the user already has (config hosts), a node's setup checks modelCacheDir
before it binds it as the model cache: it must exist, root must write it, and it must be
the same directory the wheelhouse writer (gang 0's head) sees. Each refusal names the
host, the fact and the fix. The functions of scripts/node/vllm-cluster-node, run by bash
with the script library as the node runs them (the binding itself, which needs mounts,
is proven on the local hosts: tests/test_fleet.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
NODE_SCRIPT = ROOT / "scripts" / "node" / "vllm-cluster-node"


def node_function(name: str) -> str:
    """The function's definition as the node script has it."""
    found = re.search(rf"^{name}\(\) \{{\n.*?\n\}}$", NODE_SCRIPT.read_text(), re.M | re.S)
    assert found, name
    return found.group(0)


def run_setup_check(body: str, shared: Path, node: str, wait: int = 1) -> subprocess.CompletedProcess:
    script = "\n".join(
        [
            "set -euo pipefail",
            f". {LIBRARY}",
            f"readonly SHARED_DIR_WAIT_SECONDS={wait}",
            f"MODEL_CACHE_SHARED_DIR={shared}",
            f"NODE_NAME={node}",
            "WHEELHOUSE_WRITER_NODE=head",
            node_function("check_shared_dir"),
            node_function("mount_shared_dir"),
            body,
        ]
    )
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_missing_directory_is_refused_naming_the_host_the_path_and_the_fix(tmp_path):
    result = run_setup_check("mount_shared_dir", tmp_path / "not-mounted", "worker-1")
    assert result.returncode != 0
    assert "worker-1 (" in result.stderr and f"modelCacheDir {tmp_path / 'not-mounted'} does not exist" in result.stderr
    assert "Fix: mount the shared file system" in result.stderr


def test_a_directory_of_the_hosts_own_is_refused_once_the_writer_does_not_show_up(tmp_path):
    """A worker's own directory never holds the head's signature: refused after the wait,
    not an hour later in the wheelhouse or the model's parts."""
    result = run_setup_check("check_shared_dir", tmp_path, "worker-1", wait=2)
    assert result.returncode != 0
    assert f"modelCacheDir {tmp_path} is not shared with head" in result.stderr and "Fix:" in result.stderr
    # It signed the directory itself, for the others to see.
    assert (tmp_path / ".vllm-cluster-hosts" / "worker-1").read_text().strip()


def test_the_writers_signature_on_the_directory_shows_it_is_shared(tmp_path):
    head = run_setup_check("check_shared_dir", tmp_path, "head")
    assert head.returncode == 0, head.stderr
    worker = run_setup_check("check_shared_dir", tmp_path, "worker-1")
    assert worker.returncode == 0, worker.stderr
    assert f"modelCacheDir {tmp_path} is shared with head" in worker.stderr
