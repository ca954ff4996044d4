"""The services on the hosts, brought up over SSH by remote commands, in order:

  the gateway waits until each node accepts logins (with its login probe)
    -> every node's setup (scripts, units, model cache, software; converges)
    -> secrets into root-only files -> Ray head -> every Ray worker, in parallel
    -> cluster ready (every node and GPU) -> model staged on the cache
    -> preflight (every node's facts, compared on the head) -> vLLM started
    -> readiness: a real completion through the gateway.
  The gateway: setup -> login probe key -> (waits for the nodes); certificate and
  key -> nginx site.

Every command runs one idempotent subcommand of scripts/node/vllm-cluster-node or
scripts/gateway/vllm-cluster-gateway, so re-running one by hand converges. A
command runs again only when its own inputs change (its command line, its stdin or
its triggers), which is what makes day-2 changes precise: a new model or new vLLM
settings re-run the model and vLLM commands and nothing of Ray. Secrets travel on
stdin (secret in state), never in a command line or the user data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pulumi
import pulumi_command as command

from components import bootstrap, image
from components.bootstrap import GATEWAY_COMMAND, LOGIN_READY_WORD, NODE_COMMAND
from components.compute import NodeBootArgs, node_boot
from components.spec import ClusterSpec, Secret
from components.topology import node_name

# The default user of the Deep Learning AMI and of Ubuntu's own images.
SSH_USER = image.DEFAULT_USER
# GPU instances can take many minutes from launch to sshd (capacity, EFA, driver
# init); pulumi-command's default of 10 x 15 s gives up too early.
DIAL_ERROR_LIMIT = 80
PER_DIAL_TIMEOUT_SECONDS = 15

# How long the node scripts wait for each stage before failing with a diagnosis.
CLUSTER_READY_TIMEOUT_SECONDS = 900
# From launch to a node that accepts logins: boot, /run/nologin, cloud-init's start.
LOGIN_TIMEOUT_SECONDS = 1200
READINESS_TIMEOUT_SECONDS = 900

# Secret stdin must not come back through logs or plain outputs.
QUIET = dict(logging=command.remote.Logging.NONE)
SECRET_OUTPUTS = ["stdout", "stderr"]


@dataclass
class ServicesArgs:
    """Plain values and Inputs (no spec, no callback), grouped by the step that uses them."""

    # How the commands reach the hosts.
    ssh_private_key: pulumi.Output[str]
    gateway_public_ip: pulumi.Output[str]
    gateway_private_ip: pulumi.Output[str]
    node_ips: Sequence[pulumi.Output[str]]  # head first; one per node
    # The instances (and the gateway's address): a command starts after its host exists.
    nodes: Sequence[pulumi.Resource]
    gateway: Sequence[pulumi.Resource]

    # The gateway proxy: its first-boot script (sent again by its setup command), TLS and site.
    gateway_user_data: str
    tls_certificate_pem: pulumi.Output[str]
    tls_private_key_pem: pulumi.Output[str]
    tls_self_signed: bool
    endpoint_host: pulumi.Output[str]
    admin_cidrs: tuple[str, ...]
    api_read_timeout_seconds: int
    api_rate_limit_per_second: int
    login_probe_private_key: pulumi.Output[str]

    # The node bootstrap: what each node was told at boot (setup sends it again) and its secrets.
    node_boot: NodeBootArgs
    ray_token: pulumi.Output[str]
    api_key: pulumi.Output[str]
    hf_token: Secret | None

    # Serving: the model, the head's vllm.env (vllm_settings below) and what preflight expects.
    model: str
    model_revision: str
    hf_endpoint: str | None
    vllm_settings: pulumi.Input[str]
    gpu_memory_gib: float
    efa_interfaces: int


def vllm_settings(spec: ClusterSpec, node_ips: Sequence[pulumi.Input[str]]) -> pulumi.Output[str]:
    """/etc/vllm-cluster/vllm.env for the head (bootstrap.vllm_env), from the spec and
    every node's private IP, head first."""
    return pulumi.Output.all(*node_ips).apply(lambda ips: bootstrap.vllm_env(spec, ips[0], list(ips)))


def _dial(host: pulumi.Input[str], key: pulumi.Input[str]) -> dict:
    return {
        "host": host,
        "user": SSH_USER,
        "private_key": key,
        "dial_error_limit": DIAL_ERROR_LIMIT,
        "per_dial_timeout": PER_DIAL_TIMEOUT_SECONDS,
    }


def node_secrets(ray_token: str, api_key: str, hf_token: str | None, is_head: bool) -> str:
    """The NAME=value lines `vllm-cluster-node install-secrets` reads on stdin. Only
    the head gets the API key and the Hugging Face token."""
    lines = [f"RAY_AUTH_TOKEN={ray_token}"]
    if is_head:
        lines.append(f"VLLM_API_KEY={api_key}")
        if hf_token:
            lines.append(f"HF_TOKEN={hf_token}")
    return "\n".join(lines) + "\n"


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
    proxy: command.remote.Command  # nginx serves the API and the dashboard with TLS
    login_probe: command.remote.Command  # the probe key is installed: the gateway can wait for nodes


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
    """The remote commands of the module docstring, declared in four steps: the gateway
    proxy, each node's bootstrap, Ray, then serving. Each step takes what it waits for
    from the one before and returns what the next waits for."""

    # The readiness command's report: a real completion went through the gateway.
    readiness: pulumi.Output[str]

    def __init__(self, name: str, args: ServicesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:ClusterServices", name, None, opts)
        self._name = name
        self._ssh_key = args.ssh_private_key
        self._gateway_dial = _dial(args.gateway_public_ip, args.ssh_private_key)

        gateway = self._gateway_proxy(args)
        nodes = self._node_bootstrap(args, gateway.login_probe)
        ray = self._ray(args, nodes)
        self.readiness = self._serving(args, nodes[0], ray, gateway.proxy).stdout
        self.register_outputs({"readiness": self.readiness})

    # --- how a command reaches its host ---------------------------------------------------

    def _on_gateway(self) -> command.remote.ConnectionArgs:
        return command.remote.ConnectionArgs(**self._gateway_dial)

    def _on_node(self, host: pulumi.Input[str]) -> command.remote.ConnectionArgs:
        # The nodes have no public IP: every session is tunnelled through the gateway.
        return command.remote.ConnectionArgs(
            **_dial(host, self._ssh_key), proxy=command.remote.ProxyConnectionArgs(**self._gateway_dial)
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
    ) -> command.remote.Command:
        """One remote command. Its name is part of the fleet's replay and of the deployed
        stacks' URNs: do not rename one without an alias."""
        return command.remote.Command(
            f"{self._name}-{resource}",
            connection=connection,
            create=create,
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

    # --- the steps ------------------------------------------------------------------------

    def _gateway_proxy(self, args: ServicesArgs) -> GatewayCommands:
        """The gateway: nginx with TLS in front of the head, and the login probe key."""
        setup = self._run(
            "gateway-setup", self._on_gateway(), "sudo bash -s", stdin=args.gateway_user_data, after=args.gateway
        )
        tls = self._run(
            "gateway-tls",
            self._on_gateway(),
            f"sudo {GATEWAY_COMMAND} install-tls",
            stdin=tls_bundle(args.tls_private_key_pem, args.tls_certificate_pem),
            after=[setup],
            secret=True,
        )
        site = pulumi.Output.from_input(args.node_ips[0]).apply(
            lambda head_ip: bootstrap.nginx_site(
                head_ip,
                args.admin_cidrs,
                read_timeout_seconds=args.api_read_timeout_seconds,
                rate_limit_per_second=args.api_rate_limit_per_second,
            )
        )
        proxy = self._run(
            "gateway-proxy", self._on_gateway(), f"sudo {GATEWAY_COMMAND} configure", stdin=site, after=[tls]
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
        )
        return GatewayCommands(proxy=proxy, login_probe=login_probe)

    def _node_bootstrap(self, args: ServicesArgs, login_probe: command.remote.Command) -> list[NodeCommands]:
        """Every node, in parallel: wait (on the gateway) until it accepts logins, set it up
        with what it booted with, then give it its secrets. Head first."""
        hf_token = args.hf_token.reveal() if args.hf_token is not None else None
        head_ip = args.node_ips[0]
        bootstrapped = []
        for index, (host, instance) in enumerate(zip(args.node_ips, args.nodes, strict=True)):
            node = node_name(index)
            accepts_logins = self._run(
                f"login-{node}",
                self._on_gateway(),
                pulumi.Output.concat(
                    f"sudo {GATEWAY_COMMAND} wait-login --host ",
                    host,
                    f" --user {SSH_USER} --expect {LOGIN_READY_WORD} --timeout {LOGIN_TIMEOUT_SECONDS}",
                ),
                after=[login_probe, instance],
            )
            setup_script = node_boot(args.node_boot, index, None if index == 0 else head_ip).apply(
                bootstrap.node_setup_script
            )
            setup = self._run(
                f"setup-{node}",
                self._on_node(host),
                "sudo bash -s",
                stdin=setup_script,
                after=[instance, accepts_logins],
            )
            lines = pulumi.Output.secret(
                pulumi.Output.all(args.ray_token, args.api_key).apply(
                    lambda values, is_head=(index == 0): node_secrets(values[0], values[1], hf_token, is_head)
                )
            )
            secrets = self._run(
                f"secrets-{node}",
                self._on_node(host),
                f"sudo {NODE_COMMAND} install-secrets",
                stdin=lines,
                after=[setup],
                secret=True,
            )
            bootstrapped.append(NodeCommands(setup=setup, secrets=secrets))
        return bootstrapped

    def _ray(self, args: ServicesArgs, nodes: list[NodeCommands]) -> RayCommands:
        """Ray on the head, then on every worker at once; then wait until every node and
        every GPU has joined."""
        # A new Ray, or any change of the locked environment, restarts Ray (start-ray
        # restarts a unit that started before the environment last changed).
        environment = [args.node_boot.ray_version, bootstrap.lock_digest(args.node_boot.node_lock)]
        head = self._run(
            "ray-head",
            self._on_node(args.node_ips[0]),
            f"sudo {NODE_COMMAND} start-ray",
            after=[nodes[0].setup, nodes[0].secrets],
            triggers=environment,
        )
        workers = [
            self._run(
                f"ray-{node_name(index)}",
                self._on_node(args.node_ips[index]),
                f"sudo {NODE_COMMAND} start-ray",
                after=[head, nodes[index].setup, nodes[index].secrets],
                triggers=environment,
            )
            for index in range(1, len(args.node_ips))
        ]
        ray_nodes = [head, *workers]
        expected = pulumi.Output.all(*args.node_ips).apply(
            lambda ips: ",".join(f"{node_name(i)}={ip}" for i, ip in enumerate(ips))
        )
        cluster_ready = self._run(
            "cluster-ready",
            self._on_node(args.node_ips[0]),
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} wait-cluster --expect ",
                expected,
                f" --gpus {len(args.node_ips) * args.node_boot.gpus} --timeout {CLUSTER_READY_TIMEOUT_SECONDS}",
            ),
            after=ray_nodes,
            # Whenever a Ray node was (re)started, check the whole cluster again.
            triggers=[node.id for node in ray_nodes],
        )
        return RayCommands(nodes=ray_nodes, cluster_ready=cluster_ready)

    def _serving(
        self, args: ServicesArgs, head: NodeCommands, ray: RayCommands, gateway_proxy: command.remote.Command
    ) -> command.remote.Command:
        """The model onto the cache, preflight, vLLM, then a real completion through the
        gateway: returns that last command, the readiness check."""
        on_head = self._on_node(args.node_ips[0])
        model = self._run(
            "model",
            on_head,
            f"sudo {NODE_COMMAND} stage-model --model {args.model} --revision {args.model_revision}"
            + (f" --hub {args.hf_endpoint}" if args.hf_endpoint else ""),
            after=[ray.cluster_ready, head.secrets],
        )
        # Restarted Ray nodes take vLLM's workers with them, and a new vLLM version
        # needs a restart: then check (and if need be restart) vLLM again.
        vllm_restarts = [
            args.node_boot.vllm_version,
            bootstrap.lock_digest(args.node_boot.node_lock),
            *[node.id for node in ray.nodes],
        ]
        preflight = self._preflight(args, model, ray, vllm_restarts)
        serve = self._run(
            "vllm",
            on_head,
            f"sudo {NODE_COMMAND} start-vllm",
            stdin=args.vllm_settings,
            after=[model, ray.cluster_ready, preflight],
            triggers=vllm_restarts,
        )
        return self._run(
            "readiness",
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
            after=[serve, gateway_proxy],
            # Check again whenever vLLM may have restarted: new settings, key, version or Ray.
            triggers=[args.vllm_settings, pulumi.Output.secret(args.api_key), *vllm_restarts],
        )

    def _preflight(
        self, args: ServicesArgs, model: command.remote.Command, ray: RayCommands, vllm_restarts: list
    ) -> command.remote.Command:
        """Every node's facts onto the shared cache, then the head compares them, so a
        broken node fails `pulumi up` with a diagnosis before vLLM starts."""
        node_count = len(args.node_ips)
        model_dir = bootstrap.model_directory(args.model, args.model_revision)
        facts = [
            self._run(
                f"preflight-{node_name(index)}",
                self._on_node(args.node_ips[index]),
                f"sudo {NODE_COMMAND} preflight-facts --model-dir {model_dir}",
                after=[model, ray.nodes[index]],
                triggers=vllm_restarts,
            )
            for index in range(node_count)
        ]
        boot = args.node_boot
        efa_flag = f" --efa {args.efa_interfaces}" if boot.efa else ""
        return self._run(
            "preflight",
            self._on_node(args.node_ips[0]),
            f"sudo {NODE_COMMAND} preflight --nodes {','.join(node_name(i) for i in range(node_count))}"
            f" --gpus {boot.gpus} --gpu-memory-gib {args.gpu_memory_gib:g}{efa_flag}"
            f" --ray {boot.ray_version} --vllm {boot.vllm_version}",
            # Compare again whenever the facts were gathered again.
            after=facts,
            triggers=[*vllm_restarts, model_dir],
        )
