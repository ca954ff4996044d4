"""What the nodes and the gateway are given to run: user data, env files, the
`vllm serve` argument list and the gateway's nginx site.

Pure Python, no Pulumi: every function takes plain values and returns text or
lists, so all of it is unit-tested, and the planner shows exactly the arguments
the head will run. The scripts themselves are real files under scripts/node and
scripts/gateway; the user data only carries them to the host and runs them.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from components import ports
from components.spec import ClusterSpec
from components.topology import node_name, node_role

ROOT = Path(__file__).resolve().parent.parent
NODE_SCRIPTS = ROOT / "scripts" / "node"
GATEWAY_SCRIPTS = ROOT / "scripts" / "gateway"

# Where things live on the hosts. The scripts hold the same paths; tests check both agree.
INSTALL_DIR = "/opt/vllm-cluster"
BIN_DIR = f"{INSTALL_DIR}/bin"
NODE_COMMAND = f"{BIN_DIR}/vllm-cluster-node"
GATEWAY_COMMAND = f"{BIN_DIR}/vllm-cluster-gateway"
CONFIG_DIR = "/etc/vllm-cluster"
CLUSTER_ENV = f"{CONFIG_DIR}/cluster.env"
MODEL_ROOT = "/mnt/vllm-models"
TLS_DIR = f"{CONFIG_DIR}/tls"
NGINX_SITE = "/etc/nginx/conf.d/vllm-cluster.conf"

# amazon-efs-utils has no Ubuntu package; the node builds this tag (github.com/aws/efs-utils).
# The last 1.x release: Python and stunnel. 2.x needs a newer Rust (and Go) than Ubuntu
# 22.04 ships (aws/efs-utils #303, #312).
EFS_UTILS_VERSION = "v1.36.0"

# EC2 refuses user data above 16 KiB (before base64).
USER_DATA_LIMIT_BYTES = 16 * 1024

# The gateway's API limits: a request body large enough for long chat histories,
# and a per-client rate that stops a runaway script, not a busy application.
MAX_REQUEST_BODY = "4m"
RATE_LIMIT_PER_SECOND = 20
RATE_LIMIT_BURST = 40
# The only API routes the gateway forwards; everything else answers 404. vLLM's own
# API key guards only /v1 and a few prefixes, leaving admin routes such as
# /collective_rpc or /sleep open, so the allowlist is what keeps them private.
API_ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health")

_HEREDOC_END = "VLLM_CLUSTER_FILE_END"
NODE_UNITS = ("ray-head.service", "ray-worker.service", "vllm.service", "vllm-watchdog.service", "vllm-watchdog.timer")


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


def cluster_env(boot: NodeBoot) -> str:
    """/etc/vllm-cluster/cluster.env: what the stack decided for one node."""
    values = {
        "NODE_INDEX": str(boot.index),
        "NODE_NAME": node_name(boot.index),
        "NODE_ROLE": node_role(boot.index),
        "HEAD_IP": boot.head_ip,
        "NODE_SUBNET_CIDR": boot.subnet_cidr,
        "GPUS_PER_NODE": str(boot.gpus),
        "EFA_ENABLED": "true" if boot.efa else "false",
        "MODEL_CACHE_FILE_SYSTEM_ID": boot.file_system_id,
        "MODEL_CACHE_ACCESS_POINT_ID": boot.access_point_id,
        "MODEL_CACHE_DNS": boot.file_system_dns,
        "RAY_VERSION": boot.ray_version,
        "VLLM_VERSION": boot.vllm_version,
        "EFS_UTILS_VERSION": EFS_UTILS_VERSION,
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


def node_user_data(boot: NodeBoot) -> str:
    """The node's first-boot script (cloud-init runs it as root, once). It writes the
    node scripts, the systemd units and cluster.env, then runs `vllm-cluster-node
    setup`. The stack's setup command sends the same text again (idempotent), which
    is how a changed script reaches a running node. No secret is in here: secrets
    arrive later over SSH into root-only files."""
    parts = [
        "#!/bin/bash\n",
        "# vllm-cluster GPU node bootstrap, generated by components/bootstrap.py.\n",
        "# Safe to run again: every step skips what is already in place.\n",
        "set -euo pipefail\numask 022\n",
        f"install -d -m 0700 {CONFIG_DIR}\n",
        _file(NODE_COMMAND, _read(NODE_SCRIPTS / "vllm-cluster-node"), "0755"),
        _file(f"{BIN_DIR}/ray-cluster-check", _read(NODE_SCRIPTS / "ray-cluster-check"), "0755"),
        _file(f"{BIN_DIR}/preflight-check", _read(NODE_SCRIPTS / "preflight-check"), "0755"),
        _file(f"{BIN_DIR}/vllm-watchdog-check", _read(NODE_SCRIPTS / "vllm-watchdog-check"), "0755"),
    ]
    for unit in NODE_UNITS:
        parts.append(_file(f"/etc/systemd/system/{unit}", _read(NODE_SCRIPTS / "units" / unit), "0644"))
    parts.append(_file(CLUSTER_ENV, cluster_env(boot), "0600"))
    parts.append(f"exec {NODE_COMMAND} setup\n")
    return "".join(parts)


def gateway_user_data() -> str:
    """The gateway's first-boot script: install nginx and the gateway command. The
    certificate, its key and the site come later through the stack's commands."""
    return "".join(
        [
            "#!/bin/bash\n",
            "# vllm-cluster gateway bootstrap, generated by components/bootstrap.py.\n",
            "# Safe to run again: every step skips what is already in place.\n",
            "set -euo pipefail\numask 022\n",
            _file(GATEWAY_COMMAND, _read(GATEWAY_SCRIPTS / "vllm-cluster-gateway"), "0755"),
            f"exec {GATEWAY_COMMAND} setup\n",
        ]
    )


# --- vLLM --------------------------------------------------------------------------


def model_directory(model: str, revision: str) -> str:
    """The model's directory on the shared model cache: the same path on every node."""
    return f"{MODEL_ROOT}/models/{model}/{revision}"


def served_model_name(spec: ClusterSpec) -> str:
    return spec.served_model_name or spec.model


def _number(value: float) -> str:
    return f"{value:g}"


def vllm_serve_args(spec: ClusterSpec, head_ip: str) -> list[str]:
    """Everything after `vllm serve` on the head, in order. The planner prints this
    same list; the head runs it through vllm.env. The API key is not here: vLLM reads
    VLLM_API_KEY from a root-only env file."""
    args = [
        model_directory(spec.model, spec.model_revision),
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


def vllm_env(spec: ClusterSpec, head_ip: str, node_ips: list[str]) -> str:
    """/etc/vllm-cluster/vllm.env on the head: the serve arguments and the cluster
    vLLM must see before it starts (every node by name and IP, every GPU)."""
    expected = ",".join(f"{node_name(i)}={ip}" for i, ip in enumerate(node_ips))
    return env_file(
        {
            "VLLM_SERVE_ARGS": " ".join(vllm_serve_args(spec, head_ip)),
            "SERVED_MODEL_NAME": served_model_name(spec),
            "EXPECTED_NODES": expected,
            "EXPECTED_GPUS": str(spec.nodes * spec.gpus_per_node),
            # The model is staged on the cache before vLLM starts: never download at serve time.
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        },
        header="Written by vllm-cluster-node start-vllm from the stack. Changing it restarts vLLM only.",
    )


# --- gateway -----------------------------------------------------------------------


def nginx_site(
    head_ip: str,
    admin_cidrs: tuple[str, ...],
    cert_path: str = f"{TLS_DIR}/cert.pem",
    key_path: str = f"{TLS_DIR}/key.pem",
) -> str:
    """The gateway's nginx site (an http-context file for conf.d): TLS on the API
    port with an allowlist of routes, a body limit and a per-client rate limit, and
    the Ray dashboard on the admin port for adminCidrs only."""
    api_locations = "".join(
        f"""
    location = {route} {{
        limit_req zone=vllm_api burst={RATE_LIMIT_BURST} nodelay;
        proxy_pass http://vllm_api;
    }}
"""
        for route in API_ROUTES
    )
    admin_allow = "".join(f"    allow {cidr};\n" for cidr in admin_cidrs)
    # TLS settings go in each server block: the distribution's nginx.conf already sets
    # ssl_protocols in the http block, and a second one there is an error.
    tls = f"""    ssl_certificate {cert_path};
    ssl_certificate_key {key_path};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:vllm_tls:10m;
    server_tokens off;
"""
    return f"""# vllm-cluster gateway, generated by components/bootstrap.py. Do not edit on the host:
# the next `pulumi up` writes it again. Included in nginx.conf's http block (conf.d).

limit_req_zone $binary_remote_addr zone=vllm_api:10m rate={RATE_LIMIT_PER_SECOND}r/s;

upstream vllm_api {{
    server {head_ip}:{ports.VLLM_API};
    keepalive 16;
}}

upstream ray_dashboard {{
    server {head_ip}:{ports.RAY_DASHBOARD};
}}

# The OpenAI-compatible API: only the allowlisted routes reach vLLM.
server {{
    listen {ports.API_HTTPS} ssl;
    listen [::]:{ports.API_HTTPS} ssl;
    server_name _;
{tls}
    client_max_body_size {MAX_REQUEST_BODY};
    limit_req_status 429;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header X-Forwarded-For $remote_addr;
    # Streaming responses (server-sent events) must not wait in a buffer.
    proxy_buffering off;
    proxy_read_timeout 600s;
{api_locations}
    location / {{
        return 404;
    }}
}}

# The Ray dashboard (also Ray's Jobs API, which runs code): admins only. The
# security group admits adminCidrs alone; nginx checks again, and Ray asks for its token.
server {{
    listen {ports.DASHBOARD_HTTPS} ssl;
    listen [::]:{ports.DASHBOARD_HTTPS} ssl;
    server_name _;
{tls}
{admin_allow}    deny all;

    location / {{
        proxy_pass http://ray_dashboard;
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection "upgrade";
        proxy_read_timeout 300s;
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


