"""Machines the user already has (hosts): the gangs' IPs, the gateway, the SSH login,
the shared model directory and every machine's pinned host key. With hosts the stack
creates no AWS resource, so the keys that configure what it creates are refused; without
them, the keys that describe own hosts are.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass

from components import host_keys
from components.catalog import InstanceType
from components.config_keys import MAX_REPLICAS, NAMESPACE
from components.spec.reader import HOSTNAME, Reader, set_beyond_default
from components.spec.secrets import Secret

# The login user with hosts when sshUser is not set: Ubuntu's, as on the AWS image.
SSH_USER_DEFAULT = "ubuntu"


@dataclass(frozen=True)
class OwnHosts:
    """Machines the user already has (hosts): the stack creates no AWS resource and
    reaches them over SSH, the nodes through the gateway as on AWS."""

    gangs: tuple[tuple[str, ...], ...]  # each gang's node private IPs, head first
    gateway_address: str  # as this machine and the API's clients reach it (IP or DNS name)
    gateway_private_ip: str  # on the nodes' network
    ssh_user: str
    ssh_private_key: Secret
    model_cache_dir: str  # the shared directory every host has mounted
    # hostKeys: known_hosts lines with a key for the gateway and every host (host_keys.py).
    host_keys: tuple[str, ...] = ()

    def host_key(self, address: str) -> str:
        """The key every connection to `address` pins (authorized_keys form)."""
        return host_keys.pinned_key(host_keys.keys_by_host(list(self.host_keys))[address]).authorized

    def known_hosts(self) -> str:
        """The known_hosts text of every machine, for the operator tools."""
        return "".join(line.strip() + "\n" for line in self.host_keys if line.strip())

    @property
    def node_ips(self) -> tuple[str, ...]:
        return tuple(ip for gang in self.gangs for ip in gang)


# Keys that configure what the stack creates on AWS: with hosts it creates nothing, so a
# value here would be silently ignored.
CREATED_INSTANCE_KEYS = (
    "availabilityZone",
    "vpcCidr",
    "vpcId",
    "publicSubnetId",
    "privateSubnetId",
    "amiId",
    "nodeImage",
    "capacityReservationId",
    "capacityBlock",
    "placementGroupName",
    "rootVolumeGiB",
    "retainModelCache",
    "modelCacheFileSystemId",
    "gatewayInstanceType",
)
# Keys that describe the user's own machines: without hosts there are none.
OWN_HOST_KEYS = ("gatewayHost", "gatewayPrivateIp", "sshUser", "sshPrivateKey", "modelCacheDir")
_OPENSSH_PRIVATE_KEY = re.compile(r"-----BEGIN (OPENSSH|RSA|EC) PRIVATE KEY-----")
_LOGIN_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_ABSOLUTE_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")


def hosts_listed(reader: Reader) -> bool:
    """Whether hosts holds anything (Pulumi passes an array as its JSON text, and its
    default [] along with every other key's)."""
    value = reader.raw.get("hosts")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return bool(value.strip())
    return bool(value)


def _ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def check_own_hosts(reader: Reader, secret_keys: set[str] | None) -> OwnHosts | None:
    """hosts and what comes with it; None when the stack creates its instances (and then
    none of the own-host keys may be set)."""
    listed = reader.string_list("hosts")
    if not listed:
        _check_no_own_host_keys(reader)
        return None
    _check_no_created_instance_keys(reader)
    gangs = _check_host_gangs(reader, listed)
    gateway, private_ip = _check_gateway_addresses(reader)
    user, key = _check_ssh_login(reader, secret_keys)
    cache = _check_model_cache_dir(reader)
    everything = (gangs, gateway, private_ip, key, cache)
    if any(value is None for value in everything):
        return None
    known = _check_host_keys(reader, gateway, [ip for gang in gangs for ip in gang])
    if known is None:
        return None
    taken = [ip for gang in gangs for ip in gang]
    if private_ip in taken:
        reader.fail(
            "gatewayPrivateIp",
            f"is {private_ip}, which hosts lists as a GPU host too: the gateway needs a machine of its own. Fix: "
            "another machine as gatewayHost",
            raw=private_ip,
        )
        return None
    return OwnHosts(gangs, gateway, private_ip, user, Secret(key), cache.rstrip("/"), known)


def _check_no_own_host_keys(reader: Reader) -> None:
    """Without hosts there are no machines of the user's for hostKeys and OWN_HOST_KEYS to describe."""
    if reader.string_list("hostKeys"):
        reader.fail(
            "hostKeys",
            "applies only to machines you already have, and hosts lists none: the stack generates the host keys "
            f"of the instances it creates. Fix: pulumi config rm {NAMESPACE}:hostKeys",
        )
    for key in OWN_HOST_KEYS:
        # Read first: a value of the wrong type is that problem alone.
        if reader.string(key) is not None:
            reader.fail(
                key,
                "applies only to machines you already have, and hosts lists none: the stack creates its own. "
                f"Fix: pulumi config rm {NAMESPACE}:{key}, or list your hosts with pulumi config set --path "
                f"'{NAMESPACE}:hosts[0]' 10.0.1.11,10.0.1.12",
            )


def _check_no_created_instance_keys(reader: Reader) -> None:
    """With hosts the stack creates nothing on AWS, so CREATED_INSTANCE_KEYS would be ignored."""
    for key in CREATED_INSTANCE_KEYS:
        if set_beyond_default(reader, key):
            reader.fail(
                key,
                "configures the EC2 instances the stack creates, and with hosts it creates none (no VPC, "
                f"instance, EFS or security group). Fix: pulumi config rm {NAMESPACE}:{key}",
            )


def _check_gateway_addresses(reader: Reader) -> tuple[str | None, str | None]:
    """gatewayHost (as this machine and the API's clients reach it) and gatewayPrivateIp (on
    the hosts' network; gatewayHost itself when that is an IPv4 address); None where refused."""
    gateway = reader.string("gatewayHost")
    if gateway is None or not (_ipv4(gateway) or HOSTNAME.match(gateway)):
        reader.fail(
            "gatewayHost",
            "is needed with hosts, as an IPv4 address or DNS name: the machine that runs the TLS gateway, "
            "reached over SSH from here and over HTTPS by the API's clients; the stack reaches the hosts through "
            f"it. Fix: pulumi config set {NAMESPACE}:gatewayHost 203.0.113.10",
        )
        gateway = None
    private_ip = reader.string("gatewayPrivateIp")
    if private_ip is None and gateway is not None and _ipv4(gateway):
        private_ip = gateway
    if private_ip is None or not _ipv4(private_ip):
        reader.fail(
            "gatewayPrivateIp",
            "must be the gateway's IPv4 address on the hosts' network when gatewayHost is a DNS name (the "
            f"hosts' Prometheus and readiness checks reach it there). Fix: pulumi config set "
            f"{NAMESPACE}:gatewayPrivateIp 10.0.1.10",
        )
        private_ip = None
    return gateway, private_ip


def _check_ssh_login(reader: Reader, secret_keys: set[str] | None) -> tuple[str, str | None]:
    """sshUser (Ubuntu's by default) and sshPrivateKey, which must have been set with --secret;
    the key None where refused."""
    user = reader.string("sshUser") or SSH_USER_DEFAULT
    if not _LOGIN_NAME.match(user):
        reader.fail("sshUser", "is not a login name such as ubuntu. Fix: pulumi config set vllm-cluster:sshUser ubuntu")
    key = reader.string("sshPrivateKey")
    if key is None or not _OPENSSH_PRIVATE_KEY.search(key):
        reader.fail(
            "sshPrivateKey",
            "is needed with hosts: the private key (OpenSSH or PEM) that logs in as sshUser on the gateway and "
            f"every host. Fix: pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/id_ed25519",
        )
        key = None
    elif secret_keys is not None and "sshPrivateKey" not in secret_keys:
        reader.fail(
            "sshPrivateKey",
            "was set in plain text: it would sit unencrypted in the stack file and in state. "
            f"Fix: pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/id_ed25519",
        )
        key = None
    return user, key


def _check_model_cache_dir(reader: Reader) -> str | None:
    """modelCacheDir: the shared directory every host has mounted; None where refused."""
    cache = reader.string("modelCacheDir")
    if cache is None or not _ABSOLUTE_PATH.match(cache) or cache.rstrip("/") in ("", "/mnt/vllm-models"):
        reader.fail(
            "modelCacheDir",
            "is needed with hosts: the absolute path of a directory every host has mounted from the same shared "
            "file system (NFS or any shared mount; letters, digits and . _ - / only, not / itself or the "
            f"stack's own mount point /mnt/vllm-models). Fix: pulumi config set {NAMESPACE}:modelCacheDir "
            "/srv/models",
        )
        return None
    return cache


def _check_host_keys(reader: Reader, gateway: str, node_ips: list[str]) -> tuple[str, ...] | None:
    """hostKeys: a known_hosts line for the gateway (as gatewayHost names it) and every
    host (as hosts names it). Without them every connection would trust whoever answers
    at the address and hand it the secrets the stack sends (issue: host keys)."""
    fix = (
        f"Fix: on each machine read its key (cat /etc/ssh/ssh_host_ed25519_key.pub), or run ssh-keyscan -t ed25519 "
        f"{gateway} {' '.join(node_ips)} from a host you trust and compare each fingerprint (ssh-keygen -lf) with the "
        f"machine's own, then pulumi config set --path '{NAMESPACE}:hostKeys[0]' '{gateway} ssh-ed25519 AAAA...' "
        "(one item per machine)"
    )
    lines = reader.string_list("hostKeys") or []
    try:
        found = host_keys.keys_by_host(lines)
    except host_keys.KnownHostsError as error:
        reader.fail("hostKeys", f"{error}. {fix}")
        return None
    missing = [address for address in [gateway, *node_ips] if address not in found]
    if missing:
        reader.fail(
            "hostKeys",
            f"has no key for {', '.join(missing)}: the stack pins the SSH host key of the gateway and of every host "
            f"before it logs in, so nobody else answering at an address receives the keys and tokens it sends. {fix}",
        )
        return None
    return tuple(line.strip() for line in lines if line.strip())


def _check_host_gangs(reader: Reader, listed: list[str]) -> tuple[tuple[str, ...], ...] | None:
    """Each gang's hosts: IPv4 addresses, none listed twice, every gang the same size (a
    gang is one copy of the model, laid over its nodes the same way)."""
    gangs, seen, ok = [], set(), True
    for position, item in enumerate(listed):
        ips = tuple(part.strip() for part in item.split(","))
        for ip in ips:
            if not _ipv4(ip):
                reader.fail(
                    "hosts",
                    f"item {position} holds {json.dumps(ip)}, which is not an IPv4 address: each item is one gang's "
                    f"hosts, their private IPs separated by commas, head first. Fix: pulumi config set --path "
                    f"'{NAMESPACE}:hosts[{position}]' 10.0.1.11,10.0.1.12",
                )
                ok = False
            elif ip in seen:
                reader.fail(
                    "hosts",
                    f"lists {ip} twice: every node is a host of its own (one Ray node, its own GPUs). "
                    "Fix: list each host once",
                )
                ok = False
            seen.add(ip)
        gangs.append(ips)
    sizes = sorted({len(gang) for gang in gangs})
    if len(sizes) > 1:
        reader.fail(
            "hosts",
            f"has gangs of {' and '.join(map(str, sizes))} hosts: every gang serves the same model laid over its "
            "hosts the same way, so each needs as many. Fix: the same number of hosts in every item",
        )
        ok = False
    if len(gangs) > MAX_REPLICAS:
        reader.fail("hosts", f"has {len(gangs)} gangs; at most {MAX_REPLICAS} (replicas) serve behind one gateway")
        ok = False
    return tuple(gangs) if ok else None


def own_hosts_shape(reader: Reader, own: OwnHosts) -> tuple[int, int]:
    """nodes and replicas, as hosts lays them out; a nodes or replicas set to other
    figures would contradict it."""
    nodes, replicas = len(own.gangs[0]), len(own.gangs)
    for key, value in (("nodes", nodes), ("replicas", replicas)):
        if set_beyond_default(reader, key) and reader.integer(key) != value:
            reader.fail(
                key,
                f"contradicts hosts, which lists {replicas} gang(s) of {nodes} host(s). Fix: pulumi config rm "
                f"{NAMESPACE}:{key} (hosts says it)",
            )
    return nodes, replicas


def host_instance_type(gpus: int, memory_gib: float) -> InstanceType:
    """A stack of hosts without a catalog type (gpusPerNode, gpuMemoryGiB): its GPUs are
    all that is known of it."""
    return InstanceType(
        name=f"host with {gpus} GPU(s) of {memory_gib} GiB",
        gpus=gpus,
        gpu_model="",
        gpu_memory_gib=float(memory_gib),
        vcpus=0,
        memory_gib=0,
        efa_supported=False,
        max_efa_interfaces=0,
        network_cards=1,
        network_gbps=0,
        price_per_hour_usd=0.0,
        price_date="",
        figures_source="the stack's gpusPerNode and gpuMemoryGiB",
        price_source="your own hosts: the stack pays for none",
    )
