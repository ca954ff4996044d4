"""scripts/node/node-env, the nodes' wheelhouse and environment checks, on real wheels
built here (tools/pure_wheel.py) and a real virtualenv (uv): what a node relies on is
that only files whose hashes the lock holds are ever kept or installed, that a
wheelhouse already filled costs a check and no download, that a change of pins asks
only for what changed, and that an environment that is not the lock's is named."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_ENV = ROOT / "scripts" / "node" / "node-env"
sys.path.insert(0, str(ROOT))

from tools import pure_wheel  # noqa: E402


def load_node_env():
    loader = SourceFileLoader("node_env_script", str(NODE_ENV))
    module = module_from_spec(spec_from_loader("node_env_script", loader))
    loader.exec_module(module)
    return module


def wheel(tmp_path: Path, name: str, version: str, body: str = "") -> Path:
    """A real wheel of a one-module project `name` at `version`."""
    project = tmp_path / "projects" / f"{name}-{version}-{hashlib.sha1(body.encode()).hexdigest()[:6]}"
    package = name.replace("-", "_")
    (project / package).mkdir(parents=True)
    (project / package / "__init__.py").write_text(f"VERSION = {version!r}\n{body}")
    (project / "pyproject.toml").write_text(
        f'[project]\nname = "{name}"\nversion = "{version}"\n\n[tool.setuptools]\npackages = ["{package}"]\n'
    )
    return pure_wheel.build(project, tmp_path / "built" / project.name)


def lock_text(*wheels: Path, extra_hashes: dict[str, list[str]] | None = None) -> str:
    lines = ["# a lock as tools/lock_node_env.py writes one\n"]
    for path in wheels:
        name, version = path.name.split("-")[:2]
        hashes = [pure_wheel.sha256_of(path), *(extra_hashes or {}).get(name, [])]
        lines.append(f"{name}=={version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes) + "\n")
    return "".join(lines)


def fill(house: Path, lock: Path, *, incoming: list[Path] = ()) -> tuple[int, str]:
    """Run `node-env wheelhouse` as the node script does; (missing count, missing file)."""
    (house / ".incoming").mkdir(parents=True, exist_ok=True)
    for path in incoming:
        (house / ".incoming" / path.name).write_bytes(path.read_bytes())
    missing = house / ".incoming" / "missing.txt"
    result = subprocess.run(
        [sys.executable, str(NODE_ENV), "wheelhouse", "--lock", str(lock), "--wheelhouse", str(house)]
        + ["--missing", str(missing)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout), missing.read_text()


@pytest.fixture
def two_packages(tmp_path):
    alpha, beta = wheel(tmp_path, "alpha", "1.0"), wheel(tmp_path, "beta", "2.0")
    lock = tmp_path / "node-env.lock"
    lock.write_text(lock_text(alpha, beta))
    return alpha, beta, lock


def test_an_empty_wheelhouse_asks_for_every_locked_package_with_its_hashes(tmp_path, two_packages):
    alpha, beta, lock = two_packages
    count, missing = fill(tmp_path / "house", lock)
    assert count == 2
    assert f"alpha==1.0 --hash=sha256:{pure_wheel.sha256_of(alpha)}\n" in missing
    assert f"beta==2.0 --hash=sha256:{pure_wheel.sha256_of(beta)}\n" in missing


def test_downloaded_wheels_with_the_locks_hashes_are_taken_in_and_then_nothing_is_missing(tmp_path, two_packages):
    alpha, beta, lock = two_packages
    house = tmp_path / "house"
    assert fill(house, lock, incoming=[alpha, beta]) == (0, "")
    assert (house / alpha.name).read_bytes() == alpha.read_bytes()
    assert not list((house / ".incoming").glob("*.whl"))


def test_a_downloaded_file_the_lock_does_not_hold_is_refused_and_never_kept(tmp_path, two_packages):
    alpha, _, lock = two_packages
    forged = wheel(tmp_path, "alpha", "1.0", body="import os  # not the locked bytes\n")
    house = tmp_path / "house"
    count, missing = fill(house, lock, incoming=[forged])
    assert count == 2 and "alpha==1.0" in missing
    assert not (house / forged.name).exists() and not list((house / ".incoming").glob("*.whl"))


def test_a_wheel_changed_in_the_wheelhouse_is_removed_and_asked_for_again(tmp_path, two_packages):
    alpha, beta, lock = two_packages
    house = tmp_path / "house"
    fill(house, lock, incoming=[alpha, beta])
    (house / alpha.name).write_bytes(b"truncated")
    count, missing = fill(house, lock)
    assert count == 1 and missing.startswith("alpha==1.0 ")
    assert not (house / alpha.name).exists()


def test_a_filled_wheelhouse_is_checked_without_reading_the_wheels_again(tmp_path, two_packages, monkeypatch):
    alpha, beta, lock = two_packages
    house = tmp_path / "house"
    fill(house, lock, incoming=[alpha, beta])
    module = load_node_env()
    read = []
    monkeypatch.setattr(module, "sha256_of", lambda path: read.append(path) or pure_wheel.sha256_of(path))
    missing = tmp_path / "missing.txt"
    assert module.main(["wheelhouse", "--lock", str(lock), "--wheelhouse", str(house), "--missing", str(missing)]) == 0
    assert read == [] and missing.read_text() == ""


def test_a_change_of_pins_asks_only_for_what_changed_and_keeps_the_rest(tmp_path, two_packages):
    alpha, beta, lock = two_packages
    house = tmp_path / "house"
    fill(house, lock, incoming=[alpha, beta])
    kept = (house / alpha.name).stat().st_ino
    beta_3 = wheel(tmp_path, "beta", "3.0")
    lock.write_text(lock_text(alpha, beta_3))
    count, missing = fill(house, lock)
    assert count == 1 and missing.startswith("beta==3.0 ")
    assert (house / alpha.name).stat().st_ino == kept
    # The old pin's wheel stays: a stack still on it installs from the same wheelhouse.
    assert (house / beta.name).exists()


def fake_uv_wheel(tmp_path: Path, version: str, machine: str) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"uv-{version}.data/scripts/uv", "#!/bin/sh\necho uv " + version + "\n")
        archive.writestr(f"uv-{version}.dist-info/METADATA", f"Name: uv\nVersion: {version}\n")
    path = tmp_path / f"uv-{version}-py3-none-manylinux_2_17_{machine}.whl"
    path.write_bytes(buffer.getvalue())
    return path


def test_the_installer_comes_out_of_its_locked_wheel_and_only_when_the_hash_is_the_locks(tmp_path):
    import platform

    house = tmp_path / "house"
    house.mkdir()
    uv_wheel = fake_uv_wheel(house, "0.13.9", platform.machine())
    lock = tmp_path / "lock.txt"
    lock.write_text(lock_text(uv_wheel))
    dest = tmp_path / "bin" / "uv"
    command = [sys.executable, str(NODE_ENV), "extract-uv", "--lock", str(lock), "--wheelhouse", str(house)]
    subprocess.run(command + ["--dest", str(dest)], check=True)
    assert subprocess.run([str(dest)], capture_output=True, text=True).stdout == "uv 0.13.9\n"
    lock.write_text(lock_text(uv_wheel).replace(pure_wheel.sha256_of(uv_wheel), "0" * 64))
    refused = subprocess.run(command + ["--dest", str(tmp_path / "uv2")], capture_output=True, text=True)
    assert refused.returncode != 0 and "does not match the lock's hashes for uv 0.13.9" in refused.stderr
    assert not (tmp_path / "uv2").exists()


def uv() -> str:
    path = Path(sys.prefix) / "bin" / "uv"
    assert path.exists(), "uv is in requirements-dev.txt"
    return str(path)


def test_an_environment_is_the_locks_exactly_or_the_first_difference_is_named(tmp_path, two_packages):
    alpha, beta, lock = two_packages
    house = tmp_path / "house"
    fill(house, lock, incoming=[alpha, beta])
    venv = tmp_path / "venv"
    subprocess.run([uv(), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # As the node script installs: offline, from the wheelhouse only, hashes required.
    offline = ["--offline", "--no-index", "--find-links", str(house), "--require-hashes"]
    subprocess.run([uv(), "pip", "sync", "--quiet", "--python", python, *offline, str(lock)], check=True)
    check = [python, "-I", str(NODE_ENV), "check", "--lock", str(lock)]
    matched = subprocess.run(check, capture_output=True, text=True)
    assert matched.returncode == 0, matched.stderr
    assert len(matched.stdout.strip()) == 64  # the fingerprint preflight compares across nodes
    gamma = wheel(tmp_path, "gamma", "0.1")
    subprocess.run([uv(), "pip", "install", "--quiet", "--python", python, "--offline", str(gamma)], check=True)
    extra = subprocess.run(check, capture_output=True, text=True)
    assert extra.returncode == 1 and "gamma==0.1 is installed but not locked" in extra.stderr
    lock.write_text(lock_text(alpha, wheel(tmp_path, "beta", "3.0"), gamma))
    other = subprocess.run(check, capture_output=True, text=True)
    assert other.returncode == 1 and "beta is 2.0, the lock says 3.0" in other.stderr


def test_a_lock_with_a_line_that_is_not_a_hashed_pin_is_refused_by_name(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("numpy>=2\n")
    result = subprocess.run(
        [sys.executable, str(NODE_ENV), "wheelhouse", "--lock", str(lock), "--wheelhouse", str(tmp_path / "h")]
        + ["--missing", str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "not a hash-pinned requirement: 'numpy>=2'" in result.stderr
