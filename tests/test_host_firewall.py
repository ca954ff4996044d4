"""The nodes' host firewall (issue 33 point 5): Ray binds most of its listeners on every
address whatever --node-ip-address says, and a stack of hosts has no security group, so
each node gets an nftables table of the stack's own that lets its gang and the gateway
reach Ray's and vLLM's ports and refuses everyone else there. Checked on what the host
really receives (the setup command's file, the units' arguments as systemd expands
them from node.env), read by a small evaluator of the rules' few forms; a rule it cannot
read fails the test. The kernel's side is the fleet's (tests/test_fleet.py)."""

from __future__ import annotations

import ipaddress
import re
import subprocess
from pathlib import Path

import pytest

from components import bootstrap, ports
from tests.test_bootstrap import boot, parse_env, spec_of
from tests.test_host_ports import (
    LIBRARY,
    NODE_SCRIPT,
    exec_start,
    expand_like_systemd,
    moved,  # noqa: F401  (a fixture: every port of ports.py moved)
    written_node_env,
)

ROOT = Path(__file__).resolve().parent.parent
REMOVER = ROOT / "scripts" / "lib" / "vllm-cluster-remove"

GANG = ("10.42.128.10", "10.42.128.11")
GATEWAY = "10.42.0.10"
# Another gang's host, the gateway's public address, a neighbour on the hosts' network.
STRANGERS = ("10.42.128.20", "203.0.113.10", "10.42.128.99")


def firewall_sent(script: str) -> str:
    """The firewall file as the setup command writes it on the node."""
    start = f"{bootstrap.FIREWALL_FILE} <<'VLLM_CLUSTER_FILE_END'\n"
    assert script.count(start) == 1, "the setup command does not write the firewall exactly once"
    return script.split(start, 1)[1].split("VLLM_CLUSTER_FILE_END", 1)[0]


def port_set(text: str) -> set[int]:
    found = set()
    for item in text.split(","):
        first, _, last = item.strip().partition("-")
        found |= set(range(int(first), int(last or first) + 1))
    return found


# The one form of a port rule the stack renders: ports, maybe a source set, a verdict.
RULE = r"tcp dport \{ ([\d, -]+) \}( ip saddr @(\w+))? (accept|counter reject with tcp reset)"


class Firewall:
    """The rules of one rendered table, as nft reads them in order."""

    def __init__(self, text: str):
        self.text = text
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
        self.sets = {
            name: {ipaddress.ip_address(a.strip()) for a in elements.split(",")}
            for name, elements in re.findall(r"set (\w+) \{\s*type ipv4_addr\s*elements = \{ ([^}]*) \}", text)
        }
        chain = text.split("chain input {", 1)[1].split("}\n}", 1)[0]
        rules = [line.strip() for line in chain.splitlines() if line.strip() and not line.strip().startswith("#")]
        assert rules[0] == "type filter hook input priority filter; policy accept;", rules[0]
        self.rules = rules[1:]
        self.preamble = lines[:2]

    def verdict(self, source: str, port: int, loopback: bool = False, established: bool = False) -> str:
        """What the input chain does with a TCP packet from `source` to `port`: "accept",
        "reject", or "policy" (not decided here: the host's other rules do)."""
        address = ipaddress.ip_address(source)
        for rule in self.rules:
            if rule == 'iif "lo" accept':
                if loopback:
                    return "accept"
                continue
            if rule == "ct state established,related accept":
                if established:
                    return "accept"
                continue
            match = re.fullmatch(RULE, rule)
            assert match, f"a rule this test cannot read: {rule}"
            if port not in port_set(match.group(1)):
                continue
            if match.group(3) is not None and address not in self.sets[match.group(3)]:
                continue
            return "accept" if match.group(4) == "accept" else "reject"
        return "policy"


def firewall_of(**overrides) -> Firewall:
    addresses = {"gang_ips": GANG, "gateway_ip": GATEWAY, **overrides}
    return Firewall(firewall_sent(bootstrap.node_setup_script(boot(1, **addresses))))


def told_to_listen(tmp_path: Path) -> dict[str, set[int]]:
    """Every port Ray and vLLM are told to listen on, by what tells them: the units'
    ExecStart lines as systemd expands them from the node.env setup writes (head and
    worker), and vLLM's --port in vllm.env. Independent of host_firewall's own list."""
    told: dict[str, set[int]] = {}
    for index, unit in ((0, "ray-head.service"), (1, "ray-worker.service")):
        words = expand_like_systemd(exec_start(unit), written_node_env(tmp_path, index))
        for word in words:
            if match := re.fullmatch(r"--((?:[a-z-]+-)?port)=(\d+)", word):
                told.setdefault(f"--{match.group(1)}", set()).add(int(match.group(2)))
            elif match := re.fullmatch(r"(DASHBOARD_METRIC_PORT|AUTOSCALER_METRIC_PORT)=(\d+)", word):
                told.setdefault(match.group(1), set()).add(int(match.group(2)))
    low, high = told.pop("--min-worker-port"), told.pop("--max-worker-port")
    assert len(low) == len(high) == 1, (low, high)
    told["workers"] = set(range(low.pop(), high.pop() + 1))
    serve = parse_env(bootstrap.vllm_env(spec_of(), GANG[0], list(GANG)))["SERVE_ARGS"].split()
    told["vllm --port"] = {int(serve[serve.index("--port") + 1])}
    return told


@pytest.mark.usefixtures("moved")
def test_the_gang_reaches_every_port_ray_and_vllm_listen_on_and_no_one_else_does(tmp_path):
    """With every port of ports.py moved: each one Ray or vLLM is told to listen on is
    open to every host of the gang and refused to another gang's host, the gateway's
    public address and a neighbour; every port of Ray's workers' range too."""
    firewall = firewall_of()
    told = told_to_listen(tmp_path)
    # Every listener ray start takes a flag for, and the two the head's take from the environment.
    assert set(told) == {
        "--port",
        "--dashboard-port",
        "--metrics-export-port",
        "--ray-client-server-port",
        "--node-manager-port",
        "--object-manager-port",
        "--runtime-env-agent-port",
        "--dashboard-agent-grpc-port",
        "--dashboard-agent-listen-port",
        "DASHBOARD_METRIC_PORT",
        "AUTOSCALER_METRIC_PORT",
        "workers",
        "vllm --port",
    }, sorted(told)
    assert 18076 in told["--node-manager-port"] and told["workers"] == set(range(20002, 21000))
    for what, listened in told.items():
        for port in listened:
            for host in GANG:
                assert firewall.verdict(host, port) == "accept", (what, port, host)
            for stranger in STRANGERS:
                assert firewall.verdict(stranger, port) == "reject", (what, port, stranger)


@pytest.mark.usefixtures("moved")
def test_the_gateway_reaches_only_vllm_ray_metrics_and_the_dashboard(tmp_path):
    firewall = firewall_of()
    opened = {port for port in (18000, 18080, 18265) if firewall.verdict(GATEWAY, port) == "accept"}
    assert opened == {18000, 18080, 18265}  # vLLM (the pool, Prometheus), Ray's metrics, the dashboard
    every = set().union(*told_to_listen(tmp_path).values())
    assert {port for port in every if firewall.verdict(GATEWAY, port) == "accept"} == opened


def test_the_node_itself_and_replies_to_its_own_connections_get_through():
    """Its checks reach vLLM and Ray at its own address (over loopback); a reply to a
    connection the node opened comes back whatever its port."""
    firewall = firewall_of()
    assert firewall.verdict(GANG[0], ports.VLLM_API, loopback=True) == "accept"
    assert firewall.verdict("127.0.0.1", ports.RAY_GCS, loopback=True) == "accept"
    assert firewall.verdict(STRANGERS[2], ports.RAY_MIN_WORKER, established=True) == "accept"
    # IPv6 from outside is refused too (the sets hold the gang's IPv4 addresses only).
    assert firewall.verdict("2001:db8::7", ports.RAY_METRICS) == "reject"


def test_every_other_port_and_packet_is_left_to_the_hosts_own_rules():
    """SSH, and ports the stack does not listen on (a user's own service on 9100, the
    port after Ray's workers' range), are not decided here: the chain's policy accepts
    and the host's other tables decide. Loading it again replaces the table whole."""
    firewall = firewall_of()
    for port in (ports.SSH, 9100, ports.RAY_MAX_WORKER + 1, ports.RAY_MIN_WORKER - 2):
        assert firewall.verdict(STRANGERS[0], port) == "policy", port
    assert firewall.preamble == [f"table {bootstrap.FIREWALL_TABLE}", f"delete table {bootstrap.FIREWALL_TABLE}"]
    assert firewall.text.count(f"\ntable {bootstrap.FIREWALL_TABLE} {{\n") == 1
    assert "flush ruleset" not in firewall.text and "policy drop" not in firewall.text


def test_the_firewall_admits_exactly_the_gang_and_the_gateway_it_is_given():
    firewall = firewall_of(gang_ips=("192.0.2.21", "192.0.2.22"), gateway_ip="192.0.2.10")
    assert firewall.sets == {
        "gang": {ipaddress.ip_address("192.0.2.21"), ipaddress.ip_address("192.0.2.22")},
        "gateway": {ipaddress.ip_address("192.0.2.10")},
    }


@pytest.mark.parametrize(
    "gang, gateway, words",
    [
        ((), GATEWAY, "the gang's private IPs: none given"),
        (("10.42.128.10", "gpu-box"), GATEWAY, "not 'gpu-box'"),
        (GANG, "", "the gateway's private IP: none given"),
        (GANG, "10.42.0.10; flush ruleset", "not '10.42.0.10; flush ruleset'"),
    ],
)
def test_a_setup_without_the_addresses_it_must_admit_is_refused(gang, gateway, words):
    """No setup command goes out with a firewall that admits no one, or with an address nft
    would read as more rules."""
    with pytest.raises(ValueError, match=re.escape(words)):
        bootstrap.node_setup_script(boot(1, gang_ips=gang, gateway_ip=gateway))


def test_the_user_data_carries_no_firewall():
    """The user data runs before the stack knows the gang and the gateway on EC2: the
    setup command brings the firewall, and Ray's unit (enabled by setup) loads it."""
    assert bootstrap.FIREWALL_FILE not in bootstrap.node_user_data(boot(1, gang_ips=(), gateway_ip=""))


# --- on the node: the node script loads it, the remover takes it away --------------------


def firewall_functions() -> str:
    text = NODE_SCRIPT.read_text()
    block = text[text.index("ensure_nft() {") :]
    return block[: block.index("\n# The GPUs' and EFA's device files")]


def run_load_firewall(tmp_path: Path, file_text: str | None, nft_status: int = 0) -> subprocess.CompletedProcess:
    """load_firewall as the node script defines it, with a stand-in nft that logs its
    arguments and exits `nft_status`, and the firewall file `file_text` (None: absent)."""
    nft = tmp_path / "nft"
    nft.write_text(f'#!/bin/bash\necho "nft $*" >>{tmp_path}/calls\nexit {nft_status}\n')
    nft.chmod(0o755)
    firewall = tmp_path / "firewall.nft"
    if file_text is not None:
        firewall.write_text(file_text)
    script = f"""set -euo pipefail
. {LIBRARY}
NFT={nft} FIREWALL_FILE={firewall}
{firewall_functions()}
load_firewall
"""
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True)


def test_the_node_loads_the_file_the_stack_wrote_with_nft(tmp_path):
    result = run_load_firewall(tmp_path, firewall_of().text)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "calls").read_text() == f"nft -f {tmp_path}/firewall.nft\n"


@pytest.mark.parametrize(
    "file_text, nft_status, words",
    [
        (None, 0, "no host firewall at"),
        ("", 0, "no host firewall at"),
        ("table inet vllm_cluster {", 1, "nft could not load the host firewall"),
    ],
    ids=["absent", "empty", "nft-refuses"],
)
def test_without_a_loaded_firewall_the_node_script_stops(tmp_path, file_text, nft_status, words):
    """guard-service runs this before every start of Ray's unit: Ray does not start on a
    node whose firewall is not in place."""
    result = run_load_firewall(tmp_path, file_text, nft_status)
    assert result.returncode != 0 and words in result.stderr, result.stderr
    if file_text is None or file_text == "":
        assert not (tmp_path / "calls").exists()  # nft never ran


def test_setup_and_every_start_of_rays_unit_load_it():
    text = NODE_SCRIPT.read_text()
    for command in ("cmd_setup", "cmd_guard_service"):
        body = text[text.index(f"{command}() {{") :]
        body = body[: body.index("\n}\n")]
        assert "\n  load_firewall\n" in body, command
    # nftables installed by setup's install step (which a baked image ran already).
    assert "install_node_software" in text[text.index("cmd_setup() {") :].split("\n}\n", 1)[0]
    assert "ensure_nft" in text[text.index("install_node_software() {") :].split("\n}\n", 1)[0]
    for unit in ("ray-head.service", "ray-worker.service"):
        assert (
            "ExecStartPre=+/opt/vllm-cluster/bin/vllm-cluster-node guard-service\n"
            in (NODE_SCRIPT.parent / "units" / unit).read_text()
        )


def test_the_node_script_and_the_remover_name_the_stacks_file_and_table():
    assert f'readonly FIREWALL_FILE="$CONFIG_DIR/{Path(bootstrap.FIREWALL_FILE).name}"\n' in NODE_SCRIPT.read_text()
    assert bootstrap.FIREWALL_FILE.startswith(bootstrap.CONFIG_DIR + "/")
    remover = REMOVER.read_text()
    assert f"FIREWALL_TABLE=({bootstrap.FIREWALL_TABLE})\n" in remover
    assert 'nft delete table "${FIREWALL_TABLE[@]}"' in remover
    # Only the stack's own table: nothing that would touch the host's other rules.
    assert "flush ruleset" not in remover and "nft flush" not in remover


def test_the_fabric_gates_rendezvous_admits_the_gang_alone():
    """The fabric gate's TCP store on the head (ports.FABRIC_RENDEZVOUS) has no login: any
    host that reached it could join the gang's all-reduce or feed its rendezvous keys."""
    firewall = firewall_of()
    for host in GANG:
        assert firewall.verdict(host, ports.FABRIC_RENDEZVOUS) == "accept"
    for stranger in (*STRANGERS, GATEWAY):
        assert firewall.verdict(stranger, ports.FABRIC_RENDEZVOUS) == "reject", stranger
