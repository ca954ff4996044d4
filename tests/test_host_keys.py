"""SSH host keys (components/host_keys.py): what an instance's user data hands cloud-init,
what a stack of hosts' hostKeys may hold, and how the operator tools pin them."""

from __future__ import annotations

import email
import subprocess
from pathlib import Path

import pytest
import yaml

from cli.cluster import Cluster, host_key_advice, ssh_args
from cli.mock_runtime import real_private_key
from components import host_keys


@pytest.fixture(scope="module")
def key():
    return real_private_key("ED25519")


def test_the_user_data_gives_cloud_init_the_key_and_the_script_as_it_reads_them(key):
    """cloud-init takes user data as MIME when "mime-version:" is in its first 4096 bytes
    (cloudinit/user_data.py convert_string), parses it with the email package, hands a
    text/cloud-config part to its modules (cc_ssh reads ssh_keys) and runs a
    text/x-shellscript part in its final stage: the script arrives byte for byte."""
    script = "#!/bin/bash\nset -euo pipefail\necho first boot\n"
    text = host_keys.multipart_user_data(
        script, host_keys.host_key_cloud_config(key["privateKeyOpenssh"], key["publicKeyOpenssh"])
    )
    assert "mime-version:" in text[:4096].lower()
    parts = {part.get_content_type(): part.get_payload() for part in email.message_from_string(text).walk()}
    assert parts["text/x-shellscript"] == script
    config = parts["text/cloud-config"]
    assert config.startswith("#cloud-config\n")
    ssh_keys = yaml.safe_load(config)["ssh_keys"]
    assert ssh_keys == {
        "ed25519_private": key["privateKeyOpenssh"],
        "ed25519_public": " ".join(key["publicKeyOpenssh"].split()[:2]),
    }
    # No other key type is named: with ssh_keys given, cloud-init generates none and its
    # ssh_deletekeys default removes the image's (cc_ssh.py).
    assert "ssh_genkeytypes" not in config and "ssh_deletekeys" not in config


def test_a_public_key_that_ssh_keygen_reads_is_pinned_as_ssh_keygen_prints_it(key, tmp_path):
    public = tmp_path / "key.pub"
    public.write_text(key["publicKeyOpenssh"])
    fingerprint = subprocess.run(["ssh-keygen", "-lf", str(public)], capture_output=True, text=True, check=True)
    parsed = host_keys.parse_public_key(key["publicKeyOpenssh"])
    assert parsed.type == "ssh-ed25519" and parsed.authorized == " ".join(key["publicKeyOpenssh"].split()[:2])
    assert "ED25519" in fingerprint.stdout


@pytest.mark.parametrize(
    "line, hosts",
    [
        ("10.0.1.5 ssh-ed25519 {blob}", ("10.0.1.5",)),
        ("gw.example.com,203.0.113.10 ssh-ed25519 {blob} comment", ("gw.example.com", "203.0.113.10")),
        ("[10.0.1.5]:22 ssh-ed25519 {blob}", ("10.0.1.5",)),
    ],
)
def test_known_hosts_lines_name_their_hosts(key, line, hosts):
    blob = key["publicKeyOpenssh"].split()[1]
    named, parsed = host_keys.parse_known_hosts_line(line.format(blob=blob))
    assert named == hosts and parsed.blob == blob


@pytest.mark.parametrize(
    "line, why",
    [
        ("10.0.1.5 ssh-ed25519", "not a known_hosts line"),
        ("[10.0.1.5]:2222 ssh-ed25519 {blob}", "port 2222"),
        ("@cert-authority *.example.com ssh-ed25519 {blob}", "marker"),
        ("10.0.1.5 ssh-rsa {blob}", "is not valid base64 of a ssh-rsa key"),
    ],
)
def test_a_line_that_cannot_pin_its_host_says_why(key, line, why):
    with pytest.raises(host_keys.KnownHostsError, match=why):
        host_keys.parse_known_hosts_line(line.format(blob=key["publicKeyOpenssh"].split()[1]))


def test_pulumi_command_is_given_the_best_key_a_host_has(key):
    """ssh-keyscan lists every key a host has; pulumi-command takes one and offers only its
    algorithm, so the best: Ed25519 before RSA, whose "ssh-rsa" SHA-1 signature OpenSSH
    8.8 and later refuse by default."""
    ed25519 = host_keys.parse_public_key(key["publicKeyOpenssh"])
    rsa = host_keys.HostKey("ssh-rsa", "AAAAB3NzaC1yc2EAAAADAQABAAABAQ")
    assert host_keys.pinned_key([rsa, ed25519]) == ed25519


def test_the_operator_tools_pin_every_hop_to_the_stacks_known_hosts(key, tmp_path):
    blob = " ".join(key["publicKeyOpenssh"].split()[:2])
    outputs = {
        "gatewayPublicIp": "203.0.113.10",
        "headPrivateIp": "10.0.1.5",
        "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----\nnot used\n",
        "sshKnownHosts": f"203.0.113.10 {blob}\n10.0.1.5 {blob}\n",
        "tlsCertificate": "-----BEGIN CERTIFICATE-----\n",
    }
    cluster = Cluster(outputs)
    try:
        assert cluster.known_hosts.read_text() == outputs["sshKnownHosts"]
        args = ssh_args(cluster.key_file, cluster.known_hosts, "ubuntu", "10.0.1.5", "true", "ubuntu", "203.0.113.10")
        jump = next(arg for arg in args if arg.startswith("ProxyCommand="))
        for hop in (" ".join(args), jump):
            assert "StrictHostKeyChecking=yes" in hop and f"UserKnownHostsFile={cluster.known_hosts}" in hop
            assert "StrictHostKeyChecking=no" not in hop and "/dev/null" in hop  # GlobalKnownHostsFile only
    finally:
        cluster.close()
    assert not Path(cluster.known_hosts).exists()


def test_a_refused_host_key_is_named_with_the_fix():
    said = host_key_advice("Host key verification failed.\n", "the gateway (203.0.113.10)")
    assert "the gateway (203.0.113.10) presents an SSH host key other than the stack's" in said and "Fix:" in said
    assert host_key_advice("Connection refused\n", "x") == "Connection refused\n"
