"""How `scripts/vllm-cluster status` judges a snapshot: each gang serving, degraded,
down or unknown from its own head's facts (its own completion included), and the pool
healthy, degraded (naming the gang, node or GPU), down when no gang serves, or unknown
when nothing answered. With one gang it judges as it did before replicas. Prometheus's
figures and alerts are shown beside the verdicts and never change them."""

import dataclasses
import http.server
import json
import re
import subprocess
import threading
from datetime import datetime, timezone
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import SimpleNamespace

import pytest

from cli import prometheus_view, status
from cli.cluster import Node, OutputsError, gangs_of, stack_outputs
from components import bootstrap, metrics, ports
from components.spec import load_spec
from tests.test_prometheus_view import (
    AT,
    GANG0_FIGURES,
    IDLE_GANG1,
    NOW,
    alert,
    alerts_answer,
    gateway_output,
    matrix,
    vector,
)

ROOT = Path(__file__).resolve().parent.parent
SPEC = load_spec(
    {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "instanceType": "g5.12xlarge",
        "nodes": 3,
        "tensorParallelSize": 4,
        "efa": "false",
        "apiAllowedCidrs": ["10.0.0.0/8"],
        "adminCidrs": ["10.1.0.0/16"],
    },
    stack="t",
)
IPS = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
GANG1_IPS = ["10.0.1.1", "10.0.1.2", "10.0.1.3"]
BASE_OUTPUTS = {
    "gatewayPublicIp": "203.0.113.5",
    "headPrivateIp": IPS[0],
    "workerPrivateIps": IPS[1:],
    "sshPrivateKey": "key",
    "sshKnownHosts": "",
    "endpoint": "https://203.0.113.5/v1",
    "apiKey": "sk-test",
    "tlsCertificate": "cert",
}


def gangs_output(*gangs: list[str]) -> list[dict]:
    """The `gangs` stack output as __main__.py exports it: names, then IPs, head first."""
    names = [["head", "worker-1", "worker-2"], ["gang1-head", "gang1-worker-1", "gang1-worker-2"]]
    return [
        {"name": f"gang{g}", "nodes": [{"name": n, "ip": ip} for n, ip in zip(names[g], ips, strict=True)]}
        for g, ips in enumerate(gangs)
    ]


class FakeCluster:
    def __init__(self, outputs=None):
        self.gangs = gangs_of(outputs or BASE_OUTPUTS)
        self.nodes = [node for gang in self.gangs for node in gang.nodes]


ONE_GANG = FakeCluster()
TWO_GANGS = FakeCluster({**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)})


def head(
    ips=IPS,
    alive=None,
    health=200,
    completion=200,
    answered=True,
    ray_error=None,
    old_head=False,
    tokens_while_waiting=None,
    running=0,
    waiting=0,
):
    """One gang's head's status-facts answer; `tokens_while_waiting`, when given, is what
    the engine generated for others while the head's completion waited."""
    facts = {
        "alive": {ip: 4.0 for ip in (ips if alive is None else alive)},
        "vllm_unit": "active" if health else "failed",
        "health": health,
        "completion": {"status": completion, "seconds": 0.05, "error": "" if completion == 200 else "boom"},
        "metrics": {"running": running, "waiting": waiting, "kv_cache_usage": 0.1, "tokens_per_second": 5},
    }
    if tokens_while_waiting is not None:
        facts["completion"] |= {"seconds": 30.0, "error": "timed out", "tokens_while_waiting": tokens_while_waiting}
    if ray_error:
        facts = {**facts, "alive": {}, "ray_error": ray_error}
    if old_head:  # status-facts from before the per-gang completion
        del facts["completion"]
    if not answered:
        return {"facts": None, "factsError": "ssh: connect timed out"}
    return {"facts": facts, "factsError": None}


# Prometheus answering, with no alert: gang0 busy, gang1 idle (its quantiles NaN).
PROMETHEUS_OUTPUT = gateway_output(figures=vector(GANG0_FIGURES | IDLE_GANG1), alerts=alerts_answer())


def prometheus_seen(output=PROMETHEUS_OUTPUT, code=0, stderr="", trends=False):
    """The snapshot's view of Prometheus from the gateway command's output."""
    return prometheus_view.read(code, output, stderr, trends)


def snap(*heads, endpoint=200, pool=None, pool_error="usage: vllm-cluster-gateway setup|...", prometheus=None):
    return {
        "gangs": list(heads) or [head()],
        "completion": {"status": endpoint, "seconds": 0.1, "error": "" if endpoint == 200 else "boom"},
        "gateway": {"view": pool, "error": None if pool else pool_error},
        "prometheus": prometheus or prometheus_seen(),
    }


def in_pool(*states):
    """The gateway's pool view: gang g in the state given (in-pool or drained)."""
    return {f"gang{g}": {"address": f"10.0.{g}.1:8000", "state": s, "health": "serving"} for g, s in enumerate(states)}


def verdict(**kwargs):
    endpoint = kwargs.pop("endpoint", 200)
    report = status.assess(ONE_GANG, SPEC, snap(head(**kwargs), endpoint=endpoint))
    return report["exitCode"], report["problems"]


# --- one gang: as before replicas -----------------------------------------------------------


def test_everything_there_is_healthy():
    assert verdict() == (0, [])


def test_a_missing_worker_is_degraded_and_named():
    code, problems = verdict(alive=IPS[:2])
    assert code == 1
    assert "worker-2 (10.0.0.3) is not in the Ray cluster" in problems
    assert any("Ray has 8 of 12 GPUs" in p for p in problems)


def test_a_failing_completion_through_the_endpoint_is_degraded_though_the_gang_serves():
    code, problems = verdict(endpoint=500)
    assert code == 1 and problems == ["a completion through the endpoint got HTTP 500 (boom)"]


def test_health_200_with_failing_completions_on_the_head_is_down_not_healthy():
    # /health stays 200 after a worker dies (vllm #16259): the head's own completion decides.
    code, problems = verdict(completion=500, endpoint=500)
    assert code == 2
    assert problems[0].startswith("vLLM is not serving") and "a completion on head got HTTP 500" in problems[0]


def test_vllm_not_serving_is_down():
    code, problems = verdict(health=0, completion=0, endpoint=0)
    assert code == 2 and problems[0].startswith("vLLM is not serving")


def test_no_answer_from_anything_is_unknown_not_down():
    code, problems = verdict(answered=False, endpoint=0)
    assert code == 3 and "the head did not answer" in problems[0]


def test_a_head_from_before_its_own_completion_is_judged_by_health():
    assert verdict(old_head=True) == (0, [])
    code, problems = verdict(old_head=True, health=0, endpoint=0)
    assert code == 2 and problems[0].startswith("vLLM is not serving")


def test_a_saturated_engine_whose_completion_waits_out_the_timeout_is_degraded_not_down():
    """Under load the head's 1-token completion can wait behind a full batch longer than
    status waits for it, while the engine makes tokens for everyone else: that gang
    serves (slowly). Calling it down would send an operator to restart a busy server,
    which drops every request in flight (the watchdog judges it busy the same way)."""
    code, problems = verdict(completion=0, tokens_while_waiting=240, running=2, waiting=14, endpoint=0)
    assert code == 1, problems
    assert not any(p.startswith("vLLM is not serving") for p in problems), problems
    saturated = [p for p in problems if p.startswith("vLLM is saturated")]
    assert saturated == [
        "vLLM is saturated: a completion on head got no answer within 30 s while the engine made 240 tokens "
        "for other requests (2 running, 14 waiting)"
    ]


def test_no_answer_and_no_token_made_meanwhile_is_down():
    code, problems = verdict(completion=0, tokens_while_waiting=0, running=2, endpoint=0)
    assert code == 2 and problems[0].startswith("vLLM is not serving"), problems


def test_an_error_answer_is_down_whatever_the_engine_made_meanwhile():
    code, problems = verdict(completion=500, tokens_while_waiting=240, endpoint=500)
    assert code == 2 and problems[0].startswith("vLLM is not serving"), problems


def test_a_saturated_gang_of_two_keeps_the_pool_degraded_and_is_named():
    report = assess_two(head(), head(GANG1_IPS, completion=0, tokens_while_waiting=90, waiting=3))
    assert report["exitCode"] == 1
    assert report["pool"]["serving"] == ["gang0", "gang1"]
    assert [p for p in report["problems"] if p.startswith("gang1")] == [
        "gang1 is degraded: vLLM is saturated: a completion on gang1-head got no answer within 30 s while the "
        "engine made 90 tokens for other requests (0 running, 3 waiting)"
    ]


@pytest.mark.parametrize("answered", [False, True])
def test_unseen_ray_does_not_call_nodes_missing(answered):
    kwargs = {"answered": False} if not answered else {"ray_error": "GCS timed out"}
    report = status.assess(ONE_GANG, SPEC, snap(head(**kwargs)))
    assert all(node["alive"] is None for node in report["nodes"])
    assert not any("not in the Ray cluster" in p for p in report["problems"])


# --- several gangs: each judged on its own, the pool from all of them ----------------------


def assess_two(gang0, gang1, endpoint=200, pool=None):
    return status.assess(TWO_GANGS, SPEC, snap(gang0, gang1, endpoint=endpoint, pool=pool))


def test_every_gang_serving_is_healthy():
    report = assess_two(head(IPS), head(GANG1_IPS))
    assert (report["exitCode"], report["problems"]) == (0, [])
    assert [(g["name"], g["verdict"]) for g in report["gangs"]] == [("gang0", "serving"), ("gang1", "serving")]
    assert [n["node"] for n in report["gangs"][1]["nodes"]] == ["gang1-head", "gang1-worker-1", "gang1-worker-2"]
    # Existing consumers read gang 0's nodes and Ray at the top, as before.
    assert [n["ip"] for n in report["nodes"]] == IPS and report["ray"]["expectedNodes"] == 3


def test_one_gang_of_two_not_serving_is_degraded_and_named():
    report = assess_two(head(IPS), head(GANG1_IPS, health=0, completion=0))
    assert report["exitCode"] == 1
    assert [p.split(" ")[0] for p in report["problems"]] == ["gang1"], report["problems"]
    assert report["problems"][0].startswith("gang1 is not serving (")
    assert report["pool"]["serving"] == ["gang0"] and report["pool"]["notServing"] == ["gang1"]
    assert [g["verdict"] for g in report["gangs"]] == ["serving", "down"]


def test_a_gang_whose_own_completion_fails_is_not_serving_even_when_the_endpoint_answers():
    # The endpoint's completion went to gang0: only gang1's own completion shows it is dead.
    report = assess_two(head(IPS), head(GANG1_IPS, completion=500))
    assert report["exitCode"] == 1
    assert report["problems"] == [
        "gang1 is not serving (unit active, /health 200, a completion on gang1-head got HTTP 500 (boom))"
    ]


def test_no_gang_serving_is_down():
    report = assess_two(head(IPS, health=0, completion=0), head(GANG1_IPS, completion=503), endpoint=502)
    assert report["exitCode"] == 2
    assert [p.split(" ")[0] for p in report["problems"][:2]] == ["gang0", "gang1"]


def test_a_gang_missing_a_worker_is_degraded_naming_the_gang_and_the_node():
    report = assess_two(head(IPS), head(GANG1_IPS, alive=GANG1_IPS[:2]))
    assert report["exitCode"] == 1
    assert report["problems"] == [
        "gang1 is degraded: gang1-worker-2 (10.0.1.3) is not in the Ray cluster; Ray has 8 of 12 GPUs"
    ]
    assert [g["verdict"] for g in report["gangs"]] == ["serving", "degraded"]


def test_a_silent_head_makes_its_gang_unknown_and_the_pool_degraded():
    report = assess_two(head(IPS), head(GANG1_IPS, answered=False))
    assert report["exitCode"] == 1 and report["gangs"][1]["verdict"] == "unknown"
    assert report["problems"] == ["gang1 is unknown: the head did not answer: ssh: connect timed out"]


def test_nothing_answering_is_unknown():
    report = assess_two(head(answered=False), head(answered=False), endpoint=0)
    assert report["exitCode"] == 3


def test_a_drained_gang_makes_the_pool_degraded_and_says_how_to_return_it():
    """Drained during a roll, or left drained by one that failed: the pool serves with
    less either way, and only an operator can tell which."""
    report = assess_two(head(IPS), head(GANG1_IPS), pool=in_pool("in-pool", "drained"))
    assert report["exitCode"] == 1 and report["pool"]["drained"] == ["gang1"]
    assert report["pool"]["serving"] == ["gang0"]
    assert len(report["problems"]) == 1 and report["problems"][0].startswith("gang1 is drained")
    assert "return --gang gang1" in report["problems"][0]


def test_only_drained_gangs_serving_is_down():
    report = assess_two(
        head(IPS), head(GANG1_IPS, health=0, completion=0), endpoint=502, pool=in_pool("drained", "in-pool")
    )
    assert report["exitCode"] == 2


def test_a_gang_the_gateway_does_not_balance_to_is_named():
    report = assess_two(head(IPS), head(GANG1_IPS), pool=in_pool("in-pool"))
    assert report["exitCode"] == 1
    assert report["problems"] == ["gang1 is not in the gateway's pool: the gateway sends it no request"]


# --- the gangs from the outputs ------------------------------------------------------------


def test_outputs_without_gangs_are_one_gang_of_head_and_workers():
    (gang,) = gangs_of(BASE_OUTPUTS)
    assert gang.name == "gang0" and [(n.name, n.ip) for n in gang.nodes] == list(
        zip(["head", "worker-1", "worker-2"], IPS, strict=True)
    )


def test_the_gangs_output_gives_every_gang_its_nodes_head_first():
    gangs = gangs_of({**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)})
    assert [g.name for g in gangs] == ["gang0", "gang1"]
    assert [(n.name, n.ip) for n in gangs[1].nodes] == list(
        zip(["gang1-head", "gang1-worker-1", "gang1-worker-2"], GANG1_IPS, strict=True)
    )
    assert gangs[1].head == Node(0, GANG1_IPS[0], 1)


@pytest.mark.parametrize("gangs", [[], [{"name": "gang0", "nodes": []}], [{"name": "gang0"}], "gang0"])
def test_a_gangs_output_of_another_shape_is_one_line_naming_the_file(tmp_path, gangs):
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps({**BASE_OUTPUTS, "gangs": gangs}))
    with pytest.raises(OutputsError, match=rf"^{outputs}: the gangs output "):
        stack_outputs("t", str(outputs))


# --- what is asked, and what is printed ----------------------------------------------------


# The last 15 minutes as Prometheus gives them for gang0 (a step every 20 s): tokens/s
# climbing, TTFT p95 with a gap where no request came, the queue filling at the end.
STEPS = [NOW - 900 + 20 * i for i in range(46)]
TRENDS_ANSWER = matrix(
    {
        (metrics.TOKENS_PER_SECOND, "gang0"): [(t, str(10.0 * i)) for i, t in enumerate(STEPS)],
        (metrics.TTFT_P95, "gang0"): [(t, "NaN" if 20 <= i < 25 else "0.5") for i, t in enumerate(STEPS)],
        (metrics.REQUESTS_WAITING, "gang0"): [(t, "14" if i >= 40 else "0") for i, t in enumerate(STEPS)],
    }
)


def prometheus_answering(command: str) -> tuple[int, str, str]:
    """Prometheus as the gateway command finds it: answering what it is asked, gang0's
    KV cache alert firing."""
    trends = TRENDS_ANSWER if "/query_range" in command else None
    alerts = alerts_answer(alert("VllmKvCacheFull", "gang0", summary="gang gang0's KV cache is over 95% full"))
    return 0, gateway_output(figures=vector(GANG0_FIGURES | IDLE_GANG1), alerts=alerts, trends=trends), ""


def prometheus_refusing(command: str) -> tuple[int, str, str]:
    """No Prometheus listening on the gateway: each curl says so on its line."""
    refused = "curl: (7) Failed to connect to 127.0.0.1 port 9090 after 0 ms: Couldn't connect to server"
    return 0, gateway_output(figures=refused, alerts=refused, trends=refused if "/query_range" in command else None), ""


class AskedCluster(FakeCluster):
    """Answers as the heads and the gateway would, recording who was asked what."""

    def __init__(self, outputs, answers, pool_lines="", pool_code=0, prometheus=None):
        super().__init__(outputs)
        self.answers, self.pool_answer, self.asked = answers, (pool_code, pool_lines), []
        # Prometheus on the gateway: what it prints for the command it is given.
        self.outputs, self.prometheus = outputs, prometheus or prometheus_answering

    def ssh(self, node, command, timeout=60):
        self.asked.append((node.ip, command, timeout))
        facts = self.answers[node.ip]
        return subprocess.CompletedProcess([], 0 if facts else 255, json.dumps(facts) if facts else "", "timed out")

    def ssh_gateway(self, command, timeout=30):
        self.asked.append(("gateway", command, timeout))
        if "/api/v1/" in command:  # Prometheus's questions
            return subprocess.CompletedProcess([], *self.prometheus(command))
        code, lines = self.pool_answer
        return subprocess.CompletedProcess([], code, lines, "" if code == 0 else "usage: ...")

    def close(self):
        pass  # nothing to clean up: the real one removes its key file

    def probe(self, probe, timeout=60):
        self.probes = [*getattr(self, "probes", []), probe]
        return 200, 0.1, ""


def test_the_snapshot_asks_every_gangs_own_head_and_the_gateways_pool():
    answers = {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: None}
    cluster = AskedCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        answers,
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 drained not-serving\n",
    )
    taken = status.snapshot(cluster, SPEC)
    facts_command = f"sudo {bootstrap.NODE_COMMAND} status-facts"
    assert sorted(a[:2] for a in cluster.asked) == sorted(
        [
            (IPS[0], facts_command),
            (GANG1_IPS[0], facts_command),
            ("gateway", f"sudo {bootstrap.GATEWAY_COMMAND} pool"),
            ("gateway", prometheus_view.gateway_command()),
        ]
    )
    assert [g["facts"] is not None for g in taken["gangs"]] == [True, False]
    assert taken["gateway"]["view"]["gang1"] == {
        "address": "10.0.1.1:8000",
        "state": "drained",
        "health": "not-serving",
    }
    report = status.assess(cluster, SPEC, taken)
    assert report["gangs"][1]["verdict"] == "unknown" and report["pool"]["drained"] == ["gang1"]


def test_a_gateway_without_a_pool_view_leaves_the_verdict_to_the_gangs():
    cluster = AskedCluster(BASE_OUTPUTS, {IPS[0]: head(IPS)["facts"]}, pool_code=1)
    report = status.assess(cluster, SPEC, status.snapshot(cluster, SPEC))
    assert report["exitCode"] == 0 and report["pool"]["drained"] is None and report["pool"]["gatewayError"]


def test_one_gang_prints_as_before_replicas():
    text = status.render("t", status.assess(ONE_GANG, SPEC, snap(head(alive=IPS[:2]))), "https://x/v1")
    assert "gang0" not in text and "pool " not in text
    assert "  worker-2  10.0.0.3         MISSING  -" in text
    assert "completion  HTTP 200 in 0.05 s on head (10.0.0.1)" in text
    assert "endpoint    HTTP 200 in 0.10 s through https://x/v1" in text
    assert "verdict     DEGRADED\n    - worker-2 (10.0.0.3) is not in the Ray cluster" in text


def test_several_gangs_print_one_block_each_then_the_pool():
    report = assess_two(head(IPS), head(GANG1_IPS, health=0, completion=0), pool=in_pool("in-pool", "drained"))
    text = status.render("t", report, "https://x/v1")
    headings = [block.splitlines()[0] for block in text.split("\n\n")]
    assert "  gang0       SERVING, in-pool" in headings and "  gang1       DOWN, drained" in headings
    assert text.index("gang1-head") > text.index("gang1       DOWN") > text.index("gang0       SERVING")
    assert "  pool        1 of 2 gangs serving; drained: gang1" in text
    assert text.rstrip().splitlines()[-2:] == ["  verdict     DEGRADED", f"    - {report['problems'][0]}"]
    json.dumps(report)  # --json prints it as it is


# --- Prometheus's figures and alerts: shown, never judged ------------------------------------

REFUSED = "curl: (7) Failed to connect to 127.0.0.1 port 9090 after 0 ms: Couldn't connect to server"
PROMETHEUS_VIEWS = {
    "answering": prometheus_seen(),
    "alerts firing": prometheus_seen(
        gateway_output(
            figures=vector(GANG0_FIGURES | IDLE_GANG1),
            alerts=alerts_answer(
                alert("VllmEngineDown", "gang0", severity="critical"),
                alert("VllmGangHung", "gang1", severity="critical"),
                alert("RayNodeMetricsGone", "gang1", node="gang1-worker-2"),
            ),
        )
    ),
    "refused": prometheus_seen(gateway_output(figures=REFUSED, alerts=REFUSED)),
    "gateway silent": prometheus_seen("", 255, "no answer from the gateway (203.0.113.5) in 30 s"),
    "not the API": prometheus_seen(gateway_output(figures="404 page not found", alerts="404 page not found")),
}


@pytest.mark.parametrize("seen", PROMETHEUS_VIEWS, ids=list(PROMETHEUS_VIEWS))
@pytest.mark.parametrize(
    "heads", [(head(IPS), head(GANG1_IPS)), (head(IPS), head(GANG1_IPS, alive=GANG1_IPS[:2]))], ids=["whole", "short"]
)
def test_prometheus_never_changes_a_verdict_or_the_exit_code(seen, heads):
    """Its figures inform: an alert firing, or no Prometheus at all, leaves status's own
    verdicts, problems and exit code as the heads and the endpoint make them."""
    without = status.assess(TWO_GANGS, SPEC, snap(*heads, prometheus=PROMETHEUS_VIEWS["refused"]))
    report = status.assess(TWO_GANGS, SPEC, snap(*heads, prometheus=PROMETHEUS_VIEWS[seen]))
    judged = ("verdict", "exitCode", "problems", "pool")
    assert {k: report[k] for k in judged} == {k: without[k] for k in judged}
    assert [g["verdict"] for g in report["gangs"]] == [g["verdict"] for g in without["gangs"]]
    assert report["exitCode"] == (0 if heads[1]["facts"]["alive"].keys() == set(GANG1_IPS) else 1)


@pytest.mark.parametrize("watch", [False, True])
def test_the_snapshot_asks_prometheus_in_one_ssh_call_to_the_gateway(watch):
    cluster = AskedCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: head(GANG1_IPS)["facts"]},
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 in-pool serving\n",
    )
    report = status.assess(cluster, SPEC, status.snapshot(cluster, SPEC, trends=watch))
    (asked,) = [(command, timeout) for who, command, timeout in cluster.asked if "/api/v1/" in command]
    assert asked == (prometheus_view.gateway_command(trends=watch), status.PROMETHEUS_TIMEOUT)
    assert ("/api/v1/query_range" in asked[0]) is watch
    assert report["gangs"][0]["prometheus"]["tokensPerSecond"] == 412.25
    assert ("trends" in report["gangs"][0]["prometheus"]) is watch


def two_gangs_report(prometheus=None):
    cluster = AskedCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: head(GANG1_IPS)["facts"]},
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 in-pool serving\n",
        prometheus=prometheus,
    )
    return status.assess(cluster, SPEC, status.snapshot(cluster, SPEC))


def block_of(text: str, heading: str) -> str:
    """A gang's lines: from its heading to the next gang's, or to the pool's lines."""
    rest = text[text.index(heading) :]
    end = re.search(r"\n  (gang\d+ +[A-Z]+|alerts |prometheus |pool )", rest[len(heading) :])
    return rest[: len(heading) + end.start()] if end else rest


class PinnedClock(datetime):
    """status's clock, stopped at 2026-12-03 11:08 UTC: the KV cache alert (firing since
    2026-12-02 04:53 UTC) is then 30 h 15 min old, the minute in which CI's run failed."""

    @classmethod
    def now(cls, tz=None):
        return datetime(2026, 12, 3, 11, 8, 52, tzinfo=timezone.utc).astimezone(tz)


@pytest.fixture
def pinned_clock(monkeypatch):
    monkeypatch.setattr(status, "datetime", PinnedClock)


def has_trends(text: str) -> bool:
    """Whether `text` has --watch's charts: a row labelled "15 min", or a bar anywhere (an
    alert's age, "30 h 15 min", is no chart)."""
    return bool(re.search(r"^  15 min ", text, re.MULTILINE) or set(prometheus_view.BARS) & set(text))


def test_each_gang_shows_its_last_5_minutes_beside_its_verdict_and_the_alerts_are_listed(pinned_clock):
    text = status.render("t", two_gangs_report(), "https://x/v1")
    gang0, gang1 = block_of(text, "  gang0       SERVING"), block_of(text, "  gang1       SERVING")
    assert (
        "  last 5m     TTFT p50 210 ms, p95 840 ms; ITL p50 32 ms; 412.2 tokens/s; running 3, waiting 1; KV cache 41%"
        in gang0.splitlines()
    )
    # gang1 served no request in the window: its quantiles are NaN, shown as "-".
    assert "  last 5m     TTFT p50 -, p95 -; ITL p50 -; 0.0 tokens/s; running 0, waiting 0; KV cache 0%" in gang1
    assert "nan" not in text.lower()
    (alert_line,) = [line for line in text.splitlines() if line.startswith("  alerts ")]
    assert alert_line.startswith("  alerts      VllmKvCacheFull on gang0: firing since 2026-12-02 04:53 UTC (")
    assert alert_line.endswith(" (30 h 15 min), warning: gang gang0's KV cache is over 95% full")
    # The trends are --watch's only.
    assert not has_trends(text), text
    assert text.rstrip().splitlines()[-1] == "  verdict     HEALTHY"


def test_no_alert_active_says_none():
    text = status.render("t", status.assess(TWO_GANGS, SPEC, snap(head(IPS), head(GANG1_IPS))), "https://x/v1")
    assert "  alerts      none" in text.splitlines()


def test_prometheus_unreachable_is_one_line_naming_why_and_the_verdict_stands():
    report = two_gangs_report(prometheus_refusing)
    text = status.render("t", report, "https://x/v1")
    mentions = [line for line in text.splitlines() if "prometheus" in line.lower() or "last 5m" in line]
    assert mentions == [
        f"  prometheus  unreachable (http://127.0.0.1:{ports.PROMETHEUS}{metrics.ROUTE_PREFIX} on the gateway): "
        f"{REFUSED}"
    ]
    assert "alerts" not in text and report["exitCode"] == 0 and "  verdict     HEALTHY" in text


def test_json_carries_each_gangs_figures_the_alerts_and_whether_prometheus_answered():
    report = two_gangs_report()
    document = json.loads(json.dumps(report, allow_nan=False))  # strict JSON: NaN is null
    assert document["prometheus"] == {"reachable": True, "error": None}
    (active,) = document["alerts"]
    assert (active["name"], active["state"], active["gang"], active["node"], active["activeAt"]) == (
        "VllmKvCacheFull",
        "firing",
        "gang0",
        None,
        AT,
    )
    gang0, gang1 = (g["prometheus"] for g in document["gangs"])
    assert gang0["window"] == "5m" and set(prometheus_view.FIGURES) <= set(gang0)
    assert (gang0["ttftP95"], gang0["tokensPerSecond"], gang0["kvCacheUsed"]) == (0.84, 412.25, 0.41)
    assert (gang1["ttftP50"], gang1["requestsWaiting"]) == (None, 0.0)
    # The keys that were there before stay.
    assert {"verdict", "exitCode", "problems", "pool", "gangs", "nodes", "ray", "vllm", "completion", "metrics"} <= set(
        document
    )
    unreachable = json.loads(json.dumps(two_gangs_report(prometheus_refusing), allow_nan=False))
    assert unreachable["prometheus"] == {"reachable": False, "error": REFUSED}
    assert unreachable["alerts"] is None and [g["prometheus"] for g in unreachable["gangs"]] == [None, None]


def run_main(monkeypatch, capsys, **flags):
    """status.main on the two-gang AskedCluster for one refresh (a watch is stopped by
    Ctrl-C where it would sleep): (exit code, what it printed)."""
    cluster = AskedCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: head(GANG1_IPS)["facts"]},
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 in-pool serving\n",
    )
    monkeypatch.setattr(status, "read_stack", lambda stack, stack_file: SimpleNamespace(spec=SPEC))
    monkeypatch.setattr(status, "stack_outputs", lambda stack, outputs: cluster.outputs)
    monkeypatch.setattr(status, "Cluster", lambda outputs: cluster)

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(status.time, "sleep", interrupt)
    args = {"stack": "t", "stack_file": None, "outputs": None, "json": False, "watch": False, "interval": 1} | flags
    code = status.main(SimpleNamespace(**args))
    return code, capsys.readouterr().out


def test_watch_draws_each_gangs_last_15_minutes_and_the_one_shot_does_not(monkeypatch, capsys, pinned_clock):
    code, watched = run_main(monkeypatch, capsys, watch=True)
    assert code == 0
    gang0 = block_of(watched.split("\x1b[H\x1b[2J")[-1], "  gang0       SERVING").splitlines()
    charts = gang0[gang0.index(next(line for line in gang0 if line.startswith("  last 5m "))) + 1 :]
    tokens, ttft, waiting = charts[:3]
    rising = "".join(prometheus_view.BARS[round(i / 45 * 7)] for i in range(46))
    assert tokens == "  15 min      tokens/s  " + rising + "  min 0.0, max 450.0, last 450.0"
    # The steps without a request are gaps in the TTFT chart, not zeros.
    assert ttft == "              TTFT p95  " + "▁" * 20 + " " * 5 + "▁" * 21 + "  min 500 ms, max 500 ms, last 500 ms"
    assert waiting == "              waiting   " + "▁" * 40 + "█" * 6 + "  min 0, max 14, last 14"
    # gang1 has no series in the window: its charts are empty, and say so.
    gang1 = block_of(watched.split("\x1b[H\x1b[2J")[-1], "  gang1       SERVING")
    assert "  15 min      tokens/s  " + " " * 46 + "  no data" in gang1.splitlines()

    code, once = run_main(monkeypatch, capsys)
    assert code == 0 and "last 5m " in once and not has_trends(once), once


def test_watch_json_carries_the_trends(monkeypatch, capsys):
    code, printed = run_main(monkeypatch, capsys, watch=True, json=True)
    (line,) = printed.splitlines()
    trends = json.loads(line)["gangs"][0]["prometheus"]["trends"]
    assert (trends["seconds"], trends["step"]) == (900, 20)
    assert trends["tokensPerSecond"][-1] == 450.0 and trends["ttftP95"][20:25] == [None] * 5


# --- the head's own completion (ray-cluster-check, run by status-facts) ---------------------


def load_ray_cluster_check():
    loader = SourceFileLoader("ray_cluster_check", str(ROOT / "scripts" / "node" / "ray-cluster-check"))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "extra_args, route, body",
    [
        ([], "/v1/completions", {"model": "served-name", "prompt": "Hello", "max_tokens": 1}),
        (["--convert", "embed"], "/v1/embeddings", {"model": "served-name", "input": "Hello"}),
    ],
)
def test_the_heads_probe_is_the_stacks_with_the_key_from_the_environment(monkeypatch, extra_args, route, body):
    seen = []

    class VLLM(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers["Authorization"], body))
            self.send_response(200 if self.headers["Authorization"] == "Bearer test-key" else 401)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), VLLM)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    check = load_ray_cluster_check()
    try:
        sent = bootstrap.stack_probe(
            dataclasses.replace(SPEC, served_model_name="served-name", vllm_extra_args=tuple(extra_args))
        )
        monkeypatch.setenv("VLLM_API_KEY", "test-key")
        answer = check.probe(url, sent.route, sent.body_json(), 5)
        monkeypatch.delenv("VLLM_API_KEY")
        refused = check.probe(url, sent.route, sent.body_json(), 5)
    finally:
        server.shutdown()
        server.server_close()
    assert answer["status"] == 200 and answer["error"] == "" and 0 <= answer["seconds"] < 5
    assert refused["status"] == 401
    assert seen[0] == (route, "Bearer test-key", body)
    assert check.probe(url, sent.route, sent.body_json(), 5)["status"] == 0  # nothing listens any more


def test_status_facts_sends_the_stacks_probe_bounded_the_key_not_in_argv(tmp_path):
    from tests.test_bootstrap import parse_env
    from tests.test_host_ports import node_host, run_node

    calls, env = node_host(tmp_path, 0)
    # The stand-in Python logs its arguments, then the key it finds in its environment.
    python = tmp_path / "root/opt/vllm-cluster/venv/bin/python"
    python.write_text(f'#!/bin/bash\necho "python $*" >>{calls}\necho "key ${{VLLM_API_KEY:-}}" >>{calls}\n')
    result = run_node(tmp_path, env, "status-facts")
    assert result.returncode == 0, result.stderr
    argv, key = calls.read_text().splitlines()
    probe = parse_env((tmp_path / "root/etc/vllm-cluster/probe.env").read_text())
    assert probe["PROBE_ROUTE"] == "/v1/completions", probe
    body = probe["PROBE_BODY"].strip("'")  # single-quoted in the file, one word in argv
    sent = f"--probe-route {probe['PROBE_ROUTE']} --probe-body {body} --probe-timeout 30"
    assert sent in argv and "--status-json " in argv
    assert "test-key" not in argv and key == "key test-key"
    # A head whose start-vllm has not kept a probe yet (updated mid-way) sends none:
    # status judges it by /health.
    (tmp_path / "root/etc/vllm-cluster/probe.env").unlink()
    calls.unlink()
    assert run_node(tmp_path, env, "status-facts").returncode == 0
    assert "--probe-route" not in calls.read_text()


def test_the_head_counts_the_tokens_its_engine_made_while_its_completion_waited():
    """A vLLM that holds the head's completion past its timeout while its token counter
    climbs (a full batch running for others): the facts carry the count, for the
    verdict above. One that answers carries none."""
    made = {"tokens": 1000.0}
    hold, release = threading.Event(), threading.Event()

    class BusyVLLM(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/metrics":
                made["tokens"] += 7  # the batch in flight moves on between samples
                self.answer(f'vllm:generation_tokens_total{{engine="0"}} {made["tokens"]}\n'.encode())
            else:
                self.answer(b"")

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            if hold.is_set():
                made["tokens"] += 50
                release.wait()  # beyond the completion's timeout: set as the test ends
            self.answer(b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), BusyVLLM)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    check = load_ray_cluster_check()
    try:
        # Ample for a server thread of this (perhaps busy) process to answer at once.
        completion = bootstrap.stack_probe(SPEC)
        answered = check.status("127.0.0.1:1", {}, url, completion.route, completion.body_json(), probe_timeout=30)
        hold.set()
        busy = check.status("127.0.0.1:1", {}, url, completion.route, completion.body_json(), probe_timeout=1)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
    assert answered["completion"]["status"] == 200 and "tokens_while_waiting" not in answered["completion"]
    assert busy["completion"]["status"] == 0
    assert busy["completion"]["tokens_while_waiting"] >= 50


# --- idle stop (idleStopMinutes): the waker's view of each gang's instances ----------------

IDLE_SPEC = dataclasses.replace(SPEC, idle_stop_minutes=30)


class PoweredCluster(AskedCluster):
    """AskedCluster whose gateway also answers `vllm-cluster-gateway power` and, in the
    same login, power.json as the waker wrote it (`power_json`; None: the waker never
    wrote one, so `cat` fails after the mark, as the shell would), and whose endpoint
    records whether a completion was sent (one would wake a stopped service)."""

    def __init__(self, outputs, answers, power_lines, pool_lines="", power_json=None):
        super().__init__(outputs, answers, pool_lines)
        self.power_lines, self.power_json, self.completions = power_lines, power_json, 0

    def ssh_gateway(self, command, timeout=30):
        if command == status.power_command():
            self.asked.append(("gateway", command, timeout))
            shown = self.power_lines + status.POWER_FILE_MARK + "\n"
            if self.power_json is None:
                missing = f"cat: {status.POWER_FILE}: No such file or directory"
                return subprocess.CompletedProcess([], 1, shown, missing)
            return subprocess.CompletedProcess([], 0, shown + json.dumps(self.power_json, indent=1) + "\n", "")
        return super().ssh_gateway(command, timeout)

    def probe(self, probe, timeout=60):
        self.completions += 1
        return super().probe(probe, timeout)


def test_a_gang_stopped_for_idleness_is_stopped_since_its_last_request_not_down_and_not_asked():
    cluster = PoweredCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: None},
        "gang0 serving -\ngang1 stopped 2026-12-02T12:40:00Z\n",
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 in-pool not-serving\n",
    )
    report = status.assess(cluster, IDLE_SPEC, status.snapshot(cluster, IDLE_SPEC))
    # gang1's head is off: not dialled (that would wait out ssh's connect timeout).
    assert GANG1_IPS[0] not in [asked[0] for asked in cluster.asked]
    assert report["exitCode"] == status.HEALTHY and report["problems"] == [], report["problems"]
    gang1 = report["gangs"][1]
    # It stopped idleStopMinutes (30) after its last request.
    assert gang1["verdict"] == "stopped" and gang1["idleSince"] == "2026-12-02 12:10 UTC"
    assert report["pool"]["asleep"] == {"gang1": "stopped (idle since 2026-12-02 12:10 UTC)"}
    text = status.render("t", report, "https://x/v1")
    assert "gang1       STOPPED (idle since 2026-12-02 12:10 UTC)" in text
    assert "not asked, their instances are stopped" in text
    assert cluster.completions == 1  # gang0 serves: the endpoint is asked as always


def test_every_gang_stopped_is_its_own_verdict_and_no_request_wakes_them():
    cluster = PoweredCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: None, GANG1_IPS[0]: None},
        "gang0 stopped 2026-12-02T12:41:00Z\ngang1 waking 2026-12-02T12:50:00Z\n",
    )
    report = status.assess(cluster, IDLE_SPEC, status.snapshot(cluster, IDLE_SPEC))
    assert cluster.completions == 0, "status sent a completion, which would wake the service"
    assert [a[0] for a in cluster.asked if a[0] != "gateway"] == []
    assert report["exitCode"] == status.IDLE and report["verdict"] == "waking", report
    assert [g["verdict"] for g in report["gangs"]] == ["stopped", "waking"]
    assert report["problems"] == []
    text = status.render("t", report, "https://x/v1")
    assert "verdict     WAKING" in text and "endpoint    not sent" in text


WAKE_REFUSED = (
    "EC2 refused to start gang1's i-0b000000000000002: Server.InsufficientInstanceCapacity (Insufficient "
    "capacity.); retrying with backoff for 1500 s more, then the waker gives up and stops what it started."
)


def test_a_wake_ec2_refuses_is_named_by_status_and_is_a_problem_not_an_idle_gang():
    """Issue 34: the waker's `power` line carries what EC2 refused; status shows it under
    the gang, lists it as a problem (degraded while another gang serves), and with every
    gang asleep says down, not the idle exit 4: the service will not come back by itself."""
    cluster = PoweredCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: None},
        f"gang0 serving -\ngang1 waking 2026-12-02T12:50:00Z {WAKE_REFUSED}\n",
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 in-pool not-serving\n",
    )
    report = status.assess(cluster, IDLE_SPEC, status.snapshot(cluster, IDLE_SPEC))
    assert report["exitCode"] == status.DEGRADED and report["problems"] == [f"gang1: {WAKE_REFUSED}"], report
    assert report["gangs"][1]["wakeTrouble"] == WAKE_REFUSED
    text = status.render("t", report, "https://x/v1")
    assert "Server.InsufficientInstanceCapacity" in text and "gang1       WAKING" in text
    given_up = "The last wake of gang0 was given up at 2026-12-02T13:20:00Z: it did not serve within 900 s ..."
    cluster = PoweredCluster(BASE_OUTPUTS, {IPS[0]: None}, f"gang0 stopped 2026-12-02T13:20:00Z {given_up}\n")
    report = status.assess(cluster, IDLE_SPEC, status.snapshot(cluster, IDLE_SPEC))
    assert report["exitCode"] == status.DOWN and report["verdict"] == "down", report
    assert report["problems"] == [f"gang0: {given_up}"] and cluster.completions == 0


def test_without_idle_stop_status_never_asks_the_waker():
    cluster = PoweredCluster(BASE_OUTPUTS, {IPS[0]: head(IPS)["facts"]}, "gang0 stopped -\n")
    status.snapshot(cluster, SPEC)
    assert not [a for a in cluster.asked if " power" in a[1] or status.POWER_FILE in a[1]]


# --- warm gangs (maxReplicas, issue 36): each gang's role and why it was woken or stopped ----

# replicas 1 of maxReplicas 2: gang0 always on, gang1 warm.
WARM_SPEC = dataclasses.replace(SPEC, idle_stop_minutes=10, replicas=1, max_replicas=2)
SCALED_IN = "scaled in: no request for 10 min"


def power_json(**gangs: dict) -> dict:
    """power.json as the waker writes it (Waker._write): per gang its state, since,
    stopped_at, instances, wake and failed, and from issue 36 on role, why and why_at."""
    records = {
        name: {"stopped_at": None, "instances": {}, "wake": None, "failed": None, **record}
        for name, record in gangs.items()
    }
    return {"updated": "2026-12-06T05:50:00Z", "error": None, "gangs": records}


def warm_cluster(power_lines: str, document: dict | None) -> PoweredCluster:
    return PoweredCluster(
        {**BASE_OUTPUTS, "gangs": gangs_output(IPS, GANG1_IPS)},
        {IPS[0]: head(IPS)["facts"], GANG1_IPS[0]: None},
        power_lines,
        "gang0 10.0.0.1:8000 in-pool serving\ngang1 10.0.1.1:8000 drained not-serving\n",
        power_json=document,
    )


def test_each_gang_shows_its_role_and_why_the_waker_last_woke_or_stopped_it():
    document = power_json(
        gang0={
            "state": "serving",
            "since": "2026-12-06T04:00:00Z",
            "role": "always-on",
            "why": "woken: a request while every gang was stopped",
            "why_at": "2026-12-06T04:00:00Z",
        },
        gang1={
            "state": "stopped",
            "since": "2026-12-06T05:40:00Z",
            "stopped_at": "2026-12-06T05:40:00Z",
            "role": "warm",
            "why": SCALED_IN,
            "why_at": "2026-12-06T05:40:12Z",
        },
    )
    cluster = warm_cluster("gang0 serving 2026-12-06T04:00:00Z\ngang1 stopped 2026-12-06T05:40:00Z\n", document)
    report = status.assess(cluster, WARM_SPEC, status.snapshot(cluster, WARM_SPEC))
    assert ("gateway", status.power_command()) in [a[:2] for a in cluster.asked]
    assert report["exitCode"] == status.HEALTHY, report["problems"]
    gang0, gang1 = report["gangs"]
    assert (gang0["role"], gang0["why"], gang0["whyAt"]) == (
        "always-on",
        "woken: a request while every gang was stopped",
        "2026-12-06T04:00:00Z",
    )
    assert (gang1["role"], gang1["why"], gang1["whyAt"]) == ("warm", SCALED_IN, "2026-12-06T05:40:12Z")
    assert (report["pool"]["replicas"], report["pool"]["maxReplicas"]) == (1, 2)
    text = status.render("t", report, "https://x/v1")
    assert block_of(text, "  gang0       SERVING").splitlines()[1:3] == [
        "  role        always-on (serves always, never stopped for idleness)",
        "  why         woken: a request while every gang was stopped (2026-12-06 04:00 UTC)",
    ]
    assert block_of(text, "  gang1       STOPPED").splitlines()[1:3] == [
        "  role        warm (started when requests queue, stopped when the load fits on one gang fewer)",
        f"  why         {SCALED_IN} (2026-12-06 05:40 UTC)",
    ]
    # status --json carries them as the report does.
    assert [(g["role"], g["why"]) for g in json.loads(json.dumps(report))["gangs"]] == [
        ("always-on", "woken: a request while every gang was stopped"),
        ("warm", SCALED_IN),
    ]


@pytest.mark.parametrize("document", [power_json(gang0={"state": "serving"}, gang1={"state": "stopped"}), None])
def test_a_waker_from_before_roles_gets_them_from_replicas_and_no_why(document):
    """A power.json without role and why (or none at all): gang0 is among the `replicas`
    first gangs, so always-on, gang1 warm; nothing is printed for a why nobody said."""
    cluster = warm_cluster("gang0 serving -\ngang1 stopped 2026-12-06T05:40:00Z\n", document)
    report = status.assess(cluster, WARM_SPEC, status.snapshot(cluster, WARM_SPEC))
    assert [(g["role"], g["why"], g["whyAt"]) for g in report["gangs"]] == [
        ("always-on", None, None),
        ("warm", None, None),
    ]
    text = status.render("t", report, "https://x/v1")
    assert "  role        warm (started when requests queue" in text and "  why " not in text
    assert report["exitCode"] == status.HEALTHY and report["gangs"][1]["verdict"] == "stopped"


def test_with_replicas_0_every_gang_is_warm():
    spec = dataclasses.replace(WARM_SPEC, replicas=0)
    cluster = warm_cluster("gang0 serving -\ngang1 stopped -\n", None)
    report = status.assess(cluster, spec, status.snapshot(cluster, spec))
    assert [g["role"] for g in report["gangs"]] == ["warm", "warm"]


def test_a_stack_without_warm_gangs_prints_no_role_but_the_why_it_is_told():
    document = power_json(
        gang0={"state": "serving", "role": "always-on"},
        gang1={"state": "stopped", "role": "always-on", "why": "stopped: no request for 30 min", "why_at": "x"},
    )
    cluster = warm_cluster("gang0 serving -\ngang1 stopped 2026-12-02T12:40:00Z\n", document)
    report = status.assess(cluster, IDLE_SPEC, status.snapshot(cluster, IDLE_SPEC))
    text = status.render("t", report, "https://x/v1")
    assert "  role " not in text and "  why         stopped: no request for 30 min (x)" in text


def test_what_follows_the_since_on_a_power_line_is_trouble_only_when_power_json_says_so():
    """A waker that prints more on a `power` line than NAME STATE SINCE [trouble] (its
    role and why, say) makes no problem of it: power.json tells whether a wake was
    refused or given up; one given up is still named."""
    calm = power_json(gang0={"state": "serving"}, gang1={"state": "stopped", "role": "warm", "why": SCALED_IN})
    cluster = warm_cluster(f"gang0 serving -\ngang1 stopped 2026-12-06T05:40:00Z warm {SCALED_IN}\n", calm)
    report = status.assess(cluster, WARM_SPEC, status.snapshot(cluster, WARM_SPEC))
    assert report["gangs"][1]["wakeTrouble"] is None and report["problems"] == [], report["problems"]
    failed = {"at": "2026-12-06T05:40:00Z", "reason": "it did not serve", "retry_at": "2026-12-06T06:10:00Z"}
    given_up = power_json(gang0={"state": "serving"}, gang1={"state": "stopped", "failed": failed})
    note = "The last wake of gang1 was given up at 2026-12-06T05:40:00Z: it did not serve."
    cluster = warm_cluster(f"gang0 serving -\ngang1 stopped 2026-12-06T05:40:00Z {note}\n", given_up)
    report = status.assess(cluster, WARM_SPEC, status.snapshot(cluster, WARM_SPEC))
    assert report["gangs"][1]["wakeTrouble"] == note and report["problems"] == [f"gang1: {note}"]


def test_the_power_file_status_reads_is_the_one_the_waker_writes():
    waker = (ROOT / "scripts" / "gateway" / "vllm-cluster-waker").read_text()
    [state_dir] = re.findall(r'^STATE_DIR = "([^"]+)"$', waker, re.MULTILINE)
    assert status.POWER_FILE == f"{state_dir}/power.json"
    assert f"  {status.POWER_FILE}\n" in waker  # its header's "Writes:"


def test_status_marks_its_completion_through_the_endpoint_as_a_probe_the_waker_does_not_wake_for(monkeypatch):
    from cli import cluster as cluster_module

    sent = []

    class Answer:
        status = 200

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b"{}"

    def urlopen(request, context=None, timeout=None):
        sent.append(dict(request.header_items()))
        return Answer()

    monkeypatch.setattr(cluster_module.urllib.request, "urlopen", urlopen)
    real = cluster_module.Cluster.__new__(cluster_module.Cluster)
    real.outputs = {**BASE_OUTPUTS, "tlsCertificate": None}
    monkeypatch.setattr(real, "tls_context", lambda: None)
    assert real.probe(bootstrap.stack_probe(SPEC))[0] == 200
    assert sent[0].get("X-vllm-cluster-probe") == "status", sent


@pytest.mark.parametrize(
    "extra_args, path, body",
    [
        ([], "/v1/completions", {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "Hello", "max_tokens": 1}),
        (["--convert", "embed"], "/v1/embeddings", {"model": "Qwen/Qwen2.5-0.5B-Instruct", "input": "Hello"}),
        (["--convert", "classify"], "/classify", {"model": "Qwen/Qwen2.5-0.5B-Instruct", "input": "Hello"}),
    ],
)
def test_status_sends_the_stacks_probe_through_the_endpoint_not_a_completion_to_a_pooling_model(
    monkeypatch, extra_args, path, body
):
    """What reaches the endpoint is the request of the model's task, at its route (a
    classifier's /classify lies outside the endpoint's /v1): a pooling model's vLLM
    serves no /v1/completions, so a completion would call a serving stack degraded."""
    from cli import cluster as cluster_module

    sent = []

    class Answer:
        status = 200

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self):
            return b"{}"

    def urlopen(request, context=None, timeout=None):
        sent.append((request.full_url, json.loads(request.data)))
        return Answer()

    monkeypatch.setattr(cluster_module.urllib.request, "urlopen", urlopen)
    spec = dataclasses.replace(SPEC, vllm_extra_args=tuple(extra_args))
    cluster = AskedCluster(BASE_OUTPUTS, {IPS[0]: head(IPS)["facts"]})
    status.snapshot(cluster, spec)
    real = cluster_module.Cluster.__new__(cluster_module.Cluster)
    real.outputs = {**BASE_OUTPUTS, "tlsCertificate": None}
    monkeypatch.setattr(real, "tls_context", lambda: None)
    assert real.probe(cluster.probes[0])[0] == 200
    endpoint = BASE_OUTPUTS["endpoint"].removesuffix("/v1")
    assert sent == [(endpoint + path, body)]
