"""The gateway's TLS certificate: the user's own (tlsCertificate, tlsPrivateKey and
endpointHostname), or a self-signed one generated in the stack for the gateway's
Elastic IP. Either way the stack exports the certificate and its SHA-256
fingerprint, so clients can pin it (`curl --cacert`) instead of turning
verification off.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_tls as tls

from components.bootstrap import certificate_fingerprint
from components.spec import UserCertificate
from components.tagging import renamed_from

# Two years; `pulumi up` after expiry (or earlier, see early_renewal) issues a new one.
VALIDITY_HOURS = 2 * 365 * 24
EARLY_RENEWAL_HOURS = 30 * 24


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass
class GatewayCertificateArgs:
    public_ip: pulumi.Input[str]
    user_certificate: UserCertificate | None


class GatewayCertificate(pulumi.ComponentResource):
    certificate_pem: pulumi.Output[str]
    private_key_pem: pulumi.Output[str]
    fingerprint: pulumi.Output[str]
    # The name clients put in the URL: the DNS name of the user's certificate, or the IP.
    hostname: pulumi.Output[str]
    # Whether clients must be given the certificate (self-signed) or a public CA vouches for it.
    self_signed: bool

    def __init__(self, name: str, args: GatewayCertificateArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("vllm-cluster:index:GatewayCertificate", name, None, opts)
        if args.user_certificate is not None:
            self.self_signed = False
            self.certificate_pem = pulumi.Output.from_input(args.user_certificate.certificate_pem)
            self.private_key_pem = pulumi.Output.secret(args.user_certificate.private_key.reveal())
            self.hostname = pulumi.Output.from_input(args.user_certificate.hostname)
        else:
            self.self_signed = True
            # ECDSA P-256: fast handshakes, accepted by every TLS client in use.
            key = tls.PrivateKey(
                f"{name}-gateway-tls-key",
                algorithm="ECDSA",
                ecdsa_curve="P256",
                opts=renamed_from(f"{name}-tls", parent=self),
            )
            certificate = tls.SelfSignedCert(
                f"{name}-gateway-tls-certificate",
                private_key_pem=key.private_key_pem,
                subject={"common_name": "vllm-cluster gateway", "organization": "vllm-cluster"},
                # A gateway of the user's own (hosts) may be known by a DNS name instead.
                **(
                    {"dns_names": [args.public_ip]}
                    if isinstance(args.public_ip, str) and not _is_ip(args.public_ip)
                    else {"ip_addresses": [args.public_ip]}
                ),
                validity_period_hours=VALIDITY_HOURS,
                early_renewal_hours=EARLY_RENEWAL_HOURS,
                allowed_uses=["digital_signature", "key_encipherment", "server_auth"],
                opts=renamed_from(f"{name}-tls", parent=self),
            )
            self.certificate_pem = certificate.cert_pem
            self.private_key_pem = pulumi.Output.secret(key.private_key_pem)
            self.hostname = pulumi.Output.from_input(args.public_ip)

        self.fingerprint = self.certificate_pem.apply(certificate_fingerprint)
        self.register_outputs(
            {
                "certificatePem": self.certificate_pem,
                "privateKeyPem": self.private_key_pem,  # secret here too
                "fingerprint": self.fingerprint,
                "hostname": self.hostname,
                "selfSigned": self.self_signed,
            }
        )
