"""The tests' name for the mock runtime harness, which lives in cli/mock_runtime.py
because the planner (`scripts/vllm-cluster plan`) runs the program with it too.

Also what only the tests need from a run: the URNs the real engine gives the
declared resources, the aliases each registration carried and the outputs each
component registered, which the harness does not record.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import pulumi

import cli.mock_runtime as mock_runtime
from cli.mock_runtime import (  # noqa: F401
    PROJECT,
    ROOT,
    STACKS_DIR,
    MockCloud,
    ProgramRun,
    ProjectConfigError,
    apply_project_config,
    ec2_stack_names,
    run_program,
    run_stack,
    stack_config,
    stack_names,
    unsecret,
)

ROOT_STACK_TYPE = "pulumi:pulumi:Stack"


def engine_urn(stack: str, project: str, parent_urn: str | None, type_: str, name: str) -> str:
    """The URN the Pulumi engine gives a resource (resource.CreateURN in pulumi/pulumi):
    urn:pulumi:<stack>::<project>::<parent's qualified type>$<type>::<name>, where the
    parent's qualified type is its own chain of types, and a resource whose parent is
    the stack has no parent type at all.

    The mock monitor's URNs (MockMonitor.make_urn) keep only the parent's last type
    and prefix top-level resources with the stack's type, so they differ from what a
    real stack's state holds; this is what `pulumi stack --show-urns` lists."""
    prefix = f"urn:pulumi:{stack}::{project}::"
    if parent_urn is None or _qualified_type(parent_urn) == ROOT_STACK_TYPE:
        return f"{prefix}{type_}::{name}"
    return f"{prefix}{_qualified_type(parent_urn)}${type_}::{name}"


def _qualified_type(urn: str) -> str:
    return urn.split("::")[2]


def engine_urns(run: ProgramRun, stack: str) -> dict[str, str]:
    """Mock URN -> engine URN for every resource of the run, parents first."""
    by_urn = {resource.urn: resource for resource in run.resources}
    found: dict[str, str] = {}

    def urn_of(mock_urn: str) -> str | None:
        if mock_urn not in by_urn:
            return None  # the stack itself, which the run does not list
        if mock_urn not in found:
            resource = by_urn[mock_urn]
            found[mock_urn] = engine_urn(stack, PROJECT, urn_of(resource.parent), resource.type, resource.name)
        return found[mock_urn]

    for resource in run.resources:
        urn_of(resource.urn)
    return found


@dataclass
class Registrations:
    """What the program sent the engine beyond the resources themselves, by (type, name)."""

    aliases: dict[tuple[str, str], list] = field(default_factory=dict)  # alias_pb2.Alias messages
    # The keys each component passed to register_outputs (a key whose value is None
    # never reaches the engine, so they are taken from the call itself).
    outputs: dict[tuple[str, str], set[str]] = field(default_factory=dict)


@contextmanager
def recording_registrations() -> Iterator[Registrations]:
    """Within the block, runs of the harness also record each registration's aliases
    and each component's registered outputs (the harness's monitor keeps neither)."""
    recorded = Registrations()
    harness_monitor = mock_runtime.RecordingMonitor
    register_outputs = pulumi.ComponentResource.register_outputs

    class Monitor(harness_monitor):
        def RegisterResource(self, request):
            recorded.aliases[(request.type, request.name)] = list(request.aliases)
            return super().RegisterResource(request)

    def recording_register_outputs(component, outputs):
        recorded.outputs[(component._type, component._name)] = set(outputs or {})
        return register_outputs(component, outputs)

    mock_runtime.RecordingMonitor = Monitor
    pulumi.ComponentResource.register_outputs = recording_register_outputs
    try:
        yield recorded
    finally:
        mock_runtime.RecordingMonitor = harness_monitor
        pulumi.ComponentResource.register_outputs = register_outputs


def run_stack_recorded(
    stack: str, overrides: Mapping[str, Any] | None = None, **kwargs
) -> tuple[ProgramRun, Registrations]:
    with recording_registrations() as recorded:
        run = run_stack(stack, overrides, **kwargs)
    return run, recorded


def alias_urns(run: ProgramRun, recorded: Registrations, stack: str) -> dict[str, list[str]]:
    """Engine URN of each resource -> the URNs its aliases stand for, resolved as the
    engine does (stepGenerator.collapseAliasToUrn in pulumi/pulumi): a field the alias
    leaves empty is the resource's own, and no parent or the stack means none."""
    engine = engine_urns(run, stack)
    resolved: dict[str, list[str]] = {}
    for resource in run.resources:
        urns = []
        for alias in recorded.aliases.get((resource.type, resource.name), []):
            if alias.WhichOneof("alias") == "urn":
                urns.append(alias.urn)
                continue
            spec = alias.spec
            parent = None if spec.noParent else engine.get(spec.parentUrn or resource.parent)
            urns.append(
                engine_urn(
                    spec.stack or stack,
                    spec.project or PROJECT,
                    parent,
                    spec.type or resource.type,
                    spec.name or resource.name,
                )
            )
        resolved[engine[resource.urn]] = urns
    return resolved


def user_data_parts(inputs: Mapping[str, Any]):
    """An instance's user data as cloud-init takes it apart (components/host_keys.py): the
    first-boot script and the host key, from the gzipped userDataBase64 (secret or not)."""
    import base64
    import gzip

    from components import host_keys

    packed = unsecret(inputs["userDataBase64"])
    return host_keys.user_data_parts(gzip.decompress(base64.b64decode(packed)).decode())


def booted_script(inputs: Mapping[str, Any]) -> str:
    """The script cloud-init's final stage runs from an instance's user data."""
    return user_data_parts(inputs).script
