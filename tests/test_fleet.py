"""End to end on the local fleet: the program's user data and remote commands run on
real hosts (systemd, sshd, nginx, a multi-node Ray), and the service is checked
through what the stack exports. Then faults, each ending with the service healthy
again or a clear report. The tests run in file order against one cluster.

Skipped, with the reason, where the machine cannot host the fleet (not root, no
namespaces); under CI (VLLM_CLUSTER_CI) that is a failure instead.
"""

from __future__ import annotations

import calendar
import dataclasses
import itertools
import json
import os
import re
import select
import shlex
import signal
import socket
import stat
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from fleet_helpers import boot_log, downloads_per_file, first_timestamp
from pulumi_mocks import run_program

from cli.mock_runtime import real_private_key
from components import bootstrap, metrics, node_env, ports, versions
from components.bootstrap import local_model_directory
from components.catalog import CATALOG
from components.config_keys import MAX_FABRIC_FLOOR_GBPS
from components.topology import node_name
from components.versions import RAY_VERSION
from localhosts.cluster import (
    ENGINE_CACHE,
    MODEL,
    fleet_config,
    start_cluster,
    stop_cluster,
    tiny_model,
)
from localhosts.fleet import in_ci, why_no_fleet
from localhosts.replay import COMMAND, destroy, replay, run_step, steps_of, with_outputs
from scripts.lib import model_stage
from scripts.lib.vllm_cluster_lib import metric_totals  # the watchdog's reader of /metrics
from tools import local_target

ROOT = Path(__file__).resolve().parent.parent
NODES = int(os.environ.get("VLLM_CLUSTER_FLEET_NODES", "2"))
GPUS_PER_NODE = CATALOG[fleet_config(NODES)["instanceType"]].gpus

_reason = why_no_fleet()
if _reason and in_ci():
    pytest.fail(f"CI cannot host the local fleet: {_reason}", pytrace=False)
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"no local fleet here: {_reason}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The cluster as `make local` leaves it running (tools/local_target.py): a stack of
    hosts a user already has (config hosts) on the local hosts; the last test removes it
    as `make local-down` does, and checks nothing is left behind."""
    state_dir = tmp_path_factory.mktemp("local-target")
    # The engine's shared-memory segments and sockets live inside the hosts (their own
    # /dev/shm and /tmp): none may be left on this machine when the target is removed.
    shm_before, sockets_before = set(os.listdir("/dev/shm")), tmp_sockets()
    running = start_cluster(state_dir / "fleet", NODES, own_hosts=True)
    try:  # nothing after the bring-up may fail without removing what it made
        running.printed = local_target.detach(running, state_dir, time.monotonic() - running.booted_at)
    except BaseException:
        stop_cluster(running.fleet, running.hub)
        raise
    running.state_dir, running.shm_before, running.sockets_before = state_dir, shm_before, sockets_before
    yield running
    if local_target.state_file(state_dir).exists():  # the last test did not get to remove it
        local_target.down(state_dir)


def tmp_sockets() -> set[str]:
    """The sockets in this machine's /tmp (vLLM's engine puts its ZeroMQ sockets in /tmp)."""
    return {entry.name for entry in os.scandir("/tmp") if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode)}


def head_shell(cluster, command: str, check: bool = True):
    """A command on the head as root, with node.env loaded (Ray's token settings among them)."""
    return cluster.node_shell(0, f"sudo bash -c 'set -a; . /etc/vllm-cluster/node.env; {command}'", check=check)


def ray_status(cluster) -> tuple[int, float]:
    """(live nodes, GPUs) as `ray status` on the head reports them."""
    out = head_shell(cluster, "/opt/vllm-cluster/venv/bin/ray status --address $HEAD_IP:6379").stdout
    active = out.split("Active:", 1)[1].split("Pending:", 1)[0]
    nodes = len(re.findall(r"^\s*1 node_", active, re.M))
    gpus = float(re.search(r"/([\d.]+) GPU", out).group(1))
    return nodes, gpus


def pids(cluster) -> dict[str, str]:
    """The main PID of every Ray unit and of vLLM: a restart changes it."""
    found = {"vllm": cluster.unit_property(0, "vllm.service", "MainPID")}
    for index in range(NODES):
        unit = "ray-head.service" if index == 0 else "ray-worker.service"
        found[f"ray@{index}"] = cluster.unit_property(index, unit, "MainPID")
    return found


# --- the service, through the exported endpoint -----------------------------------------


def openai_client(cluster, api_key: str | None = None):
    """The official OpenAI client pointed at the exported endpoint, trusting the stack's certificate."""
    import openai

    return openai.OpenAI(
        base_url=cluster.endpoint,
        api_key=api_key or cluster.api_key,
        max_retries=0,
        timeout=120,
        http_client=openai.DefaultHttpx2Client(verify=cluster.tls()),
    )


def test_a_completion_through_the_gateway_succeeds(cluster):
    client = openai_client(cluster)
    completion = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5)
    assert completion.choices[0].text and completion.usage.completion_tokens == 5
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 4


def test_streaming_through_the_gateway_arrives_token_by_token(cluster):
    """Server-sent events pass the gateway unbuffered: several chunks, then the end."""
    client = openai_client(cluster)
    chunks = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=12, stream=True))
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert len(texts) >= 6 and "".join(texts)
    assert chunks[-1].choices[0].finish_reason == "length"
    chat = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
        )
    )
    assert sum(bool(chunk.choices and chunk.choices[0].delta.content) for chunk in chat) >= 4


def test_the_local_target_says_how_to_reach_it_and_that_works_from_this_machine(cluster):
    lines = cluster.printed.splitlines()
    outputs = json.loads(Path(lines[-1]).read_text())
    assert {"endpoint", "apiKey", "dashboardUrl", "tlsCertificate", "metricsUrl", "metricsLogin"} <= set(outputs)
    assert any(outputs["metricsUrl"] in line for line in lines) and any(
        outputs["metricsLogin"] in line for line in lines
    )
    assert oct(Path(lines[-1]).stat().st_mode & 0o777) == "0o600"
    assert any(outputs["endpoint"] in line for line in lines) and any(outputs["apiKey"] in line for line in lines)
    curl = next(line.strip() for line in lines if line.strip().startswith("curl "))
    answered = subprocess.run(curl, shell=True, capture_output=True, text=True, timeout=120)
    assert json.loads(answered.stdout)["choices"][0]["text"], answered.stdout + answered.stderr
    status = next(line.strip() for line in lines if line.strip().startswith("scripts/vllm-cluster status"))
    result = subprocess.run(status.split(), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0 and "HEALTHY" in result.stdout, result.stdout + result.stderr


def test_without_the_api_key_the_api_refuses(cluster):
    import openai

    assert cluster.request("/v1/completions", {"model": MODEL, "prompt": "x"}, key=None)[0] == 401
    assert cluster.request("/v1/models", key="wrong-key")[0] == 401
    with pytest.raises(openai.AuthenticationError):
        openai_client(cluster, api_key="wrong-key").completions.create(model=MODEL, prompt="x", max_tokens=1)


def test_the_responses_api_answers_through_the_gateway_with_the_key_only(cluster):
    """Issue 33: the OpenAI SDK's Responses API (which OpenAI recommends for new
    applications) reaches vLLM's /v1/responses through the gateway; without the key the
    gateway itself refuses it."""
    import openai

    response = openai_client(cluster).responses.create(model=MODEL, input="Hello", max_output_tokens=16)
    # The tiny test model rarely stops on its own: 16 tokens end it as "incomplete".
    assert response.output_text, response
    assert response.status == "completed" or response.incomplete_details.reason == "max_output_tokens", response
    with pytest.raises(openai.AuthenticationError):
        openai_client(cluster, api_key="wrong-key").responses.create(model=MODEL, input="x", max_output_tokens=16)


def test_paths_as_sent_that_climb_out_of_a_route_get_404(cluster, tmp_path):
    """curl --path-as-is keeps /metrics/../v1/models as sent: before, nginx matched it as
    /v1/models and forwarded the raw path, and vLLM answered its /metrics with no key."""
    base = cluster.endpoint.removesuffix("/v1")
    certificate = tmp_path / "tls-certificate.pem"
    certificate.write_text(cluster.run.outputs["tlsCertificate"])
    for path in ("/metrics/../v1/models", "/v1/models/../../metrics", "/v1//models", "/v1/%6dodels"):
        for key in (cluster.api_key, None):
            header = ["-H", f"Authorization: Bearer {key}"] if key else []
            code = subprocess.run(
                ["curl", "--path-as-is", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(certificate)]
                + header
                + [base + path],
                capture_output=True,
                text=True,
                timeout=60,
            ).stdout
            assert code == "404", (path, key is not None, code)


def test_the_clients_key_stops_at_the_gateway_the_head_checks_its_own(cluster):
    """vLLM on the head checks the heads' key, which only the gateway sends: a node (or
    anything else inside) holding the clients' key cannot call the head with it."""
    probe = (
        'curl -s -o /dev/null -w %{http_code} -H "Content-Type: application/json" '
        f'-H "Authorization: Bearer {cluster.api_key}" http://$NODE_IP:8000/v1/models'
    )
    assert head_shell(cluster, probe).stdout == "401"


def test_routes_outside_the_allowlist_are_refused_at_the_gateway(cluster):
    # vLLM itself answers /metrics (200, no key needed) and its admin routes: the gateway must not pass them.
    vllm_metrics = head_shell(cluster, "curl -s -o /dev/null -w %{http_code} http://$NODE_IP:8000/metrics").stdout
    assert vllm_metrics == "200"
    for path in ("/metrics", "/collective_rpc", "/v1/embeddings", "/version", "/tokenize", "/invocations"):
        assert cluster.request(path)[0] == 404, path
    assert cluster.request("/health")[0] == 200


# --- Prometheus on the gateway (issue 21) ---------------------------------------------------


def test_prometheus_is_reachable_only_on_the_admin_port_with_its_login(cluster):
    """From this machine (in adminCidrs) the stack's login gets in and none or a wrong
    one gets 401; from a node's address (outside adminCidrs) nginx refuses before any
    login; the API port answers 404 for every Prometheus and metrics path."""
    status, answer = cluster.metrics_request("api/v1/query", query="up")
    assert status == 200 and answer["status"] == "success", answer
    assert cluster.metrics_request("api/v1/query", login=None, query="up")[0] == 401
    user, password = cluster.run.outputs["metricsLogin"].split(":", 1)
    assert cluster.metrics_request("api/v1/query", login=f"{user}:{password[:-1]}", query="up")[0] == 401
    assert cluster.metrics_request("graph")[0] == 200  # Prometheus's own UI, under the prefix
    outside = cluster.node_shell(
        0, f"curl -sk -o /dev/null -w %{{http_code}} '{cluster.run.outputs['metricsUrl']}api/v1/query?query=up'"
    ).stdout
    assert outside == "403", outside
    for path in (
        "/prometheus/",
        "/prometheus/graph",
        "/prometheus/api/v1/query?query=up",
        "/prometheus/-/ready",
        "/api/v1/query?query=up",
        "/metrics",
        "/federate",
    ):
        assert cluster.request(path)[0] == 404, path
        assert cluster.request(path, key=None)[0] == 404, path


def test_the_ray_dashboard_finds_prometheus_on_the_gateway(cluster):
    """RAY_PROMETHEUS_HOST on the head: the dashboard's own health check of Prometheus
    (ray/dashboard/modules/metrics/metrics_head.py, a query through the private network)."""
    answer = head_shell(
        cluster,
        'curl -s -w " %{http_code}" -H "Authorization: Bearer $(cat $RAY_AUTH_TOKEN_PATH)" '
        "http://$NODE_IP:$PORT_RAY_DASHBOARD/api/prometheus_health",
    ).stdout
    body, code = answer.rsplit(" ", 1)
    assert code == "200" and json.loads(body)["msg"] == "prometheus running", answer


def recorded(cluster, series: str, start: float, end: float) -> set[float | None]:
    """Every value the recorded `series` of gang0 had between `start` and `end` (epoch
    seconds), as Prometheus's own query API gives it: a range query a second apart, so
    no evaluation of the rule in the window is missed. NaN (no request in the window) is
    None, as status reports it."""
    status, answer = cluster.metrics_request(
        "api/v1/query_range", query=f'{series}{{gang="gang0"}}', start=f"{start:.3f}", end=f"{end:.3f}", step="1"
    )
    assert status == 200 and answer["status"] == "success", answer
    values = {
        None if value == "NaN" else float(value) for result in answer["data"]["result"] for _, value in result["values"]
    }
    return values or {None}


def test_prometheus_scrapes_every_node_and_the_gangs_figures_agree_with_status(cluster):
    """After completions through the gateway: every node's Ray metrics and the head's
    vLLM are scraped, labelled by gang, node and role; each recording rule has gang0's
    value; and `status` shows exactly what Prometheus's own query API holds."""
    gang = "gang0"
    nodes = {(gang, node_name(index)) for index in range(NODES)}
    deadline = time.monotonic() + 180
    while True:
        for _ in range(3):
            assert cluster.completion() == 200
        ray = cluster.prometheus_query('up{job="ray"}')
        vllm = cluster.prometheus_query('up{job="vllm"}')
        tokens = cluster.prometheus_query(f'{metrics.TOKENS_PER_SECOND}{{gang="{gang}"}}')
        if (
            set(ray) == nodes
            and set(ray.values()) == {1.0}
            and vllm == {(gang, node_name(0)): 1.0}
            and any(value > 0 for value in tokens.values())
        ):
            break
        assert time.monotonic() < deadline, f"after 180 s: ray {ray}, vllm {vllm}, tokens/s {tokens}"
        time.sleep(10)
    roles = cluster.prometheus_query('count by (gang, node, role) (up{job="ray"})')
    assert len(roles) == NODES
    for name in metrics.recording_rule_exprs():
        assert cluster.prometheus_query(f'{name}{{gang="{gang}"}}'), f"{name} has no value for {gang}"
    before = time.time()
    result = cluster.operator("status", "--json")
    after = time.time()
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["prometheus"]["reachable"], report.get("prometheus")
    figures = report["gangs"][0]["prometheus"]
    for key, series in (
        ("ttftP50", metrics.TTFT_P50),
        ("ttftP95", metrics.TTFT_P95),
        ("interTokenP50", metrics.INTER_TOKEN_P50),
        ("tokensPerSecond", metrics.TOKENS_PER_SECOND),
        ("requestsRunning", metrics.REQUESTS_RUNNING),
        ("requestsWaiting", metrics.REQUESTS_WAITING),
        ("kvCacheUsed", metrics.KV_CACHE_USED),
    ):
        assert figures[key] in recorded(cluster, series, before - 1, after + 1), (key, figures[key])
    assert report["alerts"] == [], report["alerts"]
    printed = cluster.operator("status").stdout
    assert "last 5m" in printed and "TTFT p50" in printed and "alerts      none" in printed, printed


def test_the_model_list_names_the_configured_model(cluster):
    status, body = cluster.request("/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL]
    assert [m.id for m in openai_client(cluster).models.list()] == [MODEL]


def test_the_model_was_staged_once_without_its_training_checkpoint(cluster):
    weights_and_tokenizer = sorted(p.name for p in tiny_model().iterdir())
    assert "model.safetensors.index.json" in weights_and_tokenizer and "tokenizer.json" in weights_and_tokenizer
    assert downloads_per_file(cluster.hub) == dict.fromkeys(weights_and_tokenizer, 1)
    marker = cluster.node_shell(0, f"cat /mnt/vllm-models/complete/{MODEL}/main").stdout
    assert marker.startswith("staged ") and f"in {NODES} parts" in marker, marker


def test_gang_0s_nodes_each_downloaded_their_own_part_of_the_model(cluster):
    """A disjoint share each, at the same time, so one node's link does not bound the first download."""
    parts = [cluster.outcomes["vllm-model"]]
    parts += [cluster.outcomes[f"vllm-model-part-{node_name(i)}"] for i in range(1, NODES)]
    for number, outcome in enumerate(parts, start=1):
        said = re.search(rf"downloading part {number} of {NODES} of \S+ \((\d+) files\)", outcome.stderr)
        assert said and int(said.group(1)) > 0, outcome.stderr


# --- the model's bytes: each node its own stage, from its own disk ---------------------

LOCAL_MODEL = local_model_directory(MODEL, "main")


def tiny_model_layout() -> tuple[dict, int, bool]:
    """The tiny model's weight map, layer count and whether its embeddings are tied."""
    index = json.loads((tiny_model() / "model.safetensors.index.json").read_text())
    layers, tied = model_stage.model_layout(json.loads((tiny_model() / "config.json").read_text()))
    return index["weight_map"], layers, tied


def weight_files(cluster, index: int, directory: str) -> list[str]:
    found = cluster.node_shell(index, f"sudo find {directory} -maxdepth 1 -name '*.safetensors' -printf '%f %y\\n'")
    return sorted(found.stdout.split("\n")[:-1])


def test_each_node_serves_only_its_pipeline_stage_from_its_own_disk(cluster):
    """vLLM reads every weight file in its folder in every worker: each node's folder
    holds only the files with tensors of its own stage, copied (not links to the cache),
    and a stage index that names only those, and the engine serves from it."""
    weight_map, layers, tied = tiny_model_layout()
    assert len(set(weight_map.values())) > NODES, "the tiny model must have several weight files"
    ips = [node.ip for node in cluster.fleet.nodes]
    stages = model_stage.node_stages(ips, ips[0], GPUS_PER_NODE, 1, NODES)
    vllm_env = cluster.node_shell(0, "sudo cat /etc/vllm-cluster/vllm.env").stdout
    assert f'SERVE_ARGS="{LOCAL_MODEL} ' in vllm_env, vllm_env
    held = []
    for index, ip in enumerate(ips):
        expected = model_stage.stage_files(weight_map, set(stages[ip]), layers, NODES, tied)
        assert weight_files(cluster, index, LOCAL_MODEL) == [f"{name} f" for name in expected], ip
        index_file = f"{LOCAL_MODEL}/model.safetensors.index.json"
        stage_index = json.loads(cluster.node_shell(index, f"sudo cat {index_file}").stdout)
        assert sorted(set(stage_index["weight_map"].values())) == expected
        held.append(frozenset(expected))
    assert len(set(held)) == NODES and all(files < set(weight_map.values()) for files in held), held
    assert cluster.completion() == 200


def test_the_stage_copy_follows_three_pipeline_stages_too(cluster):
    """The node's own copy command on a real host, for a three-stage gang (the third
    node imagined): each position gets exactly the files of its stage, and they differ."""
    weight_map, layers, tied = tiny_model_layout()
    ips = [*(node.ip for node in cluster.fleet.nodes[:2]), cluster.fleet.network.node_ip(249)]
    # vLLM orders the nodes after the head by their Ray node ID (model_stage.node_stages):
    # given as Ray would know them, each position is exact.
    ray_ids = {ip: f"{position:02x}" * 28 for position, ip in enumerate(ips)}
    stages = model_stage.node_stages(ips, ips[0], GPUS_PER_NODE, 1, 3, ray_node_ids=ray_ids)
    held = set()
    for position, ip in enumerate(ips):
        target = f"/tmp/pp3-stage-{position}"
        cluster.node_shell(
            0,
            f"sudo /opt/vllm-cluster/venv/bin/python /opt/vllm-cluster/bin/model-stage local"
            f" --source /mnt/vllm-models/models/{MODEL}/main --target {target} --model {MODEL} --revision main"
            f" --node-ip {ip} --head-ip {ips[0]} --gang-ips {','.join(ips)} --gpus-per-node {GPUS_PER_NODE}"
            f" --tp 1 --pp 3 --ray-node-ids {','.join(f'{ip}={node}' for ip, node in ray_ids.items())}"
            f" && sudo test -f {target}/config.json",
        )
        expected = model_stage.stage_files(weight_map, set(stages[ip]), layers, 3, tied)
        try:
            assert weight_files(cluster, 0, target) == [f"{name} f" for name in expected], ip
        finally:
            cluster.node_shell(0, f"sudo rm -rf {target}")
        held.add(frozenset(expected))
    assert len(held) == 3, held


def test_ray_shows_every_node_and_gpu(cluster):
    assert ray_status(cluster) == (NODES, float(NODES * GPUS_PER_NODE))


def test_ray_refuses_a_client_without_the_token(cluster):
    with_token = head_shell(cluster, "/opt/vllm-cluster/venv/bin/ray job list --address http://$NODE_IP:8265")
    assert with_token.returncode == 0
    without = cluster.node_shell(
        0,
        "sudo env -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN_PATH /opt/vllm-cluster/venv/bin/ray job submit "
        f"--address http://{cluster.fleet.nodes[0].ip}:8265 -- echo pwned",
        check=False,
    )
    assert without.returncode != 0
    assert re.search(r"401|[Uu]nauthori[sz]ed|authentication", without.stdout + without.stderr)


def test_every_node_is_pinned_to_its_interface_and_ip(cluster):
    for index in range(NODES):
        env = dict(
            line.split("=", 1)
            for line in cluster.node_shell(index, "sudo cat /etc/vllm-cluster/node.env").stdout.splitlines()
            if "=" in line and not line.startswith("#")
        )
        assert env["NODE_IP"] == env["VLLM_HOST_IP"] == cluster.fleet.nodes[index].ip
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["PRIMARY_INTERFACE"] == "eth0"
        assert env["HEAD_IP"] == cluster.fleet.nodes[0].ip


def test_vllm_knows_every_variable_the_stack_gives_it(cluster):
    """vLLM warns at start about a VLLM_* variable it does not know (a misspelt setting
    would be ignored): its log from the bring-up has no such warning."""
    log = cluster.node_shell(0, "sudo journalctl -u vllm.service -o cat --no-pager").stdout
    assert "Application startup complete" in log
    assert "Unknown vLLM environment variable" not in log, [
        line for line in log.splitlines() if "Unknown vLLM environment variable" in line
    ]


def test_secrets_on_the_nodes_are_root_only(cluster):
    listing = [
        line
        for line in cluster.node_shell(
            0,
            "sudo sh -c \"stat -c '%a %U %n' /etc/vllm-cluster /etc/vllm-cluster/secrets /etc/vllm-cluster/secrets/*\"",
        ).stdout.split("\n")
        if line
    ]
    # The service user's group may reach the Ray token by name (Ray reads it), nothing else.
    # Passable by name, not listable: Ray (the service user) opens its token there.
    assert listing.pop(0) == "711 root /etc/vllm-cluster"
    assert listing[0] == "710 root /etc/vllm-cluster/secrets"
    assert {line.rsplit("/", 1)[1] for line in listing[1:]} == {"ray-token", "vllm-api.env", "gateway-probe.env"}
    for line in listing[1:]:
        assert line.startswith("640 root " if line.endswith("/ray-token") else "600 root "), listing
    assert cluster.node_shell(0, "cat /etc/vllm-cluster/secrets/ray-token", check=False).returncode != 0
    as_service = "sudo setpriv --reuid=vllm-cluster --regid=vllm-cluster --init-groups"
    api_key = cluster.node_shell(0, f"{as_service} cat /etc/vllm-cluster/secrets/vllm-api.env", check=False)
    assert api_key.returncode != 0, "the service user read the API key's file"


# A stand-in for the instance metadata service on the node itself (its address on the
# loopback, a web server as root): what the service user may not reach and root may.
METADATA_STAND_IN = (
    "sudo sh -c 'ip addr add 169.254.169.254/32 dev lo"
    " && (python3 -m http.server --bind 169.254.169.254 80 </dev/null >/dev/null 2>&1 & echo $!)'"
)


def test_ray_and_vllm_run_as_the_service_user_who_cannot_reach_the_metadata_service(cluster):
    """Issue 33 point 3: every process of Ray's and vLLM's units on every node is the
    service user's, not root's, and that user's packets to the metadata service's address
    are refused on the node (the rule Ray's unit applies before it starts), root's not."""
    for index in range(len(cluster.fleet.nodes)):
        listing = cluster.node_shell(index, "ps -eo user:32=,comm=,args=").stdout.splitlines()
        processes = [line.split(None, 2) for line in listing if len(line.split(None, 2)) == 3]
        ray_and_vllm = [
            (user, command, args)
            for user, command, args in processes
            if command in ("raylet", "gcs_server")
            # Ray's workers and vLLM's processes name themselves (ray::..., VLLM::...).
            or args.startswith(("ray::", "VLLM::"))
            or "/opt/vllm-cluster/venv/bin/vllm serve" in args
            or "/opt/vllm-cluster/venv/bin/ray start" in args
        ]
        assert {user for user, _, _ in ray_and_vllm} == {"vllm-cluster"}, ray_and_vllm
        assert any(command == "raylet" for _, command, _ in ray_and_vllm), listing
        if index == 0:
            assert any("vllm serve" in args or args.startswith("VLLM::") for _, _, args in ray_and_vllm), listing
    server = cluster.node_shell(0, METADATA_STAND_IN).stdout.strip()
    try:
        fetch = "curl -sS -o /dev/null -w '%{http_code}' --max-time 10 http://169.254.169.254/"
        deadline = time.monotonic() + 30
        while (as_root := cluster.node_shell(0, f"sudo {fetch}", check=False)).stdout != "200":
            assert time.monotonic() < deadline, as_root
            time.sleep(0.5)
        as_service = cluster.node_shell(
            0, f"sudo setpriv --reuid=vllm-cluster --regid=vllm-cluster --init-groups {fetch}", check=False
        )
        # curl's 7: the connection was refused (the REJECT rule), not a timeout (28).
        assert as_service.returncode == 7, (as_service.stdout, as_service.stderr)
    finally:
        cluster.node_shell(0, f"sudo sh -c 'kill {server}; ip addr del 169.254.169.254/32 dev lo'", check=False)


def service_listeners(cluster, index: int) -> list[tuple[str, int, str]]:
    """(address, port, process) of every TCP socket the service user (Ray and vLLM)
    listens on at node `index`, as `ss` shows it there."""
    uid = cluster.node_shell(index, "id -u vllm-cluster").stdout.strip()
    found = []
    for line in cluster.node_shell(index, "sudo ss -Hltnpe").stdout.splitlines():
        if f" uid:{uid} " not in f" {line} ":
            continue
        address, port = line.split()[3].rsplit(":", 1)
        process = re.search(r'users:\(\("([^"]+)"', line)
        found.append((address.strip("[]").removeprefix("::ffff:"), int(port), process.group(1) if process else "?"))
    return found


def dialled_from_here(ip: str, port: int) -> str:
    """What a TCP connection from this machine (the bridge's address, which is none of the
    stack's) to ip:port meets: "open", "refused" (a reset) or "silence" (nothing within
    30 s, generous for a loaded machine: a reset comes back at once)."""
    try:
        with socket.create_connection((ip, port), timeout=30):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "silence"


def dial_from_gateway(cluster, ip: str, port: int) -> subprocess.CompletedProcess:
    return cluster.fleet.ssh(cluster.fleet.gateway, f"timeout 30 bash -c 'exec 3<>/dev/tcp/{ip}/{port}'", check=False)


def test_only_the_gang_and_the_gateway_reach_ray_and_vllm_on_a_node(cluster):
    """Issue 33 point 5: on a stack of hosts nothing has a security group. vLLM listens on
    the head's private address only; Ray listens on every address, but on ports of its
    own that ports.py pins (none left random: the rest are the kernel's ephemeral ones,
    NCCL's, Gloo's and vLLM's own). From an address that is not the stack's (this machine,
    on the hosts' bridge) every one of those ports on every node is refused (a reset from
    the node's host firewall, which counts it), vLLM's and Ray's metrics among them. The
    gateway still scrapes Ray's metrics on every node and reaches the head's vLLM, but not
    Ray's GCS; the gang's worker reaches the head's GCS. Loading the firewall again (every
    start of Ray's unit does) leaves one table of the stack's and a table of the host's
    own as it was."""
    gateway = cluster.fleet.gateway
    pinned = set()
    for listened in bootstrap.node_listening_ports():
        pinned |= set(range(listened[0], listened[1] + 1)) if isinstance(listened, tuple) else {listened}
    tried = set()
    for index, node in enumerate(cluster.fleet.nodes):
        low, high = map(int, cluster.node_shell(index, "cat /proc/sys/net/ipv4/ip_local_port_range").stdout.split())
        listeners = service_listeners(cluster, index)
        assert any(process == "raylet" for _, _, process in listeners), listeners
        unpinned = [item for item in listeners if item[1] not in pinned and not low <= item[1] <= high]
        assert not unpinned, f"{node.name}: listeners on ports neither pinned nor ephemeral: {unpinned}"
        if index == 0:
            vllm = [item for item in listeners if item[1] == ports.VLLM_API]
            assert [address for address, _, _ in vllm] == [node.ip], vllm  # the head's private address only
        for address, port, process in listeners:
            if port in pinned and address != "127.0.0.1":
                assert dialled_from_here(node.ip, port) == "refused", (node.name, address, port, process)
                tried.add((index, port))
    last = len(cluster.fleet.nodes) - 1
    assert {(0, ports.VLLM_API), (0, ports.RAY_METRICS), (0, ports.RAY_GCS), (last, ports.RAY_METRICS)} <= tried
    counted = cluster.node_shell(0, "sudo nft list chain inet vllm_cluster input").stdout
    refused = re.search(r"counter packets (\d+) .* reject with tcp reset", counted)
    assert refused and int(refused.group(1)) >= 3, counted
    # The gateway: Ray's metrics on every node, the head's vLLM; not Ray's GCS.
    for node in cluster.fleet.nodes:
        scraped = cluster.fleet.ssh(
            gateway,
            f"curl -s -o /dev/null -w %{{http_code}} --max-time 60 http://{node.ip}:{ports.RAY_METRICS}/metrics",
        )
        assert scraped.stdout == "200", (node.name, scraped.stdout, scraped.stderr)
    health = cluster.fleet.ssh(
        gateway,
        f"curl -s -o /dev/null -w %{{http_code}} --max-time 60 http://{cluster.head.ip}:{ports.VLLM_API}/health",
    )
    assert health.stdout == "200", health
    gcs = dial_from_gateway(cluster, cluster.head.ip, ports.RAY_GCS)
    assert gcs.returncode != 0 and "refused" in gcs.stderr, (gcs.returncode, gcs.stderr)
    peer = f"timeout 30 bash -c 'exec 3<>/dev/tcp/{cluster.head.ip}/{ports.RAY_GCS}'"
    peer = cluster.node_shell(last, peer, check=False)
    assert peer.returncode == 0, peer.stderr
    # Loaded again beside a table of the host's own: one table of the stack's, the same
    # rules, and the host's table as it was.
    worker = last
    own = "table inet users_own { chain input { type filter hook input priority 10; tcp dport 9999 counter accept; }; }"
    rules = "sudo nft list table inet vllm_cluster | sed -E 's/counter packets [0-9]+ bytes [0-9]+/counter/'"
    before = cluster.node_shell(worker, rules).stdout
    cluster.node_shell(worker, f"sudo nft '{own}'")
    try:
        cluster.node_shell(worker, "sudo /opt/vllm-cluster/bin/vllm-cluster-node guard-service")
        tables = cluster.node_shell(worker, "sudo nft list tables").stdout.split("\n")
        assert sorted(line for line in tables if "vllm_cluster" in line or "users_own" in line) == [
            "table inet users_own",
            "table inet vllm_cluster",
        ], tables
        assert "tcp dport 9999 counter" in cluster.node_shell(worker, "sudo nft list table inet users_own").stdout
        assert cluster.node_shell(worker, rules).stdout == before
    finally:
        cluster.node_shell(worker, "sudo nft delete table inet users_own", check=False)


@contextmanager
def host_key_changed(cluster, index: int):
    """Node `index` answers with a new SSH host key (as a machine put in its place would),
    for the block's length; its own key is back after, also when the block fails."""
    fleet = cluster.fleet
    host = fleet.nodes[index]
    private = host.root / "etc" / "ssh" / "ssh_host_ed25519_key"
    public = private.with_name("ssh_host_ed25519_key.pub")
    kept = private.read_bytes(), public.read_bytes()
    other = real_private_key("ED25519")

    def reload_sshd() -> None:
        # sshd loads its host keys again on SIGHUP (it re-executes itself), as after a reboot.
        assert fleet._in_host(host, "sh", "-c", "kill -HUP $(cat /run/sshd.pid)") is not None
        time.sleep(2)

    private.write_text(other["privateKeyOpenssh"])
    public.write_text(other["publicKeyOpenssh"])
    reload_sshd()
    try:
        yield host
    finally:
        private.write_bytes(kept[0])
        public.write_bytes(kept[1])
        reload_sshd()
        fleet.wait_for_ssh(host)


def test_a_host_whose_key_changed_gets_no_command_and_is_named(cluster):
    """Issue 33 point 4: whoever answers at a node's address with another host key gets
    nothing. The gateway's login wait fails at once naming the node and the fix (not after
    its 20 minutes); pulumi-command's dial (ssh_dial.py, as connection.go does it) refuses
    the key before it logs in, so the node's secrets command never runs; the operator
    tools name the host."""
    worker = cluster.fleet.nodes[1]
    steps = steps_of(cluster.run, only={"vllm-login-worker-1", "vllm-secrets-worker-1"})
    with host_key_changed(cluster, 1):
        started = time.monotonic()
        login = run_step(steps["vllm-login-worker-1"], timeout=300)
        assert login.returncode != 0 and time.monotonic() - started < 120, (login.stdout, login.stderr)
        assert f"{worker.ip} presents an SSH host key other than the one the stack gave it" in login.stderr
        assert "Fix:" in login.stderr
        # The real limit (80 tries) only makes the refusal take minutes: two show it.
        secrets = steps["vllm-secrets-worker-1"]
        secrets = dataclasses.replace(secrets, target=dataclasses.replace(secrets.target, dial_error_limit=2))
        refused = run_step(secrets, timeout=120)
        # The handshake's first try meets the other key; pulumi-command retries it on the
        # same tunnelled connection, which that failure closed (connection.go), so the
        # command's last word is "use of closed network connection": the login wait's
        # message above is the one a user reads. The command itself never ran.
        tries = refused.dial_log.stages("Dial")
        assert refused.returncode == 255 and tries and "host key mismatch" in tries[0], refused.dial_log.failures
        assert refused.output.opened is None, "no session was opened on the node"
        tool = cluster.operator("preflight")
        assert tool.returncode != 0
        named = f"({worker.ip}) or the gateway presents an SSH host key other than the stack's"
        assert named in tool.stdout + tool.stderr, tool.stdout + tool.stderr
    # Its own key back, the same commands get through.
    assert run_step(steps["vllm-login-worker-1"], timeout=300).returncode == 0


# --- first boot as it really happens, on hosts laid out like the node image -------------


def test_hosts_refused_logins_while_booting_and_the_stack_began_on_running_machines(cluster):
    """/run/nologin was there while sshd already answered, on every host. The machines of
    a stack of hosts run before the stack does: `make local` starts the stack once every
    host accepts logins (a machine refusing them would fail the stack's first command on
    it, as pulumi-command retries a refused login on the same connection)."""
    for host in cluster.fleet.hosts:
        sshd = first_timestamp(boot_log(cluster, host, "ssh.service"), "Server listening")
        sessions = first_timestamp(boot_log(cluster, host, "systemd-user-sessions.service"), "Finished")
        assert sessions - sshd >= 5, f"{host.name}: logins were possible {sessions - sshd:.1f} s after sshd started"
        assert sessions <= cluster.started_wall, f"{host.name} refused logins when the stack began"
    for name, outcome in cluster.outcomes.items():
        refused = [e for e in outcome.dial_log.stages("Dial") if "Authentication" in e]
        assert not refused, (name, refused)


def test_every_hosts_boot_was_checked_and_no_unit_of_the_local_hosts_failed(cluster):
    """Each host's boot was watched to its end (localhosts/boot_check.py) and none of the
    machinery's own units failed: the hosts the rest of this file tests booted whole."""
    checks = cluster.fleet.wait_for_boot_checks(timeout=120)
    assert sorted(checks) == sorted(host.name for host in cluster.fleet.hosts)
    assert all(check.passed for check in checks.values()), {name: check.boots for name, check in checks.items()}


# A NAT gateway drops a TCP flow idle for 350 s, some firewalls sooner (issue 19, point 5):
# every long step prints at least every 30 s, so no command of the bring-up stays silent
# for a minute (localhosts/replay.py OutputClock, from when each line arrived).
MAX_SILENCE_S = 60


def test_no_command_of_the_bring_up_was_silent_for_a_minute(cluster):
    silences = {name: outcome.output.longest_silence() for name, outcome in cluster.outcomes.items()}
    too_long = {
        name: f"{seconds:.0f} s after " + (repr(line) if line is not None else "its start")
        for name, (seconds, line) in silences.items()
        if seconds >= MAX_SILENCE_S
    }
    assert silences and not too_long, too_long


def test_the_gateway_waited_for_the_package_lists_lock_at_first_boot(cluster):
    gateway = cluster.fleet.gateway
    printed = cluster.fleet.ssh(gateway, "cat /var/log/apt-lock-double.log").stdout
    logged = [line.split() for line in printed.splitlines()]
    # A host the fleet booted again (localhosts/boot_check.py: a unit of its own failed at a
    # boot on a starved machine) ran the double again, its first hold cut by the power-off
    # (CI of 2026-12-07: "locked", "locked", "released"): the last hold is the one the
    # bootstrap met.
    locked = max(float(at) for at, event in logged if event == "locked")
    released = min(float(at) for at, event in logged if event == "released" and float(at) >= locked)
    assert released - locked >= 30, logged
    # On machines the user has, the stack's gateway-setup installs nginx: it waited for the
    # lock if it came before its release (the stack began once the hosts accepted logins).
    setup = cluster.outcomes["vllm-gateway-setup"]
    if cluster.started_wall < released - 5:
        assert "another apt holds the package lists lock" in setup.stderr + setup.stdout, setup.stderr[-2000:]
    # nginx came from the package mirror after the lock was released (dpkg's own log).
    log = cluster.fleet.ssh(gateway, "grep ' status installed nginx:' /var/log/dpkg.log").stdout
    installed = calendar.timegm(time.strptime(log.split()[0] + " " + log.split()[1], "%Y-%m-%d %H:%M:%S"))
    assert installed >= int(released)


def test_only_the_wheelhouse_writer_can_write_the_wheelhouse_and_every_node_the_model_tree(cluster):
    """Gang 0's head alone may write the wheelhouse (on AWS its role, through the
    wheelhouse's access point; here a read-only bind for the others): a worker that is
    compromised cannot plant or swap the wheels another node installs. Every node still
    writes the model tree (preflight's facts)."""
    probe = "sudo sh -c 'touch {0}/.write-probe-$$ && rm {0}/.write-probe-$$'"
    assert cluster.node_shell(0, probe.format("/mnt/vllm-wheelhouse"), check=False).returncode == 0
    for index in range(1, NODES):
        refused = cluster.node_shell(index, probe.format("/mnt/vllm-wheelhouse"), check=False)
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr, refused.stderr
        assert cluster.node_shell(index, probe.format("/mnt/vllm-models"), check=False).returncode == 0
        setup = cluster.outcomes[f"vllm-setup-{node_name(index)}"].stderr
        if cluster.fleet.baked_hosts:
            # Booted from the baked host image: the worker found its environment in place.
            assert "the virtualenv is the lock's environment already" in setup, setup
        else:
            assert "head fills the wheelhouse" in setup, setup


def test_every_node_has_the_locked_environment_the_nodes_own_install_step_put_there_offline(cluster):
    """No virtualenv is handed to the hosts. The node hosts booted from the host image, into
    which the node's own install step (`vllm-cluster-node bake`, setup's
    install_node_software) installed the stack's lock (nodeLock) once, with the locked uv from
    the wheelhouse the tests filled from this machine's registries: each node's setup found
    its environment already the lock, only checked it, and copied none of it into its own
    disk. Unbaked (VLLM_CLUSTER_FLEET_BAKED_HOSTS=0): each node's setup installed it itself."""
    lock_file, check = "/opt/vllm-cluster/node-env.lock", "/opt/vllm-cluster/bin/node-env check --lock"
    lock = node_env.local_host().lock_path.read_text()
    fingerprints = set()
    for index in range(NODES):
        assert cluster.node_shell(index, f"cat {lock_file}").stdout == lock
        setup = cluster.outcomes[f"vllm-setup-{node_name(index)}"].stderr
        if cluster.fleet.baked_hosts:
            assert "the virtualenv is the lock's environment already" in setup, setup
            assert "installing the locked environment" not in setup and "installing python" not in setup, setup
            # The environment stayed in the image's layer: the host's own holds no file of it.
            own_layer = cluster.fleet.nodes[index].dir / "upper" / "opt" / "vllm-cluster" / "venv"
            copied = [path for path in own_layer.rglob("*") if path.is_file()] if own_layer.exists() else []
            assert not copied, f"node{index} copied {len(copied)} files of the environment up, e.g. {copied[:3]}"
        else:
            assert "installing the locked environment" in setup and "installed the locked environment" in setup, setup
        assert "fetching" not in setup, "the wheelhouse was full: nothing to download"
        installed = cluster.node_shell(index, f"sudo /opt/vllm-cluster/venv/bin/python -I {check} {lock_file}")
        fingerprints.add(installed.stdout.strip())
        uv = cluster.node_shell(index, "/opt/vllm-cluster/bin/uv --version").stdout.split()
        assert uv[:2] == ["uv", versions.UV_VERSION]
    if cluster.fleet.baked_hosts:
        bake = (cluster.fleet.node_image.parent / "bake.log").read_text()
        assert "installed the locked environment" in bake and "baked the node software" in bake, bake
        assert "fetching" not in bake, bake
    assert len(fingerprints) == 1, f"the nodes' environments differ: {fingerprints}"
    # ... and the head's preflight compared every node's packages with the head's.
    report = cluster.outcomes["vllm-preflight"].stdout
    assert next(line for line in report.splitlines() if line.startswith("packages ")).count("ok") == NODES, report


def test_the_fabric_gate_measured_the_gangs_all_reduce_before_vllm_and_fails_a_floor_above_it(cluster):
    """Issue 35 point 4 on real hosts: every node ran its share of one all-reduce over the
    hosts' network (Gloo: the local hosts' torch is a CPU build) before vLLM started, and
    the head's gate passed naming the figure and its floor. Then the same gate with a
    floor above what the hosts reach (fabricFloorGBps, as a user would set it) fails,
    naming the measured figure, the floor and the likely causes."""
    outcomes = cluster.outcomes
    measured = json.loads(outcomes["vllm-fabric-head"].stdout)
    assert measured["backend"] == "gloo" and measured["nodes"] == NODES and measured["correct"] is True
    assert measured["busbw_gbps"] > 0
    for index in range(1, NODES):
        assert json.loads(outcomes[f"vllm-fabric-{node_name(index)}"].stdout)["completed"] is True
    gate = outcomes["vllm-fabric"]
    figure = f"{measured['busbw_gbps']:.3g} GB/s"
    assert gate.returncode == 0 and figure in gate.stdout and "0.03125 GB/s" in gate.stdout, gate.stdout
    # Before vLLM: the gate ended before the vllm command started.
    assert gate.finished <= outcomes["vllm-vllm"].started
    print(f"fabric gate on the fleet: {gate.stdout.strip()}")

    # A hundred times the figure (within what the key accepts): far above what the hosts reach.
    above = min(measured["busbw_gbps"] * 100, MAX_FABRIC_FLOOR_GBPS)
    assert above > measured["busbw_gbps"]
    updated = cluster.program(fabricFloorGBps=f"{above:g}")
    # The new floor judges the same measurement again and changes nothing else.
    assert changed_commands(cluster.run, updated) == {"vllm-fabric"}
    again = run_step(with_outputs(steps_of(updated, only={"vllm-fabric"})["vllm-fabric"], outcomes), timeout=300)
    assert again.returncode != 0
    assert f"{figure} is below the floor of {above:g} GB/s (fabricFloorGBps" in again.stderr, again.stderr
    assert "Likely causes: (1) wrong NIC" in again.stderr and "GLOO_SOCKET_IFNAME" in again.stderr
    # The service is untouched: the gate judges, it restarts nothing.
    assert cluster.completion() == 200


def test_setup_refuses_a_python_the_pinned_releases_do_not_accept(cluster):
    """On a real host with its own python3 (3.11 here): demand 3.13 or later, as a pin
    whose wheels dropped 3.11 would, and setup stops first, saying what to do."""
    worker = NODES - 1
    env = "/etc/vllm-cluster/cluster.env"
    cluster.node_shell(
        worker, f"sudo cp {env} /tmp/cluster.env.kept && sudo sed -i 's/^PYTHON_MIN=.*/PYTHON_MIN=3.13/' {env}"
    )
    try:
        refused = cluster.node_shell(worker, "sudo /opt/vllm-cluster/bin/vllm-cluster-node setup", check=False)
    finally:
        cluster.node_shell(worker, f"sudo cp /tmp/cluster.env.kept {env}")
    assert refused.returncode != 0
    assert "this node's Python is 3.11" in refused.stderr and ">=3.13,<3.15" in refused.stderr, refused.stderr
    assert "leave amiId empty" in refused.stderr
    assert "mounted" not in refused.stderr and "installing" not in refused.stderr, "it must stop before any work"


def limits(cluster, index: int, pid: str) -> dict[str, tuple[float, float]]:
    """/proc/PID/limits on a node: name -> (soft, hard), unlimited as infinity."""
    table = cluster.node_shell(index, f"sudo cat /proc/{pid}/limits").stdout.splitlines()[1:]
    found = {}
    for line in table:
        match = re.match(r"(.+?)\s{2,}(\S+)\s+(\S+)", line)
        found[match.group(1)] = tuple(float("inf") if v == "unlimited" else float(v) for v in match.group(2, 3))
    return found


def test_running_raylets_and_vllm_may_lock_all_the_memory_the_host_allows(cluster):
    """The limits of the running processes, not the unit files. This machine cannot grant
    more locked memory than its own hard limit (it lacks CAP_SYS_RESOURCE), so "all the
    host allows" is that limit here and unlimited on EC2; a service that does not lift
    its limits keeps the hosts' lower default (localhosts/fleet.py), as sshd shows."""
    for index in range(NODES):
        host_max = limits(cluster, index, "1")  # the host's init: the most any service can get
        default = limits(cluster, index, cluster.unit_property(index, "ssh.service", "MainPID"))
        pids = [cluster.node_shell(index, "pgrep -x raylet").stdout.split()[0]]
        if index == 0:
            pids.append(cluster.unit_property(0, "vllm.service", "MainPID"))
        for pid in pids:
            got = limits(cluster, index, pid)
            memlock, hard_memlock = got["Max locked memory"]
            assert memlock == hard_memlock == host_max["Max locked memory"][1] > default["Max locked memory"][0], got
            files = got["Max open files"][0]
            assert files == min(1048576, host_max["Max open files"][1]) > default["Max open files"][0], got


# --- idempotence and day 2 ---------------------------------------------------------------


def test_replaying_everything_again_restarts_nothing_and_downloads_nothing(cluster):
    before, downloads = pids(cluster), cluster.hub.downloads()
    assert downloads > 0
    again = replay(cluster.run)
    assert pids(cluster) == before
    assert cluster.hub.downloads() == downloads
    # Unchanged pins: each node checks its environment against the lock and installs nothing.
    for index in range(NODES):
        setup = again[f"vllm-setup-{node_name(index)}"]
        assert "the virtualenv is the lock's environment already" in setup.stderr, setup.stderr
        assert "installing" not in setup.stderr and "fetching" not in setup.stderr, setup.stderr
    for index in range(NODES):
        assert cluster.node_shell(index, "pgrep -c -x raylet").stdout.strip() == "1"
        # An unchanged model, revision and stage: the local copy is complete, nothing is copied.
        summary = json.loads(again[f"vllm-prepare-{node_name(index)}"].stdout.strip().splitlines()[-1])
        assert summary["bytes_copied"] == 0 and summary["mode"] == "local", summary
    assert cluster.completion() == 200


def changed_commands(before, after) -> set[str]:
    old = {c.name: c.inputs for c in before.of_type(COMMAND)}
    return {c.name for c in after.of_type(COMMAND) if old.get(c.name) != c.inputs}


def test_new_vllm_settings_restart_only_vllm(cluster):
    updated = cluster.program(gpuMemoryUtilization="0.8")
    changed = changed_commands(cluster.run, updated)
    # The memory share does not change vLLM's compiled graphs (engine_cache.warmup_key): the
    # nodes keep what the restarted engine compiled under the same key; nothing else restarts.
    assert changed == {"vllm-vllm", "vllm-readiness", *(f"vllm-warmup-{node_name(i)}" for i in range(NODES))}
    before, downloads = pids(cluster), cluster.hub.downloads()
    replay(updated, only=changed)  # what `pulumi up` would run: the commands whose inputs changed
    after = pids(cluster)
    assert after["vllm"] != before["vllm"]
    assert {k: v for k, v in after.items() if k != "vllm"} == {k: v for k, v in before.items() if k != "vllm"}
    assert cluster.hub.downloads() == downloads
    assert "--gpu-memory-utilization 0.8" in cluster.node_shell(0, "sudo cat /etc/vllm-cluster/vllm.env").stdout
    cluster.run = updated
    cluster.config["gpuMemoryUtilization"] = "0.8"


NEW_REVISION = "v2"


def test_a_new_revision_is_downloaded_once_copied_to_every_node_and_served(cluster):
    """A stack's new modelRevision: gang 0's nodes download it once, in parts; each node
    copies its stage of it to its own disk and drops the old revision's copy (it must
    not fill the instance store); vLLM serves it; nothing but the model's commands, the
    engine and its checks runs again."""
    updated = cluster.program(modelRevision=NEW_REVISION)
    changed = changed_commands(cluster.run, updated)
    # The revision is part of the warm-up key (a new compile) and of what preflight checks.
    per_node = {f"vllm-{step}-{node_name(i)}" for i in range(NODES) for step in ("prepare", "warmup", "preflight")}
    parts = {f"vllm-model-part-{node_name(i)}" for i in range(1, NODES)}
    assert changed == {"vllm-model", *parts, *per_node, "vllm-preflight", "vllm-vllm", "vllm-readiness"}, changed
    before = pids(cluster)
    outcomes = replay(updated, only=changed)
    cluster.run = updated
    cluster.config["modelRevision"] = NEW_REVISION
    weights_and_tokenizer = sorted(p.name for p in tiny_model().iterdir())
    assert downloads_per_file(cluster.hub, NEW_REVISION) == dict.fromkeys(weights_and_tokenizer, 1)
    new_local = local_model_directory(MODEL, NEW_REVISION)
    for index in range(NODES):
        prepare = outcomes[f"vllm-prepare-{node_name(index)}"]
        summary = json.loads(prepare.stdout.strip().splitlines()[-1])
        # The stage's weight files and the config and tokenizer beside them, all new.
        assert summary["mode"] == "local" and summary["bytes_copied"] > summary["stage_bytes"] > 0, summary
        assert f"removed the old local copy {LOCAL_MODEL}" in prepare.stderr, prepare.stderr
        assert cluster.node_shell(index, f"sudo test -e {LOCAL_MODEL}", check=False).returncode == 1
        assert len(weight_files(cluster, index, new_local)) == len(summary["files"])
    assert f'SERVE_ARGS="{new_local} ' in cluster.node_shell(0, "sudo cat /etc/vllm-cluster/vllm.env").stdout
    after = pids(cluster)
    assert after.pop("vllm") != before.pop("vllm") and after == before, (before, after)
    assert cluster.completion() == 200


def test_a_file_planted_or_changed_on_the_model_cache_is_refused_at_a_nodes_staging(cluster):
    """Issue 33, point 3: a node stages only the bytes the Hub listed for the model. A
    writer of the cache that plants a file in the model's tree (code a model could load
    with trust_remote_code), or changes one, gets the next node's staging refused naming
    it, instead of the node serving it; once the cache holds the Hub's bytes again the
    node stages them."""
    saved = cluster.node_shell(1, "sudo cat /etc/vllm-cluster/prepare-serve.args").stdout.split()
    model_dir = saved[saved.index("--model-dir") + 1]
    local_dir = saved[saved.index("--local-dir") + 1]
    stage_again = "sudo /opt/vllm-cluster/bin/vllm-cluster-node prepare-serve --saved"
    planted, original = f"{model_dir}/planted_code.py", "/root/config.json.issue-33"
    try:
        # A writer (gang 0's head) plants a file.
        cluster.node_shell(0, f"echo 'import os' | sudo tee {planted} >/dev/null")
        refused = cluster.node_shell(1, stage_again, check=False)
        assert refused.returncode != 0 and "planted_code.py" in refused.stderr, refused.stderr
        cluster.node_shell(0, f"sudo rm {planted}")
        # ... or changes a file's bytes (its size kept), and a node copies it again (here the
        # node's copy of it is gone; a replaced node has no copy at all).
        cluster.node_shell(
            0, f"sudo cp -p {model_dir}/config.json {original} && sudo sed -i '1s/{{/[/' {model_dir}/config.json"
        )
        cluster.node_shell(1, f"sudo rm {local_dir}/config.json")
        refused = cluster.node_shell(1, stage_again, check=False)
        assert refused.returncode != 0 and "config.json" in refused.stderr, refused.stderr
    finally:
        cluster.node_shell(
            0, f"sudo rm -f {planted}; if sudo test -e {original}; then sudo mv {original} {model_dir}/config.json; fi"
        )
    staged = cluster.node_shell(1, stage_again, check=False)
    assert staged.returncode == 0, staged.stderr
    assert cluster.node_shell(1, f"sudo test -s {local_dir}/config.json", check=False).returncode == 0


def test_a_node_seeded_from_the_kept_warmup_finds_the_engines_compile_cache(cluster):
    """What the engine compiled is kept on the shared cache under its key (warmup-<node>
    published it after serving). A node whose own cache is empty (a replaced node, a
    second gang) seeds from there before the engine starts, and the engine finds the
    compiled model. The CPU build cannot load its own saved graph ("Compiling model
    again due to a load failure from <the path>": the file is found, the load fails on
    its CPU platform) and recompiles with Inductor's kernels from the seeded cache; the
    GPU build loads it ("Directly load AOT compilation from path")."""
    shared = f"/mnt/vllm-models/warmup/{cluster.warmup_key()}"
    kept = cluster.node_shell(0, f"find {shared} -path '*/rank_*' -name model -printf '%P\\n'").stdout.split()
    ranks = NODES * GPUS_PER_NODE  # PP = nodes, TP 1: one rank a GPU
    assert {path.split("/")[-2] for path in kept} == {f"rank_{r}_0" for r in range(ranks)}, kept
    for index in range(NODES):
        cluster.node_shell(index, f"sudo rm -rf {ENGINE_CACHE}")
        seeded = cluster.node_shell(index, "sudo /opt/vllm-cluster/bin/vllm-cluster-node prepare-serve --saved")
        said = re.search(r"seeded (\d+) of (\d+) pieces", seeded.stderr)
        assert said and int(said.group(1)) == int(said.group(2)) > 0, seeded.stderr
    since = float(cluster.node_shell(0, "date +%s.%N").stdout)
    cluster.node_shell(0, "sudo systemctl restart vllm.service")
    cluster.wait_for_completion(timeout=600)
    found = re.compile(
        r"(Compiling model again due to a load failure from|Directly load AOT compilation from path) "
        rf"{re.escape(ENGINE_CACHE)}/torch_compile_cache/\S+/rank_\d+_\d+/model"
    )
    said = [line for line in journal(cluster, "vllm.service", since) if found.search(line)]
    assert said, "the engine's log does not say it found its compiled model in the seeded cache"
    inits = cluster.engine_inits()
    print(
        f"engine init: {inits[-2]:.1f} s compiling the new revision, {inits[-1]:.1f} s seeded from the kept "
        f"warm-up; the engine said: {said[0]}"
    )
    for index in range(NODES):  # what the nodes seeded is still there for the next start
        local = cluster.node_shell(index, f"sudo find {ENGINE_CACHE} -path '*/rank_*' -name model")
        assert local.stdout.strip(), f"node {index} lost its compiled model"


# --- operator tools against the fleet ------------------------------------------------------


def test_preflight_passes_on_a_healthy_cluster(cluster):
    result = cluster.operator("preflight")
    assert result.returncode == 0, result.stdout + result.stderr
    table = result.stdout.splitlines()
    assert table[0].split() == ["check", "head", *[f"worker-{i}" for i in range(1, NODES)]]
    for check in ("python", "ray", "vllm", "packages", "gpus", "interface", "model", "gcs"):
        row = next(line for line in table if line.startswith(check + " "))
        assert "XX" not in row and row.count("ok") == NODES, row


def test_preflight_names_the_node_with_another_ray_version(cluster):
    metadata = "/opt/vllm-cluster/venv/lib/python3.11/site-packages/ray-*.dist-info/METADATA"
    worker = 1
    # As root: setup installs the virtualenv under its umask 077, readable by root only.
    cluster.node_shell(
        worker,
        f"sudo sh -c \"sed 's/^Version: .*/Version: 2.59.0/' {metadata} > /tmp/METADATA && "
        f'mount --bind /tmp/METADATA {metadata}"',
    )
    try:
        result = cluster.operator("preflight")
    finally:
        cluster.node_shell(worker, f"sudo sh -c 'umount {metadata}'")
    assert result.returncode == 1
    assert "worker-1: ray is 2.59.0" in result.stderr, result.stderr
    # The whole environment is compared too: the first (here the only) package that differs.
    assert f"worker-1: packages differ from head's: ray is 2.59.0 here, {RAY_VERSION} on head" in result.stderr
    assert "head: ray" not in result.stderr and "head: packages" not in result.stderr


def test_status_is_healthy_with_metrics(cluster):
    result = cluster.operator("status", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["verdict"] == "healthy", report["problems"]
    assert report["ray"] == {
        "nodes": NODES,
        "expectedNodes": NODES,
        "gpus": NODES * GPUS_PER_NODE,
        "expectedGpus": NODES * GPUS_PER_NODE,
    }
    assert report["completion"]["status"] == 200 and report["completion"]["seconds"] > 0
    assert set(report["metrics"]) == {"running", "waiting", "kv_cache_usage", "tokens_per_second"}
    printed = cluster.operator("status")
    assert printed.returncode == 0 and "HEALTHY" in printed.stdout


def test_status_watch_redraws_in_place(cluster):
    args = [
        str(ROOT / "scripts" / "vllm-cluster"),
        "status",
        "--watch",
        "--interval",
        "1",
        *cluster.operator_files(cluster.fleet.workdir),
    ]
    # Ctrl-C as in a terminal: a test run started in the background inherits SIGINT
    # ignored, and so would the tool; it gets the default disposition back.
    process = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    clear, header = b"\x1b[H\x1b[2J", b"vllm-cluster status:"
    out = b""
    # A refresh takes a few seconds (SSH to the head, two metric samples, a completion):
    # read until three frames have been drawn whole, then Ctrl-C. Starved beside the other
    # fleet, one refresh (its SSH, samples, completion and Prometheus queries) can take 20 s.
    deadline = time.monotonic() + 180
    while out.count(clear) < 3 or header not in out.rsplit(clear, 1)[1]:
        assert time.monotonic() < deadline and process.poll() is None, out[-500:]
        if select.select([process.stdout], [], [], 5)[0]:
            out += os.read(process.stdout.fileno(), 65536)
    process.send_signal(signal.SIGINT)
    out += process.communicate(timeout=60)[0]
    frames = out.decode().split(clear.decode())
    assert frames[0] == "" and len(frames) >= 4, out[-500:]
    assert all(frame.count("vllm-cluster status:") == 1 for frame in frames[1:4])
    assert process.returncode == 0


def test_status_watch_draws_the_trends_as_charts_in_a_terminal(cluster, tmp_path):
    """In a real terminal (tmux): each frame has the gang's charts of the last 15 minutes
    for tokens/s, TTFT p95 and the queue, drawn from Prometheus's range query, with the
    lowest, highest and last value beside each."""
    assert cluster.completion() == 200
    session = f"vllm-cluster-status-{os.getpid()}"
    # A tmux server of the test's own, on a socket in its folder: the default one would leave
    # /tmp/tmux-0 behind, and share a server with the user's sessions.
    tmux = ["tmux", "-S", str(tmp_path / "tmux.socket")]
    command = shlex.join(
        [
            str(ROOT / "scripts" / "vllm-cluster"),
            "status",
            "--watch",
            "--interval",
            "2",
            *cluster.operator_files(cluster.fleet.workdir),
        ]
    )
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", session, "-x", "220", "-y", "70", "-c", str(ROOT), command], check=True
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True, check=True
            ).stdout
            charts = {
                label: line
                for line in screen.splitlines()
                for label in ("tokens/s", "TTFT p95", "waiting")
                if re.search(rf"(15 min|^)\s+{re.escape(label)}\s+[ ▁▂▃▄▅▆▇█]+  (min |no data)", line)
            }
            if len(charts) == 3 and "15 min" in screen:
                break
            assert time.monotonic() < deadline, f"no charts within 120 s; the terminal shows:\n{screen}"
            time.sleep(2)
        assert "min " in charts["tokens/s"] and re.search(r"[▁▂▃▄▅▆▇█]", charts["tokens/s"]), charts
        assert screen.count("vllm-cluster status:") == 1, screen  # redrawn in place, not appended
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)


# --- faults --------------------------------------------------------------------------------


def test_a_powered_off_worker_is_named_rejoins_its_raylet_restarts_and_a_rebooted_head_brings_all_back(cluster):
    """A worker lost: the readiness command fails naming it, and so does `status`. The real
    engine does not serve without a pipeline stage (its Ray worker is gone with the node and
    the engine exits or hangs), so the verdict is degraded while vLLM still answers /health
    and down once it does not; either way the lost worker is named and the exit code is not 0.
    Booted again, it rejoins; its raylet, killed then, is restarted by systemd. Then the
    head reboots: Ray's new head starts, the worker's raylet (which lost its GCS) rejoins
    it, and serving recovers (the watchdog restarts vLLM once every node is back). One
    engine start for the three failures: each costs the real engine about a minute and a
    half here."""
    worker = NODES - 1
    lost = cluster.fleet.nodes[worker]
    cluster.fleet.power_off(lost)
    outcome = replay(cluster.run, only={"vllm-readiness"}, check=False)["vllm-readiness"]
    assert outcome.returncode != 0
    named = f"worker-{worker} ({lost.ip})"
    assert named in outcome.stderr, outcome.stderr
    deadline = time.monotonic() + 90
    while True:
        result = cluster.operator("status")
        if (result.returncode in (1, 2) and f"{named} is not in the Ray cluster" in result.stdout) or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(3)
    assert result.returncode in (1, 2), result.stdout
    assert ("DEGRADED" if result.returncode == 1 else "DOWN") in result.stdout
    assert f"{named} is not in the Ray cluster" in result.stdout, result.stdout
    cluster.fleet.boot(lost)
    deadline = time.monotonic() + 300
    while ray_status(cluster)[0] < NODES:
        assert time.monotonic() < deadline, f"{named} did not rejoin Ray within 300 s of its boot"
        time.sleep(3)
    restarts = int(cluster.unit_property(worker, "ray-worker.service", "NRestarts"))
    cluster.node_shell(worker, "sudo pkill -KILL -x raylet")
    deadline = time.monotonic() + 120
    while int(cluster.unit_property(worker, "ray-worker.service", "NRestarts")) == restarts:
        assert time.monotonic() < deadline, "systemd did not restart ray-worker after its raylet was killed"
        time.sleep(2)
    # A machine's boot starts with no nftables table; the fleet's host keeps its network
    # namespace, and the tables in it, across a reboot: take the firewall away as a boot would.
    cluster.node_shell(0, "sudo nft delete table inet vllm_cluster")
    cluster.fleet.reboot(cluster.head)
    cluster.wait_for_completion(timeout=600)
    # Issue 34 point 3: a reboot keeps the instance store (EC2 empties it only on a stop):
    # the image's unit (its stand-in) mounted it again before the staging ran, which found
    # its copy complete there and copied nothing.
    prepared = cluster.node_shell(0, "sudo journalctl -b -o cat -u vllm-prepare.service").stdout
    assert "nothing copied" in prepared, prepared
    # The head's GCS is a new one after the reboot: every node counted has joined it.
    assert ray_status(cluster) == (NODES, float(NODES * GPUS_PER_NODE))
    # Ray's unit loaded the firewall again before Ray listened.
    for port in (ports.VLLM_API, ports.RAY_METRICS, ports.RAY_GCS):
        assert dialled_from_here(cluster.head.ip, port) == "refused", port
    assert replay(cluster.run, only={"vllm-readiness"})["vllm-readiness"].returncode == 0


# --- the watchdog under load, and the gateway's keep-alive -----------------------------------

# Long completions that keep the engine's batch full (--max-num-seqs in fleet_config):
# a request sent behind them waits for several of them to finish.
LONG_COMPLETION_TOKENS = 2000
LOAD_STREAMS = 8


@contextmanager
def engine_saturated(cluster):
    """LOAD_STREAMS streams of long completions through the gateway, each replaced as
    it ends, until the block exits (then every stream is closed: vLLM aborts them)."""
    import openai

    stop = threading.Event()
    errors: list[str] = []

    def stream_until_stopped() -> None:
        client = openai_client(cluster)
        while not stop.is_set():
            try:
                with client.completions.create(
                    model=MODEL,
                    prompt="Hello",
                    max_tokens=LONG_COMPLETION_TOKENS,
                    stream=True,
                    extra_body={"ignore_eos": True},
                ) as stream:
                    for _ in stream:
                        if stop.is_set():
                            break
            except openai.APIError as error:  # a restarted engine drops them: send again
                errors.append(str(error))
                stop.wait(2)

    threads = [threading.Thread(target=stream_until_stopped, daemon=True) for _ in range(LOAD_STREAMS)]
    for thread in threads:
        thread.start()
    try:
        yield errors
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=150)


def wait_for_waiting_requests(cluster, count: int, timeout: float = 60) -> None:
    """Until vLLM's own gauge shows `count` requests waiting (read on the head)."""
    metrics = "curl -s http://$NODE_IP:$PORT_VLLM_API/metrics"
    deadline = time.monotonic() + timeout
    while True:
        if metric_totals(head_shell(cluster, metrics).stdout).get("vllm:num_requests_waiting", 0) >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} requests waiting after {timeout:g} s"
        time.sleep(1)


def journal(cluster, unit: str, since: float) -> list[str]:
    return cluster.node_shell(
        0, f"sudo journalctl -u {unit} --since @{int(since)} -o cat --no-pager"
    ).stdout.splitlines()


def watchdog_lines(cluster, since: float) -> list[str]:
    return [line for line in journal(cluster, "vllm-watchdog.service", since) if "watchdog:" in line]


def test_a_saturated_server_is_left_alone_and_a_hung_one_is_restarted_in_bounded_time(cluster):
    """Under load a completion can wait longer than the watchdog's probe (60 s) while the
    engine runs a full batch and produces tokens: that server is busy, not dead, and a
    restart would drop every request in flight. Two watchdog runs in a row see it and
    leave it (a restart needs two dead verdicts in a row), each judging by the tokens.

    Then, under the same load, the real engine's failure: a pipeline stage stops
    answering (here its Ray worker is frozen with SIGSTOP) with requests in the batch.
    /health stays 200, the gauges freeze and no token comes: two watchdog runs that see
    requests and no token restart vLLM. A hung engine ignores SIGTERM: the unit kills it
    after TimeoutStopSec, so the restart is bounded, and serving recovers. While the new
    engine loads, `status` says down: vLLM is not serving. (One saturation for both: the
    hang comes once the busy server was left alone.)"""
    cluster.wait_for_completion(timeout=300)
    pid = cluster.unit_property(0, "vllm.service", "MainPID")
    stop_timeout = unit_seconds(cluster.unit_property(0, "vllm.service", "TimeoutStopUSec"))
    last = NODES - 1
    with engine_saturated(cluster):
        # Counted from a full batch with requests waiting behind it: a watchdog run that
        # started before the load may get its completion in time, and judges nothing.
        wait_for_waiting_requests(cluster, LOAD_STREAMS - 3)
        since = time.time()
        deadline = time.monotonic() + 480
        # status, meanwhile (within the watchdog's two runs): the head's completion may
        # wait out its 30 s behind the batch, but a busy server is not down.
        seen = cluster.operator("status", "--json")
        report = json.loads(seen.stdout)
        gang = report["gangs"][0]
        assert seen.returncode != 2 and gang["serving"], seen.stdout
        if gang["completion"]["status"] != 200:
            assert any(p.startswith("vLLM is saturated") for p in gang["problems"]), gang
        # Prometheus sees the queue, and no engine down: its scrapes of the busy server work.
        waiting_deadline = time.monotonic() + 90
        while not any(v > 0 for v in cluster.prometheus_query(f'{metrics.REQUESTS_WAITING}{{gang="gang0"}}').values()):
            assert time.monotonic() < waiting_deadline, "Prometheus saw no request waiting within 90 s"
            time.sleep(5)
        # Prometheus's scrapes reach the busy server (one within the last minute: a single
        # scrape that a starved machine let time out says nothing), and no engine-down alert
        # fires (a pending one, from such a scrape, is no engine down).
        up = cluster.prometheus_query('max_over_time(up{job="vllm",gang="gang0"}[1m])')
        assert up == {("gang0", node_name(0)): 1.0}, up
        assert not [
            a
            for a in cluster.prometheus_alerts()
            if a["labels"]["alertname"] == "VllmEngineDown" and a["state"] == "firing"
        ]
        while True:
            lines = watchdog_lines(cluster, since)
            assert cluster.unit_property(0, "vllm.service", "MainPID") == pid, (
                "the watchdog restarted a saturated server:\n" + "\n".join(lines)
            )
            busy = [line for line in lines if "watchdog: busy" in line]
            if len(busy) >= 2:
                break
            assert time.monotonic() < deadline, "fewer than 2 watchdog runs saw the load:\n" + "\n".join(lines)
            time.sleep(5)
        assert not any("watchdog: dead" in line for line in lines), lines
        assert sum("tokens in" in line for line in busy) >= 2, busy  # judged by the tokens it produced

        # The hang, with the batch still full.
        hung_since = time.time()
        # vLLM's Ray actors on that node (RayWorkerProc in vLLM 0.32's executor, RayWorkerWrapper before).
        frozen = cluster.node_shell(last, "pgrep -f '^ray::RayWorker'").stdout.split()
        assert frozen, f"no vLLM Ray worker on worker-{last}"
        cluster.node_shell(last, f"sudo kill -STOP {' '.join(frozen)}")
        try:
            deadline = time.monotonic() + 480
            while cluster.unit_property(0, "vllm.service", "MainPID") in (pid, "0"):
                assert time.monotonic() < deadline, "the watchdog left a hung engine:\n" + "\n".join(
                    watchdog_lines(cluster, hung_since)
                )
                time.sleep(3)
        finally:
            # Killed with the old engine's job as a rule; if one is left, it must not stay frozen.
            cluster.node_shell(last, f"sudo kill -CONT {' '.join(frozen)}", check=False)
    # The new engine's process has just started: it answers nothing for tens of seconds
    # (its imports alone take longer than this check).
    down = cluster.operator("status")
    assert down.returncode == 2, down.stdout
    assert "DOWN" in down.stdout and "vLLM is not serving" in down.stdout, down.stdout
    lines = watchdog_lines(cluster, hung_since)
    restart = [line for line in lines if "watchdog: dead" in line and "no token" in line and "restarting" in line]
    assert restart, lines
    stopped = stop_seconds(cluster, hung_since)
    assert stopped <= stop_timeout + 15, f"vllm.service took {stopped:.0f} s to stop (TimeoutStopSec {stop_timeout:g})"
    cluster.wait_for_completion(timeout=600)


def unit_seconds(value: str) -> float:
    """systemd's time span ('2min', '1min 30s', '45s', '500ms') in seconds."""
    units = {"ms": 0.001, "s": 1, "min": 60, "h": 3600}
    return sum(float(number) * units[unit] for number, unit in re.findall(r"([\d.]+)(ms|min|h|s)", value))


def stop_seconds(cluster, since: float) -> float:
    """How long the first stop of vllm.service since `since` took: systemd's "Stopping"
    to its "Stopped" (journal lines of the unit, with their times)."""
    log = cluster.node_shell(
        0, f"sudo journalctl -u vllm.service --since @{int(since)} -o short-unix --no-pager"
    ).stdout.splitlines()
    stopping = next((line for line in log if " Stopping " in line), None)
    stopped = next((line for line in log[log.index(stopping) :] if " Stopped " in line), None) if stopping else None
    assert stopping and stopped, "vllm.service's log since the hang shows no stop:\n" + "\n".join(log[-40:])
    return float(stopped.split()[0]) - float(stopping.split()[0])


def longest_silence(cluster, unit: str, since: float) -> float:
    """The longest time between two lines of `unit`'s journal on the head since `since`."""
    log = cluster.node_shell(
        0, f"sudo journalctl -u {unit} --since @{int(since)} -o short-unix --no-pager -q"
    ).stdout.splitlines()
    times = [float(line.split()[0]) for line in log if re.match(r"^\d+\.\d+ ", line)]
    return max((later - earlier for earlier, later in itertools.pairwise(times)), default=0.0)


def freeze_unit(cluster, index: int, unit: str, within: float = 60) -> None:
    """SIGSTOP every process of `unit` (its whole control group) and return once each one
    is stopped. One `systemctl kill --signal=SIGSTOP` is not enough: while the engine
    starts processes, systemd 252 failed it in CI ("Failed to send signal SIGSTOP to
    auxiliary processes: Input/output error") and left part of the engine running; and a
    process started after the signal would not be frozen. So: signal what is in the unit's
    group, look at every process's state, again until none is left running. The group's
    members are read from /proc/PID/cgroup, which names it in every cgroup layout (the
    test hosts mount a hybrid one under systemd-nspawn, the node image the unified one)."""
    freeze = (
        f"cg=$(systemctl show -P ControlGroup {unit}); "
        '[ -n "$cg" ] || { echo "no control group"; exit 2; }; '
        "pids=$(grep -lE \":$cg(/|\\$)\" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 | tr '\\n' ' '); "
        '[ -n "${pids// /}" ] || { echo "no process in $cg"; exit 2; }; '
        "sudo kill -STOP $pids; "
        'running=$(ps -o pid=,stat= -p "$(echo $pids | tr " " ,)" | awk \'$2 !~ /^[Tt]/\'); '
        '[ -z "$running" ] || { echo "still running: $running"; exit 1; }'
    )
    deadline = time.monotonic() + within
    while True:
        done = cluster.node_shell(index, freeze, check=False)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, f"{unit} not frozen within {within:g} s: {done.stdout}{done.stderr}"
        time.sleep(0.5)


def test_a_start_that_hangs_fails_within_the_planned_bound_naming_the_cause(cluster):
    """Issue 34, point 5: the head's `vllm` command (start-vllm, as the program declared it)
    waits for a start that makes progress, however long, but not for one that is stuck.
    Here the real engine hangs at start: once it wrote its first lines, every process of
    vllm.service is frozen (SIGSTOP): it writes nothing more and never answers. The command
    fails once the journal has been silent for the bound the program handed it
    (--stall-seconds, sizing.engine_start_stall_for), not after its 45-minute timeout,
    shows the journal's last lines and says the engine's processes are stopped, and stops
    the unit. The same command again starts the engine afresh and serves."""
    step = with_outputs(steps_of(cluster.run, only={"vllm-vllm"})["vllm-vllm"], {})
    bound = int(re.search(r"--stall-seconds (\d+)", step.create).group(1))
    since = float(cluster.node_shell(0, "date +%s.%N").stdout)
    cluster.node_shell(0, "sudo systemctl stop vllm.service")  # so that start-vllm starts it
    waited: dict[str, object] = {}
    waiting = threading.Thread(target=lambda: waited.update(outcome=run_step(step, timeout=bound + 900)), daemon=True)
    waiting.start()
    # The engine's own first line (after the unit's wait for the cluster), then the hang.
    deadline = time.monotonic() + 600
    while True:
        pid = cluster.unit_property(0, "vllm.service", "MainPID")
        own = f"sudo journalctl _SYSTEMD_UNIT=vllm.service _PID={pid} --since @{int(since)} -o cat -q --no-pager"
        if pid != "0" and cluster.node_shell(0, own, check=False).stdout.strip():
            break
        assert waiting.is_alive(), f"start-vllm ended before the engine wrote a line: {waited}"
        assert time.monotonic() < deadline, "the engine wrote no line within 600 s of its start"
        time.sleep(1)
    try:
        freeze_unit(cluster, 0, "vllm.service")
        frozen_at = time.monotonic()
        last_line = journal(cluster, "vllm.service", since)[-1]
        waiting.join(timeout=bound + 900)
        assert not waiting.is_alive(), f"start-vllm still waits {time.monotonic() - frozen_at:.0f} s after the hang"
    finally:
        # start-vllm stops the unit (systemd sends SIGCONT with its SIGTERM); if it did not, thaw it.
        cluster.node_shell(0, "sudo systemctl kill --signal=SIGCONT vllm.service", check=False)
    outcome = waited["outcome"]
    seconds = outcome.finished - frozen_at
    print(f"start-vllm failed {seconds:.0f} s after the engine froze (bound {bound} s); it said:\n{outcome.stderr}")
    assert outcome.returncode != 0, outcome.stderr
    assert "vLLM's start is stuck, not slow" in outcome.stderr, outcome.stderr
    assert "vllm.service wrote no line for" in outcome.stderr, outcome.stderr
    assert "its processes are stopped (a SIGSTOP or a debugger)" in outcome.stderr, outcome.stderr
    assert last_line in outcome.stderr, f"the journal's last line {last_line!r} is not shown"
    # Within the bound and the wait's own step (a probe may take curl's 60 s, then 10 s
    # until the next): from the engine's last line (just before the freeze) to the first
    # look at the journal after it, and from the bound to the look that finds it over.
    assert bound - 30 <= seconds <= bound + 2 * 70 + 10, seconds
    # Stopped, so the stuck engine holds no GPU: "failed" when the engine, woken by the
    # SIGCONT systemd sends with its SIGTERM, exits non-zero (as measured on the fleet),
    # "inactive" when it exits cleanly; either way the next start-vllm starts it afresh.
    assert cluster.unit_property(0, "vllm.service", "ActiveState") in ("inactive", "failed")

    # The same command again: a fresh start, which makes progress and serves.
    restarted = float(cluster.node_shell(0, "date +%s.%N").stdout)
    again = run_step(step, timeout=bound + 900)
    assert again.returncode == 0, again.stderr
    silence = longest_silence(cluster, "vllm.service", restarted)
    print(f"the fresh start's longest silence in its journal: {silence:.0f} s (bound {bound} s)")
    assert silence < bound
    cluster.wait_for_completion(timeout=600)


def test_requests_spaced_around_the_servers_keep_alive_get_no_502(cluster):
    """vLLM's server (uvicorn) closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    (5 s); nginx keeps idle upstream connections for its own keepalive_timeout. When the
    server's is the shorter, a request nginx sends on a connection as the server closes
    it fails: 502. Requests through the endpoint on one client connection (so a gap is
    the upstream connection's idle time, to a millisecond), with gaps that sweep the
    server's 5 s, for about a minute: no 502, and the server never closed an idle
    connection the gateway still held. The race is a few milliseconds wide (measured with
    nginx 1.22: about 1 in 3 requests idle 5.001-5.004 s got a 502, none at 5.2-5.5 s,
    where nginx has seen the close), so the second check is the one that fails on every
    run where the gateway holds idle connections longer than the server: the side that
    closes a TCP connection first keeps it in TIME_WAIT (60 s on Linux), so a connection
    from the gateway in TIME_WAIT on the head is one the server closed. Two thirds of the
    gaps are over 5 s: each of them is a connection the server would close first; that
    check needs a few such gaps, not a long sweep."""
    import http.client
    from urllib.parse import urlsplit

    cluster.wait_for_completion(timeout=300)
    gateway = urlsplit(cluster.endpoint).hostname
    body = json.dumps({"model": cluster.served_model, "prompt": "Hi", "max_tokens": 1})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {cluster.api_key}"}
    connection = http.client.HTTPSConnection(gateway, 443, context=cluster.tls(), timeout=60)
    closed_by_server = f"ss -Htn state time-wait '( sport = :8000 and dst {gateway} )'"
    # What is in TIME_WAIT already was closed before the sweep: by the engine the last
    # test killed (a process that exits closes its connections first), not by a keep-alive.
    earlier = set(cluster.node_shell(0, closed_by_server).stdout.split("\n"))
    # Prometheus on the gateway scrapes vLLM on the same port every 15 s and leaves its
    # connection idle past the server's 5 s: the server closes those, and no scrape comes
    # near that moment. Only nginx's connections count: those it holds to the head, seen
    # on the gateway (with their process) right after each response, idle in its pool.
    held_by_nginx = f"sudo ss -Htnp state established '( dport = :8000 and dst {cluster.head.ip} )'"
    nginx_ports: set[str] = set()
    results, gap, closed = [], None, set()
    for i in range(13):
        connection.request("POST", "/v1/completions", body, headers)
        response = connection.getresponse()
        response.read()
        answered = time.monotonic()
        nginx_ports |= {
            line.split()[2].rsplit(":", 1)[1]
            for line in cluster.fleet.ssh(cluster.fleet.gateway, held_by_nginx).stdout.splitlines()
            if '(("nginx"' in line
        }
        if gap is not None:
            results.append((round(gap, 4), response.status))
        if i % 4 == 0:  # within TIME_WAIT's 60 s of every connection of the last ones
            closed.update(cluster.node_shell(0, closed_by_server).stdout.split("\n"))
        gap = 4.990 + 0.030 * ((i * 0.6180339887) % 1)  # spread evenly over 4.990-5.020 s
        time.sleep(max(0.0, gap - (time.monotonic() - answered)))
    connection.close()
    closed.update(cluster.node_shell(0, closed_by_server).stdout.split("\n"))
    closed -= earlier | {""}
    assert nginx_ports, "nginx held no connection to the head after a response: its keepalive pool is off"
    closed = {line for line in closed if line.split()[3].rsplit(":", 1)[1] in nginx_ports}
    failed = [(gap, status) for gap, status in results if status != 200]
    assert not failed and not closed, (
        f"{len(failed)} of {len(results)} requests failed (gap s, status): {failed}; the server closed "
        f"{len(closed)} idle connections the gateway still held. The gateway must drop idle upstream "
        "connections before the server's VLLM_HTTP_TIMEOUT_KEEP_ALIVE (nginx keepalive_timeout in the upstream)"
    )


def test_a_bad_config_never_reaches_the_hosts():
    run = run_program(
        {
            "model": MODEL,
            "instanceType": "g5.12xlarge",
            "nodes": 2,
            "tensorParallelSize": 8,
            "apiAllowedCidrs": ["10.99.0.0/16"],
            "adminCidrs": ["0.0.0.0/0"],
        },
        stack="fleet",
    )
    assert run.error is not None and "adminCidrs" in str(run.error)
    assert run.of_type(COMMAND) == [] and run.resources == []


def test_destroy_removes_what_the_stack_put_on_the_hosts_and_leaves_them_and_the_models(cluster):
    """`pulumi destroy` of a stack of hosts: each machine's delete (vllm-cluster-remove),
    the GPU hosts before the gateway they are reached through. Nothing of the stack is
    left on them (units, processes, scripts, environment, secrets, mounts, the login
    probe's key, the host firewall's table, the gateway's site and Prometheus), and the
    machines, a firewall table of their own and the models on the shared directory stay."""
    models = cluster.fleet.shared / "models"
    kept = sorted(str(path.relative_to(models)) for path in models.rglob("*") if path.is_file())
    assert kept, "the stack staged no model on the shared directory"
    # A table of the host's own beside the stack's firewall: the removal leaves it.
    own = "table inet users_own { chain input { type filter hook input priority 10; tcp dport 9999 counter accept; }; }"
    for host in cluster.fleet.nodes:
        cluster.fleet.ssh(host, f"sudo nft '{own}'")
    outcomes = destroy(cluster.run)
    nodes = [f"vllm-host-{node_name(index)}" for index in range(NODES)]
    assert sorted(outcomes) == sorted(["vllm-host-gateway", *nodes])
    assert all(outcomes[node].finished <= outcomes["vllm-host-gateway"].started for node in nodes)
    gone = "/opt/vllm-cluster /etc/vllm-cluster /var/lib/vllm-cluster /var/cache/vllm-cluster /var/log/vllm-cluster"
    for host in cluster.fleet.hosts:
        # The machine stays, and its login: the user's key still gets in.
        left = cluster.fleet.ssh(host, f"sudo ls -d {gone} 2>/dev/null; true").stdout.split()
        assert left == [], (host.name, left)
        keys = cluster.fleet.ssh(host, "cat ~/.ssh/authorized_keys").stdout
        assert "vllm-cluster-login-probe" not in keys and keys.strip(), (host.name, keys)
        assert "vllm-cluster" not in cluster.fleet.ssh(host, "cat /etc/fstab").stdout, host.name
    units = "ray-head.service ray-worker.service vllm.service vllm-watchdog.timer vllm-prepare.service"
    for index, host in enumerate(cluster.fleet.nodes):
        listed = cluster.fleet.ssh(host, f"systemctl list-unit-files --no-legend {units}", check=False)
        assert listed.stdout.strip() == "", (host.name, listed.stdout)  # none left (it exits 1 then)
        for process in ("raylet", "gcs_server"):
            assert cluster.fleet.ssh(host, f"pgrep -x {process}", check=False).returncode != 0, (host.name, process)
        assert cluster.fleet.ssh(host, "mountpoint -q /mnt/vllm-models", check=False).returncode != 0, host.name
        # The service user and its rule against the metadata service are gone too.
        assert cluster.fleet.ssh(host, "id vllm-cluster", check=False).returncode != 0, host.name
        rules = cluster.fleet.ssh(host, "sudo iptables -w -S OUTPUT").stdout
        assert "169.254.169.254" not in rules, (host.name, rules)
        # The host firewall's table is gone, and only it: the host's own table stays.
        tables = cluster.fleet.ssh(host, "sudo nft list tables").stdout.split("\n")
        assert "table inet vllm_cluster" not in tables and "table inet users_own" in tables, (host.name, tables)
        assert "removed the host firewall" in outcomes[f"vllm-host-{node_name(index)}"].stderr
        assert "removed ray" in outcomes[f"vllm-host-{node_name(index)}"].stderr
    gateway = cluster.fleet.gateway
    assert cluster.fleet.ssh(gateway, "test -e /etc/nginx/conf.d/vllm-cluster.conf", check=False).returncode != 0
    assert cluster.fleet.ssh(gateway, "systemctl is-active prometheus", check=False).stdout.strip() != "active"
    assert cluster.completion(timeout=10) != 200
    # The models on the shared directory, every file of them.
    assert sorted(str(path.relative_to(models)) for path in models.rglob("*") if path.is_file()) == kept


def test_make_local_down_removes_everything_it_made(cluster):
    """The teardown from another process (`make local-down` reads what `make local`
    recorded): no host process, namespace, bridge, mount or file of the target is left."""
    pids = [host.process.pid for host in cluster.fleet.hosts] + [cluster.hub.process.pid]
    workdir = cluster.fleet.workdir
    assert local_target.down(cluster.state_dir) == 0
    assert not cluster.state_dir.exists()
    assert all(
        not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower() for pid in pids
    )
    network = cluster.fleet.network
    assert subprocess.run(["ip", "link", "show", network.bridge], capture_output=True).returncode != 0
    assert not [
        name
        for name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if name.startswith(network.netns_prefix)
    ]
    assert str(workdir) not in Path("/proc/self/mounts").read_text()
    assert not workdir.exists()
    left = set(os.listdir("/dev/shm")) - cluster.shm_before
    assert not left, f"shared-memory segments left on this machine: {sorted(left)}"
    sockets = tmp_sockets() - cluster.sockets_before
    assert not sockets, f"sockets left in this machine's /tmp: {sorted(sockets)}"
