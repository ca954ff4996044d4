"""tools/install-test-deps, which `make test` and CI run first: as root it installs
the system packages the tests use that are missing; without root it names them and
lets the run go on (the tests that need them skip and say so); under CI what cannot
be installed stops the run. Run here with an apt-get stand-in and a PATH holding
nothing else, so every command-probed package looks missing and nothing is installed."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "install-test-deps"
# Every package the script looks for by a command on the PATH (nginx it finds by its path).
BY_COMMAND = [
    "make",
    "python3-venv",
    "systemd-container",
    "debootstrap",
    "openssh-client",
    "iproute2",
    "openssl",
    "curl",
    "tmux",
]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the root branch of tools/install-test-deps needs root")


def missing_here() -> list[str]:
    # Debian's python3-botocore it finds by importing botocore into /usr/bin/python3.
    probe = subprocess.run(["/usr/bin/python3", "-c", "import botocore"], capture_output=True, check=False)
    botocore = [] if probe.returncode == 0 else ["python3-botocore"]
    nginx = [] if os.access("/usr/sbin/nginx", os.X_OK) else ["nginx"]
    return BY_COMMAND[:2] + botocore + nginx + BY_COMMAND[2:]


def run_script(tmp_path: Path, apt_exit: int = 0, ci: bool = False, as_nobody: bool = False):
    """(exit code, stderr, apt-get calls) of the script with only the stand-in on its PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "apt-get.log"
    (bin_dir / "apt-get").write_text(f'#!/bin/bash\necho "$*" >> "{log}"\nexit {apt_exit}\n')
    (bin_dir / "apt-get").chmod(0o755)
    # promtool is not a package here but unpacked from one: give the script one, so only
    # the packages it installs with apt-get are in play.
    promtool = tmp_path / "cache" / "prometheus-deb" / "usr" / "bin" / "promtool"
    promtool.parent.mkdir(parents=True, exist_ok=True)
    promtool.write_text("#!/bin/sh\n")
    promtool.chmod(0o755)
    env = {
        "PATH": str(bin_dir),
        "VLLM_CLUSTER_TESTBED_CACHE": str(tmp_path / "cache"),
        **({"VLLM_CLUSTER_CI": "1"} if ci else {}),
    }
    # As root, drop to nobody to see what a user without root gets.
    prefix = (
        [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups"]
        if as_nobody and os.geteuid() == 0
        else []
    )
    result = subprocess.run([*prefix, "/bin/bash", str(SCRIPT)], capture_output=True, text=True, env=env)
    calls = log.read_text().splitlines() if log.exists() else []
    return result.returncode, result.stderr, calls


def test_the_scripts_are_shellcheck_clean():
    shellcheck = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: make test installs it from requirements-dev.txt"
    result = subprocess.run(
        [shellcheck, "--severity=style", str(SCRIPT), str(ROOT / ".ci" / "run")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_ci_and_make_test_install_with_the_one_script():
    assert "tools/install-test-deps" in (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in (ROOT / ".ci" / "run").read_text()
    assert "tools/install-test-deps" in (ROOT / "Makefile").read_text()


@needs_root
def test_as_root_the_missing_packages_are_installed(tmp_path):
    code, stderr, calls = run_script(tmp_path)
    assert code == 0, stderr
    assert calls == ["update -qq", "install -y -qq " + " ".join(missing_here())]


@needs_root
def test_a_failed_install_goes_on_outside_ci_and_stops_ci(tmp_path):
    code, stderr, _ = run_script(tmp_path, apt_exit=100)
    assert code == 0 and "apt-get could not install them" in stderr and "sudo make test" in stderr
    code, stderr, _ = run_script(tmp_path, apt_exit=100, ci=True)
    assert code == 1 and "apt-get could not install them" in stderr


def test_without_root_the_missing_packages_are_named_not_installed():
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv to drop to an ordinary user")
    # Not under tmp_path, whose parents only root may enter: nobody must reach the stand-in.
    with tempfile.TemporaryDirectory() as scratch:
        Path(scratch).chmod(0o777)
        code, stderr, calls = run_script(Path(scratch), as_nobody=True)
        assert code == 0 and calls == []
        assert f"missing {' '.join(missing_here())}; not installing them without root" in stderr
        assert "sudo make test installs them" in stderr
        code, _, calls = run_script(Path(scratch), as_nobody=True, ci=True)
        assert code == 1 and calls == []
