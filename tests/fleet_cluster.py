"""The whole bootstrap on the local fleet: the program under the mock runtime with a
stack config for the fleet, its instances mapped to the fleet's hosts, the user
data run as cloud-init would, then every declared command replayed over SSH.

Used by tests/test_fleet.py and bench/bench_fleet.py.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from components.catalog import CATALOG
from components.topology import efa_interface_count
from fleet import BRIDGE_IP, GATEWAY_IP, VPC_CIDR, Fleet, Host, node_ip
from pulumi_mocks import ProgramRun, run_program
from replay import Outcome, replay, user_data_of

ROOT = Path(__file__).resolve().parent.parent
HUB_PORT = 8765
SECRET_KEYS = ("apiKey", "hfToken", "tlsPrivateKey")
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
# Ends in "=": a base64 key, which the node must keep whole (an `IFS==` read would not).
API_KEY = "ZmxlZXQtdGVzdC1hcGkta2V5LXdpdGgtcGFkZGluZy0x="


def fleet_config(nodes: int, **overrides: Any) -> dict[str, Any]:
    """A stack config for the fleet: g5.12xlarge nodes (4 logical GPUs each), TP 4
    inside a node and PP across them, EFA on (the type has one EFA interface), the VPC
    where the fleet's addresses are."""
    config = {
        "model": MODEL,
        "instanceType": "g5.12xlarge",
        "nodes": nodes,
        "tensorParallelSize": 4,
        "pipelineParallelSize": nodes,
        "efa": "true",
        "apiAllowedCidrs": [VPC_CIDR],
        "adminCidrs": [f"{BRIDGE_IP}/32"],
        "vpcCidr": VPC_CIDR,
        "hfEndpoint": f"http://{BRIDGE_IP}:{HUB_PORT}",
        "maxModelLen": 4096,
        "apiKey": API_KEY,
    }
    config.update(overrides)
    return config


def instance_ips(nodes: int) -> dict[str, str]:
    ips = {"vllm-head": node_ip(0), "vllm-host": GATEWAY_IP}
    ips.update({f"vllm-worker-{i}": node_ip(i) for i in range(1, nodes)})
    return ips


def fleet_program(nodes: int, key_store: dict, **overrides: Any) -> ProgramRun:
    run = run_program(
        fleet_config(nodes, **overrides),
        stack="fleet",
        instance_ips=instance_ips(nodes),
        public_ips={"vllm-ip": GATEWAY_IP},
        secret_keys=["apiKey"],
        real_crypto=True,
        key_store=key_store,
    )
    if run.error is not None:
        raise RuntimeError(f"the program failed under the mock runtime: {run.error}")
    return run


class FakeHub:
    """tests/doubles/fake_hf_hub.py serving one tiny model repository on the bridge."""

    def __init__(self, workdir: Path):
        self.root = workdir / "hub"
        self.log = workdir / "hub-downloads.jsonl"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "FakeHub":
        repo = self.root / MODEL
        repo.mkdir(parents=True, exist_ok=True)
        (repo / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 24}))
        (repo / "model.safetensors").write_bytes(bytes(range(256)) * 4096)
        # The training-format checkpoint many repos carry beside the safetensors (Llama's original/).
        (repo / "original").mkdir(exist_ok=True)
        (repo / "original" / "consolidated.00.pth").write_bytes(b"\0" * 65536)
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "doubles" / "fake_hf_hub.py"), "--root", str(self.root),
             "--host", BRIDGE_IP, "--port", str(HUB_PORT), "--log", str(self.log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        return self

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def downloads(self) -> int:
        return len(self.files())

    def files(self) -> list[str]:
        """Every file the hub served, in order (a file twice means a second download)."""
        if not self.log.exists():
            return []
        return [json.loads(line)["file"] for line in self.log.read_text().splitlines()]


@dataclass
class ClusterUnderTest:
    run: ProgramRun
    fleet: Fleet
    hub: FakeHub
    key_store: dict
    config: dict[str, Any] = field(default_factory=dict)
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    booted_at: float = 0.0
    ready_at: float = 0.0
    # Wall-clock time the hosts were started and the replay began (compared with host logs).
    started_wall: float = 0.0

    @property
    def head(self) -> Host:
        return self.fleet.nodes[0]

    @property
    def endpoint(self) -> str:
        return self.run.outputs["endpoint"]

    @property
    def api_key(self) -> str:
        return self.run.outputs["apiKey"]

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.run.outputs["tlsCertificate"])

    def request(self, path: str, body: dict | None = None, key: str | None = "default", timeout: float = 60):
        """(HTTP status, parsed body) of a request to the exported endpoint."""
        url = self.endpoint.removesuffix("/v1") + path
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {self.api_key if key == 'default' else key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(request, context=self.tls(), timeout=timeout) as response:
                raw = response.read()
                return response.status, (json.loads(raw) if raw.strip() else None)
        except urllib.error.HTTPError as error:
            raw = error.read()
            try:
                return error.code, json.loads(raw)
            except json.JSONDecodeError:
                return error.code, raw.decode(errors="replace")

    def completion(self, timeout: float = 60) -> int:
        try:
            status, _ = self.request("/v1/completions", {"model": self.served_model, "prompt": "Hi", "max_tokens": 2},
                                     timeout=timeout)
        except OSError:
            return 0
        return status

    @property
    def served_model(self) -> str:
        return self.config.get("servedModelName") or self.config["model"]

    def wait_for_completion(self, timeout: float) -> float:
        """Seconds until a completion through the gateway succeeds; raises on timeout."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.completion(timeout=30) == 200:
                return time.monotonic() - started
            time.sleep(2)
        raise TimeoutError(f"no successful completion through {self.endpoint} within {timeout:g} s")

    def operator_files(self, workdir: Path) -> list[str]:
        """Arguments for scripts/vllm-cluster: the fleet's stack file and its outputs
        (what `pulumi stack output --json --show-secrets` would print)."""
        import yaml

        stack_file, outputs = workdir / "Pulumi.fleet.yaml", workdir / "outputs.json"
        # Secrets as a stack file holds them: encrypted (the tools never need their values).
        config = {f"vllm-cluster:{k}": ({"secure": "v1:ciphertext"} if k in SECRET_KEYS else v)
                  for k, v in self.config.items()}
        stack_file.write_text(yaml.safe_dump({"config": config}))
        outputs.write_text(json.dumps(self.run.outputs))
        return ["--stack", "fleet", "--stack-file", str(stack_file), "--outputs", str(outputs)]

    def operator(self, *args: str) -> subprocess.CompletedProcess:
        """scripts/vllm-cluster SUBCOMMAND against the fleet."""
        return subprocess.run([str(ROOT / "scripts" / "vllm-cluster"), *args, *self.operator_files(self.fleet.workdir)],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)

    def node_shell(self, index: int, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.fleet.ssh(self.fleet.nodes[index], command, check=check)

    def unit_property(self, index: int, unit: str, name: str) -> str:
        return self.node_shell(index, f"systemctl show -p {name} --value {unit}").stdout.strip()


def efa_devices(config: dict[str, Any]) -> int:
    """What the fi_info double reports: the interfaces the program gives the type."""
    return efa_interface_count(CATALOG[config["instanceType"]], config["efa"] == "true")


@contextmanager
def serving_cluster(workdir: Path, nodes: int = 3, **overrides: Any) -> Iterator[ClusterUnderTest]:
    """Start the fleet's hosts with the program's user data (cloud-init's final stage
    runs it at boot) and replay the program's commands at once, while the hosts still
    boot, as `pulumi up` does; yields once `pulumi up` would have finished (the
    readiness command passed)."""
    key_store: dict = {}
    run = fleet_program(nodes, key_store, **overrides)
    config = fleet_config(nodes, **overrides)
    public_key = next(r for r in run.of_type("aws:ec2/keyPair:KeyPair")).inputs["publicKey"]
    host_names = {"vllm-host": "gateway", "vllm-head": "node0"}
    host_names.update({f"vllm-worker-{i}": f"node{i}" for i in range(1, nodes)})
    user_data = {host_names[instance]: script for instance, script in user_data_of(run).items()}
    with Fleet(workdir, nodes, public_key, run.outputs["sshPrivateKey"], efa_devices=efa_devices(config),
               user_data=user_data, wait_for_ssh=False) as fleet, FakeHub(workdir) as hub:
        cluster = ClusterUnderTest(run, fleet, hub, key_store, config=config, booted_at=time.monotonic(),
                                   started_wall=time.time())
        cluster.outcomes = replay(run)
        cluster.ready_at = time.monotonic()
        yield cluster
