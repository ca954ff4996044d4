"""load_spec: every checker over the raw config, in order, then the ClusterSpec."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, Mapping

from components import idle_stop, sizing, stage_volume
from components.config_keys import NAMESPACE
from components.spec.capacity import check_capacity
from components.spec.cluster_shape import check_cluster_shape, check_fabric_floor
from components.spec.cluster_spec import ClusterSpec
from components.spec.engine_fit import check_engine_fit
from components.spec.engine_settings import check_engine_settings
from components.spec.exposure import check_exposure
from components.spec.gateway import check_gateway, check_user_certificate
from components.spec.model_source import check_model_source
from components.spec.network_placement import check_network
from components.spec.node_software import check_node_software
from components.spec.node_storage import NODE_IMAGE_NONE, check_node_storage, check_stage_volume
from components.spec.own_hosts import check_own_hosts
from components.spec.reader import Problem, Reader, SpecError, check_known_keys
from components.spec.secrets import check_secrets
from components.spec.sleep_and_wake import check_idle_stop, check_max_replicas, check_wake_give_up


def _fields(piece: Any) -> dict[str, Any]:
    """A piece's fields by name, shallow (dataclasses.asdict would turn the InstanceType
    and ExistingNetwork inside into dicts)."""
    return {f.name: getattr(piece, f.name) for f in fields(piece)}


def resolve_stage_volume(spec: ClusterSpec, chosen: str | None) -> str:
    """stageVolume auto: ebs when idleStopMinutes is set, the stack serves from each node's
    local copy of its stage (sizing.serves_from_local_disk: the volume only changes which disk
    is under that copy's path, never vLLM's path) and the wake with the stage volume is the
    shorter by at least a Retry-After (idle_stop.stage_volume_wakes_faster), else the
    instance store. ebs on a stack that serves from the EFS cache is refused: there is no
    local copy to keep."""
    local, reason = sizing.serves_from_local_disk(spec)
    if chosen == stage_volume.STAGE_VOLUME_EBS and not local:
        raise SpecError(
            [
                Problem(
                    "stageVolume",
                    chosen,
                    f"the stack serves from the EFS cache, not from a local copy of each node's stage ({reason}), "
                    f"so there is no stage for a volume to keep. Fix: pulumi config rm {NAMESPACE}:stageVolume, or "
                    "choose an instance type whose instance store holds the stage",
                )
            ]
        )
    if chosen is not None:
        return chosen
    if (
        spec.own_hosts is None
        and spec.idle_stop_minutes
        and local
        and idle_stop.stage_volume_wakes_faster(spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
    ):
        return stage_volume.STAGE_VOLUME_EBS
    return stage_volume.STAGE_VOLUME_INSTANCE_STORE


def load_spec(
    raw: Mapping[str, Any],
    *,
    stack: str,
    region: str | None = None,
    secret_keys: set[str] | None = None,
) -> ClusterSpec:
    """Validate `raw` (config key without namespace -> value) and return the spec.

    `region` is the stack's aws:region, which an availabilityZone must lie in; None
    skips that check. `secret_keys` names the keys (without namespace) that were set
    with --secret; None skips that check (for callers that hold no stack, such as the
    planner).

    Raises SpecError with every problem found. Warnings that should not stop a
    deployment are returned in `spec.warnings`.
    """
    reader = Reader(raw)
    pieces, settings, chosen_stage_volume = _check_every_key(reader, region, secret_keys)
    if reader.problems:
        raise SpecError(reader.problems)
    spec = ClusterSpec(
        stack=stack,
        **{name: value for piece in pieces for name, value in _fields(piece).items()},
        **settings,
        warnings=tuple(reader.warnings),
    )
    spec = dataclasses.replace(spec, stage_volume=resolve_stage_volume(spec, chosen_stage_volume))
    return _with_wake_warnings(spec)


def _check_every_key(
    reader: Reader, region: str | None, secret_keys: set[str] | None
) -> tuple[tuple[Any, ...], dict[str, Any], str | None]:
    """Every checker, in the order their problems are reported: the pieces of the spec, the
    spec's fields that no piece holds, and stageVolume as set (resolved once the spec is whole)."""
    check_known_keys(reader)
    source = check_model_source(reader)
    engine = check_engine_settings(reader)
    own = check_own_hosts(reader, secret_keys)
    shape = check_cluster_shape(reader, own)
    exposure = check_exposure(reader)
    secrets = check_secrets(reader, secret_keys)
    software = check_node_software(reader)
    network = check_network(reader, region)
    capacity = check_capacity(reader, network)
    storage = check_node_storage(reader)
    if own is not None:
        # Machines the user has: nothing is launched, so no image (own_hosts refuses a nodeImage set).
        storage = dataclasses.replace(storage, node_image=NODE_IMAGE_NONE)
    gateway = check_gateway(reader, engine)
    tls = check_user_certificate(reader, secret_keys)
    idle_stop_minutes = check_idle_stop(reader)
    settings = {
        "tls": tls,
        "own_hosts": own,
        "idle_stop_minutes": idle_stop_minutes,
        "wake_give_up_minutes": check_wake_give_up(reader, idle_stop_minutes),
        "max_replicas": check_max_replicas(reader, shape.replicas, idle_stop_minutes),
        "fabric_floor_gbps": check_fabric_floor(reader),
    }
    chosen_stage_volume = check_stage_volume(reader)
    check_engine_fit(reader, source, engine, shape)
    pieces = (source, engine, shape, exposure, secrets, software, network, capacity, storage, gateway)
    return pieces, settings, chosen_stage_volume


def _with_wake_warnings(spec: ClusterSpec) -> ClusterSpec:
    """With idleStopMinutes, the warnings about an idle time or a give-up bound short beside
    the expected wake: the wake the planner prints and the waker is told (components/idle_stop.py)."""
    if not spec.idle_stop_minutes:
        return spec
    wake = idle_stop.expected_wake_seconds(
        spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, spec.on_stage_volume
    )
    warnings = [
        idle_stop.short_idle_warning(spec.idle_stop_minutes, wake, spec.nodes, spec.instance.price_per_hour_usd),
        idle_stop.short_give_up_warning(spec.wake_give_up_minutes, wake),
    ]
    return dataclasses.replace(spec, warnings=(*spec.warnings, *(w for w in warnings if w)))
