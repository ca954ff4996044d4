"""The vLLM watchdog's judgement (scripts/node/vllm-watchdog-check): restart only on
evidence of a dead engine, never because a saturated server answers slowly. Then the
same file against the vLLM test double, and the double's imitation of what the
watchdog and the gateway see: vLLM's metrics, a saturated or hung engine, uvicorn's
keep-alive."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import redirect_stdout
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from io import StringIO
from pathlib import Path

import pytest

from components import api_routes

ROOT = Path(__file__).resolve().parent.parent
CHECK_PATH = ROOT / "scripts" / "node" / "vllm-watchdog-check"
DOUBLE = ROOT / "tests" / "doubles" / "vllm_double"


def load_check():
    loader = SourceFileLoader("vllm_watchdog_check", str(CHECK_PATH))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


CHECK = load_check()
judge = CHECK.judge


def at(seconds: float, running: float = 0, waiting: float = 0, tokens: float = 0) -> dict:
    return {"at": seconds, "running": running, "waiting": waiting, "tokens": tokens}


def kind(verdict: str) -> str:
    return verdict.split(":", 1)[0]


# --- the verdict ------------------------------------------------------------------------


def test_a_completion_that_answers_is_healthy():
    assert judge("200", "200", None, None, served=True) == "healthy"


def test_a_saturated_server_is_busy_not_dead():
    # The probe waited 60 s behind a full batch, but the batch keeps producing tokens.
    verdict = judge(
        "200",
        "timeout",
        at(100, running=256, waiting=40, tokens=91_000),
        at(80, running=256, waiting=35, tokens=60_000),
        served=True,
    )
    assert kind(verdict) == "busy", verdict
    assert "+31000 tokens in 20 s" in verdict


def test_requests_running_without_a_token_between_two_samples_is_dead():
    verdict = judge("200", "timeout", at(100, running=12, tokens=5000), at(80, running=12, tokens=5000), served=True)
    assert kind(verdict) == "dead", verdict
    assert "12 running" in verdict and "no token in 20 s" in verdict


def test_requests_only_waiting_without_a_token_is_dead():
    # Nothing runs although requests wait and the KV cache is free: the scheduler is stuck.
    verdict = judge("200", "timeout", at(100, waiting=3, tokens=70), at(75, waiting=2, tokens=70), served=True)
    assert kind(verdict) == "dead", verdict


def test_connection_refused_by_a_server_that_was_serving_is_dead():
    assert kind(judge("refused", "none", None, None, served=True)) == "dead"


def test_connection_refused_before_it_ever_served_is_starting():
    # vLLM loading its model: restarting it would only start the load again.
    assert kind(judge("refused", "none", None, None, served=False)) == "starting"
    assert kind(judge("timeout", "none", None, None, served=False)) == "starting"


@pytest.mark.parametrize("health, completion", [("503", "none"), ("200", "500"), ("200", "503")])
def test_a_5xx_answer_is_dead(health, completion):
    verdict = judge(health, completion, at(100, tokens=1), at(80, tokens=0), served=True)
    assert kind(verdict) == "dead" and "HTTP 5" in verdict, verdict


def test_a_timeout_on_an_idle_engine_without_progress_is_dead():
    # Chosen: a live idle engine answers one token in milliseconds and shows the probe in
    # its gauges. Zeros that do not move and no token for the whole window mean the engine
    # takes no requests (its gauges freeze at the last values when it hangs).
    verdict = judge("200", "timeout", at(100, tokens=42), at(80, tokens=42), served=True)
    assert kind(verdict) == "dead", verdict


def test_a_slow_answer_alone_is_never_dead():
    """Whatever the probes say short of refused or 5xx: without two samples that
    show requests and no token, the verdict is not dead."""
    for health, completion in (("200", "timeout"), ("timeout", "none"), ("200", "failed"), ("failed", "none")):
        assert kind(judge(health, completion, None, None, served=True)) == "busy"
        assert kind(judge(health, completion, at(100, running=4), None, served=True)) == "busy"
        # Samples too close to say anything, or a counter that went back (a new process).
        assert (
            kind(judge(health, completion, at(100, running=4, tokens=7), at(95, running=4, tokens=7), True)) == "busy"
        )
        assert (
            kind(judge(health, completion, at(100, running=4, tokens=7), at(70, running=4, tokens=9), True)) == "busy"
        )
        assert (
            kind(judge(health, completion, at(100, running=4, tokens=8), at(80, running=4, tokens=7), True)) == "busy"
        )


def test_a_4xx_answer_is_a_configuration_problem_not_a_dead_engine():
    verdict = judge("200", "401", None, None, served=True)
    assert kind(verdict) == "healthy" and "401" in verdict


def test_metrics_are_read_as_vllm_exposes_them():
    text = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 1.5e+06
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7960496384666417e+09
vllm:prompt_tokens_total{engine="0",model_name="m"} 250.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 9.0
"""
    assert CHECK.sample(text, 7.0) == at(7.0, running=5, waiting=1, tokens=1_500_250)


def test_probes_tell_refused_from_timeout_from_a_broken_answer():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert CHECK.fetch(f"http://127.0.0.1:{port}/health", 2)[0] == "refused"
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        assert CHECK.fetch(f"http://127.0.0.1:{silent.getsockname()[1]}/health", 0.5)[0] == "timeout"
    with socket.socket() as rude:  # accepts, then hangs up without an answer
        rude.bind(("127.0.0.1", 0))
        rude.listen()
        hangup = threading.Thread(target=lambda: rude.accept()[0].close())
        hangup.start()
        assert CHECK.fetch(f"http://127.0.0.1:{rude.getsockname()[1]}/health", 2)[0] == "failed"
        hangup.join()


# --- the check against the vLLM test double ----------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Double:
    """The vLLM test double serving on this machine (no Ray: a single-GPU server)."""

    def __init__(self, workdir: Path, keep_alive: int = 5, extra_args: tuple[str, ...] = (), api_key: str = "test-key"):
        self.extra_args = extra_args
        (workdir / "model").mkdir(parents=True)
        (workdir / "model" / "config.json").write_text("{}")
        self.model = str(workdir / "model")
        self.control = workdir / "mode"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "double.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(DOUBLE),
            "VLLM_API_KEY": api_key,
            "VLLM_DOUBLE_CONTROL": str(self.control),
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(keep_alive),
        }
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm_double.cli",
                    "serve",
                    self.model,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    *extra_args,
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while self.get("/health")[0] != 200:
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the double did not serve within 20 s:\n{self.log.read_text()}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.status, response.read().decode()
        except OSError:
            return 0, ""

    def metrics(self) -> dict:
        return CHECK.sample(self.get("/metrics")[1], time.monotonic())

    def switch(self, mode: str) -> None:
        """The TEST DOUBLE control; waits until the engine follows it."""
        followed = self.log.read_text().count(f"-> {mode}\n")
        self.control.write_text(mode + "\n")
        deadline = time.monotonic() + 5
        while self.log.read_text().count(f"-> {mode}\n") == followed:
            assert time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.1)

    def probe(self) -> api_routes.Probe:
        """The stack's probe of this model (its task's request), as the head keeps it."""
        return api_routes.stack_probe(self.extra_args, self.model)

    def post(self, route: str, body: dict) -> str:
        return CHECK.fetch(f"{self.url}{route}", 5, {"model": self.model, **body})[0]

    def completion(self, timeout: float) -> str:
        return CHECK.fetch(
            f"{self.url}/v1/completions", timeout, {"model": self.model, "prompt": "Hi", "max_tokens": 2}
        )[0]


@pytest.fixture
def double(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "test-key")  # where the check reads it, as on the node
    running = Double(tmp_path)
    try:
        yield running
    finally:
        running.stop()


def run_check(double: Double, state: Path, window: float | None = None) -> str:
    """One watchdog run as the node makes it (the file's main), with a 3 s probe instead
    of 60 (and, given `window`, that many seconds instead of WINDOW's 15)."""
    out = StringIO()
    original = CHECK.PROBE_TIMEOUT, CHECK.WINDOW
    CHECK.PROBE_TIMEOUT, CHECK.WINDOW = 3, window or CHECK.WINDOW
    probe = double.probe()
    try:
        with redirect_stdout(out):
            CHECK.main(double.url, probe.route, probe.body_json(), "4242", str(state))
    finally:
        CHECK.PROBE_TIMEOUT, CHECK.WINDOW = original
    return out.getvalue().strip()


def probe_seconds(verdict: str) -> int:
    """N in a verdict's "in N s": the seconds between the two samples it judged."""
    match = re.search(r" in (\d+) s\b", verdict)
    assert match, verdict
    return int(match[1])


def age_sample(state: Path, seconds: float) -> None:
    """Pretend the stored sample was taken `seconds` earlier (the timer's interval)."""
    saved = json.loads(state.read_text())
    saved["sample"]["at"] -= seconds
    state.write_text(json.dumps(saved))


def test_the_double_exposes_vllms_metric_names(double):
    text = double.get("/metrics")[1]
    for line in (
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:num_requests_waiting gauge",
        "# TYPE vllm:generation_tokens_total counter",
        "# TYPE vllm:prompt_tokens_total counter",
    ):
        assert line in text
    assert f'vllm:generation_tokens_total{{engine="0",model_name="{double.model}"}} 0.0' in text
    assert double.completion(5) == "200"
    assert double.metrics()["tokens"] == 3  # 2 generated, 1 prompt


def test_the_check_judges_the_double_healthy_busy_and_dead(double, tmp_path):
    state = tmp_path / "watchdog.json"
    assert run_check(double, state) == "healthy"

    double.switch("saturated")
    first = run_check(double, state)  # the probe waits beyond its timeout
    assert kind(first) == "busy", first
    age_sample(state, 20)
    saturated = run_check(double, state)
    assert kind(saturated) == "busy" and "tokens in" in saturated, saturated
    # The probe that gave up is dropped (the double looks every 0.5 s), as vLLM aborts it.
    deadline = time.monotonic() + 3
    while double.metrics()["waiting"] != 0:
        assert time.monotonic() < deadline, "the double kept a request whose client went away"
        time.sleep(0.1)

    double.switch("hung")
    age_sample(state, 20)
    run_check(double, state)  # tokens came between the last sample and the hang
    age_sample(state, 20)
    hung = run_check(double, state)
    assert kind(hung) == "dead" and "8 running" in hung and "no token" in hung, hung

    double.switch("normal")
    assert run_check(double, state) == "healthy"


# A pooling model: vLLM serves it no /v1/completions. The watchdog sends the stack's probe
# of its task; with a completion it saw only 404s, "healthy" whatever the engine did.
POOLING_MODELS = {
    "embed": ("--runner", "pooling", "--pooler-config.task", "embed"),
    "classify": ("--convert", "classify"),
}


@pytest.fixture(params=sorted(POOLING_MODELS))
def pooling_double(request, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "test-key")
    running = Double(tmp_path, extra_args=POOLING_MODELS[request.param])
    try:
        yield running
    finally:
        running.stop()


def test_the_pooling_double_serves_its_tasks_routes_and_no_completion(pooling_double):
    assert pooling_double.completion(5) == "404"
    assert pooling_double.post("/v1/chat/completions", {"messages": []}) == "404"
    assert pooling_double.post("/pooling", {"input": "Hello"}) == "200"
    embeds = "--pooler-config.task" in pooling_double.extra_args
    assert pooling_double.post("/v1/embeddings", {"input": "Hello"}) == ("200" if embeds else "404")
    assert pooling_double.post("/classify", {"input": "Hello"}) == ("404" if embeds else "200")
    # A classifier with two labels has no scoring routes (vLLM's enable_scoring_api).
    assert pooling_double.post("/v1/score", {"text_1": "a", "text_2": "b"}) == ("200" if embeds else "404")
    assert pooling_double.post(pooling_double.probe().route, {}) == "400"  # its input is missing


def test_the_check_judges_a_pooling_engine_healthy_busy_and_dead_by_its_own_probe(pooling_double, tmp_path):
    double, state = pooling_double, tmp_path / "watchdog.json"
    assert run_check(double, state) == "healthy"

    double.switch("saturated")
    assert kind(run_check(double, state)) == "busy"
    age_sample(state, 20)
    saturated = run_check(double, state)
    # The batch reads prompts and generates nothing: progress is still progress.
    assert kind(saturated) == "busy" and "tokens in" in saturated, saturated

    double.switch("hung")
    age_sample(state, 20)
    run_check(double, state)  # tokens came between the last sample and the hang
    age_sample(state, 20)
    hung = run_check(double, state)
    assert kind(hung) == "dead" and "8 running" in hung and "no token" in hung, hung

    double.switch("normal")
    assert run_check(double, state) == "healthy"


def test_a_hang_that_began_since_the_last_run_is_dead_in_the_first_run_that_waits_out_the_window(double, tmp_path):
    """The run before the hang stored a sample; tokens came after it, then the engine
    froze. A probe that waits a whole window is evidence of its own: the gauges and
    counters read as it starts and as it gives up show requests and no token, so this
    run says dead, not "busy" on progress made before the hang (one run, not two, sooner
    to the restart a hang needs)."""
    state = tmp_path / "watchdog.json"
    assert run_check(double, state, window=2) == "healthy"
    double.switch("saturated")
    time.sleep(0.6)  # tokens after the stored sample
    double.switch("hung")
    age_sample(state, 20)
    hung = run_check(double, state, window=2)
    # Judged on the samples around the 3 s probe (3 s and the metrics' fetches), not on
    # the stored one, 20 s older.
    assert kind(hung) == "dead" and "no token in" in hung and 3 <= probe_seconds(hung) < 20, hung


def test_a_saturated_server_is_busy_by_the_tokens_made_while_the_probe_waited(double, tmp_path):
    state = tmp_path / "watchdog.json"
    assert run_check(double, state, window=2) == "healthy"
    double.switch("saturated")
    age_sample(state, 20)  # the stored sample would say "in 23 s" or more
    busy = run_check(double, state, window=2)
    # Judged on the samples around the 3 s probe (3 s and the metrics' fetches).
    assert kind(busy) == "busy" and "tokens in" in busy and 3 <= probe_seconds(busy) < 20, busy


def test_the_check_says_dead_when_a_server_that_served_refuses(double, tmp_path):
    state = tmp_path / "watchdog.json"
    assert run_check(double, state) == "healthy"
    double.stop()
    assert kind(run_check(double, state)) == "dead"


def test_a_saturated_double_keeps_producing_tokens_while_a_completion_waits(double):
    double.switch("saturated")
    before = double.metrics()
    assert double.completion(2) == "timeout"
    after = double.metrics()
    assert after["running"] > 0 and after["tokens"] > before["tokens"]
    double.switch("normal")
    assert double.completion(5) == "200"


def test_a_hung_double_freezes_its_gauges_and_counters(double):
    double.switch("saturated")
    time.sleep(0.6)
    double.switch("hung")
    frozen = double.metrics()
    assert double.completion(2) == "timeout"
    after = double.metrics()
    assert after["running"] == frozen["running"] > 0 and after["tokens"] == frozen["tokens"]
    assert double.get("/health")[0] == 200  # vllm #16259: /health does not notice


def test_the_double_closes_an_idle_keep_alive_connection_like_uvicorn(tmp_path):
    double = Double(tmp_path, keep_alive=1)
    try:
        closed = "keep-alive: closed the connection from 127.0.0.1, idle for 1 s"
        connection = http.client.HTTPConnection("127.0.0.1", double.port, timeout=5)
        connection.request("GET", "/health")
        connection.getresponse().read()
        # Within the keep-alive: the same connection serves again.
        asked = time.monotonic()  # before the server's answer, whence its idle second counts
        connection.request("GET", "/health")
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b""
        # Idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE: the server closes it, not sooner.
        deadline = asked + 15
        while closed not in double.log.read_text():
            assert time.monotonic() < deadline, double.log.read_text()
            time.sleep(0.05)
        assert time.monotonic() - asked >= 1, double.log.read_text()
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            connection.request("GET", "/health")
            connection.getresponse()
    finally:
        double.stop()
