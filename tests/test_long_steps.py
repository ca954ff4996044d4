"""Long steps on the hosts speak, and the hosts' sshd keeps idle sessions alive (issue 19,
point 5): pulumi-command's SSH client sends no keepalives (provider/pkg/provider/remote/
connection.go builds an ssh.ClientConfig without them) and sshd's ClientAliveInterval is
0, so a NAT or firewall with an idle timeout drops a session that prints nothing. The
library's with_progress and ensure_sshd_keepalive (scripts/lib/vllm-cluster-lib.sh), run
by bash as the scripts run them."""

from __future__ import annotations

import itertools
import queue
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.test_host_library import GATEWAY_SCRIPT, LIBRARY, NODE_SCRIPT, run_with_library, shell_functions


def test_a_long_step_reports_progress_every_interval_and_keeps_its_status(tmp_path):
    """The test ends the step itself once it has heard three notes: in CI's niced worker
    (beside the fleet's tests on two cores) bash may take seconds to start and a second's
    wake-up may come late, so how many notes fit in a fixed sleep is not known."""
    flag = tmp_path / "done"
    script = (
        f"set -euo pipefail\n. {LIBRARY}\n"
        f"step() {{ until [ -e {flag} ]; do sleep 0.05; done; return 7; }}\n"
        'PROGRESS_SECONDS=1 with_progress "waiting for the test" step || echo "status $?"\n'
        'with_progress "failing" false || echo "status $?"\n'
        'with_progress "a function in this shell" eval "exec 7>/dev/null; answer=42"; echo "answer $answer"\n'
    )
    process = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True)
    reader.start()
    heard, deadline = [], time.monotonic() + 60
    try:
        while len([line for line in heard if "still running after" in line]) < 3:
            heard.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
    except queue.Empty:
        pytest.fail(f"fewer than three notes in 60 s: {heard}")
    finally:
        flag.touch()
    # The reporter ends with the step: the script's stderr closes as it exits.
    try:
        process.wait(timeout=20)  # it prints a few lines: its stdout pipe does not fill
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the script did not end after its step")
    stdout = process.stdout.read()
    reader.join(timeout=20)
    assert not reader.is_alive(), "the reporter outlived the script"
    heard += list(lines.queue)
    assert process.returncode == 0, heard
    notes = [line for line in heard if "still running after" in line]
    assert all("waiting for the test" in note for note in notes), heard
    # Each note says how long the step has run: at least an interval, later each time.
    seconds = [int(re.search(r"still running after (\d+) s", note).group(1)) for note in notes]
    assert seconds[0] >= 1 and all(a < b for a, b in itertools.pairwise(seconds)), heard
    assert "status 7" in stdout and "status 1" in stdout and "answer 42" in stdout


def test_a_failing_long_step_ends_the_script_and_its_reporter_at_once(tmp_path):
    """Under set -e the step's failure ends the script; the reporter, which holds the
    session's stderr, must not keep the remote command open after it."""
    # A reporter that outlived the script holds its stderr and the run hangs; it does not
    # overrun by seconds. 20 s, not 4: in CI's niced worker bash alone may take 2 s to start.
    try:
        result = run_with_library(
            'PROGRESS_SECONDS=1 with_progress "doomed" bash -c "sleep 1.5; exit 3"\necho not here', timeout=20
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the reporter outlived the script")
    assert result.returncode == 3 and "not here" not in result.stdout


def test_the_reporter_does_not_hold_the_setup_or_wheelhouse_lock(tmp_path):
    """A lock the script holds on fd 8 or 9 is free once the script lets it go, also
    while a reporter (forked with the script's descriptors) still runs."""
    lock = tmp_path / "lock"
    result = run_with_library(
        f"exec 9>{lock}; flock 9\n"
        f"release() {{ sleep 0.5; exec 9>&-; flock -n {lock} true && echo free; }}\n"
        'PROGRESS_SECONDS=1 with_progress "holding" release'
    )
    assert result.returncode == 0 and "free" in result.stdout, result.stderr


def keepalive_host(tmp_path: Path, active: bool = True) -> tuple[Path, dict[str, str]]:
    """Stand-ins for sshd (validates; -T shows the drop-in's values) and systemctl
    (ssh.service active or not), both logging their arguments."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stand_ins = {
        # The real sshd -t refuses to run without its privilege separation directory.
        "sshd": f'echo "sshd $*" >>{calls}\n'
        f'[ -d {tmp_path}/run-sshd ] || {{ echo "Missing privilege separation directory: /run/sshd" >&2; exit 255; }}\n'
        f'[ "$1" = -T ] && sed -n "s/^ClientAlive\\(Interval\\|CountMax\\) /clientalive\\L\\1 /p" '
        f"{tmp_path}/sshd_config.d/*.conf\nexit 0\n",
        "systemctl": f'echo "systemctl $*" >>{calls}\ncase "$*" in *is-active*) exit {0 if active else 3} ;; esac\n',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SSHD_CONFIG_DIR": str(tmp_path / "sshd_config.d")}
    return calls, {**env, "SSHD_RUN_DIR": str(tmp_path / "run-sshd")}


def test_sshd_sends_keepalives_and_is_reloaded_only_when_its_drop_in_changed(tmp_path):
    calls, env = keepalive_host(tmp_path)
    first = run_with_library("ensure_sshd_keepalive", env=env)
    assert first.returncode == 0, first.stderr
    (drop_in,) = (tmp_path / "sshd_config.d").glob("*.conf")
    text = drop_in.read_text()
    assert "ClientAliveInterval 15\n" in text and "ClientAliveCountMax 8\n" in text
    # sshd -t refuses to run without its privilege separation directory (Ubuntu 24.04 makes
    # it only when ssh.socket first starts sshd): the function makes it first.
    assert (tmp_path / "run-sshd").is_dir()
    log = calls.read_text().splitlines()
    # Checked before the reload (a bad file would keep sshd from starting again), then a
    # reload: sshd re-reads its configuration; running sessions are not cut.
    assert log.index("sshd -t") < log.index("systemctl reload ssh.service"), log
    assert not any("restart" in line for line in log), log
    calls.unlink()
    again = run_with_library("ensure_sshd_keepalive", env=env)
    assert again.returncode == 0, again.stderr
    assert not calls.exists() or "reload" not in calls.read_text(), "reloaded although nothing changed"


def test_a_stopped_sshd_is_not_started_for_keepalives(tmp_path):
    """Ubuntu 24.04 starts sshd from ssh.socket at the first connection: then it reads
    the drop-in itself, and nothing is to reload."""
    calls, env = keepalive_host(tmp_path, active=False)
    result = run_with_library("ensure_sshd_keepalive", env=env)
    assert result.returncode == 0, result.stderr
    assert not any(word in calls.read_text() for word in ("reload", "restart", "start ssh"))


def test_the_node_setup_makes_sshd_send_keepalives_before_its_long_steps():
    setup = shell_functions(NODE_SCRIPT)["cmd_setup"].splitlines()
    assert "ensure_sshd_keepalive" in setup
    assert setup.index("ensure_sshd_keepalive") < setup.index('install_node_software "$WHEELHOUSE"')


def test_the_gateway_setup_makes_sshd_send_keepalives_too():
    """The gateway's commands wait too (a node's login, a drain's requests in flight):
    its sshd sends keepalives from its setup on, with the library's one function."""
    setup = shell_functions(GATEWAY_SCRIPT)["cmd_setup"].splitlines()
    assert "ensure_sshd_keepalive" in setup
    assert "ensure_sshd_keepalive() {" not in NODE_SCRIPT.read_text(), "one function, in the library"
