"""The local target: the whole system serving on this machine, before any GPU is paid for.

    make local         boot the local hosts, bring the cluster up, print how to reach it
    make local LOCAL_REPLICAS=2 LOCAL_NODES=1
                       two gangs behind the gateway (replicas): the pool balancing over them
    make local-down    remove everything `make local` made

`make local` boots Debian hosts (localhosts/fleet.py: a gateway and GPU-node hosts,
systemd, sshd, in network namespaces on a bridge, with a shared directory) and runs
the real program (under Pulumi's mock engine, since there is no Pulumi CLI here) for
a stack of hosts pointing at them (config hosts, localhosts/cluster.py
own_hosts_config): the path a user with machines of their own takes, with no AWS at
all. It replays the stack's remote commands over SSH as `pulumi up` would: the real
bootstrap, Ray, nginx with TLS, and the real vLLM engine (its CPU build) serving a
tiny model across the nodes with pipeline parallelism. Its API key, Ray tokens and
metrics login are drawn as a real stack's are, and the SSH key is made for it. What
stands in for the GPU is listed in localhosts/fleet.py.

It prints the endpoint, the API key, the Ray dashboard and how to call them from
this machine, and writes the stack's outputs, as
`pulumi stack output --json --show-secrets` would print them, to a file whose path
is the last line printed. Needs root, systemd-nspawn and debootstrap.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.spec import SpecError, load_spec  # noqa: E402
from localhosts.cluster import FakeHub, fleet_config, start_cluster, stop_cluster  # noqa: E402
from localhosts.fleet import Fleet, adopt, process_state, why_no_fleet  # noqa: E402

STATE_DIR = Path(os.environ.get("VLLM_CLUSTER_LOCAL_DIR", "/var/lib/vllm-cluster-local"))
NEEDS = (
    "Needs root, systemd-nspawn (apt-get install systemd-container), debootstrap and iproute2; "
    "`sudo make local` on Debian or Ubuntu after `apt-get install systemd-container debootstrap`."
)


def state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def outputs_file(state_dir: Path) -> Path:
    return state_dir / "outputs.json"


def certificate_file(state_dir: Path) -> Path:
    return state_dir / "tls-certificate.pem"


def up(nodes: int, state_dir: Path = STATE_DIR, replicas: int = 1) -> int:
    reason = why_no_fleet()
    if reason:
        print(f"make local: this machine cannot host the local target: {reason}.\n{NEEDS}", file=sys.stderr)
        return 1
    if state_file(state_dir).exists():
        print(
            f"make local: a local target is already running ({state_file(state_dir)}). "
            "Remove it first: make local-down",
            file=sys.stderr,
        )
        return 1
    # replicas only when not one: the stack of one gang declares what it did before replicas.
    overrides = {"replicas": replicas} if replicas != 1 else {}
    try:
        load_spec(fleet_config(nodes, **overrides), stack="local")
    except SpecError as error:
        print(
            f"make local: the local stack's config is refused "
            f"(LOCAL_NODES={nodes}, LOCAL_REPLICAS={replicas}):\n{error}",
            file=sys.stderr,
        )
        return 2
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    gangs = f" ({replicas} gangs of {nodes})" if replicas > 1 else ""
    print(
        f"make local: booting a gateway and {nodes * replicas} GPU-node hosts{gangs} and running the stack's "
        "bootstrap (a few minutes; the first run also builds the hosts' image and the engine's virtualenv) ...",
        flush=True,
    )
    started = time.monotonic()
    cluster = start_cluster(state_dir / "fleet", nodes, own_hosts=True, **overrides)
    try:
        cluster.wait_for_completion(timeout=300)
        print(detach(cluster, state_dir, time.monotonic() - started))
    except BaseException:
        stop_cluster(cluster.fleet, cluster.hub)
        state_file(state_dir).unlink(missing_ok=True)
        raise
    return 0


def detach(cluster, state_dir: Path, seconds: float) -> str:
    """Leave `cluster` running: record what `down` needs, write the outputs and the
    certificate, and return how to reach it, ending with the outputs file's path."""
    state_file(state_dir).write_text(
        json.dumps({"fleet": cluster.fleet.state(), "hub": process_state(cluster.hub.process)})
    )
    outputs = cluster.run.outputs
    # The stack file and the outputs the operator tools read. The outputs hold the API
    # key and the SSH key: root-only, in a root-only folder, like a stack's secrets.
    operator_args = cluster.operator_files(state_dir)
    outputs_file(state_dir).chmod(0o600)
    certificate_file(state_dir).write_text(outputs["tlsCertificate"])
    endpoint, key, certificate = outputs["endpoint"], outputs["apiKey"], certificate_file(state_dir)
    body = json.dumps({"model": cluster.served_model, "prompt": "Hello", "max_tokens": 16})
    curl = (
        f"curl --cacert {certificate} -H 'Authorization: Bearer {key}' "
        f"-H 'Content-Type: application/json' -d {shlex.quote(body)} {endpoint}/completions"
    )
    return "\n".join(
        [
            f"The local target serves (up in {seconds:.0f} s).",
            f"  endpoint       {endpoint}   (OpenAI-compatible; TLS with the stack's certificate)",
            f"  API key        {key}",
            f"  model          {cluster.served_model}",
            f"  Ray dashboard  {outputs['dashboardUrl']}   (admin only: from this machine's bridge address)",
            f"  metrics        {outputs['metricsUrl']}   (Prometheus; admin only, with the login below)",
            f"  metrics login  {outputs['metricsLogin']}",
            f"  certificate    {certificate}",
            "From this machine:",
            f"  {curl}",
            f"  OPENAI_BASE_URL={endpoint} OPENAI_API_KEY={key} SSL_CERT_FILE={certificate} <your OpenAI client>",
            *gang_lines(outputs),
            "Health of each gang and of the gateway's pool (Ray, vLLM, a real completion, metrics):",
            f"  scripts/vllm-cluster status {' '.join(operator_args)}",
            "Remove everything: make local-down",
            "The stack's outputs, as `pulumi stack output --json --show-secrets` prints them:",
            str(outputs_file(state_dir)),
        ]
    )


def gang_lines(outputs: dict) -> list[str]:
    """With several gangs, a heading and a line each (its nodes and IPs, head first);
    nothing with one, whose nodes the stack's other outputs name."""
    gangs = outputs.get("gangs") or []
    if len(gangs) < 2:
        return []
    lines = ["Gangs behind the gateway (each its own Ray cluster and vLLM):"]
    for gang in gangs:
        nodes = ", ".join(f"{node['name']} {node['ip']}" for node in gang["nodes"])
        lines.append(f"  {gang['name']:14s} {nodes}")
    return lines


def down(state_dir: Path = STATE_DIR) -> int:
    if os.geteuid() != 0:
        print(
            f"make local-down: needs root (it removes hosts, namespaces, a bridge and mounts). {NEEDS}", file=sys.stderr
        )
        return 1
    if not state_file(state_dir).exists():
        print(
            f"make local-down: no local target is running ({state_file(state_dir)} does not exist); nothing to remove."
        )
        return 0
    state = json.loads(state_file(state_dir).read_text())
    hub = FakeHub(Path(state["fleet"]["workdir"]))
    hub.process = adopt(state["hub"])
    stop_cluster(Fleet.adopt(state["fleet"]), hub)
    shutil.rmtree(state_dir)
    print("make local-down: removed the local target (hosts, namespaces, bridge, mounts, processes, files).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up", help="boot the local hosts and bring the cluster up")
    start.add_argument("--nodes", type=int, default=2, help="GPU-node hosts per gang (pipeline stages); default 2")
    start.add_argument(
        "--replicas", type=int, default=1, help="gangs of --nodes hosts behind the gateway (the stack's replicas)"
    )
    commands.add_parser("down", help="remove everything `up` made")
    args = parser.parse_args(argv)
    return up(args.nodes, replicas=args.replicas) if args.command == "up" else down()


if __name__ == "__main__":
    sys.exit(main())
