"""Reaching a deployed stack from the operator's machine: its outputs (from the
Pulumi CLI, or a JSON file), its gangs and their nodes, SSH to its nodes through
the gateway (and to the gateway itself) with the stack's key, and HTTPS to its
endpoint pinned to the stack's certificate."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components import api_routes, image
from components.topology import gang_name, node_name

ROOT = Path(__file__).resolve().parent.parent
# Every host's key is pinned: the stack's sshKnownHosts output lists each machine's key (the
# keys the stack generated and pinned in its own connections, or a stack of hosts' hostKeys),
# and ssh accepts no other (components/host_keys.py). Nothing from ~/.ssh or /etc/ssh counts.
SSH_OPTIONS = (
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "GlobalKnownHostsFile=/dev/null",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=15",
)


def ssh_args(
    key_file: Path,
    known_hosts: Path,
    user: str,
    host: str,
    command: str,
    jump_user: str | None = None,
    jump_host: str | None = None,
) -> list[str]:
    """`ssh` arguments that run `command` on user@host, through jump_user@jump_host when
    one is given (the gateway in front of the GPU nodes), with the one key for both hops
    and each hop's host key pinned in `known_hosts`."""
    options = [*SSH_OPTIONS, "-o", f"UserKnownHostsFile={known_hosts}"]
    args = ["ssh", "-i", str(key_file), *options]
    if jump_host:
        jump = " ".join(["ssh", "-i", str(key_file), *options, "-W", "%h:%p", f"{jump_user}@{jump_host}"])
        args += ["-o", f"ProxyCommand={jump}"]
    return [*args, f"{user}@{host}", command]


# What OpenSSH prints when a host's key is not the pinned one (or it has none pinned).
HOST_KEY_REFUSED = "Host key verification failed"


def host_key_advice(stderr: str, who: str) -> str:
    """`stderr` with a line naming the host and the fix when ssh refused its host key."""
    if HOST_KEY_REFUSED not in stderr:
        return stderr
    return stderr.rstrip("\n") + (
        f"\n{who} presents an SSH host key other than the stack's (sshKnownHosts): another machine answers at "
        "its address, or it was replaced outside the stack. Nothing was sent to it. Fix: run pulumi up (a node "
        "the stack replaced gets its pinned key), then use the stack's new outputs; if the key still differs, "
        "find out who answers there before you log in\n"
    )


# The header that marks `status`'s completion through the endpoint as a probe: the gateway's
# waker (scripts/gateway/vllm-cluster-waker PROBE_HEADER) wakes no stopped gang for it.
PROBE_HEADER = "X-Vllm-Cluster-Probe"

# What the tools read from a deployed stack's outputs (__main__.py exports them).
REQUIRED_OUTPUTS = (
    "gatewayPublicIp",
    "headPrivateIp",
    "sshPrivateKey",
    "sshKnownHosts",
    "endpoint",
    "apiKey",
    "tlsCertificate",
)


class OutputsError(Exception):
    """The stack's outputs could not be had; the message is one line saying why."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def stack_outputs(stack: str, outputs_file: str | None) -> dict[str, Any]:
    """The stack's outputs, secrets included: from `outputs_file`, or from the Pulumi
    CLI with the same backend and passphrase as scripts/deploy. Raises OutputsError."""
    if outputs_file:
        source = outputs_file
        try:
            text = Path(outputs_file).read_text()
        except OSError as error:
            raise OutputsError(f"{outputs_file}: cannot read it: {error.strerror or error}") from error
    else:
        source = f"pulumi stack output --stack {stack}"
        command = f'. "{ROOT}/scripts/pulumi-env.sh" && pulumi stack output --stack "$1" --json --show-secrets'
        result = subprocess.run(["bash", "-c", command, "outputs", stack], capture_output=True, text=True, cwd=ROOT)
        if result.returncode != 0:
            raise OutputsError(f"{source} failed: {_one_line(result.stderr) or f'exit {result.returncode}'}")
        text = result.stdout
    try:
        outputs = json.loads(text)
    except json.JSONDecodeError as error:
        raise OutputsError(f"{source}: not JSON: {error}") from error
    missing = [name for name in REQUIRED_OUTPUTS if name not in (outputs if isinstance(outputs, dict) else {})]
    if missing:
        raise OutputsError(
            f"{source}: no {', '.join(missing)} among the outputs (is the stack deployed, by this version? "
            "pulumi up adds the outputs a newer version has)"
        )
    try:
        gangs_of(outputs)
    except OutputsError as error:
        raise OutputsError(f"{source}: {error}") from error
    certificate = outputs["tlsCertificate"]
    if not isinstance(certificate, str) or "-----BEGIN CERTIFICATE-----" not in certificate:
        # The tools trust it to reach the endpoint (Cluster.tls_context); ssl fails on
        # anything else with an exception of its own, not a line a user can act on.
        raise OutputsError(
            f"{source}: the tlsCertificate output is not a PEM certificate ({certificate!r:.40}): "
            "give the stack's own output (pulumi stack output --json --show-secrets)"
        )
    return outputs


@dataclass
class Node:
    index: int  # 0 is its gang's head
    ip: str
    gang: int = 0

    @property
    def name(self) -> str:
        return node_name(self.index, self.gang)


@dataclass
class Gang:
    """One copy of the model: a head (the first node) and its workers, one Ray cluster
    and one vLLM server on the head."""

    index: int
    nodes: list[Node]

    @property
    def name(self) -> str:
        return gang_name(self.index)

    @property
    def head(self) -> Node:
        return self.nodes[0]


def gangs_of(outputs: dict[str, Any]) -> list[Gang]:
    """The stack's gangs, in order, from its `gangs` output (each a name and its nodes,
    head first). A stack deployed before replicas has no such output: one gang, of
    headPrivateIp and workerPrivateIps. Raises OutputsError for a `gangs` of another shape."""
    listed = outputs.get("gangs")
    if listed is None:
        ips = [[outputs["headPrivateIp"], *(outputs.get("workerPrivateIps") or [])]]
    else:
        try:
            ips = [[node["ip"] for node in gang["nodes"]] for gang in listed]
        except (TypeError, KeyError) as error:
            raise OutputsError(f"the gangs output is not a list of gangs with nodes and ips ({error!r})") from error
        if not ips or not all(ips):
            raise OutputsError("the gangs output lists no gang, or a gang without nodes")
    return [Gang(g, [Node(i, ip, g) for i, ip in enumerate(gang_ips)]) for g, gang_ips in enumerate(ips)]


def _run(args: list[str], timeout: float, who: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, 255, "", f"no answer from {who} in {timeout:g} s")


class Cluster:
    """A deployed stack as its outputs describe it."""

    def __init__(self, outputs: dict[str, Any]):
        self.outputs = outputs
        self.gateway = outputs["gatewayPublicIp"]
        # The login user on the gateway and the nodes: the image's, or a stack of hosts' sshUser
        # (a stack deployed before the output existed has the image's).
        self.user = outputs.get("sshUser") or image.DEFAULT_USER
        self.gangs = gangs_of(outputs)
        self.nodes = [node for gang in self.gangs for node in gang.nodes]  # every gang's, in order
        self._scratch = tempfile.TemporaryDirectory(prefix="vllm-cluster-")
        self.key_file = Path(self._scratch.name) / "key"
        self.key_file.write_text(outputs["sshPrivateKey"])
        os.chmod(self.key_file, 0o600)
        self.known_hosts = Path(self._scratch.name) / "known_hosts"
        self.known_hosts.write_text(outputs["sshKnownHosts"])

    def close(self) -> None:
        self._scratch.cleanup()

    def ssh(self, node: Node, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        args = ssh_args(self.key_file, self.known_hosts, self.user, node.ip, command, self.user, self.gateway)
        return self._pinned(_run(args, timeout, f"{node.name} ({node.ip})"), f"{node.name} ({node.ip}) or the gateway")

    def ssh_gateway(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """`command` on the gateway itself: a direct login, no jump."""
        args = ssh_args(self.key_file, self.known_hosts, self.user, self.gateway, command)
        return self._pinned(_run(args, timeout, f"the gateway ({self.gateway})"), f"the gateway ({self.gateway})")

    @staticmethod
    def _pinned(result: subprocess.CompletedProcess, who: str) -> subprocess.CompletedProcess:
        result.stderr = host_key_advice(result.stderr, who)
        return result

    def tls_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        # The stack's own certificate as a trust anchor (self-signed); a public one is
        # checked by the system store as usual.
        context.load_verify_locations(cadata=self.outputs["tlsCertificate"])
        return context

    def probe(self, probe: api_routes.Probe, timeout: float = 60) -> tuple[int, float, str]:
        """(HTTP status, seconds, error) of the stack's probe (bootstrap.stack_probe: a
        small completion for a generation model) through the endpoint."""
        # The endpoint output names the API's /v1; the probe's route is the whole path
        # (a classifier's is /classify, outside /v1).
        base = self.outputs["endpoint"].rstrip("/").removesuffix("/v1")
        request = urllib.request.Request(
            base + probe.route,
            data=probe.body_json().encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.outputs['apiKey']}",
                # A look, not a use: the gateway's waker starts no stopped gang for it (idle stop).
                PROBE_HEADER: "status",
            },
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, context=self.tls_context(), timeout=timeout) as response:
                response.read()
                return response.status, time.monotonic() - started, ""
        except urllib.error.HTTPError as error:
            return error.code, time.monotonic() - started, error.read().decode(errors="replace")[:200]
        except OSError as error:
            return 0, time.monotonic() - started, str(error)
