"""What `status` reads from Prometheus on the gateway (cli/prometheus_view.py): the one
shell command that asks it, run here by a real shell and a real curl against a stand-in
of Prometheus's HTTP API, the answers read into figures per gang (NaN, no request, is
`-`, never "nan"), the alerts, and the trend charts.

The answers imitate Prometheus's API (https://prometheus.io/docs/prometheus/latest/querying/api/)
as Prometheus 2.42 gives them: values as strings, "NaN" and "+Inf" included."""

import http.server
import json
import re
import shutil
import socket
import subprocess
import threading
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlsplit

import pytest

from cli import prometheus_view as view
from components import metrics, ports

NOW = 1796187183  # the gateway's clock, as `date +%s` prints it
AT = "2026-12-02T04:53:01.704408618Z"  # an alert's activeAt, as Prometheus writes it


# --- Prometheus's answers, in its API's format ------------------------------------------------


def vector(samples: dict[tuple[str, str], str]) -> dict:
    """An instant query's answer: {(series, gang): value}. A recorded series aggregated
    `by (gang)` carries only __name__ and gang."""
    result = [
        {"metric": {"__name__": name, "gang": gang}, "value": [NOW + 0.91, text]}
        for (name, gang), text in samples.items()
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def matrix(series: dict[tuple[str, str], list[tuple[int, str]]]) -> dict:
    result = [
        {"metric": {"__name__": name, "gang": gang}, "values": [[t, text] for t, text in values]}
        for (name, gang), values in series.items()
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def alert(name, gang, state="firing", node=None, severity="warning", summary="", active_at=AT, value="1e+00"):
    labels = {"alertname": name, "gang": gang, "severity": severity} | ({"node": node} if node else {})
    return {
        "labels": labels,
        "annotations": {"summary": summary} if summary else {},
        "state": state,
        "activeAt": active_at,
        "value": value,
    }


def alerts_answer(*alerts) -> dict:
    return {"status": "success", "data": {"alerts": list(alerts)}}


def error_answer(error="1:1: parse error: unexpected end of input") -> dict:
    return {"status": "error", "errorType": "bad_data", "error": error}


GANG0_FIGURES = {
    (metrics.TTFT_P50, "gang0"): "0.21",
    (metrics.TTFT_P95, "gang0"): "0.84",
    (metrics.INTER_TOKEN_P50, "gang0"): "0.032",
    (metrics.INTER_TOKEN_P95, "gang0"): "0.05",
    (metrics.E2E_P95, "gang0"): "3.5",
    (metrics.TOKENS_PER_SECOND, "gang0"): "412.25",
    (metrics.REQUESTS_RUNNING, "gang0"): "3",
    (metrics.REQUESTS_WAITING, "gang0"): "1",
    (metrics.KV_CACHE_USED, "gang0"): "0.41",
    (metrics.PREEMPTIONS_PER_SECOND, "gang0"): "0",
}
# A gang that served no request in the window: its quantiles are NaN.
IDLE_GANG1 = {
    (metrics.TTFT_P50, "gang1"): "NaN",
    (metrics.TTFT_P95, "gang1"): "NaN",
    (metrics.INTER_TOKEN_P50, "gang1"): "NaN",
    (metrics.INTER_TOKEN_P95, "gang1"): "NaN",
    (metrics.E2E_P95, "gang1"): "NaN",
    (metrics.TOKENS_PER_SECOND, "gang1"): "0",
    (metrics.REQUESTS_RUNNING, "gang1"): "0",
    (metrics.REQUESTS_WAITING, "gang1"): "0",
    (metrics.KV_CACHE_USED, "gang1"): "0",
    (metrics.PREEMPTIONS_PER_SECOND, "gang1"): "0",
}


def gateway_output(figures=None, alerts=None, trends=None, now=NOW) -> str:
    """What the gateway command prints: its clock, then each answer on its tagged line
    (a dict as the JSON Prometheus sends, a str as it stands: curl's error, a body that
    is not the API's)."""
    lines = [f"now {now}"]
    for tag, answer in (("figures", figures), ("alerts", alerts), ("trends", trends)):
        if answer is not None:
            lines.append(f"{tag} {answer if isinstance(answer, str) else json.dumps(answer)}")
    return "\n".join(lines) + "\n"


def read(**answers):
    """The view of these answers, trends asked when they are given."""
    return view.read(0, gateway_output(**answers), "", trends="trends" in answers)


# --- the command, run by a shell and curl against a stand-in of the API ----------------------


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine (the gateway has one)")


class StandIn(http.server.BaseHTTPRequestHandler):
    """Prometheus's API under its route prefix: answers[path] for a GET (or what it makes
    of the query's parameters), what was asked recorded."""

    answers: dict = {}
    asked: list = []

    def do_GET(self):
        url = urlsplit(self.path)
        self.asked.append((url.path, {k: v[0] for k, v in parse_qs(url.query).items()}))
        answer = self.answers.get(url.path)
        answer = answer(self.asked[-1][1]) if callable(answer) else answer
        body = json.dumps(answer).encode() if answer else b"404 page not found\n"
        self.send_response(200 if answer else 404)
        self.send_header("Content-Type", "application/json" if answer else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass  # the test reads what was asked from `asked`, not from stderr


@pytest.fixture
def prometheus():
    """A stand-in Prometheus on a free port; yields its API URL and what it was asked."""
    asked = []
    prefix = f"{metrics.ROUTE_PREFIX}/api/v1"
    handler = type(
        "Answers",
        (StandIn,),
        {
            "asked": asked,
            "answers": {
                f"{prefix}/query": vector(GANG0_FIGURES | IDLE_GANG1),
                f"{prefix}/alerts": alerts_answer(alert("VllmKvCacheFull", "gang0")),
                # One sample, a step before the end asked.
                f"{prefix}/query_range": lambda query: matrix(
                    {(metrics.TOKENS_PER_SECOND, "gang0"): [(int(query["end"]) - 20, "400")]}
                ),
            },
        },
    )
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{prefix}", asked
    finally:
        server.shutdown()
        server.server_close()


def run_on_gateway(command: str) -> subprocess.CompletedProcess:
    # sh, as the admin user's login shell runs an SSH command (dash on Debian is the strictest).
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


def test_the_command_asks_prometheus_on_the_gateways_loopback_at_its_port_and_prefix():
    command = view.gateway_command(trends=True)
    base = f"http://127.0.0.1:{ports.PROMETHEUS}{metrics.ROUTE_PREFIX}/api/v1"
    assert re.findall(r"http://\S+", command) == [f"{base}/query", f"{base}/alerts", f"{base}/query_range"]


@needs_curl
def test_one_command_asks_every_recorded_figure_and_the_alerts_and_reads_them(prometheus):
    url, asked = prometheus
    result = run_on_gateway(view.gateway_command(api_url=url))
    assert result.returncode == 0, result.stderr
    # One query, the alerts, and no range query outside --watch.
    assert [path for path, _ in asked] == [urlsplit(url).path + "/query", urlsplit(url).path + "/alerts"]
    # The query's matcher is anchored (Prometheus's =~): it selects every recorded series
    # status shows, and only them.
    (names,) = re.fullmatch(r'\{__name__=~"(.*)"\}', asked[0][1]["query"]).groups()
    recorded = set(metrics.recording_rule_exprs())
    assert {n for n in recorded if re.fullmatch(names, n)} == recorded
    assert not re.fullmatch(names, metrics.TTFT) and not re.fullmatch(names, "up")
    answered = view.read(result.returncode, result.stdout, result.stderr)
    assert (answered["reachable"], answered["error"]) == (True, None)
    assert answered["figures"]["gang0"]["ttftP95"] == 0.84
    assert answered["figures"]["gang0"]["kvCacheUsed"] == 0.41
    assert [a["name"] for a in answered["alerts"]] == ["VllmKvCacheFull"]


@needs_curl
def test_with_trends_the_last_15_minutes_are_asked_in_steps_ending_at_the_gateways_now(prometheus):
    url, asked = prometheus
    result = run_on_gateway(view.gateway_command(trends=True, api_url=url))
    now = int(result.stdout.splitlines()[0].split()[1])
    path, query = asked[-1]
    assert path.endswith("/query_range")
    assert (int(query["start"]), int(query["end"]), int(query["step"])) == (now - 900, now, 20)
    assert set(re.fullmatch(r'\{__name__=~"(.*)"\}', query["query"]).group(1).split("|")) == {
        metrics.TOKENS_PER_SECOND,
        metrics.TTFT_P95,
        metrics.REQUESTS_WAITING,
    }
    answered = view.read(result.returncode, result.stdout, result.stderr, trends=True)
    assert answered["error"] is None
    row = answered["trends"]["gang0"]["tokensPerSecond"]
    assert row[-2] == 400.0 and row.count(None) == len(row) - 1  # one sample, one step before now


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed on leaving: nothing listens there


@needs_curl
def test_prometheus_not_listening_is_unreachable_with_curls_reason_said_once():
    url = f"http://127.0.0.1:{closed_port()}{metrics.ROUTE_PREFIX}/api/v1"
    result = run_on_gateway(view.gateway_command(trends=True, api_url=url))
    answered = view.read(result.returncode, result.stdout, result.stderr, trends=True)
    assert answered["reachable"] is False
    assert answered["error"].startswith("curl: (7) ") and answered["error"].count("curl:") == 1, answered["error"]
    assert (answered["figures"], answered["alerts"], answered["trends"]) == (None, None, None)


@needs_curl
def test_prometheus_that_never_answers_is_given_up_on_after_curls_max_time(monkeypatch):
    monkeypatch.setattr(view, "CURL_MAX_TIME", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # connections complete in the backlog; nothing ever answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}{metrics.ROUTE_PREFIX}/api/v1"
        result = run_on_gateway(view.gateway_command(api_url=url))
    answered = view.read(result.returncode, result.stdout, result.stderr)
    assert answered["reachable"] is False and answered["error"].startswith("curl: (28) "), answered["error"]


# --- reading the answers -----------------------------------------------------------------------


def test_nan_means_no_request_and_is_none_not_nan():
    answered = read(figures=vector(GANG0_FIGURES | IDLE_GANG1), alerts=alerts_answer())
    idle = answered["figures"]["gang1"]
    assert idle["ttftP50"] is None and idle["interTokenP50"] is None and idle["tokensPerSecond"] == 0.0
    line = view.figures_line(view.gang_view(answered, "gang1"))
    assert "nan" not in line.lower()
    assert line.startswith("TTFT p50 -, p95 -; ITL p50 -; 0.0 tokens/s; running 0, waiting 0; KV cache 0%")


def test_a_gangs_figures_in_a_line():
    answered = read(figures=vector(GANG0_FIGURES), alerts=alerts_answer())
    assert view.figures_line(view.gang_view(answered, "gang0")) == (
        "TTFT p50 210 ms, p95 840 ms; ITL p50 32 ms; 412.2 tokens/s; running 3, waiting 1; KV cache 41%"
    )


def test_infinity_is_kept_as_prometheus_writes_it_so_json_stays_json():
    """A quantile beyond the largest bucket is +Inf: slower than measured, not no request."""
    answered = read(figures=vector({**GANG0_FIGURES, (metrics.TTFT_P95, "gang0"): "+Inf"}), alerts=alerts_answer())
    gang = view.gang_view(answered, "gang0")
    assert gang["ttftP95"] == "+Inf" and "p95 +Inf s" in view.figures_line(gang)
    json.dumps(answered, allow_nan=False)  # strict JSON: no NaN, no Infinity


def test_a_gang_prometheus_has_no_series_of_says_so_and_not_no_request():
    answered = read(figures=vector(GANG0_FIGURES), alerts=alerts_answer())
    gang = view.gang_view(answered, "gang1")
    assert gang["series"] is False and gang["ttftP50"] is None
    assert view.figures_line(gang).startswith("no series of this gang in Prometheus yet")


@pytest.mark.parametrize(
    ("figures", "expected"),
    [
        (error_answer(), "Prometheus: bad_data: 1:1: parse error: unexpected end of input"),
        ("404 page not found", "404 page not found"),  # a wrong route prefix
        ("<html><body>502 Bad Gateway</body></html>", "<html><body>502 Bad Gateway</body></html>"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "answered a 'matrix', not a vector"),
        ("", "no answer"),
    ],
)
def test_figures_without_a_usable_answer_make_prometheus_unreachable_naming_why(figures, expected):
    answered = read(figures=figures, alerts=alerts_answer())
    assert answered["reachable"] is False and answered["figures"] is None
    assert expected in answered["error"] and answered["error"].startswith("the figures: "), answered["error"]
    assert view.gang_view(answered, "gang0") is None


def test_the_alerts_failing_alone_leaves_the_figures_and_names_the_alerts():
    answered = read(figures=vector(GANG0_FIGURES), alerts=error_answer("boom"))
    assert answered["reachable"] is True and answered["alerts"] is None
    assert answered["error"] == "the alerts: Prometheus: bad_data: boom"


def test_no_answer_from_the_gateway_is_unreachable_naming_ssh():
    answered = view.read(255, "", "no answer from the gateway (203.0.113.5) in 30 s\n")
    assert answered["reachable"] is False
    assert answered["error"] == "the gateway did not answer: no answer from the gateway (203.0.113.5) in 30 s"


def test_alerts_firing_first_then_oldest_each_with_its_gang_node_and_since_when():
    answered = read(
        figures=vector(GANG0_FIGURES),
        alerts=alerts_answer(
            alert("VllmQueueGrowing", "gang0", state="pending", active_at="2026-12-02T04:40:00Z"),
            alert("RayNodeMetricsGone", "gang1", node="gang1-worker-1", active_at="2026-12-02T04:50:00.5Z"),
            alert("VllmGangHung", "gang0", severity="critical", summary="gang gang0 is hung", active_at=AT),
        ),
    )
    assert [(a["name"], a["state"]) for a in answered["alerts"]] == [
        ("RayNodeMetricsGone", "firing"),
        ("VllmGangHung", "firing"),
        ("VllmQueueGrowing", "pending"),
    ]
    now = datetime(2026, 12, 2, 5, 7, 30, tzinfo=timezone.utc)
    lines = [view.alert_line(a, now) for a in answered["alerts"]]
    assert lines == [
        "RayNodeMetricsGone on gang1/gang1-worker-1: firing since 2026-12-02 04:50 UTC (17 min), warning",
        "VllmGangHung on gang0: firing since 2026-12-02 04:53 UTC (14 min), critical: gang gang0 is hung",
        "VllmQueueGrowing on gang0: pending since 2026-12-02 04:40 UTC (27 min), warning",
    ]


def test_an_alert_active_for_hours_says_hours():
    (active,) = read(figures=vector({}), alerts=alerts_answer(alert("VllmKvCacheFull", "gang0")))["alerts"]
    later = datetime.fromisoformat(AT) + timedelta(hours=3, minutes=5)
    assert "(3 h 5 min)" in view.alert_line(active, later)


# --- the trends ------------------------------------------------------------------------------


def test_a_trend_has_a_cell_per_step_placed_by_its_time_with_gaps_where_none():
    start = NOW - 900
    samples = [(start + 20 * i, str(i)) for i in range(46) if i not in (10, 11)]
    samples[5] = (samples[5][0], "NaN")  # no request in that step: a gap too
    answered = read(
        figures=vector(GANG0_FIGURES), alerts=alerts_answer(), trends=matrix({(metrics.TTFT_P95, "gang0"): samples})
    )
    row = answered["trends"]["gang0"]["ttftP95"]
    assert len(row) == 46
    assert row[0] == 0.0 and row[45] == 45.0 and row[10] is None and row[11] is None and row[5] is None
    chart = view.sparkline(row)
    assert len(chart) == 46 and chart[0] == "▁" and chart[-1] == "█"
    assert chart[5] == chart[10] == chart[11] == " "


def test_sparkline_rises_with_its_values_and_flat_is_the_lowest_bar():
    assert view.sparkline([0.0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert view.sparkline([3.0, 3.0, None, 3.0]) == "▁▁ ▁"
    assert view.sparkline([None, "+Inf"]) == "  "


def test_trend_lines_write_min_max_and_last_beside_each_chart():
    cells = 46
    trends = {
        "tokensPerSecond": [None] * (cells - 3) + [100.0, 400.0, 250.5],
        "ttftP95": [None] * cells,
        "requestsWaiting": [0.0] * (cells - 1) + [14.0],
    }
    tokens, ttft, waiting = view.trend_lines(trends)
    assert tokens.startswith("tokens/s  ") and tokens.endswith("▁█▅  min 100.0, max 400.0, last 250.5")
    assert ttft == "TTFT p95  " + " " * cells + "  no data"
    assert waiting.endswith("▁█  min 0, max 14, last 14")


def test_a_name_that_is_no_metric_name_cannot_become_a_selector():
    with pytest.raises(ValueError, match="not a metric name"):
        view.selector(["up|vllm:.*"])


def test_one_cause_for_every_question_is_said_once_though_curls_numbers_differ():
    answered = read(
        figures="curl: (28) Operation timed out after 5001 milliseconds with 0 bytes received",
        alerts="curl: (28) Operation timed out after 5000 milliseconds with 0 bytes received",
    )
    assert answered["error"] == "curl: (28) Operation timed out after 5001 milliseconds with 0 bytes received"
