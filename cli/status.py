"""`vllm-cluster status --stack NAME`: gang health, not process health. Ray's live
nodes and GPUs against what the stack expects, vLLM's unit and /health, a real
small completion through the endpoint with its latency, and vLLM's metrics.

Exit 0 healthy; 1 degraded (vLLM is up but a node or GPU is missing, or completions
fail: what is wrong is named); 2 down (vLLM is not serving); 3 unknown (the tool
could not look: no outputs, no answer from the head, and no completion either).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone

from cli.cluster import Cluster, stack_outputs
from cli.stack_file import read_stack
from components import bootstrap

HEALTHY, DEGRADED, DOWN, UNKNOWN = 0, 1, 2, 3
VERDICTS = {HEALTHY: "healthy", DEGRADED: "degraded", DOWN: "down", UNKNOWN: "unknown"}


def snapshot(cluster: Cluster, spec) -> dict:
    head = cluster.nodes[0]
    result = cluster.ssh(head, f"sudo {bootstrap.NODE_COMMAND} status-facts")
    facts = json.loads(result.stdout) if result.returncode == 0 and result.stdout.strip() else None
    status, seconds, error = cluster.completion(bootstrap.served_model_name(spec))
    return {
        "facts": facts,
        "factsError": None if facts else (result.stderr.strip() or "no answer from the head"),
        "completion": {"status": status, "seconds": round(seconds, 3), "error": error},
    }


def assess(cluster: Cluster, spec, snap: dict) -> dict:
    facts = snap["facts"]
    seen = facts is not None and "ray_error" not in facts  # did we see Ray's membership at all?
    alive = (facts or {}).get("alive", {})
    gpus_expected = spec.nodes * spec.gpus_per_node
    nodes = [
        {"node": n.name, "ip": n.ip, "alive": (n.ip in alive) if seen else None, "gpus": alive.get(n.ip)}
        for n in cluster.nodes
    ]
    gpus = sum(alive.get(n.ip, 0) for n in cluster.nodes)
    completion = snap["completion"]
    problems = []
    if facts is None:
        problems.append(f"the head did not answer: {snap['factsError']}")
    elif not seen:
        problems.append(f"Ray's GCS did not answer on the head: {facts['ray_error']}")
    else:
        problems += [f"{n['node']} ({n['ip']}) is not in the Ray cluster" for n in nodes if not n["alive"]]
        if gpus < gpus_expected:
            problems.append(f"Ray has {gpus:g} of {gpus_expected} GPUs")
    if completion["status"] != 200:
        problems.append(
            f"a completion through the endpoint got HTTP {completion['status'] or 'nothing'}"
            + (f" ({completion['error']})" if completion["error"] else "")
        )
    if facts is None and completion["status"] != 200:
        verdict = UNKNOWN  # nothing answered: we cannot tell down from unreachable
    elif facts is not None and facts.get("health") != 200 and completion["status"] != 200:
        verdict = DOWN
        problems.insert(
            0,
            f"vLLM is not serving (unit {facts.get('vllm_unit', 'unknown')}, "
            f"/health {facts.get('health') or 'no answer'})",
        )
    else:
        verdict = DEGRADED if problems else HEALTHY
    return {
        "verdict": VERDICTS[verdict],
        "exitCode": verdict,
        "problems": problems,
        "nodes": nodes,
        "ray": {
            "nodes": sum(bool(n["alive"]) for n in nodes),
            "expectedNodes": spec.nodes,
            "gpus": gpus,
            "expectedGpus": gpus_expected,
        },
        "vllm": {"unit": (facts or {}).get("vllm_unit"), "health": (facts or {}).get("health")},
        "completion": completion,
        "metrics": (facts or {}).get("metrics"),
    }


def render(stack: str, report: dict, endpoint: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [f"vllm-cluster status: stack {stack}   {stamp}", "", f"  {'node':10s}{'ip':17s}{'ray':9s}GPUs"]
    for node in report["nodes"]:
        gpus = f"{node['gpus']:g}" if node["gpus"] is not None else "-"
        state = {True: "alive", False: "MISSING", None: "unknown"}[node["alive"]]
        lines.append(f"  {node['node']:10s}{node['ip']:17s}{state:9s}{gpus}")
    ray, vllm, completion, metrics = report["ray"], report["vllm"], report["completion"], report["metrics"]
    lines += [
        "",
        f"  ray         {ray['nodes']}/{ray['expectedNodes']} nodes, {ray['gpus']:g}/{ray['expectedGpus']} GPUs",
        f"  vllm        unit {vllm['unit'] or 'unknown'}, /health {vllm['health'] if vllm['health'] else 'no answer'}",
        f"  completion  HTTP {completion['status'] or 'none'} in {completion['seconds']:.2f} s through {endpoint}",
    ]
    if metrics:
        lines.append(
            f"  metrics     running {metrics['running']:g}, waiting {metrics['waiting']:g}, "
            f"KV cache {metrics['kv_cache_usage'] * 100:.1f}%, {metrics['tokens_per_second']:.1f} tokens/s"
        )
    lines += ["", f"  verdict     {report['verdict'].upper()}"]
    lines += [f"    - {problem}" for problem in report["problems"]]
    return "\n".join(lines)


def main(args) -> int:
    """The verdict as the exit code. A stack file or outputs that cannot be read raise
    (StackFileError, OutputsError): cli/__main__.py reports them, exiting UNKNOWN."""
    spec = read_stack(args.stack, args.stack_file).spec
    cluster = Cluster(stack_outputs(args.stack, args.outputs))
    report = None
    try:
        while True:
            report = assess(cluster, spec, snapshot(cluster, spec))
            if args.watch and args.json:
                print(json.dumps(report), flush=True)  # one document a line, for scripts
            elif args.watch:
                # Home and clear: the new report replaces the old one instead of piling up.
                sys.stdout.write("\x1b[H\x1b[2J" + render(args.stack, report, cluster.outputs["endpoint"]) + "\n")
                sys.stdout.flush()
            else:
                print(
                    json.dumps(report, indent=2)
                    if args.json
                    else render(args.stack, report, cluster.outputs["endpoint"])
                )
                return report["exitCode"]
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return report["exitCode"] if report else UNKNOWN
    finally:
        cluster.close()
