"""Record a deliberate change of named resources in tests/golden/resources-<stack>.txt.

The golden files hold every resource as the program declared it before replicas, so
that `replicas: 1` is held to it. When a later change alters a resource on purpose (a
fix AWS requires, say), only that resource's line is rewritten, and the file's header
gains a line saying which resource changed and why. Any other resource that differs
from its line stops the update: that is a change nobody meant.

    venv/bin/python tests/golden/update_golden.py --resource vllm-gateway-host --why "..."
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent))

from pulumi_mocks import run_stack, stack_names  # noqa: E402
from test_replicas_program import golden_identities, resource_identities  # noqa: E402


def resource_name(urn: str) -> str:
    return urn.rsplit("::", 1)[1]


def update(stack: str, names: set[str], why: str) -> list[str]:
    """Rewrites the named resources' lines; returns the URNs rewritten."""
    run = run_stack(stack, {"replicas": None})
    if run.error is not None:
        raise SystemExit(f"{stack}: the program failed: {run.error}")
    identities = resource_identities(run, stack)
    golden = golden_identities(stack)
    unexpected = sorted(
        urn
        for urn in set(golden) | set(identities)
        if golden.get(urn) != identities.get(urn) and resource_name(urn) not in names
    )
    if unexpected:
        raise SystemExit(f"{stack}: resources changed that were not named: {unexpected}")
    changed = sorted(urn for urn in set(golden) | set(identities) if golden.get(urn) != identities.get(urn))
    path = HERE / f"resources-{stack}.txt"
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    if changed:
        header.append(f"# Changed on purpose: {', '.join(sorted({resource_name(u) for u in changed}))}: {why}")
    body = [f"{urn} {identities[urn]}" for urn in sorted(identities)]
    path.write_text("\n".join(header + body) + "\n")
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resource", action="append", required=True, help="a resource name to update (repeatable)")
    parser.add_argument("--why", required=True, help="the reason, recorded in the file's header")
    parser.add_argument("--stack", action="append", help="a stack (default: every stack file)")
    options = parser.parse_args()
    for stack in options.stack or stack_names():
        for urn in update(stack, set(options.resource), options.why):
            print(f"{stack}: updated {urn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
