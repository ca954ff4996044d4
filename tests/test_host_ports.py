"""components/ports.py is the one place a port is written. Move one there and it reaches
every host file: cluster.env carries it, the node's setup copies it into node.env, and
the units, the node script and the checks take it from there; the nginx site and
vLLM's arguments are rendered with it. No host file holds a port number of its own."""

from __future__ import annotations

import re
import socket
import subprocess
import urllib.request
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

from components import bootstrap, gateway_nginx, image, ports
from tests.test_bootstrap import boot, parse_env, spec_of

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
HOST_FILES = sorted(
    path
    for folder in ("node", "gateway", "lib")
    for path in (SCRIPTS / folder).rglob("*")
    if path.is_file() and "__pycache__" not in path.parts
)
NODE_SCRIPT = SCRIPTS / "node" / "vllm-cluster-node"
LIBRARY = SCRIPTS / "lib" / "vllm-cluster-lib.sh"
UNITS = SCRIPTS / "node" / "units"

# Every port the hosts or the renderer use, moved to a number nothing else holds.
MOVED = {
    "VLLM_API": 18000,
    "RAY_GCS": 16379,
    "RAY_DASHBOARD": 18265,
    "RAY_CLIENT": 11001,
    "API_HTTPS": 10443,
    "DASHBOARD_HTTPS": 18443,
    "RAY_METRICS": 18080,
    "RAY_NODE_MANAGER": 18076,
    "RAY_OBJECT_MANAGER": 18077,
    "RAY_RUNTIME_ENV_AGENT": 18078,
    "RAY_DASHBOARD_AGENT_GRPC": 18079,
    "RAY_DASHBOARD_AGENT_HTTP": 18081,
    "RAY_DASHBOARD_METRICS": 18082,
    "RAY_AUTOSCALER_METRICS": 18083,
    "FABRIC_RENDEZVOUS": 18084,
    "RAY_MIN_WORKER": 20002,
    "RAY_MAX_WORKER": 20999,
    "PROMETHEUS": 19090,
    "WAKER": 18099,
}
# Moved ports that cluster.env does not carry: the admin port is only in the nginx site,
# Prometheus's in the gateway's Prometheus flags and nginx site, the waker's in the
# gateway's waker.env and nginx site.
NOT_CARRIED = ("DASHBOARD_HTTPS", "PROMETHEUS", "WAKER")
ORIGINAL = {name: getattr(ports, name) for name in MOVED}

HEAD_IP, WORKER_IP = "10.42.128.10", "10.42.128.11"


def port_constants() -> dict[str, int]:
    return {name: value for name, value in vars(ports).items() if name.isupper() and isinstance(value, int)}


def holds_number(text: str, number: int) -> bool:
    """Whether `number` stands on its own in text (not inside 18000, 1.8000 or a key)."""
    return re.search(rf"(?<![\w.]){number}(?![\w.])", text) is not None


@pytest.fixture
def moved(monkeypatch):
    for name, port in MOVED.items():
        monkeypatch.setattr(ports, name, port)


def test_the_moved_ports_are_new_numbers():
    assert set(MOVED) >= {name for name in port_constants() if name not in ("SSH", "NFS")}
    assert not set(MOVED.values()) & set(port_constants().values())


def test_no_host_file_writes_a_port_number():
    # SSH (22) is left out: "22" is also Ubuntu 22.04, and no host file names sshd's port
    # (the image's sshd listens on its default; the gateway's ssh dials that default).
    numbers = {name: value for name, value in port_constants().items() if name != "SSH"}
    for path in HOST_FILES:
        text = path.read_text()
        for name, number in numbers.items():
            assert not holds_number(text, number), f"{path.relative_to(ROOT)} writes {number} (ports.{name})"


def test_every_port_a_host_file_reads_is_one_cluster_env_carries_and_each_is_read():
    # The gateway's waker.env carries the waker's port (the nodes never need it).
    carried = set(bootstrap.port_env()) | set(bootstrap.waker_port_env())
    copy_block = node_env_block()
    read = set()
    for path in HOST_FILES:
        text = path.read_text().replace(copy_block, "")  # setup's copy into node.env is not a use
        names = set(re.findall(r"\bPORT_[A-Z0-9_]+\b", text))
        assert names <= carried, f"{path.name} reads {sorted(names - carried)}, which cluster.env does not carry"
        read |= names
    assert read == carried, f"cluster.env carries ports no host file reads: {sorted(carried - read)}"


def node_env_block() -> str:
    text = NODE_SCRIPT.read_text()
    block = text[text.index("write_node_env() {") :]
    return block[: block.index("\n}\n") + 3]


def node_script_constant(name: str) -> str:
    """The node script's own `readonly NAME=value`, as an assignment (not readonly: the
    test's shell sets its stand-ins beside it)."""
    match = re.search(rf"^readonly ({name}=.*)$", NODE_SCRIPT.read_text(), re.MULTILINE)
    assert match, f"{name} is not a readonly constant of {NODE_SCRIPT}"
    return match.group(1)


def written_node_env(tmp_path: Path, index: int) -> dict[str, str]:
    """node.env as the node's setup writes it (write_node_env, run by bash) from the
    cluster.env the stack renders; the primary interface is a stand-in."""
    work = tmp_path / f"node-{index}"
    work.mkdir()
    (work / "cluster.env").write_text(bootstrap.cluster_env(boot(index)))
    (work / "ofi-nccl").mkdir()
    (work / "ofi-nccl" / image.OFI_NCCL_PLUGIN).write_bytes(b"\x7fELF")
    script = f"""set -euo pipefail
. {LIBRARY}
CLUSTER_ENV={work}/cluster.env NODE_ENV={work}/node.env MODEL_ROOT=/mnt/vllm-models
SECRETS_DIR=/etc/vllm-cluster/secrets {node_script_constant("ENGINE_CACHE")}
load_env "$CLUSTER_ENV"
OFI_NCCL_LIB_DIRS={work}/ofi-nccl  # the image's aws-ofi-nccl (EFA is on), a stand-in
find_primary_interface() {{ echo ens5 {HEAD_IP if index == 0 else WORKER_IP}; }}
{node_env_block()}
write_node_env
"""
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return parse_env((work / "node.env").read_text())


def test_a_moved_port_reaches_cluster_env_and_node_env(tmp_path, moved):
    expected = {f"PORT_{name}": str(port) for name, port in MOVED.items() if name not in NOT_CARRIED}
    assert bootstrap.port_env() == expected
    for index in (0, 1):
        assert parse_env(bootstrap.cluster_env(boot(index))).items() >= expected.items()
        assert written_node_env(tmp_path, index).items() >= expected.items()


def expand_like_systemd(line: str, env: dict[str, str]) -> list[str]:
    """An Exec line's words with ${NAME} and $NAME replaced from the unit's
    EnvironmentFile=s, as systemd does; a name they lack fails the test."""
    words = []
    for word in line.split():
        if re.fullmatch(r"\$[A-Z_]+", word):  # unbraced: systemd splits the value into words
            words += env[word[1:]].split()
        else:
            words.append(re.sub(r"\$\{([A-Z0-9_]+)\}", lambda m: env[m.group(1)], word))
    return words


def exec_start(unit: str) -> str:
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    return re.search(r"^ExecStart=(.*)$", text, re.M).group(1)


def test_ray_starts_on_the_moved_ports(tmp_path, moved):
    head, worker = written_node_env(tmp_path, 0), written_node_env(tmp_path, 1)
    started = expand_like_systemd(exec_start("ray-head.service"), head)
    assert "--port=16379" in started and "--dashboard-port=18265" in started
    assert "--ray-client-server-port=11001" in started
    joined = expand_like_systemd(exec_start("ray-worker.service"), worker)
    assert f"--address={HEAD_IP}:16379" in joined
    # Every listener Ray would otherwise put on a random port, on every node; the head's
    # own metrics endpoints (dashboard, autoscaler) through Ray's environment variables.
    for words in (started, joined):
        for flag in (
            "--metrics-export-port=18080",
            "--node-manager-port=18076",
            "--object-manager-port=18077",
            "--runtime-env-agent-port=18078",
            "--dashboard-agent-grpc-port=18079",
            "--dashboard-agent-listen-port=18081",
            "--min-worker-port=20002",
            "--max-worker-port=20999",
        ):
            assert flag in words, (flag, words)
    assert started[:3] == ["/usr/bin/env", "DASHBOARD_METRIC_PORT=18082", "AUTOSCALER_METRIC_PORT=18083"], started


def test_vllm_serves_on_the_moved_port_and_the_gateway_reaches_it_there(tmp_path, moved):
    vllm_env = parse_env(bootstrap.vllm_env(spec_of(), HEAD_IP, [HEAD_IP]))
    served = expand_like_systemd(exec_start("vllm.service"), {**written_node_env(tmp_path, 0), **vllm_env})
    assert served[served.index("--port") + 1] == "18000"
    assert gateway_nginx.gateway_gangs({"gang0": HEAD_IP}) == f"gang0={HEAD_IP}:18000"
    site = gateway_nginx.nginx_site(HEAD_IP, ("198.51.100.7/32",))
    assert f"server {HEAD_IP}:18265;" in site
    assert "listen 10443 ssl;" in site and "listen 18443 ssl;" in site


def test_no_rendered_host_file_holds_a_port_that_moved(moved):
    """What reaches the hosts, rendered with every port moved: the setup command (every
    node script, unit and cluster.env), the user data, vllm.env and the nginx site."""
    rendered = {
        "node setup": bootstrap.node_setup_script(boot(1)),
        "head setup": bootstrap.node_setup_script(boot(0)),
        "node user data": bootstrap.node_user_data(boot(1)),
        "gateway user data": bootstrap.gateway_user_data(),
        "vllm.env": bootstrap.vllm_env(spec_of(), HEAD_IP, [HEAD_IP, WORKER_IP]),
        "nginx site": gateway_nginx.nginx_site(HEAD_IP, ("198.51.100.7/32",)),
        "nginx site with the waker": gateway_nginx.nginx_site(HEAD_IP, ("198.51.100.7/32",), waker=True),
        "the gateway's waker script": bootstrap.gateway_waker_script("{}"),
        "the gateway's gangs": gateway_nginx.gateway_gangs({"gang0": HEAD_IP, "gang1": WORKER_IP}),
    }
    for what, text in rendered.items():
        for name, old in ORIGINAL.items():
            assert not holds_number(text, old), f"{what} still holds {old} (ports.{name} moved to {MOVED[name]})"


# --- the node script and the checks, run against the node.env the setup wrote ----------


def probe_env(spec=None) -> str:
    """probe.env as start-vllm keeps it (vllm-cluster-node keep_probe) for the stack's probe."""
    probe = bootstrap.stack_probe(spec or spec_of())
    return f"PROBE_ROUTE={probe.route}\nPROBE_BODY='{probe.body_json()}'\n"


def node_host(tmp_path: Path, index: int) -> tuple[Path, dict[str, str]]:
    """vllm-cluster-node under a scratch root, with node.env as setup wrote it, vllm.env,
    the stack's probe, the API key, and stand-ins: the virtualenv's python and curl log
    their arguments, systemctl says vLLM runs, id says root."""
    written_node_env(tmp_path, index)
    root = tmp_path / "root"
    config, install = root / "etc/vllm-cluster", root / "opt/vllm-cluster"
    for folder in (config / "secrets", install / "bin", install / "lib", install / "venv/bin"):
        folder.mkdir(parents=True)
    (config / "node.env").write_text((tmp_path / f"node-{index}" / "node.env").read_text())
    (config / "vllm.env").write_text(bootstrap.vllm_env(spec_of(), HEAD_IP, [HEAD_IP, WORKER_IP]))
    (config / "probe.env").write_text(probe_env())
    (config / "secrets/vllm-api.env").write_text("VLLM_API_KEY=test-key\n")
    (install / "lib/vllm-cluster-lib.sh").write_text(LIBRARY.read_text())
    script = NODE_SCRIPT.read_text()
    for path in ("/etc/vllm-cluster", "/opt/vllm-cluster", "/run/vllm-cluster"):
        script = script.replace(path, f"{root}{path}")
    (install / "bin/vllm-cluster-node").write_text(script)
    calls = tmp_path / "calls"
    stand_ins = {
        install / "venv/bin/python": f'echo "python $*" >>{calls}\necho healthy\n',
        # A completion with the key (a header file, -H @...) answers 200, one without 401, a
        # route off the allowlist 404.
        root / "bin/curl": f'echo "curl $*" >>{calls}\ncase "$*" in\n  *"/metrics"*) echo 404 ;;\n'
        '  *"-H @"*) echo 200 ;;\n  *) echo 401 ;;\nesac\n',
        root / "bin/systemctl": 'case "$*" in *MainPID*) echo 4242 ;; esac\n',
        root / "bin/id": "echo 0\n",
    }
    for path, body in stand_ins.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/bash\n{body}")
        path.chmod(0o755)
    return calls, {"PATH": f"{root}/bin:/usr/bin:/bin"}


def run_node(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "root/opt/vllm-cluster/bin/vllm-cluster-node"
    return subprocess.run(["bash", str(script), *args], input="", capture_output=True, text=True, env=env)


def test_the_node_script_reaches_ray_and_vllm_on_the_moved_ports(tmp_path, moved):
    calls, env = node_host(tmp_path, 0)
    for command in (
        ["status-facts"],
        ["wait-cluster", "--timeout", "1"],
        ["watchdog"],
        ["readiness", "--gateway", "203.0.113.5", "--host", "api.example.com", "--timeout", "5"],
    ):
        result = run_node(tmp_path, env, *command)
        assert result.returncode == 0, (command, result.stderr)
    log = calls.read_text()
    ray_checks = [line for line in log.splitlines() if "ray-cluster-check" in line]
    assert ray_checks and all(f"--address {HEAD_IP}:16379" in line for line in ray_checks), log
    assert f"--status-json http://{HEAD_IP}:18000" in log
    assert re.search(rf"vllm-watchdog-check http://{HEAD_IP}:18000 ", log), log
    assert "--connect-to api.example.com:10443:203.0.113.5:10443" in log
    assert "https://api.example.com:10443/v1/completions" in log and "https://api.example.com:10443/metrics" in log


def load_preflight_check():
    loader = SourceFileLoader("preflight_check_ports", str(SCRIPTS / "node" / "preflight-check"))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_preflight_dials_the_heads_gcs_and_dashboard_on_the_moved_ports(tmp_path, moved, monkeypatch):
    written_node_env(tmp_path, 1)  # writes node-1/node.env
    check = load_preflight_check()
    monkeypatch.setattr(check, "NODE_ENV", str(tmp_path / "node-1" / "node.env"))
    monkeypatch.setattr(check, "run", lambda *args: None)  # no nvidia-smi, fi_info or ip here
    dialled = []

    def refuse(target, *args, **kwargs):  # a (host, port) for the GCS, a URL for the dashboard
        dialled.append(target)
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    facts = check.collect(str(tmp_path / "no-model"))
    assert facts["gcs_reachable"] is False and facts["clock_skew_s"] is None
    assert sorted(dialled, key=str) == sorted([(HEAD_IP, 16379), f"http://{HEAD_IP}:18265/api/gcs_healthz"], key=str)
