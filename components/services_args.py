"""What the services' commands (components/services.py) are given, grouped by who reads
it: the gateway's commands (GatewayServiceArgs), every node's bootstrap (NodesArgs), the
model and its serving (ModelServingArgs) and idle stop with the warm gangs
(IdleStopArgs). Plain values and Inputs: no spec, no callback. Each step takes the
records it reads, so what a step depends on shows in its signature.

Imported by services.py and by the modules of its steps (remote_commands.py,
gateway_commands.py, node_commands.py); it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pulumi

from components import bootstrap, fabric
from components.compute import NodeBootArgs
from components.spec import Secret
from components.topology import gang_name, gang_prefix, node_name


@dataclass
class ServingGang:
    """One gang's hosts and its head's vllm.env (services.vllm_settings)."""

    index: int
    node_ips: Sequence[pulumi.Output[str]]  # head first; one per node
    # The instances: a command starts after its host exists.
    instances: Sequence[pulumi.Resource]
    vllm_settings: pulumi.Input[str]
    # The gang's own Ray token (components/credentials.py): its nodes and nothing else.
    ray_token: pulumi.Output[str]
    # Each node's SSH host key (authorized_keys form), head first: every connection pins it.
    host_keys: Sequence[pulumi.Input[str]]

    @property
    def name(self) -> str:
        return gang_name(self.index)

    def node(self, index: int) -> str:
        return node_name(index, self.index)

    def command(self, step: str) -> str:
        """A gang-wide command's resource name: gang 0's as before replicas."""
        return gang_prefix(self.index) + step


@dataclass
class GatewayServiceArgs:
    """The gateway: how its commands reach it, its setup, TLS and site, the clients' keys
    and Prometheus on it."""

    # Its addresses, and its SSH host key, which every connection to it (and through it) pins.
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    host_key: pulumi.Input[str]
    # The gateway's instance and address: its commands start after both exist.
    instances: Sequence[pulumi.Resource]

    # The gateway proxy: its setup script (its first boot's steps, with the commented
    # gateway command: bootstrap.gateway_setup_script), TLS and site.
    setup_script: str
    tls_certificate_pem: pulumi.Output[str]
    tls_private_key_pem: pulumi.Output[str]
    tls_self_signed: bool
    endpoint_host: pulumi.Output[str]
    admin_cidrs: tuple[str, ...]
    api_read_timeout_seconds: int
    api_rate_limit_per_second: int
    api_max_requests_in_flight_per_key: int
    api_max_requests_in_flight_per_address: int
    # What the gateway's nginx holds (components/gateway_capacity.py): worker_connections
    # and worker_rlimit_nofile for nginx.conf, the upstream's idle keep-alive pool.
    gateway_connections: int
    gateway_open_files: int
    upstream_keepalive: int
    # The clients' keys, checked at the gateway: apiKey and, while clients move over,
    # previousApiKey; and the routes it forwards (spec.api_routes).
    api_key: pulumi.Output[str]
    previous_api_key: pulumi.Output[str] | None
    api_routes: tuple[str, ...]
    login_probe_private_key: pulumi.Output[str]
    # Prometheus on the gateway: its login's password (components/credentials.py), and
    # the gateway's root volume its retention is sized by.
    metrics_password: pulumi.Output[str]
    disk_gib: int


@dataclass
class NodesArgs:
    """The GPU nodes: every gang, what each node booted with, and the secrets its setup
    gives it."""

    # Every gang, gang 0 first; one unless the stack has replicas.
    gangs: Sequence[ServingGang]
    # The node bootstrap: what each node was told at boot (setup sends it again).
    boot: NodeBootArgs
    # The key the heads' vLLM checks, which only the gateway sends, and the key the heads'
    # readiness check sends through the gateway (credentials.py).
    heads_api_key: pulumi.Output[str]
    probe_api_key: pulumi.Output[str]
    hf_token: Secret | None

    @property
    def rolling(self) -> bool:
        """Restarts roll gang by gang through the gateway's pool; with one gang there
        is nothing to roll over, and the stack declares what it did before replicas."""
        return len(self.gangs) > 1

    def environment(self) -> list:
        """A new Ray, or any change of the locked environment, restarts Ray (start-ray
        restarts a unit that started before the environment last changed)."""
        return [self.boot.ray_version, bootstrap.lock_digest(self.boot.node_lock)]

    def restarts(self, gang: ServingGang) -> list:
        """Every input whose change restarts the gang's Ray or vLLM: its drain and its
        return to the pool run again with any of them. The secrets too: install-secrets
        restarts Ray for a new Ray token (and vLLM with it) and vLLM for a new API key."""
        return [
            *self.environment(),
            self.boot.vllm_version,
            gang.vllm_settings,
            pulumi.Output.secret(self.heads_api_key),
            pulumi.Output.secret(gang.ray_token),
            *gang.node_ips,
        ]


@dataclass
class ModelServingArgs:
    """The model and its serving: what is staged, what preflight expects, how vLLM
    starts and how long a gang's restart may take."""

    model: str
    # The head's start-vllm with the stack's probe (bootstrap.start_vllm_command): the
    # request of the model's task that readiness, the watchdog and status send.
    start_vllm_command: str
    model_revision: str
    hf_endpoint: str | None
    gpu_memory_gib: float
    efa_interfaces: int
    engine_ready_timeout_seconds: int
    # Where vLLM reads the model on every node (bootstrap.serving_directory): each node's
    # stage on its own disk, copied by its prepare command, or the shared cache itself.
    serving_dir: str
    serves_from_local_disk: bool
    tensor_parallel: int
    pipeline_parallel: int
    # vLLM's compile cache on the shared cache is kept under this (bootstrap.warmup_key).
    warmup_key: str
    # The fabric gate (components/fabric.py): how each node measures the gang's all-reduce,
    # None for gangs of one node (no fabric between nodes); the floor its bus bandwidth
    # must reach.
    fabric_measurement: fabric.Measurement | None = None
    fabric_floor: fabric.Floor | None = None


@dataclass
class IdleStopArgs:
    """Idle stop (idleStopMinutes, components/idle_stop.py) and the warm gangs
    (maxReplicas, issue 36)."""

    # The minutes (0: off), and the waker's configuration (JSON) for the gateway, with
    # minutes only. None: a stack whose machines nothing could start again (the user's own
    # hosts), with no idle commands.
    minutes: int | None = None
    waker_config: pulumi.Input[str] | None = None
    # With minutes: how long a boot whose engine never answers keeps a node up
    # (idle_stop.never_served_grace_seconds: past the waker's give-up bound).
    never_served_grace_seconds: int = 0
    # Warm gangs: the first `replicas` gangs always serve and never stop for idleness
    # (idle_stop.gang_idle_minutes); the others (NodesArgs.gangs holds every declared
    # gang) are parked by the stack's last command. None: every gang as minutes, nothing
    # parked.
    replicas: int | None = None
    max_replicas: int | None = None


@dataclass
class ServicesArgs:
    """Everything the services' commands are given, one record per reader."""

    # How the commands reach the hosts: the gateway, and through it the nodes.
    ssh_private_key: pulumi.Output[str]
    gateway: GatewayServiceArgs
    nodes: NodesArgs
    serving: ModelServingArgs
    idle_stop: IdleStopArgs = field(default_factory=IdleStopArgs)
