"""components/gateway_capacity.py: what the gateway's nginx holds, from what the stack serves."""

import pytest

from components import gateway_capacity
from components.gateway_capacity import MIN_STREAMS, capacity, spec_capacity
from components.spec import load_spec

# A small stack: one node of one L4 (vLLM's max_num_seqs 256 by default).
SMALL = {
    "model": "Qwen/Qwen2.5-1.5B-Instruct",
    "instanceType": "g6.xlarge",
    "nodes": 1,
    "apiAllowedCidrs": ["203.0.113.0/24"],
    "adminCidrs": ["198.51.100.7/32"],
}


def spec_of(**changes):
    return load_spec({**SMALL, **changes}, stack="test", region="us-east-1")


def test_a_small_stack_still_holds_the_floor_a_burst_of_a_thousand_needs():
    sized = spec_capacity(spec_of())
    assert sized.max_num_seqs == 256 and sized.gangs == 1
    assert sized.streams == MIN_STREAMS >= 1000
    # Debian's 768 reset 276 of 1,000 streams in flight (issue 48); the sizing is far above it.
    assert sized.worker_connections >= 2 * sized.streams > 768


def test_streams_grow_with_each_gangs_batch_and_queue_above_the_floor():
    # 8 gangs of 1,024: each runs 1,024 and queues as many, twice over for headroom.
    assert gateway_capacity.gateway_streams(8, 1024) == 8 * 1024 * 2 * 2
    assert gateway_capacity.gateway_streams(9, 1024) > gateway_capacity.gateway_streams(8, 1024)
    assert gateway_capacity.gateway_streams(1, 16) == MIN_STREAMS


def test_one_worker_holds_every_stream_twice_and_its_upstream_pool():
    sized = capacity(8, 1024)
    assert sized.worker_connections >= 2 * sized.streams + sized.upstream_keepalive
    # Every connection is a descriptor, and a stream may hold a body's temporary file too.
    assert sized.open_files >= sized.worker_connections + sized.streams


def test_the_upstream_pool_keeps_every_gangs_batch_not_sixteen():
    assert capacity(1, 256).upstream_keepalive == 256
    assert capacity(3, 1024).upstream_keepalive == 3 * 1024


def test_max_replicas_counts_the_warm_gangs_too():
    big = ["--max-num-seqs", "1024"]
    always = spec_capacity(spec_of(replicas=1, maxReplicas=1, vllmExtraArgs=big))
    warm = spec_capacity(spec_of(replicas=1, maxReplicas=4, idleStopMinutes=30, vllmExtraArgs=big))
    assert (always.gangs, warm.gangs) == (1, 4)
    assert warm.streams == 4 * always.streams
    assert warm.upstream_keepalive == 4 * 1024


def test_max_num_seqs_in_vllm_extra_args_sizes_the_gateway():
    sized = spec_capacity(spec_of(vllmExtraArgs=["--max-num-seqs", "2048"]))
    assert sized.max_num_seqs == 2048
    assert sized.streams == 2048 * 2 * 2
    assert sized.upstream_keepalive == 2048


@pytest.mark.parametrize(("gangs", "seqs"), [(0, 256), (1, 0)])
def test_no_gang_or_no_batch_is_a_mistake_not_a_size(gangs, seqs):
    with pytest.raises(ValueError):
        capacity(gangs, seqs)


# --- the gateway's type against that load ---------------------------------------------------


def test_a_small_gateway_carries_one_gang_of_256_and_warns_at_a_large_batch():
    small = gateway_capacity.gateway_load(capacity(1, 256), "t3.small", 2, 2048, 509)
    assert small.warnings == ()
    assert small.vcpus_sustained == pytest.approx(0.4)  # t3.small: 2 vCPUs at a 20 % baseline
    large = gateway_capacity.gateway_load(capacity(1, 1024), "t3.small", 2, 2048, 509)
    assert large.vcpus_needed > large.vcpus_sustained
    (warning,) = large.warnings
    assert "gatewayInstanceType t3.small" in warning and "Fix:" in warning and "c7i.large" in warning


def test_memory_for_every_stream_beside_prometheus_is_checked():
    many = capacity(16, 4096)  # 262,144 streams
    load = gateway_capacity.gateway_load(many, "t3.medium", 2, 4096, 509)
    assert any("MiB" in warning and "more memory" in warning for warning in load.warnings)


def test_a_type_the_planner_does_not_know_is_not_checked():
    load = gateway_capacity.gateway_load(capacity(16, 1024), "c7i.large", None, None, 509)
    assert load.vcpus_sustained is None and load.memory_mib is None and load.warnings == ()
