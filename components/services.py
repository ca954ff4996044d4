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
    spec: ClusterSpec
    ssh_private_key: pulumi.Output[str]
    gateway_public_ip: pulumi.Output[str]
    gateway_private_ip: pulumi.Output[str]
    node_ips: Sequence[pulumi.Output[str]]  # head first
    node_setup_scripts: Sequence[pulumi.Output[str]]  # head first
    gateway_user_data: str
    ray_token: pulumi.Output[str]
    login_probe_private_key: pulumi.Output[str]
    api_key: pulumi.Output[str]
    hf_token: Secret | None
    tls_certificate_pem: pulumi.Output[str]
    tls_private_key_pem: pulumi.Output[str]
    tls_self_signed: bool
    endpoint_host: pulumi.Output[str]
    efa_interfaces: int
    # The instances (and the gateway's address): a command starts after its host exists.
    nodes: Sequence[pulumi.Resource]
    gateway: Sequence[pulumi.Resource]


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


class ClusterServices(pulumi.ComponentResource):
    readiness: command.remote.Command

    def __init__(self, name: str, args: ServicesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:ClusterServices", name, None, opts)
        spec = args.spec
        key = args.ssh_private_key
        gateway_dial = _dial(args.gateway_public_ip, key)
        head_ip = args.node_ips[0]

        def through_gateway(host: pulumi.Input[str]) -> command.remote.ConnectionArgs:
            # The nodes have no public IP: every session is tunnelled through the gateway.
            return command.remote.ConnectionArgs(**_dial(host, key), proxy=command.remote.ProxyConnectionArgs(**gateway_dial))

        def run(
            resource: str,
            connection,
            create: pulumi.Input[str],
            *,
            stdin: pulumi.Input[str] | None = None,
            after: Sequence[pulumi.Resource] = (),
            triggers: list | None = None,
            secret: bool = False,
        ) -> command.remote.Command:
            return command.remote.Command(
                f"{name}-{resource}",
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

        # --- the gateway: nginx with TLS in front of the head --------------------------
        gateway_connection = command.remote.ConnectionArgs(**gateway_dial)
        gateway_setup = run(
            "gateway-setup", gateway_connection, "sudo bash -s", stdin=args.gateway_user_data, after=args.gateway
        )
        tls_bundle = pulumi.Output.secret(
            pulumi.Output.all(args.tls_private_key_pem, args.tls_certificate_pem).apply(
                # `pulumi config set < key.pem` drops the final newline: keep the PEM blocks apart.
                lambda pems: pems[0].rstrip("\n") + "\n" + pems[1].rstrip("\n") + "\n"
            )
        )
        gateway_tls = run(
            "gateway-tls", gateway_connection, f"sudo {GATEWAY_COMMAND} install-tls",
            stdin=tls_bundle, after=[gateway_setup], secret=True,
        )
        site = pulumi.Output.from_input(head_ip).apply(
            lambda ip: bootstrap.nginx_site(
                ip, spec.admin_cidrs, read_timeout_seconds=spec.api_read_timeout_seconds,
                rate_limit_per_second=spec.api_rate_limit_per_second,
            )
        )
        gateway_proxy = run(
            "gateway-proxy", gateway_connection, f"sudo {GATEWAY_COMMAND} configure", stdin=site, after=[gateway_tls]
        )

        # The gateway's login probe: pulumi-command retries a refused login on the same
        # tunnelled connection, so a node still booting (/run/nologin) would fail its
        # first command at once. The gateway waits for each node with this key first.
        login_probe = run(
            "gateway-login-probe", gateway_connection, f"sudo {GATEWAY_COMMAND} install-login-probe",
            stdin=args.login_probe_private_key, after=[gateway_setup], secret=True,
        )

        # --- every node: setup and secrets ---------------------------------------------
        hf_token = args.hf_token.reveal() if args.hf_token is not None else None
        setups, secrets = [], []
        for index, (host, setup_script, instance) in enumerate(zip(args.node_ips, args.node_setup_scripts, args.nodes)):
            node = node_name(index)
            connection = through_gateway(host)
            accepts_logins = run(
                f"login-{node}", gateway_connection,
                pulumi.Output.concat(
                    f"sudo {GATEWAY_COMMAND} wait-login --host ", host,
                    f" --user {SSH_USER} --expect {LOGIN_READY_WORD} --timeout {LOGIN_TIMEOUT_SECONDS}",
                ),
                after=[login_probe, instance],
            )
            setup = run(f"setup-{node}", connection, "sudo bash -s", stdin=setup_script, after=[instance, accepts_logins])
            lines = pulumi.Output.secret(
                pulumi.Output.all(args.ray_token, args.api_key).apply(
                    lambda values, is_head=(index == 0): node_secrets(values[0], values[1], hf_token, is_head)
                )
            )
            secrets.append(
                run(f"secrets-{node}", connection, f"sudo {NODE_COMMAND} install-secrets",
                    stdin=lines, after=[setup], secret=True)
            )
            setups.append(setup)

        # --- Ray: the head, then every worker at once ----------------------------------
        head = through_gateway(head_ip)
        ray_head = run(
            "ray-head", head, f"sudo {NODE_COMMAND} start-ray",
            after=[setups[0], secrets[0]], triggers=[spec.ray_version],
        )
        ray_workers = [
            run(
                f"ray-{node_name(index)}", through_gateway(args.node_ips[index]), f"sudo {NODE_COMMAND} start-ray",
                after=[ray_head, setups[index], secrets[index]], triggers=[spec.ray_version],
            )
            for index in range(1, spec.nodes)
        ]
        ray_nodes = [ray_head, *ray_workers]

        expected = pulumi.Output.all(*args.node_ips).apply(
            lambda ips: ",".join(f"{node_name(i)}={ip}" for i, ip in enumerate(ips))
        )
        cluster_ready = run(
            "cluster-ready", head,
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} wait-cluster --expect ", expected,
                f" --gpus {spec.nodes * spec.gpus_per_node} --timeout {CLUSTER_READY_TIMEOUT_SECONDS}",
            ),
            after=ray_nodes,
            # Whenever a Ray node was (re)started, check the whole cluster again.
            triggers=[node.id for node in ray_nodes],
        )

        # --- the model, then vLLM, then a real completion through the gateway -----------
        model = run(
            "model", head,
            f"sudo {NODE_COMMAND} stage-model --model {spec.model} --revision {spec.model_revision}"
            + (f" --hub {spec.hf_endpoint}" if spec.hf_endpoint else ""),
            after=[cluster_ready, secrets[0]],
        )
        vllm_settings = pulumi.Output.all(*args.node_ips).apply(
            lambda ips: bootstrap.vllm_env(spec, ips[0], list(ips))
        )
        # Restarted Ray nodes take vLLM's workers with them, and a new vLLM version
        # needs a restart: then check (and if need be restart) vLLM again.
        vllm_restarts = [spec.vllm_version, *[node.id for node in ray_nodes]]

        # Preflight: every node's facts onto the shared cache, then the head compares
        # them, so a broken node fails `pulumi up` with a diagnosis before vLLM starts.
        model_dir = bootstrap.model_directory(spec.model, spec.model_revision)
        facts = [
            run(f"preflight-{node_name(index)}", through_gateway(args.node_ips[index]),
                f"sudo {NODE_COMMAND} preflight-facts --model-dir {model_dir}",
                after=[model, ray_nodes[index]], triggers=vllm_restarts)
            for index in range(spec.nodes)
        ]
        efa_flag = f" --efa {args.efa_interfaces}" if spec.efa else ""
        preflight = run(
            "preflight", head,
            f"sudo {NODE_COMMAND} preflight --nodes {','.join(node_name(i) for i in range(spec.nodes))}"
            f" --gpus {spec.gpus_per_node} --gpu-memory-gib {spec.instance.gpu_memory_gib:g}{efa_flag}"
            f" --ray {spec.ray_version} --vllm {spec.vllm_version}",
            # Compare again whenever the facts were gathered again.
            after=facts, triggers=[*vllm_restarts, model_dir],
        )
        serve = run(
            "vllm", head, f"sudo {NODE_COMMAND} start-vllm", stdin=vllm_settings,
            after=[model, cluster_ready, preflight], triggers=vllm_restarts,
        )
        self.readiness = run(
            "readiness", head,
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} readiness --gateway ", args.gateway_private_ip,
                " --host ", args.endpoint_host, f" --timeout {READINESS_TIMEOUT_SECONDS}",
            ),
            # A self-signed certificate is the trust anchor; a public one is checked by the system store.
            stdin=args.tls_certificate_pem if args.tls_self_signed else "",
            after=[serve, gateway_proxy],
            # Check again whenever vLLM may have restarted: new settings, key, version or Ray.
            triggers=[vllm_settings, pulumi.Output.secret(args.api_key), *vllm_restarts],
        )

        self.register_outputs({"readiness": self.readiness.stdout})
