"""The gateway's waker (scripts/gateway/vllm-cluster-waker, issue 23): its pure logic, and
the waker itself run as on the gateway, on loopback, against the doubles of EC2's Query
API and of IMDSv2 (tests/doubles/ec2_api.py) holding the IAM policy the stack gives the
gateway's role. A request no gang could take starts the stopped gang and gets 503 with
Retry-After; an instance outside the stack's tags is refused by the double and the waker
goes on; the double refuses what AWS would (a bad signature, unknown ids). Also the
nginx site that hands requests to the waker, checked by the real nginx, and
vllm-cluster-gateway's waker-config, power and wake."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

from components import bootstrap, gateway_nginx, idle_stop, ports
from tests.doubles.ec2_api import (
    CredentialStore,
    Ec2ApiDouble,
    InstanceMetadataDouble,
    issue_test_certificate,
    policy_allows,
)
from tests.test_gateway_pool import Gang, gateway  # noqa: F401 - the fixture, for the test through nginx

ROOT = Path(__file__).resolve().parent.parent
WAKER_SCRIPT = ROOT / "scripts" / "gateway" / "vllm-cluster-waker"
GATEWAY_SCRIPT = ROOT / "scripts" / "gateway" / "vllm-cluster-gateway"
LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
# The gateway runs the waker with Debian's python3; here too when it is there.
PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def load_waker():
    loader = SourceFileLoader("vllm_cluster_waker", str(WAKER_SCRIPT))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    # dataclasses look their module up in sys.modules.
    sys.modules[loader.name] = module
    loader.exec_module(module)
    return module


waker = load_waker()

STACK, PROJECT = "dev", "vllm-cluster"
# The stack's random id (compute.GpuNodes' RandomId) as the GPU instances carry it.
STACK_ID = "0f" * 16
# The gateway role's policy as the program declares it (idle_stop.gateway_wake_policy):
# DescribeInstances on "*" (it has no resource-level permission) in the stack's region,
# StartInstances (and, issue 34, StopInstances: a wake given up) only on the stack's
# instances there.
POLICY = idle_stop.gateway_wake_policy("aws", "us-east-1", "123456789012", PROJECT, STACK, STACK_ID)
STACK_TAGS = {"vllm-cluster:stack": STACK, "vllm-cluster:project": PROJECT, idle_stop.STACK_ID_TAG: STACK_ID}
GANG0 = ["i-0a000000000000001", "i-0a000000000000002"]
GANG1 = ["i-0b000000000000001"]


def config(**overrides) -> dict:
    return {
        "region": "us-east-1",
        "endpoint": "https://ec2.us-east-1.amazonaws.com",
        "stack": STACK,
        "project": PROJECT,
        "gangs": {"gang0": GANG0},
        "idle_stop_minutes": 30,
        "retry_after_seconds": 30,
        "expected_wake_seconds": 300,
        "give_up_seconds": 900,
        **overrides,
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def eventually(condition, timeout: float = 30, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.1)
    return result


def serving_on(process: subprocess.Popen, log: Path, port: int) -> bool:
    """Whether a server this test started accepts connections on its loopback port yet; its
    log is the failure when it died instead."""
    assert process.poll() is None, log.read_text()
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# --- pure logic -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("previous", "states", "serves", "expected"),
    [
        ("serving", ["running", "running"], True, "serving"),
        # Up but its vLLM does not answer, and it never slept: broken, nothing to wake.
        ("serving", ["running", "running"], False, "serving"),
        ("serving", ["stopped", "stopped"], False, "stopped"),
        ("serving", ["stopping", "stopped"], False, "stopped"),
        # One node powered off while the other still runs: on its way down.
        ("serving", ["running", "stopped"], False, "stopping"),
        ("stopped", ["pending", "stopped"], False, "waking"),
        ("stopped", ["pending", "pending"], False, "waking"),
        ("waking", ["running", "running"], False, "waking"),
        ("waking", ["running", "running"], True, "serving"),
        (None, ["pending", "running"], False, "waking"),
        (None, [], False, "serving"),
        ("stopped", [], False, "stopped"),
    ],
)
def test_a_gangs_power_state_follows_its_instances_and_its_head(previous, states, serves, expected):
    assert waker.gang_state(previous, states, serves) == expected


def test_stopped_at_is_the_last_stop_ec2_wrote_in_the_transition_reason():
    instances = [
        waker.Instance("i-1", "stopped", "User initiated (2026-12-02 10:15:00 GMT)"),
        waker.Instance("i-2", "stopped", "User initiated (2026-12-02 10:16:30 GMT)"),
    ]
    assert waker.stopped_at(instances) == "2026-12-02T10:16:30Z"
    assert waker.stopped_at([waker.Instance("i-1", "stopping", "")]) is None


def test_an_instance_is_started_at_most_once_in_30_seconds():
    debounce = waker.Backoff()
    assert debounce.seconds == 30
    assert debounce.due(["i-1", "i-2"], 100.0) == ["i-1", "i-2"]
    debounce.record(["i-1"], 100.0)
    assert debounce.due(["i-1", "i-2"], 129.9) == ["i-2"]
    assert debounce.due(["i-1", "i-2"], 130.0) == ["i-1", "i-2"]


def test_each_refused_start_doubles_the_wait_before_the_next_up_to_five_minutes():
    backoff = waker.Backoff()
    waits = []
    for _ in range(6):
        waits.append(backoff.delay("i-1"))
        backoff.refuse(["i-1"])
    assert waits == [30, 60, 120, 240, 300, 300]
    backoff.record(["i-1"], 1000.0)
    assert backoff.due(["i-1"], 1299.0) == [] and backoff.wait(["i-1"], 1299.0) == pytest.approx(1.0)
    backoff.reset(["i-1"])
    assert backoff.due(["i-1"], 1030.0) == ["i-1"]


def test_a_sleeping_gang_gets_503_with_retry_after_and_otherwise_what_nginx_would_say():
    status, headers, body = waker.fallback_answer({"gang0": "stopped", "gang1": "serving"}, config())
    assert status == 503 and headers == {"Retry-After": "30"}
    error = json.loads(body)["error"]
    assert error["code"] == "waking_from_idle_stop" and "gang0" in error["message"]
    assert "Retry after 30 seconds" in error["message"] and set(error) == {"message", "type", "param", "code"}
    assert waker.fallback_answer({"gang0": "waking"}, config())[0] == 503
    status, headers, body = waker.fallback_answer({"gang0": "serving"}, config())
    assert (status, headers) == (502, {}) and json.loads(body)["error"]["code"] == "bad_gateway"
    assert waker.fallback_answer({"gang0": "serving"}, config(), upstream_status=504)[0] == 504


def test_the_configuration_is_refused_naming_each_problem():
    assert waker.parse_config(json.dumps(config()))["gangs"] == {"gang0": GANG0}
    broken = config(endpoint="http://ec2.us-east-1.amazonaws.com", gangs={"gang0": ["vm-1"]}, retry_after_seconds=0)
    del broken["stack"]
    with pytest.raises(waker.ConfigError) as refused:
        waker.parse_config(json.dumps(broken))
    for words in ("stack is missing", "endpoint is not an https:// URL", "gangs.gang0", "retry_after_seconds"):
        assert words in str(refused.value)
    with pytest.raises(waker.ConfigError, match="not JSON"):
        waker.parse_config("{")


def test_the_policy_allows_starting_only_the_stacks_instances_and_describing_all():
    arn = "arn:aws:ec2:us-east-1:123456789012:instance/i-0a000000000000001"
    tagged = {"aws:RequestedRegion": "us-east-1", **{f"aws:ResourceTag/{k}": v for k, v in STACK_TAGS.items()}}
    assert policy_allows(POLICY, "ec2:StartInstances", arn, tagged)
    assert not policy_allows(POLICY, "ec2:StartInstances", arn, {**tagged, "aws:RequestedRegion": "eu-west-1"})
    unknown_id = {**tagged, f"aws:ResourceTag/{idle_stop.STACK_ID_TAG}": "1" * 32}
    assert not policy_allows(POLICY, "ec2:StartInstances", arn, unknown_id)
    assert not policy_allows(POLICY, "ec2:StartInstances", arn, {**tagged, "aws:ResourceTag/vllm-cluster:stack": "x"})
    assert not policy_allows(POLICY, "ec2:StartInstances", arn, {"aws:ResourceTag/vllm-cluster:stack": STACK})
    assert not policy_allows(POLICY, "ec2:TerminateInstances", arn, tagged)
    assert policy_allows(POLICY, "ec2:DescribeInstances", "*", {"aws:RequestedRegion": "us-east-1"})
    denied = {"Statement": [*POLICY["Statement"], {"Effect": "Deny", "Action": "ec2:Start*", "Resource": "*"}]}
    assert not policy_allows(denied, "ec2:StartInstances", arn, tagged)


# --- the doubles and the waker on loopback --------------------------------------------------------


class Head:
    """A gang head's vLLM as the waker probes it: /health answers 200."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                self.send_response(200 if self.path == "/health" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.handler = Handler

    def start(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


class Aws:
    """Both doubles, with every instance of the test's account and its state."""

    def __init__(self, folder: Path):
        self.ca, cert, key = issue_test_certificate(folder / "tls", ["localhost"])
        self.credentials = CredentialStore()
        self.imds = InstanceMetadataDouble(
            "127.0.0.1", 0, role="vllm-gateway-role", credentials=self.credentials
        ).start()
        self.states = {i: "running" for i in [*GANG0, *GANG1]}
        self.tags = {i: dict(STACK_TAGS) for i in GANG0}
        # gang1's instance carries the stack's tag but another project's: the policy refuses it.
        self.tags.update({i: {**STACK_TAGS, "vllm-cluster:project": "another"} for i in GANG1})
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.ec2 = Ec2ApiDouble(
            "127.0.0.1",
            0,
            cert,
            key,
            credentials=self.credentials,
            policy=POLICY,
            instances=self.tags,
            state=lambda instance_id: self.states[instance_id],
            start=self.started.append,
            stop=self._stop,
        ).start()

    def _stop(self, instance_id: str) -> None:
        self.stopped.append(instance_id)
        self.states[instance_id] = "stopped"

    @property
    def endpoint(self) -> str:
        return f"https://localhost:{self.ec2.port}"

    def client(self, credentials=None):
        """The waker's EC2 client as the gateway makes it (the instance role through IMDSv2),
        or with other credentials (a botocore credential provider)."""
        role = credentials or waker.instance_role(self.imds.url)
        return waker.Ec2(self.endpoint, "us-east-1", role, waker.trust_store({"ca_file": self.ca}))

    def stop(self) -> None:
        self.ec2.stop()
        self.imds.stop()


@pytest.fixture
def aws(tmp_path):
    doubles = Aws(tmp_path)
    yield doubles
    doubles.stop()


class WakerProcess:
    def __init__(self, tmp_path: Path, aws: Aws, gangs: dict[str, list[str]], head: Head):
        self.state_dir = tmp_path / "state"
        self.state_dir.mkdir()
        (self.state_dir / "gangs").write_text("".join(f"{name} 127.0.0.1:{head.port}\n" for name in gangs))
        self.config = tmp_path / "waker.json"
        self.config.write_text(
            json.dumps(config(endpoint=aws.endpoint, gangs=gangs, imds=aws.imds.url, ca_file=aws.ca))
        )
        self.port = free_port()
        self.log = tmp_path / "waker.log"
        self.process = subprocess.Popen(
            [PYTHON, str(WAKER_SCRIPT), "--config", str(self.config), "--state-dir", str(self.state_dir)]
            + ["serve", "--port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        eventually(self.listening, 15, "the waker listening")

    def listening(self) -> bool:
        return serving_on(self.process, self.log, self.port)

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def completion(self):
        """A completion as nginx hands it over after no gang could take it."""
        body = json.dumps({"model": "m", "prompt": "hello"}).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Forwarded-For": "198.51.100.7",
            "X-Vllm-Cluster-Status": "502",
        }
        return self.request("POST", "/v1/completions", body, headers)

    def power(self) -> dict:
        try:
            return json.loads((self.state_dir / "power.json").read_text())["gangs"]
        except (FileNotFoundError, ValueError):
            return {}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def head():
    started = Head()
    yield started
    started.stop()


@pytest.fixture
def start_waker(tmp_path, aws, head):
    started = []

    def start(gangs: dict[str, list[str]]) -> WakerProcess:
        process = WakerProcess(tmp_path, aws, gangs, head)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


def starts(aws: Aws) -> list:
    return [call for call in aws.ec2.calls if call[0] == "StartInstances"]


def test_a_request_while_the_gang_is_stopped_starts_it_and_gets_503_with_retry_after(aws, head, start_waker):
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0})
    eventually(lambda: process.power().get("gang0", {}).get("state") == "stopped", what="gang0 seen stopped")
    assert process.power()["gang0"]["stopped_at"].endswith("Z")

    status, headers, body = process.completion()
    assert status == 503, body
    assert headers["Retry-After"] == "30"
    assert json.loads(body)["error"]["code"] == "waking_from_idle_stop"
    assert sorted(aws.started) == sorted(GANG0)
    assert starts(aws) == [("StartInstances", 200, "")]
    assert "gang0: StartInstances" in process.log.read_text()

    # More requests while it boots: 503 again, and no second StartInstances within 30 s.
    assert process.completion()[0] == 503
    assert len(starts(aws)) == 1
    eventually(lambda: process.power()["gang0"]["state"] == "waking", what="gang0 waking")

    # The instances run and the head's vLLM answers: the gang serves, and a request nginx
    # could still not place gets 502, as from nginx.
    for instance_id in GANG0:
        aws.states[instance_id] = "running"
    head.start()

    def serving():
        status, _, _ = process.completion()
        return status == 502 and process.power()["gang0"]["state"] == "serving"

    eventually(serving, 30, "gang0 serving after its wake")


def test_an_instance_the_policy_does_not_cover_is_refused_and_the_waker_goes_on(aws, head, start_waker):
    for instance_id in [*GANG0, *GANG1]:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0, "gang1": GANG1})
    eventually(lambda: len(process.power()) == 2, what="both gangs seen")

    status, headers, _ = process.completion()
    assert status == 503 and headers["Retry-After"] == "30"
    # gang1's start is refused as EC2 would (403, UnauthorizedOperation); gang0's goes through.
    assert ("StartInstances", 403, "UnauthorizedOperation") in starts(aws)
    assert sorted(aws.started) == sorted(GANG0)
    log = eventually(lambda: "UnauthorizedOperation" in process.log.read_text() and process.log.read_text())
    assert "gang1: EC2 refused to start i-0b000000000000001: UnauthorizedOperation" in log
    assert process.power()["gang1"]["wake"]["refusal"]["code"] == "UnauthorizedOperation"
    assert process.process.poll() is None
    assert process.power()["gang1"]["state"] == "stopped"
    assert process.request("GET", "/power")[0] == 200


def test_wake_starts_every_stopped_gang_and_is_only_for_this_host(aws, head, start_waker):
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0})
    eventually(lambda: process.power().get("gang0", {}).get("state") == "stopped", what="gang0 seen stopped")
    status, _, body = process.request("POST", "/wake")
    assert status == 200 and json.loads(body) == {"gangs": {"gang0": "waking"}}
    assert sorted(aws.started) == sorted(GANG0)
    # Through nginx (X-Forwarded-For) /wake is just another request no gang could take.
    status, headers, _ = process.request("POST", "/wake", headers={"X-Forwarded-For": "203.0.113.9"})
    assert status == 503 and headers["Retry-After"] == "30"
    assert len(starts(aws)) == 1


# --- a wake that EC2 refuses half-way (issue 34) ------------------------------------------------

CAPACITY = ("Server.InsufficientInstanceCapacity", "Insufficient capacity.")
HEAD_ID, WORKER_ID = GANG0


def in_process(tmp_path: Path, aws: Aws, head: Head, **overrides):
    """The waker's own Waker against the doubles, looked at by the test (poll) instead of
    its poller thread, with a backoff of a fraction of a second: the real one's 30 s
    doubling is held by test_each_refused_start_doubles_the_wait_before_the_next_up_to_five_minutes."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    (state_dir / "gangs").write_text(f"gang0 127.0.0.1:{head.port}\n")
    settings = config(endpoint=aws.endpoint, gangs={"gang0": GANG0}, imds=aws.imds.url, ca_file=aws.ca, **overrides)
    woken = waker.Waker(waker.parse_config(json.dumps(settings)), str(state_dir), aws.client())
    woken.backoff = waker.Backoff(seconds=0.2, most=0.8)
    return woken


def answer(woken) -> tuple[int, dict, dict]:
    """What a request no gang could take gets (nginx hands it over with 502)."""
    status, headers, body = woken.fallback(502)
    return status, headers, json.loads(body)["error"]


def until_due(woken, instance_id: str) -> None:
    time.sleep(woken.backoff.wait([instance_id], time.monotonic()) + 0.05)


def test_a_member_ec2_puts_back_to_stopped_is_started_again_until_the_gang_serves(tmp_path, aws, head):
    """The head starts and the worker is accepted, then put back to stopped for want of
    capacity: the gang is half started ("waking" with a member stopped). The waker starts
    the worker again, waiting longer after each refusal, says why in the 503, and the gang
    serves once EC2 has capacity again."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    aws.ec2.put_back[WORKER_ID] = CAPACITY
    woken = in_process(tmp_path, aws, head)
    woken.poll()
    status, _, _ = answer(woken)
    assert status == 503 and aws.started == [HEAD_ID]
    aws.states[HEAD_ID] = "running"
    woken.poll()
    assert woken.power["gang0"]["state"] == "waking"
    assert woken.power["gang0"]["instances"] == {HEAD_ID: "running", WORKER_ID: "stopped"}
    assert woken.power["gang0"]["wake"]["refusal"]["code"] == "Server.InsufficientInstanceCapacity"
    status, headers, error = answer(woken)
    assert status == 503 and headers["Retry-After"] == "30" and error["code"] == "waking_from_idle_stop"
    assert f"EC2 refused to start gang0's {WORKER_ID}: Server.InsufficientInstanceCapacity" in error["message"]
    # Started again, by the poller alone (no request needed), each wait longer than the last.
    worker_starts = []
    for _ in range(3):
        worker_starts.append(woken.backoff.delay(WORKER_ID))
        until_due(woken, WORKER_ID)
        woken.poll()  # starts it (pending) ...
        woken.poll()  # ... and sees it put back
    assert worker_starts == [0.4, 0.8, 0.8]
    assert sum(1 for call in starts(aws) if call[1] == 200) == 4
    # Capacity is back: the worker starts, boots, the head's vLLM answers, the gang serves.
    del aws.ec2.put_back[WORKER_ID]
    until_due(woken, WORKER_ID)
    woken.poll()
    assert aws.started == [HEAD_ID, WORKER_ID]
    aws.states[WORKER_ID] = "running"
    head.start()
    woken.poll()
    assert woken.power["gang0"]["state"] == "serving" and woken.power["gang0"]["wake"] is None
    assert answer(woken)[0] == 502


def test_a_start_ec2_refuses_is_said_in_the_503_in_power_and_to_prometheus(tmp_path, aws, head):
    """StartInstances answers InsufficientInstanceCapacity: the client's 503 names it,
    `vllm-cluster-gateway power` (what `status` reads) prints it, and the waker's metrics
    carry it for the alert; the refused start is tried again."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    aws.ec2.refuse_start[WORKER_ID] = (
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested.",
    )
    woken = in_process(tmp_path, aws, head)
    woken.poll()
    status, _, error = answer(woken)
    assert status == 503 and ("StartInstances", 500, "InsufficientInstanceCapacity") in starts(aws)
    assert "InsufficientInstanceCapacity (We currently do not have sufficient p4d.24xlarge capacity" in error["message"]
    assert "then the waker gives up and stops what it started" in error["message"]
    metrics = waker.exposition(woken.states(), woken.power).decode().splitlines()
    assert 'vllm_cluster_wake_refused{gang="gang0",code="InsufficientInstanceCapacity"} 1' in metrics
    settings = tmp_path / "waker.json"
    settings.write_text(json.dumps(woken.config))
    printed = subprocess.run(
        [PYTHON, str(WAKER_SCRIPT), "--config", str(settings), "--state-dir", woken.state_dir, "power"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    line = printed.stdout.strip()
    # The whole call was refused: nothing started, the gang is still stopped, and says why.
    assert line.startswith("gang0 stopped ") and "refused to start" in line, line
    assert "InsufficientInstanceCapacity" in line, line
    # Each start refused with HTTP 500 is asked EC2_ATTEMPTS times within the call (the SDK's
    # retry), and the waker tries again once its own backoff allows.
    assert len(starts(aws)) == waker.EC2_ATTEMPTS and woken.power["gang0"]["wake"]["attempts"] == 1
    until_due(woken, WORKER_ID)
    woken.poll()
    assert len(starts(aws)) == 2 * waker.EC2_ATTEMPTS and woken.power["gang0"]["wake"]["attempts"] == 2


def test_a_wake_that_never_serves_is_given_up_what_it_started_stopped_and_the_reason_kept(tmp_path, aws, head):
    """Past give_up_seconds without serving, the waker stops the head it started (no GPU
    left billed while its worker cannot start), says why in power.json, the 503 and the
    metrics, and no request starts the gang again before as long has passed; a wake by
    hand may."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    aws.ec2.put_back[WORKER_ID] = CAPACITY
    woken = in_process(tmp_path, aws, head, give_up_seconds=3)
    woken.poll()
    answer(woken)
    aws.states[HEAD_ID] = "running"
    woken.poll()
    eventually(lambda: woken.poll() or woken.power["gang0"].get("failed"), 15, "the wake given up")
    assert aws.stopped == [HEAD_ID] and ("StopInstances", 200, "") in aws.ec2.calls
    failed = woken.power["gang0"]["failed"]
    assert failed["code"] == "Server.InsufficientInstanceCapacity" and failed["stopped"] == [HEAD_ID]
    assert "did not serve within 3 s" in failed["reason"] and f"stopped {HEAD_ID}" in failed["reason"]
    assert json.loads((Path(woken.state_dir) / "power.json").read_text())["gangs"]["gang0"]["failed"] == failed
    woken.poll()
    assert woken.power["gang0"]["state"] == "stopped"
    before = len(starts(aws))
    status, headers, error = answer(woken)
    assert status == 503 and error["code"] == "wake_failed" and len(starts(aws)) == before
    assert "given up" in error["message"] and "Server.InsufficientInstanceCapacity" in error["message"]
    assert int(headers["Retry-After"]) >= 1
    assert 'vllm_cluster_wake_given_up{gang="gang0"} 1' in waker.exposition(woken.states(), woken.power).decode()
    # By hand (vllm-cluster wake), it is tried again at once.
    del aws.ec2.put_back[WORKER_ID]
    woken.wake("by hand", by_hand=True)
    assert len(starts(aws)) == before + 1 and woken.power["gang0"]["wake"] is not None


def test_what_a_given_up_wake_started_is_stopped_even_when_ec2_cannot_stop_it_at_once(tmp_path, aws, head):
    """Given up while its worker is still pending (booting): EC2 refuses to stop a pending
    instance, and one such instance fails the whole StopInstances. The waker stops the head
    that runs at once, and the worker at its first look once it runs: nothing the wake
    started is left billed because the first stop could not take it all."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    woken = in_process(tmp_path, aws, head, give_up_seconds=2)
    woken.poll()
    answer(woken)
    assert aws.started == GANG0
    aws.states[HEAD_ID] = "running"  # the worker stays pending (the double: started, not yet up)
    eventually(lambda: woken.poll() or woken.power["gang0"].get("failed"), 15, "the wake given up")
    assert aws.stopped == [HEAD_ID], (aws.stopped, aws.ec2.calls)
    failed = woken.power["gang0"]["failed"]
    assert failed["stopped"] == [HEAD_ID] and WORKER_ID in failed["reason"], failed
    # The worker comes up: the next look stops it, and the record says both were stopped.
    aws.states[WORKER_ID] = "running"
    woken.poll()
    assert aws.stopped == [HEAD_ID, WORKER_ID], (aws.stopped, aws.ec2.calls)
    failed = woken.power["gang0"]["failed"]
    assert failed["stopped"] == GANG0 and f"stopped {HEAD_ID}, {WORKER_ID}" in failed["reason"], failed
    woken.poll()
    assert [c for c in aws.ec2.calls if c[0] == "StopInstances" and c[1] == 200] == [("StopInstances", 200, "")] * 2


def test_a_gang_found_half_started_is_completed_by_the_next_request(tmp_path, aws, head):
    """A gang whose head runs and whose worker is stopped (a wake refused half-way, by an
    earlier waker): the next request starts the worker, which the waker of main took for a
    gang on its way up and left stopped."""
    aws.states[WORKER_ID] = "stopped"
    woken = in_process(tmp_path, aws, head)
    woken.power["gang0"] = {"state": "waking", "since": "2026-12-05T10:00:00Z"}
    woken.poll()
    assert woken.power["gang0"]["state"] == "waking"
    status, _, _ = answer(woken)
    assert status == 503 and aws.started == [WORKER_ID]


# --- what reaches the waker from its AWS client (issue 34, point 4) ------------------------------


def test_a_throttled_start_is_asked_again_by_the_client_and_the_gang_starts_on_that_request(tmp_path, aws, head):
    """EC2 throttles an account's API calls (RequestLimitExceeded) and asks callers to retry
    with backoff: the SDK's retry does, within the request, and a throttled start is no
    refusal of the gang's instances."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    aws.ec2.throttle["StartInstances"] = 1
    woken = in_process(tmp_path, aws, head)
    woken.poll()
    status, _, error = answer(woken)
    assert status == 503 and error["code"] == "waking_from_idle_stop"
    assert [call[1:] for call in starts(aws)] == [(400, "RequestLimitExceeded"), (200, "")]
    assert sorted(aws.started) == sorted(GANG0)
    assert woken.power["gang0"]["wake"]["refusal"] is None and "refused" not in error["message"]


def test_a_throttled_look_at_ec2_is_asked_again_and_finds_the_gang(tmp_path, aws, head):
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    aws.ec2.throttle["DescribeInstances"] = 2
    woken = in_process(tmp_path, aws, head)
    woken.poll()
    assert woken.power["gang0"]["state"] == "stopped"
    assert json.loads((Path(woken.state_dir) / "power.json").read_text())["error"] is None
    describes = [call[1:] for call in aws.ec2.calls if call[0] == "DescribeInstances"]
    assert describes == [(400, "RequestLimitExceeded")] * 2 + [(200, "")]


def test_an_answer_cut_short_still_gets_the_client_its_503(aws, head, start_waker):
    """EC2's answer to StartInstances stops half-way (the connection lost): the waker of
    main let the http.client.IncompleteRead escape and nginx's request went unanswered.
    The waker as the local fleet's gateway runs it (Debian 12's python3-botocore and
    urllib3 1.26, which reads the cut answer as whole and cannot parse it) answers the
    503 and keeps the failure as the start's refusal; the instances EC2 did start wake."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0})
    eventually(lambda: process.power().get("gang0", {}).get("state") == "stopped", what="gang0 seen stopped")
    aws.ec2.cut_short["StartInstances"] = 1
    status, headers, body = process.completion()
    assert status == 503 and headers["Retry-After"] == "30", body
    assert json.loads(body)["error"]["code"] == "waking_from_idle_stop"
    assert starts(aws)[0][1:] == (200, "cut short") and sorted(aws.started) == sorted(GANG0)
    refusal = process.power()["gang0"]["wake"]["refusal"]
    assert refusal is None or refusal["code"] == "ResponseParserError", refusal
    for instance_id in GANG0:
        aws.states[instance_id] = "running"
    head.start()
    eventually(lambda: process.power()["gang0"]["state"] == "serving", 30, "gang0 serving")


def test_an_answer_cut_short_is_asked_again_within_the_call_by_ubuntus_botocore(tmp_path, aws, head):
    """The same with the test environment's botocore 1.34.46 and urllib3 2.0.7, the pair
    Ubuntu 24.04 (the gateway's image on AWS) ships: the cut answer is an IncompleteRead,
    which botocore asks again at once (StartInstances is idempotent), and no refusal."""
    import botocore
    import urllib3

    assert (botocore.__version__, urllib3.__version__) == ("1.34.46", "2.0.7")
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    woken = in_process(tmp_path, aws, head)
    woken.poll()
    aws.ec2.cut_short["StartInstances"] = 1
    status, _, error = answer(woken)
    assert status == 503 and error["code"] == "waking_from_idle_stop"
    assert [call[1:] for call in starts(aws)] == [(200, "cut short"), (200, "")]
    assert woken.power["gang0"]["wake"]["refusal"] is None


class UnforeseenFailure:
    """An EC2 client failing as nothing in the waker names."""

    def describe(self, ids, stack):
        raise LookupError("a failure nobody foresaw")

    start = stop = describe


def test_a_failure_nobody_foresaw_still_answers_the_request_nginx_handed_over(tmp_path, aws, head):
    """Whatever fails inside the waker, the request nginx handed over gets an answer in
    OpenAI's error shape (a dropped connection would reach the client as nginx's own HTML
    502), and the waker goes on answering."""
    woken = in_process(tmp_path, aws, head)
    woken.ec2 = UnforeseenFailure()
    server = ThreadingHTTPServer(("127.0.0.1", 0), waker.make_handler(woken))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def request() -> tuple[int, dict, dict]:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        try:
            connection.request("POST", "/v1/completions", body=b"{}", headers={"X-Forwarded-For": "198.51.100.7"})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), json.loads(response.read())["error"]
        finally:
            connection.close()

    try:
        status, headers, error = request()
        assert status == 503 and headers["Retry-After"] == "30"
        assert error["code"] == "waker_failed" and "LookupError" in error["message"], error
        assert "nobody foresaw" not in error["message"]
        # The next request (EC2 looked at less than FRESH_SECONDS ago) is answered as ever.
        assert request()[0] in (502, 503)
    finally:
        server.shutdown()
        server.server_close()


class FixedKeys:
    """A botocore credential provider with the keys given (an IAM user's, or a role
    session's altered), where the waker's client loads the instance role's."""

    METHOD = "keys-given-by-the-test"

    def __init__(self, access_key: str, secret_key: str, token: str | None = None):
        self.keys = (access_key, secret_key, token)

    def load(self):
        from botocore.credentials import Credentials

        return Credentials(*self.keys, method=self.METHOD)


def test_the_ec2_double_verifies_the_signature_and_the_credentials(aws):
    """Requests botocore signed (the waker's client), then changed on their way: the double
    refuses what EC2 would."""
    issued = waker.instance_role(aws.imds.url).load().get_frozen_credentials()

    def describe(credentials=None, change=None) -> str:
        client = aws.client(credentials)
        if change is not None:
            client.botocore_client().meta.events.register("before-send.ec2.DescribeInstances", change)
        try:
            client.describe(GANG0, STACK)
        except waker.Ec2Error as refused:
            return refused.code
        return "accepted"

    def other_instance(request, **_):
        # One character of the signed body changed (its length kept).
        body = request.body if isinstance(request.body, bytes) else request.body.encode()
        request.body = body.replace(GANG0[1].encode(), GANG1[0].encode())

    def twenty_minutes_late(request, **_):
        late = (waker.utc_now() - dt.timedelta(minutes=20)).strftime("%Y%m%dT%H%M%SZ")
        request.headers["X-Amz-Date"] = late

    assert describe() == "accepted"
    assert describe(FixedKeys(issued.access_key, "not-the-secret", issued.token)) == "AuthFailure"
    assert describe(change=other_instance) == "AuthFailure"
    assert describe(FixedKeys(issued.access_key, issued.secret_key)) == "AuthFailure"
    assert describe(change=twenty_minutes_late) == "RequestExpired"
    assert describe(FixedKeys("ASIANOTISSUED", "x", "y")) == "AuthFailure"
    assert [call[1:] for call in aws.ec2.calls] == [
        (200, ""),
        (401, "AuthFailure"),
        (401, "AuthFailure"),
        (401, "AuthFailure"),
        (400, "RequestExpired"),
        (401, "AuthFailure"),
    ]


def test_unknown_and_malformed_ids_and_a_stopping_instance_are_refused_as_ec2_does(aws):
    client = aws.client()
    with pytest.raises(waker.Ec2Error) as unknown:
        client.start(["i-0f00000000000000f"])
    assert unknown.value.code == "InvalidInstanceID.NotFound" and unknown.value.status == 400
    assert "i-0f00000000000000f" in unknown.value.message
    with pytest.raises(waker.Ec2Error) as malformed:
        client.start(["vm-1"])
    assert malformed.value.code == "InvalidInstanceID.Malformed"
    aws.states[GANG0[0]] = "stopping"
    with pytest.raises(waker.Ec2Error) as stopping:
        client.start([GANG0[0]])
    assert stopping.value.code == "IncorrectInstanceState"
    assert client.start([GANG0[1]]) == {GANG0[1]: "running"}
    assert aws.started == []


def test_describe_reads_states_tags_and_the_stop_time_as_ec2_writes_them(aws):
    aws.states[GANG0[1]] = "stopped"
    found = aws.client().describe([*GANG0, "i-0c000000000000001"], STACK)
    assert set(found) == set(GANG0)
    assert found[GANG0[0]].state == "running" and found[GANG0[0]].reason == ""
    assert found[GANG0[1]].state == "stopped" and found[GANG0[1]].tags == STACK_TAGS
    assert waker.STOP_TIME.search(found[GANG0[1]].reason), found[GANG0[1]].reason
    assert found[GANG0[1]].reason.startswith("User initiated (")
    # Another stack's filter sees none of them.
    assert aws.client().describe(GANG0, "another-stack") == {}
    assert found[GANG0[1]].state_code == "Client.InstanceInitiatedShutdown"
    # A start EC2 accepts and then cannot place: stopped again, its StateReason says why.
    aws.ec2.put_back[GANG0[1]] = ("Server.InsufficientInstanceCapacity", "Insufficient capacity.")
    assert aws.client().start([GANG0[1]]) == {GANG0[1]: "pending"}
    again = aws.client().describe(GANG0, STACK)[GANG0[1]]
    assert (again.state, again.state_code) == ("stopped", "Server.InsufficientInstanceCapacity")
    assert again.state_message == "Server.InsufficientInstanceCapacity: Insufficient capacity."


def test_the_instance_role_needs_an_imds_token_and_renews_credentials_before_they_expire(aws):
    connection = http.client.HTTPConnection("127.0.0.1", aws.imds.port, timeout=5)
    connection.request("GET", "/latest/meta-data/iam/security-credentials/")
    assert connection.getresponse().status == 401
    connection.close()
    before = len(aws.imds.requests)
    credentials = waker.instance_role(aws.imds.url).load()
    first = credentials.get_frozen_credentials()
    assert aws.credentials.get(first.access_key) is not None
    asked = aws.imds.requests[before:]
    # A session token first (IMDSv2), then the role's name and its credentials, each with it.
    assert ("PUT", "/latest/api/token", 200) in asked
    assert ("GET", "/latest/meta-data/iam/security-credentials/", 200) in asked
    assert all(status == 200 for _, _, status in asked), asked
    assert credentials.get_frozen_credentials() == first and len(aws.imds.requests) == before + len(asked)


def test_the_role_is_asked_for_new_credentials_within_ten_minutes_of_their_expiration(aws, monkeypatch):
    """botocore renews the role's credentials from IMDS before they expire; seen by moving
    the credentials' clock (RefreshableCredentials' time fetcher) to 8 minutes before the
    first ones' end, when EC2 has rotated them (the metadata double issues new ones)."""
    credentials = waker.instance_role(aws.imds.url).load()
    first = credentials.get_frozen_credentials()
    expiration = aws.credentials.get(first.access_key).expiration
    monkeypatch.setattr(credentials, "_time_fetcher", lambda: expiration - dt.timedelta(minutes=8))
    aws.imds.current = None
    renewed = credentials.get_frozen_credentials()
    assert renewed.access_key != first.access_key and aws.credentials.get(renewed.access_key) is not None


# --- nginx ------------------------------------------------------------------------------------------


def needs_nginx() -> str:
    if NGINX is None:
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail("nginx is missing: .ci/run should have installed Debian's nginx")
        pytest.skip("Debian's nginx is not installed (apt-get install nginx; .ci/run installs it)")
    return NGINX


def test_the_site_hands_failed_requests_to_the_waker_only_when_asked():
    plain = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",))
    assert "vllm_waker" not in plain and "error_page" not in plain
    site = gateway_nginx.nginx_site("10.42.128.10", ("198.51.100.7/32",), waker=True)
    assert site.replace("    error_page 502 504 = @vllm_waker;\n", "") != plain  # the named location is there too
    assert "error_page 502 504 = @vllm_waker;" in site
    assert f"proxy_pass http://127.0.0.1:{ports.WAKER};" in site
    assert "proxy_intercept_errors" not in site


def stopped_behind_nginx(aws, start_waker, gateway_pool):
    """The real nginx with the site rendered with the waker (on the waker's test port),
    gang 0's instances stopped and its head gone: the gateway, once the waker saw it."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0})
    eventually(lambda: process.power().get("gang0", {}).get("state") == "stopped", what="gang0 seen stopped")
    nginx_gateway, gang = gateway_pool
    site = nginx_gateway.site(waker=True).replace(f"127.0.0.1:{ports.WAKER};", f"127.0.0.1:{process.port};")
    result = nginx_gateway.configure(gang, site=site)
    assert result.returncode == 0, result.stderr
    gang.stop()
    return nginx_gateway


def test_a_completion_to_a_stopped_service_through_nginx_gets_the_wakers_503(aws, head, start_waker, gateway_pool):
    """The real nginx with the site rendered with the waker, every gang's head gone: the
    client gets the waker's 503 with Retry-After, and the gang is started."""
    nginx_gateway = stopped_behind_nginx(aws, start_waker, gateway_pool)
    status, answer = nginx_gateway.request("POST", "/v1/completions", {"model": "m", "prompt": "hello"})
    assert status == 503, answer
    assert answer["error"]["code"] == "waking_from_idle_stop"
    assert sorted(aws.started) == sorted(GANG0)


def test_no_request_without_the_key_and_no_health_probe_wakes_a_stopped_stack(aws, head, start_waker, gateway_pool):
    """Issue 33: a scanner, an uptime monitor's /health or a client without the key must
    not start GPU instances. Without the key: 401 at the gateway, whatever the gangs'
    state; /health and /v1/models with the key: 503, and still nothing starts. Only a
    keyed request to a route that uses the model wakes the gang."""
    nginx_gateway = stopped_behind_nginx(aws, start_waker, gateway_pool)
    completion = {"model": "m", "prompt": "hello"}
    for key in (None, "wrong-" + "k" * 40):
        status, answer = nginx_gateway.request("POST", "/v1/completions", completion, key=key)
        assert status == 401 and answer["error"]["code"] == "invalid_api_key", answer
        assert nginx_gateway.request("GET", "/health", key=key)[0] == 401
    for path in ("/health", "/v1/models"):
        status, answer = nginx_gateway.request("GET", path)
        assert status == 503 and answer["error"]["code"] == "no_gang_serving", (path, answer)
    assert starts(aws) == []
    status, answer = nginx_gateway.request("POST", "/v1/chat/completions", {"model": "m", "messages": []})
    assert status == 503 and answer["error"]["code"] == "waking_from_idle_stop", answer
    assert sorted(aws.started) == sorted(GANG0)


@pytest.fixture
def gateway_pool(gateway):  # noqa: F811 - test_gateway_pool's fixture
    """tests/test_gateway_pool.py's gateway (its nginx under a scratch root) with one gang."""
    gang = Gang("gang0", "127.0.0.2").start()
    try:
        yield gateway, gang
    finally:
        gang.stop()


# --- vllm-cluster-gateway waker-config, power, wake -------------------------------------------------


class GatewayHost:
    """vllm-cluster-gateway under a scratch root (its host paths moved there, as
    tests/test_gateway_pool.py does), with the waker installed as the stack's waker
    command installs it, and stand-ins: systemctl runs the waker as its unit would
    (restart starts it, disable --now stops it) and logs its calls, id says root,
    logger writes a file."""

    MOVED = ("/etc/vllm-cluster", "/opt/vllm-cluster", "/var/lib/vllm-cluster", "/run/vllm-cluster", "/etc/nginx")

    def __init__(self, root: Path, head: Head):
        self.root = root
        for folder in (
            "etc/vllm-cluster",
            "opt/vllm-cluster/bin",
            "opt/vllm-cluster/lib",
            "var/lib/vllm-cluster/gateway",
            "bin",
        ):
            (root / folder).mkdir(parents=True)
        script, library = GATEWAY_SCRIPT.read_text(), LIBRARY.read_text()
        for path in self.MOVED:
            script, library = script.replace(path, f"{root}{path}"), library.replace(path, f"{root}{path}")
        self.script = root / "opt/vllm-cluster/bin/vllm-cluster-gateway"
        self.script.write_text(script)
        (root / "opt/vllm-cluster/lib/vllm-cluster-lib.sh").write_text(library)
        self.state = root / "var/lib/vllm-cluster/gateway"
        (self.state / "gangs").write_text(f"gang0 127.0.0.1:{head.port}\n")
        self.config = root / "etc/vllm-cluster/waker.json"
        self.port = free_port()
        self.calls = root / "systemctl.calls"
        self.log = root / "waker.log"
        pid = root / "waker.pid"
        waker_path = root / "opt/vllm-cluster/bin/vllm-cluster-waker"
        serve = f"{PYTHON} {waker_path} --config {self.config} --state-dir {self.state} serve --port {self.port}"
        stand_ins = {
            "systemctl": f"""echo "$*" >>{self.calls}
stop() {{ if [ -f {pid} ]; then kill "$(cat {pid})" 2>/dev/null; rm -f {pid}; fi; }}
case "$1" in
  daemon-reload|enable) ;;
  is-active) [ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null ;;
  restart) stop; {serve} </dev/null >>{self.log} 2>&1 & echo $! >{pid} ;;
  disable) stop ;;
  *) echo "systemctl stand-in: unexpected: $*" >&2; exit 1 ;;
esac
""",
            "id": "echo 0\n",
            "logger": f'echo "$*" >>{root}/journal\n',
            "python3": f'exec {PYTHON} "$@"\n',
        }
        for name, text in stand_ins.items():
            (root / "bin" / name).write_text("#!/usr/bin/env bash\n" + text)
            (root / "bin" / name).chmod(0o755)
        self.env = {**os.environ, "PATH": f"{root}/bin:{os.environ['PATH']}"}
        self.pid = pid

    def install_waker(self) -> None:
        """What gateway_waker_script writes before it runs waker-config."""
        installed = self.root / "opt/vllm-cluster/bin/vllm-cluster-waker"
        installed.write_text(WAKER_SCRIPT.read_text())
        installed.chmod(0o755)
        (self.root / "etc/vllm-cluster/waker.env").write_text(f"PORT_WAKER={self.port}\n")

    def run(self, *args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(self.script), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def stop(self) -> None:
        if self.pid.exists():
            subprocess.run(["kill", self.pid.read_text().strip()], check=False)


@pytest.fixture
def gateway_host(tmp_path, head):
    host = GatewayHost(tmp_path / "root", head)
    yield host
    host.stop()


def test_waker_config_installs_checks_starts_and_turns_off_the_waker(aws, head, gateway_host):
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    document = json.dumps(config(endpoint=aws.endpoint, imds=aws.imds.url, ca_file=aws.ca))

    not_installed = gateway_host.run("waker-config", stdin=document)
    assert not_installed.returncode != 0 and "the waker is not installed" in not_installed.stderr
    gateway_host.install_waker()
    refused = gateway_host.run("waker-config", stdin=json.dumps({**json.loads(document), "stack": 7}))
    assert refused.returncode != 0 and "stack is not a str" in refused.stderr
    assert not gateway_host.config.exists() and not gateway_host.calls.exists()
    # Without a waker configured, every gang serves (nothing stops them).
    assert gateway_host.run("power").stdout == "gang0 serving -\n"

    installed = gateway_host.run("waker-config", stdin=document)
    assert installed.returncode == 0, installed.stderr
    assert oct(gateway_host.config.stat().st_mode & 0o777) == "0o600"
    assert gateway_host.calls.read_text().splitlines() == [
        "daemon-reload",
        "enable --quiet vllm-cluster-waker.service",
        "restart vllm-cluster-waker.service",
    ]
    again = gateway_host.run("waker-config", stdin=document)
    assert again.returncode == 0 and "unchanged, not restarted" in again.stderr
    assert gateway_host.calls.read_text().count("restart") == 1

    def power() -> list[str]:
        return gateway_host.run("power").stdout.split()

    eventually(lambda: power()[:2] == ["gang0", "stopped"], what="power: gang0 stopped")
    assert power()[2].startswith("20") and power()[2].endswith("Z")

    # wake --wait: started, progress, and back once the instances run and the head serves.
    waking = subprocess.Popen(
        ["bash", str(gateway_host.script), "wake", "--wait", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=gateway_host.env,
    )
    eventually(lambda: sorted(aws.started) == sorted(GANG0), what="gang0 started by wake")
    for instance_id in GANG0:
        aws.states[instance_id] = "running"
    head.start()
    out, err = waking.communicate(timeout=60)
    assert waking.returncode == 0, err
    assert out.splitlines()[0] == "gang0=waking" and out.splitlines()[-1] == "every gang serves: gang0"
    assert power()[:2] == ["gang0", "serving"]

    off = gateway_host.run("waker-config", "--off")
    assert off.returncode == 0, off.stderr
    assert "disable --now vllm-cluster-waker.service" in gateway_host.calls.read_text()
    assert not gateway_host.config.exists() and not (gateway_host.state / "power.json").exists()
    assert not gateway_host.pid.exists()
    assert gateway_host.run("power").stdout == "gang0 serving -\n"
    no_waker = gateway_host.run("wake")
    assert no_waker.returncode != 0 and "no idle stop" in no_waker.stderr


def test_waker_config_installs_the_distributions_aws_sdk_before_it_checks_the_configuration(aws, gateway_host):
    """A gateway whose python3 has no botocore (idle stop turned on for the first time):
    waker-config installs python3-botocore with apt-get first, then checks and starts the
    waker. (Stand-ins: python3 finds botocore only once apt-get installed it.)"""
    installed, apt_calls = gateway_host.root / "botocore-installed", gateway_host.root / "apt-get.calls"
    stand_ins = {
        "python3": f"""if [ "$*" = "-c import botocore" ] && [ ! -e {installed} ]; then exit 1; fi
exec {PYTHON} "$@"
""",
        "apt-get": f"""echo "$*" >>{apt_calls}
case " $* " in *" install "*) touch {installed} ;; esac
""",
    }
    for name, text in stand_ins.items():
        (gateway_host.root / "bin" / name).write_text("#!/usr/bin/env bash\n" + text)
        (gateway_host.root / "bin" / name).chmod(0o755)
    gateway_host.install_waker()
    document = json.dumps(config(endpoint=aws.endpoint, imds=aws.imds.url, ca_file=aws.ca))
    result = gateway_host.run("waker-config", stdin=document)
    assert result.returncode == 0, result.stderr
    assert "installing the waker's AWS SDK (python3-botocore)" in result.stderr
    calls = apt_calls.read_text().splitlines()
    assert [call.split()[-1] for call in calls] == ["-q", "python3-botocore"], calls
    assert "update" in calls[0] and "install" in calls[1] and "--no-install-recommends" in calls[1]
    # Installed once: the next waker-config finds it.
    assert gateway_host.run("waker-config", stdin=document).returncode == 0
    assert len(apt_calls.read_text().splitlines()) == 2


def test_the_waker_script_carries_the_waker_its_unit_and_port_and_then_configures_it(tmp_path):
    document = idle_stop.waker_config(
        region="us-east-1",
        endpoint="https://ec2.us-east-1.amazonaws.com",
        stack=STACK,
        project=PROJECT,
        gangs={"gang0": GANG0},
        idle_stop_minutes=30,
        expected_wake_seconds=300,
    )
    assert waker.parse_config(document)["endpoint"] == "https://ec2.us-east-1.amazonaws.com"
    script = bootstrap.gateway_waker_script(document)
    assert f"PORT_WAKER={ports.WAKER}\n" in script
    assert script.endswith(
        f"exec {bootstrap.GATEWAY_COMMAND} waker-config <<'VLLM_CLUSTER_FILE_END'\n{document}VLLM_CLUSTER_FILE_END\n"
    )
    # Each file where it goes, under tmp_path; waker-config's stdin into a file.
    moved = "".join(
        line.replace("/opt/vllm-cluster", f"{tmp_path}/opt").replace("/etc/", f"{tmp_path}/etc/")
        if line.startswith("install ")
        else line
        for line in script.splitlines(keepends=True)
    )
    moved = moved.replace(f"exec {bootstrap.GATEWAY_COMMAND} waker-config", "exec cat >" + str(tmp_path / "fed"))
    result = subprocess.run(["bash", "-s"], input=moved, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "opt/bin/vllm-cluster-waker").read_text() == WAKER_SCRIPT.read_text()
    unit = (tmp_path / "etc/systemd/system/vllm-cluster-waker.service").read_text()
    assert "Restart=on-failure" in unit and "EnvironmentFile=/etc/vllm-cluster/waker.env" in unit
    assert (tmp_path / "fed").read_text() == document


def test_a_moved_waker_port_reaches_waker_env_and_the_site(monkeypatch):
    monkeypatch.setattr(ports, "WAKER", 18099)
    assert "PORT_WAKER=18099\n" in bootstrap.gateway_waker_script("{}")
    assert "proxy_pass http://127.0.0.1:18099;" in gateway_nginx.nginx_site("10.0.0.1", ("10.0.0.0/8",), waker=True)


def test_the_endpoint_is_verified_against_the_trust_store(aws):
    """Without the test CA (the system's trust store alone) the double's certificate is
    refused before any request is sent."""
    from botocore.exceptions import SSLError

    role = waker.instance_role(aws.imds.url)
    assert waker.trust_store({}) == waker.SYSTEM_TRUST_STORE
    untrusting = waker.Ec2(aws.endpoint, "us-east-1", role, waker.trust_store({}))
    with pytest.raises(SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusting.describe(GANG0, STACK)
    # Nor does a name the certificate does not hold pass, CA or not.
    by_address = waker.Ec2(
        f"https://127.0.0.1:{aws.ec2.port}", "us-east-1", role, waker.trust_store({"ca_file": aws.ca})
    )
    with pytest.raises(SSLError, match="CERTIFICATE_VERIFY_FAILED|match"):
        by_address.describe(GANG0, STACK)
    assert aws.ec2.calls == []


def test_prometheus_reads_which_gangs_are_asleep_from_the_waker_and_a_client_cannot(aws, head, start_waker):
    """GET /metrics: 1 for a gang stopped, stopping or waking (the alerts of an engine
    or a Ray node gone leave such a gang alone, components/metrics.py), 0 for a serving
    one; through nginx (X-Forwarded-For) it is just a request no gang could take."""
    for instance_id in GANG1:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0, "gang1": GANG1})
    eventually(lambda: process.power().get("gang1", {}).get("state") == "stopped", what="gang1 seen stopped")
    status, headers, body = process.request("GET", "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    samples = [line for line in body.decode().splitlines() if line.startswith(waker.ASLEEP_METRIC)]
    assert samples == ['vllm_cluster_gang_asleep{gang="gang0"} 0', 'vllm_cluster_gang_asleep{gang="gang1"} 1']
    assert process.request("GET", "/metrics", headers={"X-Forwarded-For": "203.0.113.9"})[0] in (502, 503)


def test_the_asleep_gauge_counts_stopping_and_waking_as_asleep():
    text = waker.exposition({"gang0": "serving", "gang1": "stopping", "gang2": "waking", "gang3": "stopped"})
    assert [line for line in text.decode().splitlines() if line.startswith(waker.ASLEEP_METRIC)] == [
        'vllm_cluster_gang_asleep{gang="gang0"} 0',
        'vllm_cluster_gang_asleep{gang="gang1"} 1',
        'vllm_cluster_gang_asleep{gang="gang2"} 1',
        'vllm_cluster_gang_asleep{gang="gang3"} 1',
    ]


def test_an_operators_probe_finds_the_service_asleep_and_wakes_nothing(aws, head, start_waker):
    """`vllm-cluster status` right after the last gang stopped (before this waker's next
    look at EC2) still sends its completion through the endpoint: marked as a probe, it
    gets the answer any request would, and starts no instance."""
    for instance_id in GANG0:
        aws.states[instance_id] = "stopped"
    process = start_waker({"gang0": GANG0})
    eventually(lambda: process.power().get("gang0", {}).get("state") == "stopped", what="gang0 seen stopped")
    body = json.dumps({"model": "m", "prompt": "hello"}).encode()
    probe = {"X-Forwarded-For": "203.0.113.9", waker.PROBE_HEADER: "status", "X-Vllm-Cluster-Status": "502"}
    status, headers, _ = process.request("POST", "/v1/completions", body, probe)
    assert status == 503 and headers["Retry-After"] == "30"
    assert aws.started == [] and process.power()["gang0"]["state"] == "stopped"
    # The same request from a client wakes it.
    status, _, _ = process.completion()
    assert status == 503 and sorted(aws.started) == sorted(GANG0)
