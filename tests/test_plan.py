"""`scripts/vllm-cluster plan`: the printed plan of every stack against a golden copy
(tests/golden/plan-<stack>.txt; VLLM_CLUSTER_UPDATE_GOLDEN=1 rewrites them after
a deliberate change), and the --json document's contract."""

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest
from pulumi_mocks import stack_config, stack_names

from cli import plan
from cli.stack_file import read_stack
from components import aws_contract, bootstrap, gateway_capacity, image, prometheus_sizing, sizing, versions
from components.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize("stack", stack_names())
def test_the_printed_plan_matches_its_golden_copy(stack):
    printed = plan.render(plan.build_plan(stack))
    golden = GOLDEN / f"plan-{stack}.txt"
    if os.environ.get("VLLM_CLUSTER_UPDATE_GOLDEN"):
        golden.write_text(printed)
    assert printed == golden.read_text()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "vllm-cluster"), *args], capture_output=True, text=True, cwd=ROOT)


def test_json_has_the_documented_fields():
    result = run_cli("plan", "--stack", "prod", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert isinstance(document["costPerHourUsd"], float) and document["costPerHourUsd"] > 40
    assert document["weightsGB"] == pytest.approx(141.2)
    assert document["fits"] is True
    assert document["ranks"][0] == {"rank": 0, "node": 0, "gpu": 0, "tpRank": 0, "ppRank": 0}
    assert document["ranks"][15] == {"rank": 15, "node": 1, "gpu": 7, "tpRank": 7, "ppRank": 1}
    assert isinstance(document["timeToFirstTokenSeconds"], int) and document["timeToFirstTokenSeconds"] > 0
    assert isinstance(document["warnings"], list)
    # The image the nodes boot, from components/image.py.
    assert document["image"] == {"name": image.DLAMI_DESCRIPTION, "python": "3.12"}
    # AWS's rules on every resource's inputs (components/aws_contract.py): nothing refused.
    assert document["problems"] == []
    assert document["awsContract"] == {"ok": True, "errors": [], "warnings": []}
    # The model's bytes per node: what each pulls from the cache, its copy to NVMe, the engine's read.
    model_bytes = document["modelBytes"]
    assert model_bytes["efsClientMiBps"] == 500 and model_bytes["efsUtilsVersion"] == versions.EFS_UTILS_VERSION
    assert model_bytes["download"]["perNodeGB"] == 70.6 and model_bytes["servesFromLocalDisk"] is True
    assert [node["copy"]["to"] for node in model_bytes["perNode"]] == [image.NVME_MOUNT] * 2


def test_the_serve_args_are_the_bootstraps_own():
    document = plan.build_plan("prod")
    config = {k.split(":", 1)[1]: v for k, v in stack_config("prod").items() if k.startswith("vllm-cluster:")}
    assert document["vllmServeArgs"] == bootstrap.vllm_serve_args(load_spec(config, stack="prod"), "<head-ip>")
    assert all("apiKey" not in a and "--api-key" != a for a in document["vllmServeArgs"])


def test_every_resource_the_program_declares_is_listed():
    document = plan.build_plan("h100")
    listed = sum(n for counts in document["resources"].values() for n in counts.values())
    components = len(document["resources"])
    assert listed + components == document["resourceCount"]
    # 6 gateway (setup, login probe, TLS, API keys, site, metrics) + per node (login wait, setup, secrets, ray, prepare,
    # preflight facts, warmup, idle stop, fabric measure) + cluster-ready, model, preflight, fabric gate, vllm,
    # readiness + the worker's model part
    assert document["resources"]["vllm (ClusterServices)"]["command:remote:Command"] == 6 + 2 * 9 + 6 + 1


def test_a_model_outside_the_table_is_sized_from_params_and_dtype():
    result = run_cli("plan", "--stack", "dev", "--json", "--params-b", "70", "--dtype", "bf16")
    document = json.loads(result.stdout)
    assert document["weightsGB"] == 140.0 and document["fits"] is False
    assert document["smallestFit"] is not None
    assert any(w.startswith("does not fit") for w in document["warnings"])


def test_a_bad_stack_is_a_clear_error():
    result = run_cli("plan", "--stack", "nosuchstack")
    assert result.returncode == 2 and "nosuchstack" in result.stderr


@pytest.mark.parametrize("stack", stack_names())
def test_the_plan_shows_the_engine_ready_timeout_the_head_gets(stack):
    document = plan.build_plan(stack)
    env = bootstrap.vllm_env(read_stack(stack).spec, "10.0.0.1", ["10.0.0.1"])
    assert f"VLLM_ENGINE_READY_TIMEOUT_S={document['engineReadyTimeoutSeconds']}\n" in env
    assert f"{document['engineReadyTimeoutSeconds']} s" in plan.render(document)


def test_replicas_multiply_the_gpu_cost_and_the_resources_but_not_the_gang(tmp_path):
    """Two replicas of prod: twice the GPU nodes' cost, one gang's topology, and the
    plan says there are two gangs."""
    text = (ROOT / "stacks" / "Pulumi.prod.yaml").read_text()
    stack_file = tmp_path / "Pulumi.prod.yaml"
    stack_file.write_text(text.replace("config:\n", "config:\n  vllm-cluster:replicas: 2\n", 1))
    one, two = plan.build_plan("prod"), plan.build_plan("prod", stack_file=str(stack_file))
    assert two["cluster"]["replicas"] == 2 and one["cluster"]["replicas"] == 1
    assert two["cost"]["gpuNodes"] == pytest.approx(2 * one["cost"]["gpuNodes"])
    assert two["nodes"] == one["nodes"] and two["ranks"] == one["ranks"]
    assert two["resourceCount"] > one["resourceCount"]
    printed = plan.render(two)
    assert "2 replicas: 2 such gangs behind the gateway" in printed and "(4 x p4d.24xlarge)" in printed


def test_what_aws_would_refuse_is_a_problem_of_the_stack_before_anything_exists(tmp_path, monkeypatch, capsys):
    """30 admin CIDRs are 60 inbound rules of the gateway's group, plus its API rule and
    the two from the nodes (readiness, Prometheus): past EC2's 60. The spec refuses such
    lists (tests/test_aws_contract.py); with that check taken out, as for any rule the spec
    does not know, the plan names the group, the count, the quota and AWS's page, and
    `plan` exits 1."""
    import argparse

    from cli.__main__ import run_command
    from components.spec import exposure

    monkeypatch.setattr(exposure, "_check_gateway_rule_quota", lambda *args: None)
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    admins = "".join(f"    - 198.51.100.{i}/32\n" for i in range(30))
    stack_file = tmp_path / "Pulumi.dev.yaml"
    stack_file.write_text(text.replace("    - 198.51.100.7/32\n", admins))
    document = plan.build_plan("dev", stack_file=str(stack_file))
    [problem] = document["problems"]
    assert problem.startswith("vllm-gateway-sg (SecurityGroup) inbound IPv4 rules: 63 rules across the stack")
    assert aws_contract.VPC_QUOTAS_SOURCE in problem
    [error] = document["awsContract"]["errors"]
    assert error["rule"] == "rules-per-group" and error["resource"] == "vllm-gateway-sg"
    printed = plan.render(document)
    assert "PROBLEMS  AWS would refuse 1 input(s)" in printed and f"  - {problem}" in printed
    args = argparse.Namespace(
        command="plan", stack="dev", stack_file=str(stack_file), json=False, params_b=None, dtype=None, busy_hours=None
    )
    assert run_command(args) == 1
    assert f"  - {problem}" in capsys.readouterr().out


def test_a_stack_aws_accepts_plans_with_exit_0():
    assert run_cli("plan", "--stack", "dev").returncode == 0


def test_a_default_quota_the_stack_alone_exceeds_is_a_warning(monkeypatch):
    """dev holds 2 Elastic IPs (gateway, NAT); against a quota of 1 the plan warns,
    naming the quota and its source, and the stack has no problem for it."""
    monkeypatch.setattr(aws_contract, "EIPS_PER_REGION", 1)
    document = plan.build_plan("dev")
    assert document["problems"] == [] and document["awsContract"]["ok"] is True
    [warning] = [w for w in document["warnings"] if "Elastic IPs" in w]
    assert "2 Elastic IPs (vllm-gateway-ip, vllm-nat-ip)" in warning
    assert "default quota is 1 per region" in warning and aws_contract.EIP_SOURCE in warning
    assert f"  - {warning}" in plan.render(document)


def test_the_prod_plan_shows_what_each_node_pulls_copies_and_reads():
    """TP 8 x PP 2 of the 70B on two p4d.24xlarge: each node copies its stage, about half of
    the 141.2 GB, from the EFS cache to its NVMe at efs-utils 1.x's 500 MiB/s, and its engine
    reads it there; the plan says so per node, with the sources."""
    document = plan.build_plan("prod")
    model_bytes = document["modelBytes"]
    assert model_bytes["reason"] == (
        "p4d.24xlarge has 8 x 1000 GB NVMe at /opt/dlami/nvme; each node's stage is ~71 GB"
    )
    for node, role in zip(model_bytes["perNode"], ("head", "worker"), strict=True):
        assert node["role"] == role and node["fromCacheGB"] == 70.6
        assert node["copy"] == {
            "GB": 70.6,
            "from": "the EFS cache",
            "to": "/opt/dlami/nvme",
            "rateMiBps": 500,
            "seconds": 135,
            "source": model_bytes["efsRateSource"],
        }
        assert node["load"]["from"] == "local NVMe (/opt/dlami/nvme)" and node["load"]["seconds"] == 9
    assert "stunnel" in model_bytes["efsRateSource"] and "performance.html" in model_bytes["efsRateSource"]
    printed = plan.render(document)
    for line in (
        "Model bytes per node (estimates, components/sizing/model_bytes.py)",
        f"  EFS rate       500 MiB/s per client: {model_bytes['efsRateSource']}",
        f"  serves from    local NVMe: {model_bytes['reason']}",
        "    copy         70.6 GB from the EFS cache to /opt/dlami/nvme at 500 MiB/s: 135 s (the EFS rate above)",
    ):
        assert f"\n{line}\n" in printed, line
    assert "\n  node 0 head    stage 0, layers 0-39: ~70.6 GB (" in printed
    assert "\n  node 1 worker  stage 1, layers 40-79: ~70.6 GB (" in printed
    assert printed.count("pulls 70.6 GB from the EFS cache") == 2
    # prod sets --safetensors-load-strategy eager: the plan says how its 8 workers per node read.
    assert "\n  loader         --safetensors-load-strategy eager: whole files" in printed
    assert printed.count("    engine read  70.6 GB from local NVMe (/opt/dlami/nvme) at 7812 MiB/s: 9 s (AWS's") == 2


def test_without_nvme_every_prod_node_pulls_the_whole_model_and_the_plan_says_why(monkeypatch):
    from components import catalog

    no_store = dataclasses.replace(
        catalog.CATALOG["p4d.24xlarge"], instance_store_gb=0, instance_store_disks=0, instance_store_read_iops=0
    )
    monkeypatch.setitem(catalog.CATALOG, "p4d.24xlarge", no_store)
    document = plan.build_plan("prod")
    model_bytes = document["modelBytes"]
    assert model_bytes["servesFromLocalDisk"] is False
    assert model_bytes["reason"].startswith("p4d.24xlarge has no local NVMe: serving from the EFS cache")
    for node in model_bytes["perNode"]:
        assert node["copy"] is None and node["fromCacheGB"] == 141.2
        assert node["load"]["from"] == "the EFS cache" and node["load"]["seconds"] == 269
    printed = plan.render(document)
    assert "\n    copy         none: serves from the EFS cache\n" in printed
    assert printed.count("pulls 141.2 GB from the EFS cache") == 2


def test_the_plan_follows_the_efs_utils_the_nodes_build(monkeypatch):
    monkeypatch.setattr(versions, "EFS_UTILS_VERSION", "v2.1.0")
    model_bytes = plan.build_plan("prod")["modelBytes"]
    assert model_bytes["efsUtilsVersion"] == "v2.1.0" and model_bytes["efsClientMiBps"] == 1500
    assert [node["copy"]["seconds"] for node in model_bytes["perNode"]] == [45, 45]


@pytest.mark.parametrize("stack", stack_names())
def test_the_plan_serves_from_where_the_bootstrap_decides(stack):
    document = plan.build_plan(stack)
    local, reason = sizing.serves_from_local_disk(read_stack(stack).spec)
    assert (document["modelBytes"]["servesFromLocalDisk"], document["modelBytes"]["reason"]) == (local, reason)
    assert len(document["modelBytes"]["perNode"]) == len(document["nodes"])


# --- Prometheus on the gateway (issue 21) ----------------------------------------------------


def test_the_dev_plan_sizes_prometheus_on_its_default_gateway_and_warns_of_nothing():
    """dev: one gang of one g6.xlarge (one GPU) behind the default t3.small: the series are
    the sizing's, the memory fits, 15 days fit the retention limit, and no warning."""
    document = plan.build_plan("dev")
    p = document["prometheus"]
    assert p["series"] == prometheus_sizing.ingest(1, 1, 1).series
    assert p["seriesPerNode"]["head"] == prometheus_sizing.VLLM_HEAD_SERIES + p["seriesPerNode"]["ray"]
    assert p["memory"]["gatewayType"] == "t3.small" and p["memory"]["fits"] is True
    assert p["disk"]["daysAtLimit"] > p["disk"]["retentionDays"] == 15 and p["warnings"] == []
    printed = plan.render(document)
    assert "\nMetrics on the gateway (Prometheus; estimates, components/prometheus_sizing.py)\n" in printed
    assert "of t3.small's 2,048 MiB: fits within 80%\n" in printed
    assert "so the 15-day time limit applies\n" in printed
    assert document["warnings"] == []


def _stack_file(tmp_path, stack: str, *lines: str) -> str:
    text = (ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()
    stack_file = tmp_path / f"Pulumi.{stack}.yaml"
    stack_file.write_text(text.replace("config:\n", "config:\n" + "".join(f"  {line}\n" for line in lines), 1))
    return str(stack_file)


def test_the_plan_counts_every_gang_and_node_of_the_stack(tmp_path):
    """prod with 3 replicas: 3 gangs of 2 p4d nodes (8 GPUs each) behind the gateway."""
    stack_file = _stack_file(tmp_path, "prod", "vllm-cluster:replicas: 3")
    p = plan.build_plan("prod", stack_file=stack_file)["prometheus"]
    assert (p["gangs"], p["nodesPerGang"], p["targets"]) == (3, 2, 3 + 6 + 1)
    assert p["series"] == prometheus_sizing.ingest(3, 2, 8).series


def test_a_gateway_too_small_for_prometheus_is_a_warning_of_the_plan(tmp_path, monkeypatch):
    """The plan carries the sizing's memory warning and says DOES NOT FIT; here with the
    gateway's own share raised so that prod's one gang outgrows a t3.micro."""
    monkeypatch.setattr(prometheus_sizing, "GATEWAY_BASE_MIB", 1000)
    stack_file = _stack_file(tmp_path, "prod", "vllm-cluster:gatewayInstanceType: t3.micro")
    document = plan.build_plan("prod", stack_file=stack_file)
    [warning] = [w for w in document["warnings"] if w.startswith("gatewayInstanceType t3.micro (1,024 MiB)")]
    assert "use t3.small or t4g.small" in warning
    printed = plan.render(document)
    assert "of t3.micro's 1,024 MiB: DOES NOT FIT within 80%\n" in printed and f"  - {warning}\n" in printed


def test_an_unknown_gateway_type_is_named_not_guessed(tmp_path):
    stack_file = _stack_file(tmp_path, "dev", "vllm-cluster:gatewayInstanceType: m7i.large")
    document = plan.build_plan("dev", stack_file=stack_file)
    assert document["prometheus"]["memory"]["fits"] is None
    assert any(
        w.startswith("gatewayInstanceType m7i.large: its memory is not in the planner's table")
        for w in document["warnings"]
    )
    assert "of m7i.large's memory, which the planner does not know: not checked\n" in plan.render(document)


@pytest.mark.parametrize("stack", ["dev", "prod", "h100"])
def test_the_plan_states_the_streams_the_gateway_holds_and_its_nginx_limits(stack):
    """Issue 48: the gateway's capacity from the stack (components/gateway_capacity.py), in
    the text and the JSON, as configure and the site get it."""
    document = plan.build_plan(stack)
    g = document["gateway"]
    the_stack = read_stack(stack, None)
    sized = gateway_capacity.spec_capacity(the_stack.spec)
    assert (g["streams"], g["workerConnections"], g["workerRlimitNofile"], g["upstreamKeepalive"]) == (
        sized.streams,
        sized.worker_connections,
        sized.open_files,
        sized.upstream_keepalive,
    )
    printed = plan.render(document)
    assert f"the gateway holds {sized.streams:,} streams" in printed
    assert f"worker_connections {sized.worker_connections:,}, worker_rlimit_nofile {sized.open_files:,}" in printed


def _h100_with_gateway(tmp_path, gateway_type: str) -> str:
    """stacks/Pulumi.h100.yaml with another gatewayInstanceType (it sets c7i.large)."""
    text = (ROOT / "stacks" / "Pulumi.h100.yaml").read_text()
    assert "vllm-cluster:gatewayInstanceType: c7i.large\n" in text
    stack_file = tmp_path / "Pulumi.h100.yaml"
    stack_file.write_text(text.replace("gatewayInstanceType: c7i.large", f"gatewayInstanceType: {gateway_type}"))
    return str(stack_file)


def test_a_gateway_type_too_slow_for_the_stacks_batch_is_a_warning_with_the_fix(tmp_path):
    """h100: one gang of max_num_seqs 1,024 streams ~30,000 events a second; a t3.small
    sustains 0.4 vCPU of its 2 (20 % baseline). The shipped h100 stack therefore runs its
    gateway on a c7i.large, which the plan finds big enough."""
    document = plan.build_plan("h100", stack_file=_h100_with_gateway(tmp_path, "t3.small"))
    [warning] = [w for w in document["warnings"] if w.startswith("gatewayInstanceType t3.small sustains")]
    assert "Fix:" in warning and "pulumi config set vllm-cluster:gatewayInstanceType" in warning
    assert "TOO SMALL" in plan.render(document)
    for stack in ("dev", "prod", "h100"):
        assert not [w for w in plan.build_plan(stack)["warnings"] if "sustains" in w], stack
    assert "a c7i.large sustains: fits" in plan.render(plan.build_plan("h100"))


def test_the_gateway_load_of_an_unknown_type_is_not_checked(tmp_path):
    document = plan.build_plan("h100", stack_file=_h100_with_gateway(tmp_path, "m7g.medium"))
    assert document["gateway"]["load"]["vcpusSustained"] is None
    assert not [w for w in document["warnings"] if "sustains" in w]
    assert "not checked: m7g.medium is not a type the planner knows" in plan.render(document)
