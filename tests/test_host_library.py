"""The host scripts' shared library (scripts/lib/vllm-cluster-lib.sh), run by bash as
the scripts source it: temporary files go however a script ends, and a subshell's
cleanup never takes the files its parent still uses."""

from __future__ import annotations

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
    process = subprocess.Popen(["bash", "-c", f"""set -euo pipefail
. {LIBRARY}
file=$(mktemp -p {tmp_path} temp.XXXXXX)
remove_on_exit "$file"
touch {started}
sleep 30 & wait
"""])
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
