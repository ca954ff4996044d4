"""What the nodes and the gateway are given to run: user data, env files, the
`vllm serve` argument list and the gateway's nginx site.

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
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from components import api_routes, image, metrics, ports, sizing, stage_volume, versions
from components.api_routes import DEFAULT_GENERATION_ROUTES, KNOWN_ROUTES, WORK_ROUTES
from components.spec import (
    DEFAULT_API_RATE_LIMIT_PER_SECOND,
    DEFAULT_API_READ_TIMEOUT_SECONDS,
    MAX_API_KEY_LENGTH,
    ClusterSpec,
)
from components.topology import node_name, node_role, writes_wheelhouse
from components.versions import EFS_UTILS_VERSION  # noqa: F401  # moved (issue 37): lead removes at integration
from scripts.lib import engine_cache

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPTS = ROOT / "scripts" / "node"
GATEWAY_SCRIPTS = ROOT / "scripts" / "gateway"
SCRIPT_LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
PYTHON_LIBRARY = ROOT / "scripts" / "lib" / "vllm_cluster_lib.py"
# The node's Python modules beside it: which files a pipeline stage needs and their copy
# (model-stage), and vLLM's compile cache kept on the shared cache (engine-cache).
NODE_PYTHON_MODULES = (ROOT / "scripts" / "lib" / "model_stage.py", ROOT / "scripts" / "lib" / "engine_cache.py")

# Where things live on the hosts. The scripts hold the same paths; tests check both agree.
INSTALL_DIR = "/opt/vllm-cluster"
BIN_DIR = f"{INSTALL_DIR}/bin"
NODE_COMMAND = f"{BIN_DIR}/vllm-cluster-node"
FIRST_BOOT_COMMAND = f"{BIN_DIR}/vllm-cluster-first-boot"
# What `pulumi destroy` runs on a machine of a stack of hosts (components/own_hosts.py).
REMOVE_COMMAND = f"{BIN_DIR}/vllm-cluster-remove"
REMOVE_SCRIPT = ROOT / "scripts" / "lib" / "vllm-cluster-remove"
GATEWAY_COMMAND = f"{BIN_DIR}/vllm-cluster-gateway"
LIBRARY_PATH = f"{INSTALL_DIR}/lib/vllm-cluster-lib.sh"
# Where the Python checks find their shared helpers: ../lib from BIN_DIR.
PYTHON_LIBRARY_PATH = f"{INSTALL_DIR}/lib/vllm_cluster_lib.py"
# The lock the node installs (vllm-cluster-node NODE_LOCK).
NODE_LOCK_PATH = f"{INSTALL_DIR}/node-env.lock"
# All the gateway's login probe may do on a node: print this word (see
# `vllm-cluster-gateway wait-login` and `vllm-cluster-node setup`).
LOGIN_READY_WORD = "vllm-cluster-login-ready"
CONFIG_DIR = "/etc/vllm-cluster"
# Who runs Ray and vLLM on a node (their units' User=, scripts/node/units): a system user
# without a login, so an engine that runs code it was tricked into loading (a model's,
# a compiled graph's) gets neither root nor, kept from the metadata service, the node
# role's credentials (issue 33 point 3). The stack's own tooling stays root.
SERVICE_USER = "vllm-cluster"
CLUSTER_ENV = f"{CONFIG_DIR}/cluster.env"
MODEL_ROOT = "/mnt/vllm-models"
# The wheelhouse's own access point, mounted read-only but on its writer (storage.py).
WHEELHOUSE_ROOT = "/mnt/vllm-wheelhouse"
TLS_DIR = f"{CONFIG_DIR}/tls"
NGINX_SITE = "/etc/nginx/conf.d/vllm-cluster.conf"

# EC2 refuses user data above 16 KiB "in raw form, before it is base64-encoded"
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html):
# for gzipped user data, the gzip bytes.
USER_DATA_LIMIT_BYTES = 16 * 1024

# The gateway's API limits: a request body large enough for long chat histories; the
# per-client rate and the read timeout come from config (apiRateLimitPerSecond,
# apiReadTimeoutSeconds), and a burst of this many seconds' worth of requests is let through.
MAX_REQUEST_BODY = "4m"
RATE_LIMIT_BURST_SECONDS = 2
# vLLM's HTTP server closes an idle keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE
# seconds (5 by default, vllm/envs.py); vllm.env sets it explicitly. nginx keeps idle
# upstream connections for 60 s unless told otherwise, and a request it sends on one the
# server has just closed fails with 502. So the gateway lets go first.
VLLM_HTTP_KEEP_ALIVE_SECONDS = 5
GATEWAY_UPSTREAM_KEEPALIVE_SECONDS = 4
# The keys the gateway accepts and the one it sends the heads, as nginx maps (an
# http-level include the site names): root-only, written by
# `vllm-cluster-gateway install-api-keys`. nginx's master reads it as root at every
# (re)load; its workers hold the maps in memory and never open the file.
API_KEYS_FILE = f"{CONFIG_DIR}/api-keys.conf"
# A map's keys must fit one bucket of its hash (nginx docs, ngx_http_map_module
# map_hash_bucket_size): "Bearer " and a key of up to spec.MAX_API_KEY_LENGTH characters.
API_KEYS_MAP_BUCKET_SIZE = 256

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
        # The stage volume's facts (components/stage_volume.py), the same for every node
        # whatever stageVolume chose: cluster.env is in the user data and the setup command,
        # and the node decides from what it was launched with (vllm-cluster-node
        # stage_volume_launched), so a change of the choice reaches no running node.
        "STAGE_VOLUME_MOUNT": stage_volume.STAGE_VOLUME_MOUNT,
        "STAGE_VOLUME_LABEL": stage_volume.STAGE_VOLUME_LABEL,
        "STAGE_VOLUME_DEVICE_NAME": stage_volume.STAGE_VOLUME_DEVICE_NAME,
        "STAGE_VOLUME_BY_ID_PREFIX": stage_volume.STAGE_VOLUME_BY_ID_PREFIX,
        "STAGE_VOLUME_IMDS_MAPPINGS": stage_volume.IMDS_BLOCK_DEVICE_MAPPING,
        "IMDS_TOKEN_PATH": stage_volume.IMDS_TOKEN_PATH,
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


# --- gateway -----------------------------------------------------------------------

# The API pool's servers, one line per gang, in a file of their own: the stack sends the
# gangs (`vllm-cluster-gateway configure --gangs`), and the gateway renders the file
# from them and from the gangs drained for a restart (`drain`, `return`), so taking a gang
# out never waits for a `pulumi up`. Not under conf.d: nginx.conf includes conf.d/*.conf
# in its http block, where a bare `server` line is an error.
NGINX_UPSTREAM_INCLUDE = "/etc/nginx/vllm-cluster-upstream.inc"
# A connection to a head inside the VPC takes milliseconds: one that has not opened in
# this long is a head that is off, and the request moves on to another gang instead of
# waiting nginx's default 60 s.
GATEWAY_CONNECT_TIMEOUT_SECONDS = 3
# A request a gang could not serve is passed to another gang at most this many tries in
# all, and only within this many seconds of its first try: long enough for a dead head's
# connect timeout and a second gang, short enough that a generation which ran into the
# read timeout is not run again elsewhere (never longer than the read timeout).
GATEWAY_RETRY_TRIES = 3
GATEWAY_RETRY_WINDOW_SECONDS = 15
# The waker listens on the gateway itself: a connect that takes longer means it is down.
# Its answer may wait for one look at EC2 (its HTTP timeouts are 5 s) and the heads.
WAKER_CONNECT_TIMEOUT_SECONDS = 1
WAKER_READ_TIMEOUT_SECONDS = 20


def gateway_gangs(head_ips: dict[str, str]) -> str:
    """The value of `vllm-cluster-gateway configure --gangs`: each gang's name and the
    address of its head's vLLM, in the order given: gang0=IP:PORT,gang1=IP:PORT."""
    return ",".join(f"{gang}={ip}:{ports.VLLM_API}" for gang, ip in head_ips.items())


def nginx_site(
    dashboard_head_ip: str,
    admin_cidrs: tuple[str, ...],
    cert_path: str = f"{TLS_DIR}/cert.pem",
    key_path: str = f"{TLS_DIR}/key.pem",
    *,
    read_timeout_seconds: int = DEFAULT_API_READ_TIMEOUT_SECONDS,
    rate_limit_per_second: int = DEFAULT_API_RATE_LIMIT_PER_SECOND,
    upstream_include: str = NGINX_UPSTREAM_INCLUDE,
    waker: bool = False,
    api_routes: tuple[str, ...] = DEFAULT_GENERATION_ROUTES,
    api_keys_file: str = API_KEYS_FILE,
    nodes_prometheus_ip: str | None = None,
) -> str:
    """The gateway's nginx site (an http-context file for conf.d): TLS on the API
    port, where a request needs one of the stack's API keys (api_keys_conf, in
    `api_keys_file`) before anything else happens, and only `api_routes` are forwarded,
    as the route itself (never the path as sent); a body limit, a read timeout and a
    per-client rate limit (none when 0), balanced over every gang's head (the servers
    are in `upstream_include`, which the gateway renders); and the Ray dashboard of one
    head (gang0's, `dashboard_head_ip`) on the admin port for adminCidrs only. With
    `waker` (a stack with idleStopMinutes), a request to a route that does the model's
    work (WORK_ROUTES) that no gang could take goes to the gateway's waker, which starts
    the stopped gangs and answers 503 with Retry-After; the other routes get a 503 and
    wake nothing. With `nodes_prometheus_ip` (the gateway's private address), Prometheus's
    query API for the heads' Ray dashboards on that address (_nginx_nodes_prometheus_server)."""
    unknown = sorted(set(api_routes) - set(KNOWN_ROUTES))
    if unknown:
        raise ValueError(f"not a route the gateway knows: {', '.join(unknown)}")
    # TLS settings go in each server block: the distribution's nginx.conf already sets
    # ssl_protocols in the http block, and a second one there is an error.
    tls = f"""    ssl_certificate {cert_path};
    ssl_certificate_key {key_path};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:vllm_tls:10m;
    server_tokens off;
"""
    rate_zone = (
        f"limit_req_zone $binary_remote_addr zone=vllm_api:10m rate={rate_limit_per_second}r/s;\n\n"
        if rate_limit_per_second
        else ""
    )
    return (
        "# vllm-cluster gateway, generated by components/bootstrap.py. Do not edit on the host:\n"
        "# the next `pulumi up` writes it again. Included in nginx.conf's http block (conf.d).\n\n"
        f"{_nginx_api_keys(api_keys_file)}\n"
        f"{rate_zone}{_nginx_upstreams(dashboard_head_ip, upstream_include)}\n"
        f"{_nginx_api_server(tls, read_timeout_seconds, rate_limit_per_second, waker, api_routes)}\n"
        f"{_nginx_dashboard_server(tls, admin_cidrs)}"
        + (f"\n{_nginx_nodes_prometheus_server(nodes_prometheus_ip)}" if nodes_prometheus_ip is not None else "")
    )


# The variables api_keys_conf defines: which key a request carried ("" for none the
# stack accepts), and the Authorization header the gateway sends the heads.
API_KEY_VARIABLE = "$vllm_cluster_api_key"
HEADS_AUTHORIZATION_VARIABLE = "$vllm_cluster_heads_authorization"


def api_keys_conf(keys: dict[str, str], heads_key: str) -> str:
    """The root-only include the site names (API_KEYS_FILE), as nginx maps: each key a
    client may send as `Authorization: Bearer KEY`, labelled (`current`, `previous`,
    `probe`: the value of $vllm_cluster_api_key, "" for none); and the key of the
    heads' vLLM, which only the gateway sends. Clients never learn the heads' key, so a
    new client key (a rotation) changes this file alone: nginx reloads gracefully and no
    vLLM restarts. A map is a hash lookup (ngx_http_map_module), not a comparison a
    timing could walk character by character."""
    for label, key in {**keys, "heads": heads_key}.items():
        # spec._TOKEN_CHARS: nothing nginx would read as a quote, a variable or an escape.
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


def _nginx_api_keys(api_keys_file: str) -> str:
    return f"""# The API keys (api_keys_conf): a root-only file, so the keys are not in this site.
map_hash_bucket_size {API_KEYS_MAP_BUCKET_SIZE};
include {api_keys_file};
"""


def _nginx_upstreams(dashboard_head_ip: str, upstream_include: str) -> str:
    return f"""upstream vllm_api {{
    # Each request to the gang with the fewest requests in flight: a generation holds
    # its connection for seconds to minutes, so this balances better than taking turns.
    # A balancing method must come before keepalive (nginx docs, upstream keepalive).
    least_conn;
    # One server line per gang, written by vllm-cluster-gateway (configure, drain,
    # return): a gang drained for a restart is `down`, and the others are taken out for
    # a while after a failed try (max_fails); the file says why.
    include {upstream_include};
    keepalive 16;
    # Idle connections close here before vLLM closes them
    # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE {VLLM_HTTP_KEEP_ALIVE_SECONDS} s).
    keepalive_timeout {GATEWAY_UPSTREAM_KEEPALIVE_SECONDS}s;
}}

upstream ray_dashboard {{
    server {dashboard_head_ip}:{ports.RAY_DASHBOARD};
}}
"""


def _openai_error(status: int, message: str, kind: str, code: str) -> str:
    """An error body as OpenAI's API sends it (and the OpenAI SDKs parse into their
    exceptions' messages): {"error": {"message", "type", "param", "code"}}. In an nginx
    single-quoted string: the messages hold no quote, no $ and no backslash."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    if set("'$\\\\") & set(body):
        raise ValueError(f"an error body nginx would misread: {body}")
    return f"return {status} '{body}';"


UNAUTHORIZED = _openai_error(
    401,
    "Missing or invalid API key: send the key of the stack as Authorization: Bearer KEY "
    "(pulumi stack output apiKey --show-secrets).",
    "invalid_request_error",
    "invalid_api_key",
)
NOT_FOUND = _openai_error(
    404,
    "No such route on this gateway (see the apiRoutes setting of the stack).",
    "invalid_request_error",
    "unknown_url",
)
NO_GANG_SERVES = _openai_error(
    503,
    "No gang of this stack is serving now. A stack that stopped for idleness wakes on a request to a "
    "route that uses the model (such as /v1/chat/completions), not on this one.",
    "service_unavailable",
    "no_gang_serving",
)


def _nginx_waker() -> tuple[str, str]:
    """The work routes' line that hands a request no gang could take to the waker, and
    the named locations: the waker's, and the 503 the other routes give instead. error_page
    catches only nginx's own 502 and 504 (no gang answered, or none in time, after
    proxy_next_upstream's tries): without proxy_intercept_errors a 502 or 503 that vLLM
    itself sent reaches the client as it is (nginx docs, ngx_http_proxy_module
    proxy_intercept_errors). "=" without a code answers with the waker's status
    (ngx_http_core_module error_page). A named location keeps the request's URI and
    method, and nothing outside can address it. error_page is set per location: a
    location's own error_page replaces the server's (ngx_http_core_module: "inherited
    ... if and only if there are no error_page directives defined on the current level")."""
    handoff = """        # No gang could take it (all stopped by idleStopMinutes, or down): the waker on
        # this host answers, waking the stopped gangs (503 with Retry-After).
        error_page 502 504 = @vllm_waker;
"""
    locations = f"""
    location @vllm_waker {{
        # The status nginx would have sent, for the waker's answer when nothing sleeps.
        proxy_set_header X-Vllm-Cluster-Status $status;
        # The waker needs no key: the request passed the gateway's check to get here.
        proxy_set_header Authorization "";
        proxy_pass http://127.0.0.1:{ports.WAKER};
        # On this host: it answers at once (it reads EC2 for a few seconds at most).
        proxy_connect_timeout {WAKER_CONNECT_TIMEOUT_SECONDS}s;
        proxy_read_timeout {WAKER_READ_TIMEOUT_SECONDS}s;
        proxy_next_upstream off;
    }}

    location @vllm_no_gang {{
        {NO_GANG_SERVES}
    }}
"""
    return handoff, locations


def _nginx_api_server(
    tls: str,
    read_timeout_seconds: int,
    rate_limit_per_second: int,
    waker: bool = False,
    api_routes: tuple[str, ...] = DEFAULT_GENERATION_ROUTES,
) -> str:
    """The OpenAI-compatible API: the key first, then only `api_routes` reach vLLM."""
    limit = (
        f"        limit_req zone=vllm_api burst={rate_limit_per_second * RATE_LIMIT_BURST_SECONDS} nodelay;\n"
        if rate_limit_per_second
        else ""
    )
    handoff, waker_locations = _nginx_waker() if waker else ("", "")
    no_gang = (
        "        # Never a reason to start a gang.\n        error_page 502 504 = @vllm_no_gang;\n" if waker else ""
    )
    # proxy_pass names the route: nginx sends exactly it (with the query string), not the
    # path as the client sent it (ngx_http_proxy_module proxy_pass: with a URI, "the part
    # of a normalized request URI matching the location is replaced by a URI specified in
    # the directive"; without one, the request URI goes "in the same form as sent by a
    # client"), so /metrics/../v1/models cannot reach vLLM's /metrics.
    api_locations = "".join(
        f"""
    location = {route} {{
        if ({API_KEY_VARIABLE} = "") {{
            {UNAUTHORIZED}
        }}
{limit}{handoff if route in WORK_ROUTES else no_gang}        proxy_pass http://vllm_api{route};
    }}
"""
        for route in api_routes
    )
    rate_status = "    limit_req_status 429;\n" if rate_limit_per_second else ""
    return f"""# The OpenAI-compatible API: the key first, then only the stack's routes reach vLLM.
server {{
    listen {ports.API_HTTPS} ssl;
    listen [::]:{ports.API_HTTPS} ssl;
    server_name _;
{tls}
    client_max_body_size {MAX_REQUEST_BODY};
    # The type of the gateway's own answers (401, 404, 503): OpenAI-style JSON.
    default_type application/json;
    # A path as sent that is not the route it names: a dot segment, an empty segment or
    # any percent-encoding (none of the routes has one). nginx would match its normalised
    # form (/metrics/../v1/models as /v1/models); refused before any location is chosen.
    if ($request_uri ~ "^[^?]*(/\\.\\.?(/|$|\\?)|//|%)") {{
        {NOT_FOUND}
    }}
{rate_status}    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header X-Forwarded-For $remote_addr;
    # The heads check their own key, which only the gateway holds: the client's key
    # stops here (api_keys_conf).
    proxy_set_header Authorization {HEADS_AUTHORIZATION_VARIABLE};
    # Streaming responses (server-sent events) must not wait in a buffer.
    proxy_buffering off;
    # Between two reads from vLLM: a non-streamed generation longer than this gets 504.
    proxy_read_timeout {read_timeout_seconds}s;
    # Inside the VPC a connect takes milliseconds: a head that is off must not hold the
    # request for nginx's default 60 s before the next gang is tried.
    proxy_connect_timeout {GATEWAY_CONNECT_TIMEOUT_SECONDS}s;
    # A request a gang could not serve goes to another gang: the connection failed or
    # broke before a response header (error), did not open or answer in time (timeout),
    # or vLLM answered 502/503. A POST (every completion) that was already sent is
    # passed on only with non_idempotent; running a generation again changes nothing.
    # nginx never retries once a byte went to the client, so a stream is not restarted,
    # and the body can be sent again because proxy_request_buffering stays on.
    proxy_next_upstream error timeout http_502 http_503 non_idempotent;
    # At most this many tries in all, and none after this long since the first: a
    # generation that ran into proxy_read_timeout is not run again on another gang.
    proxy_next_upstream_tries {GATEWAY_RETRY_TRIES};
    proxy_next_upstream_timeout {min(GATEWAY_RETRY_WINDOW_SECONDS, read_timeout_seconds)}s;
{api_locations}{waker_locations}
    location / {{
        {NOT_FOUND}
    }}
}}
"""


def _nginx_dashboard_server(tls: str, admin_cidrs: tuple[str, ...]) -> str:
    admin_allow = "".join(f"    allow {cidr};\n" for cidr in admin_cidrs)
    return f"""# The Ray dashboard (also Ray's Jobs API, which runs code) and Prometheus: admins
# only. The security group admits adminCidrs alone; nginx checks again, Ray asks for
# its token and Prometheus for the metrics login.
server {{
    listen {ports.DASHBOARD_HTTPS} ssl;
    listen [::]:{ports.DASHBOARD_HTTPS} ssl;
    server_name _;
{tls}
{admin_allow}    deny all;

    # Prometheus on this host: the stack's metrics login (metricsLogin) on top of
    # adminCidrs, as Prometheus has none of its own. It serves everything under the
    # prefix itself (--web.route-prefix), so the path passes through unchanged.
    location {metrics.ROUTE_PREFIX}/ {{
        auth_basic "vllm-cluster metrics";
        auth_basic_user_file {metrics.HTPASSWD_FILE};
        proxy_pass http://{metrics.listen_address()};
        proxy_read_timeout 120s;
    }}

    location / {{
        proxy_pass http://ray_dashboard;
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection "upgrade";
        proxy_read_timeout 300s;
    }}
}}
"""


def _nginx_nodes_prometheus_server(gateway_private_ip: str) -> str:
    """Prometheus listens on loopback only (metrics.listen_address()); the heads' Ray
    dashboards reach its query API here, on the gateway's private address and Prometheus's
    port (metrics.ray_prometheus_host), which the security group opens to the nodes alone.
    Ray asks that one path with GET (metrics.NODES_QUERY_PATH); everything else of
    Prometheus (its UI, /federate, the other APIs) is 404 to the nodes."""
    ip = ipaddress.ip_address(gateway_private_ip)
    listen = f"[{ip}]:{ports.PROMETHEUS}" if ip.version == 6 else f"{ip}:{ports.PROMETHEUS}"
    return f"""# Prometheus's query API for the heads' Ray dashboards (RAY_PROMETHEUS_HOST), and
# nothing else of it: the nodes only, by the security group; no TLS inside the VPC, as
# before, and Prometheus itself on loopback.
server {{
    listen {listen};
    server_name _;
    server_tokens off;

    location = {metrics.NODES_QUERY_PATH} {{
        limit_except GET {{
            deny all;
        }}
        proxy_pass http://{metrics.listen_address()};
        proxy_read_timeout 120s;
    }}

    location / {{
        return 404;
    }}
}}
"""


def certificate_fingerprint(pem: str) -> str:
    """SHA-256 fingerprint of a PEM certificate, as `openssl x509 -fingerprint -sha256`
    prints it (upper-case hex pairs joined by colons)."""
    match = re.search(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", pem, re.S)
    if not match:
        raise ValueError("no PEM certificate found")
    der = base64.b64decode("".join(match.group(1).split()))
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
