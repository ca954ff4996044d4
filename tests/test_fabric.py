"""The fabric gate (issue 35 point 4): the floor a gang's all-reduce must reach before
vLLM starts, the measurement (scripts/node/fabric-check measure, a real all-reduce
between processes that meet at a rendezvous as the gang's nodes do) and the judge that
fails `pulumi up` naming the figure, the floor and the likely causes. The program's
side (the commands and their order) is tests/test_services.py's; the hosts' side
tests/test_fleet.py's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import pytest

from components import fabric, node_env
from components.catalog import CATALOG
from components.spec import host_instance_type

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "node" / "fabric-check"

P4D = CATALOG["p4d.24xlarge"]
# A stack of hosts without a catalog type (gpusPerNode, gpuMemoryGiB), as components/spec/ makes it.
HOST_TYPE = host_instance_type(1, 24)


# --- the floor --------------------------------------------------------------------------


def test_the_floor_is_a_quarter_of_the_instance_types_published_network_bandwidth():
    floor = fabric.floor(P4D, gloo=False)
    # p4d: 400 Gbps = 50 GB/s; a quarter of it.
    assert floor.gbps == 12.5
    assert "p4d.24xlarge" in floor.why and "400 Gbps" in floor.why
    assert fabric.floor(CATALOG["p5.48xlarge"], gloo=False).gbps == 100.0


def test_gloo_and_hosts_without_a_type_are_held_to_a_quarter_of_gigabit_ethernet():
    assert fabric.floor(P4D, gloo=True).gbps == fabric.floor(HOST_TYPE, gloo=False).gbps == 0.03125
    assert "Gloo" in fabric.floor(P4D, gloo=True).why


def test_the_stacks_floor_replaces_the_types():
    floor = fabric.floor(P4D, gloo=False, configured_gbps=40.0)
    assert floor.gbps == 40.0 and "fabricFloorGBps" in floor.why


def test_the_collectives_follow_the_locks_torch():
    """The local hosts' lock holds a CPU build of torch (no NCCL): they run Gloo; the GPU
    nodes' lock a CUDA build: NCCL, one rank per GPU."""

    def packages(target) -> dict[str, str]:
        lock = node_env.read_lock(target.lock_path.read_text())
        return {name: package.version for name, package in lock.packages.items()}

    assert fabric.cpu_torch(packages(node_env.local_host()))
    assert not fabric.cpu_torch(packages(node_env.gpu_node()))
    assert fabric.measurement(P4D, gloo=False).ranks_per_node == 8
    assert fabric.measurement(P4D, gloo=False).backend == "nccl"
    assert fabric.measurement(P4D, gloo=True) == fabric.Measurement("gloo", 1, fabric.GLOO_BYTES, 5, 2)


def test_only_gangs_of_several_nodes_are_gated_and_planned():
    assert not fabric.gated(1) and fabric.check_seconds(P4D, 1) == 0.0
    assert fabric.gated(2) and fabric.check_seconds(P4D, 2) > fabric.SETUP_SECONDS


# --- the judge --------------------------------------------------------------------------


def measured(**changes) -> str:
    figures = {
        "backend": "nccl",
        "nodes": 2,
        "ranks": 16,
        "bytes": fabric.NCCL_BYTES,
        "iterations": 20,
        "seconds": 0.01,
        "algbw_gbps": 21.4,
        "busbw_gbps": 40.1,
        "correct": True,
        "network": "AWS Libfabric",
    }
    return json.dumps({**figures, **changes}) + "\n"


def judge(stdin: str, floor: float = 12.5, efa: bool = True) -> subprocess.CompletedProcess:
    # The image's python3 runs it on the head: standard library only.
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), "judge", "--floor-gbps", str(floor), "--floor-why", "p4d.24xlarge: test"]
        + (["--efa"] if efa else []),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_fabric_at_or_above_its_floor_passes_naming_the_figure_and_the_floor():
    done = judge(measured())
    assert done.returncode == 0, done.stderr
    assert "40.1 GB/s" in done.stdout and "12.5 GB/s" in done.stdout and "AWS Libfabric" in done.stdout


def test_a_fabric_below_its_floor_fails_naming_the_figure_the_floor_and_the_likely_causes():
    done = judge(measured(busbw_gbps=3.2))
    assert done.returncode == 1
    message = done.stderr
    assert "3.2 GB/s is below the floor of 12.5 GB/s (p4d.24xlarge: test)" in message
    causes = ("EFA plugin not loaded", "wrong NIC", "NCCL_SOCKET_IFNAME", "not self-referencing", "placement group")
    for cause in causes:
        assert cause in message, cause
    assert "vllm-cluster:fabricFloorGBps" in message


def test_with_efa_nccl_on_tcp_sockets_fails_even_when_fast_enough():
    """The plugin file's presence (preflight) is not NCCL's use of it: NCCL's own word on
    its network is."""
    done = judge(measured(network="Socket"))
    assert done.returncode == 1
    assert "NCCL used the network 'Socket', not aws-ofi-nccl's" in done.stderr
    assert judge(measured(network="Socket"), efa=False).returncode == 0


def test_an_all_reduce_with_wrong_sums_fails_whatever_its_speed():
    done = judge(measured(correct=False))
    assert done.returncode == 1 and "wrong sums" in done.stderr


@pytest.mark.parametrize(
    "stdin",
    [
        "",
        "not json\n",
        measured() + measured(),  # more than the head's one line
        json.dumps({"backend": "nccl"}) + "\n",
        measured(busbw_gbps="NaN"),
        measured(busbw_gbps=-1),
    ],
)
def test_anything_but_the_heads_one_line_of_figures_is_refused(stdin):
    done = judge(stdin)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""


# --- the measurement ----------------------------------------------------------------------


def torch_python() -> str:
    """A Python with the locked environment's torch: the local hosts' (their lock, built
    for the fleets), as a node runs fabric-check with its own."""
    from localhosts.fleet import fleet_venv_dir

    python = fleet_venv_dir() / "bin" / "python"
    if not (fleet_venv_dir() / ".complete").exists():
        pytest.skip(f"no local hosts' environment at {fleet_venv_dir()} (the fleets build it)")
    return str(python)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(python: str, port: int, node_rank: int, nodes: int = 2, timeout: int = 120) -> subprocess.Popen:
    return subprocess.Popen(
        [python, str(SCRIPT), "measure", "--backend", "gloo", "--head-ip", "127.0.0.1", "--port", str(port)]
        + ["--nodes", str(nodes), "--node-rank", str(node_rank), "--ranks-per-node", "1", "--bytes", str(2**22)]
        + ["--iterations", "3", "--warmup", "1", "--timeout", str(timeout)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_nodes_all_reduce_and_the_head_prints_a_bus_bandwidth_that_its_judge_reads():
    python, port = torch_python(), free_port()
    worker = measure(python, port, 1)
    head = measure(python, port, 0)
    head_out, head_err = head.communicate(timeout=300)
    worker_out, worker_err = worker.communicate(timeout=300)
    assert head.returncode == 0 and worker.returncode == 0, (head_err, worker_err)
    figures = json.loads(head_out)
    assert figures["backend"] == "gloo" and figures["ranks"] == 2 and figures["correct"] is True
    assert figures["busbw_gbps"] > 0 and figures["busbw_gbps"] == figures["algbw_gbps"]  # 2 (n - 1) / n = 1
    assert json.loads(worker_out) == {"node_rank": 1, "ranks": 1, "completed": True}
    assert judge(head_out, floor=0.001, efa=False).returncode == 0
    too_high = judge(head_out, floor=10_000, efa=False)
    assert too_high.returncode == 1 and f"{figures['busbw_gbps']:.3g} GB/s is below" in too_high.stderr


def test_a_gang_whose_other_node_never_comes_fails_within_the_rendezvous_timeout():
    python = torch_python()
    head = measure(python, free_port(), 0, timeout=5)
    out, err = head.communicate(timeout=120)
    assert head.returncode == 1 and out == ""
    assert "the all-reduce over 2 nodes did not complete" in err


def test_bus_bandwidth_is_nccl_tests_definition():
    loader = SourceFileLoader("fabric_check", str(SCRIPT))
    module = module_from_spec(spec_from_loader("fabric_check", loader))
    loader.exec_module(module)
    # 1 GB in 0.1 s over 16 ranks: algbw 10 GB/s, busbw 10 x 2 x 15 / 16.
    assert module.bus_bandwidth_gbps(10**9, 0.1, 16) == pytest.approx((10.0, 18.75))
