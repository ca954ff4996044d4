"""The local node hosts' image (localhosts/fleet.py host_image): the node's own install
step run once per lock into a layer the node hosts boot from. Its name holds everything
the bake depends on, so a new lock or a changed install script bakes a new image, and the
same inputs find the cached one; the bake runs the function the node's setup runs.
The fleet's tests show the hosts booted from it (tests/test_fleet.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from test_bootstrap import boot
from test_host_library import shell_functions

from components import bootstrap, node_env
from localhosts import fleet

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPT = ROOT / "scripts" / "node" / "vllm-cluster-node"
ROOTFS = Path("/var/cache/vllm-cluster-testbed/rootfs-bookworm-0123456789ab")


@pytest.fixture
def bake_inputs(tmp_path, monkeypatch):
    """Copies of the lock and of every file the bake runs, which a test may change."""
    locks = tmp_path / "locks"
    locks.mkdir()
    lock = locks / node_env.local_host().lock_path.name
    shutil.copy(node_env.local_host().lock_path, lock)
    monkeypatch.setattr(node_env, "LOCK_DIR", locks)
    files = {}
    for path, (source, mode) in fleet.BAKE_FILES.items():
        copy = tmp_path / "scripts" / path.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, copy)
        files[path] = (copy, mode)
    monkeypatch.setattr(fleet, "BAKE_FILES", files)
    return lock, files


def test_the_same_lock_and_scripts_find_the_same_image(bake_inputs):
    assert fleet.host_image_dir(ROOTFS) == fleet.host_image_dir(ROOTFS)
    assert fleet.host_image_dir(ROOTFS).parent == fleet.CACHE_DIR


def test_a_new_lock_bakes_a_new_image(bake_inputs):
    lock, _ = bake_inputs
    before = fleet.host_image_dir(ROOTFS)
    lock.write_text(lock.read_text().replace("uv==", "uv==0.0.1+other-", 1))
    assert fleet.host_image_dir(ROOTFS) != before


@pytest.mark.parametrize("path", sorted(fleet.BAKE_FILES))
def test_a_changed_install_script_bakes_a_new_image(bake_inputs, path):
    _, files = bake_inputs
    before = fleet.host_image_dir(ROOTFS)
    source, _ = files[path]
    source.write_text(source.read_text() + "\n# changed\n")
    assert fleet.host_image_dir(ROOTFS) != before


def test_another_base_image_bakes_a_new_image(bake_inputs):
    assert fleet.host_image_dir(ROOTFS) != fleet.host_image_dir(ROOTFS.with_name("rootfs-bookworm-ba9876543210"))


def test_the_bake_runs_the_install_step_of_the_nodes_setup():
    """`vllm-cluster-node bake` and `vllm-cluster-node setup` install through one function,
    and the bake runs from the files the stack's setup command writes, at their paths."""
    functions = shell_functions(NODE_SCRIPT)
    assert 'install_node_software "$WHEELHOUSE"' in functions["cmd_setup"].splitlines()
    assert 'install_node_software "$wheelhouse"' in functions["cmd_bake"].splitlines()
    install = functions["install_node_software"].splitlines()
    assert install[0] == 'install_software "$1"'
    assert any("ensure_python_headers" in line for line in install)
    assert {"open_environment_to_service"} <= set(install)
    setup_script = bootstrap.node_setup_script(boot(node_lock=node_env.local_host().lock_path.read_text()))
    for path, (source, mode) in fleet.BAKE_FILES.items():
        assert f"install -D -m {mode:04o} /dev/stdin {path} <<" in setup_script, path
        assert source.read_text() in setup_script, path


def test_the_bake_refuses_without_a_lock_or_its_arguments(tmp_path):
    from node_scratch import install_node_script

    script = install_node_script(tmp_path, node_env="")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    missing = subprocess.run(["bash", str(script), "bake"], capture_output=True, text=True, env=env)
    assert missing.returncode != 0 and "bake needs --facts FILE" in missing.stderr
    args = ["--wheelhouse", str(tmp_path / "wheels"), "--facts", str(tmp_path / "facts")]
    no_lock = subprocess.run(["bash", str(script), "bake", *args], capture_output=True, text=True, env=env)
    assert no_lock.returncode != 0 and "bake: no lock at" in no_lock.stderr, no_lock.stderr


def open_environment(install_dir: Path) -> subprocess.CompletedProcess:
    body = shell_functions(NODE_SCRIPT)["open_environment_to_service"]
    script = f"set -euo pipefail\nINSTALL_DIR={install_dir}\nVENV={install_dir}/venv\nf() {{\n{body}\n}}\nf\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_opening_the_environment_to_the_service_user_rewrites_nothing_already_open(tmp_path):
    """The service user reads and runs the environment and writes none of it. On a node
    launched from the baked image the environment is open already: a chmod of every file
    (`chmod -R`) rewrites each inode anyway, and on the hosts' overlay that copies every
    file of 3.7 GiB up into the host's own layer at each setup."""
    install = tmp_path / "opt"
    venv = install / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").mkdir(mode=0o700)
    files = {"bin/python": 0o700, "lib/module.py": 0o600, "lib/shared.py": 0o666, "lib/data": 0o640}
    for name, mode in files.items():
        (venv / name).write_text(name)
        (venv / name).chmod(mode)
    (venv / "bin" / "python3").symlink_to("python")
    first = open_environment(install)
    assert first.returncode == 0, first.stderr
    modes = {name: (venv / name).stat().st_mode & 0o7777 for name in files}
    assert modes == {"bin/python": 0o755, "lib/module.py": 0o644, "lib/shared.py": 0o644, "lib/data": 0o644}
    assert (venv / "lib").stat().st_mode & 0o777 == 0o755
    changed = {path: path.lstat().st_ctime_ns for path in [venv, *venv.rglob("*")]}
    time.sleep(0.05)
    again = open_environment(install)
    assert again.returncode == 0, again.stderr
    rewritten = [str(path) for path, ctime in changed.items() if path.lstat().st_ctime_ns != ctime]
    assert rewritten == [], f"opened again: {rewritten}"


def test_a_new_image_removes_the_old_ones_but_not_one_in_use(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "CACHE_DIR", tmp_path)
    images = {name: tmp_path / f"host-image-{name}" for name in ("new", "old", "mounted", "recent", "unfinished")}
    for name, image in images.items():
        (image / "layer").mkdir(parents=True)
        if name != "unfinished":
            (image / ".complete").write_text("over rootfs\n")
    hours_ago = time.time() - 3 * 3600
    for name in ("old", "mounted"):
        os.utime(images[name] / ".complete", (hours_ago, hours_ago))
    mounts = f"overlay /tmp/node0/root overlay rw,lowerdir={images['mounted']}/layer:/var/cache/rootfs,upperdir=x 0 0\n"
    fleet._remove_other_host_images(images["new"], mounts)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "host-image-mounted",
        "host-image-new",
        "host-image-recent",
    ]
