"""The whole bootstrap on the local fleet: the program under the mock runtime with a
stack config for the fleet, its instances mapped to the fleet's hosts, the user
data run as cloud-init would, then every declared command replayed over SSH.

Used by `make local` (tools/local_target.py), the fleet tests and the benches. The
fake Hugging Face hub (tests/doubles/fake_hf_hub.py) and the tiny model's builder
(tests/tiny_model.py) run as programs, by path.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from cli.mock_runtime import ProgramRun, real_private_key, run_program
from components import node_env
from components.catalog import CATALOG
from components.topology import efa_interface_count, node_name
from localhosts.fleet import (
    CACHE_DIR,
    MAIN_NETWORK,
    SSH_USER,
    Fleet,
    Host,
    Network,
    _digest,
    baked_hosts_by_default,
    base_rootfs,
    building,
    fleet_venv,
    host_image,
    serve_on_bridge,
)
from localhosts.replay import COMMAND, Outcome, ReplayError, host_keys_of, replay, user_data_of

ROOT = Path(__file__).resolve().parent.parent
HUB_PORT = 8765
SECRET_KEYS = ("apiKey", "hfToken", "tlsPrivateKey", "sshPrivateKey")
# Where the local hosts have the shared directory of a stack of hosts (modelCacheDir).
LOCAL_MODEL_CACHE_DIR = "/srv/vllm-shared"
# The tiny model tests/tiny_model.py builds (no network), under a Hub repository name
# of its own: the fake hub serves it, the nodes stage it and vLLM serves it.
MODEL = "vllm-cluster-tests/tiny-llama"
# Ends in "=": a base64 key, which the node must keep whole (an `IFS==` read would not).
API_KEY = "ZmxlZXQtdGVzdC1hcGkta2V5LXdpdGgtcGFkZGluZy0x="
KV_CACHE_BYTES = "256M"
# vLLM's compile cache on a node (VLLM_CACHE_ROOT), as the node script names it.
ENGINE_CACHE = re.search(
    r"^readonly ENGINE_CACHE=(\S+)$", (ROOT / "scripts" / "node" / "vllm-cluster-node").read_text(), re.MULTILINE
).group(1)
# vLLM's own line for its engine's start (the model's compile included), v1/engine/core.py.
ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)")


def fleet_config(nodes: int, network: Network = MAIN_NETWORK, **overrides: Any) -> dict[str, Any]:
    """A stack config for the fleet: g5.8xlarge nodes (one GPU each, and EFA), one
    pipeline stage per node (PP = nodes, TP 1), the VPC where the fleet's addresses
    are (its `network`), and the vLLM release and the locked environment of the fleet's
    engine (its CPU build)."""
    config = {
        "model": MODEL,
        "instanceType": "g5.8xlarge",
        "nodes": nodes,
        "tensorParallelSize": 1,
        "pipelineParallelSize": nodes,
        "efa": "true",
        "vllmVersion": node_env.local_host_vllm_version(),
        # The environment the nodes install: the local hosts' lock (the CPU engine and
        # the GPU-build double), as a stack names its own with nodeLock.
        "nodeLock": str(node_env.local_host().lock_path.relative_to(ROOT)),
        # On vLLM's CPU platform --gpu-memory-utilization is a share of the host's RAM
        # (for every worker on this one machine): the KV cache gets a size instead.
        # A batch of two sequences: a few long completions fill it, as real traffic fills
        # a GPU's, and what comes after them waits (the watchdog tests need a full engine).
        "vllmExtraArgs": [f"--kv-cache-memory-bytes={KV_CACHE_BYTES}", "--max-num-seqs=2"],
        "apiAllowedCidrs": [network.vpc_cidr],
        "adminCidrs": [f"{network.bridge_ip}/32"],
        "vpcCidr": network.vpc_cidr,
        "hfEndpoint": f"http://{network.bridge_ip}:{HUB_PORT}",
        "maxModelLen": 4096,
        "apiKey": API_KEY,
    }
    config.update(overrides)
    return config


def own_hosts_config(
    nodes: int,
    private_key: str,
    replicas: int = 1,
    network: Network = MAIN_NETWORK,
    host_keys: dict[str, str] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """fleet_config's cluster as a stack of hosts a user already has (config hosts): the
    fleet's hosts by address, gang by gang, reached through its gateway with a key of the
    user's own, the shared directory at LOCAL_MODEL_CACHE_DIR; no AWS (no VPC, no EFA),
    and the API key left to the stack to draw, as a real stack's. `host_keys`: address ->
    the machine's public SSH host key, the stack's hostKeys."""
    config = fleet_config(nodes, network, **overrides)
    for key in ("nodes", "efa", "vpcCidr"):
        config.pop(key)
    if "apiKey" not in overrides:
        config.pop("apiKey")
    config.update(
        hosts=[",".join(network.node_ip(gang * nodes + index) for index in range(nodes)) for gang in range(replicas)],
        gatewayHost=network.gateway_ip,
        gatewayPrivateIp=network.gateway_ip,
        sshUser=SSH_USER,
        sshPrivateKey=private_key,
        modelCacheDir=LOCAL_MODEL_CACHE_DIR,
    )
    if host_keys is not None:
        config["hostKeys"] = [f"{address} {' '.join(key.split()[:2])}" for address, key in host_keys.items()]
    return config


def machine_host_keys(names: list[str]) -> dict[str, dict[str, str]]:
    """Host name -> an SSH host key of its own (privateKeyOpenssh, publicKeyOpenssh): what
    a machine the user already has was given at its install."""
    return {name: real_private_key("ED25519") for name in names}


def own_hosts_program(config: dict[str, Any], key_store: dict) -> ProgramRun:
    """The program for a stack of hosts (own_hosts_config): nothing to map to the hosts,
    which the config names; secrets drawn and kept in `key_store`, as in a stack's state."""
    run = run_program(
        config,
        stack="fleet",
        secret_keys=["sshPrivateKey"],
        real_crypto=True,
        key_store=key_store,
        stdout_references=True,
    )
    if run.error is not None:
        raise RuntimeError(f"the program failed under the mock runtime: {run.error}")
    return run


def fleet_gangs(overrides: dict[str, Any]) -> int:
    """How many gangs of hosts a fleet of fleet_config's stack with `overrides` needs: every
    gang the stack declares (maxReplicas when set above 0, warm gangs too, else replicas),
    as spec.declared_gangs counts them."""
    return int(overrides.get("maxReplicas") or 0) or int(overrides.get("replicas", 1))


def node_hosts(nodes: int, replicas: int = 1) -> dict[str, str]:
    """Instance resource name -> the fleet's host for it: gang by gang, head first
    (node0 is gang 0's head; with two gangs of one node, node1 is gang 1's head)."""
    return {
        f"vllm-{node_name(index, gang)}": f"node{gang * nodes + index}"
        for gang in range(replicas)
        for index in range(nodes)
    }


def instance_ips(nodes: int, replicas: int = 1, network: Network = MAIN_NETWORK) -> dict[str, str]:
    ips = {"vllm-gateway-host": network.gateway_ip}
    ips.update(
        {name: network.node_ip(int(host.removeprefix("node"))) for name, host in node_hosts(nodes, replicas).items()}
    )
    return ips


def fleet_program(
    nodes: int,
    key_store: dict,
    moved: dict[str, str] | None = None,
    network: Network = MAIN_NETWORK,
    **overrides: Any,
) -> ProgramRun:
    """The program for the fleet on `network`; `moved`: instance resource name -> the
    private IP of its replacement (a launch-template change gives every replaced node a
    new one)."""
    run = run_program(
        fleet_config(nodes, network, **overrides),
        stack="fleet",
        instance_ips={**instance_ips(nodes, fleet_gangs(overrides), network), **(moved or {})},
        public_ips={"vllm-gateway-ip": network.gateway_ip},
        secret_keys=["apiKey"],
        real_crypto=True,
        key_store=key_store,
        # The replay hands each command's real stdout to the commands whose stdin uses it.
        stdout_references=True,
    )
    if run.error is not None:
        raise RuntimeError(f"the program failed under the mock runtime: {run.error}")
    return run


def tiny_model() -> Path:
    """The tiny model (tests/tiny_model.py), built once with the fleet's virtualenv and cached."""
    source = (ROOT / "tests" / "tiny_model.py").read_text()
    venv = fleet_venv()
    target = CACHE_DIR / f"tiny-model-{_digest(source, str(venv))}"
    if (target / "config.json").exists():
        return target
    with building("tiny-model"):
        if (target / "config.json").exists():
            return target
        scratch = target.with_name(target.name + ".building")
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(
            [str(venv / "bin" / "python"), str(ROOT / "tests" / "tiny_model.py"), str(scratch)],
            check=True,
            capture_output=True,
            text=True,
        )
        scratch.rename(target)
    return target


class FakeHub:
    """tests/doubles/fake_hf_hub.py serving one tiny model repository on the bridge."""

    def __init__(self, workdir: Path, network: Network = MAIN_NETWORK):
        self.network = network
        self.root = workdir / "hub"
        self.log = workdir / "hub-downloads.jsonl"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "FakeHub":
        repo = self.root / MODEL
        shutil.copytree(tiny_model(), repo, dirs_exist_ok=True)
        # The training-format checkpoint many repos carry beside the safetensors (Llama's
        # original/), which vLLM never reads: the nodes must not download it.
        (repo / "original").mkdir(exist_ok=True)
        (repo / "original" / "consolidated.00.pth").write_bytes(b"\0" * 65536)
        command = [sys.executable, str(ROOT / "tests" / "doubles" / "fake_hf_hub.py"), "--root", str(self.root)]
        command += ["--host", self.network.bridge_ip, "--port", str(HUB_PORT), "--log", str(self.log)]
        # Started once its port is known to be its own: another local user's server there
        # would hand the hosts a model of its choosing.
        self.process = serve_on_bridge(
            command, self.network.bridge_ip, HUB_PORT, self.root.parent / "hub.log", what="stand-in Hugging Face Hub"
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
    # A stack of hosts (config hosts, own_hosts_config) rather than of EC2 instances.
    own_hosts: bool = False

    def program(self, moved: dict[str, str] | None = None, **changes: Any) -> ProgramRun:
        """The program again for the cluster's config with `changes`, keeping its secrets
        (its key_store, as a stack's state keeps them); `moved` as fleet_program's."""
        config = {**self.config, **changes}
        if self.own_hosts:
            return own_hosts_program(config, self.key_store)
        nodes = int(config.pop("nodes"))
        return fleet_program(nodes, self.key_store, moved, self.fleet.network, **config)

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
        return self._answer(request, timeout)

    def _answer(self, request: urllib.request.Request, timeout: float) -> tuple[int, Any]:
        """(HTTP status, body) of `request` through the gateway's TLS: the body parsed as
        JSON, None when empty, else its text (an error page, Prometheus's UI)."""
        try:
            with urllib.request.urlopen(request, context=self.tls(), timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        if not raw.strip():
            return status, None
        try:
            return status, json.loads(raw)
        except json.JSONDecodeError:
            return status, raw.decode(errors="replace")

    def completion(self, timeout: float = 60) -> int:
        try:
            status, _ = self.request(
                "/v1/completions", {"model": self.served_model, "prompt": "Hi", "max_tokens": 2}, timeout=timeout
            )
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
        config = {
            f"vllm-cluster:{k}": ({"secure": "v1:ciphertext"} if k in SECRET_KEYS else v)
            for k, v in self.config.items()
        }
        stack_file.write_text(yaml.safe_dump({"config": config}))
        outputs.write_text(json.dumps(self.run.outputs))
        return ["--stack", "fleet", "--stack-file", str(stack_file), "--outputs", str(outputs)]

    def operator(self, *args: str) -> subprocess.CompletedProcess:
        """scripts/vllm-cluster SUBCOMMAND against the fleet."""
        return subprocess.run(
            [str(ROOT / "scripts" / "vllm-cluster"), *args, *self.operator_files(self.fleet.workdir)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )

    def node_shell(self, index: int, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.fleet.ssh(self.fleet.nodes[index], command, check=check)

    def engine_start_seconds(self) -> float:
        """The engine's own start, from its log on the head: vllm.service's main process
        started (after its wait for the Ray cluster) to vLLM's "Application startup
        complete." (its API server ready, the model loaded and compiled on every stage)."""
        started = self.node_shell(0, "systemctl show -p ExecMainStartTimestamp --timestamp=unix --value vllm.service")
        ready = self.node_shell(
            0,
            "sudo journalctl -u vllm.service -o short-unix --no-pager --grep 'Application startup complete' | tail -1",
        )
        began = float(started.stdout.strip().lstrip("@"))
        lines = [line for line in ready.stdout.splitlines() if "Application startup complete" in line]
        if not lines:
            raise RuntimeError("vLLM's log on the head has no 'Application startup complete'")
        return float(lines[-1].split()[0]) - began

    def engine_inits(self, since: str | None = None) -> list[float]:
        """vLLM's "init engine ... took N s" of every engine start on the head since it
        booted, or since the epoch second `since`."""
        window = f"--since @{since}" if since else "-b"
        lines = self.node_shell(0, f"sudo journalctl {window} -u vllm.service -o cat --no-pager").stdout
        return [float(found.group(1)) for found in ENGINE_INIT.finditer(lines)]

    def warmup_key(self) -> str:
        """The key the head's last prepare-serve seeded vLLM's compile cache under."""
        args = self.node_shell(0, "sudo cat /etc/vllm-cluster/prepare-serve.args").stdout.split()
        return args[args.index("--warmup-key") + 1]

    def unit_property(self, index: int, unit: str, name: str) -> str:
        return self.node_shell(index, f"systemctl show -p {name} --value {unit}").stdout.strip()

    def metrics_request(self, path: str, login: str | None = "default", **params: str) -> tuple[int, Any]:
        """(HTTP status, parsed JSON or text) of GET metricsUrl + `path`, from this machine
        (in adminCidrs) through the gateway's TLS, with the stack's metrics login unless
        `login` is None or another USER:PASSWORD."""
        url = self.run.outputs["metricsUrl"] + path.lstrip("/")
        if params:
            url += "?" + urllib.parse.urlencode(params)
        request = urllib.request.Request(url)
        if login is not None:
            pair = self.run.outputs["metricsLogin"] if login == "default" else login
            request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
        return self._answer(request, timeout=30)

    def prometheus_query(self, query: str) -> dict[tuple[str, ...], float]:
        """An instant query through metricsUrl: {label values of gang, node: value}."""
        status, answer = self.metrics_request("api/v1/query", query=query)
        assert status == 200 and answer["status"] == "success", (status, answer)
        return {
            (sample["metric"].get("gang", ""), sample["metric"].get("node", "")): float(sample["value"][1])
            for sample in answer["data"]["result"]
        }

    def prometheus_alerts(self) -> list[dict]:
        status, answer = self.metrics_request("api/v1/alerts")
        assert status == 200 and answer["status"] == "success", (status, answer)
        return answer["data"]["alerts"]

    def wait_for_alert(self, name: str, gang: str, state: str | None, timeout: float) -> float:
        """Seconds until alert `name` of `gang` is in `state` ("firing", "pending"), or
        gone when `state` is None; fails after `timeout`."""
        started = time.monotonic()
        while True:
            states = [
                a["state"]
                for a in self.prometheus_alerts()
                if a["labels"].get("alertname") == name and a["labels"].get("gang") == gang
            ]
            if (state is None and not states) or (state is not None and state in states):
                return time.monotonic() - started
            assert time.monotonic() - started < timeout, (
                f"{name} of {gang} is {states or 'inactive'} after {timeout:g} s"
            )
            time.sleep(5)

    def prometheus_pid(self) -> str:
        return self.fleet.ssh(self.fleet.gateway, "systemctl show -p MainPID --value prometheus").stdout.strip()


@dataclass
class Replacement:
    """What replace_nodes did: the program after it, the commands that ran again (and
    how), the new hosts by instance name, and when each phase ended."""

    run: ProgramRun
    changed: set[str]
    outcomes: dict[str, Outcome]
    hosts: dict[str, Host]
    booted_at: float
    replayed_at: float
    deleted_at: float


def replace_nodes(cluster: ClusterUnderTest, instances: dict[str, Host], **overrides: Any) -> Replacement:
    """Replace the named instances (resource name -> the host running it now) as `pulumi
    up` does after a launch-template change: the new instances are created first, each a
    new host at a new IP started with the user data the program gives it; then every
    command whose inputs changed runs again, in dependency order, as the engine updates
    the dependents; the old instances are deleted last (powered off, as terminated).
    `overrides`: the stack config the cluster runs now (beyond `fleet_config`'s)."""
    fleet = cluster.fleet
    nodes = int(cluster.config["nodes"])
    first_new = len(fleet.nodes)
    moved = {name: fleet.network.node_ip(first_new + offset) for offset, name in enumerate(instances)}
    updated = fleet_program(nodes, cluster.key_store, moved=moved, network=fleet.network, **overrides)
    scripts, keys = user_data_of(updated), host_keys_of(updated)
    hosts = {name: fleet.add_node(scripts[name], keys[name]) for name in instances}
    assert [host.ip for host in hosts.values()] == list(moved.values())
    booted_at = time.monotonic()
    old = {c.name: c.inputs for c in cluster.run.of_type(COMMAND)}
    changed = {c.name for c in updated.of_type(COMMAND) if old.get(c.name) != c.inputs}
    outcomes = replay(updated, only=changed)
    replayed_at = time.monotonic()
    for host in instances.values():
        fleet.power_off(host)
    cluster.run = updated
    return Replacement(updated, changed, outcomes, hosts, booted_at, replayed_at, time.monotonic())


def efa_devices(config: dict[str, Any]) -> int:
    """What the fi_info double reports: the interfaces the program gives the type."""
    return efa_interface_count(CATALOG[config["instanceType"]], config.get("efa") == "true")


_images: Future | None = None
_images_lock = threading.Lock()


def _build_images() -> None:
    # The hosts' image beside the engine's wheelhouse and the model (built with a virtualenv
    # installed from that wheelhouse): on a new machine each takes minutes. Then the node
    # hosts' image, which installs from both.
    with ThreadPoolExecutor(2) as pool:
        image = pool.submit(base_rootfs)
        tiny_model()
        rootfs, mirror = image.result()
    if baked_hosts_by_default():
        host_image(rootfs, mirror)


def images_in_background() -> Future:
    """The hosts' image and package mirror, and the engine's virtualenv and model (each
    cached on disk), built in a background thread started by the first caller; the
    result is None, or the build's error. The test run starts it once it knows the
    fleet's tests will run (tests/conftest.py), so a cold build overlaps the other tests."""
    global _images
    with _images_lock:
        if _images is None:
            _images = Future()

            def build(future: Future = _images) -> None:
                try:
                    _build_images()
                except BaseException as error:  # handed to whoever waits for the images
                    future.set_exception(error)
                else:
                    future.set_result(None)

            threading.Thread(target=build, name="fleet-images", daemon=True).start()
        return _images


def wait_for_images() -> None:
    """If a build of the images was started, wait until it ends, so no build (debootstrap,
    uv) is left running when the run ends early; its error, if any, is the fleet's tests' to report."""
    with _images_lock:
        started = _images
    if started is not None:
        wait([started])


@contextmanager
def serving_cluster(workdir: Path, nodes: int = 3, **overrides: Any) -> Iterator[ClusterUnderTest]:
    """start_cluster, and everything it made removed on exit, also when a test fails."""
    cluster = start_cluster(workdir, nodes, **overrides)
    try:
        yield cluster
    finally:
        stop_cluster(cluster.fleet, cluster.hub)


def start_cluster(
    workdir: Path,
    nodes: int = 3,
    own_hosts: bool = False,
    network: Network = MAIN_NETWORK,
    baked_hosts: bool | None = None,
    **overrides: Any,
) -> ClusterUnderTest:
    """Start the fleet's hosts and replay the program's commands at once, while the hosts
    still boot, as `pulumi up` does; returns once `pulumi up` would have finished (the
    readiness command passed). The hosts stand in for the EC2 instances of fleet_config's
    stack, started with the program's user data (cloud-init's final stage runs it at
    boot), or with `own_hosts` for the machines of own_hosts_config's stack of hosts, which
    exist before the stack and get nothing at boot; on `network` (another fleet may run
    on another at the same time); the node hosts from the host image unless `baked_hosts`
    is False (Fleet). A host whose boot failed twice
    (localhosts/boot_check.py) raises HostBootError, the machinery's fault. On failure,
    removes what it made."""
    key_store: dict = {}
    replicas = fleet_gangs(overrides)
    if own_hosts:
        stack = _own_hosts_stack(nodes, replicas, network, key_store, overrides)
    else:
        stack = _ec2_stack(nodes, replicas, network, key_store, overrides)
    instance = CATALOG[stack.config["instanceType"]]
    images_in_background().result()  # before the hosts start: a cold build is not boot time
    fleet = Fleet(
        workdir,
        nodes * replicas,
        stack.public_key,
        stack.run.outputs["sshPrivateKey"],
        efa_devices=efa_devices(stack.config),
        gpus_per_node=instance.gpus,
        gpu_name=instance.gpu_model,
        user_data=stack.user_data,
        host_keys=stack.host_keys,
        # EC2 reports an instance running while it boots, and `pulumi up` goes on; the
        # machines of a stack of hosts run before the stack does.
        wait_for_ssh=own_hosts,
        model_cache_dir=LOCAL_MODEL_CACHE_DIR if own_hosts else None,
        network=network,
        baked_hosts=baked_hosts,
    )
    hub = FakeHub(workdir, network)
    try:
        fleet.__enter__()
        hub.__enter__()
        return _replayed(stack, fleet, hub, key_store, own_hosts)
    except BaseException:
        stop_cluster(fleet, hub)
        raise


@dataclass
class _StackOnHosts:
    """The program's run for the fleet's stack, its config, and what the hosts start
    with: the key that logs in, each host's user data and host key (by host name)."""

    run: ProgramRun
    config: dict[str, Any]
    public_key: str
    user_data: dict[str, str]
    host_keys: dict[str, str]


def _own_hosts_stack(
    nodes: int, replicas: int, network: Network, key_store: dict, overrides: dict[str, Any]
) -> _StackOnHosts:
    """A stack of hosts (own_hosts_config) on the fleet's machines, which get nothing at boot."""
    # The user's own key, which the machines authorize before any stack exists, and
    # the machines' own host keys, which the user gives the stack (hostKeys).
    key = real_private_key("ED25519")
    addresses = {"gateway": network.gateway_ip, **{f"node{i}": network.node_ip(i) for i in range(nodes * replicas)}}
    machines = machine_host_keys(list(addresses))
    config = own_hosts_config(
        nodes,
        key["privateKeyOpenssh"],
        network=network,
        host_keys={addresses[name]: machines[name]["publicKeyOpenssh"] for name in addresses},
        **overrides,
    )
    run = own_hosts_program(config, key_store)
    public_key, user_data = key["publicKeyOpenssh"], {}
    host_keys = {name: machine["privateKeyOpenssh"] for name, machine in machines.items()}
    return _StackOnHosts(run, config, public_key, user_data, host_keys)


def _ec2_stack(
    nodes: int, replicas: int, network: Network, key_store: dict, overrides: dict[str, Any]
) -> _StackOnHosts:
    """The EC2 stack (fleet_config), its instances on the fleet's hosts, each started
    with the user data and host key the program gives its instance."""
    run = fleet_program(nodes, key_store, network=network, **overrides)
    config = fleet_config(nodes, network, **overrides)
    public_key = next(r for r in run.of_type("aws:ec2/keyPair:KeyPair")).inputs["publicKey"]
    host_names = {"vllm-gateway-host": "gateway", **node_hosts(nodes, replicas)}
    user_data = {host_names[instance]: script for instance, script in user_data_of(run).items()}
    # What cloud-init's ssh module installs from each instance's user data.
    host_keys = {host_names[instance]: private for instance, private in host_keys_of(run).items()}
    return _StackOnHosts(run, config, public_key, user_data, host_keys)


def _replayed(stack: _StackOnHosts, fleet: Fleet, hub: FakeHub, key_store: dict, own_hosts: bool) -> ClusterUnderTest:
    """The program's commands replayed on the started hosts, as `pulumi up` runs them;
    a host whose boot failed is named as the cause of any failure."""
    cluster = ClusterUnderTest(
        stack.run,
        fleet,
        hub,
        key_store,
        config=stack.config,
        booted_at=time.monotonic(),
        started_wall=time.time(),
        own_hosts=own_hosts,
    )
    try:
        cluster.outcomes = replay(stack.run)
    except ReplayError as failure:
        # A host that could not boot explains the failed command: the machinery's fault, named first.
        fleet.raise_boot_failures(cause=failure)
        raise
    # A host that could not boot is broken machinery, even where the commands got through.
    fleet.raise_boot_failures()
    cluster.ready_at = time.monotonic()
    return cluster


def stop_cluster(fleet: Fleet, hub: "FakeHub") -> None:
    hub.__exit__(None, None, None)
    fleet.__exit__(None, None, None)
