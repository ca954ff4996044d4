"""The cluster's credentials, made in the stack (the API key is taken from config
when the stack sets apiKey):

- ssh: an Ed25519 key. Its public half is the EC2 key pair the gateway and the GPU
  nodes launch with; the stack's remote commands log in with the private half, which
  is also exported (sshPrivateKey) for admins. On hosts the user already has (hosts),
  the stack's sshPrivateKey instead, and no key pair.
- API key: the stack's apiKey, or 48 random letters and digits: the clients' Bearer
  token, which the gateway checks (nginx, before anything reaches a gang or the waker),
  beside previousApiKey while clients move to a new key. Only the gateway receives it.
- heads' key: 48 random letters and digits that vLLM on each gang's head checks
  (VLLM_API_KEY); only the gateway sends it, in place of the client's key. Clients
  never hold it, so rotating the API key restarts no vLLM.
- gateway probe key: 48 random letters and digits the gateway accepts beside the
  clients' keys, held by the heads for the stack's readiness check through the gateway
  (a client's key never reaches a node); its own label in the gateway's key map.
- Ray token: 48 random letters and digits that every Ray node and client of a gang
  presents (Ray's token authentication); each gang has its own (a gang is its own Ray
  cluster), and every node of the gang receives it.
- metrics password: 48 random letters and digits, the login of Prometheus on the
  gateway (nginx's auth_basic at /prometheus/ on the admin port, components/metrics.py);
  the gateway keeps only its salted hash.
- login probe: an Ed25519 key whose public half the nodes authorize only to print
  one word (user data, vllm-cluster-first-boot); the gateway holds the private half,
  so it can tell when a booting node accepts logins without the stack's SSH key.

The private values are kept in Pulumi state (a configured apiKey in the stack's
config too), encrypted by the stack's secrets provider. The SSH key, the API key and
the Ray token leave it as secret stack outputs; every private value reaches its host
only on the secret stdin of a remote command (components/services.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_random as random
import pulumi_tls as tls

from components.spec import Secret
from components.tagging import tags
from components.topology import gang_prefix

API_KEY_LENGTH = 48
RAY_TOKEN_LENGTH = 48
METRICS_PASSWORD_LENGTH = 48


@dataclass
class CredentialsArgs:
    # The stack's apiKey when the user set one; None to generate it.
    api_key: Secret | None
    # previousApiKey: still accepted while clients move to apiKey; None: no other key.
    previous_api_key: Secret | None = None
    # Every gang the stack declares (maxReplicas, warm ones too): one Ray token each.
    gang_count: int = 1
    # hosts: the user's key that logs in on their machines (no key is made, no key pair).
    ssh_private_key: Secret | None = None


class Credentials(pulumi.ComponentResource):
    ssh_private_key: pulumi.Output[str]
    key_pair_name: pulumi.Output[str] | None
    api_key: pulumi.Output[str]
    previous_api_key: pulumi.Output[str] | None
    heads_api_key: pulumi.Output[str]
    probe_api_key: pulumi.Output[str]
    ray_token: pulumi.Output[str]
    ray_tokens: list[pulumi.Output[str]]
    login_probe_private_key: pulumi.Output[str]
    login_probe_public_key: pulumi.Output[str]
    metrics_password: pulumi.Output[str]

    def __init__(self, name: str, args: CredentialsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:Credentials", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self._ssh_key(name, args, child)
        self._api_keys(name, args, child)

        # Ray token authentication: every node and every client presents its gang's
        # token to the GCS and the dashboard (the Jobs API runs code: CVE-2023-48022).
        # One a gang: a node started against another gang's head cannot join it.
        # Gang 0's keeps its name, so a stack of one replica keeps its token.
        self.ray_tokens = [
            pulumi.Output.secret(
                random.RandomPassword(
                    f"{name}-{gang_prefix(gang)}ray-token", length=RAY_TOKEN_LENGTH, special=False, opts=child
                ).result
            )
            for gang in range(args.gang_count)
        ]
        self.ray_token = self.ray_tokens[0]

        # Letters and digits: it travels in a Basic auth header, as USER:PASSWORD.
        self.metrics_password = pulumi.Output.secret(
            random.RandomPassword(
                f"{name}-metrics-password", length=METRICS_PASSWORD_LENGTH, special=False, opts=child
            ).result
        )

        probe = tls.PrivateKey(f"{name}-login-probe", algorithm="ED25519", opts=child)
        self.login_probe_private_key = pulumi.Output.secret(probe.private_key_openssh)
        self.login_probe_public_key = probe.public_key_openssh

        # The secrets stay secret in the component's registered outputs too.
        self.register_outputs(
            {
                "sshPrivateKey": self.ssh_private_key,
                "keyPairName": self.key_pair_name,
                "apiKey": self.api_key,
                "previousApiKey": self.previous_api_key,
                "headsApiKey": self.heads_api_key,
                "probeApiKey": self.probe_api_key,
                "rayToken": self.ray_token,
                "rayTokens": self.ray_tokens,
                "loginProbePrivateKey": self.login_probe_private_key,
                "loginProbePublicKey": self.login_probe_public_key,
                "metricsPassword": self.metrics_password,
            }
        )

    def _ssh_key(self, name: str, args: CredentialsArgs, child: pulumi.ResourceOptions) -> None:
        """The key the stack's commands log in with: the user's own on their hosts, else
        one made here with its EC2 key pair."""
        if args.ssh_private_key is not None:
            self.ssh_private_key = pulumi.Output.secret(args.ssh_private_key.reveal())
            self.key_pair_name = None
        else:
            # Ed25519: short keys, fast handshakes, and supported by EC2 key pairs and OpenSSH.
            ssh_key = tls.PrivateKey(f"{name}-ssh", algorithm="ED25519", opts=child)
            key_pair = aws.ec2.KeyPair(
                f"{name}-ssh",
                public_key=ssh_key.public_key_openssh,
                tags=tags(f"{name}-ssh"),
                opts=child,
            )
            self.ssh_private_key = pulumi.Output.secret(ssh_key.private_key_openssh)
            self.key_pair_name = key_pair.key_name

    def _api_keys(self, name: str, args: CredentialsArgs, child: pulumi.ResourceOptions) -> None:
        """The clients' apiKey (and previousApiKey), the heads' own key and the gateway's
        probe key."""
        if args.api_key is not None:
            self.api_key = pulumi.Output.secret(args.api_key.reveal())
        else:
            # Letters and digits only: the key travels in an HTTP header and an env file.
            generated = random.RandomPassword(f"{name}-api-key", length=API_KEY_LENGTH, special=False, opts=child)
            self.api_key = pulumi.Output.secret(generated.result)
        self.previous_api_key = (
            pulumi.Output.secret(args.previous_api_key.reveal()) if args.previous_api_key is not None else None
        )
        # The heads' own key: never configured, never exported, only on the gateway and
        # the heads (their vllm-api.env).
        self.heads_api_key = pulumi.Output.secret(
            random.RandomPassword(f"{name}-heads-api-key", length=API_KEY_LENGTH, special=False, opts=child).result
        )
        self.probe_api_key = pulumi.Output.secret(
            random.RandomPassword(f"{name}-probe-api-key", length=API_KEY_LENGTH, special=False, opts=child).result
        )
