"""The gateway: its instance type, how long it waits for a reply (apiReadTimeoutSeconds),
how many requests a client may send (apiRateLimitPerSecond) and have in flight
(apiMaxRequestsInFlightPerKey, apiMaxRequestsInFlightPerAddress), the routes it forwards
(apiRoutes), and the certificate a user brings for it (tlsCertificate, tlsPrivateKey,
endpointHostname).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from components import api_routes
from components.config_keys import (
    DEFAULT_API_MAX_REQUESTS_IN_FLIGHT,
    DEFAULT_API_RATE_LIMIT_PER_SECOND,
    DEFAULT_API_READ_TIMEOUT_SECONDS,
    MAX_API_RATE_LIMIT_PER_SECOND,
    MAX_API_READ_TIMEOUT_SECONDS,
    MAX_API_REQUESTS_IN_FLIGHT,
    NAMESPACE,
)
from components.spec.engine_settings import EngineSettings
from components.spec.reader import HOSTNAME, Reader
from components.spec.secrets import Secret

# How an instance type is named: family, generation, attributes, a dot and a size.
INSTANCE_TYPE_NAMES_DOC = "https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html"
_EC2_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----")
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z]+ )?PRIVATE KEY-----\s+[A-Za-z0-9+/=\s]+-----END ([A-Z]+ )?PRIVATE KEY-----"
)


@dataclass(frozen=True)
class UserCertificate:
    """A certificate the user brings for the gateway, and the name it is for."""

    certificate_pem: str
    private_key: Secret
    hostname: str


@dataclass(frozen=True)
class GatewaySettings:
    gateway_instance_type: str
    api_read_timeout_seconds: int
    api_rate_limit_per_second: int
    api_routes: tuple[str, ...]
    api_max_requests_in_flight_per_key: int = DEFAULT_API_MAX_REQUESTS_IN_FLIGHT
    api_max_requests_in_flight_per_address: int = DEFAULT_API_MAX_REQUESTS_IN_FLIGHT


def _check_api_read_timeout(reader: Reader) -> int:
    return _whole_number_within(
        reader,
        "apiReadTimeoutSeconds",
        1,
        MAX_API_READ_TIMEOUT_SECONDS,
        DEFAULT_API_READ_TIMEOUT_SECONDS,
        'seconds. A generation that runs longer should stream ("stream": true: each chunk resets the '
        "gateway's timer).",
    )


def _check_api_rate_limit(reader: Reader) -> int:
    return _whole_number_within(
        reader,
        "apiRateLimitPerSecond",
        0,
        MAX_API_RATE_LIMIT_PER_SECOND,
        DEFAULT_API_RATE_LIMIT_PER_SECOND,
        "requests per second per client; 0 turns the limit off.",
    )


def _check_in_flight(reader: Reader, key: str, who: str) -> int:
    return _whole_number_within(
        reader,
        key,
        0,
        MAX_API_REQUESTS_IN_FLIGHT,
        DEFAULT_API_MAX_REQUESTS_IN_FLIGHT,
        f"requests in flight per {who}; 0 turns the limit off (one client may use the whole stack).",
    )


def _whole_number_within(reader: Reader, key: str, low: int, high: int, default: int, what: str) -> int:
    """`key` from `low` to `high` (`what` says in which unit and why); its default when unset."""
    value = reader.integer(key)
    if value is not None and not low <= value <= high:
        reader.fail(key, f"must be from {low} to {high} {what} Fix: pulumi config set {NAMESPACE}:{key} {default}")
    return value if value is not None else default


def _check_api_routes(reader: Reader, engine: EngineSettings) -> tuple[str, ...]:
    """apiRoutes, each a route the gateway knows, once; or the model's routes. Every model
    keeps its probe's route (components/api_routes.py stack_probe): the stack's readiness
    check and vllm-cluster status send it through the gateway."""
    configured = reader.string_list("apiRoutes")
    if not configured:
        return api_routes.default_routes(engine.vllm_extra_args)
    unknown = [route for route in configured if route not in api_routes.KNOWN_ROUTES]
    if unknown:
        reader.fail(
            "apiRoutes",
            f"names {', '.join(map(json.dumps, unknown))}, not a route the gateway forwards. Known routes: "
            f"{', '.join(api_routes.KNOWN_ROUTES)}. Fix: pulumi config set --path '{NAMESPACE}:apiRoutes[0]' "
            f"{api_routes.KNOWN_ROUTES[0]} (one item per route), or pulumi config rm {NAMESPACE}:apiRoutes",
        )
    repeated = sorted({route for route in configured if configured.count(route) > 1})
    if repeated:
        reader.fail("apiRoutes", f"names {', '.join(repeated)} more than once. Fix: list each route once")
    pooling = api_routes.is_pooling(engine.vllm_extra_args)
    if api_routes.model_task(engine.vllm_extra_args) in api_routes.SERVED_TASKS:  # others: engine_settings refuses
        probe = api_routes.stack_probe(engine.vllm_extra_args, "")
        if probe.route not in configured:
            reader.fail(
                "apiRoutes",
                f"leaves out {probe.route}, where the stack's readiness check and vllm-cluster status send "
                f"{probe.what} through the gateway to see that the model serves. Fix: add it (pulumi config set "
                f"--path '{NAMESPACE}:apiRoutes[{len(configured)}]' {probe.route})",
            )
    wrong_task = [
        route
        for route in configured
        if route in (api_routes.GENERATION_ROUTES if pooling else api_routes.POOLING_ROUTES)
    ]
    if wrong_task:
        task = "a pooling model (--runner pooling)" if pooling else "a generation model"
        reader.fail(
            "apiRoutes",
            f"names {', '.join(wrong_task)}, which {task} does not serve. Fix: remove them, or change vllmExtraArgs",
        )
    return tuple(configured)


def check_gateway(reader: Reader, engine: EngineSettings) -> GatewaySettings:
    gateway_instance_type = reader.string("gatewayInstanceType")
    if gateway_instance_type is not None and not _EC2_TYPE.match(gateway_instance_type):
        reader.fail(
            "gatewayInstanceType",
            f"is not an EC2 instance type such as t3.small (see {INSTANCE_TYPE_NAMES_DOC})",
        )
    return GatewaySettings(
        gateway_instance_type,
        _check_api_read_timeout(reader),
        _check_api_rate_limit(reader),
        _check_api_routes(reader, engine),
        _check_in_flight(reader, "apiMaxRequestsInFlightPerKey", "API key"),
        _check_in_flight(reader, "apiMaxRequestsInFlightPerAddress", "client address"),
    )


def check_user_certificate(reader: Reader, secret_keys: set[str] | None) -> UserCertificate | None:
    """tlsCertificate, tlsPrivateKey and endpointHostname: all three or none."""
    certificate = reader.string("tlsCertificate")
    private_key = reader.string("tlsPrivateKey")
    hostname = reader.string("endpointHostname")
    if certificate is None and private_key is None and hostname is None:
        return None
    checks = (
        (
            "tlsCertificate",
            certificate,
            _PEM_CERTIFICATE.search,
            "must be a PEM certificate (-----BEGIN CERTIFICATE-----) when tlsPrivateKey or endpointHostname is set. "
            f"Fix: pulumi config set {NAMESPACE}:tlsCertificate < cert.pem, or unset all three for a generated "
            "certificate",
        ),
        (
            "tlsPrivateKey",
            private_key,
            _PEM_PRIVATE_KEY.search,
            "must be the PEM private key of tlsCertificate. "
            f"Fix: pulumi config set --secret {NAMESPACE}:tlsPrivateKey < key.pem",
        ),
        (
            "endpointHostname",
            hostname,
            HOSTNAME.match,
            "must be the DNS name in tlsCertificate that clients use (point it at the gatewayPublicIp output), "
            f"e.g. llm.example.com. Fix: pulumi config set {NAMESPACE}:endpointHostname NAME",
        ),
    )
    ok = True
    for key, value, accepts, message in checks:
        if value is None or not accepts(value):
            reader.fail(key, message)
            ok = False
    if not ok or (secret_keys is not None and "tlsPrivateKey" not in secret_keys):
        return None
    return UserCertificate(certificate_pem=certificate, private_key=Secret(private_key), hostname=hostname)
