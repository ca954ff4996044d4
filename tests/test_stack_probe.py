"""The stack's probe of a pooling model on its head: vLLM serves such a model no
/v1/completions (components/api_routes.py, with the vLLM sources), so every check the
stack runs sends the request of the model's task instead, as the stack handed it to
start-vllm (bootstrap.start_vllm_command):

- start-vllm keeps the probe (probe.env) and waits until the head's vLLM answers it;
- readiness sends it through the gateway's real nginx, which forwards the pooling routes
  only, and checks that it gets 401 there without the key;
- the watchdog judges the engine by it;
- status-facts sends it to the head's vLLM.

vllm-cluster-node runs under a scratch root (its paths rewritten, as
tests/test_host_ports.py does), against the vLLM test double serving a pooling model
(tests/doubles/vllm_double: only the routes vLLM 0.33.0 serves for the task, 404 on
/v1/completions), with stand-ins for systemctl, journalctl and id. A generation stack
runs the same commands against the double serving a generation model."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components import bootstrap
from tests import test_gateway_pool as gateway_pool
from tests.test_bootstrap import spec_of
from tests.test_gateway_pool import CLIENT_KEY, HEADS_KEY, assert_ran, free_port, gateway  # noqa: F401 - its fixture
from tests.test_watchdog import Double

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
# The head's vLLM key: the one the double checks, as vLLM checks VLLM_API_KEY.
HEAD_KEY = HEADS_KEY

MODELS = {
    "embed": ["--runner", "pooling", "--pooler-config.task", "embed"],
    "classify": ["--convert", "classify"],
    "generate": [],
}


class Head:
    """A gang's head under `root`: node.env, vllm.env (as the stack renders them for
    `extra_args`), the keys, the node script and its checks. venv/bin/python is this
    Python, except that Ray's cluster check (no Ray here) finds every node."""

    def __init__(self, root: Path, extra_args: list[str], vllm_port: int, gateway_port: int = 9):
        self.root = root
        self.spec = spec_of(vllmExtraArgs=extra_args, servedModelName="served", nodes=1)
        self.probe = bootstrap.stack_probe(self.spec)
        config, install = root / "etc/vllm-cluster", root / "opt/vllm-cluster"
        for folder in (config / "secrets", install / "bin", install / "lib", install / "venv/bin", root / "bin"):
            folder.mkdir(parents=True)
        (config / "node.env").write_text(
            "NODE_NAME=head\nNODE_ROLE=head\nNODE_IP=127.0.0.1\nHEAD_IP=127.0.0.1\n"
            f"PORT_VLLM_API={vllm_port}\nPORT_API_HTTPS={gateway_port}\nPORT_RAY_GCS={free_port('127.0.0.1')}\n"
        )
        self.vllm_env = bootstrap.vllm_env(self.spec, "127.0.0.1", ["127.0.0.1"])
        (config / "secrets/vllm-api.env").write_text(f"VLLM_API_KEY={HEAD_KEY}\n")
        (config / "secrets/gateway-probe.env").write_text(f"GATEWAY_PROBE_KEY={CLIENT_KEY}\n")

        def moved(text: str) -> str:
            for path in ("/etc/vllm-cluster", "/opt/vllm-cluster", "/run/vllm-cluster", "/var/lib/vllm-cluster"):
                text = text.replace(path, f"{root}{path}")
            return text

        (install / "lib/vllm-cluster-lib.sh").write_text(moved((SCRIPTS / "lib/vllm-cluster-lib.sh").read_text()))
        shutil.copy(SCRIPTS / "lib/vllm_cluster_lib.py", install / "lib")
        (install / "bin/vllm-cluster-node").write_text(moved((SCRIPTS / "node/vllm-cluster-node").read_text()))
        for check in ("vllm-watchdog-check", "ray-cluster-check"):
            shutil.copy(SCRIPTS / "node" / check, install / "bin")
        self.systemctl = root / "systemctl.log"
        stand_ins = {
            install / "venv/bin/python": 'case "$*" in *ray-cluster-check*"--timeout 0"*) exit 0 ;; esac\n'
            f'exec {sys.executable} "$@"\n',
            root / "bin/systemctl": f'echo "$*" >>{self.systemctl}\ncase "$*" in *MainPID*) echo 4242 ;; esac\n',
            root / "bin/journalctl": "echo '(no journal here)'\n",
            root / "bin/id": "echo 0\n",
        }
        for path, body in stand_ins.items():
            path.write_text(f"#!/bin/bash\n{body}")
            path.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{root}/bin:{os.environ['PATH']}", "PROGRESS_SECONDS": "600"}

    def run(self, *args: str, stdin: str = "", timeout: float = 120) -> subprocess.CompletedProcess:
        script = self.root / "opt/vllm-cluster/bin/vllm-cluster-node"
        return subprocess.run(
            ["bash", str(script), *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=timeout
        )

    def start_vllm(self) -> subprocess.CompletedProcess:
        """start-vllm as the stack's command runs it: its arguments from the command line
        the stack sends, vllm.env on stdin; a short start timeout (VLLM_START_TIMEOUT)."""
        words = shlex.split(bootstrap.start_vllm_command(self.probe, 600))
        self.env["VLLM_START_TIMEOUT"] = "5"
        return self.run(*words[words.index("start-vllm") :], stdin=self.vllm_env)


@pytest.fixture(params=sorted(MODELS))
def served(request, tmp_path, monkeypatch):
    """(the double serving the model, its head), the model as the parameter names it."""
    monkeypatch.setenv("VLLM_API_KEY", HEAD_KEY)
    double = Double(tmp_path, extra_args=("--served-model-name", "served", *MODELS[request.param]), api_key=HEAD_KEY)
    try:
        yield double, Head(tmp_path / "head", MODELS[request.param], double.port)
    finally:
        double.stop()


def requests_seen(double: Double) -> list[str]:
    """The double's access log, one request a line: "POST /v1/embeddings 200"."""
    lines = [line.split('"') for line in double.log.read_text().splitlines() if line.count('"') == 2]
    return [f"{request} {status.strip()}" for _, request, status in lines]


def test_start_vllm_keeps_the_stacks_probe_and_waits_for_its_answer(served):
    double, head = served
    started = head.start_vllm()
    assert started.returncode == 0, started.stderr
    posted = [seen for seen in requests_seen(double) if seen.startswith("POST ")]
    assert posted == [f"POST {head.probe.route} 200"], posted
    kept = head.root / "etc/vllm-cluster/probe.env"
    assert kept.stat().st_mode & 0o777 == 0o600
    # What the checks read back (bash sources it) is the probe the stack sent, byte for byte.
    read = subprocess.run(
        ["bash", "-c", f'. {kept} && printf "%s\\n%s" "$PROBE_ROUTE" "$PROBE_BODY"'], capture_output=True, text=True
    )
    assert read.stdout.split("\n") == [head.probe.route, head.probe.body_json()]
    # The same probe again restarts nothing (a new probe alone would not either: its own file).
    again = head.start_vllm()
    assert again.returncode == 0 and "nothing to restart" in again.stderr, again.stderr


def test_start_vllm_refuses_a_probe_the_checks_could_not_read_back(served):
    _, head = served
    for route, body in (("v1/embeddings", "{}"), ("/v1/x", "{'a': 1}"), ("/v1/x", "not json")):
        refused = head.run(
            "start-vllm", "--probe-route", route, "--probe-body", body, "--stall-seconds", "600", stdin=head.vllm_env
        )
        assert refused.returncode == 1 and "start-vllm: --probe-" in refused.stderr, refused.stderr
    assert head.run("start-vllm", stdin=head.vllm_env).returncode == 1
    assert not (head.root / "etc/vllm-cluster/probe.env").exists()


def test_the_watchdog_sends_the_stacks_probe_and_finds_the_engine_healthy(served):
    double, head = served
    assert head.start_vllm().returncode == 0
    before = len(requests_seen(double))
    watched = head.run("watchdog")
    assert watched.returncode == 0, watched.stderr
    asked = requests_seen(double)[before:]
    assert [seen for seen in asked if seen.startswith("POST ")] == [f"POST {head.probe.route} 200"], asked
    # Healthy: nothing logged, nothing restarted.
    assert "watchdog:" not in watched.stderr and "restart" not in head.systemctl.read_text()


def test_status_facts_sends_the_stacks_probe_to_the_heads_vllm(served):
    _, head = served
    assert head.start_vllm().returncode == 0
    facts = head.run("status-facts")
    assert facts.returncode == 0, facts.stderr
    snapshot = json.loads(facts.stdout)
    assert snapshot["health"] == 200 and "ray_error" in snapshot  # no Ray here
    assert snapshot["completion"]["status"] == 200, snapshot


@pytest.fixture
def nginx(request):
    """test_gateway_pool's gateway (a real nginx serving the stack's site), where nginx is."""
    if not gateway_pool.NGINX or not shutil.which("curl"):
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail("nginx or curl missing: .ci/run should have installed them (tools/install-test-deps)")
        pytest.skip("nginx or curl not installed (tools/install-test-deps installs them as root)")
    return request.getfixturevalue("gateway")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_readiness_sends_the_stacks_probe_through_the_gateway_and_gets_401_without_the_key(
    nginx, tmp_path, monkeypatch, model
):
    """The gateway forwards the model's routes only (a pooling model's: no
    /v1/completions), so the readiness check passes only with the probe of its task."""
    front = nginx
    monkeypatch.setenv("VLLM_API_KEY", HEAD_KEY)
    double = Double(tmp_path / "gang", extra_args=("--served-model-name", "served", *MODELS[model]), api_key=HEAD_KEY)
    try:
        head = Head(tmp_path / "head", MODELS[model], double.port, front.api_port)
        double.name, double.address = "gang0", f"127.0.0.1:{double.port}"
        assert_ran(front.configure(double, site=front.site(api_routes=head.spec.api_routes)))
        assert head.start_vllm().returncode == 0
        ready = head.run(
            "readiness", "--gateway", "127.0.0.1", "--host", "test", "--timeout", "20", stdin=front.cert.read_text()
        )
    finally:
        double.stop()
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.startswith(f"ready: POST {head.probe.route} of served through https://test"), ready.stdout
    # The probe went through nginx to the gang, with the heads' key the gateway holds.
    assert requests_seen(double)[-1] == f"POST {head.probe.route} 200", requests_seen(double)
