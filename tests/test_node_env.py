"""scripts/node/node-env, the nodes' wheelhouse and environment checks, on real wheels
built here (localhosts/pure_wheel.py) and a real virtualenv (uv): what a node relies on
is that only files whose hashes the lock holds are ever kept or installed, that a
wheelhouse already filled costs a check and no download, that a change of pins asks
only for what changed, and that an environment that is not the lock's is named."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import time
import zipfile
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_ENV = ROOT / "scripts" / "node" / "node-env"
sys.path.insert(0, str(ROOT))

from localhosts import pure_wheel  # noqa: E402


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


# --- a node's install from the shared wheelhouse (issue 19, points 5, 6 and 8) -------
#
# The wheelhouse is on the model cache, which every node of every gang can write. A node
# trusts only its own lock and its own disk: it copies each wheel to a local, root-only
# stage, hashing the very bytes it copies; it writes what pip reads on local disk; it
# installs from the stage. Every long step prints a line at least every interval, and a
# fill prunes the wheels of locks older than the current one and the previous one.


def fake_pip(tmp_path: Path, index: Path, *, sleep: float = 0, attack: Path | None = None) -> Path:
    """A pip that serves `download -r FILE --dest DIR` from the wheels in `index`,
    records what it was asked (pip.log) and, with `attack`, first does what a
    compromised node could do at that moment: rewrite every file under the wheelhouse."""
    script = tmp_path / "pip"
    script.write_text(f"""#!{sys.executable}
import pathlib, shutil, sys, time
args = sys.argv[1:]
attack = {str(attack) if attack else None!r}
if attack:
    for path in pathlib.Path(attack).rglob("*"):
        if path.is_file() and not path.name.endswith(".whl"):
            path.write_text("--no-binary :all:\\nevil==6.6.6\\n")
requirements = pathlib.Path(args[args.index("-r") + 1])
dest = pathlib.Path(args[args.index("--dest") + 1])
text = requirements.read_text()
with open({str(tmp_path / "pip.log")!r}, "a") as log:
    log.write(f"-r {{requirements}}\\n{{text}}")
time.sleep({sleep})
for line in text.splitlines():
    name, version = line.split()[0].split("==")
    for wheel in pathlib.Path({str(index)!r}).glob(f"{{name}}-{{version}}-*.whl"):
        shutil.copy(wheel, dest / wheel.name)
""")
    script.chmod(0o755)
    return script


def node_env(*args, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(NODE_ENV), *map(str, args)], capture_output=True, text=True, **kwargs)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def stage(lock: Path, house: Path, local: Path) -> int:
    return int(node_env("stage", "--lock", lock, "--wheelhouse", house, "--stage", local).stdout)


def fill_from(lock: Path, house: Path, local: Path, pip: Path, *extra, check: bool = True):
    return node_env("fill", "--lock", lock, "--wheelhouse", house, "--stage", local, "--pip", pip, *extra, check=check)


@pytest.fixture
def index(tmp_path, two_packages):
    """What the package index serves: the locked wheels."""
    alpha, beta, _ = two_packages
    folder = tmp_path / "index"
    folder.mkdir()
    for path in (alpha, beta):
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def test_a_node_fills_an_empty_wheelhouse_and_stages_checked_copies_on_its_own_disk(tmp_path, two_packages, index):
    alpha, beta, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    assert stage(lock, house, local) == 2
    fill_from(lock, house, local, fake_pip(tmp_path, index))
    assert stage(lock, house, local) == 0
    for path in (alpha, beta):
        assert (local / path.name).read_bytes() == (house / path.name).read_bytes() == path.read_bytes()
    assert local.stat().st_mode & 0o777 == 0o700
    # A second node finds everything on the cache and downloads nothing.
    other = tmp_path / "other" / "wheels"
    assert stage(lock, house, other) == 0 and sorted(p.name for p in other.glob("*.whl")) == [alpha.name, beta.name]


def test_the_list_pip_downloads_from_is_on_local_disk_whatever_the_cache_holds(tmp_path, two_packages, index):
    """A node that rewrites the shared cache while another fills it cannot add pip options
    (--no-binary, another index, its own hashes) to what the filler downloads."""
    _, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    (house / ".incoming").mkdir(parents=True)
    (house / ".incoming" / "missing.txt").write_text("--no-binary :all:\nevil==6.6.6\n")
    fill_from(lock, house, local, fake_pip(tmp_path, index, attack=house))
    log = (tmp_path / "pip.log").read_text()
    asked = Path(log.splitlines()[0].removeprefix("-r "))
    assert not asked.resolve().is_relative_to(house.resolve())
    assert "evil" not in log and "--no-binary" not in log
    assert sorted(line.split("==")[0] for line in log.splitlines()[1:]) == ["alpha", "beta"]
    assert stage(lock, house, local) == 0


def test_a_wheel_planted_on_the_cache_is_never_staged_and_the_filler_replaces_it(tmp_path, two_packages, index):
    alpha, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    house.mkdir(parents=True)
    planted = wheel(tmp_path, "alpha", "1.0", body="import os  # planted by another node\n")
    (house / alpha.name).write_bytes(planted.read_bytes())
    assert stage(lock, house, local) == 2
    assert not (local / alpha.name).exists()
    fill_from(lock, house, local, fake_pip(tmp_path, index))
    assert (house / alpha.name).read_bytes() == (local / alpha.name).read_bytes() == alpha.read_bytes()


def test_a_wheel_swapped_on_the_cache_after_its_hash_was_taken_is_not_what_gets_staged(
    tmp_path, two_packages, monkeypatch
):
    """The hash is of the bytes the stage keeps: a swap between the check and the copy
    (or between the check and the install) changes nothing on the node."""
    alpha, beta, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    house.mkdir(parents=True)
    for path in (alpha, beta):
        (house / path.name).write_bytes(path.read_bytes())
    planted = wheel(tmp_path, "alpha", "1.0", body="import os  # planted by another node\n").read_bytes()
    module = load_node_env()
    monkeypatch.setattr(module, "hashlib", swapping_hashlib(house / alpha.name, planted))
    module.main(["stage", "--lock", str(lock), "--wheelhouse", str(house), "--stage", str(local)])
    assert (house / alpha.name).read_bytes() == planted  # the swap happened
    assert (local / alpha.name).read_bytes() == alpha.read_bytes()


def swapping_hashlib(victim: Path, planted: bytes):
    """hashlib, except that a digest's hexdigest() first replaces `victim` with
    `planted`: another node's write landing just after the hash was taken."""

    class Digest:
        def __init__(self, data=b""):
            self.real = hashlib.sha256(data)

        def update(self, data):
            self.real.update(data)

        def hexdigest(self):
            if victim.exists():
                victim.write_bytes(planted)
            return self.real.hexdigest()

    class Module:
        sha256 = Digest

    return Module


def test_the_installer_unzipped_is_the_one_whose_hash_was_checked(tmp_path, monkeypatch):
    import platform

    house = tmp_path / "house"
    house.mkdir()
    uv_wheel = fake_uv_wheel(house, "0.13.9", platform.machine())
    lock = tmp_path / "lock.txt"
    lock.write_text(lock_text(uv_wheel))
    forged = io.BytesIO()
    with zipfile.ZipFile(forged, "w") as archive:
        archive.writestr("uv-0.13.9.data/scripts/uv", "#!/bin/sh\necho forged\n")
    forged = forged.getvalue()
    module = load_node_env()
    monkeypatch.setattr(module, "hashlib", swapping_hashlib(uv_wheel, forged))
    dest = tmp_path / "bin" / "uv"
    module.main(["extract-uv", "--lock", str(lock), "--wheelhouse", str(house), "--dest", str(dest)])
    assert uv_wheel.read_bytes() == forged  # the swap happened
    assert subprocess.run([str(dest)], capture_output=True, text=True).stdout == "uv 0.13.9\n"


def test_a_staged_copy_changed_on_local_disk_is_checked_again_and_replaced(tmp_path, two_packages, index):
    alpha, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    fill_from(lock, house, local, fake_pip(tmp_path, index))
    (local / alpha.name).write_bytes(b"truncated by a full disk")
    assert stage(lock, house, local) == 0
    assert (local / alpha.name).read_bytes() == alpha.read_bytes()


def timed_lines(command: list[str], on_first_line=lambda: None) -> tuple[int, list[tuple[float, str]]]:
    """Run `command`; (status, [(seconds since start, stderr line)]). `on_first_line` is
    called once, when the command has said its first line."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append((time.monotonic() - start, line.rstrip()))
        if len(lines) == 1:
            on_first_line()
    return process.wait(), lines + [(time.monotonic() - start, "<end>")]


def longest_silence(lines: list[tuple[float, str]]) -> float:
    """The longest gap between two lines, from the tool's first line to its exit.

    Not from the process's start: the interpreter's start-up before the tool's first line is
    not the tool's progress reporting, and on a loaded machine (CI runs these tests at
    niceness 10 beside two fleets) it alone took 1.3-1.7 s. Each test counts the tool's
    progress lines instead."""
    times = [at for at, _ in lines]
    return max(later - earlier for earlier, later in zip(times, times[1:], strict=False))


# How late a line may come after its interval: the tool's and the reading test's wake-ups,
# late by up to half a second each at niceness 10 beside two fleets. Every wait below lasts
# longer than an interval plus this, so a tool that says nothing while it waits still fails.
LATE = 1.0


def test_waiting_on_another_nodes_wheelhouse_lock_says_so_every_interval(tmp_path, two_packages, index):
    import fcntl

    _, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    house.mkdir(parents=True)
    with open(house / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        command = [sys.executable, str(NODE_ENV), "fill", "--lock", str(lock), "--wheelhouse", str(house)]
        command += ["--stage", str(local), "--pip", str(fake_pip(tmp_path, index)), "--wait", "3"]
        status, lines = timed_lines(command + ["--progress-every", "0.5"])
    assert status == 1
    assert sum("waiting for" in line and str(house / ".lock") in line for _, line in lines) >= 4
    assert "held by another node for 3 s" in lines[-2][1]
    assert longest_silence(lines) < 0.5 + LATE


def test_a_slow_download_prints_progress_every_interval(tmp_path, two_packages, index):
    _, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    command = [sys.executable, str(NODE_ENV), "fill", "--lock", str(lock), "--wheelhouse", str(house)]
    command += ["--stage", str(local), "--pip", str(fake_pip(tmp_path, index, sleep=3)), "--progress-every", "0.5"]
    status, lines = timed_lines(command)
    assert status == 0, lines
    assert sum("downloading 2 locked wheels" in line for _, line in lines) >= 4
    assert longest_silence(lines) < 0.5 + LATE


def test_the_install_is_offline_from_the_stage_and_a_slow_one_prints_progress(tmp_path, two_packages, index):
    import platform

    alpha, beta, lock = two_packages
    # The lock's uv: a wheel whose uv runs the real one, slowly.
    slow_uv = io.BytesIO()
    with zipfile.ZipFile(slow_uv, "w") as archive:
        archive.writestr("uv-0.13.9.data/scripts/uv", f'#!/bin/sh\nsleep 2\nexec {uv()} "$@"\n')
        archive.writestr("uv-0.13.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: uv\nVersion: 0.13.9\n")
        archive.writestr("uv-0.13.9.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n")
        archive.writestr("uv-0.13.9.dist-info/RECORD", "")
    uv_wheel = index / f"uv-0.13.9-py3-none-manylinux_2_17_{platform.machine()}.whl"
    uv_wheel.write_bytes(slow_uv.getvalue())
    lock.write_text(lock_text(alpha, beta, uv_wheel))
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    fill_from(lock, house, local, fake_pip(tmp_path, index))
    # Another node plants a wheel on the cache after the stage: the install never reads it.
    (house / alpha.name).write_bytes(b"planted")
    venv = tmp_path / "venv"
    command = [sys.executable, str(NODE_ENV), "install", "--lock", str(lock), "--stage", str(local)]
    command += ["--uv", str(tmp_path / "bin" / "uv"), "--uv-cache", str(tmp_path / "uv-cache"), "--venv", str(venv)]
    command += ["--python", sys.executable, "--progress-every", "0.4"]
    status, lines = timed_lines(command)
    assert status == 0, "\n".join(line for _, line in lines)
    said = [line for _, line in lines]
    assert sum("still installing" in line for line in said) >= 3, said  # uv runs 2 s, a line every 0.4 s
    assert longest_silence(lines) < 0.4 + LATE
    python = venv / "bin" / "python"
    result = subprocess.run([str(python), "-I", str(NODE_ENV), "check", "--lock", str(lock)], capture_output=True)
    assert result.returncode == 0, result.stderr
    where = [str(python), "-c", "import alpha; print(alpha.__file__)"]
    installed = subprocess.run(where, capture_output=True, text=True)
    assert Path(installed.stdout.strip()).read_text() == "VERSION = '1.0'\n"


def use(lock: Path, house: Path, local: Path, pip: Path, *, at: float):
    """A node installing `lock` at time `at` (its fill records the use)."""
    fill_from(lock, house, local, pip)
    for record in (house / ".locks").glob("*"):
        if record.read_text() == lock.read_text():
            os.utime(record, (at, at))


def test_a_fill_prunes_every_lock_but_the_current_and_the_last_one_used_before_it(tmp_path):
    """Keep the previous lock's wheels (a rollback, a gang not yet replaced), prune the
    rest; "previous" is the other lock used last, not the one filled last."""
    index = tmp_path / "index"
    index.mkdir()
    wheels = {}
    for version in ("1", "2", "3", "4"):
        wheels[version] = wheel(tmp_path, "app", f"{version}.0")
        (index / wheels[version].name).write_bytes(wheels[version].read_bytes())
    common = wheel(tmp_path, "common", "1.0")
    (index / common.name).write_bytes(common.read_bytes())
    pip = fake_pip(tmp_path, index)
    house = tmp_path / "cache" / "wheelhouse"
    locks = {}
    for version in wheels:
        locks[version] = tmp_path / f"lock-{version}.txt"
        locks[version].write_text(lock_text(wheels[version], common))
    use(locks["1"], house, tmp_path / "n1", pip, at=1000)
    use(locks["2"], house, tmp_path / "n2", pip, at=2000)
    assert {p.name for p in house.glob("*.whl")} == {wheels["1"].name, wheels["2"].name, common.name}
    use(locks["1"], house, tmp_path / "n3", pip, at=3000)  # a rollback: lock 1 is used again
    use(locks["3"], house, tmp_path / "n4", pip, at=4000)
    assert {p.name for p in house.glob("*.whl")} == {wheels["1"].name, wheels["3"].name, common.name}
    assert len(list((house / ".locks").iterdir())) == 2
    use(locks["4"], house, tmp_path / "n5", pip, at=5000)
    assert {p.name for p in house.glob("*.whl")} == {wheels["3"].name, wheels["4"].name, common.name}


# --- a reader: every node but the wheelhouse's writer (gang 0's head) -------------------


def tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every path under `folder` with its size and modification time."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def test_a_reader_waits_for_the_writer_to_fill_the_wheelhouse_saying_so_and_never_writes_it(
    tmp_path, two_packages, index
):
    """Only gang 0's head may write the wheelhouse (its access point is read-only for the
    others): a node that finds it incomplete waits for the writer, prints a line every
    interval, stages what the writer published, and writes nothing on the cache."""
    import threading

    alpha, beta, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    house.mkdir(parents=True)
    (house / alpha.name).write_bytes(alpha.read_bytes())
    before = tree_state(house)

    def writer_publishes_late() -> None:
        time.sleep(2.5)
        (house / beta.name).write_bytes(beta.read_bytes())

    # Counted from the reader's first line, not from its start: a loaded machine took 1.5 s
    # to start the interpreter, and a writer 1.5 s after the start had published before the
    # reader looked.
    late = threading.Thread(target=writer_publishes_late)
    command = [sys.executable, str(NODE_ENV), "stage", "--lock", str(lock), "--wheelhouse", str(house)]
    command += ["--stage", str(local), "--wait-for-writer", "head", "--wait", "20", "--progress-every", "0.4"]
    status, lines = timed_lines(command, on_first_line=late.start)
    if late.ident is not None:  # started: the reader said a line (else the asserts below say why)
        late.join()
    assert status == 0, lines
    assert sorted(p.name for p in local.glob("*.whl")) == sorted([alpha.name, beta.name])
    assert sum("waiting for head" in line for _, line in lines) >= 3, lines
    assert longest_silence(lines) < 0.4 + LATE
    after = tree_state(house)
    assert after == {**before, beta.name: after[beta.name]}, "the reader wrote on the cache"


def test_a_reader_whose_writer_never_fills_the_wheelhouse_fails_naming_it_and_the_fix(tmp_path, two_packages):
    _, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    house.mkdir(parents=True)
    result = node_env(
        "stage", "--lock", lock, "--wheelhouse", house, "--stage", local,
        "--wait-for-writer", "head", "--wait", "1", "--progress-every", "0.3", check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "2 locked packages" in result.stderr and "head" in result.stderr
    assert "setup-head" in result.stderr  # the fix: the writer's own setup command, named
    assert list(house.iterdir()) == []


def test_recording_a_locks_use_never_takes_another_hosts_file_in_progress(tmp_path):
    """Every host has its own PID namespace, so two nodes often run node-env with the same
    PID: a temporary name made of the PID alone let one node move the other's half-written
    record into place, and the other's move then failed."""
    script = load_node_env()
    house = tmp_path / "wheelhouse"
    lock = tmp_path / "node-env.lock"
    lock.write_text("alpha==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    record = script.lock_record(house, lock)
    record.parent.mkdir(parents=True)
    other_hosts = record.with_name(f".{record.name}.{os.getpid()}.partial")
    other_hosts.write_bytes(b"half of another node's record")
    script.record_use(house, lock)
    assert record.read_bytes() == lock.read_bytes()
    assert other_hosts.read_bytes() == b"half of another node's record"


def test_the_writer_publishes_the_checked_wheels_it_holds_that_the_wheelhouse_lacks(tmp_path, two_packages):
    """A writer whose own stage has every locked wheel (installed before the wheelhouse had
    an access point of its own, or from a wheelhouse since emptied) fills an empty one
    without downloading anything: the readers would otherwise wait for it for an hour."""
    alpha, beta, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    local.mkdir(parents=True)
    for path in (alpha, beta):
        (local / path.name).write_bytes(path.read_bytes())
    node_env("fill", "--lock", lock, "--wheelhouse", house, "--stage", local)
    assert sorted(p.name for p in house.glob("*.whl")) == sorted([alpha.name, beta.name])
    assert (house / alpha.name).read_bytes() == alpha.read_bytes()


def test_a_fill_that_must_download_without_pip_says_so_with_its_own_status(tmp_path, two_packages):
    """setup runs fill without pip first (making pip's virtualenv costs a package install
    on an image without ensurepip) and again with it only when something must be fetched."""
    _, _, lock = two_packages
    house, local = tmp_path / "cache" / "wheelhouse", tmp_path / "local" / "wheels"
    result = node_env("fill", "--lock", lock, "--wheelhouse", house, "--stage", local, check=False)
    assert result.returncode == 75 and "2 locked packages" in result.stderr and "pip" in result.stderr
