"""The GPU nodes' commands among the services (components/services.py), per gang: each
node's bootstrap (its login, setup and secrets) and idle stop, Ray, the model staged on
the cache, each node prepared to serve, preflight, the fabric gate, vLLM and its
warm-up cache, and the readiness check through the gateway. Each runs one idempotent
subcommand of scripts/node/vllm-cluster-node (or the node's setup script) over SSH,
through the gateway.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import bootstrap, idle_stop, metrics
from components.bootstrap import GATEWAY_COMMAND, LOGIN_READY_WORD, NODE_COMMAND
from components.compute import node_boot
from components.remote_commands import RemoteCommands
from components.services_args import GatewayServiceArgs, IdleStopArgs, ModelServingArgs, NodesArgs, ServingGang
from components.topology import writes_model_tree

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


def gang_turn_seconds(engine_ready_timeout_seconds: int) -> int:
    """How long one gang's whole turn may take, from its setup through Ray and preflight
    to vLLM's start: what a drain waits for the rolling lease (gateway_commands)."""
    return (
        GANG_SETUP_ALLOWANCE_SECONDS
        + CLUSTER_READY_TIMEOUT_SECONDS
        + engine_ready_timeout_seconds
        + START_VLLM_MARGIN_SECONDS
    )


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


@dataclass
class NodeCommands:
    """One node's bootstrap, as the steps after it wait for it."""

    setup: command.remote.Command
    secrets: command.remote.Command


@dataclass
class RayCommands:
    nodes: list[command.remote.Command]  # Ray started, head first
    cluster_ready: command.remote.Command  # every node and GPU joined


@dataclass
class NodeSteps:
    """Declares a gang's node commands, each step taking what it waits for from the one
    before and returning what the next waits for. What each needs comes from the nodes'
    record, the model's, idle stop's and, for the readiness check through it, the
    gateway's."""

    remote: RemoteCommands
    args: NodesArgs
    serving: ModelServingArgs
    idle: IdleStopArgs
    # For the readiness check through it, and for the node's setup (where the gateway is).
    gateway: GatewayServiceArgs

    def _run(
        self, resource: str, gang: ServingGang, index: int, create: pulumi.Input[str], **options
    ) -> command.remote.Command:
        """A command on the gang's node `index` (0: its head)."""
        return self.remote.run(resource, self.remote.on_node(gang, index), create, **options)

    # --- each node's bootstrap ----------------------------------------------------------

    def bootstrap(
        self, gang: ServingGang, login_probe: command.remote.Command, drained: command.remote.Command | None
    ) -> list[NodeCommands]:
        """Every node of the gang, in parallel: wait (on the gateway) until it accepts
        logins, set it up with what it booted with, then give it its secrets. Head first."""
        bootstrapped = []
        for index, (host, instance) in enumerate(zip(gang.node_ips, gang.instances, strict=True)):
            accepts_logins = self._accepts_logins(gang, index, host, [login_probe, instance])
            setup = self._run(
                f"setup-{gang.node(index)}",
                gang,
                index,
                "sudo bash -s",
                stdin=self._setup_script(gang, index, host),
                # A drained gang's setup may install a new environment under its engine.
                after=[instance, accepts_logins, *([drained] if drained is not None else [])],
            )
            secrets = self._run(
                f"secrets-{gang.node(index)}",
                gang,
                index,
                f"sudo {NODE_COMMAND} install-secrets",
                stdin=self._secrets(gang, index),
                after=[setup],
                secret=True,
            )
            bootstrapped.append(NodeCommands(setup=setup, secrets=secrets))
        return bootstrapped

    def _accepts_logins(
        self, gang: ServingGang, index: int, host: pulumi.Input[str], after: list
    ) -> command.remote.Command:
        """On the gateway: wait until the node accepts logins (with the login probe's key)."""
        return self.remote.run(
            f"login-{gang.node(index)}",
            self.remote.on_gateway(),
            pulumi.Output.concat(
                f"sudo {GATEWAY_COMMAND} wait-login --host ",
                host,
                " --host-key '",
                gang.host_keys[index],
                f"' --user {self.remote.user} --expect {LOGIN_READY_WORD} --timeout {LOGIN_TIMEOUT_SECONDS}",
            ),
            after=after,
        )

    def _setup_script(self, gang: ServingGang, index: int, host: pulumi.Input[str]) -> pulumi.Output[str]:
        """What the node's setup runs: what it booted with, and where the gateway and its gang are."""
        # The head's dashboard reads Prometheus on the gateway, and the host firewall
        # admits the gateway and the gang: their addresses come here, not in the user
        # data (which would make every node wait for the gateway and the others).
        head_ip = gang.node_ips[0]
        return pulumi.Output.all(
            node_boot(self.args.boot, index, None if index == 0 else head_ip, gang.index, host),
            self.gateway.private_ip,
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

    def _secrets(self, gang: ServingGang, index: int) -> pulumi.Output[str]:
        """What the node's install-secrets reads (node_secrets), secret."""
        args = self.args
        hf_token = args.hf_token.reveal() if args.hf_token is not None else None
        return pulumi.Output.secret(
            pulumi.Output.all(gang.ray_token, args.heads_api_key, args.probe_api_key).apply(
                lambda values: node_secrets(
                    values[0], values[1], hf_token, index == 0, downloads=gang.index == 0, probe_key=values[2]
                )
            )
        )

    def idle_stop(self, gang: ServingGang, nodes: list[NodeCommands]) -> None:
        """Every node of the gang powers itself off after idleStopMinutes without a request
        (vllm-cluster-node idle-check, from a timer this turns on), or never (0). Its own
        command, after the node's setup: a new idleStopMinutes runs it again and nothing
        else, neither Ray nor vLLM. Declared with 0 too, and without a delete: unsetting
        the key turns the timer off by running it again, and `pulumi destroy` never has to
        reach a node, which may be stopped then."""
        idle = self.idle
        minutes = idle.minutes
        if minutes and idle.replicas is not None:
            # With warm gangs, an always-on gang never stops for idleness.
            minutes = idle_stop.gang_idle_minutes(gang.index, idle.replicas, idle.max_replicas, minutes)
        for index in range(len(gang.node_ips)):
            self._run(
                f"idle-stop-{gang.node(index)}",
                gang,
                index,
                f"sudo {NODE_COMMAND} idle-stop-config --minutes {minutes}"
                + (f" --grace-seconds {idle.never_served_grace_seconds}" if minutes else ""),
                after=[nodes[index].setup],
                # A replaced node is a new machine: it needs its timer turned on again.
                triggers=[gang.instances[index].id],
            )

    # --- Ray and the model ----------------------------------------------------------------

    def ray(self, gang: ServingGang, nodes: list[NodeCommands]) -> RayCommands:
        """Ray on the gang's head, then on every worker at once; then wait until every
        node and every GPU of the gang has joined."""
        environment = self.args.environment()
        head = self._run(
            f"ray-{gang.node(0)}",
            gang,
            0,
            f"sudo {NODE_COMMAND} start-ray",
            after=[nodes[0].setup, nodes[0].secrets],
            triggers=environment,
        )
        workers = [
            self._run(
                f"ray-{gang.node(index)}",
                gang,
                index,
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
            gang,
            0,
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} wait-cluster --expect ",
                expected,
                f" --gpus {len(gang.node_ips) * self.args.boot.gpus} --timeout {CLUSTER_READY_TIMEOUT_SECONDS}",
            ),
            after=ray_nodes,
            # Whenever a Ray node was (re)started, check the whole cluster again.
            triggers=[node.id for node in ray_nodes],
        )
        return RayCommands(nodes=ray_nodes, cluster_ready=cluster_ready)

    def stage_model(self, gang: ServingGang, nodes: list[NodeCommands], ray: RayCommands) -> command.remote.Command:
        """The model onto the shared cache, by gang 0's nodes at once: each downloads a
        disjoint share of its files (part I of N), and the head's part, which returns the
        command every gang waits for, completes and checks the whole."""
        serving = self.serving
        parts = len(gang.node_ips)

        def stage(index: int) -> str:
            return (
                f"sudo {NODE_COMMAND} stage-model --model {serving.model} --revision {serving.model_revision}"
                + (f" --hub {serving.hf_endpoint}" if serving.hf_endpoint else "")
                + (f" --part {index} --parts {parts}" if parts > 1 else "")
            )

        for index in range(1, parts):
            self._run(
                f"model-part-{gang.node(index)}",
                gang,
                index,
                stage(index),
                after=[nodes[index].setup, nodes[index].secrets],
            )
        return self._run(
            "model",
            gang,
            0,
            stage(0),
            # Not after the other parts: the head downloads its own meanwhile and waits
            # for theirs, so a part that fails fails its own command, naming its node.
            after=[ray.cluster_ready, nodes[0].secrets],
        )

    # --- serving ----------------------------------------------------------------------------

    def vllm_restarts(self, ray: RayCommands) -> list:
        """Restarted Ray nodes take vLLM's workers with them, and a new vLLM version
        needs a restart: then check (and if need be restart) vLLM again."""
        boot = self.args.boot
        return [boot.vllm_version, bootstrap.lock_digest(boot.node_lock), *[node.id for node in ray.nodes]]

    def prepare(
        self, gang: ServingGang, nodes: list[NodeCommands], model: command.remote.Command
    ) -> list[command.remote.Command]:
        """On every node of the gang: its pipeline stages of the staged model copied to
        its own disk (when the stack serves from local disk) and vLLM's compile cache
        seeded from the shared cache. A replaced node (a new instance) does it again.
        Gang 0's nodes, which download the model, copy their stages while it lands
        (--model-landing: each file as soon as it is on the cache, hashed as it is copied),
        so the download and the copy overlap; later gangs copy the staged model."""
        serving = self.serving
        local = ""
        landing = writes_model_tree(gang.index) and serving.serves_from_local_disk
        if serving.serves_from_local_disk:
            local = pulumi.Output.all(*gang.node_ips).apply(
                lambda ips: (
                    f" --local-dir {serving.serving_dir} --gang-ips {','.join(ips)}"
                    f" --tp {serving.tensor_parallel} --pp {serving.pipeline_parallel}"
                    + (" --model-landing true" if landing else "")
                )
            )
        model_dir = bootstrap.model_directory(serving.model, serving.model_revision)
        return [
            self._run(
                f"prepare-{gang.node(index)}",
                gang,
                index,
                pulumi.Output.concat(
                    f"sudo {NODE_COMMAND} prepare-serve --model-dir {model_dir} --warmup-key {serving.warmup_key}",
                    local,
                ),
                # Gang 0's: not after the model's command (its head's stage-model, which
                # returns once the whole model is checked) but beside it; vLLM starts after both.
                after=[nodes[index].setup] if landing else [model, nodes[index].setup],
                triggers=[gang.instances[index].id],
            )
            for index in range(len(gang.node_ips))
        ]

    def preflight(
        self,
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
        serving = self.serving
        node_count = len(gang.node_ips)
        model_dir = bootstrap.model_directory(serving.model, serving.model_revision)
        facts = [
            self._run(
                f"preflight-{gang.node(index)}",
                gang,
                index,
                f"sudo {NODE_COMMAND} preflight-facts --model-dir {model_dir}",
                # After the model too: gang 0's nodes are prepared before the model is whole.
                after=[prepared[index], ray.nodes[index], model],
                triggers=vllm_restarts,
            )
            for index in range(node_count)
        ]
        boot = self.args.boot
        efa_flag = f" --efa {serving.efa_interfaces}" if boot.efa else ""
        return self._run(
            gang.command("preflight"),
            gang,
            0,
            f"sudo {NODE_COMMAND} preflight --nodes {','.join(gang.node(i) for i in range(node_count))}"
            f" --gpus {boot.gpus} --gpu-memory-gib {serving.gpu_memory_gib:g}{efa_flag}"
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

    def fabric_gate(
        self, gang: ServingGang, ray: RayCommands, preflight: command.remote.Command
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
        measurement, floor = self.serving.fabric_measurement, self.serving.fabric_floor
        if measurement is None or floor is None:
            return None
        node_count = len(gang.node_ips)
        # The same for every node of the gang: their measurements run again together, or
        # a node would wait at the rendezvous for peers that never come.
        remeasure = [
            bootstrap.lock_digest(self.args.boot.node_lock),
            *[node.id for node in ray.nodes],
            *[instance.id for instance in gang.instances],
        ]
        measures = [
            self._run(
                f"fabric-{gang.node(index)}",
                gang,
                index,
                f"sudo {NODE_COMMAND} fabric-measure --nodes {node_count} {measurement.arguments()}",
                after=[preflight, ray.cluster_ready],
                triggers=remeasure,
            )
            for index in range(node_count)
        ]
        efa_flag = " --efa" if self.args.boot.efa else ""
        return self._run(
            gang.command("fabric"),
            gang,
            0,
            f"sudo {NODE_COMMAND} fabric-gate --floor-gbps {floor.gbps:g}"
            f" --floor-why {shlex.quote(floor.why)}{efa_flag}",
            # The head's measurement: rank 0's line of JSON.
            stdin=measures[0].stdout,
            after=measures,
            triggers=[measures[0].id],
        )

    def start_vllm(self, gang: ServingGang, after: list, vllm_restarts: list) -> command.remote.Command:
        """vLLM on the gang's head: start-vllm keeps the stack's probe and returns once it
        succeeded on the head."""
        return self._run(
            gang.command("vllm"),
            gang,
            0,
            self.serving.start_vllm_command,
            stdin=gang.vllm_settings,
            after=after,
            triggers=vllm_restarts,
        )

    def keep_warmup(
        self,
        gang: ServingGang,
        serve: command.remote.Command,
        prepared: list[command.remote.Command],
        vllm_restarts: list,
    ) -> None:
        """vLLM's compile cache back onto the shared cache once the engine serves. Only the
        nodes that may write the warm-up cache publish to it (gang 0's,
        topology.writes_model_tree); the other gangs seed from what they compiled."""
        for index in range(len(gang.node_ips) if writes_model_tree(gang.index) else 0):
            self._run(
                f"warmup-{gang.node(index)}",
                gang,
                index,
                f"sudo {NODE_COMMAND} keep-warmup --warmup-key {self.serving.warmup_key}",
                after=[serve],
                # Whenever the engine may have compiled anew on this node.
                triggers=[*vllm_restarts, gang.vllm_settings, prepared[index].id],
            )

    def readiness(self, gang: ServingGang, after: list, triggers: list) -> command.remote.Command:
        """The stack's probe from the gang's head through the gateway: a real request of
        the model's task, through TLS and the route allowlist."""
        gateway = self.gateway
        return self._run(
            gang.command("readiness"),
            gang,
            0,
            pulumi.Output.concat(
                f"sudo {NODE_COMMAND} readiness --gateway ",
                gateway.private_ip,
                " --host ",
                gateway.endpoint_host,
                f" --timeout {READINESS_TIMEOUT_SECONDS}",
            ),
            # A self-signed certificate is the trust anchor; a public one is checked by the system store.
            stdin=gateway.tls_certificate_pem if gateway.tls_self_signed else "",
            after=after,
            triggers=triggers,
        )
