"""`vllm-cluster plan --stack NAME`: what a stack would create and whether it works,
offline (no AWS, no Pulumi CLI). The resource list comes from running the real
program under the mock runtime; the figures from components/sizing/; the
`vllm serve` arguments from the same function the bootstrap uses. Every declared
resource's inputs go through AWS's own rules (components/aws_contract.py): what EC2,
IAM or EFS would refuse is shown as a problem of the stack before anything exists.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import Any

from cli.stack_file import read_stack
from components import (
    aws_contract,
    bootstrap,
    gateway_capacity,
    idle_stop,
    image,
    metrics,
    models,
    prometheus_sizing,
    quotas,
    sizing,
    stage_volume,
    versions,
    warm_pool_cost,
)
from components.catalog import InstanceType
from components.topology import node_name, topology_summary


def _kv_cache_dtype(spec) -> str | None:
    """The value of --kv-cache-dtype among vllmExtraArgs (`--kv-cache-dtype fp8` or `=fp8`)."""
    args = list(spec.vllm_extra_args)
    for i, arg in enumerate(args):
        if arg == "--kv-cache-dtype" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--kv-cache-dtype="):
            return arg.split("=", 1)[1]
    return None


def resources_by_component(run) -> dict[str, dict[str, int]]:
    components = {
        r.urn: r.name + " (" + r.type.rsplit(":", 1)[1] + ")"
        for r in run.resources
        if r.type.startswith("vllm-cluster:index:")
    }
    grouped: dict[str, Counter] = defaultdict(Counter)
    for resource in run.resources:
        if resource.urn in components:
            continue
        owner = components.get(resource.parent, "(stack)")
        grouped[owner][resource.type] += 1
    return {
        owner: dict(sorted(counts.items()))
        for owner, counts in sorted(grouped.items(), key=lambda kv: kv[0].split("(")[1])
    }


def _nodes(
    topology: dict[str, Any], layers: list[tuple[int, int]] | None, ips: tuple[str, ...] | None = None
) -> list[dict[str, Any]]:
    """Each node's role, GPUs, ranks and pipeline stages with the layers each holds; the
    IPs of gang 0's hosts when the stack lists them (hosts), else placeholders."""
    return [
        {
            "node": node["node"],
            "role": node["role"],
            "ip": ips[node["node"]] if ips else f"<{node_name(node['node'])}-ip>",
            "gpus": node["gpus"],
            "ranks": node["ranks"],
            "stages": [
                {"stage": stage, "layers": list(layers[stage]) if layers else None} for stage in node["pipelineStages"]
            ],
        }
        for node in topology["nodes"]
    ]


def _fit(the_fit: sizing.Fit, gpu_memory_utilization: float | None) -> dict[str, Any]:
    return {
        "weightsPerGpuGiB": round(the_fit.weights_per_rank_gib, 2),
        "gpuMemoryGiB": the_fit.gpu_memory_gib,
        "gpuMemoryUtilization": gpu_memory_utilization or sizing.DEFAULT_GPU_MEMORY_UTILIZATION,
        "usablePerGpuGiB": round(the_fit.usable_per_rank_gib, 2),
        "runtimeOverheadGiB": sizing.RUNTIME_OVERHEAD_GIB,
        "kvCachePerGpuGiB": round(the_fit.kv_room_per_rank_gib, 2),
        "contextTokens": the_fit.context_tokens,
        "maxModelLen": the_fit.max_model_len,
        "verdict": the_fit.reason,
    }


def _cost(the_cost: sizing.Cost, instance: InstanceType) -> dict[str, Any]:
    return {
        "gpuNodes": round(the_cost.gpu_nodes, 4),
        "gateway": the_cost.gateway,
        "natGateway": the_cost.nat_gateway,
        "modelCache": round(the_cost.model_cache, 4),
        "priceDate": instance.price_date,
        "priceSource": instance.price_source,
    }


def build_plan(
    stack: str,
    params_b: float | None = None,
    dtype: str | None = None,
    stack_file: str | None = None,
    busy_hours: int | None = None,
) -> dict[str, Any]:
    """The plan of stacks/Pulumi.<stack>.yaml (or `stack_file`). Raises StackFileError
    when the stack file cannot be read or its config is refused; ValueError when
    `busy_hours` (--busy-hours, a day's busy hours of a warm pool) is out of 0..24 or the
    stack has no warm gang to price it with."""
    the_stack = read_stack(stack, stack_file)  # first: a bad stack file is reported before the engine loads
    if busy_hours is not None:
        _check_busy_hours(the_stack.spec, stack, busy_hours)
    run = _declared_run(the_stack, stack)
    spec = the_stack.spec
    info = models.lookup(spec.model)
    model = _model_size(spec, info, params_b, dtype)
    tp, pp, instance = spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.instance
    the_fit = sizing.fit(model, instance, tp, pp, spec.gpu_memory_utilization, spec.max_model_len)
    contract = aws_contract.check(run.resources, run.id_of)
    prometheus = _prometheus(spec)
    gateway = _gateway(spec, prometheus)
    # The plan's sections, in the order its JSON and text show them: what the stack
    # declares, whether the model fits, what it costs, how long it takes to serve, and
    # what would stop it.
    return {
        "stack": stack,
        **_what_it_declares(spec, run, model, "model table" if info and params_b is None else "--params-b"),
        **_fit_section(spec, model, the_fit),
        **_cost_section(spec, the_fit.weights_gb, busy_hours, prometheus),
        "gateway": gateway,
        **_time_section(spec, model),
        **_problems_section(spec, model, the_fit, contract, prometheus, the_stack.secret_keys),
    }


def _check_busy_hours(spec, stack: str, busy_hours: int) -> None:
    """--busy-hours prices a warm pool: refused out of 0..24, or for a stack without one."""
    warm_pool_cost.parse_busy_hours(str(busy_hours))
    if not _has_warm_gangs(spec):
        replicas = spec.replicas
        raise ValueError(_NO_WARM_GANGS.format(hours=busy_hours, stack=stack, replicas=replicas, more=replicas + 1))


def _declared_run(the_stack, stack: str):
    """The real program's run under the mock runtime: the resources it declares."""
    from cli.mock_runtime import run_program  # the engine: only the planner pays for it

    run = run_program(dict(the_stack.config), stack=stack, secret_keys=the_stack.secret_keys)
    if run.error is not None:
        raise RuntimeError(f"the program failed under the mock runtime: {run.error}")
    return run


def _model_size(spec, info, params_b: float | None, dtype: str | None) -> sizing.ModelSize:
    """The model's size from the model table (`info`) or --params-b and --dtype, with
    the KV cache in fp8 when vllmExtraArgs ask for it."""
    model = sizing.ModelSize.of(info, spec.model, params_b, dtype)
    if (_kv_cache_dtype(spec) or "").startswith("fp8"):
        model = dataclasses.replace(model, kv_cache_dtype="fp8")
    return model


def _what_it_declares(spec, run, model: sizing.ModelSize, model_source: str) -> dict[str, Any]:
    """The plan's first section: the model, the cluster, its hosts and image, the
    resources by component, and each node's ranks, layers and model bytes."""
    tp, pp, instance = spec.tensor_parallel_size, spec.pipeline_parallel_size, spec.instance
    loads = sizing.node_loads(model, instance, spec.nodes, pp, readers=spec.total_nodes)
    topology = topology_summary(spec.nodes, spec.gpus_per_node, tp, pp)
    layers = sizing.stage_layers(model.layers, pp) if model.layers else None
    return {
        "model": {
            "name": model.name,
            "paramsB": model.params_b,
            "dtype": model.dtype,
            "source": model_source,
            "layers": model.layers,
        },
        "cluster": _cluster(spec),
        "hosts": _own_hosts(spec),
        # components/image.py: what the nodes boot, or the stack's own AMI.
        "image": (
            {"amiId": spec.ami_id} if spec.ami_id else {"name": image.DLAMI_DESCRIPTION, "python": image.python_label()}
        ),
        "resources": resources_by_component(run),
        "resourceCount": len(run.resources),
        "nodes": _nodes(topology, layers, spec.own_hosts.gangs[0] if spec.own_hosts else None),
        "modelBytes": _model_bytes(model, spec, loads, topology),
        "ranks": topology["ranks"],
    }


def _fit_section(spec, model: sizing.ModelSize, the_fit: sizing.Fit) -> dict[str, Any]:
    """Whether the weights and a KV cache fit the GPUs, and if not the smallest
    instance and shape that would hold them."""
    smallest = None
    if not the_fit.fits:
        option = sizing.smallest_fit(model, spec.gpu_memory_utilization, spec.max_model_len)
        smallest = option.__dict__ if option else None
    return {
        "weightsGB": round(the_fit.weights_gb, 1),
        "fits": the_fit.fits,
        "fit": _fit(the_fit, spec.gpu_memory_utilization),
        "smallestFit": smallest,
    }


def _cost_section(spec, weights_gb: float, busy_hours: int | None, prometheus: dict[str, Any]) -> dict[str, Any]:
    """What the stack costs running, idle and as a warm pool, the vCPU quotas it needs,
    and the gateway's Prometheus."""
    # Every gang is a full copy: its nodes cost as much as the first gang's.
    the_cost = sizing.cost(spec.instance, spec.total_nodes, spec.gateway_instance_type, weights_gb)
    return {
        # Machines of the user's own cost the stack nothing on AWS.
        "costPerHourUsd": round(the_cost.per_hour, 4) if spec.own_hosts is None else 0.0,
        "costPerDayUsd": round(the_cost.per_day, 2) if spec.own_hosts is None else 0.0,
        "cost": _cost(the_cost, spec.instance),
        "vcpuQuotas": _vcpu_quotas(spec) if spec.own_hosts is None else None,
        "idleStop": _idle_stop(spec, weights_gb) if spec.own_hosts is None else None,
        # maxReplicas above replicas (issue 36): the cost of the range and the time to add a gang.
        "warmPool": _warm_pool(spec, weights_gb, busy_hours) if _has_warm_gangs(spec) else None,
        "prometheus": prometheus,
    }


def _time_section(spec, model: sizing.ModelSize) -> dict[str, Any]:
    """How long the first `pulumi up` takes to the first token, term by term, the
    engine's start limits, and the bake of the node image."""
    instance = spec.instance
    # The gangs start in parallel on the first `pulumi up`, so the time to the first token
    # is one gang's; but every gang's nodes read the cache at once.
    terms = sizing.time_to_first_token(
        model,
        instance,
        spec.nodes,
        spec.pipeline_parallel_size,
        readers=spec.total_nodes,
        baked_image=spec.launches_with_software,
    )
    bake = sizing.image_bake() if spec.bakes_node_image else []
    if spec.own_hosts is not None:
        # Machines that run already, with a shared directory of the user's: no launch, no EFS helper.
        terms = [term for term in terms if term.name not in OWN_HOSTS_SKIP_TERMS]
    return {
        "timeToFirstTokenSeconds": round(sum(t.seconds for t in terms)),
        "engineReadyTimeoutSeconds": sizing.engine_ready_timeout_for(spec.model, instance, spec.nodes),
        "engineStartStallSeconds": sizing.engine_start_stall_for(spec.model, instance, spec.nodes),
        "timeToFirstToken": [{"term": t.name, "seconds": round(t.seconds), "assumes": t.assumes} for t in terms],
        # nodeImage: the image the nodes launch with the software in, and its bake (once per
        # lock and base image; a stack that finds the image skips it).
        "nodeImage": spec.node_image,
        "imageBake": [{"term": t.name, "seconds": round(t.seconds), "assumes": t.assumes} for t in bake],
        "imageBakeSeconds": round(sum(t.seconds for t in bake)),
    }


def _problems_section(
    spec,
    model: sizing.ModelSize,
    the_fit: sizing.Fit,
    contract: aws_contract.Contract,
    prometheus: dict[str, Any],
    secret_keys: list[str],
) -> dict[str, Any]:
    """What would stop the stack or deserves a look: what AWS would refuse, the
    warnings of every part; and what the nodes would run, and the secrets not read."""
    return {
        # What AWS would refuse of the inputs as declared: `pulumi up` would fail there.
        "problems": [str(finding) for finding in contract.errors],
        "awsContract": {
            "ok": contract.ok,
            "errors": [dataclasses.asdict(finding) for finding in contract.errors],
            "warnings": [dataclasses.asdict(finding) for finding in contract.warnings],
        },
        "warnings": sizing.warnings_for(model, spec.instance, spec.tensor_parallel_size, the_fit)
        + list(spec.warnings)
        + [str(finding) for finding in contract.warnings]
        + prometheus["warnings"]
        + _gateway(spec, prometheus)["warnings"],
        "vllmServeArgs": bootstrap.vllm_serve_args(spec, "<head-ip>"),
        "secretsNotRead": secret_keys,
    }


def _vcpu_quotas(spec) -> dict[str, Any]:
    """What the stack needs of EC2's On-Demand vCPU quotas (components/quotas.py)."""
    needs, uncounted = quotas.needs(spec.instance_type, spec.total_nodes, spec.gateway_instance_type)
    return {"needs": [need.as_dict() for need in needs], "uncounted": uncounted}


def _idle_stop(spec, weights_gb: float) -> dict[str, Any]:
    """An hour without a request, with and without idleStopMinutes, at the prices the cost
    above uses plus the EBS root volumes; and how long a stopped gang takes to serve again
    (components/idle_stop.py: the figure the gateway's waker is told)."""
    from components.gateway import GATEWAY_ROOT_GIB  # the Gateway component's module: Pulumi, as the run above

    volume = stage_volume.stage_volume_for(spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
    hour = idle_stop.idle_hour(
        spec.instance,
        spec.total_nodes,
        spec.gateway_instance_type,
        weights_gb,
        spec.root_volume_gib,
        GATEWAY_ROOT_GIB,
        volume.hour_usd if spec.on_stage_volume else 0.0,
    )
    wakes = {
        choice: idle_stop.wake_terms(
            spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, choice == stage_volume.STAGE_VOLUME_EBS
        )
        for choice in (stage_volume.STAGE_VOLUME_INSTANCE_STORE, stage_volume.STAGE_VOLUME_EBS)
    }
    terms = wakes[spec.stage_volume]
    return {
        "idleStopMinutes": spec.idle_stop_minutes,
        "idleHourWithoutUsd": round(hour.without_stop, 4),
        "idleHourWithUsd": round(hour.with_stop, 4),
        "gpuNodes": round(hour.gpu_nodes, 4),
        "gateway": hour.gateway,
        "natGateway": hour.nat_gateway,
        "modelCache": round(hour.model_cache, 4),
        "ebs": round(hour.ebs, 4),
        "ebsGiB": spec.total_nodes * spec.root_volume_gib + GATEWAY_ROOT_GIB,
        "ebsGbMonthUsd": idle_stop.EBS_GP3_GB_MONTH,
        "stageVolumesHour": round(hour.stage_volumes, 4),
        "stageVolume": _stage_volume(spec, volume, wakes),
        "notCounted": "data through the NAT gateway and public IPv4 addresses (the same with or without)",
        "wakeSeconds": round(sum(t.seconds for t in terms)),
        "wake": [{"term": t.name, "seconds": round(t.seconds), "assumes": t.assumes} for t in terms],
        "retryAfterSeconds": idle_stop.RETRY_AFTER_SECONDS,
        # What the waker is told (idle_stop.waker_config): a wake that has not served by then
        # is given up and what it started stopped.
        "giveUpSeconds": idle_stop.wake_give_up_seconds(
            round(sum(t.seconds for t in terms)), spec.wake_give_up_minutes
        ),
    }


def _stage_volume(spec, volume: stage_volume.StageVolume, wakes: dict[str, list]) -> dict[str, Any]:
    """stageVolume (components/stage_volume.py): the choice, the volume ebs would give each
    node and its cost, and the wake with either."""
    return {
        "chosen": spec.stage_volume,
        # The volume only keeps a local copy of the stage: a stack that serves from the
        # EFS cache has none (components/spec/loader.py resolve_stage_volume).
        "offered": sizing.serves_from_local_disk(spec)[0],
        "sizeGiB": volume.size_gib,
        "iops": volume.iops,
        "throughputMiBs": volume.throughput_mib_s,
        "monthUsdPerNode": round(volume.month_usd, 2),
        "monthUsd": round(volume.month_usd * spec.total_nodes, 2),
        "nodes": spec.total_nodes,
        "costBreakdown": volume.cost_breakdown(),
        "pricingSource": stage_volume.EBS_PRICING_SOURCE,
        "wakeSeconds": {choice: round(sum(t.seconds for t in wake)) for choice, wake in wakes.items()},
    }


def _has_warm_gangs(spec) -> bool:
    """maxReplicas above replicas on AWS (the spec refuses it with hosts of the user's own)."""
    return spec.own_hosts is None and idle_stop.scales(spec.replicas, spec.max_replicas)


_NO_WARM_GANGS = (
    f"{warm_pool_cost.BUSY_HOURS_FLAG} {{hours}}: stack {{stack}} has no warm gang (maxReplicas is not above "
    "replicas), so its cost does not follow the busy hours. Fix: drop "
    f"{warm_pool_cost.BUSY_HOURS_FLAG}, or pulumi config set vllm-cluster:maxReplicas {{more}} or more ({{replicas}} "
    "always on, the rest warm: started when requests queue; with vllm-cluster:idleStopMinutes)"
)


def _warm_pool(spec, weights_gb: float, busy_hours: int | None) -> dict[str, Any]:
    """The cost of the range a warm pool spans (components/warm_pool_cost.py) at the
    prices the cost and idle stop above use, and how long adding a gang takes: the
    waker's scale-out hold, then a wake (the terms idle stop prints)."""
    from components.gateway import GATEWAY_ROOT_GIB  # the Gateway component's module: Pulumi, as the run above

    the_cost = sizing.cost(spec.instance, spec.nodes, spec.gateway_instance_type, weights_gb)
    volume = stage_volume.stage_volume_for(spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
    stage_hour = volume.hour_usd if spec.on_stage_volume else 0.0
    ebs_hour_per_gib = idle_stop.EBS_GP3_GB_MONTH / sizing.HOURS_PER_MONTH
    pool = warm_pool_cost.WarmPoolCost(
        replicas=spec.replicas,
        max_replicas=spec.max_replicas,
        nodes=spec.nodes,
        node_hour=spec.instance.price_per_hour_usd,
        node_volumes_hour=spec.root_volume_gib * ebs_hour_per_gib + stage_hour,
        shared_hour=the_cost.gateway
        + the_cost.nat_gateway
        + the_cost.model_cache
        + GATEWAY_ROOT_GIB * ebs_hour_per_gib,
    )
    terms = idle_stop.wake_terms(
        spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, spec.on_stage_volume
    )
    wake = round(sum(t.seconds for t in terms))
    hold = idle_stop.SCALE_OUT_HOLD_SECONDS
    return {
        "replicas": spec.replicas,
        "maxReplicas": spec.max_replicas,
        "nodesPerGang": spec.nodes,
        "gangHourUsd": round(pool.gang_hour, 4),
        "sharedHourUsd": round(pool.shared_hour, 4),
        "stoppedGangHourUsd": round(pool.gang_volumes_hour, 4),
        "rootGiBPerNode": spec.root_volume_gib,
        "stageVolumeGiBPerNode": volume.size_gib if spec.on_stage_volume else 0,
        "allOn": {
            "gangs": spec.max_replicas,
            "hourUsd": round(pool.all_on_hour, 4),
            "monthUsd": round(pool.month(pool.all_on_hour), 2),
        },
        "replicasOn": {
            "gangs": spec.replicas,
            "hourUsd": round(pool.replicas_hour, 4),
            "monthUsd": round(pool.month(pool.replicas_hour), 2),
        },
        "busyHours": busy_hours,
        "mixMonthUsd": round(pool.mix_month(busy_hours), 2) if busy_hours is not None else None,
        "hoursPerMonth": sizing.HOURS_PER_MONTH,
        # Adding a gang: requests waiting on the serving gangs above the threshold for the
        # hold time (the waker's scale_decision), then a wake of a stopped gang.
        "scaleOutWaitingPerGang": idle_stop.SCALE_OUT_WAITING_PER_GANG,
        "scaleOutHoldSeconds": hold,
        "wakeSeconds": wake,
        "wake": [{"term": t.name, "seconds": round(t.seconds)} for t in terms],
        "addGangSeconds": hold + wake,
        "retryAfterSeconds": idle_stop.RETRY_AFTER_SECONDS,
    }


def _prometheus(spec) -> dict[str, Any]:
    """Prometheus on the gateway (components/prometheus_sizing.py, issue 21): the series
    per node and for the stack's gangs, the memory against the gateway type's, the disk
    for the retention time against the retention size limit."""
    from components.gateway import GATEWAY_ROOT_GIB  # the Gateway component's module: Pulumi, as the run above

    sized = prometheus_sizing.gateway_sizing(
        # Every declared gang is scraped, stopped warm ones too (their targets stay listed).
        spec.declared_gangs,
        spec.nodes,
        spec.gpus_per_node,
        spec.gateway_instance_type if spec.own_hosts is None else OWN_GATEWAY,
        GATEWAY_ROOT_GIB,
    )
    load = sized.ingest
    return {
        "measuredOn": prometheus_sizing.MEASURED_ON,
        "measuredBy": prometheus_sizing.MEASURED_BY,
        "seriesPerNode": {
            "head": load.head,
            "worker": load.worker,
            "vllm": prometheus_sizing.VLLM_HEAD_SERIES,
            "ray": prometheus_sizing.ray_node_series(load.gpus_per_node),
            "rayPerGpu": prometheus_sizing.RAY_SERIES_PER_GPU,
        },
        "gangs": load.gangs,
        "nodesPerGang": load.nodes,
        "targets": load.targets,
        "prometheusSelfSeries": prometheus_sizing.PROMETHEUS_SELF_SERIES,
        "seriesPerTarget": prometheus_sizing.SERIES_PER_TARGET,
        "recordedSeriesPerGang": prometheus_sizing.recorded_series_per_gang(),
        "series": load.series,
        "scrapeInterval": metrics.SCRAPE_INTERVAL,
        "samplesPerSecond": round(load.samples_per_second, 1),
        "memory": {
            "gatewayType": sized.gateway_type,
            "gatewayMiB": sized.memory_mib,
            "neededMiB": round(sized.needed_mib),
            "baseMiB": prometheus_sizing.GATEWAY_BASE_MIB,
            "seriesMiB": round(prometheus_sizing.series_mib(load.series), 1),
            "bytesPerSeries": prometheus_sizing.BYTES_PER_HEAD_SERIES,
            "share": prometheus_sizing.MEMORY_SHARE,
            "fits": sized.memory_fits,
        },
        "disk": {
            "rootGiB": GATEWAY_ROOT_GIB,
            "retentionDays": sized.retention_days,
            "retentionGiB": round(sized.retention_mib / 1024, 2),
            "bytesPerSample": prometheus_sizing.BYTES_PER_SAMPLE,
            "retentionLimitMiB": sized.retention_limit_mib,
            "daysAtLimit": round(sized.days_at_limit, 1),
        },
        # The memory line says what a gateway of the user's own needs; the gateway-type
        # warning is about gatewayInstanceType, which such a stack does not use.
        "warnings": list(sized.warnings) if spec.own_hosts is None else [],
    }


def _gateway(spec, prometheus: dict[str, Any]) -> dict[str, Any]:
    """What the gateway's nginx holds (components/gateway_capacity.py, issue 48) and its
    instance type against that load: CPU for TLS and SSE at every gang's full batch and
    memory per stream, estimates; a type the planner does not know is not checked."""
    sized = gateway_capacity.spec_capacity(spec)
    own = spec.own_hosts is not None
    load = gateway_capacity.gateway_load(
        sized,
        OWN_GATEWAY if own else spec.gateway_instance_type,
        None if own else quotas.GATEWAY_VCPUS.get(spec.gateway_instance_type),
        None if own else prometheus_sizing.gateway_memory_mib(spec.gateway_instance_type),
        prometheus["memory"]["neededMiB"],
    )
    return {
        "gangs": sized.gangs,
        "maxNumSeqs": sized.max_num_seqs,
        "streams": sized.streams,
        "workerConnections": sized.worker_connections,
        "workerRlimitNofile": sized.open_files,
        "upstreamKeepalive": sized.upstream_keepalive,
        "minStreams": gateway_capacity.MIN_STREAMS,
        "load": {
            "instanceType": load.instance_type,
            "eventsPerSecond": load.events_per_second,
            "vcpusNeeded": round(load.vcpus_needed, 2),
            "vcpusSustained": load.vcpus_sustained,
            "nginxMiB": round(load.nginx_mib),
            "memoryMiB": load.memory_mib,
            "tokensPerSecondPerSequence": gateway_capacity.ESTIMATED_TOKENS_PER_SECOND_PER_SEQUENCE,
            "cpuMicrosecondsPerEvent": round(gateway_capacity.CPU_SECONDS_PER_EVENT * 1e6, 1),
            "kibPerStream": gateway_capacity.KIB_PER_STREAM,
        },
        "warnings": list(load.warnings),
    }


def _gateway_lines(plan: dict[str, Any]) -> list[str]:
    g = plan["gateway"]
    load = g["load"]
    if load["instanceType"] == OWN_GATEWAY:
        cpu = "not checked: the planner does not know your gateway machine's CPU"
    elif load["vcpusSustained"] is None:
        cpu = f"not checked: {load['instanceType']} is not a type the planner knows"
    else:
        verdict = "fits" if load["vcpusNeeded"] <= load["vcpusSustained"] else "TOO SMALL"
        cpu = (
            f"needs {load['vcpusNeeded']:g} vCPU of the {load['vcpusSustained']:g} a {load['instanceType']} sustains: "
            f"{verdict}"
        )
    return [
        "Gateway (nginx; components/gateway_capacity.py)",
        f"  streams        the gateway holds {g['streams']:,} streams: {g['gangs']} gang(s) x max_num_seqs "
        f"{g['maxNumSeqs']:,} running + as many queued, x2 headroom, at least {g['minStreams']:,}",
        f"  nginx          worker_connections {g['workerConnections']:,}, worker_rlimit_nofile "
        f"{g['workerRlimitNofile']:,}, keepalive {g['upstreamKeepalive']:,} idle connections to the heads per worker",
        f"  CPU            TLS + SSE at every gang's full batch, ~{load['eventsPerSecond']:,} events/s "
        f"({load['tokensPerSecondPerSequence']} tokens/s a sequence, an estimate, x "
        f"{load['cpuMicrosecondsPerEvent']:g} us an event, measured on loopback: bench/bench_gateway_sse.py): {cpu}",
        f"  memory         ~{load['nginxMiB']:,} MiB at {g['streams']:,} streams ({load['kibPerStream']} KiB a TLS "
        "stream: measured, with a request body's buffer)"
        + (f" of {load['memoryMiB']:,} MiB beside Prometheus" if load["memoryMiB"] else ": not checked"),
    ]


def _model_bytes(model: sizing.ModelSize, spec, loads: list[sizing.NodeLoad], topology: dict) -> dict[str, Any]:
    """The model's bytes on the way to each node's engine (components/sizing/model_bytes.py, issue 20):
    the first download from the Hub, then per node what it pulls from the EFS cache, the
    copy to its local NVMe (none when it serves from the cache) and the engine's read, each
    with its rate, time and source."""

    rate, rate_source = sizing.efs_client_rate()
    download = sizing.model_download(model, spec.nodes)
    roles = {node["node"]: node["role"] for node in topology["nodes"]}
    return {
        "efsUtilsVersion": versions.EFS_UTILS_VERSION,  # the efs-utils the nodes build
        "efsClientMiBps": rate,
        "efsRateSource": rate_source,
        "download": {
            "from": "the Hugging Face Hub",
            "to": "the EFS cache",
            "totalGB": round(download.total_bytes / sizing.GB, 1),
            "nodes": download.nodes,
            "perNodeGB": round(download.part_bytes / sizing.GB, 1),
            "rateMiBps": download.mib_s,
            "seconds": round(download.seconds),
            "assumes": download.assumes,
        },
        "loader": sizing.loader_reads(
            sizing.flag_value(spec.vllm_extra_args, "--safetensors-load-strategy"), spec.instance.gpus
        ),
        "servesFromLocalDisk": loads[0].local,
        "reason": loads[0].reason,
        # components/catalog.py: InstanceStorageInfo, mounted at the image's NVME_MOUNT.
        "instanceStore": {
            "totalGB": spec.instance.instance_store_gb,
            "disks": spec.instance.instance_store_disks,
            "mount": image.NVME_MOUNT,
            "source": spec.instance.instance_store_source,
        },
        "perNode": [_node_model_bytes(load, roles[load.node]) for load in loads],
    }


def _node_model_bytes(load: sizing.NodeLoad, role: str) -> dict[str, Any]:
    """One node's part of the model: its stages and layers, the copy from the EFS cache
    to its NVMe (when it serves from local disk) and the engine's read."""
    return {
        "node": load.node,
        "role": role,
        "stages": list(load.stages),
        "copiedStages": list(load.copied),
        "layers": list(load.layers) if load.layers else None,
        "stageGB": round(load.stage_bytes / sizing.GB, 1),
        "stageEstimate": load.stage_estimate,
        "servesFrom": load.load_from,
        "fromCacheGB": round(load.efs_bytes / sizing.GB, 1),
        "copy": (
            {
                "GB": round(load.efs_bytes / sizing.GB, 1),
                "from": "the EFS cache",
                "to": image.NVME_MOUNT,
                "rateMiBps": round(load.efs_mib_s),
                "seconds": round(load.copy_seconds),
                "source": load.efs_source,
            }
            if load.local
            else None
        ),
        "load": {
            "GB": round(load.load_bytes / sizing.GB, 1),
            "from": load.load_from,
            "rateMiBps": round(load.load_mib_s),
            "seconds": round(load.load_seconds),
            "source": load.load_source,
        },
    }


# The gateway of a stack of hosts: a machine of the user's, whose memory the planner cannot know.
OWN_GATEWAY = "your gateway machine"
# Time-to-first-token terms of a launch that a stack of hosts does not have.
OWN_HOSTS_SKIP_TERMS = ("instance boot", "efs-utils build")
# What machines the user already has must provide, and the check that says so (with the
# host, the fact and the fix) when one does not: docs/own-hosts.md.
OWN_HOSTS_REQUIREMENTS = (
    (
        "SSH as sshUser with passwordless sudo: to the gateway from here, to every host from the gateway",
        "each host's command fails naming the host",
    ),
    (
        "modelCacheDir mounted from one shared file system on every GPU host, writable by root",
        "setup: 'does not exist', 'root cannot write', 'is not shared with head'",
    ),
    (
        "a Python the pinned vLLM and Ray accept, NVIDIA driver and nvidia-smi on every GPU host",
        "setup (Python), preflight (GPUs, driver)",
    ),
    (
        "the ports open between the hosts and from the gateway (components/ports.py)",
        "the gateway's login wait, Ray's cluster check, readiness",
    ),
    ("apt on the gateway (nginx, Prometheus) and on the hosts (Python headers when missing)", "setup"),
    (
        "with an instanceType that has an instance store: local disk at /opt/dlami/nvme for the stage copy",
        "prepare-serve",
    ),
)


def _own_hosts(spec) -> dict[str, Any] | None:
    own = spec.own_hosts
    if own is None:
        return None
    return {
        "gangs": [list(gang) for gang in own.gangs],
        "gateway": own.gateway_address,
        "gatewayPrivateIp": own.gateway_private_ip,
        "sshUser": own.ssh_user,
        "modelCacheDir": own.model_cache_dir,
        "requirements": [{"need": need, "checkedBy": check} for need, check in OWN_HOSTS_REQUIREMENTS],
    }


def _cluster(spec) -> dict[str, Any]:
    instance = spec.instance
    return {
        "instanceType": instance.name,
        "nodes": spec.nodes,
        "replicas": spec.replicas,
        "gpusPerNode": instance.gpus,
        "gpuModel": instance.gpu_model,
        "gpuMemoryGiB": instance.gpu_memory_gib,
        "tensorParallelSize": spec.tensor_parallel_size,
        "pipelineParallelSize": spec.pipeline_parallel_size,
        "efa": spec.efa,
    }


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def _summary_lines(plan: dict[str, Any]) -> list[str]:
    m, c, i = plan["model"], plan["cluster"], plan["image"]
    if plan["hosts"] is not None:
        return _own_hosts_summary_lines(plan)
    return [
        f"vllm-cluster plan: stack {plan['stack']} (offline: no AWS, no Pulumi CLI)",
        "",
        f"Model     {m['name']}, {m['paramsB']:g} B parameters, {m['dtype']} (size from the {m['source']})",
        f"Cluster   {c['nodes']} x {c['instanceType']} "
        f"({c['gpusPerNode']} x {c['gpuModel']} {c['gpuMemoryGiB']:g} GiB), "
        f"TP {c['tensorParallelSize']} x PP {c['pipelineParallelSize']} = "
        f"{c['tensorParallelSize'] * c['pipelineParallelSize']} ranks, EFA {'on' if c['efa'] else 'off'}"
        + (f"; {c['replicas']} replicas: {c['replicas']} such gangs behind the gateway" if c["replicas"] > 1 else ""),
        f"Image     {i['amiId']} (your own: setup checks its Python)"
        if "amiId" in i
        else f"Image     {i['name']}, newest; Python {i['python']}",
    ]


def _own_hosts_summary_lines(plan: dict[str, Any]) -> list[str]:
    """A stack of the user's own machines: the hosts instead of instance types and images."""
    m, c, h = plan["model"], plan["cluster"], plan["hosts"]
    out = [
        f"vllm-cluster plan: stack {plan['stack']} (offline: no AWS, no Pulumi CLI)",
        "",
        f"Model     {m['name']}, {m['paramsB']:g} B parameters, {m['dtype']} (size from the {m['source']})",
        f"Cluster   your hosts: {c['replicas']} gang(s) of {c['nodes']}, each {c['instanceType']}, "
        f"TP {c['tensorParallelSize']} x PP {c['pipelineParallelSize']} = "
        f"{c['tensorParallelSize'] * c['pipelineParallelSize']} ranks a gang, EFA off",
        f"Gateway   {h['gateway']} (private {h['gatewayPrivateIp']}), SSH as {h['sshUser']}",
    ]
    out += [f"Gang {index}    {', '.join(gang)} (head first)" for index, gang in enumerate(h["gangs"])]
    out += [f"Cache     {h['modelCacheDir']} on every GPU host (shared)", "Hosts must provide (checked by)"]
    out += [f"  - {r['need']} ({r['checkedBy']})" for r in h["requirements"]]
    return out


def _resource_lines(plan: dict[str, Any]) -> list[str]:
    out = [f"Resources ({plan['resourceCount']}, by component)"]
    for owner, counts in plan["resources"].items():
        listed = ", ".join(f"{t.split(':')[-1]} x{n}" if n > 1 else t.split(":")[-1] for t, n in counts.items())
        out.append(f"  {owner:34s} {listed}")
    return out


def _topology_lines(plan: dict[str, Any]) -> list[str]:
    out = [
        "Topology (rank = pp_rank x TP + tp_rank)",
        f"  {'node':5s}{'role':8s}{'ip':16s}{'GPUs':6s}{'ranks':8s}{'stage':7s}layers",
    ]
    for node in plan["nodes"]:
        for i, stage in enumerate(node["stages"]):
            layers = f"{stage['layers'][0]}-{stage['layers'][1] - 1}" if stage["layers"] else "(unknown)"
            first = i == 0  # a node's own columns on its first stage's row only
            out.append(
                f"  {str(node['node']) if first else '':5s}{node['role'] if first else '':8s}"
                f"{node['ip'] if first else '':16s}{str(node['gpus']) if first else '':6s}"
                f"{_ranks(node['ranks']) if first else '':8s}{str(stage['stage']):7s}{layers}"
            )
    return out


def _fit_lines(plan: dict[str, Any]) -> list[str]:
    m, f = plan["model"], plan["fit"]
    tokens = (
        f"about {f['contextTokens']:,} tokens of context"
        if f["contextTokens"] is not None
        else "context unknown (architecture not in the table)"
    )
    out = [
        "Fit",
        f"  weights        {plan['weightsGB']:g} GB ({m['paramsB']:g} B x {m['dtype']})",
        f"  per GPU        {f['weightsPerGpuGiB']:g} GiB of weights; {f['usablePerGpuGiB']:g} of "
        f"{f['gpuMemoryGiB']:g} GiB usable at gpuMemoryUtilization {f['gpuMemoryUtilization']:g}, "
        f"{f['runtimeOverheadGiB']:g} GiB runtime",
        f"  KV cache       {f['kvCachePerGpuGiB']:g} GiB per GPU: {tokens} "
        f"(max-model-len {f['maxModelLen'] or 'unknown'})",
        f"  verdict        {'FITS' if plan['fits'] else 'DOES NOT FIT'}: {f['verdict']}",
    ]
    if plan["smallestFit"]:
        s = plan["smallestFit"]
        out.append(
            f"  smallest fit   {s['nodes']} x {s['instance_type']} (TP {s['tp']} x PP {s['pp']}), "
            f"${s['cost_per_hour']:.2f}/h for the GPUs"
        )
    elif not plan["fits"]:
        out.append("  smallest fit   none in the catalog up to 16 nodes")
    return out


def _cost_lines(plan: dict[str, Any]) -> list[str]:
    c, k = plan["cluster"], plan["cost"]
    if plan["hosts"] is not None:
        return ["Cost      none to AWS: the machines are yours, and the stack creates no AWS resource"]
    return [
        f"Cost (us-east-1 on-demand, prices of {k['priceDate']})",
        f"  GPU nodes      ${k['gpuNodes']:.4f}/h ({c['nodes'] * c['replicas']} x {c['instanceType']})",
        f"  gateway        ${k['gateway']:.4f}/h",
        f"  NAT gateway    ${k['natGateway']:.4f}/h (plus data processed)",
        f"  model cache    ${k['modelCache']:.4f}/h (EFS storage for the weights)",
        f"  total          ${plan['costPerHourUsd']:.2f}/h, ${plan['costPerDayUsd']:.2f}/day",
    ]


def _vcpu_quota_lines(plan: dict[str, Any]) -> list[str]:
    if plan["vcpuQuotas"] is None:
        return ["vCPU quotas  none apply: the stack runs no EC2 instance"]
    out = [
        "vCPU quotas (EC2 On-Demand, per region; `pulumi up` reads the account's first "
        "and refuses a stack they cannot hold)"
    ]
    for need in plan["vcpuQuotas"]["needs"]:
        replacing = (
            f", {need['replacingVcpus']} while the GPU nodes are replaced"
            if need["replacingVcpus"] != need["vcpus"]
            else ""
        )
        counted = "; ".join(need["counted"])
        out.append(f"  {need['quotaName']} ({need['quotaCode']}): {need['vcpus']} vCPUs{replacing}: {counted}")
    out += [f"  not counted: {what}" for what in plan["vcpuQuotas"]["uncounted"]]
    return out


def _stage_volume_lines(volume: dict[str, Any]) -> list[str]:
    """Both wakes (the stage on the instance store, copied again; on a gp3 stage volume a
    stop keeps) and what the volumes cost, whichever stageVolume chose, and what a change of
    the choice does to nodes that run already."""
    wakes = volume["wakeSeconds"]
    store, ebs = wakes[stage_volume.STAGE_VOLUME_INSTANCE_STORE], wakes[stage_volume.STAGE_VOLUME_EBS]
    head = (
        f"  stage volume   stageVolume {volume['chosen']} (auto: ebs when idleStopMinutes is set and it wakes at "
        f"least {idle_stop.RETRY_AFTER_SECONDS} s faster, one Retry-After)"
    )
    if not volume["offered"]:
        return [
            head,
            "                 not offered: this stack serves from the EFS cache, there is no local stage to keep",
        ]
    return [
        head,
        f"                 instance-store: wake ~{store} s ({store / 60:.1f} min), no volume to pay",
        f"                 ebs: wake ~{ebs} s ({ebs / 60:.1f} min) with a {volume['sizeGiB']} GiB gp3 volume per node "
        f"({volume['iops']:,} IOPS, {volume['throughputMiBs']:,} MiB/s) that a stop keeps: "
        f"${volume['monthUsdPerNode']:.2f}/month per node ({volume['costBreakdown']}), "
        f"${volume['monthUsd']:.2f}/month for {volume['nodes']} node(s), billed stopped or not "
        f"({volume['pricingSource']})",
        "                 a change of the choice replaces no node and restarts no engine: nodes running before it keep "
        "their stage where it is (and a volume they have, and its cost) until they are made anew: each instance "
        "declares its volume under ignoreChanges, which holds through a replacement under the same name too, so "
        "the choice reaches nodes created new (a first up, an added gang)",
    ]


def _idle_stop_lines(plan: dict[str, Any]) -> list[str]:
    """What an idle hour costs with and without idleStopMinutes, and the wake time."""
    i = plan["idleStop"]
    if i is None:
        return ["Idle stop  not with your own hosts: nothing could start them again"]
    setting = (
        f"idleStopMinutes {i['idleStopMinutes']}: a gang's GPU instances stop after {i['idleStopMinutes']} min "
        "without a request"
        if i["idleStopMinutes"]
        else "idleStopMinutes not set: the GPU instances run until the stack is destroyed"
    )
    out = [
        f"Idle stop ({setting})",
        f"  idle hour      ${i['idleHourWithoutUsd']:.4f}/h without idle stop: GPU nodes ${i['gpuNodes']:.4f} + the "
        "rest below",
        f"                 ${i['idleHourWithUsd']:.4f}/h with it, the GPU instances stopped: gateway "
        f"${i['gateway']:.4f} + NAT gateway ${i['natGateway']:.4f} + EFS ${i['modelCache']:.4f} + EBS "
        f"${i['ebs']:.4f} ({i['ebsGiB']} GiB of gp3 root volumes at ${i['ebsGbMonthUsd']}/GB-month, "
        "billed stopped or not)" + (f" + stage volumes ${i['stageVolumesHour']:.4f}" if i["stageVolumesHour"] else ""),
        f"  not counted    {i['notCounted']}",
        *_stage_volume_lines(i["stageVolume"]),
        f"  wake           ~{i['wakeSeconds']} s ({i['wakeSeconds'] / 60:.1f} min) from the first request to a "
        f"serving gang with stageVolume {i['stageVolume']['chosen']}; meanwhile the gateway answers 503 with "
        f"Retry-After: {i['retryAfterSeconds']}",
    ]
    out += [f"    {t['term']:16s}{t['seconds']:6d} s   {t['assumes']}" for t in i["wake"]]
    out.append(
        f"  give up        a wake not serving after {i['giveUpSeconds']} s ({i['giveUpSeconds'] / 60:.0f} min): the "
        "gateway stops what it started and says why (wakeGiveUpMinutes; 0: three wakes, at least 15 min)"
    )
    return out


def _gangs(count: int) -> str:
    return f"{count} gang{'s' if count != 1 else ''}"


def _warm_pool_lines(plan: dict[str, Any]) -> list[str]:
    """The cost of the range of gangs on (every one, only `replicas`, a day's mix) and the
    time to add a gang; nothing for a stack without warm gangs."""
    w, c = plan["warmPool"], plan["cluster"]
    if w is None:
        return []
    most, least = w["maxReplicas"], w["replicas"]
    warm = most - least
    all_on, base = w["allOn"], w["replicasOn"]
    shared = f"gateway, NAT gateway, EFS ${w['sharedHourUsd']:.4f}"
    volumes = f"{w['rootGiBPerNode']} GiB root" + (
        f" + {w['stageVolumeGiBPerNode']} GiB stage volume" if w["stageVolumeGiBPerNode"] else ""
    )
    ebs = f"every gang's EBS ${most * w['stoppedGangHourUsd']:.4f}"
    out = [
        f"Warm pool (maxReplicas {most}, replicas {least}: {_gangs(least)} always on, {warm} warm: kept stopped, "
        "started when requests queue, drained and stopped when the load fits on one gang fewer)",
        f"  all on         ${all_on['hourUsd']:.4f}/h, ${all_on['monthUsd']:,.2f}/month: {_gangs(most)} of "
        f"{w['nodesPerGang']} x {c['instanceType']} ${most * w['gangHourUsd']:.4f} + {ebs} + {shared}",
        f"  replicas on    ${base['hourUsd']:.4f}/h, ${base['monthUsd']:,.2f}/month: "
        + (f"{_gangs(least)} ${least * w['gangHourUsd']:.4f}" if least else "no gang on, GPU instances $0")
        + f" + {ebs} + {shared}; a stopped gang still pays its EBS, ${w['stoppedGangHourUsd']:.4f}/h "
        f"({w['nodesPerGang']} x {volumes}, billed stopped or not)",
    ]
    if w["busyHours"] is None:
        out.append(
            f"  a day's mix    scripts/vllm-cluster plan --stack {plan['stack']} --busy-hours N (0-24): N hours a day "
            f"at {_gangs(most)}, the rest at {least}, per month"
        )
    else:
        busy = w["busyHours"]
        label = f"busy {busy} h/day"
        out.append(
            f"  {label:15s}${w['mixMonthUsd']:,.2f}/month: {busy} h a day at {_gangs(most)}, "
            f"{24 - busy} h at {least} (--busy-hours {busy})"
        )
    wake = " + ".join(f"{t['term']} {t['seconds']} s" for t in w["wake"])
    hold = (
        f"requests waiting, more than {w['scaleOutWaitingPerGang']:g} per serving gang, at every look for "
        f"{w['scaleOutHoldSeconds']} s, then a wake of ~{w['wakeSeconds']} s ({wake})"
    )
    if least:
        out.append(
            f"  add a gang     ~{w['addGangSeconds']} s ({w['addGangSeconds'] / 60:.1f} min): {hold}; the serving "
            "gangs answer meanwhile"
        )
    else:
        out += [
            f"  first gang     ~{w['wakeSeconds']} s ({w['wakeSeconds'] / 60:.1f} min): with replicas 0 the first "
            f"request wakes one gang at once; the gateway answers 503 with Retry-After: {w['retryAfterSeconds']} "
            "until it serves",
            f"  add a gang     ~{w['addGangSeconds']} s ({w['addGangSeconds'] / 60:.1f} min) more each: {hold}",
        ]
    out.append(f"  a month        {w['hoursPerMonth']} h (as every monthly figure of the plan)")
    return out


def _prometheus_lines(plan: dict[str, Any]) -> list[str]:
    """The series per node, the stack's, and what they take of the gateway's memory and disk."""
    p = plan["prometheus"]
    n, m, d = p["seriesPerNode"], p["memory"], p["disk"]
    if m["fits"] is None:
        verdict = f"of {m['gatewayType']}'s memory, which the planner does not know: not checked"
    else:
        state = "fits" if m["fits"] else "DOES NOT FIT"
        verdict = f"of {m['gatewayType']}'s {m['gatewayMiB']:,} MiB: {state} within {m['share']:.0%}"
    if d["daysAtLimit"] >= d["retentionDays"]:
        limit = f"holds {d['daysAtLimit']:,.0f} days at this rate, so the {d['retentionDays']}-day time limit applies"
    else:
        limit = (
            f"holds only {d['daysAtLimit']:.1f} days at this rate: it, not the {d['retentionDays']}-day limit, applies"
        )
    per_node = (
        f"head {n['head']:,} series (vLLM {n['vllm']:,} + Ray {n['ray']:,}), worker {n['worker']:,} (Ray): "
        f"measured {p['measuredOn']} ({p['measuredBy']}), Ray's {n['rayPerGpu']} per GPU counted from its source"
    )
    stack = (
        f"{p['series']:,} series: {p['gangs']} gang(s) of {p['nodesPerGang']} node(s), "
        f"{p['seriesPerTarget']} per target x {p['targets']}, {p['recordedSeriesPerGang']} rules per gang, "
        f"Prometheus's own ~{p['prometheusSelfSeries']:,}; {p['samplesPerSecond']:,.0f} samples/s at a "
        f"{p['scrapeInterval']} scrape"
    )
    memory = (
        f"{m['neededMiB']:,} MiB ({m['baseMiB']} MiB gateway and Prometheus base + {m['seriesMiB']:g} MiB "
        f"at {m['bytesPerSeries']:,} B per series, Robust Perception) {verdict}"
    )
    disk = (
        f"{d['retentionGiB']:g} GiB for {d['retentionDays']} days at {d['bytesPerSample']} B per sample "
        f"(Prometheus's storage docs: 1-2 B); the retention size limit, {d['retentionLimitMiB']:,} MiB "
        f"of the {d['rootGiB']} GiB root volume, {limit}"
    )
    return [
        "Metrics on the gateway (Prometheus; estimates, components/prometheus_sizing.py)",
        f"  per node       {per_node}",
        f"  stack          {stack}",
        f"  memory         {memory}",
        f"  disk           {disk}",
    ]


def _model_bytes_lines(plan: dict[str, Any]) -> list[str]:
    if plan["hosts"] is not None:
        return [
            "Model bytes per node",
            f"  from {plan['hosts']['modelCacheDir']}, your shared directory: its speed is yours, not estimated "
            "(the times below assume EFS's 500 MiB/s per client)",
        ]
    return _ec2_model_bytes_lines(plan)


def _ec2_model_bytes_lines(plan: dict[str, Any]) -> list[str]:
    """Per node: the bytes it copies, from where, at which rate, the time, and whether it
    serves from its local disk or the cache and why; every figure with its source."""
    b, d = plan["modelBytes"], plan["modelBytes"]["download"]
    who = (
        f"by {d['nodes']} nodes in parallel (disjoint files), ~{d['perNodeGB']:g} GB each"
        if d["nodes"] > 1
        else "by one node"
    )
    out = [
        "Model bytes per node (estimates, components/sizing/model_bytes.py)",
        f"  EFS rate       {b['efsClientMiBps']} MiB/s per client: {b['efsRateSource']}",
        f"  download       {d['totalGB']:g} GB from {d['from']} to {d['to']} {who}, at {d['rateMiBps']:g} MiB/s "
        f"(the EFS rate; the Hub and the NAT gateway assumed not slower): {d['seconds']} s, once per model "
        "and revision",
    ]
    out.append(f"  loader         {b['loader']}")
    store = b["instanceStore"]
    if store["totalGB"]:
        out.append(
            f"  NVMe           {store['disks']} x {store['totalGB'] // store['disks']} GB at {store['mount']}: "
            f"{store['source']}"
        )
    out.append(f"  serves from    {'local NVMe' if b['servesFromLocalDisk'] else 'the EFS cache'}: {b['reason']}")
    for node in b["perNode"]:
        stages = ", ".join(map(str, node["stages"]))
        layers = f", layers {node['layers'][0]}-{node['layers'][1] - 1}" if node["layers"] else ""
        out.append(
            f"  node {node['node']} {node['role']:7s} stage {stages}{layers}: ~{node['stageGB']:g} GB "
            f"({node['stageEstimate']}); pulls {node['fromCacheGB']:g} GB from the EFS cache"
        )
        if node["copy"]:
            c = node["copy"]
            source = "the EFS rate above" if c["source"] == b["efsRateSource"] else c["source"]
            out.append(
                f"    copy         {c['GB']:g} GB from {c['from']} to {c['to']} at {c['rateMiBps']} MiB/s: "
                f"{c['seconds']} s ({source})"
            )
        else:
            out.append("    copy         none: serves from the EFS cache")
        load = node["load"]
        out.append(
            f"    engine read  {load['GB']:g} GB from {load['from']} at {load['rateMiBps']} MiB/s: {load['seconds']} s "
            f"({load['source']})"
        )
    return out


def _time_to_first_token_lines(plan: dict[str, Any]) -> list[str]:
    out = ["Time to first token from a cold `pulumi up` (estimate)"]
    for term in plan["timeToFirstToken"]:
        out.append(f"  {term['term']:16s}{term['seconds']:6d} s   {term['assumes']}")
    total = plan["timeToFirstTokenSeconds"]
    out.append(f"  {'total':16s}{total:6d} s   ({total / 60:.1f} min)")
    out.append(
        f"  vLLM gives its engine {plan['engineReadyTimeoutSeconds']} s to start "
        "(VLLM_ENGINE_READY_TIMEOUT_S in vllm.env: "
        f"{sizing.ENGINE_READY_TIMEOUT_FACTOR} x (model load + engine start), at least vLLM's default "
        f"{sizing.ENGINE_READY_TIMEOUT_FLOOR_SECONDS} s)"
    )
    out.append(
        f"  `pulumi up` fails a start whose engine writes no line for {plan['engineStartStallSeconds']} s "
        f"(start-vllm --stall-seconds: {sizing.ENGINE_START_STALL_FACTOR} x the longer of model load and "
        f"engine start, at least {sizing.ENGINE_START_STALL_FLOOR_SECONDS} s), printing the journal's last lines"
    )
    if plan["nodeImage"] == "none":
        out.append("  node image     none (nodeImage): every node installs the software at its first setup")
    elif plan["imageBake"]:
        out.append(
            "  node image bake, before the nodes launch, once per lock and base image (nodeImage bake: a stack that "
            "finds the image tagged for both skips it)"
        )
        for term in plan["imageBake"]:
            out.append(f"    {term['term']:16s}{term['seconds']:6d} s   {term['assumes']}")
        bake = plan["imageBakeSeconds"]
        first = (bake + total) / 60
        label = "bake total"
        out.append(
            f"    {label:16s}{bake:6d} s   ({bake / 60:.1f} min); a first `pulumi up` that bakes: {first:.1f} min"
        )
    else:
        out.append(f"  node image     {plan['nodeImage']} (nodeImage), launched as is with the software in it")
    return out


def _problem_lines(plan: dict[str, Any]) -> list[str]:
    """AWS's rules on every resource's inputs (components/aws_contract.py)."""
    if plan["hosts"] is not None:
        return ["AWS limits  none apply: the stack creates no AWS resource"]
    if not plan["problems"]:
        return [f"AWS limits  all {plan['resourceCount']} resources' inputs within them (components/aws_contract.py)"]
    return [
        f"PROBLEMS  AWS would refuse {len(plan['problems'])} input(s): `pulumi up` fails there, "
        "after the resources before it were created"
    ] + [f"  - {problem}" for problem in plan["problems"]]


def _warning_lines(plan: dict[str, Any]) -> list[str]:
    return ["Warnings"] + ([f"  - {w}" for w in plan["warnings"]] or ["  (none)"])


def _serve_lines(plan: dict[str, Any]) -> list[str]:
    """`vllm serve` with a flag a line, each flag beside its value."""
    args = plan["vllmServeArgs"]
    out = ["vllm serve on the head (API key from a root-only env file, never an argument)", "  vllm serve " + args[0]]
    i = 1
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append(f"    {args[i]} {args[i + 1]}")
            i += 2
        else:
            out.append(f"    {args[i]}")
            i += 1
    return out


def render(plan: dict[str, Any]) -> str:
    out = _summary_lines(plan)
    for section in (
        _problem_lines,
        _resource_lines,
        _topology_lines,
        _fit_lines,
        _cost_lines,
        _vcpu_quota_lines,
        _idle_stop_lines,
        _warm_pool_lines,
        _gateway_lines,
        _prometheus_lines,
        _model_bytes_lines,
        _time_to_first_token_lines,
        _warning_lines,
        _serve_lines,
    ):
        lines = section(plan)
        if lines:  # a section that does not apply (a warm pool) prints nothing, not a blank line
            out += ["", *lines]
    if plan["secretsNotRead"]:
        out += ["", f"(secrets not read offline: {', '.join(plan['secretsNotRead'])})"]
    return "\n".join(out) + "\n"
