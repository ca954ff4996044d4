"""vllm_cluster_lib: helpers shared by the Python host scripts of vllm-cluster.

Installed at /opt/vllm-cluster/lib/vllm_cluster_lib.py by the nodes' setup command,
beside vllm-cluster-lib.sh (the shell scripts' library). ray-cluster-check and
vllm-watchdog-check import it from ../lib relative to their own file, so the same
import works on a node (/opt/vllm-cluster/bin) and in the repository (scripts/node).
Standard library only: the scripts run with the node's virtualenv Python.
"""

from __future__ import annotations


def metric_totals(text: str) -> dict[str, float]:
    """Prometheus text format (vLLM's /metrics) -> metric name: value summed over its
    label sets (one per engine, model, ...). Comments and lines that are not samples
    are skipped."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line[:1] in ("", "#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue  # not a sample line of the text format
    return totals
