"""Replicas under Pulumi's mock runtime: `replicas: 1` (or no `replicas` key) declares
exactly what stacks deployed before replicas existed, so their `pulumi up` replaces
nothing; more replicas add whole gangs, each with its own placement group and Ray
cluster, behind the one gateway."""

import hashlib
import json

import pytest
from pulumi_mocks import ROOT, engine_urns, run_stack, stack_names

STACKS = stack_names()
GOLDEN = ROOT / "tests" / "golden"
COMMAND = "command:remote:Command"


def resource_identities(run, stack: str) -> dict[str, str]:
    """Engine URN -> a digest of what the engine compares on `pulumi up`: the inputs
    (remote commands aside, whose scripts change with any script edit and only re-run
    a command) and the dependencies."""
    engine = engine_urns(run, stack)
    identities = {}
    for resource in run.resources:
        inputs = {} if resource.type == COMMAND else resource.inputs
        document = {
            "inputs": inputs,
            "dependencies": sorted(engine.get(d, d) for d in resource.dependencies),
            "deleteBeforeReplace": resource.delete_before_replace,
            "ignoreChanges": sorted(resource.ignore_changes),
        }
        encoded = json.dumps(document, sort_keys=True, default=str).encode()
        identities[engine[resource.urn]] = hashlib.sha256(encoded).hexdigest()[:16]
    return identities


def golden_identities(stack: str) -> dict[str, str]:
    """tests/golden/resources-<stack>.txt, recorded from the program before replicas."""
    lines = (GOLDEN / f"resources-{stack}.txt").read_text().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize("stack", STACKS)
def test_one_replica_declares_exactly_what_stacks_deployed_before_replicas(stack):
    run = run_stack(stack, {"replicas": None})
    assert run.error is None, run.error
    identities = resource_identities(run, stack)
    golden = golden_identities(stack)
    assert sorted(set(identities) - set(golden)) == [], "new resources with one replica"
    assert sorted(set(golden) - set(identities)) == [], "resources gone with one replica"
    changed = sorted(urn for urn in golden if golden[urn] != identities[urn])
    assert changed == [], "resources whose inputs or options changed with one replica"
