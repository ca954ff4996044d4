"""components/prometheus_sizing.py: whether the gateway holds Prometheus for the stack's
gangs (issue 21), and bench/bench_metrics_series.py's count of series, which the
sizing's measured figures come from."""

import importlib.util
from pathlib import Path

import pytest

from components import metrics
from components import prometheus_sizing as sizing
from components.config_keys import DEFAULT_GATEWAY_INSTANCE_TYPE, MAX_REPLICAS
from components.sizing import GATEWAY_PRICE_PER_HOUR

ROOT = Path(__file__).resolve().parent.parent
ROOT_GIB = 20  # components/gateway.py GATEWAY_ROOT_GIB (that module needs Pulumi)

_spec = importlib.util.spec_from_file_location("bench_metrics_series", ROOT / "bench" / "bench_metrics_series.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_the_gateway_root_volume_here_is_the_gateways():
    text = (ROOT / "components" / "gateway.py").read_text()
    assert f"GATEWAY_ROOT_GIB = {ROOT_GIB}\n" in text


# --- the series ---------------------------------------------------------------------------


def test_a_head_carries_vllm_and_ray_and_a_worker_ray_alone():
    assert sizing.head_series(8) == sizing.VLLM_HEAD_SERIES + sizing.ray_node_series(8)
    assert sizing.worker_series(8) == sizing.ray_node_series(8)
    # Ray's GPU series (not measurable here) grow with the node's GPUs.
    assert sizing.ray_node_series(8) - sizing.ray_node_series(1) == 7 * sizing.RAY_SERIES_PER_GPU


def test_every_node_gang_and_rule_adds_series_and_samples():
    one = sizing.ingest(1, 1, 1)
    assert one.targets == 3  # vLLM on the head, Ray on the head, Prometheus itself
    assert one.series == (
        sizing.head_series(1)
        + sizing.PROMETHEUS_SELF_SERIES
        + 3 * sizing.SERIES_PER_TARGET
        + len(metrics.recording_rule_exprs())
    )
    # Scraped and evaluated every 15 s: a series is a sample every 15 s.
    assert one.samples_per_second == pytest.approx(one.series / 15)
    two_nodes, two_gangs = sizing.ingest(1, 2, 1), sizing.ingest(2, 1, 1)
    assert two_nodes.series - one.series == sizing.worker_series(1) + sizing.SERIES_PER_TARGET
    assert two_gangs.series - one.series == (
        sizing.head_series(1) + 2 * sizing.SERIES_PER_TARGET + len(metrics.recording_rule_exprs())
    )


def test_the_recorded_series_follow_the_rules_the_gateway_loads():
    assert sizing.recorded_series_per_gang() == len(metrics.recording_rule_exprs()) == 10


def test_a_gang_needs_a_node():
    with pytest.raises(ValueError, match="nodes"):
        sizing.ingest(1, 0, 8)


# --- memory --------------------------------------------------------------------------------


def test_the_default_gateway_holds_the_dev_stack():
    """dev: one gang of one g6.xlarge (one GPU) behind the default gateway."""
    sized = sizing.gateway_sizing(1, 1, 1, DEFAULT_GATEWAY_INSTANCE_TYPE, ROOT_GIB)
    assert sized.memory_fits is True and sized.warnings == ()
    assert sized.needed_mib < sized.memory_mib * sizing.MEMORY_SHARE


def test_a_t3_micro_for_8_gangs_of_4_nodes_is_within_its_memory_by_this_model():
    """What the measured series say: 8 gangs of 4 eight-GPU nodes are ~37k series, about
    100 MiB of head; a t3.micro's 1 GiB holds that beside the gateway's own 500 MiB."""
    sized = sizing.gateway_sizing(8, 4, 8, "t3.micro", ROOT_GIB)
    assert 30_000 < sized.ingest.series < 45_000
    assert sized.memory_fits is True and not any("too small" in w for w in sized.warnings)


def test_a_t3_micro_is_warned_about_once_the_gangs_outgrow_it_with_the_types_that_fit():
    largest = sizing.gateway_sizing(MAX_REPLICAS, 16, 8, "t3.micro", ROOT_GIB)
    assert largest.memory_fits is False
    [warning] = [w for w in largest.warnings if "too small" in w]
    assert warning.startswith("gatewayInstanceType t3.micro (1,024 MiB) is too small for Prometheus")
    assert f"{largest.ingest.series:,} series" in warning and "use t3.small or t4g.small" in warning
    # Those hold it: same gangs, no memory warning.
    for better in ("t3.small", "t4g.small"):
        assert sizing.gateway_sizing(MAX_REPLICAS, 16, 8, better, ROOT_GIB).memory_fits is True


def test_the_warning_comes_exactly_where_the_memory_runs_out():
    limit = sizing.max_series("t3.micro")
    assert sizing.memory_needed_mib(limit) <= 1024 * sizing.MEMORY_SHARE < sizing.memory_needed_mib(limit + 1)
    assert sizing.smallest_gateways(limit) == ["t3.micro"]
    assert sizing.smallest_gateways(limit + 1) == ["t3.small", "t4g.small"]
    assert sizing.smallest_gateways(10**9) == []


def test_an_unknown_gateway_type_is_not_guessed_but_named():
    sized = sizing.gateway_sizing(2, 2, 8, "m7i.large", ROOT_GIB)
    assert sized.memory_mib is None and sized.memory_fits is None
    [warning] = sized.warnings
    assert warning.startswith("gatewayInstanceType m7i.large: its memory is not in the planner's table")
    assert "t3.small" in warning and f"{sized.needed_mib:,.0f} MiB" in warning


def test_every_gateway_type_the_planner_prices_has_its_memory():
    assert set(sizing.GATEWAY_MEMORY_GIB) == set(GATEWAY_PRICE_PER_HOUR)
    assert DEFAULT_GATEWAY_INSTANCE_TYPE in sizing.GATEWAY_MEMORY_GIB


# --- disk ----------------------------------------------------------------------------------


def test_the_dev_stack_keeps_15_days_within_the_retention_limit():
    sized = sizing.gateway_sizing(1, 1, 1, DEFAULT_GATEWAY_INSTANCE_TYPE, ROOT_GIB)
    assert sized.retention_days == metrics.RETENTION_DAYS == 15
    assert sized.retention_mib < sized.retention_limit_mib == metrics.retention_size_mib(ROOT_GIB)
    assert sized.days_at_limit > 15


def test_the_storage_docs_formula():
    """retention seconds x samples per second x bytes per sample (2: the top of "1-2")."""
    assert sizing.disk_bytes(15, 1000) == 15 * 86400 * 1000 * 2
    assert sizing.days_within(1024, 1000) == pytest.approx(1024 * 2**20 / (86400 * 1000 * 2))


def test_when_15_days_do_not_fit_the_warning_says_how_many_do():
    sized = sizing.gateway_sizing(MAX_REPLICAS, 16, 8, "t3.medium", ROOT_GIB)
    assert sized.retention_mib > sized.retention_limit_mib and sized.days_at_limit < 15
    [warning] = [w for w in sized.warnings if "days" in w]
    assert warning.startswith(f"Prometheus keeps only about {sized.days_at_limit:.1f} of 15 days")
    assert f"{sized.retention_limit_mib:,} MiB ({ROOT_GIB} GiB root volume)" in warning
    # The days that fit, at this rate, fill the limit.
    full = sizing.disk_bytes(sized.days_at_limit, sized.ingest.samples_per_second)
    assert full == pytest.approx(sized.retention_limit_mib * 2**20)


def test_prometheus_durations():
    assert [sizing.seconds(d) for d in ("15s", "5m", "2h", "15d")] == [15, 300, 7200, 15 * 86400]
    with pytest.raises(ValueError):
        sizing.seconds("1h30m")


# --- the bench's count ---------------------------------------------------------------------

EXPOSITION = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 0.0

# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 0.5
ray_node_cpu_count{SessionName="s",ip="127.0.0.1",label="a b"} 2.0 1733100000000
process_open_fds 12.0
process_open_fds 13.0
"""


def test_the_bench_counts_every_bucket_and_no_comment_or_repeat():
    keys = bench.series(EXPOSITION)
    assert len(keys) == 7
    assert 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"}' in keys
    # A label value with a space and a timestamp after the value: one series by its labels.
    assert 'ray_node_cpu_count{SessionName="s",ip="127.0.0.1",label="a b"}' in keys
    assert bench.family('vllm:e2e_request_latency_seconds_bucket{le="1"}') == "vllm:e2e_request_latency_seconds"


@pytest.mark.parametrize("gangs, nodes", [(1, 1), (8, 4), (16, 8), (16, 16)])
@pytest.mark.parametrize("gateway", sorted(sizing.GATEWAY_MEMORY_GIB))
def test_the_verdict_leaves_a_fifth_of_the_memory_to_the_page_cache(gangs, nodes, gateway):
    """16 gangs of 8 nodes need ~890 MiB: within a t3.micro's 1 GiB, but not within its
    80%, so they are warned about; the verdict is max_series's at every size."""
    sized = sizing.gateway_sizing(gangs, nodes, 8, gateway, ROOT_GIB)
    assert sized.memory_fits == (sized.ingest.series <= sizing.max_series(gateway))
    if (gangs, nodes, gateway) == (16, 8, "t3.micro"):
        assert sized.memory_mib * sizing.MEMORY_SHARE < sized.needed_mib < sized.memory_mib
        assert sized.memory_fits is False


def test_the_scrape_limits_leave_ten_times_the_largest_nodes_series():
    """A scrape over sample_limit fails whole (the node's `up` goes to 0): the limit that
    keeps one node from exhausting the gateway must stay far above what a healthy node
    gives, the largest GPU count of the catalog included."""
    from components.catalog import CATALOG

    most_gpus = max(instance.gpus for instance in CATALOG.values())
    largest = max(sizing.ray_node_series(most_gpus), sizing.VLLM_HEAD_SERIES)
    assert metrics.SCRAPE_SAMPLE_LIMIT >= 10 * largest
    # About 200 bytes a line of the text format: the body limit holds as many lines.
    assert int(metrics.SCRAPE_BODY_SIZE_LIMIT.removesuffix("MB")) * 1024 * 1024 >= 200 * metrics.SCRAPE_SAMPLE_LIMIT
