"""The model's bytes on the way to the first token, on the local fleet with the real
vLLM engine (its CPU build): what each node reads from the shared model cache, and the
engine's start cold and with the kept warm-up (issue 20).

    make bench-model    (or: venv/bin/python bench/bench_model.py [--configs 2 3])

Per configuration (PP = nodes, TP 1; localhosts/cluster.py brings it up with the
program's real user data and commands) and per node:
- before: what the node read from the cache when vLLM served from it. vLLM's own loader
  (bench/loader_reads.py, run on the node) picks its weight files in the cache's folder;
  every worker reads every one of them whatever its stage (scripts/lib/model_stage.py).
- after: what the node reads from the cache now: its prepare command's copy of its
  stage (model-stage's summary: the stage's weight files, config, tokenizer, index);
  vLLM's loader then reads the local folder, measured the same way.
Then, on the first configuration, the engine restarted twice on nodes as a replaced
node finds them (its own compile cache and /tmp empty): cold, with nothing kept on the
share either; warm, seeded from the share (prepare-serve) after keep-warmup kept the
cold start's compile there. Each figure is the engine's start from its log (process
start to "Application startup complete") and vLLM's own "init engine ... took".

Needs what the fleet needs (root, systemd-nspawn, debootstrap); one fleet at a time
(the fleet's bridge), so not while the fleet tests run. Ends with the line
`model: pp2 per node A MB of B MB, pp3 per node C MB of B MB, warm start D s vs cold E s`
(A and C: the most weight bytes any node reads from the cache, B: what each read before).
"""

import argparse
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.bootstrap import NODE_COMMAND, model_directory  # noqa: E402
from components.topology import node_name  # noqa: E402
from localhosts.cluster import ENGINE_CACHE, MODEL, serving_cluster  # noqa: E402
from localhosts.fleet import why_no_fleet  # noqa: E402

NODE_PYTHON = "/opt/vllm-cluster/venv/bin/python"


def loader_reads(cluster, index: int, folder: str) -> dict:
    script = (ROOT / "bench" / "loader_reads.py").read_text()
    command = f"sudo {NODE_PYTHON} - {shlex.quote(folder)} <<'LOADER_READS'\n{script}\nLOADER_READS"
    return json.loads(cluster.node_shell(index, command).stdout.strip().splitlines()[-1])


def model_bytes(cluster, nodes: int) -> list[dict]:
    """Per node: before (the loader's read of the cache's folder), after (the node's copy
    from the cache, and the loader's read of its local folder)."""
    cache = model_directory(MODEL, "main")
    args = cluster.node_shell(0, "sudo cat /etc/vllm-cluster/vllm.env").stdout
    local = re.search(r'SERVE_ARGS="(\S+) ', args).group(1)
    rows = []
    for index in range(nodes):
        copy = json.loads(cluster.outcomes[f"vllm-prepare-{node_name(index)}"].stdout.strip().splitlines()[-1])
        rows.append(
            {
                "node": node_name(index),
                "before": loader_reads(cluster, index, cache),
                "copied": copy,
                "engine_reads": loader_reads(cluster, index, local),
                "serves_from": local,
            }
        )
    return rows


def engine_start(cluster) -> tuple[float, float]:
    """Restart vLLM, wait until it serves; (its start from its log, its init engine)."""
    since = cluster.node_shell(0, "date +%s").stdout.strip()
    cluster.node_shell(0, "sudo systemctl restart vllm.service")
    cluster.wait_for_completion(timeout=900)
    return cluster.engine_start_seconds(), cluster.engine_inits(since)[-1]


def as_replaced_nodes(cluster, nodes: int) -> None:
    """Each node's own compile cache and Inductor's headers in /tmp gone, as on a new node."""
    for index in range(nodes):
        cluster.node_shell(index, f"sudo rm -rf {ENGINE_CACHE} /tmp/torchinductor_*")


def cold_and_warm(cluster, nodes: int) -> dict:
    key = cluster.warmup_key()
    as_replaced_nodes(cluster, nodes)
    cluster.node_shell(0, f"sudo rm -rf /mnt/vllm-models/warmup/{key}")
    cold = engine_start(cluster)
    kept = [
        cluster.node_shell(index, f"sudo {NODE_COMMAND} keep-warmup --warmup-key {key}").stderr.strip()
        for index in range(nodes)
    ]
    as_replaced_nodes(cluster, nodes)
    seeded = [
        cluster.node_shell(index, f"sudo {NODE_COMMAND} prepare-serve --saved").stderr.strip().splitlines()[-1]
        for index in range(nodes)
    ]
    warm = engine_start(cluster)
    return {"cold": cold, "warm": warm, "kept": kept, "seeded": seeded}


def mb(count: int) -> str:
    return f"{count / 1e6:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, nargs=2, default=[2, 3], metavar=("PP_A", "PP_B"))
    args = parser.parse_args()
    reason = why_no_fleet()
    if reason:
        print(f"cannot host the fleet: {reason}", file=sys.stderr)
        return 1
    most, whole, starts = {}, {}, None
    for nodes in args.configs:
        with tempfile.TemporaryDirectory(prefix="bench-model-") as workdir:
            with serving_cluster(Path(workdir), nodes=nodes) as cluster:
                cluster.wait_for_completion(timeout=120)
                rows = model_bytes(cluster, nodes)
                for row in rows:
                    copied = row["copied"]
                    print(
                        f"pp{nodes} {row['node']}: before {mb(row['before']['file_bytes'])} MB from the cache "
                        f"({len(row['before']['files'])} weight files, vLLM's loader on the cache's folder); "
                        f"after {mb(copied['bytes_copied'])} MB from the cache (its copy: stages {copied['stages']}, "
                        f"{len(copied['files'])} weight files of {mb(copied['stage_bytes'])} MB and the config and "
                        f"tokenizer, {copied['seconds']:.1f} s), then vLLM's loader reads "
                        f"{mb(row['engine_reads']['file_bytes'])} MB from {row['serves_from']}",
                        flush=True,
                    )
                # Weight bytes against weight bytes (config and tokenizer are the same few MB on any layout).
                most[nodes] = max(row["copied"]["stage_bytes"] for row in rows)
                whole[nodes] = max(row["before"]["file_bytes"] for row in rows)
                if starts is None:
                    starts = cold_and_warm(cluster, nodes)
                    (cold, cold_init), (warm, warm_init) = starts["cold"], starts["warm"]
                    print(f"pp{nodes} kept: " + " | ".join(starts["kept"]), flush=True)
                    print(f"pp{nodes} seeded: " + " | ".join(starts["seeded"]), flush=True)
                    print(
                        f"pp{nodes} engine start: cold {cold:.1f} s (init engine {cold_init:.1f} s), with the kept "
                        f"warm-up {warm:.1f} s (init engine {warm_init:.1f} s)",
                        flush=True,
                    )
    first, second = args.configs
    (cold, _), (warm, _) = starts["cold"], starts["warm"]
    print(
        f"model: pp{first} per node {mb(most[first])} MB of {mb(whole[first])} MB, "
        f"pp{second} per node {mb(most[second])} MB of {mb(whole[second])} MB, "
        f"warm start {warm:.1f} s vs cold {cold:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
