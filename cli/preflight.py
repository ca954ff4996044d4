"""`vllm-cluster preflight --stack NAME`: the checks the bootstrap runs before vLLM
starts, on demand. Each node's facts are collected over SSH by the node's own
preflight-check, and compared here by the same file (scripts/node/preflight-check)."""

from __future__ import annotations

import functools
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

from cli.cluster import Cluster, stack_outputs
from cli.stack_file import read_stack
from components import bootstrap
from components.topology import efa_interface_count

ROOT = Path(__file__).resolve().parent.parent
NODE_CHECKS = ROOT / "scripts" / "node" / "preflight-check"


@functools.cache
def node_checks():
    """scripts/node/preflight-check, the file the nodes run, as a module: the operator's
    comparison is the bootstrap's own. Executed on first use rather than when this
    module is imported, so importing cli.preflight runs no script."""
    loader = SourceFileLoader("preflight_check", str(NODE_CHECKS))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def _facts(result) -> dict | None:
    """A node's facts from its answer, or None when it gave none."""
    if result.returncode != 0:
        return None
    try:
        return json.loads(result.stdout)
    except json.JSONDecodeError:
        return None


def main(args) -> int:
    """Exit 0 when every node passes every check, 1 naming each failure. A stack file or
    outputs that cannot be read raise (StackFileError, OutputsError): cli/__main__.py
    reports them as a tool error."""
    spec = read_stack(args.stack, args.stack_file).spec
    cluster = Cluster(stack_outputs(args.stack, args.outputs))
    try:
        model_dir = bootstrap.model_directory(spec.model, spec.model_revision)
        command = (
            f"sudo {bootstrap.INSTALL_DIR}/venv/bin/python {bootstrap.BIN_DIR}/preflight-check "
            f"collect --model-dir {model_dir}"
        )
        with ThreadPoolExecutor(len(cluster.nodes)) as pool:
            results = list(pool.map(lambda node: (node, cluster.ssh(node, command)), cluster.nodes))
    finally:
        cluster.close()
    facts, unreachable = [], []
    for node, result in results:
        node_facts = _facts(result)
        if node_facts is None:
            unreachable.append(f"{node.name} ({node.ip}): {result.stderr.strip() or 'no facts in its answer'}")
        else:
            facts.append(node_facts)
    efa = efa_interface_count(spec.instance, spec.efa)
    pinned = {"ray": spec.ray_version, "vllm": spec.vllm_version}
    checks = node_checks()
    rows = checks.compare(facts, spec.gpus_per_node, spec.instance.gpu_memory_gib, efa, pinned) if facts else []
    problems = [f"{u}. Fix: check the node is running and reachable through the gateway" for u in unreachable]
    problems += checks.failures(rows)
    if args.json:
        print(
            json.dumps(
                {
                    "ok": not problems,
                    "problems": problems,
                    "facts": facts,
                    "checks": [
                        {"check": r["check"], "nodes": {n: {"ok": ok, "value": v} for n, (ok, v) in r["cells"].items()}}
                        for r in rows
                    ],
                },
                indent=2,
            )
        )
    else:
        if rows:
            print(checks.render(rows))
        for problem in problems:
            print(f"FAILED {problem}", file=sys.stderr)
        print("preflight: " + ("every node passed every check" if not problems else f"{len(problems)} problem(s)"))
    return 1 if problems else 0
