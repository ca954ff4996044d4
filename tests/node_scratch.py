"""vllm-cluster-node and its libraries installed under a scratch root, to run the real
script by bash in a unit test: /etc/vllm-cluster, /opt/vllm-cluster, /run/vllm-cluster
and /var/lib/vllm-cluster moved there, `id` saying root, and the Python running the
tests as the node's python3."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPT = ROOT / "scripts" / "node" / "vllm-cluster-node"
LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
PYTHON_LIBRARY = ROOT / "scripts" / "lib" / "vllm_cluster_lib.py"
MOVED_PATHS = ("/etc/vllm-cluster", "/opt/vllm-cluster", "/run/vllm-cluster", "/var/lib/vllm-cluster")


def install_node_script(root: Path, node_env: str, extra_bin: dict[str, Path] | None = None) -> Path:
    """The node script under `root` with `node_env` as its /etc/vllm-cluster/node.env
    (and `extra_bin`: name -> file, more of the node's commands beside it); returns the
    script's path. `root`/bin holds `id` and `python3`: put it first on PATH."""
    install, config = root / "opt/vllm-cluster", root / "etc/vllm-cluster"
    for folder in (install / "bin", install / "lib", config, root / "run", root / "bin"):
        folder.mkdir(parents=True, exist_ok=True)
    (config / "node.env").write_text(node_env)

    def moved(text: str) -> str:
        for path in MOVED_PATHS:
            text = text.replace(path, f"{root}{path}")
        return text

    (install / "lib/vllm-cluster-lib.sh").write_text(moved(LIBRARY.read_text()))
    (install / "lib/vllm_cluster_lib.py").write_text(PYTHON_LIBRARY.read_text())
    (install / "bin/vllm-cluster-node").write_text(moved(NODE_SCRIPT.read_text()))
    for name, source in (extra_bin or {}).items():
        (install / "bin" / name).write_text(source.read_text())
    (root / "bin/id").write_text("#!/bin/sh\necho 0\n")
    (root / "bin/id").chmod(0o755)
    (root / "bin/python3").symlink_to(sys.executable)
    return install / "bin/vllm-cluster-node"
