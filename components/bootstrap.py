"""What the nodes and the gateway are given to run: user data, env files, the
`vllm serve` argument list, the nodes' host firewall and the gateway's API keys. The
gateway's nginx site is components/gateway_nginx.py; where all of it lands on the
hosts, components/host_paths.py.

Pure Python, no Pulumi: every function takes plain values and returns text or
lists, so all of it is unit-tested, and the planner shows exactly the arguments
the head will run. The scripts themselves are real files under scripts/node and
scripts/gateway; the user data only carries them to the host and runs them.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import ipaddress
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from components import api_routes, image, ports, sizing, stage_volume, versions
from components.gateway_nginx import API_KEY_VARIABLE, HEADS_AUTHORIZATION_VARIABLE, VLLM_HTTP_KEEP_ALIVE_SECONDS
from components.host_paths import (
    BIN_DIR,
    CLUSTER_ENV,
    CONFIG_DIR,
    FIRST_BOOT_COMMAND,
    GATEWAY_COMMAND,
    INSTALL_DIR,
    LIBRARY_PATH,
    MODEL_ROOT,
    NODE_COMMAND,
    NODE_LOCK_PATH,
    PYTHON_LIBRARY_PATH,
    REMOVE_COMMAND,
)
from components.spec import MAX_API_KEY_LENGTH, ClusterSpec
from components.topology import node_name, node_role, writes_wheelhouse
from scripts.lib import engine_cache

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPTS = ROOT / "scripts" / "node"
GATEWAY_SCRIPTS = ROOT / "scripts" / "gateway"
SCRIPT_LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
PYTHON_LIBRARY = ROOT / "scripts" / "lib" / "vllm_cluster_lib.py"
# The node's Python modules beside it: which files a pipeline stage needs and their copy
# (model-stage), and vLLM's compile cache kept on the shared cache (engine-cache).
NODE_PYTHON_MODULES = (ROOT / "scripts" / "lib" / "model_stage.py", ROOT / "scripts" / "lib" / "engine_cache.py")

REMOVE_SCRIPT = ROOT / "scripts" / "lib" / "vllm-cluster-remove"
# All the gateway's login probe may do on a node: print this word (see
# `vllm-cluster-gateway wait-login` and `vllm-cluster-node setup`).
LOGIN_READY_WORD = "vllm-cluster-login-ready"
# Who runs Ray and vLLM on a node (their units' User=, scripts/node/units): a system user
# without a login, so an engine that runs code it was tricked into loading (a model's,
# a compiled graph's) gets neither root nor, kept from the metadata service, the node
# role's credentials (issue 33 point 3). The stack's own tooling stays root.
SERVICE_USER = "vllm-cluster"

# EC2 refuses user data above 16 KiB "in raw form, before it is base64-encoded"
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html):
# for gzipped user data, the gzip bytes.
USER_DATA_LIMIT_BYTES = 16 * 1024


_HEREDOC_END = "VLLM_CLUSTER_FILE_END"
NODE_UNITS = (
    "ray-head.service",
    "ray-worker.service",
    "vllm.service",
    "vllm-watchdog.service",
    "vllm-watchdog.timer",
    "vllm-prepare.service",
    "vllm-idle-check.service",
    "vllm-idle-check.timer",
)


@dataclass(frozen=True)
class NodeBoot:
    """What one node's user data needs to know, all of it plain text (no secret)."""

    index: int
    head_ip: str  # "" for the head itself: it learns its own IP at boot
    subnet_cidr: str
    gpus: int
    efa: bool
    file_system_id: str
    access_point_id: str
    file_system_dns: str
    ray_version: str
    vllm_version: str
    # The gateway's login probe (OpenSSH public key): authorized to print one word.
    login_probe_key: str
    # The nodes' Python environment: the text of the stack's lock (spec nodeLock,
    # components/node_env.py). Sent with the setup command, not in the user data.
    node_lock: str
    # The gang (replica) the node serves in: it names the node (topology.node_name).
    gang: int = 0
    # The wheelhouse's access point (read-only for every node but its writer).
    wheelhouse_access_point_id: str = ""
    # Prometheus on the gateway, where the head's Ray dashboard reads it
    # (RAY_PROMETHEUS_HOST, metrics.ray_prometheus_host). Empty in the user data: the
    # gateway's address reaches the head with its setup command, before Ray starts.
    prometheus_url: str = ""
    # The user the stack logs in as (the image's, or sshUser on hosts the user has).
    login_user: str = image.DEFAULT_USER
    # hosts: the shared directory bound as the model cache (modelCacheDir); "" mounts EFS.
    shared_model_dir: str = ""
    # The instance type has an instance store (catalog.InstanceType.instance_store_gb): its
    # stage is copied onto the store's mount (image.NVME_MOUNT) or not at all.
    instance_store: bool = False
    # Who the node's host firewall admits on Ray's and vLLM's ports (host_firewall): its
    # gang's private IPs, head first, and the gateway's private IP. Empty in the user data:
    # they reach the node with its setup command, which writes the firewall.
    gang_ips: tuple[str, ...] = ()
    gateway_ip: str = ""


def _python_requirement(boot: NodeBoot) -> dict[str, str]:
    """PYTHON_MIN / PYTHON_BELOW: the Pythons the pinned vLLM and Ray accept (empty
    when a release is not recorded in versions.REQUIRES_PYTHON)."""
    bounds = versions.python_bounds(("vllm", boot.vllm_version), ("ray", boot.ray_version))
    if bounds is None:
        return {"PYTHON_MIN": "", "PYTHON_BELOW": ""}
    lowest, below = bounds
    return {
        "PYTHON_MIN": ".".join(map(str, lowest)),
        "PYTHON_BELOW": ".".join(map(str, below)) if below is not None else "",
    }


def port_env() -> dict[str, str]:
    """The ports of components/ports.py that the hosts use, by the names cluster.env
    carries them under; the node's setup copies them into node.env, which the units
    (EnvironmentFile=, ${PORT_...}) and the scripts read. No host file writes a port.
    PORT_<name in ports.py>, not VLLM_PORT or RAY_...: vLLM and Ray read variables of
    their own by such names (vLLM's VLLM_PORT is its internal port base, not the API's),
    and vllm.service and Ray's units load node.env into their environment."""
    return {
        # vllm-cluster-node: the head's own probes of vLLM (start-vllm, watchdog, status-facts).
        "PORT_VLLM_API": str(ports.VLLM_API),
        # ray-head.service (--port), ray-worker.service (--address), wait-gcs, ray-cluster-check,
        # preflight-check.
        "PORT_RAY_GCS": str(ports.RAY_GCS),
        # ray-head.service (--dashboard-port), preflight-check (the head's clock).
        "PORT_RAY_DASHBOARD": str(ports.RAY_DASHBOARD),
        # ray-head.service (--ray-client-server-port).
        "PORT_RAY_CLIENT": str(ports.RAY_CLIENT),
        # ray-head.service and ray-worker.service (--metrics-export-port): the gateway scrapes it.
        "PORT_RAY_METRICS": str(ports.RAY_METRICS),
        # ray-head.service and ray-worker.service: Ray's listeners that would otherwise take
        # random ports (--node-manager-port, --object-manager-port, --runtime-env-agent-port,
        # --dashboard-agent-grpc-port, --dashboard-agent-listen-port) and its workers' range.
        "PORT_RAY_NODE_MANAGER": str(ports.RAY_NODE_MANAGER),
        "PORT_RAY_OBJECT_MANAGER": str(ports.RAY_OBJECT_MANAGER),
        "PORT_RAY_RUNTIME_ENV_AGENT": str(ports.RAY_RUNTIME_ENV_AGENT),
        "PORT_RAY_DASHBOARD_AGENT_GRPC": str(ports.RAY_DASHBOARD_AGENT_GRPC),
        "PORT_RAY_DASHBOARD_AGENT_HTTP": str(ports.RAY_DASHBOARD_AGENT_HTTP),
        "PORT_RAY_MIN_WORKER": str(ports.RAY_MIN_WORKER),
        "PORT_RAY_MAX_WORKER": str(ports.RAY_MAX_WORKER),
        # ray-head.service, as Ray's DASHBOARD_METRIC_PORT and AUTOSCALER_METRIC_PORT.
        "PORT_RAY_DASHBOARD_METRICS": str(ports.RAY_DASHBOARD_METRICS),
        "PORT_RAY_AUTOSCALER_METRICS": str(ports.RAY_AUTOSCALER_METRICS),
        # vllm-cluster-node fabric-measure: the gang's all-reduce meets at the head here.
        "PORT_FABRIC_RENDEZVOUS": str(ports.FABRIC_RENDEZVOUS),
        # vllm-cluster-node readiness: the stack's probe through the gateway, as clients send it.
        "PORT_API_HTTPS": str(ports.API_HTTPS),
    }


def cluster_env(boot: NodeBoot) -> str:
    """/etc/vllm-cluster/cluster.env: what the stack decided for one node."""
    values = {
        "NODE_INDEX": str(boot.index),
        "NODE_NAME": node_name(boot.index, boot.gang),
        "NODE_ROLE": node_role(boot.index),
        "HEAD_IP": boot.head_ip,
        "NODE_SUBNET_CIDR": boot.subnet_cidr,
        "GPUS_PER_NODE": str(boot.gpus),
        "EFA_ENABLED": "true" if boot.efa else "false",
        "MODEL_CACHE_FILE_SYSTEM_ID": boot.file_system_id,
        "MODEL_CACHE_ACCESS_POINT_ID": boot.access_point_id,
        "WHEELHOUSE_ACCESS_POINT_ID": boot.wheelhouse_access_point_id,
        # The one node that fills the wheelhouse and may write it (topology.writes_wheelhouse).
        "WHEELHOUSE_WRITER": "true" if writes_wheelhouse(boot.index, boot.gang) else "false",
        "WHEELHOUSE_WRITER_NODE": node_name(0, 0),
        "MODEL_CACHE_DNS": boot.file_system_dns,
        "RAY_VERSION": boot.ray_version,
        "VLLM_VERSION": boot.vllm_version,
        "EFS_UTILS_VERSION": versions.EFS_UTILS_VERSION,
        # Facts of the node image (components/image.py).
        "IMAGE_PYTHON": image.PYTHON,
        **_python_requirement(boot),
        "FI_INFO": image.FI_INFO,
        "EFA_LIB_DIR": image.EFA_LIB_DIR,
        "OFI_NCCL_LIB_DIRS": " ".join(image.OFI_NCCL_LIB_DIRS),
        "OFI_NCCL_PLUGIN_FILE": image.OFI_NCCL_PLUGIN,
        "NVIDIA_SMI": image.NVIDIA_SMI,
        "NVME_MOUNT": image.NVME_MOUNT,
        "INSTANCE_STORE": "true" if boot.instance_store else "false",
        **_stage_volume_env(),
        # Empty on your own hosts (hosts, which have MODEL_CACHE_SHARED_DIR): they get no
        # stage volume from the stack, even on an EC2 machine whose metadata would answer.
        "INSTANCE_METADATA_URL": "" if boot.shared_model_dir else image.INSTANCE_METADATA_URL,
        # Where each node's stage is (local_model_directory), whichever disk holds it.
        "LOCAL_MODEL_ROOT": LOCAL_MODEL_ROOT,
        "SERVICE_USER": SERVICE_USER,
        "SERVICE_DEVICES": " ".join(image.SERVICE_DEVICES),
        "INSTANCE_METADATA_ADDRESSES": " ".join(image.INSTANCE_METADATA_ADDRESSES),
        "IPTABLES": image.IPTABLES,
        "NFT": image.NFT,
        "LOGIN_USER": boot.login_user,
        # hosts (components/own_hosts.py): the shared directory bound where EFS would be.
        "MODEL_CACHE_SHARED_DIR": boot.shared_model_dir,
        "LOGIN_PROBE_KEY": boot.login_probe_key.strip(),
        "LOGIN_READY_WORD": LOGIN_READY_WORD,
        # Read by the dashboard in ray-head.service (node.env): its health check of
        # Prometheus and the pages that query it (ray/dashboard/modules/metrics/metrics_head.py).
        "RAY_PROMETHEUS_HOST": boot.prometheus_url if boot.index == 0 else "",
        **port_env(),
    }
    return env_file(values, header="Written by the user data of vllm-cluster. Read by vllm-cluster-node.")


def _stage_volume_env() -> dict[str, str]:
    """The stage volume's facts (components/stage_volume.py), the same for every node
    whatever stageVolume chose: cluster.env is in the user data and the setup command,
    and the node decides from what it was launched with (vllm-cluster-node
    stage_volume_launched), so a change of the choice reaches no running node."""
    return {
        "STAGE_VOLUME_MOUNT": stage_volume.STAGE_VOLUME_MOUNT,
        "STAGE_VOLUME_LABEL": stage_volume.STAGE_VOLUME_LABEL,
        "STAGE_VOLUME_DEVICE_NAME": stage_volume.STAGE_VOLUME_DEVICE_NAME,
        "STAGE_VOLUME_BY_ID_PREFIX": stage_volume.STAGE_VOLUME_BY_ID_PREFIX,
        "STAGE_VOLUME_IMDS_MAPPINGS": stage_volume.IMDS_BLOCK_DEVICE_MAPPING,
        "IMDS_TOKEN_PATH": stage_volume.IMDS_TOKEN_PATH,
    }


_ENV_VALUE = re.compile(r"^[A-Za-z0-9._:/=,@+%-]*$")


def env_file(values: dict[str, str], header: str) -> str:
    """KEY=value lines that bash (`. file`) and systemd (EnvironmentFile=) read the
    same way. Values are refused unless they are plain words or space-separated
    plain words, so neither reader can be made to run anything."""
    lines = [f"# {header}"]
    for key, value in values.items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", key):
            raise ValueError(f"env key {key!r} is not an upper-case name")
        words = value.split(" ")
        if not all(_ENV_VALUE.match(word) for word in words):
            raise ValueError(f"env value of {key} holds characters a shell would interpret: {value!r}")
        lines.append(f'{key}="{value}"' if " " in value else f"{key}={value}")
    return "\n".join(lines) + "\n"


def _file(path: str, content: str, mode: str) -> str:
    """A heredoc that writes `content` to `path` exactly (quoted delimiter: no expansion).
    `install` replaces the file with a new one instead of rewriting it in place, so a
    copy of the script that is running at that moment (cloud-init's) reads on undisturbed."""
    if _HEREDOC_END in content:
        raise ValueError(f"{path} contains the heredoc delimiter")
    if not content.endswith("\n"):
        content += "\n"
    return f"install -D -m {mode} /dev/stdin {path} <<'{_HEREDOC_END}'\n{content}{_HEREDOC_END}\n"


def _read(path: Path) -> str:
    return path.read_text()


def _script(purpose: str, files: list[str], then: str) -> str:
    """A root script that writes `files` (each from _file) and then runs `then`."""
    return "".join(
        [
            "#!/bin/bash\n",
            f"# vllm-cluster {purpose}, generated by components/bootstrap.py.\n",
            "# Safe to run again: every step skips what is already in place.\n",
            "set -euo pipefail\numask 022\n",
            f"install -d -m 0700 {CONFIG_DIR}\n",
            *files,
            f"exec {then}\n",
        ]
    )


def _node_file(name: str, mode: str = "0755") -> str:
    return _file(f"{BIN_DIR}/{name}", _read(NODE_SCRIPTS / name), mode)


def lock_sha256(lock_text: str) -> str:
    return hashlib.sha256(lock_text.encode()).hexdigest()


def lock_digest(lock_text: str) -> str:
    """A short name of a node lock's content (the node script logs the same: the first
    12 hex digits of its sha256)."""
    return lock_sha256(lock_text)[:12]


def _remover() -> str:
    return _file(REMOVE_COMMAND, _read(REMOVE_SCRIPT), "0755")


def own_host_node_script(boot: NodeBoot) -> str:
    """What a GPU host the user already has runs first (the host command, `sudo bash -s`
    with this on stdin): the node's user data, as cloud-init would run it on EC2, and the
    script its delete runs (vllm-cluster-remove)."""
    return node_user_data(boot).replace(f"exec {FIRST_BOOT_COMMAND}\n", _remover() + f"exec {FIRST_BOOT_COMMAND}\n")


def own_host_gateway_script() -> str:
    """The gateway machine's first script on hosts the user has: vllm-cluster-remove
    alone. Its user data is what the stack's gateway-setup command runs anyway."""
    return _script("gateway host", [_remover()], f"test -x {REMOVE_COMMAND}")


def node_user_data(boot: NodeBoot) -> str:
    """The node's first-boot script, as EC2 hands it to cloud-init (run as root, once,
    in cloud-init's final stage: on Ubuntu after multi-user.target, so after
    /run/nologin is gone). It writes cluster.env, the script library and
    vllm-cluster-first-boot and runs it, which authorizes the gateway's login probe;
    everything else arrives with the stack's setup command (node_setup_script). Small
    on purpose: EC2 takes 16 KiB. No secret is in here."""
    files = [
        _file(LIBRARY_PATH, _read(SCRIPT_LIBRARY), "0644"),
        _file(CLUSTER_ENV, cluster_env(boot), "0600"),
        _node_file("vllm-cluster-first-boot"),
    ]
    return _script("GPU node first boot", files, FIRST_BOOT_COMMAND)


def node_setup_script(boot: NodeBoot) -> str:
    """What the stack's setup command runs on a node (`sudo bash -s`, this on stdin):
    it writes the node scripts, the systemd units and cluster.env, then runs
    `vllm-cluster-node setup`. Idempotent: sending it again is how a changed script
    reaches a running node. No secret is in here: secrets arrive later over SSH into
    root-only files."""
    files = [
        _file(LIBRARY_PATH, _read(SCRIPT_LIBRARY), "0644"),
        _file(PYTHON_LIBRARY_PATH, _read(PYTHON_LIBRARY), "0644"),
        *(_file(f"{INSTALL_DIR}/lib/{path.name}", _read(path), "0644") for path in NODE_PYTHON_MODULES),
        *(
            _node_file(name)
            for name in (
                "vllm-cluster-first-boot",
                "vllm-cluster-node",
                "ray-cluster-check",
                "preflight-check",
                "fabric-check",
                "vllm-watchdog-check",
                "vllm-idle-check",
                "node-env",
                "model-stage",
                "engine-cache",
            )
        ),
        _file(NODE_LOCK_PATH, boot.node_lock, "0644"),
        *(_file(f"/etc/systemd/system/{unit}", _read(NODE_SCRIPTS / "units" / unit), "0644") for unit in NODE_UNITS),
        _file(CLUSTER_ENV, cluster_env(boot), "0600"),
        _file(FIREWALL_FILE, host_firewall(boot.gang_ips, boot.gateway_ip), "0600"),
    ]
    return _script("GPU node setup", files, f"{NODE_COMMAND} setup")


# What `vllm-cluster-node bake` reads (the image has no cluster.env: nothing of a stack or a
# node is in it). Left in the image: it says what the image was baked from.
BAKE_ENV = f"{INSTALL_DIR}/bake.env"


def bake_env(lock_text: str) -> str:
    return env_file(
        {
            "BAKED_LOCK_DIGEST": lock_digest(lock_text),
            "EFS_UTILS_VERSION": versions.EFS_UTILS_VERSION,
            "IMAGE_PYTHON": image.PYTHON,
            "IPTABLES": image.IPTABLES,
            "NFT": image.NFT,
            "SERVICE_USER": SERVICE_USER,
        },
        header="Written by the node image's bake (components/node_image.py). No secret, nothing of a node.",
    )


def node_bake_script(lock_text: str) -> str:
    """What the image build runs (components/node_image.py), as root on the base image: the
    node scripts, the library and the lock, then `vllm-cluster-node bake`, the node's own
    install step without anything of a stack: no cluster.env, no secret, no unit enabled."""
    files = [
        _file(LIBRARY_PATH, _read(SCRIPT_LIBRARY), "0644"),
        _file(PYTHON_LIBRARY_PATH, _read(PYTHON_LIBRARY), "0644"),
        *(_node_file(name) for name in ("vllm-cluster-node", "node-env")),
        _file(NODE_LOCK_PATH, lock_text, "0644"),
        _file(BAKE_ENV, bake_env(lock_text), "0644"),
    ]
    return _script("GPU node image bake", files, f"{NODE_COMMAND} bake --facts {BAKE_ENV}")


# --- the nodes' host firewall ----------------------------------------------------------

# What the node's setup and every start of Ray's unit load (vllm-cluster-node
# load_firewall, `nft -f`); vllm-cluster-remove deletes the table. The node script and
# the remover hold the same names; tests/test_host_firewall.py checks they agree.
FIREWALL_FILE = f"{CONFIG_DIR}/firewall.nft"
FIREWALL_TABLE = "inet vllm_cluster"


def firewall_gateway_ports() -> tuple[int, ...]:
    """What the gateway reaches on a node, as the security groups admit it (security.py's
    nodes group, SSH aside): vLLM (the API pool, Prometheus's scrape of vLLM), Ray's
    metrics (Prometheus) and gang 0's dashboard (nginx on the admin port)."""
    return tuple(sorted((ports.VLLM_API, ports.RAY_DASHBOARD, ports.RAY_METRICS)))


def node_listening_ports() -> tuple[int | tuple[int, int], ...]:
    """Every port Ray and vLLM listen on at a node that is not the kernel's to pick
    (ports.py), a range as (first, last), in order: the ones the host firewall keeps
    to the gang and the gateway (the fabric gate's rendezvous among them: only the
    gang's own ranks may reach its store). Not here, because nothing pins them to a range: the
    sockets of NCCL and Gloo and vLLM's own (torch's rendezvous store, its ZeroMQ
    sockets), on ports from the kernel's ephemeral range (NCCL and Gloo have no setting
    for theirs; VLLM_PORT only moves where vLLM's search for a free port starts). Seen
    with `ss -ltn` on a local host: all on the node's address but the rendezvous store's,
    which is on every address like Ray's."""
    singles = (
        ports.VLLM_API,
        ports.RAY_GCS,
        ports.RAY_DASHBOARD,
        ports.RAY_CLIENT,
        ports.RAY_METRICS,
        ports.RAY_NODE_MANAGER,
        ports.RAY_OBJECT_MANAGER,
        ports.RAY_RUNTIME_ENV_AGENT,
        ports.RAY_DASHBOARD_AGENT_GRPC,
        ports.RAY_DASHBOARD_AGENT_HTTP,
        ports.RAY_DASHBOARD_METRICS,
        ports.RAY_AUTOSCALER_METRICS,
        ports.FABRIC_RENDEZVOUS,
    )
    return (*sorted(singles), (ports.RAY_MIN_WORKER, ports.RAY_MAX_WORKER))


def _nft_ports(listed) -> str:
    return ", ".join(f"{item[0]}-{item[1]}" if isinstance(item, tuple) else str(item) for item in listed)


def _ipv4_addresses(what: str, addresses) -> list[str]:
    found = []
    for address in addresses:
        try:
            found.append(str(ipaddress.IPv4Address(address)))
        except ValueError:
            raise ValueError(f"the host firewall needs {what} as IPv4 addresses, not {address!r}") from None
    if not found:
        raise ValueError(f"the host firewall needs {what}: none given")
    return found


def host_firewall(gang_ips, gateway_ip: str) -> str:
    """The node's host firewall, for `nft -f`: a table of the stack's own
    (FIREWALL_TABLE) whose input chain lets the gang's hosts (`gang_ips`) reach every port
    Ray and vLLM listen on (node_listening_ports), the gateway (`gateway_ip`) the ones it
    proxies and scrapes (firewall_gateway_ports), the node itself (loopback), and refuses
    everyone else there with a TCP reset, counted. Ray binds most of its listeners on
    every address whatever --node-ip-address says (ports.py), and a stack of hosts has no
    security group: this is what keeps them to the gang there, and on EC2 it says what
    the security groups say. Every other port and packet (SSH, the user's own services)
    is left to the host's other rules: the chain's policy is accept, and an accept ends
    only this base chain while a drop (a reject is one) ends the whole ruleset (nft(8),
    "OVERALL EVALUATION OF THE RULESET"), so nothing here opens what another table
    closes, and no other table's accept opens what this one refuses. With iptables the
    rules would sit in the INPUT chain the user's (ufw's) share, where an earlier accept
    skips them. The first lines make loading it again replace the table whole, in one
    transaction: setup and every start of Ray's unit load it, and a boot starts with none."""
    gang = _ipv4_addresses("the gang's private IPs", gang_ips)
    gateway = _ipv4_addresses("the gateway's private IP", [gateway_ip] if gateway_ip else [])
    every = _nft_ports(node_listening_ports())
    return f"""# vllm-cluster's host firewall, generated by components/bootstrap.py (host_firewall).
# Loaded by vllm-cluster-node (setup, and guard-service before every start of Ray's
# unit); removed with `nft delete table {FIREWALL_TABLE}` (vllm-cluster-remove). Other
# tables, and ports not named here, are not touched.
table {FIREWALL_TABLE}
delete table {FIREWALL_TABLE}

table {FIREWALL_TABLE} {{
    # This node's gang: Ray, vLLM and their checks run between these hosts.
    set gang {{
        type ipv4_addr
        elements = {{ {", ".join(gang)} }}
    }}

    # The gateway: its API pool and Prometheus reach vLLM, Prometheus Ray's metrics,
    # nginx gang 0's Ray dashboard.
    set gateway {{
        type ipv4_addr
        elements = {{ {", ".join(gateway)} }}
    }}

    chain input {{
        type filter hook input priority filter; policy accept;
        # The node itself: its checks reach vLLM and Ray at its own address over loopback.
        iif "lo" accept
        # Replies to this node's own connections, whatever port they come back to.
        ct state established,related accept
        tcp dport {{ {_nft_ports(firewall_gateway_ports())} }} ip saddr @gateway accept
        tcp dport {{ {every} }} ip saddr @gang accept
        # Anyone else: refused at once (a reset, not a silent drop), and counted.
        tcp dport {{ {every} }} counter reject with tcp reset
    }}
}}
"""


def compress_user_data(text: str) -> str:
    """gzip (with a fixed timestamp, so the same script gives the same bytes) and base64,
    for an instance's userDataBase64: EC2 counts the gzip bytes against its 16 KiB, and
    cloud-init unpacks gzip by itself."""
    return base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()


def _without_comment_lines(script: str) -> str:
    """A shell script without its comment-only and blank lines (the shebang kept). Safe
    for a script with no heredoc, where a line that starts with # is a comment wherever
    it stands (tests/test_bootstrap.py checks the gateway's has none)."""
    first, *rest = script.splitlines(keepends=True)
    return first + "".join(line for line in rest if line.strip() and not line.lstrip().startswith("#"))


def gateway_setup_script() -> str:
    """What the gateway's setup command runs (as root, on stdin): write the library and
    the gateway command as they are in the repository, then `vllm-cluster-gateway
    setup` (install nginx and Prometheus). Converges when run again."""
    return _gateway_bootstrap(_read(GATEWAY_SCRIPTS / "vllm-cluster-gateway"))


def gateway_user_data() -> str:
    """The gateway's first-boot script: the setup script's steps, with the gateway
    command's comment lines left out. It starts installing nginx and Prometheus while the
    nodes boot; EC2 takes at most USER_DATA_LIMIT_BYTES of it gzipped, and the commented
    command alone is near that. The stack's setup command then writes the commented one
    (gateway_setup_script) before anything else runs it."""
    return _gateway_bootstrap(_without_comment_lines(_read(GATEWAY_SCRIPTS / "vllm-cluster-gateway")))


def _gateway_bootstrap(gateway_command: str) -> str:
    """Write the library and `gateway_command` (the gateway script's text), then run its setup."""
    files = [_file(LIBRARY_PATH, _read(SCRIPT_LIBRARY), "0644"), _file(GATEWAY_COMMAND, gateway_command, "0755")]
    return _script("gateway bootstrap", files, f"{GATEWAY_COMMAND} setup")


WAKER_COMMAND = f"{BIN_DIR}/vllm-cluster-waker"
WAKER_UNIT = "vllm-cluster-waker.service"
WAKER_ENV = f"{CONFIG_DIR}/waker.env"
# EC2 stops an instance that powers itself off and starts it again within a minute or
# two; Ray and vLLM then start as at boot. What a client is told to wait between tries.
WAKER_RETRY_AFTER_SECONDS = 30


def waker_port_env() -> dict[str, str]:
    """The gateway's waker.env: the waker's port (not in cluster.env, which only the
    nodes get), read by its unit (--port via PORT_WAKER) and `vllm-cluster-gateway wake`."""
    return {"PORT_WAKER": str(ports.WAKER)}


def gateway_waker_script(config_json: str) -> str:
    """What the gateway's waker command runs (`sudo bash -s`, this on stdin): it writes
    the waker, its unit and its port (waker.env), then hands `config_json`
    (idle_stop.waker_config) to `vllm-cluster-gateway waker-config`, which installs it and (re)starts the waker.
    Not in the gateway's user data: that is near EC2's 16 KiB already, and only stacks
    with idleStopMinutes need the waker. The delete runs `waker-config --off`."""
    if _HEREDOC_END in config_json:
        raise ValueError("the waker's configuration contains the heredoc delimiter")
    files = [
        _file(WAKER_COMMAND, _read(GATEWAY_SCRIPTS / "vllm-cluster-waker"), "0755"),
        _file(f"/etc/systemd/system/{WAKER_UNIT}", _read(GATEWAY_SCRIPTS / "units" / WAKER_UNIT), "0644"),
        _file(
            WAKER_ENV,
            env_file(waker_port_env(), header="Written by the stack. Read by vllm-cluster-waker and its unit."),
            "0644",
        ),
    ]
    text = config_json if config_json.endswith("\n") else config_json + "\n"
    return _script("gateway waker", files, f"{GATEWAY_COMMAND} waker-config <<'{_HEREDOC_END}'\n{text}{_HEREDOC_END}")


def gateway_metrics_script(files: dict[str, str], ready_url: str) -> str:
    """What the gateway's metrics command runs (`sudo bash -s`, this on stdin, secret: it
    holds the metrics login's hash): it writes `files` (path on the gateway -> content,
    components/metrics.gateway_files) into a fresh folder under the same paths, and
    `vllm-cluster-gateway metrics` installs them from there, checked first."""
    staged = [_file(f"$staged{path}", content, "0600") for path, content in files.items()]
    # _file quotes nothing in the path: the folder comes from mktemp, the paths from code.
    return "".join(
        [
            "#!/bin/bash\n",
            "# vllm-cluster gateway metrics, generated by components/bootstrap.py.\n",
            "set -euo pipefail\numask 077\n",
            "staged=$(mktemp -d)\n",
            *staged,
            f'exec {GATEWAY_COMMAND} metrics --staged "$staged" --ready-url {ready_url}\n',
        ]
    )


# --- vLLM --------------------------------------------------------------------------


def model_directory(model: str, revision: str) -> str:
    """The model's directory on the shared model cache: the same path on every node."""
    return f"{MODEL_ROOT}/models/{model}/{revision}"


# Each node's copy of its pipeline stages on the instance store (components/image.py
# NVME_MOUNT): vllm-cluster-node prepare-serve writes it, vLLM serves from it.
LOCAL_MODEL_ROOT = f"{image.NVME_MOUNT}/vllm-cluster/models"


def local_model_directory(model: str, revision: str) -> str:
    """The model's directory on a node's own disk: the same path on every node, each
    holding only the weight files of its own pipeline stages (model-stage local), and the
    same path whichever disk holds the stage: with a gp3 stage volume (stageVolume ebs) the
    node binds the volume's models directory here (components/stage_volume.py)."""
    return f"{LOCAL_MODEL_ROOT}/{model}/{revision}"


def serving_directory(spec: ClusterSpec) -> str:
    """Where vLLM reads the model on every node: its stage on local disk when the
    instance type has an instance store (sizing.serves_from_local_disk), else the
    shared cache itself. stageVolume does not change it: only which disk is under it."""
    local, _reason = sizing.serves_from_local_disk(spec)
    if local:
        return local_model_directory(spec.model, spec.model_revision)
    return model_directory(spec.model, spec.model_revision)


def warmup_key(spec: ClusterSpec) -> str:
    """The key of vLLM's compile cache kept on the shared cache: what changes the
    engine's compiled graphs (engine_cache.warmup_key), not the head's address."""
    return engine_cache.warmup_key(
        spec.vllm_version,
        spec.model,
        spec.model_revision,
        spec.tensor_parallel_size,
        spec.pipeline_parallel_size,
        spec.max_model_len,
        vllm_serve_args(spec, "0.0.0.0"),
        hardware=spec.instance_type,
    )


def served_model_name(spec: ClusterSpec) -> str:
    return spec.served_model_name or spec.model


def stack_probe(spec: ClusterSpec) -> api_routes.Probe:
    """The request the stack sends to see that the model serves (readiness, start-vllm,
    the watchdog, `status`): its task's, for the name vLLM serves it under."""
    return api_routes.stack_probe(spec.vllm_extra_args, served_model_name(spec))


def start_vllm_command(probe: api_routes.Probe, stall_seconds: int) -> str:
    """The head's start-vllm, handed the stack's probe (the head keeps it in probe.env
    for every check that sends it: scripts/node/vllm-cluster-node keep_probe) and how
    long the engine's start may write no line before it is called stuck
    (sizing.engine_start_stall_for)."""
    return (
        f"sudo {NODE_COMMAND} start-vllm --probe-route {shlex.quote(probe.route)} "
        f"--probe-body {shlex.quote(probe.body_json())} --stall-seconds {int(stall_seconds)}"
    )


def _number(value: float) -> str:
    return f"{value:g}"


def vllm_serve_args(spec: ClusterSpec, head_ip: str) -> list[str]:
    """Everything after `vllm serve` on the head, in order. The planner prints this
    same list; the head runs it through vllm.env. The API key is not here: vLLM reads
    VLLM_API_KEY from a root-only env file."""
    args = [
        serving_directory(spec),
        "--served-model-name",
        served_model_name(spec),
        "--tensor-parallel-size",
        str(spec.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(spec.pipeline_parallel_size),
        "--distributed-executor-backend",
        "ray",
        "--host",
        head_ip,
        "--port",
        str(ports.VLLM_API),
    ]
    if spec.max_model_len is not None:
        args += ["--max-model-len", str(spec.max_model_len)]
    if spec.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", _number(spec.gpu_memory_utilization)]
    args += list(spec.vllm_extra_args)
    return args


# vLLM's own variables that vllm.env sets (vllm/envs.py, vLLM 0.32.0). vLLM takes every
# VLLM_* variable for its own and warns at start about one it does not know
# (vllm/platforms/interface.py): the stack's own keys carry no VLLM_ prefix.
VLLM_VARIABLES_SET = ("VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "VLLM_NO_USAGE_STATS")


def vllm_env(spec: ClusterSpec, head_ip: str, node_ips: list[str], gang: int = 0) -> str:
    """/etc/vllm-cluster/vllm.env on a gang's head: the serve arguments and the cluster
    vLLM must see before it starts (every node of the gang by name and IP, every GPU)."""
    expected = ",".join(f"{node_name(i, gang)}={ip}" for i, ip in enumerate(node_ips))
    return env_file(
        {
            "SERVE_ARGS": " ".join(vllm_serve_args(spec, head_ip)),
            "SERVED_MODEL_NAME": served_model_name(spec),
            "EXPECTED_NODES": expected,
            "EXPECTED_GPUS": str(spec.nodes * spec.gpus_per_node),
            # vLLM's default (600 s) is too short for a large model's cold start; see sizing.
            "VLLM_ENGINE_READY_TIMEOUT_S": str(sizing.engine_ready_timeout_for(spec.model, spec.instance, spec.nodes)),
            # The gateway's upstream keepalive_timeout is shorter (GATEWAY_UPSTREAM_KEEPALIVE_SECONDS).
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": str(VLLM_HTTP_KEEP_ALIVE_SECONDS),
            # The model is staged on the cache before vLLM starts: never download at serve time.
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        },
        header="Written by vllm-cluster-node start-vllm from the stack. Changing it restarts vLLM only.",
    )


# --- the gateway's API keys, as the maps its nginx site includes (components/gateway_nginx.py)


def api_keys_conf(keys: dict[str, str], heads_key: str) -> str:
    """The root-only include the site names (gateway_nginx.API_KEYS_FILE), as nginx maps: each key a
    client may send as `Authorization: Bearer KEY`, labelled (`current`, `previous`,
    `probe`: the value of $vllm_cluster_api_key, "" for none); and the key of the
    heads' vLLM, which only the gateway sends. Clients never learn the heads' key, so a
    new client key (a rotation) changes this file alone: nginx reloads gracefully and no
    vLLM restarts. A map is a hash lookup (ngx_http_map_module), not a comparison a
    timing could walk character by character."""
    for label, key in {**keys, "heads": heads_key}.items():
        # components/spec/secrets.py _TOKEN_CHARS: nothing nginx would read as a quote, a variable or an escape.
        if not re.fullmatch(r"[A-Za-z0-9._~+/=-]{1,%d}" % MAX_API_KEY_LENGTH, key):
            raise ValueError(f"the {label} API key holds a character nginx cannot take in a map, or is too long")
    if len(set(keys.values())) != len(keys) or heads_key in keys.values():
        raise ValueError("two API keys are the same")
    client_lines = "".join(f'    "Bearer {key}" {label};\n' for label, key in keys.items())
    return (
        "# vllm-cluster: the API keys the gateway accepts, and the heads' key. Written by\n"
        "# vllm-cluster-gateway install-api-keys from the stack; root-only. Do not edit.\n"
        f"map $http_authorization {API_KEY_VARIABLE} {{\n"
        '    default "";\n'
        f"{client_lines}"
        "}\n"
        f"map $host {HEADS_AUTHORIZATION_VARIABLE} {{\n"
        f'    default "Bearer {heads_key}";\n'
        "}\n"
    )


def certificate_fingerprint(pem: str) -> str:
    """SHA-256 fingerprint of a PEM certificate, as `openssl x509 -fingerprint -sha256`
    prints it (upper-case hex pairs joined by colons)."""
    match = re.search(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", pem, re.S)
    if not match:
        raise ValueError("no PEM certificate found")
    der = base64.b64decode("".join(match.group(1).split()))
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
