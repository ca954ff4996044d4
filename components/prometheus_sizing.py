"""Is the gateway sized for Prometheus (issue 21)? The series the stack's gangs give
Prometheus, the memory and disk it needs for them, and whether the gateway's instance
type and root volume hold that.

Pure Python, no Pulumi: plain values in (gangs, nodes per gang, GPUs per node, the
gateway's type and disk), plain values out, each figure with where it comes from. The
planner (cli/plan.py) prints them; tests/test_prometheus_sizing.py checks them.

What Prometheus keeps (components/metrics.py): every SCRAPE_INTERVAL, vLLM's /metrics on
each gang's head, Ray's metrics on every node, and itself; every EVALUATION_INTERVAL, the
recording rules, one series each per gang. Alerts add series (ALERTS, ALERTS_FOR_STATE)
only while one is pending or firing: not counted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from components import metrics

# --- series per node ----------------------------------------------------------------------

# Measured on 2026-12-02 on the 2-core test machine, on loopback, with the fleet's
# environment (vLLM's CPU build with the GPU-build double, and the pinned Ray) and the tiny
# model (tests/tiny_model.py):
#     /work/main/venv/bin/python bench/bench_metrics_series.py
#     ... metrics series: ray node 944, vllm head 445
# A series is a line of the text format that is not a comment or blank (each histogram
# bucket one), after 8 completions (plain and chat, streamed and not): vLLM's histograms
# and finish reasons appear only once used.
MEASURED_ON = "2026-12-02"
# vLLM's on loopback by the bench; Ray's and Prometheus's own as Prometheus on the local
# hosts keeps them (tests/test_fleet_replicas.py prints them).
MEASURED_BY = "bench/bench_metrics_series.py; Ray's by Prometheus on the local hosts"
# vLLM's OpenAI server on a gang's head: its own vllm:* series for the one model and
# engine, plus the API server's HTTP and Python process series.
VLLM_HEAD_SERIES = 445
# Ray's `--metrics-export-port` on a head that runs the GCS, the dashboard and vLLM's
# engine worker (one logical GPU). Before vLLM started the same endpoint had 564: most of
# the difference is gRPC methods and task/actor series that appear once used. Used for
# workers too: they run no GCS or dashboard, so it is an upper bound for them. The
# loopback bench counted 944; Prometheus on the local hosts keeps more of each head
# after the replicas fleet's traffic: 1064 and 1065 (tests/test_fleet_replicas.py prints
# `count by (gang, node) ({job="ray"})`, 2026-12-02), the figure used here.
RAY_NODE_SERIES = 1065
RAY_NODE_IDLE_SERIES = 564
# No GPU here, so Ray's GPU series are not in the measurement: counted from Ray 2.60's
# source (ray/dashboard/modules/reporter/reporter_agent.py). Per GPU, labelled GpuIndex:
# node_gpus_available, node_gpus_utilization, node_gram_used, node_gram_available, and on
# NVIDIA node_gpu_power_milliwatts and node_gpu_temperature_celsius.
RAY_SERIES_PER_GPU = 6
# Per node with a GPU in use: component_gpu_memory_mb and component_gpu_percentage of the
# worker processes, which Ray groups by process name (so 8 workers are one component).
RAY_GPU_COMPONENT_SERIES = 2

# --- series Prometheus adds -----------------------------------------------------------------

# Per target, every scrape: up, scrape_duration_seconds, scrape_samples_scraped,
# scrape_samples_post_metric_relabeling, scrape_series_added
# (https://prometheus.io/docs/concepts/jobs_instances/#automatically-generated-labels-and-time-series).
SERIES_PER_TARGET = 5
# Prometheus's own /metrics (job prometheus): Go runtime, HTTP handlers' histograms, TSDB,
# rule groups, service discovery. Measured on the local hosts' gateway (Debian's 2.42):
# count({job="prometheus"}) = 468 (tests/test_fleet_replicas.py, 2026-12-02); more HTTP
# handlers appear as the UI is used, so rounded up.
PROMETHEUS_SELF_SERIES = 600

# --- memory ----------------------------------------------------------------------------------

# "As of Prometheus 2.20 a good rule of thumb should be around 3kB per series in the
# head. This allows not only for the various data structures the series itself appears
# in, but also for samples from a reasonable scrape interval" (Robust Perception, "Why
# does Prometheus use so much RAM?", https://www.robustperception.io/why-does-prometheus-use-so-much-ram/).
# It updates the derivation in "How much RAM does Prometheus 2.x need for cardinality and
# ingestion?" (https://www.robustperception.io/how-much-ram-does-prometheus-2-x-need-for-cardinality-and-ingestion/):
# about 732 B per series plus 32 B per label pair and the name twice, 50% overhead on
# chunks, up to 3 h of samples in the head, all doubled for Go's garbage collection.
# With no churn every series scraped is in the head, so series x this is the head's share.
BYTES_PER_HEAD_SERIES = 3000
# Everything on the gateway besides the series: the kernel's reservation (an instance's
# usable memory is below its nominal GiB), Ubuntu 24.04's services (snapd, the SSM agent,
# journald), nginx, an unattended-upgrades run (a few hundred MB at its peak), and
# Prometheus's own runtime and web UI ("the general overheads of Prometheus itself",
# same post). An estimate, not a measurement: check with `free -m` on a gateway.
GATEWAY_BASE_MIB = 500
# The rest is left to the page cache that queries read blocks through and to queries'
# own samples ("the actual data accessed from disk should be kept in page cache", same post).
MEMORY_SHARE = 0.8

# Memory of the gateway types the planner prices (components/sizing/
# GATEWAY_PRICE_PER_HOUR), in GiB, from AWS's instance type pages, "Mem (GiB)":
# https://aws.amazon.com/ec2/instance-types/t3/, .../t4g/ and .../c7i/ (c7i.large: 4 GiB).
GATEWAY_MEMORY_GIB = {"t3.micro": 1, "t3.small": 2, "t3.medium": 4, "t4g.small": 2, "c7i.large": 4}
GATEWAY_MEMORY_SOURCE = "https://aws.amazon.com/ec2/instance-types/t3/, /t4g/ and /c7i/"

# --- disk ------------------------------------------------------------------------------------

# "needed_disk_space = retention_time_seconds * ingested_samples_per_second *
# bytes_per_sample", and "on average, Prometheus uses only around 1-2 bytes per sample"
# (https://prometheus.io/docs/prometheus/latest/storage/#operational-aspects): the upper end.
BYTES_PER_SAMPLE = 2
SECONDS_PER_DAY = 86400
MIB = 2**20


def seconds(duration: str) -> int:
    """A Prometheus duration of one unit (`15s`, `1m`, `2h`, `15d`) in seconds."""
    match = re.fullmatch(r"(\d+)([smhd])", duration)
    if not match:
        raise ValueError(f"not a one-unit Prometheus duration: {duration!r}")
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": SECONDS_PER_DAY}[match.group(2)]


# --- series ----------------------------------------------------------------------------------


def ray_node_series(gpus: int) -> int:
    """Ray's series on one node with `gpus` GPUs: the measured node plus the GPU series
    counted from Ray's source."""
    return RAY_NODE_SERIES + gpus * RAY_SERIES_PER_GPU + (RAY_GPU_COMPONENT_SERIES if gpus else 0)


def head_series(gpus: int) -> int:
    """A gang's head: vLLM's API server and Ray."""
    return VLLM_HEAD_SERIES + ray_node_series(gpus)


def worker_series(gpus: int) -> int:
    """A gang's worker: Ray only (vLLM's /metrics is the head's alone)."""
    return ray_node_series(gpus)


def recorded_series_per_gang() -> int:
    """The recording rules' series: one per rule per gang (components/metrics.py)."""
    return len(metrics.recording_rule_exprs())


@dataclass(frozen=True)
class Ingest:
    """What the stack's gangs give Prometheus."""

    gangs: int
    nodes: int  # per gang
    gpus_per_node: int
    head: int  # series per head
    worker: int  # series per worker
    targets: int  # vLLM per gang, Ray per node, Prometheus itself
    series: int
    samples_per_second: float


def ingest(gangs: int, nodes: int, gpus_per_node: int) -> Ingest:
    """The series Prometheus keeps for `gangs` gangs of `nodes` nodes and the samples it
    appends per second (each series once per scrape or rule evaluation)."""
    if gangs < 1 or nodes < 1 or gpus_per_node < 0:
        raise ValueError(f"gangs ({gangs}) and nodes ({nodes}) must be at least 1, GPUs ({gpus_per_node}) at least 0")
    head, worker = head_series(gpus_per_node), worker_series(gpus_per_node)
    targets = gangs + gangs * nodes + 1
    scraped = gangs * (head + (nodes - 1) * worker) + PROMETHEUS_SELF_SERIES + SERIES_PER_TARGET * targets
    recorded = gangs * recorded_series_per_gang()
    per_second = scraped / seconds(metrics.SCRAPE_INTERVAL) + recorded / seconds(metrics.EVALUATION_INTERVAL)
    return Ingest(gangs, nodes, gpus_per_node, head, worker, targets, scraped + recorded, per_second)


# --- memory ----------------------------------------------------------------------------------


def series_mib(series: int) -> float:
    return series * BYTES_PER_HEAD_SERIES / MIB


def memory_needed_mib(series: int) -> float:
    """The gateway's memory for Prometheus's head and everything else on it."""
    return GATEWAY_BASE_MIB + series_mib(series)


def gateway_memory_mib(instance_type: str) -> int | None:
    """The type's memory, or None for a type the table does not know (never a guess)."""
    gib = GATEWAY_MEMORY_GIB.get(instance_type)
    return None if gib is None else gib * 1024


def max_series(instance_type: str) -> int | None:
    """The most series the type holds within MEMORY_SHARE, or None for an unknown type."""
    memory = gateway_memory_mib(instance_type)
    if memory is None:
        return None
    return max(0, math.floor((memory * MEMORY_SHARE - GATEWAY_BASE_MIB) * MIB / BYTES_PER_HEAD_SERIES))


def smallest_gateways(series: int) -> list[str]:
    """The known types with the least memory that hold `series`, sorted (one memory size,
    so a choice of architecture and price); empty when none does."""
    fitting = [t for t in GATEWAY_MEMORY_GIB if (max_series(t) or 0) >= series]
    if not fitting:
        return []
    least = min(GATEWAY_MEMORY_GIB[t] for t in fitting)
    return sorted(t for t in fitting if GATEWAY_MEMORY_GIB[t] == least)


# --- disk ------------------------------------------------------------------------------------


def disk_bytes(days: float, samples_per_second: float) -> float:
    """The storage docs' formula: retention x samples per second x bytes per sample."""
    return days * SECONDS_PER_DAY * samples_per_second * BYTES_PER_SAMPLE


def days_within(limit_mib: int, samples_per_second: float) -> float:
    """How many days of samples fit in `limit_mib` at this rate."""
    return limit_mib * MIB / (SECONDS_PER_DAY * samples_per_second * BYTES_PER_SAMPLE)


# --- the verdict -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GatewaySizing:
    ingest: Ingest
    gateway_type: str
    memory_mib: int | None  # the type's; None when the table does not know it
    needed_mib: float
    memory_fits: bool | None  # None: unknown type
    retention_days: int
    retention_limit_mib: int
    retention_mib: float  # what retention_days of samples take
    days_at_limit: float  # what the size limit holds at this rate
    warnings: tuple[str, ...]


def gateway_sizing(gangs: int, nodes: int, gpus_per_node: int, gateway_type: str, disk_gib: int) -> GatewaySizing:
    """Prometheus on a `gateway_type` gateway with a `disk_gib` root volume, for the
    stack's gangs: memory against the type's, disk against the retention size limit
    (metrics.retention_size_mib), and a warning for each that does not hold."""
    load = ingest(gangs, nodes, gpus_per_node)
    memory, needed = gateway_memory_mib(gateway_type), memory_needed_mib(load.series)
    fits = None if memory is None else needed <= memory * MEMORY_SHARE
    limit = metrics.retention_size_mib(disk_gib)
    retention = disk_bytes(metrics.RETENTION_DAYS, load.samples_per_second) / MIB
    at_limit = days_within(limit, load.samples_per_second)
    shape = f"{gangs} gang(s) of {nodes} node(s) with {gpus_per_node} GPU(s) each"
    warnings = []
    if memory is None:
        warnings.append(
            f"gatewayInstanceType {gateway_type}: its memory is not in the planner's table "
            f"(components/prometheus_sizing.py GATEWAY_MEMORY_GIB: {', '.join(sorted(GATEWAY_MEMORY_GIB))}), "
            f"so whether Prometheus fits is not checked: it needs about {needed:,.0f} MiB for {shape}"
        )
    elif not fits:
        better = smallest_gateways(load.series)
        fix = f"use {' or '.join(better)}" if better else "use a gateway type with more memory"
        warnings.append(
            f"gatewayInstanceType {gateway_type} ({memory:,} MiB) is too small for Prometheus: {shape} "
            f"give {load.series:,} series, about {needed:,.0f} MiB with the gateway's own "
            f"{GATEWAY_BASE_MIB} MiB, over {MEMORY_SHARE:.0%} of its memory; {fix} ({GATEWAY_MEMORY_SOURCE})"
        )
    if at_limit < metrics.RETENTION_DAYS:
        warnings.append(
            f"Prometheus keeps only about {at_limit:.1f} of {metrics.RETENTION_DAYS} days: {shape} "
            f"append {load.samples_per_second:,.0f} samples/s, {retention / 1024:,.1f} GiB for "
            f"{metrics.RETENTION_DAYS} days at {BYTES_PER_SAMPLE} B each, and the retention size limit is "
            f"{limit:,} MiB ({disk_gib} GiB root volume); the oldest blocks go first"
        )
    return GatewaySizing(
        ingest=load,
        gateway_type=gateway_type,
        memory_mib=memory,
        needed_mib=needed,
        memory_fits=fits,
        retention_days=metrics.RETENTION_DAYS,
        retention_limit_mib=limit,
        retention_mib=retention,
        days_at_limit=at_limit,
        warnings=tuple(warnings),
    )
