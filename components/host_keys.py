"""SSH host keys: every connection the stack, its gateway and the operator tools make
knows the key of the host it reaches before the first login. Plain Python, no Pulumi.

Who knows which key:
- On EC2 the stack generates each host's Ed25519 key (components/compute.py, gateway.py)
  and hands it to the instance at its first boot in cloud-init's `ssh_keys`: cloud-init's
  `ssh` module deletes the image's keys and writes these in its network stage, which is
  ordered before sshd starts (cloud-init systemd/cloud-init-network.service.tmpl:
  `Before=sshd.service`; cloudinit/config/cc_ssh.py), so sshd never answers with
  another key. The private half travels in the instance's user data, which the stack
  marks secret (encrypted in state); on the host only root reads it (the instance
  metadata service is closed to the service user, components/bootstrap.py).
- On the user's own hosts nothing is generated: the stack requires their keys as
  `hostKeys` (known_hosts lines) and refuses a host without one.
- pulumi-command's `host_key` takes one public key in authorized_keys form and accepts
  that key alone, and offers the server only that key's algorithm
  (provider/pkg/provider/remote/connection.go, SSHConfig: ssh.ParseAuthorizedKey,
  ssh.FixedHostKey, HostKeyAlgorithms). The operator tools and the gateway's login wait
  use OpenSSH with a known_hosts file and StrictHostKeyChecking=yes.
"""

from __future__ import annotations

import base64
import binascii
import email
import json
import re
from dataclasses import dataclass

import yaml

# The key type the stack generates, and the types a user's hosts may pin, best first:
# the one pulumi-command is given is the first the host has. ssh-rsa last: with it
# pulumi-command would offer the server only the SHA-1 "ssh-rsa" signature, which
# OpenSSH 8.8 and later refuse by default.
GENERATED_TYPE = "ssh-ed25519"
PINNABLE_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
# cloud-init's ssh_keys names for the generated type (cc_ssh.py CONFIG_KEY_TO_FILE).
CLOUD_INIT_PRIVATE, CLOUD_INIT_PUBLIC = "ed25519_private", "ed25519_public"
# The MIME boundary of the user data: never inside a shell script or a cloud-config
# the stack writes (multipart_user_data checks).
BOUNDARY = "==vllm-cluster-user-data-part=="


@dataclass(frozen=True)
class HostKey:
    """One public host key: its type and base64 blob, as a known_hosts line has them."""

    type: str
    blob: str

    @property
    def authorized(self) -> str:
        """The form pulumi-command's host_key takes (authorized_keys, no comment)."""
        return f"{self.type} {self.blob}"

    def known_hosts_line(self, host: str) -> str:
        return f"{host} {self.type} {self.blob}"


class KnownHostsError(ValueError):
    """A known_hosts line that cannot pin a host; the message says which and why."""


def _blob_type(blob: str) -> str | None:
    """The key type written inside the base64 blob (an SSH string: 4-byte length, name)."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) < 4:
        return None
    length = int.from_bytes(raw[:4], "big")
    name = raw[4 : 4 + length]
    return name.decode("ascii", errors="replace") if len(name) == length else None


def parse_public_key(text: str) -> HostKey:
    """A public key in authorized_keys form ("ssh-ed25519 AAAA... comment")."""
    fields = text.split()
    if len(fields) < 2:
        raise KnownHostsError(f"{text.strip()!r} is not a public key (type, then base64)")
    key_type, blob = fields[0], fields[1]
    if key_type not in PINNABLE_TYPES:
        raise KnownHostsError(f"key type {key_type} is not one of {', '.join(PINNABLE_TYPES)}")
    if _blob_type(blob) != key_type:
        raise KnownHostsError(f"the {key_type} key {blob[:16]}... is not valid base64 of a {key_type} key")
    return HostKey(key_type, blob)


def parse_known_hosts_line(line: str) -> tuple[tuple[str, ...], HostKey]:
    """(the hosts the line names, its key). Plain names only: `ssh-keyscan -H` hashes
    them, and a hashed line cannot say which host it pins to a reader of the config."""
    fields = line.split()
    if len(fields) < 3:
        raise KnownHostsError(f"{line.strip()!r} is not a known_hosts line (hosts, key type, key)")
    names, rest = fields[0], " ".join(fields[1:])
    if names.startswith("@"):
        raise KnownHostsError(f"{line.strip()!r} has a marker ({names}); give the plain line")
    if names.startswith("|1|"):
        raise KnownHostsError(f"{line.strip()!r} has a hashed host name; run ssh-keyscan without -H")
    hosts = []
    for name in names.split(","):
        bracketed = re.fullmatch(r"\[([^\]]+)\]:(\d+)", name)
        if bracketed:
            if bracketed.group(2) != "22":
                raise KnownHostsError(f"{line.strip()!r} is for port {bracketed.group(2)}; the stack uses 22")
            name = bracketed.group(1)
        hosts.append(name)
    return tuple(hosts), parse_public_key(rest)


def keys_by_host(lines: list[str]) -> dict[str, list[HostKey]]:
    """Every host's keys, in the order given. Raises KnownHostsError naming the line."""
    found: dict[str, list[HostKey]] = {}
    for position, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            hosts, key = parse_known_hosts_line(line)
        except KnownHostsError as error:
            raise KnownHostsError(f"item {position}: {error}") from None
        for host in hosts:
            found.setdefault(host, []).append(key)
    return found


def pinned_key(keys: list[HostKey]) -> HostKey:
    """The key pulumi-command is given for a host that has `keys`: the best type."""
    return min(keys, key=lambda key: PINNABLE_TYPES.index(key.type))


def known_hosts(entries: list[tuple[str, str]]) -> str:
    """known_hosts text for (host, public key) pairs, one line each."""
    return "".join(parse_public_key(key).known_hosts_line(host) + "\n" for host, key in entries)


# --- user data: the host key beside the first-boot script ------------------------------


def host_key_cloud_config(private_key_openssh: str, public_key_openssh: str) -> str:
    """cloud-config that installs the generated key as the host's only key (ssh_deletekeys
    is on by default: the image's keys go; with ssh_keys given nothing else is generated).
    JSON is YAML, and leaves no quoting to get wrong."""
    public = parse_public_key(public_key_openssh)
    if public.type != GENERATED_TYPE:
        raise ValueError(f"the stack generates {GENERATED_TYPE} host keys, not {public.type}")
    config = {"ssh_keys": {CLOUD_INIT_PRIVATE: private_key_openssh, CLOUD_INIT_PUBLIC: public.authorized}}
    return "#cloud-config\n" + json.dumps(config, indent=1) + "\n"


def multipart_user_data(script: str, cloud_config: str) -> str:
    """One MIME multipart user data of cloud-config and the first-boot script, as
    cloud-init reads it (its docs, "User data formats: MIME multi-part archive"): the
    cloud-config for its early stages, the script in its final stage as before."""
    for part in (script, cloud_config):
        if BOUNDARY in part:
            raise ValueError("a part of the user data contains its MIME boundary")
    parts = [("text/cloud-config", "host-key.cfg", cloud_config), ("text/x-shellscript", "first-boot.sh", script)]
    text = f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"\nMIME-Version: 1.0\n\n'
    for content_type, filename, body in parts:
        text += (
            f"--{BOUNDARY}\n"
            f'Content-Type: {content_type}; charset="us-ascii"\n'
            "MIME-Version: 1.0\n"
            "Content-Transfer-Encoding: 7bit\n"
            f'Content-Disposition: attachment; filename="{filename}"\n\n'
            # The line break before a boundary belongs to the boundary (RFC 2046 5.1.1):
            # the body keeps its own last one.
            f"{body}\n"
        )
    return text + f"--{BOUNDARY}--\n"


@dataclass(frozen=True)
class UserDataParts:
    script: str  # what cloud-init's final stage runs
    host_private_key: str | None  # what its ssh module installs (None: the image's keys stay)
    host_public_key: str | None


def user_data_parts(text: str) -> UserDataParts:
    """The user data as cloud-init takes it apart: a MIME message when "mime-version:"
    is in its first 4096 bytes (cloudinit/user_data.py convert_string), its cloud-config
    (ssh_keys) and shell script; else a plain script."""
    if "mime-version:" not in text[:4096].lower():
        return UserDataParts(text, None, None)
    message = email.message_from_string(text)
    script, private, public = None, None, None
    for part in message.walk():
        body = part.get_payload(decode=False)
        if part.get_content_type() == "text/x-shellscript":
            script = body
        elif part.get_content_type() == "text/cloud-config":
            keys = (yaml.safe_load(body.removeprefix("#cloud-config\n")) or {}).get("ssh_keys", {})
            private, public = keys.get(CLOUD_INIT_PRIVATE), keys.get(CLOUD_INIT_PUBLIC)
    if script is None:
        raise ValueError("the multipart user data has no shell script")
    return UserDataParts(script, private, public)
