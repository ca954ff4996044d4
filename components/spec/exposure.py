"""Exposure: who may reach the API (apiAllowedCidrs, allowPublicApi) and the admin paths
(adminCidrs), and whether the gateway's security group can hold that many rules.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from components import aws_contract
from components.config_keys import NAMESPACE
from components.spec.reader import Reader


@dataclass(frozen=True)
class Exposure:
    """Who may reach the API and the admin paths."""

    api_allowed_cidrs: tuple[str, ...]
    admin_cidrs: tuple[str, ...]
    allow_public_api: bool


def _world_spanning(networks: list) -> list:
    """The networks of each address family that together span all of it: 0.0.0.0/0
    itself, or the whole internet written in pieces (0.0.0.0/1 + 128.0.0.0/1)."""
    spanning = []
    for version in (4, 6):
        family = [n for n in networks if n.version == version]
        if any(n.prefixlen == 0 for n in ipaddress.collapse_addresses(family)):
            spanning += family
    return spanning


def _check_cidrs(reader: Reader, key: str, world_allowed: bool, world_fix: str) -> tuple[str, ...]:
    cidrs = reader.string_list(key)
    if cidrs is None:
        return ()
    checked = []
    if not cidrs:
        reader.fail(key, "must name at least one CIDR; an empty list would leave the path closed to everyone")
    for cidr in cidrs:
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            try:
                loose = ipaddress.ip_network(cidr, strict=False)
                hint = f"host bits are set; did you mean {loose}?"
            except ValueError:
                hint = "is not a CIDR such as 203.0.113.0/24 or 2001:db8::/48"
            reader.fail(key, f"item {json.dumps(cidr)} {hint}")
            continue
        checked.append(network)
    spanning = [] if world_allowed else _world_spanning(checked)
    if spanning:
        named = " + ".join(str(network) for network in spanning)
        reader.fail(key, f"{named} opens this path to the whole internet. Fix: {world_fix}")
    return tuple(str(network) for network in checked)


def check_exposure(reader: Reader) -> Exposure:
    allow_public_api = bool(reader.boolean("allowPublicApi"))
    api_allowed_cidrs = _check_cidrs(
        reader,
        "apiAllowedCidrs",
        world_allowed=allow_public_api,
        world_fix=f"list your clients' CIDRs, or pulumi config set {NAMESPACE}:allowPublicApi true "
        "if the API (guarded by its key) is meant to be public",
    )
    admin_cidrs = _check_cidrs(
        reader,
        "adminCidrs",
        world_allowed=False,
        world_fix="SSH and the Ray dashboard run arbitrary code (ShadowRay, CVE-2023-48022); "
        'list only your own network, e.g. "$(curl -s https://checkip.amazonaws.com)/32"',
    )
    _check_gateway_rule_quota(reader, api_allowed_cidrs, admin_cidrs)
    return Exposure(api_allowed_cidrs, admin_cidrs, allow_public_api)


# The gateway's inbound rules that name the nodes' group (components/security.py
# _gateway_rules): the readiness probe on the API port, and Prometheus.
GATEWAY_RULES_FROM_NODES = 2


def _check_gateway_rule_quota(reader: Reader, api_allowed_cidrs: tuple[str, ...], admin_cidrs: tuple[str, ...]) -> None:
    """The gateway's group takes one inbound rule per API CIDR, two per admin CIDR (SSH
    and the dashboard) and two from the nodes' group (the readiness probe, Ray's
    dashboards reading Prometheus; components/security.py).
    EC2 refuses a group's 61st inbound rule of a family (the default quota, IPv4 and IPv6
    counted apart) in the middle of `pulumi up`; refuse such lists here instead. A rule
    that names a group counts against both families (aws_contract's reading)."""
    for version, family in ((4, "IPv4"), (6, "IPv6")):
        api = sum(1 for cidr in api_allowed_cidrs if ipaddress.ip_network(cidr).version == version)
        admin = sum(1 for cidr in admin_cidrs if ipaddress.ip_network(cidr).version == version)
        rules = api + 2 * admin + GATEWAY_RULES_FROM_NODES
        if rules <= aws_contract.RULES_PER_GROUP:
            continue
        key = "adminCidrs" if 2 * admin >= api else "apiAllowedCidrs"
        reader.fail(
            key,
            f"with apiAllowedCidrs ({api} {family}) and adminCidrs ({admin} {family}) the gateway's security "
            f"group needs {rules} inbound {family} rules (1 per API CIDR, 2 per admin CIDR for SSH and the "
            f"dashboard, {GATEWAY_RULES_FROM_NODES} from the nodes); AWS refuses more than "
            f"{aws_contract.RULES_PER_GROUP} per group and family by default ({aws_contract.VPC_QUOTAS_SOURCE}). "
            "Fix: merge neighbouring CIDRs into wider ones (e.g. four /26 into one /24), or reach the admin "
            "paths through one VPN or office CIDR",
        )
