"""How EFS decides whether an NFS client may mount, write or act as root, imitated
over the policies a program run declared (the identity policies of the client's
role and the file system policy), so tests judge what AWS would allow, not what a
helper meant to write.

The rules, from the EFS User Guide, "Using IAM to control access to file systems"
(https://docs.aws.amazon.com/efs/latest/ug/iam-access-control-nfs-efs.html):
- the client actions are ClientMount (read-only), ClientWrite and ClientRootAccess;
- an Allow in either the identity policy or the file system policy allows the action
  ("The permission does not need to be granted in both"); an explicit Deny wins;
- a client that mounts without IAM (no `iam` mount option) is anonymous: only file
  system policy statements for every principal ("*") apply to it;
- EFS enforces only these condition keys for NFS clients: aws:SecureTransport,
  aws:SourceIp, elasticfilesystem:AccessPointArn, elasticfilesystem:AccessedViaMountTarget.
A condition operator or key this imitation does not know raises, so a policy it
cannot judge fails the test instead of passing it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

CLIENT_ACTIONS = (
    "elasticfilesystem:ClientMount",
    "elasticfilesystem:ClientWrite",
    "elasticfilesystem:ClientRootAccess",
)
KNOWN_KEYS = {"aws:SecureTransport", "elasticfilesystem:AccessPointArn", "elasticfilesystem:AccessedViaMountTarget"}


@dataclass(frozen=True)
class Mount:
    """One NFS client's request, as EFS sees it."""

    access_point_arn: str
    role_arn: str | None  # None: mounted without IAM (anonymous)
    tls: bool = True
    via_mount_target: bool = True

    def context(self) -> dict[str, str]:
        return {
            "aws:SecureTransport": str(self.tls).lower(),
            "elasticfilesystem:AccessPointArn": self.access_point_arn,
            "elasticfilesystem:AccessedViaMountTarget": str(self.via_mount_target).lower(),
        }


def _values(value) -> list[str]:
    return [str(v).lower() if isinstance(v, bool) else str(v) for v in (value if isinstance(value, list) else [value])]


def _condition_holds(condition: dict, context: dict[str, str]) -> bool:
    for operator, tests in condition.items():
        for key, expected in tests.items():
            if key not in KNOWN_KEYS:
                raise ValueError(f"condition key {key} is not one EFS enforces for NFS clients")
            actual = context[key]
            if operator == "Bool":
                holds = actual in [v.lower() for v in _values(expected)]
            elif operator in ("StringEquals", "ArnEquals"):
                holds = actual in _values(expected)
            elif operator in ("StringNotEquals", "ArnNotEquals"):
                holds = actual not in _values(expected)
            else:
                raise ValueError(f"condition operator {operator} is not imitated here")
            if not holds:
                return False
    return True


def _matches_action(statement: dict, action: str) -> bool:
    actions = _values(statement.get("Action", []))
    return any(a == "*" or a == action or a == "elasticfilesystem:*" for a in actions)


def _matches_resource(statement: dict, file_system_arn: str) -> bool:
    resources = _values(statement.get("Resource", "*"))
    return any(
        r == "*" or r == file_system_arn or (r.endswith("*") and file_system_arn.startswith(r[:-1])) for r in resources
    )


def _matches_principal(statement: dict, role_arn: str | None) -> bool:
    principal = statement.get("Principal")
    if principal is None:
        raise ValueError("a file system policy statement without Principal")
    allowed = _values(principal["AWS"] if isinstance(principal, dict) else principal)
    return "*" in allowed or (role_arn is not None and role_arn in allowed)


def allowed(
    action: str, mount: Mount, file_system_arn: str, file_system_policy: str, identity_policies: list[str]
) -> bool:
    """Whether EFS lets `mount` do `action`. `identity_policies`: the JSON policies of
    the client's role (ignored for an anonymous client)."""
    if action not in CLIENT_ACTIONS:
        raise ValueError(action)
    context = mount.context()
    statements = [
        (statement, True)
        for statement in _statements(file_system_policy)
        if _matches_principal(statement, mount.role_arn)
    ]
    if mount.role_arn is not None:
        statements += [(statement, False) for policy in identity_policies for statement in _statements(policy)]
    verdicts = [
        statement["Effect"]
        for statement, _ in statements
        if _matches_action(statement, action)
        and _matches_resource(statement, file_system_arn)
        and _condition_holds(statement.get("Condition", {}), context)
    ]
    return "Deny" not in verdicts and "Allow" in verdicts


def _statements(policy: str) -> list[dict]:
    document = json.loads(policy)
    statements = document["Statement"]
    return statements if isinstance(statements, list) else [statements]
