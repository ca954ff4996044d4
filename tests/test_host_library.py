"""The host scripts' shared library (scripts/lib/vllm-cluster-lib.sh), run by bash as
the scripts source it: temporary files go however a script ends, and a subshell's
cleanup never takes the files its parent still uses."""

from __future__ import annotations

import ast
import re
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"


def run_with_library(body: str, **kwargs) -> subprocess.CompletedProcess:
    """`body` as a host script runs it: strict mode, the library sourced."""
    script = f"set -euo pipefail\n. {LIBRARY}\n{body}"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, **kwargs)


def test_temporary_paths_are_removed_when_the_script_dies_and_its_status_stays(tmp_path):
    result = run_with_library(f"""
file=$(mktemp -p {tmp_path})
directory=$(mktemp -d -p {tmp_path})
remove_on_exit "$file" "$directory"
touch "$directory/inside"
die "stopped on purpose"
""")
    assert result.returncode == 1 and "stopped on purpose" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_temporary_paths_are_removed_after_a_failed_command_under_set_e(tmp_path):
    result = run_with_library(f"""
file=$(mktemp -p {tmp_path})
remove_on_exit "$file"
false
echo unreachable
""")
    assert result.returncode == 1 and "unreachable" not in result.stdout
    assert list(tmp_path.iterdir()) == []


def test_temporary_paths_are_removed_when_systemd_stops_the_script(tmp_path):
    started = tmp_path / "started"
    process = subprocess.Popen(
        [
            "bash",
            "-c",
            f"""set -euo pipefail
. {LIBRARY}
file=$(mktemp -p {tmp_path} temp.XXXXXX)
remove_on_exit "$file"
touch {started}
sleep 30 & wait
""",
        ]
    )
    deadline = time.monotonic() + 10
    while not started.exists():
        assert time.monotonic() < deadline, "the script did not start"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) != 0
    assert not list(tmp_path.glob("temp.*"))


def test_a_subshell_removes_its_own_temporary_files_and_not_its_parents(tmp_path):
    """install_if_changed runs inside $(...) and registers its own file there; the
    parent's temporary file must outlive that subshell."""
    target = tmp_path / "target"
    result = run_with_library(f"""
mine=$(mktemp -p {tmp_path} parent.XXXXXX)
remove_on_exit "$mine"
echo one >"$mine"
first=$(install_if_changed {target} 600 <"$mine")
second=$(install_if_changed {target} 600 <"$mine")
[ -f "$mine" ] || {{ echo "the parent's file went with the subshell" >&2; exit 3; }}
echo "$first $second"
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["changed", "unchanged"]
    assert target.read_text() == "one\n" and target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_install_if_changed_leaves_nothing_beside_the_target_when_it_runs_in_the_script_itself(tmp_path):
    target = tmp_path / "target"
    result = run_with_library(f"""
echo one | install_if_changed {target} 644 >/dev/null
install_if_changed {target} 644 <<<one
""")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "unchanged"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]


def test_a_script_that_made_no_temporary_file_exits_as_it_would_without_the_library():
    assert run_with_library("exit 7").returncode == 7
    assert run_with_library("true").returncode == 0


# --- one copy of each helper ---------------------------------------------------------

NODE_SCRIPT = ROOT / "scripts" / "node" / "vllm-cluster-node"
GATEWAY_SCRIPT = ROOT / "scripts" / "gateway" / "vllm-cluster-gateway"
FIRST_BOOT_SCRIPT = ROOT / "scripts" / "node" / "vllm-cluster-first-boot"
SHELL_SCRIPTS = [NODE_SCRIPT, GATEWAY_SCRIPT, FIRST_BOOT_SCRIPT, LIBRARY]
PYTHON_LIBRARY = ROOT / "scripts" / "lib" / "vllm_cluster_lib.py"
PYTHON_CHECKS = ("preflight-check", "ray-cluster-check", "vllm-watchdog-check", "vllm-idle-check", "node-env")
PYTHON_SCRIPTS = [ROOT / "scripts" / "node" / name for name in PYTHON_CHECKS] + [PYTHON_LIBRARY]


def shell_functions(path: Path) -> dict[str, str]:
    """name -> body (lines stripped) of every `name() {...}` function in a bash file."""
    text = path.read_text()
    functions = dict(re.findall(r"^([a-z_]+)\(\) \{\n(.*?)\n\}$", text, re.M | re.S))
    functions.update(re.findall(r"^([a-z_]+)\(\) \{ (.*) \}$", text, re.M))
    return {name: "\n".join(line.strip() for line in body.splitlines()) for name, body in functions.items()}


def python_functions(path: Path) -> dict[str, str]:
    """name -> body (as an AST dump, docstring left out) of every function in a file."""
    functions = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            body = node.body[1:] if ast.get_docstring(node) else node.body
            functions[node.name] = "\n".join(ast.dump(statement) for statement in body)
    return functions


def copies(files: list[Path], functions) -> list[str]:
    seen: dict[str, str] = {}
    found = []
    for path in files:
        for name, body in functions(path).items():
            if len(body.splitlines()) < 2 and len(body) < 60:
                continue  # a one-liner such as `return 0` is not a helper
            if body in seen:
                found.append(f"{path.name}: {name} repeats {seen[body]}")
            seen.setdefault(body, f"{path.name}: {name}")
    return found


def test_the_shell_scripts_share_their_helpers_through_the_library_not_copies():
    for path in (NODE_SCRIPT, GATEWAY_SCRIPT, LIBRARY):
        assert shell_functions(path), f"no function found in {path.name}: the parser no longer reads it"
    assert copies(SHELL_SCRIPTS, shell_functions) == []


def test_the_python_checks_share_their_helpers_through_their_library_not_copies():
    assert copies(PYTHON_SCRIPTS, python_functions) == []


def test_the_duplicate_finders_see_a_copied_helper(tmp_path):
    copied = tmp_path / "copy"
    copied.write_text(LIBRARY.read_text())
    assert any("install_if_changed" in line for line in copies([LIBRARY, copied], shell_functions))
    (tmp_path / "copy.py").write_text(PYTHON_LIBRARY.read_text())
    assert any("metric_totals" in line for line in copies([PYTHON_LIBRARY, tmp_path / "copy.py"], python_functions))


# --- the first boot, with the library the user data writes beside it ------------------


def first_boot(tmp_path: Path, probe_key: str | None = None):
    """vllm-cluster-first-boot as the user data runs it, moved under a scratch root:
    getent and chown are stand-ins, so the login user's home is a scratch directory.
    Returns (run, home, stand-ins): run() runs it once."""
    from components import bootstrap
    from tests.test_bootstrap import boot

    root = tmp_path / "root"
    (root / "etc/vllm-cluster").mkdir(parents=True, exist_ok=True)
    (root / "opt/vllm-cluster/lib").mkdir(parents=True, exist_ok=True)
    env_text = bootstrap.cluster_env(boot(1))
    if probe_key is not None:
        env_text = env_text.replace(boot(1).login_probe_key.strip(), probe_key)
    (root / "etc/vllm-cluster/cluster.env").write_text(env_text)
    (root / "opt/vllm-cluster/lib/vllm-cluster-lib.sh").write_text(LIBRARY.read_text())
    script = tmp_path / "first-boot"
    script.write_text(
        FIRST_BOOT_SCRIPT.read_text()
        .replace("/opt/vllm-cluster", f"{root}/opt/vllm-cluster")
        .replace("/etc/vllm-cluster", f"{root}/etc/vllm-cluster")
    )
    home, stand_ins = tmp_path / "home", tmp_path / "bin"
    stand_ins.mkdir(exist_ok=True)
    (stand_ins / "getent").write_text(f'#!/bin/sh\n[ "$2" = ubuntu ] && echo "ubuntu:x:1000:1000::{home}:/bin/bash"\n')
    (stand_ins / "chown").write_text("#!/bin/sh\nexit 0\n")
    for stand_in in stand_ins.iterdir():
        stand_in.chmod(0o755)
    env = {"PATH": f"{stand_ins}:/usr/bin:/bin"}
    return (lambda: subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)), home, stand_ins


def probe_line(key: str) -> str:
    from components import bootstrap

    return f'restrict,command="echo {bootstrap.LOGIN_READY_WORD}" {key} vllm-cluster-login-probe'


def test_first_boot_authorizes_the_login_probe_once_using_the_library(tmp_path):
    from tests.test_bootstrap import boot

    run, home, stand_ins = first_boot(tmp_path)
    for _ in range(2):
        result = run()
        assert result.returncode == 0, result.stderr
        assert "[worker-1] vllm-cluster-first-boot: login probe authorized for ubuntu" in result.stderr
    keys = (home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert keys == [probe_line(boot(1).login_probe_key)]
    (stand_ins / "getent").write_text("#!/bin/sh\nexit 2\n")
    refused = run()
    assert refused.returncode == 1 and "no user ubuntu on this node" in refused.stderr


def test_a_rotated_login_probe_key_replaces_the_old_one_and_every_other_line_stays(tmp_path):
    """The old probe key must stop working once the stack sends a new one (issue 19,
    point 8): its line goes, the admin's own keys and comments stay as they were."""
    from tests.test_bootstrap import boot

    old = boot(1).login_probe_key.strip()
    new = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHrotatedrotatedrotatedrotatedrota02"
    run, home, _ = first_boot(tmp_path)
    assert run().returncode == 0
    keys = home / ".ssh" / "authorized_keys"
    admin = ["# the admin's own keys", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIadmin admin@laptop", ""]
    keys.write_text(keys.read_text() + "\n".join(admin) + "\n" + "ssh-rsa AAAAB3last no-newline-at-end")
    run, _, _ = first_boot(tmp_path, probe_key=new)
    result = run()
    assert result.returncode == 0, result.stderr
    assert keys.read_text().splitlines() == [*admin, "ssh-rsa AAAAB3last no-newline-at-end", probe_line(new)]
    assert old not in keys.read_text()
    assert keys.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in keys.parent.iterdir()) == ["authorized_keys"]
