"""Issue 34, point 5: the head's start-vllm tells a slow start from a stuck one.

start-vllm waits until the head's vLLM answers the stack's probe. It reads vllm.service's
journal while it waits (by cursor) and what systemd knows of the unit, and fails, with the
journal's last lines and the likely cause, when the start is stuck: no new line for the
bound the stack planned (--stall-seconds, components/sizing/start_time.py
engine_start_stall_seconds), the engine's processes gone, or systemd restarting it in a
loop. A start that keeps writing lines is waited for, however long it takes in all.

vllm-cluster-node runs under a scratch root as tests/test_stack_probe.py runs it (its
Head), the test playing vllm.service: its journal is a file the test writes (one entry a
line, read by a journalctl stand-in that keeps cursors as journalctl does), and systemd's
view of the unit is a few files the test writes (read by a systemctl stand-in). The
engine's main process is a real process of this machine (a `sleep`, stopped or not), so
the script reads its state from /proc as on a node. Nothing listens on the head's vLLM
port until the test's engine ends its start."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components import bootstrap
from tests.test_gateway_pool import free_port
from tests.test_stack_probe import Head

# The journal as journalctl shows it to the script: `-u UNIT` (one unit here), `--since=@T`
# or `--after-cursor=C` (entries after it), `--show-cursor` (the last shown entry's cursor on a
# line of its own, as journalctl prints it), `-n N` (the last N). Its exit status is
# journalctl's (systemd 252, Debian 12's and the fleet hosts'): `--show-cursor` with no entry
# to show exits 1 after a `--since` (nothing to take a cursor from: measured with
# `journalctl -u x --since=@$(date +%s) --show-cursor -q; echo $?`), but 0 after an
# `--after-cursor`, which stays on the given entry and shows its cursor again (the fleet's
# hang test waited 600 s on a silent journal by cursor).
JOURNALCTL_DOUBLE = '''#!{python}
"""TEST DOUBLE of journalctl for tests/test_start_wait.py: vllm.service's journal is
{journal}, one entry a line ("epoch<TAB>message"); an entry's cursor is its line number."""
import sys

entries = [line.rstrip("\\n").split("\\t", 1) for line in open("{journal}")]
shown = list(enumerate(entries, 1))
lines, show_cursor, args = None, False, sys.argv[1:]
for index, arg in enumerate(args):
    if arg.startswith("--after-cursor="):
        shown = [entry for entry in shown if entry[0] > int(arg.split("=", 1)[1])]
    elif arg.startswith("--since=@"):
        shown = [entry for entry in shown if float(entry[1][0]) >= float(arg.split("@", 1)[1])]
    elif arg == "-n":
        lines = int(args[index + 1])
    elif arg == "--show-cursor":
        show_cursor = True
if lines is not None:
    shown = shown[-lines:]
for _, (_, message) in shown:
    print(message)
after = [arg.split("=", 1)[1] for arg in args if arg.startswith("--after-cursor=")]
if show_cursor and shown:
    print(f"-- cursor: {{shown[-1][0]}}")
elif show_cursor and after:
    print(f"-- cursor: {{after[-1]}}")
elif show_cursor:
    sys.exit(1)
'''

# systemd's view of vllm.service: one file a property under {unit}; `start` sets the state
# the test chose for a started unit (started-state, default active), `stop` inactive.
SYSTEMCTL_DOUBLE = '''#!{python}
"""TEST DOUBLE of systemctl for tests/test_start_wait.py: records each call in {log} and
keeps vllm.service's properties in files under {unit}."""
import sys
from pathlib import Path

unit, args = Path("{unit}"), sys.argv[1:]
with open("{log}", "a") as log:
    log.write(" ".join(args) + "\\n")


def read(name, default=""):
    path = unit / name
    return path.read_text().strip() if path.exists() else default


if args[0] == "show":
    names = [arg.split("=", 1)[1] for arg in args if arg.startswith("--property=")]
    names = [name for group in names for name in group.split(",")]
    names += [args[i + 1] for i, arg in enumerate(args) if arg == "-p"]
    defaults = dict(ActiveState="active", SubState="running", Result="success", NRestarts="0", MainPID="0")
    for name in names:
        value = read(name, defaults.get(name, ""))
        print(value if "--value" in args else f"{{name}}={{value}}")
elif args[0] == "is-active":
    sys.exit(0 if read("ActiveState", "active") == "active" else 3)
elif args[0] == "start":
    (unit / "ActiveState").write_text(read("started-state", "active"))
elif args[0] == "stop":
    (unit / "ActiveState").write_text("inactive")
'''


class StartingHead(Head):
    """A gang's head whose vllm.service the test plays: its journal and systemd's view."""

    def __init__(self, root: Path):
        self.port = free_port("127.0.0.1")
        super().__init__(root, [], self.port)
        self.journal, self.unit = root / "journal", root / "unit"
        self.journal.write_text("")
        self.unit.mkdir()
        doubles = {
            "journalctl": JOURNALCTL_DOUBLE.format(python=sys.executable, journal=self.journal),
            "systemctl": SYSTEMCTL_DOUBLE.format(python=sys.executable, unit=self.unit, log=self.systemctl),
        }
        for name, text in doubles.items():
            (root / "bin" / name).write_text(text)
        self.env |= {"VLLM_START_POLL_SECONDS": "0.5", "VLLM_START_TIMEOUT": "120"}

    def log(self, message: str) -> None:
        """One line of the engine in its journal, now."""
        with self.journal.open("a") as journal:
            journal.write(f"{time.time():.3f}\t{message}\n")

    def set(self, **properties: str) -> None:
        for name, value in properties.items():
            (self.unit / name).write_text(value)

    def started(self) -> bool:
        return self.systemctl.exists() and "start" in self.systemctl.read_text().split()

    def start_vllm_with(self, stall_seconds: int) -> subprocess.CompletedProcess:
        """start-vllm as the stack's command runs it, handed `stall_seconds`."""
        words = shlex.split(bootstrap.start_vllm_command(self.probe, stall_seconds))
        return self.run(*words[words.index("start-vllm") :], stdin=self.vllm_env, timeout=150)


class Engine:
    """What the test's vllm.service runs: a main process of this machine, and the answer
    to the stack's probe once its start ends (nothing listens on the port before)."""

    def __init__(self, head: StartingHead):
        self.head = head
        self.process = subprocess.Popen(["sleep", "300"])
        head.set(MainPID=str(self.process.pid))
        self.server: ThreadingHTTPServer | None = None

    def serve(self) -> None:
        class Answer(BaseHTTPRequestHandler):
            def do_POST(self):  # the probe: any request of the model's task
                body = json.dumps({"choices": [{"text": "!"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.head.port), Answer)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.process.send_signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def head(tmp_path):
    return StartingHead(tmp_path / "head")


@pytest.fixture
def engine(head):
    running = Engine(head)
    try:
        yield running
    finally:
        running.stop()


def play(head: StartingHead, scene) -> threading.Thread:
    """Run `scene` (the unit's life) once start-vllm has started the unit."""

    def after_start():
        deadline = time.monotonic() + 60
        while not head.started():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        scene()

    thread = threading.Thread(target=after_start, daemon=True)
    thread.start()
    return thread


def timed(call) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    result = call()
    return result, time.monotonic() - began


# --- a stuck start fails within its bound, saying why ---------------------------------------

# Seconds. The probe and the journal are read every 0.5 s, plus what each look costs on a
# busy machine (the stand-ins are Python): a gap of 1.5 s between two lines can look like
# 4 s in the script's whole seconds, still short of the bound.
STALL = 6


@pytest.mark.parametrize(
    "stopped, said",
    [
        (True, "its processes are stopped (a SIGSTOP or a debugger)"),
        (False, "its processes are alive and wait on something that does not come"),
    ],
)
def test_an_engine_that_stops_writing_and_never_answers_fails_within_the_bound_naming_why(head, engine, stopped, said):
    """The engine writes its first lines, then nothing, and never answers (frozen, or
    waiting forever on another node): start-vllm fails once the journal has been silent
    for the bound, shows the journal's last lines and names what the processes do, and
    stops the unit so that the next start-vllm starts it afresh instead of waiting on it."""
    if stopped:
        engine.process.send_signal(signal.SIGSTOP)

    def scene():
        head.log("INFO vLLM API server version 0.33.0")
        head.log("INFO Loading safetensors checkpoint shards: 0% Completed | 0/2")

    play(head, scene)
    result, seconds = timed(lambda: head.start_vllm_with(STALL))
    assert result.returncode == 1, result.stderr
    assert "vLLM's start is stuck, not slow" in result.stderr, result.stderr
    silent = re.search(r"vllm\.service wrote no line for (\d+) s \(the stack allows a start (\d+) s", result.stderr)
    assert silent and int(silent.group(1)) >= STALL == int(silent.group(2)), result.stderr
    assert said in result.stderr and f"sleep {engine.process.pid}" in result.stderr, result.stderr
    assert "Loading safetensors checkpoint shards: 0% Completed" in result.stderr  # the journal's last lines
    # Within the bound (and a look, and whole seconds), not the start's 120 s.
    assert STALL - 1 <= seconds < STALL + 6, seconds  # the script counts whole seconds
    calls = head.systemctl.read_text().splitlines()
    assert calls[-1] == "stop vllm.service" and calls.index("start --no-block vllm.service") < len(calls) - 1, calls


def test_a_slow_start_that_keeps_writing_is_waited_for_longer_than_the_bound(head, engine):
    """A start that takes twice the bound in all but writes a line every 1.5 s (each
    silence shorter than the bound) is slow, not stuck: start-vllm waits for its answer."""

    def scene():
        for shard in range(9):
            head.log(f"INFO Loading safetensors checkpoint shards: {shard} of 9")
            time.sleep(1.5)
        engine.serve()
        head.log("INFO Starting vLLM API server on http://127.0.0.1")

    scene_thread = play(head, scene)
    result, seconds = timed(lambda: head.start_vllm_with(STALL))
    scene_thread.join()
    assert result.returncode == 0, result.stderr
    assert seconds > 2 * STALL, seconds
    assert "stuck" not in result.stderr and "vLLM serves" in result.stderr, result.stderr
    calls = head.systemctl.read_text().splitlines()
    assert "stop vllm.service" not in calls[calls.index("start --no-block vllm.service") :], calls


def test_an_engine_that_writes_its_first_line_after_the_first_look_is_waited_for(head, engine):
    """The unit starts afresh (a failed one started again, as after a stuck start was
    stopped) and its engine writes nothing before start-vllm's first look at the journal:
    journalctl then has no entry to show (and exits 1), which is a start that has not
    written yet, not a failure. start-vllm waits, and serves once the engine does."""

    def scene():
        time.sleep(2)  # four looks with no entry
        head.log("INFO vLLM API server version 0.33.0")
        engine.serve()
        head.log("INFO Starting vLLM API server on http://127.0.0.1")

    head.set(ActiveState="failed", SubState="failed", Result="exit-code")
    scene_thread = play(head, scene)
    result = head.start_vllm_with(STALL)
    scene_thread.join()
    assert result.returncode == 0, result.stderr
    assert "starting vllm.service" in result.stderr and "vLLM serves" in result.stderr, result.stderr


def test_a_restart_loop_fails_at_the_second_restart_with_the_engines_error(head, engine):
    """vLLM exits at start the same way each time and systemd restarts it (Restart=always):
    the journal never goes quiet, but the second restart during the wait ends it, long
    before the bound, with the error the engine wrote."""

    def scene():
        for restart in range(1, 6):
            head.log("ValueError: The model's max seq len (131072) is larger than the KV cache can hold")
            head.log(f"vllm.service: Scheduled restart job, restart counter is at {restart}.")
            head.set(NRestarts=str(restart))
            time.sleep(1)

    play(head, scene)
    result, seconds = timed(lambda: head.start_vllm_with(600))
    assert result.returncode == 1, result.stderr
    assert "systemd restarted vllm.service 2 times while start-vllm waited" in result.stderr, result.stderr
    assert "ValueError: The model's max seq len" in result.stderr
    assert seconds < 10, seconds


def test_an_engine_whose_unit_is_gone_fails_at_once(head, engine):
    """The unit failed or was stopped (by hand, or with ray-head.service): nothing will
    answer, so start-vllm says so at its second look instead of waiting."""
    head.set(**{"started-state": "failed", "SubState": "failed", "Result": "exit-code"})
    play(head, lambda: head.log("vllm.service: Failed with result 'exit-code'."))
    result, seconds = timed(lambda: head.start_vllm_with(600))
    assert result.returncode == 1, result.stderr
    assert "vllm.service is failed (failed, result exit-code): its processes are gone" in result.stderr, result.stderr
    assert "Failed with result 'exit-code'" in result.stderr
    assert seconds < 10, seconds


@pytest.mark.parametrize("given", ["", "0", "ten", "-5"])
def test_start_vllm_refuses_a_missing_or_bad_stall_bound(head, given):
    probe = head.probe
    args = ["start-vllm", "--probe-route", probe.route, "--probe-body", probe.body_json()]
    refused = head.run(*args, *(["--stall-seconds", given] if given else []), stdin=head.vllm_env)
    assert refused.returncode == 1 and "--stall-seconds N" in refused.stderr, refused.stderr
    assert not head.systemctl.exists() or "start" not in head.systemctl.read_text()
