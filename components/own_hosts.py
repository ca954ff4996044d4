"""The machines of a stack of hosts the user already has (config `hosts`): the stack
creates no AWS resource, so these stand where the EC2 instances stand in a stack that
creates them.

One remote command per machine, which the services' commands (components/services.py)
start after, as they start after an instance:
- its create does what the machine's launch would: on a GPU host it runs the node's
  user data as cloud-init would (cluster.env and the gateway's login probe,
  bootstrap.own_host_node_script), and on every machine it installs
  vllm-cluster-remove;
- its delete runs vllm-cluster-remove, which takes away everything the stack put on
  the machine (units, scripts, environment, secrets, the gateway's site) and leaves
  the machine and the shared model cache. `pulumi destroy` deletes the services'
  commands first (they depend on these), then the GPU hosts, then the gateway.

The GPU hosts are reached through the gateway, as the nodes are on AWS: the machine
running `pulumi up` needs SSH to the gateway alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import pulumi
import pulumi_command as command

from components import bootstrap
from components.bootstrap import REMOVE_COMMAND
from components.compute import NodeBootArgs, node_boot
from components.remote_commands import dial
from components.topology import node_name


@dataclass
class OwnHostsArgs:
    gateway_address: str  # as the machine running `pulumi up` reaches it over SSH
    gangs: Sequence[Sequence[str]]  # each gang's private IPs, head first
    ssh_user: str
    ssh_private_key: pulumi.Output[str]
    # Address (as gateway_address and gangs name it) -> its SSH host key (hostKeys): every
    # connection pins it.
    host_keys: Mapping[str, str]
    boot: NodeBootArgs


class OwnHosts(pulumi.ComponentResource):
    # Where the stack reaches the gateway (and through it every host).
    gateway_address: str
    gateway: command.remote.Command
    # Each gang's hosts' commands, head first.
    gangs: list[list[command.remote.Command]]

    def __init__(self, name: str, args: OwnHostsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:OwnHosts", name, None, opts)
        self.gateway_address = args.gateway_address
        on_gateway = dial(
            args.gateway_address, args.ssh_private_key, args.ssh_user, args.host_keys[args.gateway_address]
        )
        self.gateway = self._host(
            f"{name}-host-gateway",
            command.remote.ConnectionArgs(**on_gateway),
            bootstrap.own_host_gateway_script(),
            address=args.gateway_address,
            after=[],
        )
        self.gangs = []
        for gang, ips in enumerate(args.gangs):
            head_ip = ips[0]
            hosts = []
            for index, ip in enumerate(ips):
                script = node_boot(args.boot, index, None if index == 0 else head_ip, gang, ip).apply(
                    bootstrap.own_host_node_script
                )
                connection = command.remote.ConnectionArgs(
                    **dial(ip, args.ssh_private_key, args.ssh_user, args.host_keys[ip]),
                    proxy=command.remote.ProxyConnectionArgs(**on_gateway),
                )
                # Deleted before the gateway, through which it is reached.
                hosts.append(
                    self._host(
                        f"{name}-host-{node_name(index, gang)}", connection, script, address=ip, after=[self.gateway]
                    )
                )
            self.gangs.append(hosts)
        self.register_outputs({"gatewayAddress": self.gateway_address, "gangs": [list(ips) for ips in args.gangs]})

    def _host(
        self,
        resource: str,
        connection: command.remote.ConnectionArgs,
        script: pulumi.Input[str],
        address: str,
        after: list[pulumi.Resource],
    ) -> command.remote.Command:
        # Another machine in its place is a new resource: its create runs on the new machine
        # and its delete (vllm-cluster-remove) on the old one, at the end of `pulumi up`.
        # pulumi-command replaces a command when its triggers change, not its connection
        # (provider/pkg/provider/common/inputs.go, remote/command.go).
        return command.remote.Command(
            resource,
            connection=connection,
            create="sudo bash -s",
            stdin=script,
            delete=f"sudo {REMOVE_COMMAND}",
            triggers=[address],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )
