"""The gateway's commands among the services (components/services.py): its setup, TLS,
login probe key, Prometheus and the keys nginx checks; nginx's site and the gangs' pool;
with replicas each gang's drain and return; the waker (idleStopMinutes) and, last of
all, the park of the warm gangs (maxReplicas). Each runs one idempotent subcommand of
scripts/gateway/vllm-cluster-gateway (or its setup script) over SSH.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command

from components import bootstrap, gateway_nginx, idle_stop, metrics, ports
from components.bootstrap import GATEWAY_COMMAND
from components.remote_commands import RemoteCommands
from components.services_args import GatewayServiceArgs, IdleStopArgs, NodesArgs, ServingGang


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
    # nodes may take its port on the private address (pool waits for it).
    metrics: command.remote.Command
    # nginx serves the API and the dashboard with TLS. With replicas, declared before the
    # gangs (their drains need the pool); with one gang, after its vLLM (ClusterServices._serving).
    proxy: command.remote.Command | None = None


@dataclass
class GatewaySteps:
    """Declares the gateway's commands: what each one needs comes from the gateway's
    record, the gangs' (NodesArgs) and idle stop's."""

    remote: RemoteCommands
    args: GatewayServiceArgs
    nodes: NodesArgs
    idle: IdleStopArgs
    # How long a drain waits for the rolling lease: one gang's whole turn (setup, Ray,
    # preflight, vLLM's start: node_commands.gang_turn_seconds).
    drain_wait_seconds: int

    def __post_init__(self) -> None:
        # A new gateway instance keeps its Elastic IP, so the commands that set it up
        # would see no change of their inputs and leave the new host bare: they re-run
        # with the instance.
        self.triggers = [resource.id for resource in self.args.instances]

    def _run(self, resource: str, create: pulumi.Input[str], **options) -> command.remote.Command:
        """A command on the gateway."""
        return self.remote.run(resource, self.remote.on_gateway(), create, **options)

    def proxy(self) -> GatewayCommands:
        """The gateway: its setup, TLS and the login probe key; with replicas also nginx
        in front of the gangs' heads (with one gang that waits for its vLLM: pool)."""
        args = self.args
        setup = self._run(
            "gateway-setup", "sudo bash -s", stdin=args.setup_script, after=args.instances, triggers=self.triggers
        )
        tls = self._run(
            "gateway-tls",
            f"sudo {GATEWAY_COMMAND} install-tls",
            stdin=tls_bundle(args.tls_private_key_pem, args.tls_certificate_pem),
            after=[setup],
            secret=True,
            triggers=self.triggers,
        )
        # The gateway's login probe: pulumi-command retries a refused login on the same
        # tunnelled connection, so a node still booting (/run/nologin) would fail its
        # first command at once. The gateway waits for each node with this key first.
        login_probe = self._run(
            "gateway-login-probe",
            f"sudo {GATEWAY_COMMAND} install-login-probe",
            stdin=args.login_probe_private_key,
            after=[setup],
            secret=True,
            triggers=self.triggers,
        )
        prometheus = self._metrics([setup])
        # The keys nginx checks, before the site that names them: a new apiKey or
        # previousApiKey re-runs this command alone (a graceful reload; no vLLM restarts).
        api_keys = self._run(
            "gateway-api-keys",
            f"sudo {GATEWAY_COMMAND} install-api-keys",
            stdin=gateway_api_keys(
                args.api_key, args.previous_api_key, self.nodes.probe_api_key, self.nodes.heads_api_key
            ),
            after=[setup],
            secret=True,
            triggers=self.triggers,
        )
        commands = GatewayCommands(setup=setup, tls=tls, login_probe=login_probe, api_keys=api_keys, metrics=prometheus)
        if self.nodes.rolling:
            commands.proxy = self.pool([tls, api_keys, prometheus])
        return commands

    def _metrics(self, after: list[command.remote.Command]) -> command.remote.Command:
        """Prometheus on the gateway (installed by its setup): its configuration, rules,
        flags and login, and the targets: every node of every gang, by private IP. New
        gangs or replaced nodes change only the targets, which Prometheus reads without a
        restart. Only nginx's site waits for it: its listener for the nodes takes
        Prometheus's port on the private address, which a Prometheus still listening on
        every interface (as before issue 33, or as the package starts it) holds."""
        gangs, idle = self.nodes.gangs, self.idle
        # Each gang's IPs, head first: one list a gang.
        gang_ips = [pulumi.Output.all(*gang.node_ips) for gang in gangs]

        def script(values: list) -> str:
            host, password, *ips = values
            scraped = [metrics.scrape_gang(gang.index, ip) for gang, ip in zip(gangs, ips, strict=True)]
            login = metrics.htpasswd_line(metrics.METRICS_USER, password)
            files = metrics.gateway_files(
                scraped,
                host,
                self.args.disk_gib,
                login,
                waker=bool(idle.minutes),
                # With warm gangs: the pool's alert (at maxReplicas and still queueing).
                scaling=idle_stop.scales(idle.replicas, idle.max_replicas),
            )
            return bootstrap.gateway_metrics_script(files, metrics.ready_url())

        stdin = pulumi.Output.secret(
            pulumi.Output.all(self.args.endpoint_host, self.args.metrics_password, *gang_ips).apply(script)
        )
        return self._run(
            "gateway-metrics", "sudo bash -s", stdin=stdin, after=after, secret=True, triggers=self.triggers
        )

    def pool(self, after: list[command.remote.Command]) -> command.remote.Command:
        """nginx's site and the gangs' pool: with replicas before the gangs, with one
        gang after its vLLM."""
        args, gangs = self.args, self.nodes.gangs
        # The dashboard is gang 0's; the API balances over every gang's head.
        site = pulumi.Output.all(gangs[0].node_ips[0], args.private_ip).apply(
            lambda values: gateway_nginx.nginx_site(
                values[0],
                args.admin_cidrs,
                read_timeout_seconds=args.api_read_timeout_seconds,
                rate_limit_per_second=args.api_rate_limit_per_second,
                max_in_flight_per_key=args.api_max_requests_in_flight_per_key,
                max_in_flight_per_address=args.api_max_requests_in_flight_per_address,
                # Every gang's batch of idle connections per worker (gateway_capacity).
                keepalive=args.upstream_keepalive,
                # A request no gang could take goes to the waker, which starts stopped gangs.
                waker=bool(self.idle.minutes),
                api_routes=args.api_routes,
                # The heads' Ray dashboards read Prometheus's query API there.
                nodes_prometheus_ip=values[1],
            )
        )
        pool = pulumi.Output.all(*[gang.node_ips[0] for gang in gangs]).apply(
            lambda heads: gateway_nginx.gateway_gangs({gang.name: ip for gang, ip in zip(gangs, heads, strict=True)})
        )
        # With replicas this runs as soon as replaced heads have addresses: a replaced
        # gang keeps its old head (while that serves and the new one does not) until its
        # return switches it. With one gang this runs after its vLLM: the new head is it.
        keep = " --keep-old-heads" if self.nodes.rolling else ""
        # nginx.conf's limits, which the conf.d site cannot set (components/gateway_capacity.py).
        limits = f" --connections {args.gateway_connections} --open-files {args.gateway_open_files}"
        return self._run(
            "gateway-proxy",
            pulumi.Output.concat(f"sudo {GATEWAY_COMMAND} configure{keep}{limits} --gangs ", pool),
            stdin=site,
            after=after,
            triggers=self.triggers,
        )

    # --- a gang out of the pool and back (replicas) ----------------------------------------

    @staticmethod
    def _head_address(gang: ServingGang) -> pulumi.Output[str]:
        """IP:PORT of the gang's head's vLLM, as the gateway's pool holds it."""
        return pulumi.Output.from_input(gang.node_ips[0]).apply(lambda ip: f"{ip}:{ports.VLLM_API}")

    def _drain_line(self, gang: ServingGang) -> pulumi.Output[str]:
        """The gateway command that takes the gang out of the pool. A serving gang waits
        for the rolling lease, which the gang before it holds until it serves again: the
        wait covers one gang's whole turn (setup, Ray, preflight, vLLM's start). It names
        the gang's head: at another address than the pool's (the gang replaced), the old
        head keeps serving and nothing is taken out."""
        return pulumi.Output.concat(
            f"sudo {GATEWAY_COMMAND} drain --gang {gang.name} --address ",
            self._head_address(gang),
            f" --timeout {self.args.api_read_timeout_seconds} --wait {self.drain_wait_seconds}",
        )

    def drain(self, gang: ServingGang, after: list[command.remote.Command]) -> command.remote.Command:
        """Take the gang out of the gateway's pool before anything of it restarts. Each
        drain waits for the previous gang's drain, so the gangs take the rolling lease in
        order: gang 0 first, whose chain stages the model that every gang's preflight
        waits for (a later gang holding the lease first would wait on gang 0, which
        would wait for the lease)."""
        return self._run(
            f"{gang.name}-drain",
            self._drain_line(gang),
            after=after,
            triggers=self.nodes.restarts(gang),
        )

    def return_to_pool(self, gang: ServingGang, serve: command.remote.Command) -> command.remote.Command:
        """The gang back into the pool once its vLLM serves: the switch to a replaced head."""
        return self._run(
            f"{gang.name}-return",
            pulumi.Output.concat(
                f"sudo {GATEWAY_COMMAND} return --gang {gang.name} --address ", self._head_address(gang)
            ),
            after=[serve],
            # Whenever the drain ran again, so does the return: a drain whose
            # line alone changed (a new read timeout) must not leave the gang out.
            triggers=[*self.nodes.restarts(gang), self._drain_line(gang)],
        )

    # --- idle stop and the warm gangs --------------------------------------------------------

    def waker(self, gateway: GatewayCommands) -> command.remote.Command:
        """The gateway's waker: its script and unit (not in the gateway's user data, which
        is near EC2's 16 KiB already), then `vllm-cluster-gateway waker-config` with which
        instances each gang has, where EC2 is and how long a wake takes (JSON,
        bootstrap.gateway_waker_script). After the gateway's setup and every node's instance
        (their ids are in it). Deleting it (the key unset) stops the waker and removes its
        configuration; the gateway is up whenever `pulumi up` or destroy runs."""
        instances = [instance for gang in self.nodes.gangs for instance in gang.instances]
        return self._run(
            "gateway-waker",
            "sudo bash -s",
            delete=f"sudo {GATEWAY_COMMAND} waker-config --off",
            stdin=pulumi.Output.from_input(self.idle.waker_config).apply(bootstrap.gateway_waker_script),
            after=[gateway.setup, *instances],
            triggers=self.triggers,
        )

    def park(self, readiness_triggers: list) -> command.remote.Command:
        """Warm gangs (maxReplicas, issue 36): the stack creates, sets up and readies every
        gang, so that a later wake is only a power-on, then parks the warm ones: `park`
        asks the gateway's waker to drain and stop every serving warm gang, its requests
        finishing on it first (the last serving gang only with none running or waiting:
        scripts/gateway/vllm-cluster-gateway). The stack's last command: after
        every other one (no command may find a warm gang stopped under it), and again
        whenever any gang's readiness check ran again (the same triggers; scripts/deploy
        starts the stack's stopped gangs before `pulumi up` reaches them) or the gateway
        was replaced (a fresh waker). No delete: destroy has nothing to park."""
        return self._run(
            "gateway-park",
            f"sudo {GATEWAY_COMMAND} park",
            after=list(self.remote.declared),
            triggers=[*readiness_triggers, *self.triggers],
        )
