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

from typing import Sequence

import pulumi
import pulumi_command as command

from components import bootstrap, idle_stop
from components.gateway_commands import GatewayCommands, GatewaySteps
from components.node_commands import NodeCommands, NodeSteps, RayCommands, gang_turn_seconds
from components.remote_commands import RemoteCommands
from components.services_args import ServicesArgs, ServingGang
from components.spec import ClusterSpec


def vllm_settings(spec: ClusterSpec, node_ips: Sequence[pulumi.Input[str]], gang: int = 0) -> pulumi.Output[str]:
    """/etc/vllm-cluster/vllm.env for a gang's head (bootstrap.vllm_env), from the spec
    and every node's private IP in the gang, head first."""
    return pulumi.Output.all(*node_ips).apply(lambda ips: bootstrap.vllm_env(spec, ips[0], list(ips), gang))


class ClusterServices(pulumi.ComponentResource):
    """The remote commands of the module docstring, declared in steps: the gateway
    proxy, then per gang its drain (with replicas), each node's bootstrap, Ray and
    serving. Each step takes what it waits for from the one before and returns what
    the next waits for: the gateway's steps are gateway_commands.py's, the nodes'
    node_commands.py's, and every command reaches its host as remote_commands.py says."""

    # The readiness commands' report: the stack's probe went through the gateway.
    readiness: pulumi.Output[str]

    def __init__(self, name: str, args: ServicesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:ClusterServices", name, None, opts)
        self._args = args
        remote = RemoteCommands(
            self, name, args.ssh_private_key, args.nodes.boot.login_user, args.gateway.public_ip, args.gateway.host_key
        )
        drain_wait = gang_turn_seconds(args.serving.engine_ready_timeout_seconds)
        self._gateway_steps = GatewaySteps(remote, args.gateway, args.nodes, args.idle_stop, drain_wait)
        self._node_steps = NodeSteps(remote, args.nodes, args.serving, args.idle_stop, args.gateway)
        # Every gang's readiness triggers: the park command (warm gangs) comes after every
        # command and re-runs with any of these.
        self._readiness_triggers: list = []
        gateway = self._gateway_steps.proxy()
        model = None
        drained = None
        reports = []
        for gang in args.nodes.gangs:
            if args.nodes.rolling:
                drained = self._gateway_steps.drain(gang, [gateway.proxy, *([drained] if drained is not None else [])])
            nodes = self._node_steps.bootstrap(gang, gateway.login_probe, drained)
            if args.idle_stop.minutes is not None:
                self._node_steps.idle_stop(gang, nodes)
            ray = self._node_steps.ray(gang, nodes)
            if model is None:
                # Once for every gang: the model cache is shared.
                model = self._node_steps.stage_model(gang, nodes, ray)
            reports.append(self._serving(gang, nodes, ray, model, gateway).stdout)
        if args.idle_stop.minutes:
            self._gateway_steps.waker(gateway)
        if idle_stop.scales(args.idle_stop.replicas, args.idle_stop.max_replicas):
            self._gateway_steps.park(self._readiness_triggers)
        self.readiness = (
            reports[0]
            if len(reports) == 1
            else pulumi.Output.all(*reports).apply(lambda lines: "\n".join(line for line in lines if line))
        )
        self.register_outputs({"readiness": self.readiness})

    def _serving(
        self,
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
        steps, rolling = self._node_steps, self._args.nodes.rolling
        vllm_restarts = steps.vllm_restarts(ray)
        prepared = steps.prepare(gang, nodes, model)
        preflight = steps.preflight(gang, prepared, ray, vllm_restarts, model)
        gate = steps.fabric_gate(gang, ray, preflight)
        serve = steps.start_vllm(
            gang, [model, ray.cluster_ready, preflight, *([gate] if gate is not None else [])], vllm_restarts
        )
        steps.keep_warmup(gang, serve, prepared, vllm_restarts)
        if rolling:
            served = self._gateway_steps.return_to_pool(gang, serve)
        else:
            # The only gang: nothing drains, and the pool's configure runs once its vLLM
            # answered the probe (on the first `pulumi up` nothing serves anyway).
            served = gateway.proxy = self._gateway_steps.pool([gateway.tls, gateway.api_keys, gateway.metrics, serve])
        proxy = gateway.proxy if rolling else served
        # Check again whenever vLLM may have restarted: new settings, key, version or Ray.
        triggers = [gang.vllm_settings, pulumi.Output.secret(self._args.nodes.heads_api_key), *vllm_restarts]
        self._readiness_triggers += triggers
        return steps.readiness(gang, [served, proxy] if rolling else [serve, proxy], triggers)
