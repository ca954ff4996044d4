"""The services on the hosts, brought up over SSH by remote commands, in order:

  the gateway waits until each node accepts logins (with its login probe)
    -> every node's setup (scripts, units, model cache, software; converges)
    -> secrets into root-only files -> Ray head -> every Ray worker, in parallel
    -> cluster ready (every node and GPU) -> model staged on the cache
    -> preflight (every node's facts, compared on the head)
    -> the fabric gate (a gang of several nodes: every node's share of one all-reduce
    over the gang's GPUs at once, the head's bus bandwidth held to a floor) -> vLLM started
    -> the gang's head into the gateway's pool -> readiness: the stack's probe (a real
    request of the model's task, components/api_routes.py) through the gateway.
  The gateway: setup -> login probe key -> (waits for the nodes); certificate and
  key -> nginx site (the gang pool). With warm gangs (maxReplicas above replicas) every
  gang goes through all of the above, and then, last of all, the gateway parks the warm
  ones (drained and stopped by its waker), so that a later wake is only a power-on.

Replacing nodes is blue/green. A launch-template change replaces every GPU node, and
Pulumi creates the new instances first and deletes the old ones at the end of `pulumi
up`: the old heads serve meanwhile. The pool keeps a gang at its old head until the new
one has passed start-vllm's probe: with one gang the nginx site and pool are
configured after vLLM started; with replicas the site is configured first (the drains
need it) and keeps a replaced gang's old head (vllm-cluster-gateway configure), the
gang's drain names its new head and takes nothing out, and its return after its vLLM
switches the gang to the new head, one gang at a time. Readiness follows the switch.
With reserved capacity the old node goes first (compute.py, replacement_notice): no
blue/green there, and the preview says the service is down.

With several replicas every gang (a head and its workers) goes through the node
steps above on its own, and the model is staged once. A gang's steps start with
its drain on the gateway and its vLLM ends with its return to the pool: the
gateway's rolling lease lets one serving gang out at a time while another serves,
so a day-2 change that restarts Ray or vLLM rolls over the gangs one after the
other and fails no request (scripts/gateway/vllm-cluster-gateway drain). On the
first `pulumi up` no gang serves yet: nothing waits, every gang starts at once.

Every command runs one idempotent subcommand of scripts/node/vllm-cluster-node or
scripts/gateway/vllm-cluster-gateway, so re-running one by hand converges. A
command runs again only when its own inputs change (its command line, its stdin or
its triggers), which is what makes day-2 changes precise: a new model or new vLLM
settings re-run the model and vLLM commands and nothing of Ray. Secrets travel on
stdin (secret in state), never in a command line or the user data.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_command as command

from components import bootstrap, fabric, idle_stop, image, metrics, ports
from components.bootstrap import GATEWAY_COMMAND, LOGIN_READY_WORD, NODE_COMMAND
from components.compute import NodeBootArgs, node_boot
from components.spec import ClusterSpec, Secret
from components.topology import gang_name, gang_prefix, node_name, writes_model_tree

# The default user of the Deep Learning AMI and of Ubuntu's own images.
SSH_USER = image.DEFAULT_USER
# GPU instances can take many minutes from launch to sshd (capacity, EFA, driver
# init); pulumi-command's default of 10 x 15 s gives up too early.
DIAL_ERROR_LIMIT = 80
PER_DIAL_TIMEOUT_SECONDS = 15

# How long the node scripts wait for each stage before failing with a diagnosis.
CLUSTER_READY_TIMEOUT_SECONDS = 900
# start-vllm's own bound beyond the engine's start timeout: vllm.service's wait for the
# cluster (30 min) and a margin (scripts/node/vllm-cluster-node cmd_start_vllm).
START_VLLM_MARGIN_SECONDS = 1800 + 300
# What a gang's setup may take before its Ray starts: installing a new lock from the
# wheelhouse (sizing: minutes), staging a new model onto the cache (gang 0's turn).
GANG_SETUP_ALLOWANCE_SECONDS = 3600
# From launch to a node that accepts logins: boot, /run/nologin, cloud-init's start.
LOGIN_TIMEOUT_SECONDS = 1200
READINESS_TIMEOUT_SECONDS = 900

# Secret stdin must not come back through logs or plain outputs.
QUIET = dict(logging=command.remote.Logging.NONE)
SECRET_OUTPUTS = ["stdout", "stderr"]


@dataclass
class ServingGang:
    """One gang's hosts and its head's vllm.env (vllm_settings below)."""

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
class ServicesArgs:
    """Plain values and Inputs (no spec, no callback), grouped by the step that uses them."""

    # How the commands reach the hosts, and the gateway's SSH host key they pin.
    ssh_private_key: pulumi.Output[str]
    gateway_public_ip: pulumi.Output[str]
    gateway_private_ip: pulumi.Output[str]
    gateway_host_key: pulumi.Input[str]
    # Every gang, gang 0 first; one unless the stack has replicas.
    gangs: Sequence[ServingGang]
    # The gateway's instance and address: its commands start after both exist.
    gateway: Sequence[pulumi.Resource]

    # The gateway proxy: its setup script (its first boot's steps, with the commented
    # gateway command: bootstrap.gateway_setup_script), TLS and site.
    gateway_setup_script: str
    tls_certificate_pem: pulumi.Output[str]
    tls_private_key_pem: pulumi.Output[str]
    tls_self_signed: bool
    endpoint_host: pulumi.Output[str]
    admin_cidrs: tuple[str, ...]
    api_read_timeout_seconds: int
    api_rate_limit_per_second: int
    # The clients' keys, checked at the gateway: apiKey and, while clients move over,
    # previousApiKey; and the routes it forwards (spec.api_routes).
    api_key: pulumi.Output[str]
    previous_api_key: pulumi.Output[str] | None
    api_routes: tuple[str, ...]
    login_probe_private_key: pulumi.Output[str]
    # Prometheus on the gateway: its login's password (components/credentials.py), and
    # the gateway's root volume its retention is sized by.
    metrics_password: pulumi.Output[str]
    gateway_disk_gib: int

    # The node bootstrap: what each node was told at boot (setup sends it again) and its secrets.
    node_boot: NodeBootArgs
    # The key the heads' vLLM checks, which only the gateway sends, and the key the heads'
    # readiness check sends through the gateway (credentials.py).
    heads_api_key: pulumi.Output[str]
    probe_api_key: pulumi.Output[str]
    hf_token: Secret | None

    # Serving: the model, what preflight expects, and how long a gang's restart may take.
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

    # Idle stop (idleStopMinutes, components/idle_stop.py): the minutes (0: off), and the
    # waker's configuration (JSON) for the gateway, with minutes only. None: a stack whose
    # machines nothing could start again (the user's own hosts), with no idle commands.
    idle_stop_minutes: int | None = None
    waker_config: pulumi.Input[str] | None = None
    # With minutes: how long a boot whose engine never answers keeps a node up
    # (idle_stop.never_served_grace_seconds: past the waker's give-up bound).
    never_served_grace_seconds: int = 0
    # Warm gangs (maxReplicas, issue 36): the first `replicas` gangs always serve and never
    # stop for idleness (idle_stop.gang_idle_minutes); the others (`gangs` holds every
    # declared gang) are parked by the stack's last command. None: every gang as
    # idle_stop_minutes, nothing parked.
    replicas: int | None = None
    max_replicas: int | None = None

    @property
    def rolling(self) -> bool:
        """Restarts roll gang by gang through the gateway's pool; with one gang there
        is nothing to roll over, and the stack declares what it did before replicas."""
        return len(self.gangs) > 1


def vllm_settings(spec: ClusterSpec, node_ips: Sequence[pulumi.Input[str]], gang: int = 0) -> pulumi.Output[str]:
    """/etc/vllm-cluster/vllm.env for a gang's head (bootstrap.vllm_env), from the spec
    and every node's private IP in the gang, head first."""
    return pulumi.Output.all(*node_ips).apply(lambda ips: bootstrap.vllm_env(spec, ips[0], list(ips), gang))


def dial(host: pulumi.Input[str], key: pulumi.Input[str], user: str, host_key: pulumi.Input[str]) -> dict:
    """How pulumi-command reaches `host`: as `user` with the stack's `key`, accepting only
    `host_key` from it (authorized_keys form: pulumi-command's FixedHostKey, which also
    offers the server only that key's algorithm)."""
    return {
        "host": host,
        "user": user,
        "private_key": key,
        "host_key": host_key,
        "dial_error_limit": DIAL_ERROR_LIMIT,
        "per_dial_timeout": PER_DIAL_TIMEOUT_SECONDS,
    }


def node_secrets(
    ray_token: str, api_key: str, hf_token: str | None, is_head: bool, downloads: bool, probe_key: str
) -> str:
    """The NAME=value lines `vllm-cluster-node install-secrets` reads on stdin. Only
    the head gets API keys: the heads' own, which its vLLM checks, and the gateway probe
    key its readiness check sends through the gateway (never a client's); only the nodes
    that download a part of the model (gang 0's, stage-model --part) get the Hugging Face
    token."""
    lines = [f"RAY_AUTH_TOKEN={ray_token}"]
    if is_head:
        lines.append(f"VLLM_API_KEY={api_key}")
        lines.append(f"GATEWAY_PROBE_KEY={probe_key}")
    if downloads and hf_token:
        lines.append(f"HF_TOKEN={hf_token}")
    return "\n".join(lines) + "\n"


def gateway_api_keys(
    api_key: pulumi.Input[str],
    previous_api_key: pulumi.Input[str] | None,
    probe_api_key: pulumi.Input[str],
    heads_api_key: pulumi.Input[str],
) -> pulumi.Output[str]:
    """What `vllm-cluster-gateway install-api-keys` reads on stdin: nginx's maps of the
    keys the gateway accepts (the clients' apiKey and previousApiKey, the heads' probe
    key) and of the heads' key (bootstrap.api_keys_conf). Secret."""
    return pulumi.Output.secret(
        pulumi.Output.all(api_key, previous_api_key, probe_api_key, heads_api_key).apply(
            lambda keys: bootstrap.api_keys_conf(
                {"current": keys[0], **({"previous": keys[1]} if keys[1] else {}), "probe": keys[2]}, keys[3]
            )
        )
    )


def tls_bundle(private_key_pem: pulumi.Input[str], certificate_pem: pulumi.Input[str]) -> pulumi.Output[str]:
    """The key then the certificate, as `vllm-cluster-gateway install-tls` reads them.
    `pulumi config set < key.pem` drops the final newline: keep the PEM blocks apart."""
    return pulumi.Output.secret(
        pulumi.Output.all(private_key_pem, certificate_pem).apply(
            lambda pems: pems[0].rstrip("\n") + "\n" + pems[1].rstrip("\n") + "\n"
        )
    )


@dataclass
class GatewayCommands:
    setup: command.remote.Command  # the gateway's scripts are installed
    tls: command.remote.Command  # the certificate and key are in place
    login_probe: command.remote.Command  # the probe key is installed: the gateway can wait for nodes
    api_keys: command.remote.Command  # the keys nginx checks are in place (the site includes them)
    # Prometheus's files and flags: it listens on loopback, so the site's listener for the
    # nodes may take its port on the private address (_pool waits for it).
    metrics: command.remote.Command
    # nginx serves the API and the dashboard with TLS. With replicas, declared before the
    # gangs (their drains need the pool); with one gang, after its vLLM (see _serving).
    proxy: command.remote.Command | None = None


@dataclass
class NodeCommands:
    """One node's bootstrap, as the steps after it wait for it."""

    setup: command.remote.Command
    secrets: command.remote.Command


@dataclass
class RayCommands:
    nodes: list[command.remote.Command]  # Ray started, head first
    cluster_ready: command.remote.Command  # every node and GPU joined


class ClusterServices(pulumi.ComponentResource):
    """The remote commands of the module docstring, declared in steps: the gateway
    proxy, then per gang its drain (with replicas), each node's bootstrap, Ray and
    serving. Each step takes what it waits for from the one before and returns what
    the next waits for."""

    # The readiness commands' report: the stack's probe went through the gateway.
    readiness: pulumi.Output[str]

    def __init__(self, name: str, args: ServicesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:ClusterServices", name, None, opts)
        self._name = name
        self._ssh_key = args.ssh_private_key
        # The image's user on AWS; sshUser on hosts the user has.
        self._user = args.node_boot.login_user
        self._gateway_dial = dial(args.gateway_public_ip, args.ssh_private_key, self._user, args.gateway_host_key)

        # A new gateway instance keeps its Elastic IP, so the commands that set it up
        # would see no change of their inputs and leave the new host bare: they re-run
        # with the instance.
        self._gateway_triggers = [resource.id for resource in args.gateway]
        # Every command declared, and every gang's readiness triggers: the park command
        # (warm gangs) comes after all of them and re-runs with any of the latter.
        self._commands: list[command.remote.Command] = []
        self._readiness_triggers: list = []
        gateway = self._gateway_proxy(args)
        model = None
        drained = None
        reports = []
        for gang in args.gangs:
            if args.rolling:
                drained = self._drain(args, gang, [gateway.proxy, *([drained] if drained is not None else [])])
            nodes = self._node_bootstrap(args, gang, gateway.login_probe, drained)
            if args.idle_stop_minutes is not None:
                self._idle_stop(args, gang, nodes)
            ray = self._ray(args, gang, nodes)
            if model is None:
                # Once for every gang: the model cache is shared.
                model = self._stage_model(args, gang, nodes, ray)
            reports.append(self._serving(args, gang, nodes, ray, model, gateway).stdout)
        if args.idle_stop_minutes:
            self._waker(args, gateway)
        if idle_stop.scales(args.replicas, args.max_replicas):
            self._park(args)
        self.readiness = (
            reports[0]
            if len(reports) == 1
            else pulumi.Output.all(*reports).apply(lambda lines: "\n".join(line for line in lines if line))
        )
        self.register_outputs({"readiness": self.readiness})

    # --- how a command reaches its host ---------------------------------------------------

    def _on_gateway(self) -> command.remote.ConnectionArgs:
        return command.remote.ConnectionArgs(**self._gateway_dial)

    def _on_node(self, gang: ServingGang, index: int) -> command.remote.ConnectionArgs:
        # The nodes have no public IP: every session is tunnelled through the gateway. Both
        # hops pin their host's key (components/host_keys.py).
        return command.remote.ConnectionArgs(
            **dial(gang.node_ips[index], self._ssh_key, self._user, gang.host_keys[index]),
            proxy=command.remote.ProxyConnectionArgs(**self._gateway_dial),
        )

    def _run(
        self,
        resource: str,
        connection: command.remote.ConnectionArgs,
        create: pulumi.Input[str],
        *,
        stdin: pulumi.Input[str] | None = None,
        after: Sequence[pulumi.Resource] = (),
        triggers: list | None = None,
        secret: bool = False,
        delete: str | None = None,
    ) -> command.remote.Command:
        """One remote command. Its name is part of the fleet's replay and of the deployed
        stacks' URNs: do not rename one without an alias."""
        declared = command.remote.Command(
            f"{self._name}-{resource}",
            connection=connection,
            create=create,
            delete=delete,
            stdin=stdin,
            triggers=triggers,
            # PULUMI_COMMAND_STDOUT of the previous run must not be replayed into the next.
            add_previous_output_in_env=False,
            **(QUIET if secret else {}),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=list(after),
                additional_secret_outputs=SECRET_OUTPUTS if secret else None,
            ),
        )
        self._commands.append(declared)
        return declared

    # --- what restarts a gang's Ray or vLLM -----------------------------------------------

    @staticmethod
    def _environment(args: ServicesArgs) -> list:
        """A new Ray, or any change of the locked environment, restarts Ray (start-ray
        restarts a unit that started before the environment last changed)."""
        return [args.node_boot.ray_version, bootstrap.lock_digest(args.node_boot.node_lock)]

    def _restarts(self, args: ServicesArgs, gang: ServingGang) -> list:
        """Every input whose change restarts the gang's Ray or vLLM: its drain and its
        return to the pool run again with any of them. The secrets too: install-secrets
        restarts Ray for a new Ray token (and vLLM with it) and vLLM for a new API key."""
        return [
            *self._environment(args),
            args.node_boot.vllm_version,
            gang.vllm_settings,
            pulumi.Output.secret(args.heads_api_key),
            pulumi.Output.secret(gang.ray_token),
            *gang.node_ips,
        ]

    @staticmethod
    def _head_address(gang: ServingGang) -> pulumi.Output[str]:
        """IP:PORT of the gang's head's vLLM, as the gateway's pool holds it."""
        return pulumi.Output.from_input(gang.node_ips[0]).apply(lambda ip: f"{ip}:{ports.VLLM_API}")

    def _drain_line(self, args: ServicesArgs, gang: ServingGang) -> pulumi.Output[str]:
        """The gateway command that takes the gang out of the pool. A serving gang waits
        for the rolling lease, which the gang before it holds until it serves again: the
        wait covers one gang's whole turn (setup, Ray, preflight, vLLM's start). It names
        the gang's head: at another address than the pool's (the gang replaced), the old
        head keeps serving and nothing is taken out."""
        wait = (
            GANG_SETUP_ALLOWANCE_SECONDS
            + CLUSTER_READY_TIMEOUT_SECONDS
            + args.engine_ready_timeout_seconds
            + START_VLLM_MARGIN_SECONDS
        )
        return pulumi.Output.concat(
            f"sudo {GATEWAY_COMMAND} drain --gang {gang.name} --address ",
            self._head_address(gang),
            f" --timeout {args.api_read_timeout_seconds} --wait {wait}",
        )

    # --- the steps ------------------------------------------------------------------------

    def _gateway_proxy(self, args: ServicesArgs) -> GatewayCommands:
        """The gateway: its setup, TLS and the login probe key; with replicas also nginx
        in front of the gangs' heads (with one gang that waits for its vLLM: _pool)."""
        setup = self._run(
            "gateway-setup",
            self._on_gateway(),
            "sudo bash -s",
            stdin=args.gateway_setup_script,
            after=args.gateway,
            triggers=self._gateway_triggers,
        )
        tls = self._run(
            "gateway-tls",
            self._on_gateway(),
            f"sudo {GATEWAY_COMMAND} install-tls",
            stdin=tls_bundle(args.tls_private_key_pem, args.tls_certificate_pem),
            after=[setup],
            secret=True,
            triggers=self._gateway_triggers,
        )
        # The gateway's login probe: pulumi-command retries a refused login on the same
        # tunnelled connection, so a node still booting (/run/nologin) would fail its
        # first command at once. The gateway waits for each node with this key first.
        login_probe = self._run(
            "gateway-login-probe",
            self._on_gateway(),
            f"sudo {GATEWAY_COMMAND} install-login-probe",
            stdin=args.login_probe_private_key,
            after=[setup],
            secret=True,
            triggers=self._gateway_triggers,
        )
        prometheus = self._metrics(args, [setup])
        # The keys nginx checks, before the site that names them: a new apiKey or
        # previousApiKey re-runs this command alone (a graceful reload; no vLLM restarts).
        api_keys = self._run(
            "gateway-api-keys",
            self._on_gateway(),
            f"sudo {GATEWAY_COMMAND} install-api-keys",
            stdin=gateway_api_keys(args.api_key, args.previous_api_key, args.probe_api_key, args.heads_api_key),
            after=[setup],
            secret=True,
            triggers=self._gateway_triggers,
        )
        commands = GatewayCommands(setup=setup, tls=tls, login_probe=login_probe, api_keys=api_keys, metrics=prometheus)
        if args.rolling:
            commands.proxy = self._pool(args, [tls, api_keys, prometheus])
        return commands

    def _metrics(self, args: ServicesArgs, after: list[command.remote.Command]) -> command.remote.Command:
        """Prometheus on the gateway (installed by its setup): its configuration, rules,
        flags and login, and the targets: every node of every gang, by private IP. New
        gangs or replaced nodes change only the targets, which Prometheus reads without a
        restart. Only nginx's site waits for it: its listener for the nodes takes
        Prometheus's port on the private address, which a Prometheus still listening on
        every interface (as before issue 33, or as the package starts it) holds."""
        # Each gang's IPs, head first: one list a gang.
        gang_ips = [pulumi.Output.all(*gang.node_ips) for gang in args.gangs]

        def script(values: list) -> str:
            host, password, *ips = values
            gangs = [metrics.scrape_gang(gang.index, ip) for gang, ip in zip(args.gangs, ips, strict=True)]
            login = metrics.htpasswd_line(metrics.METRICS_USER, password)
            files = metrics.gateway_files(
                gangs,
                host,
                args.gateway_disk_gib,
                login,
                waker=bool(args.idle_stop_minutes),
                # With warm gangs: the pool's alert (at maxReplicas and still queueing).
                scaling=idle_stop.scales(args.replicas, args.max_replicas),
            )
            return bootstrap.gateway_metrics_script(files, metrics.ready_url())

        stdin = pulumi.Output.secret(
            pulumi.Output.all(args.endpoint_host, args.metrics_password, *gang_ips).apply(script)
        )
        return self._run(
            "gateway-metrics",
            self._on_gateway(),
            "sudo bash -s",
            stdin=stdin,
            after=after,
            secret=True,
            triggers=self._gateway_triggers,
        )

    def _pool(self, args: ServicesArgs, after: list[command.remote.Command]) -> command.remote.Command:
        """nginx's site and the gangs' pool: with replicas before the gangs, with one
        gang after its vLLM."""
        # The dashboard is gang 0's; the API balances over every gang's head.
        site = pulumi.Output.all(args.gangs[0].node_ips[0], args.gateway_private_ip).apply(
            lambda values: bootstrap.nginx_site(
                values[0],
                args.admin_cidrs,
                read_timeout_seconds=args.api_read_timeout_seconds,
                rate_limit_per_second=args.api_rate_limit_per_second,
                # A request no gang could take goes to the waker, which starts stopped gangs.
                waker=bool(args.idle_stop_minutes),
                api_routes=args.api_routes,
                # The heads' Ray dashboards read Prometheus's query API there.
                nodes_prometheus_ip=values[1],
            )
        )
        pool = pulumi.Output.all(*[gang.node_ips[0] for gang in args.gangs]).apply(
            lambda heads: bootstrap.gateway_gangs({gang.name: ip for gang, ip in zip(args.gangs, heads, strict=True)})
        )
        # With replicas this runs as soon as replaced heads have addresses: a replaced
        # gang keeps its old head (while that serves and the new one does not) until its
        # return switches it. With one gang this runs after its vLLM: the new head is it.
        keep = " --keep-old-heads" if args.rolling else ""
        return self._run(
            "gateway-proxy",
            self._on_gateway(),
            pulumi.Output.concat(f"sudo {GATEWAY_COMMAND} configure{keep} --gangs ", pool),
            stdin=site,
            after=after,
            triggers=self._gateway_triggers,
        )

    def _drain(
        self, args: ServicesArgs, gang: ServingGang, after: list[command.remote.Command]
    ) -> command.remote.Command:
        """Take the gang out of the gateway's pool before anything of it restarts. Each
        drain waits for the previous gang's drain, so the gangs take the rolling lease in
        order: gang 0 first, whose chain stages the model that every gang's preflight
        waits for (a later gang holding the lease first would wait on gang 0, which
        would wait for the lease)."""
        return self._run(
            f"{gang.name}-drain",
            self._on_gateway(),
            self._drain_line(args, gang),
            after=after,
            triggers=self._restarts(args, gang),
        )

    def _node_bootstrap(
        self,
        args: ServicesArgs,
        gang: ServingGang,
        login_probe: command.remote.Command,
        drained: command.remote.Command | None,
    ) -> list[NodeCommands]:
        """Every node of the gang, in parallel: wait (on the gateway) until it accepts
        logins, set it up with what it booted with, then give it its secrets. Head first."""
        hf_token = args.hf_token.reveal() if args.hf_token is not None else None
        head_ip = gang.node_ips[0]
        bootstrapped = []
        for index, (host, instance) in enumerate(zip(gang.node_ips, gang.instances, strict=True)):
            node = gang.node(index)
            accepts_logins = self._run(
                f"login-{node}",
                self._on_gateway(),
                pulumi.Output.concat(
                    f"sudo {GATEWAY_COMMAND} wait-login --host ",
                    host,
                    " --host-key '",
                    gang.host_keys[index],
                    f"' --user {self._user} --expect {LOGIN_READY_WORD} --timeout {LOGIN_TIMEOUT_SECONDS}",
                ),
                after=[login_probe, instance],
            )
            # The head's dashboard reads Prometheus on the gateway, and the host firewall
            # admits the gateway and the gang: their addresses come here, not in the user
            # data (which would make every node wait for the gateway and the others).
            setup_script = pulumi.Output.all(
                node_boot(args.node_boot, index, None if index == 0 else head_ip, gang.index, host),
                args.gateway_private_ip,
                *gang.node_ips,
            ).apply(
                lambda values: bootstrap.node_setup_script(
                    dataclasses.replace(
                        values[0],
                        prometheus_url=metrics.ray_prometheus_host(values[1]),
                        gang_ips=tuple(values[2:]),
                        gateway_ip=values[1],
                    )
                )
            )
            setup = self._run(
                f"setup-{node}",
                self._on_node(gang, index),
                "sudo bash -s",
                stdin=setup_script,
                # A drained gang's setup may install a new environment under its engine.
                after=[instance, accepts_logins, *([drained] if drained is not None else [])],
            )
            lines = pulumi.Output.secret(
                pulumi.Output.all(gang.ray_token, args.heads_api_key, args.probe_api_key).apply(
                    lambda values, is_head=(index == 0): node_secrets(
                        values[0], values[1], hf_token, is_head, downloads=gang.index == 0, probe_key=values[2]
                    )
                )
            )
            secrets = self._run(
                f"secrets-{node}",
                self._on_node(gang, index),
                f"sudo {NODE_COMMAND} install-secrets",
                stdin=lines,
                after=[setup],
                secret=True,
            )
            bootstrapped.append(NodeCommands(setup=setup, secrets=secrets))
        return bootstrapped

    def _ray(self, args: ServicesArgs, gang: ServingGang, nodes: list[NodeCommands]) -> RayCommands:
        """Ray on the gang's head, then on every worker at once; then wait until every
        node and every GPU of the gang has joined."""
        environment = self._environment(args)
        head = self._run(
            f"ray-{gang.node(0)}",
            self._on_node(gang, 0),
            f"sudo {NODE_COMMAND} start-ray",
            after=[nodes[0].setup, nodes[0].secrets],
            triggers=environment,
        )
        workers = [
            self._run(
                f"ray-{gang.node(index)}",
                self._on_node(gang, index),
                f"sudo {NODE_COMMAND} start-ray",
                after=[head, nodes[index].setup, nodes[index].secrets],
                triggers=environment,
            )
            for index in range(1, len(gang.node_ips))
        ]
        ray_nodes = [head, *workers]
        expected = pulumi.Output.all(*gang.node_ips).apply(
            lambda ips: ",".join(f"{gang.node(i)}={ip}" for i, ip in enumerate(ips))
        )
        cluster_ready = self._run(
            gang.command("cluster-ready"),
            self._on_node(gang, 0),
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} wait-cluster --expect ",
                expected,
                f" --gpus {len(gang.node_ips) * args.node_boot.gpus} --timeout {CLUSTER_READY_TIMEOUT_SECONDS}",
            ),
            after=ray_nodes,
            # Whenever a Ray node was (re)started, check the whole cluster again.
            triggers=[node.id for node in ray_nodes],
        )
        return RayCommands(nodes=ray_nodes, cluster_ready=cluster_ready)

    def _idle_stop(self, args: ServicesArgs, gang: ServingGang, nodes: list[NodeCommands]) -> None:
        """Every node of the gang powers itself off after idleStopMinutes without a request
        (vllm-cluster-node idle-check, from a timer this turns on), or never (0). Its own
        command, after the node's setup: a new idleStopMinutes runs it again and nothing
        else, neither Ray nor vLLM. Declared with 0 too, and without a delete: unsetting
        the key turns the timer off by running it again, and `pulumi destroy` never has to
        reach a node, which may be stopped then."""
        minutes = args.idle_stop_minutes
        if minutes and args.replicas is not None:
            # With warm gangs, an always-on gang never stops for idleness.
            minutes = idle_stop.gang_idle_minutes(gang.index, args.replicas, args.max_replicas, minutes)
        for index in range(len(gang.node_ips)):
            self._run(
                f"idle-stop-{gang.node(index)}",
                self._on_node(gang, index),
                f"sudo {NODE_COMMAND} idle-stop-config --minutes {minutes}"
                + (f" --grace-seconds {args.never_served_grace_seconds}" if minutes else ""),
                after=[nodes[index].setup],
                # A replaced node is a new machine: it needs its timer turned on again.
                triggers=[gang.instances[index].id],
            )

    def _waker(self, args: ServicesArgs, gateway: GatewayCommands) -> command.remote.Command:
        """The gateway's waker: its script and unit (not in the gateway's user data, which
        is near EC2's 16 KiB already), then `vllm-cluster-gateway waker-config` with which
        instances each gang has, where EC2 is and how long a wake takes (JSON,
        bootstrap.gateway_waker_script). After the gateway's setup and every node's instance
        (their ids are in it). Deleting it (the key unset) stops the waker and removes its
        configuration; the gateway is up whenever `pulumi up` or destroy runs."""
        instances = [instance for gang in args.gangs for instance in gang.instances]
        return self._run(
            "gateway-waker",
            self._on_gateway(),
            "sudo bash -s",
            delete=f"sudo {GATEWAY_COMMAND} waker-config --off",
            stdin=pulumi.Output.from_input(args.waker_config).apply(bootstrap.gateway_waker_script),
            after=[gateway.setup, *instances],
            triggers=self._gateway_triggers,
        )

    def _park(self, args: ServicesArgs) -> command.remote.Command:
        """Warm gangs (maxReplicas, issue 36): the stack creates, sets up and readies every
        gang, so that a later wake is only a power-on, then parks the warm ones: `park`
        asks the gateway's waker to drain and stop every warm gang with no request running
        or waiting (scripts/gateway/vllm-cluster-gateway). The stack's last command: after
        every other one (no command may find a warm gang stopped under it), and again
        whenever any gang's readiness check ran again (the same triggers; scripts/deploy
        starts the stack's stopped gangs before `pulumi up` reaches them) or the gateway
        was replaced (a fresh waker). No delete: destroy has nothing to park."""
        return self._run(
            "gateway-park",
            self._on_gateway(),
            f"sudo {GATEWAY_COMMAND} park",
            after=list(self._commands),
            triggers=[*self._readiness_triggers, *self._gateway_triggers],
        )

    def _stage_model(
        self, args: ServicesArgs, gang: ServingGang, nodes: list[NodeCommands], ray: RayCommands
    ) -> command.remote.Command:
        """The model onto the shared cache, by gang 0's nodes at once: each downloads a
        disjoint share of its files (part I of N), and the head's part, which returns the
        command every gang waits for, completes and checks the whole."""
        parts = len(gang.node_ips)

        def stage(index: int) -> str:
            return (
                f"sudo {NODE_COMMAND} stage-model --model {args.model} --revision {args.model_revision}"
                + (f" --hub {args.hf_endpoint}" if args.hf_endpoint else "")
                + (f" --part {index} --parts {parts}" if parts > 1 else "")
            )

        for index in range(1, parts):
            self._run(
                f"model-part-{gang.node(index)}",
                self._on_node(gang, index),
                stage(index),
                after=[nodes[index].setup, nodes[index].secrets],
            )
        return self._run(
            "model",
            self._on_node(gang, 0),
            stage(0),
            # Not after the other parts: the head downloads its own meanwhile and waits
            # for theirs, so a part that fails fails its own command, naming its node.
            after=[ray.cluster_ready, nodes[0].secrets],
        )

    def _prepare(
        self, args: ServicesArgs, gang: ServingGang, nodes: list[NodeCommands], model: command.remote.Command
    ) -> list[command.remote.Command]:
        """On every node of the gang: its pipeline stages of the staged model copied to
        its own disk (when the stack serves from local disk) and vLLM's compile cache
        seeded from the shared cache. A replaced node (a new instance) does it again.
        Gang 0's nodes, which download the model, copy their stages while it lands
        (--model-landing: each file as soon as it is on the cache, hashed as it is copied),
        so the download and the copy overlap; later gangs copy the staged model."""
        local = ""
        landing = writes_model_tree(gang.index) and args.serves_from_local_disk
        if args.serves_from_local_disk:
            local = pulumi.Output.all(*gang.node_ips).apply(
                lambda ips: (
                    f" --local-dir {args.serving_dir} --gang-ips {','.join(ips)}"
                    f" --tp {args.tensor_parallel} --pp {args.pipeline_parallel}"
                    + (" --model-landing true" if landing else "")
                )
            )
        model_dir = bootstrap.model_directory(args.model, args.model_revision)
        return [
            self._run(
                f"prepare-{gang.node(index)}",
                self._on_node(gang, index),
                pulumi.Output.concat(
                    f"sudo {NODE_COMMAND} prepare-serve --model-dir {model_dir} --warmup-key {args.warmup_key}", local
                ),
                # Gang 0's: not after the model's command (its head's stage-model, which
                # returns once the whole model is checked) but beside it; vLLM starts after both.
                after=[nodes[index].setup] if landing else [model, nodes[index].setup],
                triggers=[gang.instances[index].id],
            )
            for index in range(len(gang.node_ips))
        ]

    def _serving(
        self,
        args: ServicesArgs,
        gang: ServingGang,
        nodes: list[NodeCommands],
        ray: RayCommands,
        model: command.remote.Command,
        gateway: GatewayCommands,
    ) -> command.remote.Command:
        """Preflight, vLLM (start-vllm keeps the stack's probe and returns once it
        succeeded on the gang's head), the gang's head into the pool (its return with
        replicas, the pool's configure with one gang: the switch to a replaced head), then
        the probe through the gateway: returns that last command, the readiness check."""
        on_head = self._on_node(gang, 0)
        # Restarted Ray nodes take vLLM's workers with them, and a new vLLM version
        # needs a restart: then check (and if need be restart) vLLM again.
        vllm_restarts = [
            args.node_boot.vllm_version,
            bootstrap.lock_digest(args.node_boot.node_lock),
            *[node.id for node in ray.nodes],
        ]
        prepared = self._prepare(args, gang, nodes, model)
        preflight = self._preflight(args, gang, prepared, ray, vllm_restarts, model)
        gate = self._fabric_gate(args, gang, ray, preflight)
        serve = self._run(
            gang.command("vllm"),
            on_head,
            args.start_vllm_command,
            stdin=gang.vllm_settings,
            after=[model, ray.cluster_ready, preflight, *([gate] if gate is not None else [])],
            triggers=vllm_restarts,
        )
        # Only the nodes that may write the warm-up cache publish to it (gang 0's,
        # topology.writes_model_tree); the other gangs seed from what they compiled.
        for index in range(len(gang.node_ips) if writes_model_tree(gang.index) else 0):
            self._run(
                f"warmup-{gang.node(index)}",
                self._on_node(gang, index),
                f"sudo {NODE_COMMAND} keep-warmup --warmup-key {args.warmup_key}",
                after=[serve],
                # Whenever the engine may have compiled anew on this node.
                triggers=[*vllm_restarts, gang.vllm_settings, prepared[index].id],
            )
        if args.rolling:
            served = self._run(
                f"{gang.name}-return",
                self._on_gateway(),
                pulumi.Output.concat(
                    f"sudo {GATEWAY_COMMAND} return --gang {gang.name} --address ", self._head_address(gang)
                ),
                after=[serve],
                # Whenever the drain ran again, so does the return: a drain whose
                # line alone changed (a new read timeout) must not leave the gang out.
                triggers=[*self._restarts(args, gang), self._drain_line(args, gang)],
            )
        else:
            # The only gang: nothing drains, and the pool's configure runs once its vLLM
            # answered the probe (on the first `pulumi up` nothing serves anyway).
            served = gateway.proxy = self._pool(args, [gateway.tls, gateway.api_keys, gateway.metrics, serve])
        proxy = gateway.proxy if args.rolling else served
        # Check again whenever vLLM may have restarted: new settings, key, version or Ray.
        triggers = [gang.vllm_settings, pulumi.Output.secret(args.heads_api_key), *vllm_restarts]
        self._readiness_triggers += triggers
        return self._run(
            gang.command("readiness"),
            on_head,
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} readiness --gateway ",
                args.gateway_private_ip,
                " --host ",
                args.endpoint_host,
                f" --timeout {READINESS_TIMEOUT_SECONDS}",
            ),
            # A self-signed certificate is the trust anchor; a public one is checked by the system store.
            stdin=args.tls_certificate_pem if args.tls_self_signed else "",
            after=[served, proxy] if args.rolling else [serve, proxy],
            triggers=triggers,
        )

    def _preflight(
        self,
        args: ServicesArgs,
        gang: ServingGang,
        prepared: list[command.remote.Command],
        ray: RayCommands,
        vllm_restarts: list,
        model: command.remote.Command,
    ) -> command.remote.Command:
        """Every node's facts (once it is prepared to serve), then the gang's head
        compares them, so a broken node fails `pulumi up` with a diagnosis before vLLM
        starts. The facts travel as each node's output into the head's input, not over
        the shared cache, which only gang 0's nodes may write (topology.writes_model_tree)."""
        node_count = len(gang.node_ips)
        model_dir = bootstrap.model_directory(args.model, args.model_revision)
        facts = [
            self._run(
                f"preflight-{gang.node(index)}",
                self._on_node(gang, index),
                f"sudo {NODE_COMMAND} preflight-facts --model-dir {model_dir}",
                # After the model too: gang 0's nodes are prepared before the model is whole.
                after=[prepared[index], ray.nodes[index], model],
                triggers=vllm_restarts,
            )
            for index in range(node_count)
        ]
        boot = args.node_boot
        efa_flag = f" --efa {args.efa_interfaces}" if boot.efa else ""
        return self._run(
            gang.command("preflight"),
            self._on_node(gang, 0),
            f"sudo {NODE_COMMAND} preflight --nodes {','.join(gang.node(i) for i in range(node_count))}"
            f" --gpus {boot.gpus} --gpu-memory-gib {args.gpu_memory_gib:g}{efa_flag}"
            f" --ray {boot.ray_version} --vllm {boot.vllm_version}",
            # One line per node: its name and its facts (one line of JSON).
            stdin=pulumi.Output.all(*[fact.stdout for fact in facts]).apply(
                lambda outputs: "".join(
                    f"{gang.node(index)} {(output or '').strip()}\n" for index, output in enumerate(outputs)
                )
            ),
            # Compare again whenever the facts were gathered again.
            after=facts,
            triggers=[*vllm_restarts, model_dir],
        )

    def _fabric_gate(
        self, args: ServicesArgs, gang: ServingGang, ray: RayCommands, preflight: command.remote.Command
    ) -> command.remote.Command | None:
        """The gang's fabric, measured before vLLM starts (components/fabric.py): every
        node runs its share of one all-reduce over the gang's GPUs at once, meeting at the
        head's rendezvous port, once Ray has every node and preflight passed (after the
        model's copy to each node, which would share the network); then the head holds
        the bus bandwidth its rank 0 measured to the floor and fails `pulumi up` below
        it. Measuring and judging are apart: a new floor judges the same figure again,
        and the measurement runs again only with what changes the fabric (a node, Ray, the
        environment), every node's with the others'. Returns the gate; None for a gang of
        one node."""
        if args.fabric_measurement is None or args.fabric_floor is None:
            return None
        node_count = len(gang.node_ips)
        # The same for every node of the gang: their measurements run again together, or
        # a node would wait at the rendezvous for peers that never come.
        remeasure = [
            bootstrap.lock_digest(args.node_boot.node_lock),
            *[node.id for node in ray.nodes],
            *[instance.id for instance in gang.instances],
        ]
        measures = [
            self._run(
                f"fabric-{gang.node(index)}",
                self._on_node(gang, index),
                f"sudo {NODE_COMMAND} fabric-measure --nodes {node_count} {args.fabric_measurement.arguments()}",
                after=[preflight, ray.cluster_ready],
                triggers=remeasure,
            )
            for index in range(node_count)
        ]
        floor = args.fabric_floor
        efa_flag = " --efa" if args.node_boot.efa else ""
        return self._run(
            gang.command("fabric"),
            self._on_node(gang, 0),
            f"sudo {NODE_COMMAND} fabric-gate --floor-gbps {floor.gbps:g}"
            f" --floor-why {shlex.quote(floor.why)}{efa_flag}",
            # The head's measurement: rank 0's line of JSON.
            stdin=measures[0].stdout,
            after=measures,
            triggers=[measures[0].id],
        )
