"""Replicas end to end on the local fleet: two gangs of one node each (each its own Ray
cluster and its own real vLLM engine) behind the one gateway. The gateway balances
over both; a day-2 change rolls over the gangs one after the other while a steady
stream of completions goes through the gateway, and none of them fails; a gang that
is powered off is ejected (the pool degraded, the gang named) and returns after boot.

Skipped, with the reason, where the machine cannot host the fleet; under CI
(VLLM_CLUSTER_CI) that is a failure instead. The tests run in file order.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from fleet_helpers import Load, boot_log, first_timestamp, streams_at_once

from components import image, metrics, ports, prometheus_sizing
from components.bootstrap import GATEWAY_COMMAND
from components.topology import gang_name, gang_prefix, node_name, writes_model_tree
from localhosts.cluster import fleet_program, replace_nodes, serving_cluster
from localhosts.fleet import SECOND_NETWORK, in_ci, why_no_fleet
from localhosts.replay import COMMAND, replay
from scripts.lib import model_stage

NODES_PER_GANG = 1
REPLICAS = 2
# VllmEngineDown's rule holds for ENGINE_DOWN_FOR (1 min); a scrape (15 s) and an
# evaluation (15 s) may come after the condition starts, and the test's own polling.
ENGINE_DOWN_WITHIN = 60 + 60
# The day-2 change the rolling test makes, which the stack keeps from then on.
ROLLED = {"maxModelLen": 2048}

_reason = why_no_fleet()
if _reason and in_ci():
    pytest.fail(f"CI cannot host the local fleet: {_reason}", pytrace=False)
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"no local fleet here: {_reason}")


@pytest.fixture(scope="module")
def gangs(tmp_path_factory):
    # On a network of its own: make test runs it beside the main fleet (tests/conftest.py).
    workdir = tmp_path_factory.mktemp("replicas") / "fleet"
    with serving_cluster(workdir, NODES_PER_GANG, replicas=REPLICAS, network=SECOND_NETWORK) as cluster:
        yield cluster


def gateway_shell(cluster, command: str, check: bool = True):
    return cluster.fleet.ssh(cluster.fleet.gateway, command, check=check)


def pool(cluster) -> dict[str, list[str]]:
    """The gateway's own view: gang -> [address, pool state, health]."""
    printed = gateway_shell(cluster, f"sudo {GATEWAY_COMMAND} pool").stdout
    return {line.split()[0]: line.split()[1:] for line in printed.splitlines() if line.startswith("gang")}


def served_requests(cluster, gang: int) -> float:
    """Completions the gang's own engine finished (vLLM's counter on its head)."""
    head = heads(cluster)[gang]
    metrics = cluster.fleet.ssh(head, f"curl -s http://{head.ip}:8000/metrics").stdout
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:request_success_total") and 'finished_reason="' in line
    )


def status(cluster) -> tuple[int, dict]:
    result = cluster.operator("status", "--json")
    return result.returncode, json.loads(result.stdout)


# --- the EC2 path: hosts started with the user data while `pulumi up` runs ----------------
# (tests/test_fleet.py runs `make local`'s stack of hosts, which exist before the stack.)


def test_hosts_refused_logins_while_booting_and_the_bootstrap_rode_it_out(gangs):
    """/run/nologin was there while sshd already answered, on every host, and the
    replay (dialling as pulumi-command does) started while the hosts booted."""
    for host in gangs.fleet.hosts:
        sshd = first_timestamp(boot_log(gangs, host, "ssh.service"), "Server listening")
        sessions = first_timestamp(boot_log(gangs, host, "systemd-user-sessions.service"), "Finished")
        assert sessions - sshd >= 5, f"{host.name}: logins were possible {sessions - sshd:.1f} s after sshd started"
    # The gateway was dialled while it refused logins: pulumi-command retried, with new connections.
    refused = [e for e in gangs.outcomes["vllm-gateway-setup"].dial_log.stages("Dial") if "Authentication" in e]
    assert refused, gangs.outcomes["vllm-gateway-setup"].dial_log.failures
    # `pulumi up` was running while the nodes still refused logins, yet each node was dialled
    # only once the gateway had seen it accept one: no handshake to a node was ever refused.
    for gang in range(REPLICAS):
        host, node = gangs.fleet.nodes[gang * NODES_PER_GANG], node_name(0, gang)
        sessions = first_timestamp(boot_log(gangs, host, "systemd-user-sessions.service"), "Finished")
        assert gangs.started_wall < sessions, f"{node} accepted logins before the replay started"
        assert "accepts logins" in gangs.outcomes[f"vllm-login-{node}"].stderr
        assert not gangs.outcomes[f"vllm-setup-{node}"].dial_log.stages("Dial"), node


def test_efa_tools_are_where_the_image_has_them_and_preflight_found_them(gangs):
    for gang in range(REPLICAS):
        index = gang * NODES_PER_GANG
        # Not on sudo's secure_path, as on the real image: a bare `fi_info` finds nothing.
        assert gangs.node_shell(index, "sudo sh -c 'command -v fi_info'", check=False).returncode != 0
        assert gangs.node_shell(index, "test -x /opt/amazon/efa/bin/fi_info").returncode == 0
        report = gangs.outcomes[f"vllm-{gang_prefix(gang)}preflight"].stdout
        row = next(line for line in report.splitlines() if line.startswith("efa "))
        assert row.count("1/1") == NODES_PER_GANG, report


def test_another_gangs_node_cannot_write_the_model_tree_or_the_warmup_cache(gangs):
    """Issue 33, point 3: gang 0's nodes alone write what every node loads (the model
    tree, vLLM's compiled pieces); gang 1's node has them read-only, as its role's
    missing ClientWrite makes them on AWS."""
    probe = "/mnt/vllm-models/warmup/.issue-33-probe"
    # Gang 0's node, a writer, makes the warm-up directory (if it published nothing yet) and writes.
    gangs.node_shell(0, f"sudo mkdir -p /mnt/vllm-models/warmup && sudo touch {probe} && sudo rm {probe}")
    for directory in ("/mnt/vllm-models", "/mnt/vllm-models/warmup"):
        refused = gangs.node_shell(NODES_PER_GANG, f"sudo touch {directory}/.issue-33-probe", check=False)
        assert refused.returncode != 0, refused
        assert "Read-only file system" in refused.stdout + refused.stderr, refused


def test_the_gateway_balances_over_both_gangs(gangs):
    assert {name: state[1:] for name, state in pool(gangs).items()} == {
        gang_name(g): ["in-pool", "serving"] for g in range(REPLICAS)
    }
    before = [served_requests(gangs, g) for g in range(REPLICAS)]
    # Twenty at once, each long enough to hold its slot: least connections hands them out
    # while all are in flight, so each gang's share does not hang on which gang a busy
    # machine slowed (as a client sending one after the other would).
    seen = streams_at_once(gangs, 20, max_tokens=64)
    assert seen.outcomes == {"200": 20}, dict(seen.outcomes)
    served = [served_requests(gangs, g) - before[g] for g in range(REPLICAS)]
    # Least connections over two gangs: each serves a real share.
    assert min(served) >= 5, served


def test_status_shows_each_gang_and_a_healthy_pool(gangs):
    code, report = status(gangs)
    assert code == 0 and report["verdict"] == "healthy", report["problems"]
    assert [(g["name"], g["verdict"]) for g in report["gangs"]] == [("gang0", "serving"), ("gang1", "serving")]
    for gang in report["gangs"]:
        assert gang["completion"]["status"] == 200 and gang["metrics"], gang


def test_prometheus_has_each_gangs_figures_after_completions(gangs):
    """Both gangs scraped, and every recording rule has a value of each after traffic
    through the gateway went to both (the balancing test before this one)."""
    deadline = time.monotonic() + 180
    while True:
        with Load(gangs, clients=2) as load:
            time.sleep(10)
        assert load.failed == [], load.failed[:3]
        tokens = gangs.prometheus_query(metrics.TOKENS_PER_SECOND)
        if {gang for (gang, _), value in tokens.items() if value > 0} == {gang_name(g) for g in range(REPLICAS)}:
            break
        assert time.monotonic() < deadline, f"tokens/s per gang after 180 s: {tokens}"
    for name in metrics.recording_rule_exprs():
        have = {gang for gang, _ in gangs.prometheus_query(name)}
        assert have == {gang_name(g) for g in range(REPLICAS)}, (name, have)
    code, report = status(gangs)
    assert [g["prometheus"]["tokensPerSecond"] is not None for g in report["gangs"]] == [True] * REPLICAS
    # The series Prometheus keeps per node here, against the planner's per-node figures
    # (components/prometheus_sizing.py, measured on loopback by bench/bench_metrics_series.py).
    by_job = {job: gangs.prometheus_query(f'count by (gang, node) ({{job="{job}"}})') for job in ("ray", "vllm")}
    itself = gangs.prometheus_query('count({job="prometheus"})')
    print(f"Prometheus keeps per node: ray {by_job['ray']}, vllm {by_job['vllm']}; itself {itself}")
    assert set(by_job["vllm"]) == {(gang_name(g), node_name(0, g)) for g in range(REPLICAS)}, by_job
    for job, planned in (("ray", prometheus_sizing.RAY_NODE_SERIES), ("vllm", prometheus_sizing.VLLM_HEAD_SERIES)):
        for where, count in by_job[job].items():
            assert count <= planned * 1.3, f"{job} on {where}: {count:.0f} series, the planner counts {planned}"


# --- the gateway under load (issue 48) ---------------------------------------------------
# Streams the gateway must hold at once: Debian's nginx (worker_connections 768 in two
# workers, a proxied stream holding two) reset 276 of 1,000 (docs/api.md).
STREAMS_AT_ONCE = 1000
# One client's requests in flight: the former default limit (20 a second, a burst of 40,
# nodelay) refused 212 of 256 at this concurrency.
ONE_CLIENTS_IN_FLIGHT = 64
# The per-key limit the refusal test sets, and how many it sends at once above it.
IN_FLIGHT_LIMIT = 2
OVER_THE_LIMIT = 8


def day2_change(cluster, **changes) -> set[str]:
    """The stack with `changes`, its changed commands replayed as `pulumi up` runs them; none
    restarts an engine or Ray. Returns the changed commands' names."""
    run = cluster.program(**changes)
    old = {c.name: c.inputs for c in cluster.run.of_type(COMMAND)}
    changed = {c.name for c in run.of_type(COMMAND) if old.get(c.name) != c.inputs}
    assert not [name for name in changed if name.endswith(("-vllm", "-ray")) or "start-ray" in name], changed
    replay(run, only=changed)
    cluster.run = run
    cluster.config = {**cluster.config, **changes}
    return changed


def test_the_gateway_holds_a_thousand_streams_at_once_and_resets_none(gangs):
    """1,000 streamed completions in flight through the gateway at the same moment (the
    gangs run 2 each, vllmExtraArgs --max-num-seqs=2: the rest wait in vLLM's queues, their
    connections open): every one read to its end, none reset or refused."""
    seen = streams_at_once(gangs, STREAMS_AT_ONCE)
    print(f"{STREAMS_AT_ONCE} streams at once: {dict(seen.outcomes)}, peak in flight {seen.peak_in_flight}")
    assert seen.peak_in_flight == STREAMS_AT_ONCE, seen.peak_in_flight
    assert seen.outcomes == {"200": STREAMS_AT_ONCE}, (dict(seen.outcomes), seen.refusals)
    warned = gateway_shell(gangs, "sudo grep -c 'worker_connections are not enough' /var/log/nginx/error.log", False)
    assert warned.stdout.strip() in ("", "0"), warned.stdout


def test_one_client_with_64_requests_in_flight_is_never_refused_by_default(gangs):
    """The default stack limits no client below what it can serve: one address, 64 at once,
    four times over."""
    for _ in range(4):
        seen = streams_at_once(gangs, ONE_CLIENTS_IN_FLIGHT)
        assert seen.outcomes == {"200": ONE_CLIENTS_IN_FLIGHT}, (dict(seen.outcomes), seen.refusals)


def test_a_key_over_its_in_flight_limit_gets_openai_json_429_with_retry_after(gangs):
    """apiMaxRequestsInFlightPerKey set by a later up (the gateway's site only: no engine
    restarts): the requests above the limit are refused at once with OpenAI's 429 body and
    Retry-After, the others served; set back to 0, nothing is refused again."""
    changed = day2_change(gangs, apiMaxRequestsInFlightPerKey=IN_FLIGHT_LIMIT)
    print(f"in-flight limit {IN_FLIGHT_LIMIT}: changed {sorted(changed)}")
    try:
        seen = streams_at_once(gangs, OVER_THE_LIMIT, max_tokens=64)
        print(f"{OVER_THE_LIMIT} at once with a limit of {IN_FLIGHT_LIMIT}: {dict(seen.outcomes)}")
        assert seen.outcomes["HTTP 429"] >= OVER_THE_LIMIT - IN_FLIGHT_LIMIT - 1, dict(seen.outcomes)
        assert seen.outcomes["200"] >= IN_FLIGHT_LIMIT, dict(seen.outcomes)
        assert set(seen.outcomes) == {"200", "HTTP 429"}, dict(seen.outcomes)
        headers, body = seen.refusals[0]
        assert int(headers["retry-after"]) >= 1 and headers["content-type"].startswith("application/json"), headers
        error = json.loads(body)["error"]
        assert error["code"] == "rate_limit_exceeded" and error["message"], error
    finally:
        day2_change(gangs, apiMaxRequestsInFlightPerKey=0)
    seen = streams_at_once(gangs, OVER_THE_LIMIT)
    assert seen.outcomes == {"200": OVER_THE_LIMIT}, dict(seen.outcomes)


def test_a_rolling_change_fails_no_request_and_restarts_the_gangs_one_after_the_other(gangs):
    updated = fleet_program(NODES_PER_GANG, gangs.key_store, network=gangs.fleet.network, replicas=REPLICAS, **ROLLED)
    old = {c.name: c.inputs for c in gangs.run.of_type(COMMAND)}
    changed = {c.name for c in updated.of_type(COMMAND) if old.get(c.name) != c.inputs}
    assert changed == {
        f"vllm-{name}"
        for name in (
            "gang0-drain",
            "gang1-drain",
            "vllm",
            "gang1-vllm",
            "gang0-return",
            "gang1-return",
            "readiness",
            "gang1-readiness",
        )
    } | {
        # A new max-model-len is a new key of vLLM's compile cache (engine_cache.warmup_key):
        # each node seeds from it before, and gang 0's nodes, the warm-up cache's writers
        # (topology.writes_model_tree), keep it after; neither restarts anything.
        f"vllm-{step}-{node_name(i, g)}"
        for g in range(REPLICAS)
        for i in range(NODES_PER_GANG)
        for step in ("prepare", "warmup")
        if step == "prepare" or writes_model_tree(g)
    }
    engines = [gangs.unit_property(g * NODES_PER_GANG, "vllm.service", "MainPID") for g in range(REPLICAS)]
    since = gateway_shell(gangs, "date +%s").stdout.strip()
    with Load(gangs, clients=2) as load:
        time.sleep(5)
        outcomes = replay(updated, only=changed)  # what `pulumi up` would run
        time.sleep(5)
    print(f"rolling update: {load.sent} requests sent through the gateway, {len(load.failed)} failed")
    assert load.failed == [], f"{len(load.failed)} of {load.sent} failed: {load.failed[:5]}"
    assert load.sent >= 30, load.sent
    gangs.run = updated
    # The stack keeps the setting from now on (its stack file would).
    gangs.config = {**gangs.config, **ROLLED}
    # Both engines restarted with the new setting...
    for g in range(REPLICAS):
        index = g * NODES_PER_GANG
        assert gangs.unit_property(index, "vllm.service", "MainPID") != engines[g]
        assert "--max-model-len 2048" in gangs.node_shell(index, "sudo cat /etc/vllm-cluster/vllm.env").stdout
    # ...one after the other: gang 1 was drained only once gang 0 served again.
    first, second = outcomes["vllm-vllm"], outcomes["vllm-gang1-vllm"]
    assert first.finished <= outcomes["vllm-gang0-return"].finished <= outcomes["vllm-gang1-drain"].finished
    assert first.finished <= second.started
    journal = gateway_shell(
        gangs, f"sudo journalctl -t vllm-cluster-gateway --since @{since} -o cat --no-pager"
    ).stdout.splitlines()
    order = [
        (step, gang)
        for line in journal
        for step, says in (("drained", "out of the API pool"), ("returned", "back in the API pool"))
        for gang in ("gang0", "gang1")
        if line.startswith(f"{'drain' if step == 'drained' else 'return'} {gang}: {says}")
    ]
    assert order == [("drained", "gang0"), ("returned", "gang0"), ("drained", "gang1"), ("returned", "gang1")], journal


def test_replacing_a_gangs_node_fails_no_request_the_old_head_serving_until_the_new_one_did(gangs):
    """A launch-template change replaces gang 1's node, as `pulumi up` does it: the new
    host first, at a new IP; the commands whose inputs changed, in order; the old host
    deleted last. Clients see no failure: the gateway keeps gang 1 at its old head until
    the new head passed start-vllm's completion, then switches."""
    old_head = gangs.fleet.nodes[1 * NODES_PER_GANG]
    since = gateway_shell(gangs, "date +%s").stdout.strip()
    prometheus = gangs.prometheus_pid()
    started = time.monotonic()
    with Load(gangs, clients=2) as load:
        time.sleep(5)
        replaced = replace_nodes(gangs, {"vllm-gang1-head": old_head}, replicas=REPLICAS, **ROLLED)
        time.sleep(5)
    new_head = replaced.hosts["vllm-gang1-head"]
    print(
        f"replacing gang1's node: {load.sent} requests sent through the gateway, {len(load.failed)} failed; "
        f"new host started to switched and checked {replaced.replayed_at - replaced.booted_at:.0f} s, "
        f"the whole replacement {time.monotonic() - started:.0f} s"
    )
    assert load.failed == [], f"{len(load.failed)} of {load.sent} failed: {load.failed[:5]}"
    assert load.sent >= 30, load.sent
    # Only gang 1's commands ran again, the pool's configure (its address changed) and
    # Prometheus's targets.
    assert {name for name in replaced.changed if "gang1" not in name} == {
        "vllm-gateway-proxy",
        "vllm-gateway-metrics",
    }, replaced.changed
    # Prometheus read its new targets itself: not restarted, and it scrapes the new head.
    assert gangs.prometheus_pid() == prometheus
    assert "targets: ray.json vllm.json rewritten" in replaced.outcomes["vllm-gateway-metrics"].stderr
    deadline = time.monotonic() + 90
    while True:
        _, answer = gangs.metrics_request("api/v1/query", query='up{gang="gang1"}')
        scraped = {
            (s["metric"]["job"], s["metric"]["instance"].rsplit(":", 1)[0], s["value"][1])
            for s in answer["data"]["result"]
        }
        if scraped == {("vllm", new_head.ip, "1"), ("ray", new_head.ip, "1")}:
            break
        assert time.monotonic() < deadline, f"gang1's targets after 90 s: {scraped}"
        time.sleep(5)
    assert pool(gangs) == {
        "gang0": [f"{gangs.fleet.nodes[0].ip}:{ports.VLLM_API}", "in-pool", "serving"],
        "gang1": [f"{new_head.ip}:{ports.VLLM_API}", "in-pool", "serving"],
    }
    journal = gateway_shell(
        gangs, f"sudo journalctl -t vllm-cluster-gateway --since @{since} -o cat --no-pager"
    ).stdout.splitlines()
    old, new = f"{old_head.ip}:{ports.VLLM_API}", f"{new_head.ip}:{ports.VLLM_API}"
    steps = [
        step
        for line in journal
        for step, says in (
            ("kept", f"configure: gang1 keeps serving at {old} until its new head at {new} serves"),
            ("not drained", f"drain gang1: stays in the API pool (replaced: it keeps serving at {old}"),
            ("switched", f"return gang1: in the pool already; now at {new} (was {old})"),
        )
        if line.startswith(says)
    ]
    assert steps == ["kept", "not drained", "switched"], journal
    # The switch came after the new head's own completion (start-vllm), and the check
    # through the gateway after the switch.
    outcomes = replaced.outcomes
    assert outcomes["vllm-gang1-vllm"].finished <= outcomes["vllm-gang1-return"].started
    # The new node's engine started from the warm-up the gangs kept under this
    # configuration's key (the rolling change's), every piece of it seeded.
    seeded = outcomes[f"vllm-prepare-{node_name(0, 1)}"].stderr
    assert re.search(r"seeded ([1-9]\d*) of \1 pieces", seeded), seeded
    assert outcomes["vllm-gang1-return"].finished <= outcomes["vllm-gang1-readiness"].started


def test_a_powered_off_gang_is_ejected_and_named(gangs):
    """Gang 1's head loses power (a plug pulled: to EC2 a crashed instance, still
    running). It stays off: the idle tests next boot it again, and it serves again by
    itself, the gateway sending to it once it does."""
    lost = heads(gangs)[1]
    gangs.fleet.power_off(lost)
    LOST.append(lost)
    # Clients see no failure: what could not reach gang 1 is sent to gang 0.
    with Load(gangs, clients=2) as load:
        time.sleep(15)
    assert load.failed == [] and load.sent >= 5, (load.sent, load.failed[:3])
    code, report = status(gangs)
    assert code == 1 and report["verdict"] == "degraded", report
    assert any("gang1" in problem for problem in report["problems"]), report["problems"]
    assert not any("gang0" in problem for problem in report["problems"]), report["problems"]
    # Prometheus: gang 1's engine down fires once it held for the rule's time; gang 0's does not.
    fired = gangs.wait_for_alert("VllmEngineDown", "gang1", "firing", timeout=ENGINE_DOWN_WITHIN)
    print(f"VllmEngineDown of gang1 fired {fired:.0f} s after the status check (rule: for {metrics.ENGINE_DOWN_FOR})")
    # Firing, not pending: one scrape of gang 0 that a starved machine let time out makes the
    # alert pending for a moment, which says nothing about gang 0's engine.
    assert not [
        a
        for a in gangs.prometheus_alerts()
        if a["labels"]["alertname"] == "VllmEngineDown" and a["labels"]["gang"] == "gang0" and a["state"] == "firing"
    ]
    code, report = status(gangs)
    assert [a["name"] for a in report["alerts"] if a["gang"] == "gang1" and a["state"] == "firing"].count(
        "VllmEngineDown"
    ) == 1, report["alerts"]


# --- idle stop and wake (idleStopMinutes; EC2's API through its test double) ---------------

IDLE_MINUTES = 1
# The waker's give-up bound, as a user sets it: past the fleet's expected wake (377 s) and
# the capacity test's own waits, and 9 minutes under the derived one (three wakes), which
# the give-up test would otherwise sit through.
WAKE_GIVE_UP_MINUTES = 10
IDLE_RECORD = "var/lib/vllm-cluster/idle/last-stop.json"
# The host test_a_powered_off_gang_is_ejected_and_named left off.
LOST = []
# A gang stops once its last request is IDLE_MINUTES old, seen by a node's idle check
# (every 15 s) and its shutdown; the waker sees it at its next DescribeInstances (15 s).
STOPS_WITHIN = IDLE_MINUTES * 60 + 90
# After a wake: the hosts boot (their logins refused for a while), Ray and the engine start
# by themselves from the model and warm-up on the shared cache.
SERVES_AGAIN_WITHIN = 480


@pytest.fixture(scope="module")
def ec2(gangs, tmp_path_factory):
    """The program with idle stop (IDLE_MINUTES), and EC2's API and metadata service
    for the gateway's waker, set up by the first idle test and torn down after the last."""
    holder = {}
    yield holder
    if "session" in holder:
        holder["session"].terminate()
        holder["session"].wait(timeout=30)
    if "stand_in" in holder:
        holder["stand_in"].__exit__(None, None, None)


def current_ips(cluster) -> dict[str, str]:
    """Every node instance at the IP it has now (gang 1's head was replaced)."""
    return {f"vllm-{node['name']}": node["ip"] for gang in cluster.run.outputs["gangs"] for node in gang["nodes"]}


def heads(cluster):
    ips = [gang["nodes"][0]["ip"] for gang in cluster.run.outputs["gangs"]]
    return [next(host for host in cluster.fleet.nodes if host.ip == ip) for ip in ips]


def unit_property(cluster, host, unit: str, name: str) -> str:
    return cluster.fleet.ssh(host, f"systemctl show -p {name} --value {unit}").stdout.strip()


def is_up(host) -> bool:
    return host.process is not None and host.process.poll() is None


def wait_until_off(host, timeout: float) -> float:
    """Seconds until the host's nspawn ended (it powered itself off); fails after `timeout`."""
    started = time.monotonic()
    while is_up(host):
        assert time.monotonic() - started < timeout, f"{host.name} still up after {timeout:.0f} s"
        time.sleep(2)
    return time.monotonic() - started


def completion_answer(cluster) -> tuple[int, dict, object]:
    """(status, headers, body) of one completion through the endpoint."""
    request = urllib.request.Request(
        cluster.endpoint + "/completions",
        data=json.dumps({"model": cluster.served_model, "prompt": "Hi", "max_tokens": 2}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {cluster.api_key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, context=cluster.tls(), timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode(errors="replace")


def retry_until_served(cluster, answer: int, headers: dict, body, asked: float, within: float) -> int:
    """A client retrying as Retry-After says from its first answer until a completion is
    served (every answer meanwhile a 503), within `within` seconds of `asked`; its tries."""
    tries = 1
    while answer != 200:
        assert time.monotonic() - asked < within, (answer, body)
        time.sleep(int(headers.get("Retry-After", "10")))
        answer, headers, body = completion_answer(cluster)
        tries += 1
        assert answer in (200, 503), (answer, body)
    return tries


def test_idle_stop_set_by_a_later_up_configures_the_nodes_and_the_waker_and_restarts_no_engine(gangs, ec2, tmp_path):
    from fleet_ec2 import WAKER_COMMAND, FleetEc2

    # Gang 1's head, off since its plug was pulled, boots again; its Ray and engine start
    # by themselves (checked by the next test) while this one goes on.
    for host in LOST:
        gangs.fleet.boot(host)
    # The stack as it runs now (the rolling change's setting kept), with idle stop.
    run = gangs.program(moved=current_ips(gangs), idleStopMinutes=IDLE_MINUTES, wakeGiveUpMinutes=WAKE_GIVE_UP_MINUTES)
    old = {c.name: c.inputs for c in gangs.run.of_type(COMMAND)}
    changed = {c.name for c in run.of_type(COMMAND) if old.get(c.name) != c.inputs}
    nodes = [node["name"] for gang in run.outputs["gangs"] for node in gang["nodes"]]
    assert {f"vllm-idle-stop-{node}" for node in nodes} | {WAKER_COMMAND} <= changed, changed
    assert not [name for name in changed if name.endswith(("-vllm", "-ray")) or "start-ray" in name], changed
    # Gang 0's engine, serving all along (gang 1's is starting after its boot).
    engine = unit_property(gangs, heads(gangs)[0], "vllm.service", "MainPID")
    ec2["stand_in"] = FleetEc2(gangs, run, tmp_path).__enter__()
    outcomes = replay(run, only=changed)
    gangs.run = run
    # The stack file the operator tools read says so too.
    gangs.config = {
        **gangs.config,
        "idleStopMinutes": str(IDLE_MINUTES),
        "wakeGiveUpMinutes": str(WAKE_GIVE_UP_MINUTES),
    }
    assert unit_property(gangs, heads(gangs)[0], "vllm.service", "MainPID") == engine
    for host in heads(gangs):  # every node: a gang is one node here
        assert unit_property(gangs, host, "vllm-idle-check.timer", "ActiveState") == "active"
    assert "waker" in outcomes[WAKER_COMMAND].stderr
    # The waker reads the stack's instances through EC2's API with the role's credentials.
    deadline = time.monotonic() + 60
    while not [c for c in ec2["stand_in"].ec2.calls if c[:2] == ("DescribeInstances", 200)]:
        assert time.monotonic() < deadline, ec2["stand_in"].ec2.calls
        time.sleep(2)
    assert all(status == 200 for _, status, _ in ec2["stand_in"].ec2.calls), ec2["stand_in"].ec2.calls


def test_a_busy_gang_never_stops_an_idle_one_does_and_a_login_session_keeps_its_node_up(gangs, ec2):
    stand_in = ec2["stand_in"]
    head0, head1 = heads(gangs)
    # An operator's interactive login (a terminal, as `ssh` gives one by default).
    login = gangs.fleet.ssh_command(head0, "sleep 1200")
    session = subprocess.Popen(
        [login[0], "-tt", *login[1:]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ec2["session"] = session
    # Busy for longer than the idle time and a check: nothing stops. (Gang 1, booted again
    # after its plug was pulled, joins the pool once its engine serves, by itself.)
    with Load(gangs, clients=2) as load:
        time.sleep(IDLE_MINUTES * 60 + 15)
    assert load.failed == [] and load.sent >= 20, (load.sent, load.failed[:3])
    assert is_up(head0) and is_up(head1)
    # Then nobody sends: gang 1 powers itself off; gang 0's head, with a login session open,
    # does not. A node's idle check arms only once its engine answered since the boot: gang
    # 1's stop for idleness says its engine came back by itself after the plug was pulled.
    took = wait_until_off(head1, SERVES_AGAIN_WITHIN + STOPS_WITHIN)
    print(f"gang1 powered itself off {took:.0f} s after the load ended (idleStopMinutes {IDLE_MINUTES})")
    # Its idle check's record of why, on its disk (the node script's last-stop.json).
    record = json.loads((head1.root / IDLE_RECORD).read_text())
    assert record["by"] == "idle" and record["minutes"] == IDLE_MINUTES, record
    assert record["reason"].startswith(f"idle since {record['idle_since']}: no request and no login"), record
    # Gang 0 had its last request when gang 1 did: its check (every 15 s) has seen the idle time too.
    time.sleep(20)
    assert is_up(head0), "gang0's head powered off with a login session open on it"
    assert not (head0.root / IDLE_RECORD).exists()
    assert stand_in.started == []
    # status: gang 1 stopped since its last request, not down; the pool healthy; a request
    # is served by gang 0 without waking gang 1.
    deadline = time.monotonic() + 60
    while True:
        code, report = status(gangs)
        if report["gangs"][1]["verdict"] == "stopped":
            break
        assert time.monotonic() < deadline, report
        time.sleep(5)
    assert code == 0 and report["verdict"] == "healthy", report["problems"]
    assert report["gangs"][1]["idleSince"], report["gangs"][1]
    assert report["gangs"][0]["verdict"] == "serving"
    assert gangs.completion() == 200
    assert stand_in.started == []


def test_a_stopped_service_answers_503_with_retry_after_and_the_gateway_wakes_it(gangs, ec2):
    stand_in = ec2["stand_in"]
    head0, head1 = heads(gangs)
    session = ec2.pop("session")
    session.terminate()
    session.wait(timeout=30)
    # By hand, as an operator leaving for the night: `vllm-cluster stop` tells gang 0's node
    # to power off (gang 1 idled out already: not dialled) and waits until the waker sees
    # every gang stopped.
    asked = time.monotonic()
    stopped = gangs.operator("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "gang1 is stopped already" in stopped.stderr, stopped.stderr
    wait_until_off(head0, 30)
    print(f"vllm-cluster stop: gang0 off and seen stopped by the waker in {time.monotonic() - asked:.0f} s")
    record = json.loads((head0.root / IDLE_RECORD).read_text())
    assert record["by"] == "hand", record
    deadline = time.monotonic() + 45
    while True:
        code, report = status(gangs)
        if code == 4:
            break
        assert time.monotonic() < deadline, report
        time.sleep(5)
    assert report["verdict"] == "stopped" and report["problems"] == [], report
    # Issue 33: a request without the key is refused at the gateway and starts nothing, nor
    # does a keyed /health or /v1/models (an uptime monitor): 503, the gangs still asleep.
    started_before = list(stand_in.started)
    for key in (None, "wrong-key-" + "w" * 38):
        assert gangs.request("/v1/completions", {"model": "m", "prompt": "x"}, key=key)[0] == 401
        assert gangs.request("/health", key=key)[0] == 401
    for path in ("/health", "/v1/models"):
        code, body = gangs.request(path)
        assert code == 503 and body["error"]["code"] == "no_gang_serving", (path, code, body)
    # The waker looks at EC2 every 15 s and nginx asks it on each request it hands over: one
    # look's worth of waiting shows that nothing was started.
    time.sleep(20)
    assert stand_in.started == started_before, (stand_in.started, stand_in.ec2.calls)
    # A request finds no gang: 503 at once, with Retry-After, and the gateway starts them.
    asked = time.monotonic()
    answer, headers, body = completion_answer(gangs)
    assert time.monotonic() - asked < 30
    assert answer == 503 and int(headers["Retry-After"]) > 0, (answer, headers, body)
    node_ids = {i for i, name in stand_in.names.items() if name != "vllm-gateway-host"}
    deadline = time.monotonic() + 30
    while set(stand_in.started) != node_ids:
        assert time.monotonic() < deadline, (stand_in.started, stand_in.ec2.calls)
        time.sleep(1)
    code, report = status(gangs)
    assert code == 4 and {g["verdict"] for g in report["gangs"]} <= {"waking", "serving"}, report
    # A client that retries as Retry-After says gets its completion.
    tries = retry_until_served(gangs, answer, headers, body, asked, SERVES_AGAIN_WITHIN)
    print(f"woken: the first completion after {time.monotonic() - asked:.0f} s and {tries} tries")
    deadline = time.monotonic() + SERVES_AGAIN_WITHIN
    while True:
        code, report = status(gangs)
        if code == 0 and all(g["verdict"] == "serving" for g in report["gangs"]):
            break
        assert time.monotonic() < deadline, report
        time.sleep(10)
    # No engine-down alert stands for either gang: asleep they were left alone, and they serve.
    for gang in ("gang0", "gang1"):
        gangs.wait_for_alert("VllmEngineDown", gang, None, timeout=90)
    # Issue 34 point 3: each node came back with a blank instance store, which the image's
    # unit (its stand-in) formatted and mounted at boot, taking its time; the staging
    # waited for it and copied the stage onto the store, none of it onto the root volume
    # beneath the mount point, where the mount would hide it.
    for host in heads(gangs):  # every node: a gang is one node here
        mounted = gangs.fleet.ssh(host, f"findmnt -n -o TARGET --mountpoint {image.NVME_MOUNT}", check=False)
        assert mounted.stdout.strip() == image.NVME_MOUNT, (host.name, mounted.stdout, mounted.stderr)
        saved = gangs.fleet.ssh(host, "sudo cat /etc/vllm-cluster/prepare-serve.args").stdout.split()
        stage = Path(saved[saved.index("--local-dir") + 1]).relative_to(image.NVME_MOUNT)
        marker = gangs.fleet.instance_store_disk(host) / stage / model_stage.MARKER_NAME
        assert json.loads(marker.read_text())["state"] == "complete", host.name
        # The root volume's directory under the mount point, as this machine sees the
        # host's disk (the host's mounts are its own).
        beneath = host.root / image.NVME_MOUNT.lstrip("/")
        assert list(beneath.iterdir()) == [], (host.name, list(beneath.iterdir()))


# --- a wake EC2 refuses for want of capacity (issue 34) -----------------------------------------

# The capacity tests' first request: when it was answered, and how many StartInstances and
# boots the stand-in had seen before it. The waker's give-up bound for gang 1, which never
# gets capacity, runs from that request.
CAPACITY_WAKE: dict = {}


def gang_troubles(report: dict) -> dict[str, str]:
    """What status says EC2 refused, or why a wake was given up, per gang ("" for none)."""
    return {gang["name"]: gang.get("wakeTrouble") or "" for gang in report["gangs"]}


def test_a_wake_ec2_refuses_for_capacity_says_why_in_the_503_and_serves_once_capacity_is_back(gangs, ec2):
    """Both gangs stopped by hand, and EC2 out of capacity for both: StartInstances of gang
    0's instance fails (InsufficientInstanceCapacity), gang 1's is taken and put back to
    stopped (StateReason Server.InsufficientInstanceCapacity). The client's 503 names the
    refusal, status reports both; once EC2 has capacity for gang 0 again the waker starts it
    by itself (no request needed), and a client retrying as Retry-After says gets served."""
    from fleet_ec2 import waker_config

    stand_in = ec2["stand_in"]
    head0, head1 = heads(gangs)
    id0, id1 = stand_in.instance_of(head0), stand_in.instance_of(head1)
    stopped = gangs.operator("stop")
    assert stopped.returncode == 0, stopped.stderr
    for host in (head0, head1):
        wait_until_off(host, 60)
    deadline = time.monotonic() + 45
    while status(gangs)[0] != 4:
        assert time.monotonic() < deadline, status(gangs)
        time.sleep(5)
    stand_in.no_capacity(id0)
    stand_in.no_capacity(id1, accepted=True)
    booted, asked_before = len(stand_in.started), len(stand_in.ec2.start_requests)
    asked = time.monotonic()
    answer, headers, body = completion_answer(gangs)
    CAPACITY_WAKE.update(asked=asked, booted=booted, asked_before=asked_before)
    assert answer == 503 and int(headers["Retry-After"]) > 0, (answer, headers, body)
    error = json.loads(body)["error"]
    assert error["code"] == "waking_from_idle_stop" and error["type"] == "service_unavailable", error
    assert (
        f"EC2 refused to start gang0's {id0}: InsufficientInstanceCapacity (There is not enough capacity"
        in (error["message"])
    ), error
    assert "retrying with backoff" in error["message"], error
    # The one request asked EC2 to start each gang's instance: gang 1's once (taken), gang 0's
    # as often as the SDK asks again on EC2's HTTP 500 within one call (the waker's
    # EC2_ATTEMPTS, botocore's standard retry mode), and not yet again by the waker's backoff.
    requested = stand_in.ec2.start_requests[asked_before:]
    assert sorted({tuple(ids) for ids in requested}) == sorted([(id0,), (id1,)]), requested
    assert requested.count([id1]) == 1, requested
    assert ("StartInstances", 500, "InsufficientInstanceCapacity") in stand_in.ec2.calls
    # Gang 1's start was taken, then put back: the waker reads why from its StateReason at its
    # next look (15 s), and status says both refusals, as problems: the service is down.
    deadline = time.monotonic() + 60
    while True:
        code, report = status(gangs)
        troubles = gang_troubles(report)
        if "Server.InsufficientInstanceCapacity" in troubles["gang1"]:
            break
        assert time.monotonic() < deadline, report
        time.sleep(5)
    assert f"EC2 refused to start gang1's {id1}: Server.InsufficientInstanceCapacity" in troubles["gang1"], troubles
    assert "InsufficientInstanceCapacity" in troubles["gang0"], troubles
    assert code == 2 and report["verdict"] == "down", report
    for gang in ("gang0", "gang1"):
        assert any(p.startswith(f"{gang}: EC2 refused to start") for p in report["problems"]), report["problems"]
    assert stand_in.started[booted:] == [] and not is_up(head0) and not is_up(head1)
    # Capacity is back for gang 0: the waker's next try (60 s after one refusal) starts it,
    # with no request to prompt it.
    stand_in.capacity_back(id0)
    deadline = time.monotonic() + 120
    while id0 not in stand_in.started[booted:]:
        assert time.monotonic() < deadline, (stand_in.ec2.start_requests[asked_before:], stand_in.ec2.calls[-6:])
        time.sleep(2)
    print(f"gang0 started again by the waker {time.monotonic() - asked:.0f} s after its refused start")
    tries = retry_until_served(gangs, answer, headers, body, asked, SERVES_AGAIN_WITHIN + 120)
    print(f"served: the first completion {time.monotonic() - asked:.0f} s after the refused wake, {tries} tries")
    # Gang 1 still has none: tried again with backoff, never booted, well inside its bound.
    assert time.monotonic() - asked < waker_config(gangs.run)["give_up_seconds"]
    assert stand_in.ec2.start_requests[asked_before:].count([id1]) >= 2, stand_in.ec2.start_requests
    assert id1 not in stand_in.started[booted:] and not is_up(head1)
    # Status: gang 0 serves (once the waker's next look saw it answer), gang 1 is still
    # refused, a problem of a service that answers: degraded.
    deadline = time.monotonic() + 60
    while True:
        code, report = status(gangs)
        if report["gangs"][0]["verdict"] == "serving":
            break
        assert time.monotonic() < deadline, report["gangs"]
        time.sleep(5)
    assert report["gangs"][1]["verdict"] in ("stopped", "waking"), report["gangs"]
    assert "Server.InsufficientInstanceCapacity" in gang_troubles(report)["gang1"], report["gangs"]
    assert code == 1 and report["verdict"] == "degraded", report


def test_a_wake_whose_capacity_never_comes_back_is_given_up_and_leaves_no_instance_running(gangs, ec2):
    """Gang 1 never gets capacity: the waker keeps trying with backoff (VllmWakeRefused
    fires meanwhile) until its bound (give_up_seconds: wakeGiveUpMinutes, as the stack
    sets it), then gives the wake up, says so in status and as VllmWakeGivenUp, and starts
    it no more: its instance never ran, and none is left running."""
    from fleet_ec2 import waker_config

    stand_in = ec2["stand_in"]
    head1 = heads(gangs)[1]
    id1 = stand_in.instance_of(head1)
    give_up = waker_config(gangs.run)["give_up_seconds"]
    assert give_up == WAKE_GIVE_UP_MINUTES * 60
    asked, booted, asked_before = (CAPACITY_WAKE[k] for k in ("asked", "booted", "asked_before"))
    gangs.wait_for_alert("VllmWakeRefused", "gang1", "firing", timeout=120)
    # Given up at the first look past the bound (the waker looks every 15 s).
    deadline = asked + give_up + 90
    while True:
        code, report = status(gangs)
        trouble = gang_troubles(report)["gang1"]
        if "given up" in trouble:
            break
        assert time.monotonic() < deadline, report["gangs"]
        time.sleep(20)
    took = time.monotonic() - asked
    tries = stand_in.ec2.start_requests[asked_before:].count([id1])
    print(f"gang1's wake given up {took:.0f} s after it was asked (bound {give_up} s), after {tries} StartInstances")
    assert took >= give_up, (took, give_up)
    assert f"did not serve within {give_up} s" in trouble, trouble
    assert f"EC2 last refused {id1}: Server.InsufficientInstanceCapacity" in trouble, trouble
    assert "nothing it started is running" in trouble, trouble
    assert code != 0 and any("given up" in p for p in report["problems"]), report
    gangs.wait_for_alert("VllmWakeGivenUp", "gang1", "firing", timeout=90)
    # The wake is over: no refusal is reported any more, and no start follows.
    gangs.wait_for_alert("VllmWakeRefused", "gang1", None, timeout=90)
    assert stand_in.ec2.start_requests[asked_before:].count([id1]) == tries
    # Tried again with backoff (30 s doubling to 5 min) through the bound, and never ran.
    assert tries >= 4, stand_in.ec2.start_requests[asked_before:]
    assert id1 not in stand_in.started[booted:]
    assert stand_in.state(id1) == "stopped" and not is_up(head1)
    stand_in.capacity_back(id1)


# --- a warm pool: gangs that follow the load (issue 36) -----------------------------------------

# The gateway command that parks the warm gangs once a deploy made them ready.
PARK_COMMAND = "vllm-gateway-park"
# The fleet's engines run two requests at once (localhosts/cluster.py --max-num-seqs=2):
# eight clients of long completions keep about five waiting on one gang, at every look,
# which is what the waker scales out on (idle_stop.SCALE_OUT_WAITING_PER_GANG,
# SCALE_OUT_HOLD_SECONDS). Short ones do not: the tiny model answers 4 tokens faster than
# a client sends the next, and the queue Prometheus saw stayed at 0 with eight clients.
QUEUEING_CLIENTS = 8
QUEUEING_TOKENS = 256
# A queue held for the hold time, seen by Prometheus (every 15 s) and by the waker's look
# (every 15 s), then StartInstances; and once more the hold and a look: on a starved
# gateway one look may find Prometheus slow (the waker's 2 s timeout) or one scrape of the
# saturated head may fail, and either starts the hold again. The test asserts that a queue
# wakes gang 1, not how fast.
SCALES_OUT_WITHIN = 60 + 15 + 15 + 60 + 60 + 15
# A warm gang parks once its last client request is IDLE_MINUTES old, at the waker's next
# look (15 s), Prometheus's scrape (15 s), the drain and the poweroff.
PARKS_WITHIN = IDLE_MINUTES * 60 + 150
# Under a trickle the load fits at every look of the window (one request in flight at most,
# the limit being half of one gang's two slots); the stack's own 1-token probes (the
# watchdog's, every 20 s) count as running too, and one caught in a scrape beside the
# client's request starts the window once more.
SCALES_IN_WITHIN = 2 * IDLE_MINUTES * 60 + 150


def power(cluster) -> dict[str, dict]:
    """The waker's record of each gang (power.json on the gateway)."""
    printed = gateway_shell(cluster, "sudo cat /var/lib/vllm-cluster/gateway/power.json").stdout
    return json.loads(printed)["gangs"]


def wait_for(check, timeout: float, what: str, explain=lambda: ""):
    """check()'s first true answer within `timeout` seconds; fails naming `what` and what
    `explain()` tells."""
    started = time.monotonic()
    while True:
        answer = check()
        if answer:
            return answer
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:.0f} s\n{explain()}"
        time.sleep(3)


def waker_view(cluster) -> str:
    """What the waker said lately and the queue it reads (Prometheus on the gateway's loopback)."""
    said = gateway_shell(cluster, "sudo journalctl -u vllm-cluster-waker --no-pager -o cat -n 25", check=False)
    query = urllib.parse.urlencode({"query": "sum by (gang) (vllm:num_requests_waiting)"})
    url = f"http://127.0.0.1:{ports.PROMETHEUS}{metrics.ROUTE_PREFIX}/api/v1/query?{query}"
    queue = gateway_shell(cluster, f"curl -s '{url}'", check=False)
    return f"waker's journal:\n{said.stdout}{said.stderr}\nqueue: {queue.stdout}{queue.stderr}"


def every_gang_serves(cluster) -> bool:
    code, report = status(cluster)
    return code == 0 and all(g["verdict"] == "serving" for g in report["gangs"])


def later_up(cluster, stand_in, **changes):
    """The stack again with `changes`, its changed commands replayed as `pulumi up` runs
    them (scripts/deploy starts a stopped gang first: the test wakes them before); returns
    the changed commands' names and outcomes."""
    run = cluster.program(moved=current_ips(cluster), **changes)
    old = {c.name: c.inputs for c in cluster.run.of_type(COMMAND)}
    changed = {c.name for c in run.of_type(COMMAND) if old.get(c.name) != c.inputs}
    assert not [name for name in changed if name.endswith(("-vllm", "-ray")) or "start-ray" in name], changed
    stand_in.refresh(run)
    outcomes = replay(run, only=changed)
    cluster.run = run
    cluster.config = {**cluster.config, **{key: str(value) for key, value in changes.items()}}
    return changed, outcomes


def test_a_warm_gang_is_parked_woken_by_a_queue_and_parked_again_when_idle_failing_no_request(gangs, ec2):
    """replicas 1, maxReplicas 2 on the running stack: the up parks gang 1 (drained, its
    requests in flight finishing, then stopped through EC2's API) while a client sends
    throughout; a load that keeps requests waiting on gang 0 wakes it; both serve; once the
    load shrinks to a trickle that fits on one gang, gang 1 drains and powers off, gang 0
    serving on. Clients sending completions throughout see no failed request."""
    stand_in = ec2["stand_in"]
    head0, head1 = heads(gangs)
    id1 = stand_in.instance_of(head1)
    # What the earlier tests left stopped (gang 1, whose wake was given up) starts first, as
    # scripts/deploy starts a stack's stopped nodes before `pulumi up` reaches them.
    woke = gangs.operator("wake")
    assert woke.returncode == 0, woke.stderr
    wait_for(lambda: every_gang_serves(gangs), SERVES_AGAIN_WITHIN, "every gang serving before the up")
    with Load(gangs, clients=1) as steady:
        changed, outcomes = later_up(gangs, stand_in, replicas=1, maxReplicas=2)
    assert PARK_COMMAND in changed, changed
    print(f"park: {outcomes[PARK_COMMAND].stdout.strip()}")
    took = wait_until_off(head1, 120)
    print(f"gang1 parked {took:.0f} s after the up")
    assert steady.failed == [] and steady.sent > 0, (steady.sent, steady.failed[:3])
    records = power(gangs)
    assert records["gang0"]["role"] == "always-on" and records["gang1"]["role"] == "warm", records
    assert "parked after deploy" in records["gang1"]["why"], records["gang1"]
    assert pool(gangs)["gang1"][1] == "drained", pool(gangs)
    assert is_up(head0) and gangs.completion() == 200

    # Scale out: requests wait on gang 0; the waker starts gang 1 through EC2's API.
    started_before = len(stand_in.started)
    asked = time.monotonic()
    # Each queued completion waits for six before it on a starved engine: the gateway's read
    # timeout (600 s), not the client's default, bounds it.
    with Load(gangs, clients=QUEUEING_CLIENTS, max_tokens=QUEUEING_TOKENS, timeout=600) as load:
        wait_for(
            lambda: id1 in stand_in.started[started_before:],
            SCALES_OUT_WITHIN,
            "gang1 started by the queue",
            lambda: f"{load.sent} sent, {len(load.failed)} failed: {load.failed[:2]}\n{waker_view(gangs)}",
        )
        print(f"scale out: gang1 started {time.monotonic() - asked:.0f} s after the queue began")
        # The stand-in records the start before the waker's StartInstances returns and it
        # writes power.json.
        wait_for(lambda: "scale out" in (power(gangs)["gang1"].get("why") or ""), 30, "gang1's why: scale out")
        wait_for(lambda: pool(gangs)["gang1"][1:] == ["in-pool", "serving"], SERVES_AGAIN_WITHIN, "gang1 in the pool")
        print(f"scale out: gang1 serves in the pool {time.monotonic() - asked:.0f} s after the queue began")
        served = served_requests(gangs, 1)
        wait_for(lambda: served_requests(gangs, 1) > served, 60, "gang1 taking requests from the pool")
    print(f"scale out: {load.sent} completions sent, {len(load.failed)} failed")
    assert load.failed == [] and load.sent >= 20, (load.sent, load.failed[:3])
    assert len(stand_in.started[started_before:]) == 1, stand_in.started[started_before:]

    # Scale in while traffic flows: one client's trickle, which fits on one gang, goes on
    # (the pool spreads it over both gangs, so neither is ever idle); once the load has fit
    # on one gang fewer for the window, gang 1 drains (its requests finish) and powers off,
    # gang 0 serving on, and not one request of the trickle fails across it.
    with Load(gangs, clients=1) as trickle:
        took = wait_until_off(head1, SCALES_IN_WITHIN)
        print(f"scale in: gang1 off {took:.0f} s after the queueing load ended, a trickle flowing")
        time.sleep(5)
    print(f"scale in: the trickle sent {trickle.sent}, {len(trickle.failed)} failed")
    assert trickle.failed == [] and trickle.sent >= 10, (trickle.sent, trickle.failed[:3])
    # Parked by the load rule after its whole window (idleStopMinutes), not for idleness: the
    # trickle reached both gangs until the drain.
    why = power(gangs)["gang1"]["why"]
    assert why.startswith("scaled in: the load") and f"fit on 1 gang for {IDLE_MINUTES} min" in why, why
    assert is_up(head0) and gangs.completion() == 200
    code, report = status(gangs)
    assert [(g["name"], g["role"]) for g in report["gangs"]] == [("gang0", "always-on"), ("gang1", "warm")], report
    assert code == 0, report["problems"]


def test_replicas_0_sleeps_completely_and_the_first_request_wakes_one_gang(gangs, ec2):
    stand_in = ec2["stand_in"]
    head0, head1 = heads(gangs)
    later_up(gangs, stand_in, replicas=0, maxReplicas=2)
    # Gang 0 is warm now: idle, it parks too.
    took = wait_until_off(head0, PARKS_WITHIN + 60)
    print(f"replicas 0: gang0 off {took:.0f} s after the up")
    wait_for(lambda: status(gangs)[0] == 4, 60, "status: every gang stopped")
    started_before = len(stand_in.started)
    asked = time.monotonic()
    answer, headers, body = completion_answer(gangs)
    assert answer == 503 and int(headers["Retry-After"]) > 0, (answer, headers, body)
    wait_for(lambda: len(stand_in.started) > started_before, 30, "one gang started by the request")
    tries = retry_until_served(gangs, answer, headers, body, asked, SERVES_AGAIN_WITHIN)
    print(f"replicas 0: the first completion after {time.monotonic() - asked:.0f} s and {tries} tries")
    # One gang woke, not both.
    assert len(stand_in.started[started_before:]) == 1, stand_in.started[started_before:]
    assert sum(is_up(head) for head in (head0, head1)) == 1
