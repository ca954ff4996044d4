"""Idle stop on a GPU node (scripts/node/vllm-idle-check, issue 23): the judgement first
(a busy gang never stops; requests, logins and a stack command keep it up; nothing
counts before the engine answered since boot; exactly N idle minutes stop it), then
the script's main against vLLM's metrics text served over HTTP, with logind, utmp and
systemctl as the test doubles under tests/doubles/bin, then `vllm-cluster-node
idle-stop-config`, `idle-check` and `stop-now` run by bash under a scratch root."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK_PATH = ROOT / "scripts" / "node" / "vllm-idle-check"
NODE_SCRIPT = ROOT / "scripts" / "node" / "vllm-cluster-node"
LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
PYTHON_LIBRARY = ROOT / "scripts" / "lib" / "vllm_cluster_lib.py"
DOUBLES_BIN = ROOT / "tests" / "doubles" / "bin"


def load_check():
    loader = SourceFileLoader("vllm_idle_check", str(CHECK_PATH))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


CHECK = load_check()
WALL = 1_796_000_000.0  # 2026-11-30T...Z: the time of day the clock started


def metrics(running=0, waiting=0, finished=0, requests=None) -> dict:
    return {
        "running": running,
        "waiting": waiting,
        "finished": finished,
        "requests": finished if requests is None else requests,
    }


def kind(verdict: str) -> str:
    return verdict.split(":", 1)[0]


def armed_at(seconds: float, finished: float = 10, requests: float = 4) -> dict:
    state, verdict = CHECK.judge(
        seconds, WALL + seconds, metrics(finished=finished, requests=requests), {}, [], None, 5
    )
    assert kind(verdict) == "armed", verdict
    return state


UNREACHABLE = "the head's /metrics did not answer"


def quiet(now: float, state: dict, sample=None, sessions=(), lock=None, minutes=5):
    """One check at `now` with nobody about: the same counters as the clock's last
    (sample=UNREACHABLE: the head did not answer)."""
    if sample is None:
        sample = metrics(finished=state["finished"], requests=state["requests"])
    elif sample == UNREACHABLE:
        sample = None
    return CHECK.judge(now, WALL + now, sample, state, list(sessions), lock, minutes)


# --- the judgement --------------------------------------------------------------------


def test_exactly_n_quiet_minutes_stop_the_node_and_not_a_second_sooner():
    state = armed_at(100)
    state, verdict = quiet(100 + 5 * 60 - 1, state)
    assert kind(verdict) == "idle", verdict
    state, verdict = quiet(100 + 5 * 60, state)
    assert verdict == (f"stop: idle since {CHECK.utc(WALL + 100)}: no request and no login for 5 min; powering off")


def test_a_busy_engine_never_stops_however_long_it_runs():
    state = armed_at(0)
    for minute in range(1, 120):
        state, verdict = quiet(minute * 60, state, metrics(running=3, finished=10, requests=4))
        assert kind(verdict) == "active" and "3 requests running" in verdict, verdict
    state, verdict = quiet(120 * 60, state, metrics(waiting=1, finished=10, requests=4))
    assert kind(verdict) == "active" and "1 waiting" in verdict


def test_requests_finishing_between_checks_keep_it_up_and_the_clock_starts_after_the_last():
    state = armed_at(0)
    state, verdict = quiet(240, state, metrics(finished=12, requests=6))
    assert kind(verdict) == "active" and "2 new requests" in verdict, verdict
    state, verdict = quiet(240 + 299, state)
    assert kind(verdict) == "idle"
    assert kind(quiet(240 + 300, state)[1]) == "stop"


def test_the_stacks_own_one_token_probes_are_not_requests():
    # The watchdog's probe every 20 s finishes a request with max_tokens 1: `finished`
    # grows, `requests` (finished less the max_tokens <= 1 bucket) does not.
    state = armed_at(0)
    for check in range(1, 21):
        state, verdict = quiet(check * 15, state, metrics(finished=10 + check, requests=4))
        assert kind(verdict) in ("idle", "stop"), verdict
    assert kind(verdict) == "stop"


def test_a_probe_caught_running_by_a_check_does_not_restart_the_idle_clock():
    # The watchdog's 1-token probe every 20 s is in vLLM's running gauge while it runs;
    # a check every 15 s catches one now and then. Once it has finished as a 1-token
    # request and nothing else happened, the node is idle since before that reading:
    # it stops after exactly N minutes, as if the probe had never been seen.
    state = armed_at(0)  # finished 10, of which 6 were 1-token requests
    state, verdict = quiet(150, state, metrics(running=1, finished=10, requests=4))
    assert kind(verdict) == "active", verdict
    state, verdict = quiet(165, state, metrics(finished=11, requests=4))
    assert verdict.startswith(f"idle: since {CHECK.utc(WALL + 0)}"), verdict
    assert kind(quiet(299, state)[1]) == "idle"
    assert kind(quiet(300, state)[1]) == "stop"


def test_probes_caught_at_every_other_check_never_keep_the_node_up():
    # However often a probe is seen in flight, the node stops after N quiet minutes.
    state = armed_at(0)
    finished = 10
    for check in range(1, 21):
        running = check % 2  # every other check sees a probe running
        state, verdict = quiet(check * 15, state, metrics(running=running, finished=finished, requests=4))
        finished += running  # it finishes (a 1-token request) before the next check
    assert kind(verdict) == "stop", verdict


def test_a_request_seen_running_that_finishes_asking_for_more_than_a_token_is_use():
    state = armed_at(0)
    state, verdict = quiet(150, state, metrics(running=1, finished=10, requests=4))
    state, verdict = quiet(165, state, metrics(finished=11, requests=5))
    assert kind(verdict) == "active" and "1 new request" in verdict, verdict
    assert kind(quiet(165 + 299, state)[1]) == "idle"
    assert kind(quiet(165 + 300, state)[1]) == "stop"


def test_a_request_still_running_at_the_next_check_is_use_and_a_login_beside_a_probe_too():
    state = armed_at(0)
    state, _ = quiet(150, state, metrics(running=1, finished=10, requests=4))
    state, verdict = quiet(165, state, metrics(running=1, finished=10, requests=4))
    assert kind(verdict) == "active", verdict
    # It ran on (a long generation): at least until 165, whatever it finishes as.
    state, verdict = quiet(180, state, metrics(finished=11, requests=4))
    assert verdict.startswith(f"idle: since {CHECK.utc(WALL + 165)}"), verdict
    login = ["ubuntu (pts/0 from 198.51.100.7, logind session 3)"]
    state = armed_at(0)
    state, _ = quiet(150, state, metrics(running=1, finished=10, requests=4), sessions=login)
    state, verdict = quiet(165, state, metrics(finished=11, requests=4))
    assert verdict.startswith(f"idle: since {CHECK.utc(WALL + 150)}"), verdict


def test_a_counter_reset_is_a_restarted_engine_and_counts_as_activity():
    state = armed_at(0, finished=500, requests=300)
    state, verdict = quiet(200, state, metrics(finished=0, requests=0))
    assert kind(verdict) == "active" and "restarted" in verdict, verdict
    # From the new engine's count on, quiet again.
    state, verdict = quiet(200 + 300, state, metrics(finished=0, requests=0))
    assert kind(verdict) == "stop", verdict


def test_an_open_login_keeps_the_node_up():
    state = armed_at(0)
    session = ["ubuntu (pts/0 from 198.51.100.7, logind session 3)"]
    for minute in range(1, 30):
        state, verdict = quiet(minute * 60, state, sessions=session)
        assert kind(verdict) == "active" and "login sessions: ubuntu (pts/0" in verdict, verdict
    state, verdict = quiet(29 * 60 + 299, state)  # logged out after minute 29
    assert kind(verdict) == "idle"


def test_a_stack_command_holding_the_node_lock_keeps_the_node_up():
    state = armed_at(0)
    state, verdict = quiet(600, state, lock="/run/vllm-cluster-setup.lock")
    assert kind(verdict) == "active" and "a stack command holds /run/vllm-cluster-setup.lock" in verdict


def test_nothing_counts_before_the_engine_answered_since_boot():
    # A deploy, the first download of a model, the rebuild after a wake: hours of no
    # answer are never idle time.
    state: dict = {}
    for minute in range(0, 600, 5):
        state, verdict = CHECK.judge(minute * 60, WALL, None, state, [], None, 5)
        assert kind(verdict) == "waiting" and state == {}, verdict
    state, verdict = CHECK.judge(36_000, WALL + 36_000, metrics(finished=1), state, [], None, 5)
    assert kind(verdict) == "armed" and state["active_at"] == 36_000


def test_a_node_whose_gang_never_serves_powers_itself_off_after_the_grace_time():
    """A wake EC2 refused half-way, or an engine that cannot load: the engine never answers
    since boot. With a grace time the node powers off once that long passed without an
    answer, a login or a stack command (a deploy's long first download holds the lock)."""
    state: dict = {}
    for check in range(1, 60):
        state, verdict = CHECK.judge(check * 15, WALL + check * 15, None, state, [], None, 5, grace=600)
        if kind(verdict) == "stop":
            break
        assert kind(verdict) == "waiting" and "powering off after 600 s" in verdict, verdict
    # 600 s after the first check of this boot (15 s in), not a check sooner.
    assert check * 15 == 615 and "has not served since this boot" in verdict, (check, verdict)
    # A stack command under way (or a login) restarts the wait: a deploy is never cut short.
    state = {}
    state, _ = CHECK.judge(15, WALL, None, state, [], None, 5, grace=600)
    state, verdict = CHECK.judge(500, WALL + 500, None, state, [], "/run/vllm-cluster-setup.lock", 5, grace=600)
    assert kind(verdict) == "waiting"
    assert kind(CHECK.judge(1099, WALL + 1099, None, state, [], None, 5, grace=600)[1]) == "waiting"
    assert kind(CHECK.judge(1100, WALL + 1100, None, state, [], None, 5, grace=600)[1]) == "stop"
    # Once the engine answered, the grace plays no part: the idle clock does.
    armed, verdict = CHECK.judge(1000, WALL + 1000, metrics(finished=1), {}, [], None, 5, grace=600)
    assert kind(verdict) == "armed"
    assert kind(quiet(1000 + 299, armed)[1]) == "idle"


def test_an_unreachable_head_after_arming_counts_as_no_request():
    # A worker whose head stopped first: its /metrics does not answer.
    state = armed_at(0)
    state, verdict = quiet(60, state, sample=UNREACHABLE)
    assert kind(verdict) == "idle", verdict
    state, verdict = quiet(300, state, sample=UNREACHABLE)
    assert kind(verdict) == "stop", verdict


# --- vLLM's metrics as the real server writes them ----------------------------------------

# What vLLM's PrometheusStatLogger exposes (prometheus_client's text format): one
# request_success series per finished_reason, the max_tokens histogram's buckets
# (build_1_2_5_buckets) with its _count and _sum, two engines.
REAL_LOOKING = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} {running}
vllm:num_requests_running{{engine="1",model_name="m"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {stop}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} {length}
vllm:request_success_total{{engine="0",finished_reason="abort",model_name="m"}} 0.0
vllm:request_success_total{{engine="1",finished_reason="length",model_name="m"}} 1.0
# HELP vllm:request_success_created Count of successfully processed requests.
# TYPE vllm:request_success_created gauge
vllm:request_success_created{{engine="0",finished_reason="stop",model_name="m"}} 1.7964e+09
# HELP vllm:request_params_max_tokens Histogram of the max_tokens request parameter.
# TYPE vllm:request_params_max_tokens histogram
vllm:request_params_max_tokens_bucket{{engine="0",le="1.0",model_name="m"}} {probes}
vllm:request_params_max_tokens_bucket{{engine="0",le="2.0",model_name="m"}} {probes}
vllm:request_params_max_tokens_bucket{{engine="0",le="+Inf",model_name="m"}} {with_max}
vllm:request_params_max_tokens_count{{engine="0",model_name="m"}} {with_max}
vllm:request_params_max_tokens_sum{{engine="0",model_name="m"}} 4242.0
vllm:request_params_max_tokens_bucket{{engine="1",le="1.0",model_name="m"}} 1.0
vllm:request_params_max_tokens_bucket{{engine="1",le="+Inf",model_name="m"}} 1.0
"""


def real_looking(running=0, waiting=0, stop=5, length=3, probes=2, with_max=6) -> str:
    values = {
        "running": running,
        "waiting": waiting,
        "stop": stop,
        "length": length,
        "probes": probes,
        "with_max": with_max,
    }
    return REAL_LOOKING.format(**{name: f"{float(value)}" for name, value in values.items()})


def test_a_sample_sums_engines_and_reasons_and_leaves_the_one_token_requests_out():
    assert CHECK.sample(real_looking(running=2, waiting=1)) == {
        "running": 2.0,
        "waiting": 1.0,
        "finished": 9.0,  # 5 + 3 + 0 on engine 0, 1 on engine 1
        "requests": 6.0,  # less the 2 + 1 requests that asked for one token at most
    }


# --- the script's main, as the node runs it -------------------------------------------------


class Engine:
    """A local HTTP server answering /metrics with what `text` holds now."""

    def __init__(self):
        self.text = real_looking()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = engine.text.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine():
    running = Engine()
    yield running
    running.stop()


class Node:
    """What the check sees of the node: logind's sessions, utmp, systemctl (the
    doubles, on PATH first), its state and record directories."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.sessions, self.utmp = tmp_path / "logind-sessions", tmp_path / "utmp"
        self.systemctl = tmp_path / "systemctl.log"
        self.state, self.record = tmp_path / "run" / "idle-check.json", tmp_path / "var-lib-idle"
        self.sessions.write_text("")  # logind answers, nobody logged in
        self.env = {
            "PATH": f"{DOUBLES_BIN}:/usr/bin:/bin",
            "LOGINCTL_DOUBLE_SESSIONS": str(self.sessions),
            "WHO_DOUBLE_UTMP": str(self.utmp),
            "SYSTEMCTL_DOUBLE_LOG": str(self.systemctl),
            "NODE_NAME": "worker-1",
        }

    def check(self, url: str, minutes: int = 2, *locks: Path) -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            str(CHECK_PATH),
            "check",
            "--metrics",
            url,
            "--minutes",
            str(minutes),
            "--state",
            str(self.state),
            "--record",
            str(self.record),
        ]
        for lock in locks:
            command += ["--lock", str(lock)]
        return subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=30)

    def age(self, seconds: float) -> None:
        """Pretend the clock's last activity was `seconds` earlier."""
        state = json.loads(self.state.read_text())
        state["active_at"] -= seconds
        self.state.write_text(json.dumps(state))

    def powered_off(self) -> bool:
        return self.systemctl.exists() and "poweroff" in self.systemctl.read_text().splitlines()


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_the_check_arms_counts_and_powers_an_idle_node_off(engine, node):
    armed = node.check(engine.url)
    assert armed.returncode == 0, armed.stderr
    assert "[worker-1] idle check: armed: the engine answered" in armed.stderr
    assert "idle check: idle: since" in node.check(engine.url).stderr
    # 100 s, not 119: the real clock runs on between the checks (two seconds once, on a loaded CI).
    node.age(100)
    assert node.check(engine.url).stderr == "" and not node.powered_off()  # still idle: said once
    # The watchdog's probes finished meanwhile: not requests.
    engine.text = real_looking(length=9, probes=8, with_max=12)
    node.age(20)
    stopped = node.check(engine.url)
    assert stopped.returncode == 0, stopped.stderr
    idle_since = json.loads(node.state.read_text())["active_utc"]
    line = f"idle since {idle_since}: no request and no login for 2 min; powering off"
    assert f"[worker-1] {line}" in stopped.stderr
    assert node.systemctl.read_text().splitlines() == ["poweroff"]
    record = json.loads((node.record / "last-stop.json").read_text())
    assert record["by"] == "idle" and record["idle_since"] == idle_since and record["minutes"] == 2
    assert record["reason"] == line and record["stopped_at"] >= idle_since and record["boot_id"]


def test_the_check_never_arms_while_the_engine_does_not_answer(node, tmp_path):
    nowhere = "http://127.0.0.1:9/metrics"  # discard: nothing listens
    first = node.check(nowhere)
    assert "waiting: the engine has not answered /metrics since this boot" in first.stderr
    assert node.check(nowhere).stderr == "" and not node.powered_off()
    assert json.loads(node.state.read_text()) == {"verdict": "waiting"}


def test_a_worker_whose_head_is_gone_after_arming_powers_off(engine, node):
    assert node.check(engine.url).returncode == 0
    engine.stop()
    node.age(120)
    stopped = node.check(engine.url)
    assert "no request and no login for 2 min; powering off" in stopped.stderr and node.powered_off()


def test_new_requests_restart_the_clock(engine, node):
    node.check(engine.url)
    node.age(300)
    engine.text = real_looking(stop=7, with_max=8)  # two requests with max_tokens > 1 finished
    active = node.check(engine.url)
    assert "idle check: active: 2 new requests" in active.stderr and not node.powered_off()


@pytest.mark.parametrize(
    "where, line, seen",
    [
        ("logind", "3 ubuntu user active pts/0 198.51.100.7", "ubuntu (pts/0 from 198.51.100.7, logind session 3)"),
        # A stack command over SSH: pam_systemd registers it without a terminal.
        ("logind", "8 ubuntu user active - 10.99.0.10", "ubuntu (no tty from 10.99.0.10, logind session 8)"),
        # A host whose sshd has no pam_systemd: only utmp knows the terminal login.
        ("utmp", "ubuntu   pts/1        2026-12-02 11:58 (198.51.100.7)", "ubuntu pts/1 (utmp)"),
    ],
)
def test_a_login_session_keeps_the_node_up(engine, node, where, line, seen):
    node.check(engine.url)
    (node.sessions if where == "logind" else node.utmp).write_text(line + "\n")
    node.age(3600)
    active = node.check(engine.url)
    assert f"idle check: active: login sessions: {seen}" in active.stderr, active.stderr
    assert not node.powered_off()


def test_sessions_that_are_no_login_do_not_count(engine, node):
    # A greeter, and a logout whose leftover processes linger (closing).
    node.sessions.write_text("9 gdm greeter active - -\n4 ubuntu user closing pts/0 198.51.100.7\n")
    node.check(engine.url)
    node.age(120)
    assert node.check(engine.url).returncode == 0 and node.powered_off()


def test_a_host_without_logind_is_judged_by_utmp(engine, node):
    node.sessions.unlink()  # loginctl: "Failed to connect to bus"
    node.check(engine.url)
    node.age(120)
    assert node.check(engine.url).returncode == 0 and node.powered_off()


def test_a_stack_command_holding_a_node_lock_keeps_the_node_up(engine, node, tmp_path):
    locks = [tmp_path / "setup.lock", tmp_path / "stage-model.lock", tmp_path / "never-taken.lock"]
    node.check(engine.url, 2, *locks)
    with open(locks[1], "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as `exec 8>LOCK; flock 8` holds it
        node.age(3600)
        active = node.check(engine.url, 2, *locks)
        assert f"idle check: active: a stack command holds {locks[1]}" in active.stderr, active.stderr
        assert not node.powered_off()
    # Let go (the command ended): the lock file stays, nobody holds it.
    node.age(120)
    assert node.check(engine.url, 2, *locks).returncode == 0 and node.powered_off()


def test_stop_now_records_a_stop_by_hand(node):
    stopped = subprocess.run(
        [sys.executable, str(CHECK_PATH), "stop-now", "--record", str(node.record)],
        capture_output=True,
        text=True,
        env=node.env,
    )
    assert stopped.returncode == 0 and "[worker-1] stopped by hand" in stopped.stderr
    record = json.loads((node.record / "last-stop.json").read_text())
    assert record["by"] == "hand" and record["reason"] == "stopped by hand"
    assert node.powered_off()


# --- vllm-cluster-node idle-stop-config, idle-check and stop-now, run by bash ---------------


class NodeHost:
    """vllm-cluster-node and its library under a scratch root (as tests/test_host_ports.py
    does): /etc/vllm-cluster, /opt/vllm-cluster, /run and /var/lib moved there; node.env
    names the head; id says root; the doubles on PATH."""

    def __init__(self, tmp_path: Path, node: Node, head_url: str = "http://127.0.0.1:9/metrics"):
        self.root = root = tmp_path / "root"
        self.node = node
        install, config = root / "opt/vllm-cluster", root / "etc/vllm-cluster"
        for folder in (install / "bin", install / "lib", config, root / "run", root / "bin"):
            folder.mkdir(parents=True, exist_ok=True)
        host, port = head_url.split("//")[1].split("/")[0].split(":")
        (config / "node.env").write_text(
            f"NODE_NAME=worker-1\nNODE_ROLE=worker\nHEAD_IP={host}\nPORT_VLLM_API={port}\n"
        )

        def moved(text: str) -> str:
            for path in ("/etc/vllm-cluster", "/opt/vllm-cluster", "/run/vllm-cluster", "/var/lib/vllm-cluster"):
                text = text.replace(path, f"{root}{path}")
            return text

        (install / "lib/vllm-cluster-lib.sh").write_text(moved(LIBRARY.read_text()))
        (install / "lib/vllm_cluster_lib.py").write_text(PYTHON_LIBRARY.read_text())
        (install / "bin/vllm-cluster-node").write_text(moved(NODE_SCRIPT.read_text()))
        (install / "bin/vllm-idle-check").write_text(CHECK_PATH.read_text())
        (root / "bin/id").write_text("#!/bin/sh\necho 0\n")
        (root / "bin/id").chmod(0o755)
        # python3: the Python running the tests, as the node's own.
        (root / "bin/python3").symlink_to(sys.executable)
        self.env = {**node.env, "PATH": f"{root}/bin:{node.env['PATH']}"}
        self.env_file, self.clock = config / "idle-stop.env", root / "run/vllm-cluster/idle-check.json"
        self.record = root / "var/lib/vllm-cluster/idle/last-stop.json"

    def run(self, *args: str) -> subprocess.CompletedProcess:
        script = self.root / "opt/vllm-cluster/bin/vllm-cluster-node"
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=self.env, timeout=60)

    def systemctl_calls(self) -> list[str]:
        log = self.node.systemctl
        return log.read_text().splitlines() if log.exists() else []


def test_idle_stop_config_turns_the_timer_on_keeps_the_clock_and_turns_it_off(node, tmp_path):
    host = NodeHost(tmp_path, node)
    on = host.run("idle-stop-config", "--minutes", "30")
    assert on.returncode == 0, on.stderr
    assert "IDLE_STOP_MINUTES=30\n" in host.env_file.read_text()
    assert host.env_file.stat().st_mode & 0o777 == 0o600
    assert host.systemctl_calls() == ["enable --now vllm-idle-check.timer"]
    assert "powers itself off after 30 idle minutes (changed)" in on.stderr

    # The same setting again (every `pulumi up` may send it): the clock runs on.
    host.clock.parent.mkdir(parents=True, exist_ok=True)
    host.clock.write_text('{"armed": true}')
    again = host.run("idle-stop-config", "--minutes", "30")
    assert again.returncode == 0 and "(unchanged)" in again.stderr and host.clock.exists()

    # A new setting restarts the idle clock.
    assert host.run("idle-stop-config", "--minutes", "5").returncode == 0
    assert "IDLE_STOP_MINUTES=5\n" in host.env_file.read_text() and not host.clock.exists()

    host.clock.write_text('{"armed": true}')
    off = host.run("idle-stop-config", "--minutes", "0")
    assert off.returncode == 0, off.stderr
    assert host.systemctl_calls()[-1] == "disable --now vllm-idle-check.timer"
    assert not host.env_file.exists() and not host.clock.exists()
    assert host.run("idle-stop-config", "--minutes", "0").returncode == 0  # off twice: still off


@pytest.mark.parametrize("minutes", ["", "-1", "1.5", "thirty", "10081"])
def test_idle_stop_config_refuses_what_is_no_number_of_minutes(node, tmp_path, minutes):
    host = NodeHost(tmp_path, node)
    refused = host.run("idle-stop-config", "--minutes", minutes)
    assert refused.returncode == 1 and "a whole number from 0 (never stop) to 10080" in refused.stderr
    assert not host.env_file.exists() and host.systemctl_calls() == []


def test_idle_check_does_nothing_while_idle_stop_is_off(node, tmp_path):
    host = NodeHost(tmp_path, node)
    assert host.run("idle-check").returncode == 0
    assert not host.clock.exists() and host.systemctl_calls() == []


def test_idle_check_through_the_node_script_powers_the_node_off(engine, node, tmp_path):
    host = NodeHost(tmp_path, node, engine.url)
    assert host.run("idle-stop-config", "--minutes", "1").returncode == 0
    armed = host.run("idle-check")
    assert armed.returncode == 0 and "[worker-1] idle check: armed" in armed.stderr, armed.stderr
    state = json.loads(host.clock.read_text())
    state["active_at"] -= 60
    host.clock.write_text(json.dumps(state))
    stopped = host.run("idle-check")
    assert stopped.returncode == 0, stopped.stderr
    assert f"idle since {state['active_utc']}: no request and no login for 1 min; powering off" in stopped.stderr
    assert host.systemctl_calls()[-1] == "poweroff"
    assert json.loads(host.record.read_text())["by"] == "idle"


def test_a_node_whose_engine_never_answers_powers_off_through_the_node_script(node, tmp_path):
    """idle-stop-config --grace-seconds reaches the check: a boot whose engine never
    answered powers the node off after it, recorded as never-served."""
    host = NodeHost(tmp_path, node)  # its head's /metrics: nothing listens there
    configured = host.run("idle-stop-config", "--minutes", "30", "--grace-seconds", "1200")
    assert configured.returncode == 0, configured.stderr
    assert "IDLE_STOP_GRACE_SECONDS=1200\n" in host.env_file.read_text()
    waiting = host.run("idle-check")
    assert waiting.returncode == 0 and "powering off after 1200 s" in waiting.stderr, waiting.stderr
    state = json.loads(host.clock.read_text())
    state["waiting_since"] -= 1200
    host.clock.write_text(json.dumps(state))
    stopped = host.run("idle-check")
    assert "has not served since this boot" in stopped.stderr, stopped.stderr
    assert host.systemctl_calls()[-1] == "poweroff"
    record = json.loads(host.record.read_text())
    assert record["by"] == "never-served" and record["grace_seconds"] == 1200
    assert host.run("idle-stop-config", "--minutes", "30", "--grace-seconds", "soon").returncode == 1


def test_idle_check_passes_the_node_locks_the_commands_take(engine, node, tmp_path):
    """The locks the check tries are the ones setup, stage-model and prepare-serve hold."""
    host = NodeHost(tmp_path, node, engine.url)
    assert host.run("idle-stop-config", "--minutes", "1").returncode == 0
    host.run("idle-check")
    with open("/run/vllm-cluster-setup.lock".replace("/run", f"{host.root}/run"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        active = host.run("idle-check")
    assert "a stack command holds" in active.stderr and "vllm-cluster-setup.lock" in active.stderr, active.stderr
    text = NODE_SCRIPT.read_text()
    assert 'exec 8>"$STAGE_MODEL_LOCK"' in text and 'exec 7>"$PREPARE_SERVE_LOCK"' in text
    assert 'exec 9>"$SETUP_LOCK"' in LIBRARY.read_text()


def test_stop_now_through_the_node_script(node, tmp_path):
    host = NodeHost(tmp_path, node)
    stopped = host.run("stop-now")
    assert stopped.returncode == 0 and "[worker-1] stopped by hand" in stopped.stderr, stopped.stderr
    assert host.systemctl_calls() == ["poweroff"] and json.loads(host.record.read_text())["by"] == "hand"


def test_the_timer_runs_the_check_every_15_seconds_and_its_service_the_subcommand():
    units = ROOT / "scripts" / "node" / "units"
    timer = (units / "vllm-idle-check.timer").read_text()
    assert "OnUnitActiveSec=15\n" in timer and "AccuracySec=1\n" in timer and "WantedBy=timers.target" in timer
    service = (units / "vllm-idle-check.service").read_text()
    assert "ExecStart=/opt/vllm-cluster/bin/vllm-cluster-node idle-check\n" in service
    assert "Type=oneshot" in service


def test_the_doubles_stand_in_for_tools_the_machine_running_the_tests_may_have():
    for name in ("loginctl", "who", "systemctl"):
        assert os.access(DOUBLES_BIN / name, os.X_OK)
        assert "TEST DOUBLE" in (DOUBLES_BIN / name).read_text()


# --- against the vLLM test double's metrics -------------------------------------------------


@pytest.fixture
def double(tmp_path, monkeypatch):
    from tests.test_watchdog import Double

    monkeypatch.setenv("VLLM_API_KEY", "test-key")
    (tmp_path / "double").mkdir()
    running = Double(tmp_path / "double")
    try:
        yield running
    finally:
        running.stop()


def completion(double, max_tokens: int) -> str:
    from tests.test_watchdog import CHECK as WATCHDOG

    body = {"model": double.model, "prompt": "Hello", "max_tokens": max_tokens}
    return WATCHDOG.fetch(f"{double.url}/v1/completions", 10, body)[0]


def test_the_double_exports_finished_requests_by_reason_and_the_max_tokens_histogram(double):
    assert completion(double, 1) == completion(double, 3) == "200"
    text = double.get("/metrics")[1]
    model = f'model_name="{double.model}"'
    for line in (
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{engine="0",finished_reason="length",{model}}} 2.0',
        f'vllm:request_success_total{{engine="0",finished_reason="stop",{model}}} 0.0',
        "# TYPE vllm:request_params_max_tokens histogram",
        f'vllm:request_params_max_tokens_bucket{{engine="0",le="1.0",{model}}} 1.0',
        f'vllm:request_params_max_tokens_bucket{{engine="0",le="2.0",{model}}} 1.0',
        f'vllm:request_params_max_tokens_bucket{{engine="0",le="5.0",{model}}} 2.0',
        f'vllm:request_params_max_tokens_bucket{{engine="0",le="+Inf",{model}}} 2.0',
        f'vllm:request_params_max_tokens_count{{engine="0",{model}}} 2.0',
        f'vllm:request_params_max_tokens_sum{{engine="0",{model}}} 4.0',
    ):
        assert line in text.splitlines(), line
    assert CHECK.sample(text) == {"running": 0.0, "waiting": 0.0, "finished": 2.0, "requests": 1.0}


def test_the_watchdogs_probes_on_the_double_leave_a_node_idle_and_a_clients_request_does_not(double, node):
    url = f"{double.url}/metrics"
    assert "armed" in node.check(url).stderr
    for _ in range(3):  # the watchdog's 1-token probes
        assert completion(double, 1) == "200"
    node.age(60)
    assert "idle: since" in node.check(url).stderr and not node.powered_off()
    assert completion(double, 16) == "200"  # a client's request
    assert "idle check: active: 1 new request" in node.check(url).stderr
    node.age(120)
    assert node.check(url).returncode == 0 and node.powered_off()


def test_the_idle_checks_units_reach_the_node_and_go_with_vllm_cluster_remove():
    from components import bootstrap

    assert {"vllm-idle-check.service", "vllm-idle-check.timer"} <= set(bootstrap.NODE_UNITS)
    remove = (ROOT / "scripts" / "lib" / "vllm-cluster-remove").read_text()
    removed = re.search(r"^NODE_UNITS=\((.*)\)$", remove, re.M).group(1).split()
    assert sorted(removed) == sorted(bootstrap.NODE_UNITS)
    # Timers first: nothing starts a check again while the services stop.
    assert removed.index("vllm-idle-check.timer") < removed.index("vllm-idle-check.service")
