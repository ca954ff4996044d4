"""How much the gateway's nginx must hold, from what the stack can serve (issue 48): the
streams in flight (every declared gang's running batch and a queue as long waiting in
vLLM, with headroom), and from them nginx's worker_connections, worker_rlimit_nofile and
the upstream keep-alive pool. Debian's nginx.conf ships worker_connections 768: measured
on the local target, 276 of 1,000 streams in flight were reset at 768 and none at 8,192.
Pure: reads the spec only; components/gateway_commands.py passes the figures to
`vllm-cluster-gateway configure`, the site takes the keep-alive pool, and `plan` states
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.engine_capacity import spec_gang_max_num_seqs

# Each gang runs max_num_seqs requests at once and vLLM's scheduler queues the rest
# (its waiting count, vllm:num_requests_waiting, is what the warm pool scales out on):
# the gateway holds a queue as long as the running batch per gang, so a burst waits in
# vLLM rather than being reset at the gateway.
QUEUED_PER_RUNNING = 1
# Streams beyond running + queued: clients' idle keep-alive connections between requests
# (each holds a connection slot while idle), reconnects after a reset, a client that
# opens its next request before the last one's connection closed.
HEADROOM_FACTOR = 2
# Never fewer streams than this: a stack of one small gang still takes a burst of 1,000+
# requests in flight (a benchmark, a batch job) without resets. The cost: each worker
# allocates a connection and its read and write events for every worker_connections slot
# at its start (ngx_event_process_init, about 450 bytes a slot: ~4 MiB a worker here), and
# the buffers and TLS state of a stream only for connections it opens (KIB_PER_STREAM).
MIN_STREAMS = 4096
# A proxied stream holds two connections in its worker: the client's and the upstream's
# (nginx docs, ngx_core_module worker_connections: "this number includes all connections
# (e.g. connections with proxied servers, among others), not only connections with clients").
CONNECTIONS_PER_STREAM = 2
# The admin port (Ray dashboard, Prometheus), the nodes' Prometheus listener, the waker's
# hand-offs, and each listening socket (every worker takes a connection slot per listen).
ADMIN_CONNECTIONS = 512
# Descriptors beyond the connections: a request body larger than client_body_buffer_size
# (8k or 16k) is written to a temporary file that stays open until the request ends
# (ngx_http_core_module client_body_buffer_size; the API allows 4m bodies), so a stream
# may hold a third descriptor; plus the logs, the listening sockets and nginx's own files.
# worker_rlimit_nofile raises the workers' RLIMIT_NOFILE (ngx_core_module), which must
# cover every descriptor a worker opens, not only connections.
TEMP_FILES_PER_STREAM = 1
OPEN_FILES_RESERVE = 1024


@dataclass(frozen=True)
class GatewayCapacity:
    """What the gateway's nginx is configured to hold."""

    gangs: int
    max_num_seqs: int  # per gang: vLLM's max_num_seqs (components/engine_capacity.py)
    streams: int  # requests in flight the gateway holds
    worker_connections: int  # nginx's events { worker_connections }: per worker
    open_files: int  # nginx's worker_rlimit_nofile: per worker
    upstream_keepalive: int  # the vllm_api upstream's keepalive: idle connections per worker


def gateway_streams(gangs: int, max_num_seqs: int) -> int:
    """The requests in flight the gateway must hold: each gang's running batch and a queue
    as long (QUEUED_PER_RUNNING), times the gangs, times HEADROOM_FACTOR; at least MIN_STREAMS."""
    if gangs < 1 or max_num_seqs < 1:
        raise ValueError(f"gangs ({gangs}) and max_num_seqs ({max_num_seqs}) must be at least 1")
    return max(MIN_STREAMS, gangs * max_num_seqs * (1 + QUEUED_PER_RUNNING) * HEADROOM_FACTOR)


def upstream_keepalive(gangs: int, max_num_seqs: int) -> int:
    """Idle connections to the heads each worker keeps (nginx docs, ngx_http_upstream_module
    keepalive: "the maximum number of idle keepalive connections to upstream servers that
    are preserved in the cache of each worker process"): every gang's running batch, so a
    batch that ends and the next that starts reuse connections instead of opening new ones
    on vLLM's API server, which shares the engine's CPU (issue 48: keepalive 16 for
    hundreds of streams). Idle ones still close after GATEWAY_UPSTREAM_KEEPALIVE_SECONDS."""
    return gangs * max_num_seqs


def worker_connections(streams: int, keepalive: int) -> int:
    """One worker must hold every stream: nginx does not spread connections evenly over
    its workers (a worker that wakes first accepts what is queued), so each is sized for
    all of them, two connections a stream, plus its idle upstream pool and the admin side."""
    return streams * CONNECTIONS_PER_STREAM + keepalive + ADMIN_CONNECTIONS


def open_files(streams: int, connections: int) -> int:
    """worker_rlimit_nofile: a descriptor per connection, a body's temporary file per
    stream, and OPEN_FILES_RESERVE for logs and listeners."""
    return connections + streams * TEMP_FILES_PER_STREAM + OPEN_FILES_RESERVE


def capacity(gangs: int, max_num_seqs: int) -> GatewayCapacity:
    """The gateway's figures for `gangs` gangs of `max_num_seqs` each."""
    streams = gateway_streams(gangs, max_num_seqs)
    keepalive = upstream_keepalive(gangs, max_num_seqs)
    connections = worker_connections(streams, keepalive)
    return GatewayCapacity(
        gangs=gangs,
        max_num_seqs=max_num_seqs,
        streams=streams,
        worker_connections=connections,
        open_files=open_files(streams, connections),
        upstream_keepalive=keepalive,
    )


def spec_capacity(spec) -> GatewayCapacity:
    """capacity for a ClusterSpec: every declared gang (maxReplicas: warm gangs serve
    through the same gateway once woken) at the gangs' max_num_seqs."""
    return capacity(spec.declared_gangs, spec_gang_max_num_seqs(spec))


# --- the gateway's instance type against that load (plan) ------------------------------------

# The vCPUs a burstable gateway type sustains, as a share of each vCPU (AWS, "Key concepts
# for burstable performance instances", baseline utilization per vCPU: t3.micro 10 %,
# t3.small 20 %, t3.medium 20 %, t4g.small 20 %); above it the type spends CPU credits
# and, out of them (standard mode) or at a charge (unlimited, T3's default), runs on.
# A type that is not burstable sustains all of each vCPU (c7i.large). A type not in this
# table: not checked.
BURSTABLE_BASELINE = {"t3.micro": 0.10, "t3.small": 0.20, "t3.medium": 0.20, "t4g.small": 0.20, "c7i.large": 1.0}
BURSTABLE_DOC = "https://docs.aws.amazon.com/ec2/latest/instancetypes/burstable-performance-instances.html"
# ESTIMATE, not a measurement here: the tokens one running sequence streams a second at a
# full batch (an inter-token latency of about 33 ms), each one server-sent event that
# nginx reads from vLLM, encrypts and writes to its client.
ESTIMATED_TOKENS_PER_SECOND_PER_SEQUENCE = 30
# nginx's CPU per proxied SSE event under TLS (a read from the upstream, one TLS record, a
# write), MEASURED on this project's 2-core test machine on loopback, 2026-12-07, by
# bench/bench_gateway_sse.py (one worker, TLS 1.3, proxy_buffering off, 20 ms between a
# stream's events, a fleet running beside it): 23 to 28 us of the worker's CPU an event
# over 100 to 1,000 streams; the highest is taken. A gateway's core may be slower or faster.
CPU_SECONDS_PER_EVENT = 28e-6
# Memory a TLS stream takes in nginx: MEASURED by the same bench, the worker's resident
# memory grew by 47 to 55 KiB a stream (300 and 1,000 streams: its buffers and OpenSSL's
# state); plus a request body's buffer, client_body_buffer_size 16k on 64-bit
# (ngx_http_core_module), which the bench's GETs do not hold: 55 + 16, taken as 72.
KIB_PER_STREAM = 72


@dataclass(frozen=True)
class GatewayLoad:
    """The gateway type's CPU and memory against the streams it holds; None: not known."""

    instance_type: str
    events_per_second: int  # SSE events at every gang's full batch
    vcpus_needed: float
    vcpus_sustained: float | None  # None: a type the planner does not know
    nginx_mib: float  # nginx at every stream it holds
    memory_mib: int | None
    warnings: tuple[str, ...]


def gateway_load(
    sized: GatewayCapacity, instance_type: str, vcpus: int | None, memory_mib: int | None, other_mib: float
) -> GatewayLoad:
    """nginx's CPU for TLS + SSE at every gang's full batch, against the vCPUs the type
    sustains (BURSTABLE_BASELINE; unknown types are not checked), and its memory at every
    stream beside `other_mib` (Prometheus's need) within `memory_mib`. The token rate is
    an estimate (ESTIMATED_TOKENS_PER_SECOND_PER_SEQUENCE); the per-event CPU and the
    per-stream memory were measured on loopback (bench/bench_gateway_sse.py)."""
    events = sized.gangs * sized.max_num_seqs * ESTIMATED_TOKENS_PER_SECOND_PER_SEQUENCE
    needed = events * CPU_SECONDS_PER_EVENT
    baseline = BURSTABLE_BASELINE.get(instance_type)
    sustained = vcpus * baseline if vcpus is not None and baseline is not None else None
    nginx_mib = sized.streams * KIB_PER_STREAM / 1024
    warnings = []
    key = f"gatewayInstanceType {instance_type}"
    if sustained is not None and needed > sustained:
        warnings.append(
            f"{key} sustains {sustained:g} vCPU ({vcpus} x its {baseline:.0%} baseline, {BURSTABLE_DOC}); nginx's "
            f"TLS and SSE at every gang's full batch (~{events:,} events/s at an estimated "
            f"{ESTIMATED_TOKENS_PER_SECOND_PER_SEQUENCE} tokens/s a sequence) needs ~{needed:.2f}. Fix: a "
            f"type that is not burstable, with at least {max(2, -int(-needed // 1))} vCPUs (e.g. c7i.large), or "
            "t3.xlarge: pulumi config set vllm-cluster:gatewayInstanceType c7i.large"
        )
    if memory_mib is not None and nginx_mib + other_mib > memory_mib:
        warnings.append(
            f"{key} has {memory_mib:,} MiB; nginx at {sized.streams:,} streams (~{nginx_mib:,.0f} MiB) "
            f"and Prometheus ({other_mib:,.0f} MiB) need more. Fix: a type with more memory (t3.medium: 4 GiB)"
        )
    return GatewayLoad(instance_type, events, needed, sustained, nginx_mib, memory_mib, tuple(warnings))
