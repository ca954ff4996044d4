"""The preflight comparison (scripts/node/preflight-check), on facts a test makes:
each check names the node that fails it and says what to do."""

import copy

from cli.preflight import node_checks

# The comparison the nodes and the operator share, loaded from scripts/node/preflight-check.
CHECKS = node_checks()

GOOD = {
    "node": "head",
    "ip": "10.0.0.1",
    "python": "3.10.12",
    "ray": "2.60.0",
    "vllm": "0.33.0",
    "torch": "2.9.0",
    "nccl": "2.27.3",
    "cuda_driver": "570.133.20",
    "gpus": 8,
    "gpu_memory_mib": [40960] * 8,
    "efa_devices": 4,
    "interface": "ens5",
    "interface_ok": True,
    "model_complete": True,
    "free_disk_gb": 120.0,
    "clock_synchronised": "yes",
    "clock_skew_s": 0.0,
    "gcs_reachable": True,
}


def node(name: str, **changes) -> dict:
    facts = copy.deepcopy(GOOD)
    facts.update(node=name, **changes)
    return facts


PINNED = {"ray": "2.60.0", "vllm": "0.33.0"}


def failures(*facts, efa=4, pinned=PINNED):
    return CHECKS.failures(CHECKS.compare(list(facts), gpus=8, gpu_memory_gib=40, efa=efa, pinned=pinned))


def test_identical_healthy_nodes_pass():
    assert failures(node("head"), node("worker-1"), node("worker-2")) == []


def test_the_odd_ray_version_is_named_on_its_node():
    problems = failures(node("head"), node("worker-1", ray="2.59.0"), node("worker-2"))
    assert len(problems) == 1 and problems[0].startswith("worker-1: ray is 2.59.0. Fix:")


def test_a_pinned_version_decides_even_against_the_head():
    # Two nodes, the head stale: the pinned version names the head, not the healthy worker.
    problems = failures(node("head", vllm="0.32.0"), node("worker-1"))
    assert [p.split(":")[0] for p in problems] == ["head"]


def test_an_unpinned_tie_flags_every_node():
    problems = failures(node("head", torch="2.8.0"), node("worker-1"))
    assert sorted(p.split(":")[0] for p in problems) == ["head", "worker-1"]
    assert all(": torch is " in p for p in problems)


def test_the_majority_decides_an_unpinned_value():
    problems = failures(node("head"), node("worker-1"), node("worker-2", python="3.10.4"))
    assert [p.split(":")[0] for p in problems] == ["worker-2"]


def test_hardware_interface_model_disk_clock_and_gcs_each_name_the_node():
    cases = {
        "gpus": dict(gpus=7, gpu_memory_mib=[40960] * 7),
        "gpu_memory": dict(gpu_memory_mib=[24576] * 8),
        "efa": dict(efa_devices=1),
        "interface": dict(interface_ok=False),
        "model": dict(model_complete=False),
        "disk": dict(free_disk_gb=3.0),
        "clock": dict(clock_skew_s=9.0),
        "gcs": dict(gcs_reachable=False),
    }
    for check, changes in cases.items():
        problems = failures(node("head"), node("worker-1", **changes))
        assert any(p.startswith(f"worker-1: {check} is") for p in problems), (check, problems)


def test_a_missing_driver_fails_even_when_every_node_lacks_it():
    problems = failures(node("head", cuda_driver="missing"), node("worker-1", cuda_driver="missing"))
    assert {p.split(":")[0] for p in problems} == {"head", "worker-1"}


def test_without_the_heads_dashboard_the_clock_falls_back_to_ntp():
    assert failures(node("head", clock_skew_s=None), node("worker-1", clock_skew_s=None)) == []
    problems = failures(node("head"), node("worker-1", clock_skew_s=None, clock_synchronised="no"))
    assert [p.split(":")[0] for p in problems] == ["worker-1"]


def test_a_model_is_complete_only_when_staged_to_the_end_with_every_shard(tmp_path):
    model = tmp_path / "models" / "org" / "m" / "main"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}'
    )
    (model / "part-1.safetensors").write_bytes(b"x")
    assert not CHECKS.model_complete(str(model))  # no marker yet
    marker = tmp_path / "complete" / "org" / "m" / "main"
    marker.parent.mkdir(parents=True)
    marker.write_text("staged")
    assert not CHECKS.model_complete(str(model))  # a shard is missing
    (model / "part-2.safetensors").write_bytes(b"")
    assert not CHECKS.model_complete(str(model))  # a shard is empty
    (model / "part-2.safetensors").write_bytes(b"y")
    assert CHECKS.model_complete(str(model))


def test_efa_is_not_checked_when_it_is_off():
    assert failures(node("head", efa_devices=0), node("worker-1", efa_devices=0), efa=0) == []


def test_the_table_has_a_row_per_check_and_a_column_per_node():
    rows = CHECKS.compare(
        [node("head"), node("worker-1", ray="2.59.0")], gpus=8, gpu_memory_gib=40, efa=4, pinned=PINNED
    )
    table = CHECKS.render(rows).splitlines()
    assert table[0].split() == ["check", "head", "worker-1"]
    ray = next(line for line in table if line.startswith("ray "))
    assert "ok  2.60.0" in ray and "XX  2.59.0" in ray
