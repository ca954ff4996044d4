"""How the services' remote commands (components/services.py) reach their hosts and are
declared: over SSH as the stack's login user, to the gateway by its public address and
to the nodes through it, each hop pinning its host's key (components/host_keys.py).

Every command is a pulumi-command remote Command, a child of ClusterServices, named
from the component's name: its name is part of the fleet's replay and of the deployed
stacks' URNs.
"""

from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_command as command

from components.services_args import ServingGang

# GPU instances can take many minutes from launch to sshd (capacity, EFA, driver
# init); pulumi-command's default of 10 x 15 s gives up too early.
DIAL_ERROR_LIMIT = 80
PER_DIAL_TIMEOUT_SECONDS = 15

# Secret stdin must not come back through logs or plain outputs.
QUIET = dict(logging=command.remote.Logging.NONE)
SECRET_OUTPUTS = ["stdout", "stderr"]


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


class RemoteCommands:
    """Declares the services' commands under `parent`, and keeps every one it declared:
    the park command (warm gangs) comes after all of them."""

    def __init__(
        self,
        parent: pulumi.Resource,
        name: str,
        ssh_key: pulumi.Input[str],
        user: str,
        gateway_ip: pulumi.Input[str],
        gateway_host_key: pulumi.Input[str],
    ):
        self._parent = parent
        self._name = name
        self._ssh_key = ssh_key
        # The image's user on AWS; sshUser on hosts the user has.
        self._user = user
        self._gateway_dial = dial(gateway_ip, ssh_key, user, gateway_host_key)
        self.declared: list[command.remote.Command] = []

    @property
    def user(self) -> str:
        return self._user

    def on_gateway(self) -> command.remote.ConnectionArgs:
        return command.remote.ConnectionArgs(**self._gateway_dial)

    def on_node(self, gang: ServingGang, index: int) -> command.remote.ConnectionArgs:
        # The nodes have no public IP: every session is tunnelled through the gateway. Both
        # hops pin their host's key (components/host_keys.py).
        return command.remote.ConnectionArgs(
            **dial(gang.node_ips[index], self._ssh_key, self._user, gang.host_keys[index]),
            proxy=command.remote.ProxyConnectionArgs(**self._gateway_dial),
        )

    def run(
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
                parent=self._parent,
                depends_on=list(after),
                additional_secret_outputs=SECRET_OUTPUTS if secret else None,
            ),
        )
        self.declared.append(declared)
        return declared
