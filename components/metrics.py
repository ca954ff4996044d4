"""Prometheus on the gateway, as plain text: its configuration, the targets it scrapes,
the recording and alert rules, and its command-line flags (issue 21).

Pure Python, no Pulumi: every function takes plain values (the stack's gangs, the
gateway's disk) and returns text or lists, so all of it is unit-tested, and
tests/test_metrics.py checks the rules against the metric names vLLM really exports and
the files with the packaged `promtool`.

What is scraped: vLLM's /metrics on each gang's head (the API port; vLLM does not put
/metrics behind --api-key, vllm/entrypoints/serve/middleware/authenticate.py, so only
the security group keeps others off) and Ray's metrics endpoint on every node. The
targets sit in file_sd files the gateway rewrites alone when the gangs change:
Prometheus watches them and applies a well-formed change at once, with no restart or
reload (https://prometheus.io/docs/prometheus/2.45/configuration/configuration/#file_sd_config).

The configuration keeps to what Prometheus 2.42 reads (Debian 12's package; Ubuntu
24.04 has 2.45), so one file serves both: no `scrape_config_files` (new in 2.43).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import math
import re
from dataclasses import dataclass

import yaml

from components import ports
from components.scale_out import SCALE_OUT_WAITING_PER_GANG
from components.topology import HEAD, WORKER, gang_name, node_name, node_role

# Where the files live on the gateway. The Debian/Ubuntu package reads
# /etc/prometheus/prometheus.yml and keeps its data in /var/lib/prometheus/metrics2/
# (the package's /etc/default/prometheus and `prometheus --help`); ours sit beside it.
CONFIG_FILE = "/etc/prometheus/prometheus.yml"
DATA_DIR = "/var/lib/prometheus/metrics2/"
CLUSTER_DIR = "/etc/prometheus/vllm-cluster"
RECORDING_RULES = "recording-rules.yml"
ALERT_RULES = "alert-rules.yml"
VLLM_TARGETS = "targets/vllm.json"
RAY_TARGETS = "targets/ray.json"

# Served at https://<gateway>:DASHBOARD_HTTPS/prometheus/. With a path in
# --web.external-url, Prometheus serves every endpoint under it (UI, /api/v1, /-/healthy,
# /metrics; `prometheus --help`, --web.route-prefix "Defaults to path of
# --web.external-url"), so nginx passes /prometheus/ through without stripping it.
ROUTE_PREFIX = "/prometheus"

JOB_VLLM = "vllm"
JOB_RAY = "ray"
JOB_PROMETHEUS = "prometheus"
# With idle stop: the gateway's waker, and its gauge of the gangs it has asleep (stopped,
# stopping or waking: scripts/gateway/vllm-cluster-waker ASLEEP_METRIC).
JOB_WAKER = "waker"
ASLEEP = "vllm_cluster_gang_asleep"
# And what EC2 refuses during a wake (labelled with EC2's code), and a wake it gave up
# (scripts/gateway/vllm-cluster-waker REFUSED_METRIC, GIVEN_UP_METRIC; issue 34).
WAKE_REFUSED = "vllm_cluster_wake_refused"
WAKE_GIVEN_UP = "vllm_cluster_wake_given_up"
# With warm gangs (issue 36, scripts/gateway/vllm-cluster-waker POOL_*): the pool's gangs by
# state (serving, waking, stopped, stopping) and its bounds (maxReplicas, replicas).
POOL_GANGS = "vllm_cluster_pool_gangs"
POOL_MAX_GANGS = "vllm_cluster_pool_max_gangs"
POOL_REPLICAS = "vllm_cluster_pool_replicas"
# Every target carries these, so every series names its gang, node and role.
TARGET_LABELS = ("gang", "node", "role")

# Debian's packaged prometheus.yml scrapes every 15 s (Prometheus's own default is 1 m).
# The rules take rate() over RATE_WINDOW: at least four scrapes in the window, so one
# missed scrape still leaves a rate (Robust Perception, "What range should I use with
# rate()?", https://www.robustperception.io/what-range-should-i-use-with-rate/).
SCRAPE_INTERVAL = "15s"
EVALUATION_INTERVAL = "15s"
RATE_WINDOW = "5m"

# Retention: when neither limit is set Prometheus keeps 15 days ("the retention time
# defaults to 15d", `prometheus --help`); keep that, and bound the size too.
RETENTION_DAYS = 15
# "it is recommended to set the retention size to at most 80-85% of your allocated
# Prometheus disk space": the WAL and the head chunks count towards the limit but are
# only cut every 2 h, and expired blocks can take up to 2 h to go
# (https://prometheus.io/docs/prometheus/latest/storage/#operational-aspects).
RETENTION_SHARE_OF_DISK = 0.80
# What the gateway's root volume holds besides Prometheus: Ubuntu 24.04's server image,
# nginx, the Prometheus package, the journal and apt's cache. An estimate, not a
# measurement: check it with `df -h /` on a gateway.
GATEWAY_SYSTEM_GIB = 4
# Below this much room for Prometheus the limit would cut data within hours: the WAL
# alone keeps at least three 128 MB segments (same storage page).
MIN_PROMETHEUS_GIB = 2


@dataclass(frozen=True)
class ScrapeNode:
    """One GPU node as Prometheus sees it: its name in the stack, its private IP and its
    role in its gang (topology.HEAD or topology.WORKER)."""

    name: str
    ip: str
    role: str


@dataclass(frozen=True)
class ScrapeGang:
    """One gang (a head and its workers) by its name in the stack."""

    name: str
    nodes: tuple[ScrapeNode, ...]

    @property
    def head(self) -> ScrapeNode:
        return next(node for node in self.nodes if node.role == HEAD)


def scrape_gang(gang: int, node_ips: list[str]) -> ScrapeGang:
    """Gang number `gang` from its nodes' private IPs in node order (head first), named
    as the rest of the stack names them (topology.gang_name, node_name, node_role)."""
    nodes = tuple(
        ScrapeNode(name=node_name(index, gang), ip=ip, role=node_role(index)) for index, ip in enumerate(node_ips)
    )
    return ScrapeGang(name=gang_name(gang), nodes=nodes)


# --- the gangs, checked -----------------------------------------------------------------


def gang_problems(gangs: list[ScrapeGang]) -> list[str]:
    """Everything wrong with the gangs the targets are made from, each naming the gang or
    node: a target list built from them would scrape the wrong hosts or label them wrong."""
    problems = []
    problems += _duplicates("gang name", [gang.name for gang in gangs])
    problems += _duplicates("node name", [node.name for gang in gangs for node in gang.nodes])
    problems += _duplicates("node IP", [node.ip for gang in gangs for node in gang.nodes])
    for gang in gangs:
        problems += _head_problems(gang)
        problems += [problem for node in gang.nodes for problem in _node_problems(gang, node)]
    return problems


def _duplicates(what: str, values: list[str]) -> list[str]:
    return [
        f"{what} {value!r} appears {values.count(value)} times"
        for value in sorted(set(values))
        if values.count(value) > 1
    ]


def _head_problems(gang: ScrapeGang) -> list[str]:
    heads = [node.name for node in gang.nodes if node.role == HEAD]
    if len(heads) == 1:
        return []
    return [f"gang {gang.name!r} has {len(heads)} heads ({', '.join(heads) or 'none'}); a gang has exactly one"]


def _node_problems(gang: ScrapeGang, node: ScrapeNode) -> list[str]:
    problems = []
    if node.role not in (HEAD, WORKER):
        problems.append(
            f"node {node.name!r} of gang {gang.name!r} has role {node.role!r}; it must be {HEAD!r} or {WORKER!r}"
        )
    try:
        ipaddress.ip_address(node.ip)
    except ValueError:
        problems.append(f"node {node.name!r} of gang {gang.name!r} has IP {node.ip!r}, which is not an IP address")
    return problems


def _checked(gangs: list[ScrapeGang]) -> list[ScrapeGang]:
    problems = gang_problems(gangs)
    if problems:
        raise ValueError("cannot write Prometheus targets: " + "; ".join(problems))
    return gangs


# --- targets (file_sd) ------------------------------------------------------------------


def _address(ip: str, port: int) -> str:
    """host:port as Prometheus's __address__ takes it (an IPv6 address in brackets)."""
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


def _target_group(gang: ScrapeGang, node: ScrapeNode, port: int) -> dict:
    """One file_sd target group: `targets` and `labels` are the format's two keys
    (https://prometheus.io/docs/prometheus/2.45/configuration/configuration/#file_sd_config)."""
    return {"targets": [_address(node.ip, port)], "labels": {"gang": gang.name, "node": node.name, "role": node.role}}


def vllm_targets(gangs: list[ScrapeGang]) -> str:
    """The `vllm` job's file_sd JSON: each gang's head on vLLM's API port. Only the head
    runs the OpenAI server; the workers run Ray workers and no /metrics of vLLM's."""
    groups = [_target_group(gang, gang.head, ports.VLLM_API) for gang in _checked(gangs)]
    return json.dumps(groups, indent=2) + "\n"


def ray_targets(gangs: list[ScrapeGang]) -> str:
    """The `ray` job's file_sd JSON: every node on Ray's metrics export port, which
    each node's dashboard agent serves (ray/dashboard/modules/reporter/reporter_agent.py)."""
    groups = [_target_group(gang, node, ports.RAY_METRICS) for gang in _checked(gangs) for node in gang.nodes]
    return json.dumps(groups, indent=2) + "\n"


def target_files(gangs: list[ScrapeGang], directory: str = CLUSTER_DIR) -> dict[str, str]:
    """Both target files by their path on the gateway: what a gateway command rewrites
    (each atomically, by rename) when the gangs change; Prometheus needs no reload."""
    return {f"{directory}/{VLLM_TARGETS}": vllm_targets(gangs), f"{directory}/{RAY_TARGETS}": ray_targets(gangs)}


# --- the main configuration -------------------------------------------------------------


# What one node's answer may hold, so that a node (a compromised one, or a runaway label)
# cannot exhaust the gateway's memory and disk: a scrape over either limit fails whole (its
# target's `up` is 0) and stores nothing (Prometheus configuration docs, scrape_config:
# sample_limit, body_size_limit). The largest node measured gives 1065 Ray series plus 6 per
# GPU, a head 445 of vLLM's (components/prometheus_sizing.py): the limits leave ten times the
# largest (tests/test_prometheus_sizing.py holds that), and the body about 200 bytes a series.
SCRAPE_SAMPLE_LIMIT = 12_000
SCRAPE_BODY_SIZE_LIMIT = "4MB"


def _file_sd_job(job: str, targets_file: str) -> dict:
    return {
        "job_name": job,
        "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [targets_file]}],
        "sample_limit": SCRAPE_SAMPLE_LIMIT,
        "body_size_limit": SCRAPE_BODY_SIZE_LIMIT,
    }


def _self_job() -> dict:
    """Prometheus's own metrics, under the route prefix: prometheus_tsdb_head_series and
    the samples appended per second are what to size the disk and memory by
    (https://www.robustperception.io/how-much-ram-does-prometheus-2-x-need-for-cardinality-and-ingestion/)."""
    return {
        "job_name": JOB_PROMETHEUS,
        "metrics_path": f"{ROUTE_PREFIX}/metrics",
        "static_configs": [{"targets": [f"127.0.0.1:{ports.PROMETHEUS}"]}],
    }


def _waker_job() -> dict:
    """The gateway's waker (idleStopMinutes): which gangs it has stopped, stopping or
    waking (ASLEEP, scripts/gateway/vllm-cluster-waker)."""
    return {
        "job_name": JOB_WAKER,
        "metrics_path": "/metrics",
        "static_configs": [{"targets": [f"127.0.0.1:{ports.WAKER}"]}],
    }


def prometheus_config(directory: str = CLUSTER_DIR, waker: bool = False) -> str:
    """prometheus.yml: the scrape interval, the rule files, and the jobs (the waker's with
    idle stop). It names no host: the targets come from the file_sd files, so it changes
    only with this code."""
    config = {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [f"{directory}/{RECORDING_RULES}", f"{directory}/{ALERT_RULES}"],
        "scrape_configs": [
            _file_sd_job(JOB_VLLM, f"{directory}/{VLLM_TARGETS}"),
            _file_sd_job(JOB_RAY, f"{directory}/{RAY_TARGETS}"),
            _self_job(),
            *([_waker_job()] if waker else []),
        ],
    }
    header = "# Written by vllm-cluster (components/metrics.py). Do not edit on the host: `pulumi up` rewrites it.\n"
    return header + _yaml(config)


def _yaml(data: dict) -> str:
    # A wide line so PromQL stays on one line and reads as written.
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)


# --- recording rules --------------------------------------------------------------------

# vLLM 0.33's names, as prometheus_client exposes them (counters gain _total, histograms
# _bucket): vllm/v1/metrics/loggers.py of the release components/versions.py pins,
# byte-identical in the CPU build the local hosts run (one minor release older).
# Not the names of older guides: vllm:gpu_cache_usage_perc became vllm:kv_cache_usage_perc
# (vllm PR #29330) and vllm:time_per_output_token_seconds became
# vllm:inter_token_latency_seconds (vllm PR #32661); neither old name is exported.
TTFT = "vllm:time_to_first_token_seconds"  # loggers.py:930-938
INTER_TOKEN = "vllm:inter_token_latency_seconds"  # loggers.py:940-948
E2E = "vllm:e2e_request_latency_seconds"  # loggers.py:960-968
GENERATION_TOKENS = "vllm:generation_tokens_total"  # loggers.py:798-805
RUNNING = "vllm:num_requests_running"  # loggers.py:527-535
WAITING = "vllm:num_requests_waiting"  # loggers.py:537-545
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"  # loggers.py:619-627; 0..1, 1 is full
PREEMPTIONS = "vllm:num_preemptions_total"  # loggers.py:738-745

# The recorded series, named level:metric:operations
# (https://prometheus.io/docs/practices/rules/#naming-and-aggregation).
TTFT_P50 = "gang:vllm_time_to_first_token_seconds:p50"
TTFT_P95 = "gang:vllm_time_to_first_token_seconds:p95"
INTER_TOKEN_P50 = "gang:vllm_inter_token_latency_seconds:p50"
INTER_TOKEN_P95 = "gang:vllm_inter_token_latency_seconds:p95"
E2E_P95 = "gang:vllm_e2e_request_latency_seconds:p95"
TOKENS_PER_SECOND = f"gang:vllm_generation_tokens:rate{RATE_WINDOW}"
REQUESTS_RUNNING = "gang:vllm_num_requests_running:sum"
REQUESTS_WAITING = "gang:vllm_num_requests_waiting:sum"
KV_CACHE_USED = "gang:vllm_kv_cache_usage_perc:max"
PREEMPTIONS_PER_SECOND = f"gang:vllm_num_preemptions:rate{RATE_WINDOW}"


def _quantile(q: float, histogram: str) -> str:
    """A quantile of a histogram across a gang's engines: the buckets are summed by gang
    and le before histogram_quantile, the only order in which buckets may be added up
    (https://prometheus.io/docs/practices/histograms/#quantiles)."""
    return f"histogram_quantile({q}, sum by (gang, le) (rate({histogram}_bucket[{RATE_WINDOW}])))"


def recording_rule_exprs() -> dict[str, str]:
    """Each recorded series and its PromQL, one series per gang."""
    return {
        TTFT_P50: _quantile(0.5, TTFT),
        TTFT_P95: _quantile(0.95, TTFT),
        INTER_TOKEN_P50: _quantile(0.5, INTER_TOKEN),
        INTER_TOKEN_P95: _quantile(0.95, INTER_TOKEN),
        E2E_P95: _quantile(0.95, E2E),
        TOKENS_PER_SECOND: f"sum by (gang) (rate({GENERATION_TOKENS}[{RATE_WINDOW}]))",
        REQUESTS_RUNNING: f"sum by (gang) ({RUNNING})",
        REQUESTS_WAITING: f"sum by (gang) ({WAITING})",
        # The fullest engine's cache: with several engines (data parallel) an average hides
        # the one that is out of room.
        KV_CACHE_USED: f"max by (gang) ({KV_CACHE_USAGE})",
        PREEMPTIONS_PER_SECOND: f"sum by (gang) (rate({PREEMPTIONS}[{RATE_WINDOW}]))",
    }


def recording_rules() -> str:
    """The recording rules file (Prometheus's rule-file format, one group)."""
    rules = [{"record": name, "expr": expr} for name, expr in recording_rule_exprs().items()]
    return _yaml({"groups": [{"name": "vllm-cluster-gangs", "rules": rules}]})


# --- alert rules ------------------------------------------------------------------------

# How long each condition must hold before its alert fires. The issue names the KV
# cache's 10 minutes; the others are ours: long enough to ride out a burst or a missed
# scrape, short enough to page while it matters. A gang whose head has not answered for
# a minute serves nothing: the gateway already sends its requests elsewhere. A planned
# restart (a roll, the watchdog) of a large model takes longer and fires it too, which is
# true while it lasts.
ENGINE_DOWN_FOR = "1m"
HUNG_FOR = "5m"
KV_CACHE_FULL_FOR = "10m"
KV_CACHE_FULL_ABOVE = 0.95
QUEUE_GROWING_WINDOW = "10m"
QUEUE_GROWING_FOR = "15m"
RAY_METRICS_GONE_FOR = "5m"
# A refusal seen at two scrapes (the waker retries within 30 s, so one that clears at once
# says nothing); a wake given up is news at once.
WAKE_REFUSED_FOR = "1m"
WAKE_GIVEN_UP_FOR = "0m"
# The pool at maxReplicas with a queue: five minutes, five times the waker's hold time
# before it adds a gang (scale_out.SCALE_OUT_HOLD_SECONDS), so a queue that one more gang
# would have taken is not news, and one that lasts this long at the top is.
POOL_AT_MAX_FOR = "5m"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str
    summary: str


def alerts(waker: bool = False, scaling: bool = False) -> list[Alert]:
    """The five alerts of issue 21, each per gang (and per node for Ray). With the waker
    (idleStopMinutes), an engine or Ray node gone says nothing of a gang idle stop
    powered off on purpose, or is starting again: those two alerts leave it alone; and
    two of issue 34: EC2 refusing a wake's start, and a wake given up. With warm gangs
    (`scaling`: maxReplicas above replicas, issue 36), the pool at maxReplicas that still
    queues."""
    # `unless on (gang)`: no result for a gang the waker has asleep; without the waker's
    # series nothing is removed (https://prometheus.io/docs/prometheus/latest/querying/operators/#logical-set-binary-operators).
    awake = f" unless on (gang) (max by (gang) ({ASLEEP}) == 1)" if waker else ""
    return [
        Alert(
            "VllmEngineDown",
            # The scrape of a gang's head fails: vLLM's API server is gone (it exits when
            # its engine dies) or the head is unreachable.
            f'min by (gang) (up{{job="{JOB_VLLM}"}}) == 0{awake}',
            ENGINE_DOWN_FOR,
            "critical",
            "vLLM on gang {{ $labels.gang }}'s head does not answer /metrics",
        ),
        Alert(
            "VllmGangHung",
            # Requests in the batch but not one token made: a stuck collective (NCCL) or a
            # dead pipeline stage leaves the API server up and every request waiting.
            f"{REQUESTS_RUNNING} > 0 and {TOKENS_PER_SECOND} == 0",
            HUNG_FOR,
            "critical",
            "gang {{ $labels.gang }} has requests running and made no token in " + RATE_WINDOW,
        ),
        Alert(
            "VllmKvCacheFull",
            f"{KV_CACHE_USED} > {KV_CACHE_FULL_ABOVE}",
            KV_CACHE_FULL_FOR,
            "warning",
            "gang {{ $labels.gang }}'s KV cache is over "
            f"{KV_CACHE_FULL_ABOVE:.0%} full: new requests wait, running ones may be preempted",
        ),
        Alert(
            "VllmQueueGrowing",
            # deriv: the slope of a gauge by linear regression, positive while the queue
            # grows (https://prometheus.io/docs/prometheus/latest/querying/functions/#deriv).
            f"deriv({REQUESTS_WAITING}[{QUEUE_GROWING_WINDOW}]) > 0 and {REQUESTS_WAITING} > 0",
            QUEUE_GROWING_FOR,
            "warning",
            "gang {{ $labels.gang }}'s queue of waiting requests keeps growing",
        ),
        Alert(
            "RayNodeMetricsGone",
            # The node's dashboard agent does not answer on RAY_METRICS: the agent, Ray or
            # the node is down. A node taken out of the stack leaves the targets instead.
            f'(max by (gang, node) (up{{job="{JOB_RAY}"}}) == 0){awake}',
            RAY_METRICS_GONE_FOR,
            "warning",
            "Ray's metrics of node {{ $labels.node }} (gang {{ $labels.gang }}) are gone",
        ),
        *(_wake_alerts() if waker else []),
        *([_pool_alert()] if waker and scaling else []),
    ]


def _pool_alert() -> Alert:
    serving = f'max({POOL_GANGS}{{state="serving"}})'
    return Alert(
        "VllmPoolAtMaxReplicas",
        # Every gang serves, and requests waiting per serving gang are above the threshold
        # at which the waker would add one: the pool cannot grow. Both sides carry no label.
        f"{serving} >= max({POOL_MAX_GANGS}) and sum({REQUESTS_WAITING}) / {serving} > {SCALE_OUT_WAITING_PER_GANG:g}",
        POOL_AT_MAX_FOR,
        "warning",
        "every gang of the pool serves (maxReplicas) and requests still wait: raise maxReplicas, or expect "
        "queueing at this load",
    )


def _wake_alerts() -> list[Alert]:
    return [
        Alert(
            "VllmWakeRefused",
            # EC2's code is a label of the waker's gauge: the alert carries it.
            f"max by (gang, code) ({WAKE_REFUSED}) == 1",
            WAKE_REFUSED_FOR,
            "warning",
            "EC2 refuses to start gang {{ $labels.gang }}'s instances ({{ $labels.code }}); the waker retries "
            "with backoff (vllm-cluster status says more)",
        ),
        Alert(
            "VllmWakeGivenUp",
            f"max by (gang) ({WAKE_GIVEN_UP}) == 1",
            WAKE_GIVEN_UP_FOR,
            "critical",
            "gang {{ $labels.gang }}'s wake was given up: it did not serve in time and what the wake started was "
            "stopped; requests get 503 until a new try (vllm-cluster wake tries now)",
        ),
    ]


def _alert_rule(alert: Alert) -> dict:
    return {
        "alert": alert.name,
        "expr": alert.expr,
        "for": alert.duration,
        "labels": {"severity": alert.severity},
        "annotations": {"summary": alert.summary},
    }


def alert_rules(waker: bool = False, scaling: bool = False) -> str:
    """The alert rules file. No Alertmanager: alerts show at /prometheus/alerts and in
    the API (/prometheus/api/v1/alerts)."""
    rules = [_alert_rule(a) for a in alerts(waker, scaling)]
    return _yaml({"groups": [{"name": "vllm-cluster-alerts", "rules": rules}]})


def rule_files(directory: str = CLUSTER_DIR, waker: bool = False, scaling: bool = False) -> dict[str, str]:
    """Both rule files by their path on the gateway (`scaling`: with warm gangs)."""
    return {
        f"{directory}/{RECORDING_RULES}": recording_rules(),
        f"{directory}/{ALERT_RULES}": alert_rules(waker, scaling),
    }


# --- command line -----------------------------------------------------------------------


def listen_address() -> str:
    """Where Prometheus listens (prometheus_flags): the gateway's loopback only. A function,
    not a constant: the local hosts move ports.PROMETHEUS (tests/test_host_ports.py)."""
    return f"127.0.0.1:{ports.PROMETHEUS}"


# What the heads' Ray dashboards ask (RAY_PROMETHEUS_HOST + /api/v1/query, its health
# check and every query: ray/dashboard/modules/metrics/metrics_head.py, GET only), the one
# path nginx on the gateway's private address passes to Prometheus.
NODES_QUERY_PATH = f"{ROUTE_PREFIX}/api/v1/query"


def retention_size_mib(disk_gib: int) -> int:
    """The size limit for a gateway whose root volume is `disk_gib`: the share the
    storage docs advise (RETENTION_SHARE_OF_DISK) of what the system leaves."""
    room_gib = disk_gib - GATEWAY_SYSTEM_GIB
    if room_gib < MIN_PROMETHEUS_GIB:
        raise ValueError(
            f"the gateway's disk of {disk_gib} GiB leaves {room_gib} GiB for Prometheus after the system's "
            f"{GATEWAY_SYSTEM_GIB} GiB; it needs at least {MIN_PROMETHEUS_GIB} GiB. "
            "Give the gateway a larger root volume."
        )
    return math.floor(room_gib * 1024 * RETENTION_SHARE_OF_DISK)


def prometheus_flags(gateway_host: str, disk_gib: int, config_file: str = CONFIG_FILE) -> list[str]:
    """Prometheus's arguments (the ARGS of /etc/default/prometheus, which the packaged
    unit passes to /usr/bin/prometheus). `gateway_host` is the name or address users
    open, for the links Prometheus writes."""
    return [
        f"--config.file={config_file}",
        f"--storage.tsdb.path={DATA_DIR}",
        # Whichever limit is reached first applies (storage docs, operational aspects).
        f"--storage.tsdb.retention.time={RETENTION_DAYS}d",
        # "A unit is required, supported units: B, KB, MB, GB, TB, PB, EB. Ex: "512MB".
        # Based on powers-of-2, so 1KB is 1024B" (`prometheus --help`): MB is MiB.
        f"--storage.tsdb.retention.size={retention_size_mib(disk_gib)}MB",
        # Loopback only: nothing but the gateway itself talks to Prometheus. nginx on the
        # admin port passes users to it (behind adminCidrs and the metrics login), and
        # nginx on the gateway's private address passes the heads' Ray dashboards its
        # query API and nothing else (gateway_nginx.nginx_site, nodes_prometheus_ip). On every
        # interface its whole API, UI and /federate were open to anything that reached the
        # port: on EC2 the security group, on hosts the user has no group at all.
        f"--web.listen-address={listen_address()}",
        f"--web.external-url=https://{gateway_host}:{ports.DASHBOARD_HTTPS}{ROUTE_PREFIX}/",
        f"--web.route-prefix={ROUTE_PREFIX}",
    ]


# --- the login, and what the gateway is sent ------------------------------------------

# The user of the metrics login (nginx auth_basic in front of /prometheus/); its password
# is the stack's own (components/credentials.py), exported as the secret metricsLogin.
METRICS_USER = "metrics"
# Read by nginx's workers (www-data on Debian and Ubuntu) for every request to
# /prometheus/: a changed file needs no reload.
HTPASSWD_FILE = "/etc/nginx/vllm-cluster-metrics.htpasswd"
# The packaged unit's EnvironmentFile: `ExecStart=/usr/bin/prometheus $ARGS`.
DEFAULTS_FILE = "/etc/default/prometheus"


def htpasswd_line(user: str, password: str) -> str:
    """`user:{SSHA}...`, a line nginx's auth_basic_user_file takes ("{SSHA}" is salted
    SHA-1, https://nginx.org/en/docs/http/ngx_http_auth_basic_module.html): base64 of
    SHA-1(password + salt) followed by the salt. The password is 48 random letters and
    digits (285 bits), so no guess can find it from the hash, however fast SHA-1 is;
    a slow hash (bcrypt) would cost the gateway ~50 ms of CPU on every request of
    Prometheus's UI. The salt comes from the password, so the same password gives the
    same line on every `pulumi up` (the command does not run again for nothing)."""
    if ":" in user or "\n" in user + password:
        raise ValueError("the metrics user may hold no ':' and neither value a line break")
    salt = hashlib.sha256(b"vllm-cluster metrics salt\0" + password.encode()).digest()[:8]
    digest = hashlib.sha1(password.encode() + salt).digest()  # noqa: S324 (nginx's {SSHA} is SHA-1)
    return f"{user}:{{SSHA}}{base64.b64encode(digest + salt).decode()}\n"


def prometheus_defaults(flags: list[str]) -> str:
    """/etc/default/prometheus: the ARGS the packaged unit passes to Prometheus."""
    for flag in flags:
        if not re.fullmatch(r"--[a-z.-]+=[A-Za-z0-9._:/=,@+%-]+", flag):
            raise ValueError(f"Prometheus flag {flag!r} is not a plain word /etc/default/prometheus can carry")
    return (
        "# Written by vllm-cluster (components/metrics.py). Do not edit: `pulumi up` rewrites it.\n"
        f'ARGS="{" ".join(flags)}"\n'
    )


def gateway_files(
    gangs: list[ScrapeGang],
    gateway_host: str,
    disk_gib: int,
    htpasswd: str,
    waker: bool = False,
    scaling: bool = False,
) -> dict[str, str]:
    """Every file of the metrics on the gateway, by its path there: the configuration, the
    rules, the targets, Prometheus's flags and the login; `waker`: with idle stop;
    `scaling`: with warm gangs (maxReplicas above replicas: the pool's alert).
    `vllm-cluster-gateway metrics` installs them, checks them with promtool first, and
    restarts Prometheus only for new flags, reloads it for a new configuration or rules,
    and neither for new targets."""
    return {
        CONFIG_FILE: prometheus_config(waker=waker),
        **rule_files(waker=waker, scaling=scaling),
        **target_files(gangs),
        DEFAULTS_FILE: prometheus_defaults(prometheus_flags(gateway_host, disk_gib)),
        HTPASSWD_FILE: htpasswd,
    }


def loopback_url() -> str:
    """Prometheus as the gateway itself reaches it (loopback, no login), under its route
    prefix: the metrics command's readiness wait and `status`'s questions."""
    return f"http://{listen_address()}{ROUTE_PREFIX}"


def ready_url() -> str:
    """Prometheus's readiness endpoint, asked on the gateway."""
    return f"{loopback_url()}/-/ready"


def api_url() -> str:
    """Prometheus's HTTP API, asked on the gateway."""
    return f"{loopback_url()}/api/v1"


def ray_prometheus_host(gateway_private_ip: str) -> str:
    """RAY_PROMETHEUS_HOST for the head's dashboard: Ray appends /api/v1/query to it
    (ray/dashboard/modules/metrics/metrics_head.py), so it carries the route prefix and
    no trailing slash. Over the private network, to the port only the nodes may reach,
    where nginx passes that one path to Prometheus on loopback (NODES_QUERY_PATH)."""
    return f"http://{_address(gateway_private_ip, ports.PROMETHEUS)}{ROUTE_PREFIX}"
