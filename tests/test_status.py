"""How `scripts/vllm-cluster status` judges a snapshot: healthy, degraded (named),
down, or unknown when nothing answered."""

import pytest

from cli import status
from cli.cluster import Node
from components.spec import load_spec

SPEC = load_spec(
    {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "instanceType": "g5.12xlarge",
        "nodes": 3,
        "tensorParallelSize": 4,
        "efa": "false",
        "apiAllowedCidrs": ["10.0.0.0/8"],
        "adminCidrs": ["10.1.0.0/16"],
    },
    stack="t",
)
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


class FakeCluster:
    nodes = [Node(i, ip) for i, ip in enumerate(IPS)]


def snap(alive=None, health=200, completion=200, facts=True, ray_error=None):
    facts_doc = {
        "alive": {ip: 4.0 for ip in (IPS if alive is None else alive)},
        "vllm_unit": "active",
        "health": health,
        "metrics": {"running": 0, "waiting": 0, "kv_cache_usage": 0.1, "tokens_per_second": 5},
    }
    if ray_error:
        facts_doc = {**facts_doc, "alive": {}, "ray_error": ray_error}
    return {
        "facts": facts_doc if facts else None,
        "factsError": None if facts else "ssh: connect timed out",
        "completion": {"status": completion, "seconds": 0.1, "error": "" if completion == 200 else "boom"},
    }


def verdict(**kwargs):
    report = status.assess(FakeCluster(), SPEC, snap(**kwargs))
    return report["exitCode"], report["problems"]


def test_everything_there_is_healthy():
    assert verdict() == (0, [])


def test_a_missing_worker_is_degraded_and_named():
    code, problems = verdict(alive=IPS[:2], completion=500)
    assert code == 1
    assert "worker-2 (10.0.0.3) is not in the Ray cluster" in problems
    assert any("Ray has 8 of 12 GPUs" in p for p in problems)


def test_health_200_with_failing_completions_is_degraded_not_healthy():
    code, problems = verdict(completion=500)
    assert code == 1 and any("HTTP 500" in p for p in problems)


def test_vllm_not_serving_is_down():
    code, problems = verdict(health=0, completion=0)
    assert code == 2 and problems[0].startswith("vLLM is not serving")


def test_no_answer_from_anything_is_unknown_not_down():
    code, problems = verdict(facts=False, completion=0)
    assert code == 3 and "the head did not answer" in problems[0]


@pytest.mark.parametrize("facts", [False, True])
def test_unseen_ray_does_not_call_nodes_missing(facts):
    kwargs = {"facts": False} if not facts else {"ray_error": "GCS timed out"}
    report = status.assess(FakeCluster(), SPEC, snap(**kwargs))
    assert all(node["alive"] is None for node in report["nodes"])
    assert not any("not in the Ray cluster" in p for p in report["problems"])
