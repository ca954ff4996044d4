"""Issue 33, point 3: the model tree and its warm-up cache are written only by the
nodes that may write them, gang 0's (topology.writes_model_tree), which download the
model and compile first. Another gang's node neither stages the model nor publishes
what vLLM compiled on it: what one node publishes, the next node (a replaced one,
another gang) seeds and runs as its own code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from node_scratch import install_node_script
from pulumi_mocks import run_stack

from components.topology import node_name, writes_model_tree

COMMAND = "command:remote:Command"


def test_only_gang_0_writes_the_model_tree():
    assert writes_model_tree(0)
    assert not any(writes_model_tree(gang) for gang in range(1, 8))


def test_only_gang_0s_nodes_publish_the_warmup_cache():
    run = run_stack("prod", {"replicas": 3})
    assert run.error is None, run.error
    nodes = [r.name.removeprefix("vllm-setup-") for r in run.of_type(COMMAND) if r.name.startswith("vllm-setup-")]
    warmups = {r.name.removeprefix("vllm-warmup-") for r in run.of_type(COMMAND) if r.name.startswith("vllm-warmup-")}
    assert {node for node in nodes if node.startswith("gang")} and nodes
    assert warmups == {node for node in nodes if not node.startswith("gang")}


class NodeScript:
    """vllm-cluster-node under a scratch root (tests/node_scratch.py): its node.env names
    the node. The model cache is not mounted here."""

    def __init__(self, tmp_path: Path, name: str):
        self.script = install_node_script(tmp_path / "root", f"NODE_NAME={name}\nNODE_ROLE=worker\n")
        self.env = {"PATH": f"{tmp_path / 'root'}/bin:/usr/bin:/bin", "HOME": str(tmp_path)}

    def run(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(self.script), *args], input=stdin, capture_output=True, text=True, env=self.env, timeout=60
        )


NAMES = [(node_name(index, gang), gang) for gang in range(3) for index in range(3)]


@pytest.mark.parametrize(("name", "gang"), NAMES)
def test_stage_model_runs_only_where_the_model_tree_may_be_written(tmp_path, name, gang):
    staged = NodeScript(tmp_path, name).run("stage-model", "--model", "org/m", "--revision", "r")
    assert staged.returncode == 1
    refusal = f"stage-model: {name} is not in gang 0, whose nodes alone write the model tree"
    if writes_model_tree(gang):
        # It goes on to write, and stops only because no cache is mounted here.
        assert refusal not in staged.stderr and "the model cache is not mounted" in staged.stderr
    else:
        assert refusal in staged.stderr and "Fix: run stage-model on gang 0's nodes" in staged.stderr


@pytest.mark.parametrize(("name", "gang"), NAMES)
def test_keep_warmup_publishes_only_where_the_warmup_cache_may_be_written(tmp_path, name, gang):
    kept = NodeScript(tmp_path, name).run("keep-warmup", "--warmup-key", "k")
    if writes_model_tree(gang):
        assert kept.returncode == 1 and "the model cache is not mounted" in kept.stderr
    else:
        assert kept.returncode == 0, kept.stderr
        assert f"keep-warmup: skipped: {name} is not in gang 0" in kept.stderr
        assert "publishes nothing" in kept.stderr


def test_the_gang_heads_preflight_takes_every_nodes_facts_on_its_input_and_names_a_missing_one(tmp_path):
    """The facts no longer travel over the shared cache, which another gang's node
    cannot write: each node's preflight-facts output is its line of the head's input."""
    head = NodeScript(tmp_path, "gang1-head")
    args = ("preflight", "--nodes", "gang1-head,gang1-worker-1", "--gpus", "8", "--gpu-memory-gib", "80")
    missing = head.run(*args, stdin='gang1-head {"gpus": 8}\n')
    assert missing.returncode == 1
    assert "preflight: no facts from gang1-worker-1 (its preflight-facts command did not run)" in missing.stderr
    # The node's Python, standing in for preflight-check: it shows what it was given.
    python = head.script.parent.parent / "venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text('#!/bin/sh\nshift 2\nfor f in "$@"; do case "$f" in /*) cat "$f";; esac; done\n')
    python.chmod(0o755)
    both = head.run(*args, stdin='gang1-head {"gpus": 8}\ngang1-worker-1 {"gpus": 8}\n')
    assert both.returncode == 0, both.stderr
    assert both.stdout == '{"gpus": 8}\n{"gpus": 8}\n'


def test_the_preflight_command_is_fed_every_nodes_facts_command_output():
    run = run_stack("prod", {"replicas": 2})
    assert run.error is None, run.error
    for prefix in ("", "gang1-"):
        (preflight,) = [r for r in run.of_type(COMMAND) if r.name == f"vllm-{prefix}preflight"]
        assert "stdin" in preflight.inputs, "the head's preflight reads the facts from its input"
        lines = preflight.inputs["stdin"].splitlines()
        assert [line.split(" ")[0] for line in lines] == [f"{prefix}head", f"{prefix}worker-1"]


@pytest.mark.parametrize(("name", "gang"), NAMES)
def test_the_local_fleet_binds_the_model_tree_read_only_where_it_may_not_be_written(name, gang):
    """The fleet imitates the roles with its binds (tests/test_fleet_replicas.py shows a
    gang 1 node refused): it reads the node's name from the user data it boots with."""
    from localhosts.fleet import Fleet, Host

    fleet = Fleet.__new__(Fleet)
    fleet.model_cache_dir, fleet.shared, fleet.wheelhouse = None, Path("/s"), Path("/w")
    fleet.user_data = {"node1": f"NODE_NAME={name}\nWHEELHOUSE_WRITER=false\n"}
    host = Host.__new__(Host)
    host.name = "node1"
    binds = fleet._model_cache_binds(host)
    expected = "--bind=/s:/mnt/vllm-models" if writes_model_tree(gang) else "--bind-ro=/s:/mnt/vllm-models"
    assert expected in binds and "--bind-ro=/w:/mnt/vllm-wheelhouse" in binds


# --- the facts the gang head compares come from the nodes (issue 33, point 3) -------------

PREFLIGHT = ("preflight", "--nodes", "head,worker-1", "--gpus", "8", "--gpu-memory-gib", "80")


@pytest.mark.parametrize(
    "worker_output",
    [
        # A second line naming a file outside the facts' directory: root would write there.
        '{{}}\n../../../../tmp/{planted} {{"owned": true}}',
        # A second line for the head: its facts would be the worker's.
        '{{"node": "worker-1"}}\nhead {{"forged": true}}',
        # A line for a node that is not in the gang.
        "{{}}\ngang7-head {{}}",
    ],
)
def test_a_nodes_output_cannot_write_or_forge_another_nodes_facts_on_the_head(tmp_path, worker_output):
    """Each node's facts reach its gang head's preflight (root) as a line of its stdin: the
    stack writes the node's name, the node's output follows. A compromised worker that
    prints more lines gets the preflight refused, and nothing written outside its own
    temporary directory."""
    planted = f"vllm-issue-33-{tmp_path.name}"
    stdin = f'head {{"node": "head"}}\nworker-1 {worker_output.format(planted=planted)}\n'
    head = NodeScript(tmp_path, "head")
    refused = head.run(*PREFLIGHT, stdin=stdin)
    assert refused.returncode == 1, refused.stderr
    assert "preflight: the facts on stdin" in refused.stderr, refused.stderr
    assert not list(Path("/tmp").glob(f"{planted}*"))
