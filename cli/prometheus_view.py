"""What `vllm-cluster status` shows from Prometheus on the gateway (issue 21): each
gang's serving figures over the rules' window, the alerts that are active, and for
`--watch` the trend of the last 15 minutes as one-line charts.

Pure Python: the shell command that asks Prometheus (run on the gateway over one SSH
call by cli/status.py), the reading of its answers, and the text. Prometheus is asked
on the gateway's loopback, where it needs no login (only nginx on the admin port asks
for one, and only the GPU nodes may reach its own port: components/ports.py). Its HTTP
API answers JSON documents (https://prometheus.io/docs/prometheus/latest/querying/api/):
{"status": "success", "data": ...} or {"status": "error", "errorType": ..., "error": ...},
sample values as strings ("NaN" and "+Inf" included).

The figures are informative: nothing here takes part in status's verdict.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from datetime import datetime, timezone

from components import metrics

# Prometheus's HTTP API on the gateway, from the port and prefix Prometheus is given.
API_URL = metrics.api_url()
# Each curl's bound: three of them stay well inside status's wait for the gateway.
CURL_MAX_TIME = 5
# The figures are the recorded series, each a rate or quantile over this window.
WINDOW = metrics.RATE_WINDOW

# Each gang's figures (the key in status's JSON) and the recorded series they are.
FIGURES = {
    "ttftP50": metrics.TTFT_P50,
    "ttftP95": metrics.TTFT_P95,
    "interTokenP50": metrics.INTER_TOKEN_P50,
    "interTokenP95": metrics.INTER_TOKEN_P95,
    "e2eP95": metrics.E2E_P95,
    "tokensPerSecond": metrics.TOKENS_PER_SECOND,
    "requestsRunning": metrics.REQUESTS_RUNNING,
    "requestsWaiting": metrics.REQUESTS_WAITING,
    "kvCacheUsed": metrics.KV_CACHE_USED,
    "preemptionsPerSecond": metrics.PREEMPTIONS_PER_SECOND,
}
# The trends `--watch` draws, in the order drawn, with their labels.
TRENDS = {"tokensPerSecond": "tokens/s", "ttftP95": "TTFT p95", "requestsWaiting": "waiting"}
TREND_SECONDS = 15 * 60
TREND_POINTS = 45
TREND_STEP = TREND_SECONDS // TREND_POINTS  # 20 s: one chart cell a step
BARS = "▁▂▃▄▅▆▇█"

# What each answer is tagged with on its line of the command's output.
NOW, FIGURES_TAG, ALERTS_TAG, TRENDS_TAG = "now", "figures", "alerts", "trends"
PARTS = {FIGURES_TAG: "the figures", ALERTS_TAG: "the alerts", TRENDS_TAG: "the trends"}
# A metric name as Prometheus's data model allows it: no character is special in a
# regular expression, so a name matches itself in a `=~` matcher unescaped.
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def selector(names) -> str:
    """One vector selector for all of `names`: one query answers every series, each
    sample naming its series in __name__ (matchers are anchored, so no other name)."""
    names = list(names)
    for name in names:
        if not METRIC_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a metric name")
    return '{__name__=~"' + "|".join(names) + '"}'


def figures_query() -> str:
    return selector(FIGURES.values())


def trends_query() -> str:
    return selector(FIGURES[key] for key in TRENDS)


def gateway_command(trends: bool = False, api_url: str = API_URL) -> str:
    """The shell command the gateway runs: the gateway's clock, then one curl per
    question, each answer on one line after its tag. curl's own error (refused, timed
    out) is caught into the line in place of an answer, so every question gets its
    line and the reason it has none. A JSON document has no raw newline in it (the
    format escapes them), so taking out the newlines joins it and changes nothing."""
    lines = [
        "ask() { printf '%s ' \"$1\"; shift; "
        f"curl --silent --show-error --max-time {CURL_MAX_TIME} --get \"$@\" 2>&1 | tr -d '\\n'; echo; }}",
        "now=$(date +%s)",
        f'echo {NOW} "$now"',
        f"ask {FIGURES_TAG} {shlex.quote(api_url + '/query')} "
        f"--data-urlencode {shlex.quote('query=' + figures_query())}",
        f"ask {ALERTS_TAG} {shlex.quote(api_url + '/alerts')}",
    ]
    if trends:
        # The window ends at the gateway's own now, which the answer carries: the
        # chart's cells line up with the steps whatever the operator's clock says.
        lines.append(
            f"ask {TRENDS_TAG} {shlex.quote(api_url + '/query_range')} "
            f"--data-urlencode {shlex.quote('query=' + trends_query())} "
            f'--data-urlencode "start=$((now - {TREND_SECONDS}))" --data-urlencode "end=$now" '
            f"--data-urlencode step={TREND_STEP}"
        )
    return "\n".join(lines)


# --- reading the answers ----------------------------------------------------------------


class Unanswered(Exception):
    """A question without a usable answer; the message says why, in one line."""


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def api_data(line: str | None):
    """The `data` of one API answer. Raises Unanswered naming curl's error, a body that
    is not JSON (another server on the port, a wrong prefix), or Prometheus's error."""
    if not line:
        raise Unanswered("no answer")
    try:
        answer = json.loads(line)
    except json.JSONDecodeError:
        # curl's error (curl: (7) Failed to connect ...) or a body that is not the API's.
        raise Unanswered(_one_line(line)) from None
    if not isinstance(answer, dict):
        raise Unanswered(f"not an answer of Prometheus's API: {_one_line(line)}")
    if answer.get("status") != "success":
        if answer.get("status") == "error":
            raise Unanswered(f"Prometheus: {answer.get('errorType')}: {answer.get('error')}")
        raise Unanswered(f"not an answer of Prometheus's API (status {answer.get('status')!r})")
    if "data" not in answer:
        raise Unanswered("Prometheus's answer has no data")
    return answer["data"]


def value(text: str) -> float | str | None:
    """A sample's value: a number, None for NaN (a quantile over no request is NaN: there
    was nothing to measure), or "+Inf"/"-Inf" as Prometheus writes them (a quantile
    beyond the largest bucket), since JSON has no infinity for status's --json."""
    number = float(text)
    if math.isnan(number):
        return None
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return number


def _results(data, kind: str) -> list:
    if not isinstance(data, dict) or data.get("resultType") != kind:
        raise Unanswered(f"Prometheus answered a {(data or {}).get('resultType')!r}, not a {kind}")
    return data["result"]


def figures_by_gang(data) -> dict[str, dict]:
    """An instant query's vector of the recorded series: {gang: {figure key: value}},
    every figure present (None where the gang has no such series or its value is NaN)."""
    keys = {series: key for key, series in FIGURES.items()}
    gangs: dict[str, dict] = {}
    for sample in _results(data, "vector"):
        labels = sample["metric"]
        key, gang = keys.get(labels.get("__name__")), labels.get("gang")
        if key and gang:
            gangs.setdefault(gang, dict.fromkeys(FIGURES))[key] = value(sample["value"][1])
    return gangs


def trends_by_gang(data, now: float) -> dict[str, dict]:
    """A range query's matrix over the TREND_SECONDS before `now`: {gang: {trend key:
    [value or None] * TREND_POINTS + 1}}, a cell per step, None where there was no
    sample (a gap: the series was absent, or NaN)."""
    keys = {FIGURES[key]: key for key in TRENDS}
    start = now - TREND_SECONDS
    cells = TREND_SECONDS // TREND_STEP + 1  # the query's points run from start to end inclusive
    gangs: dict[str, dict] = {}
    for series in _results(data, "matrix"):
        labels = series["metric"]
        key, gang = keys.get(labels.get("__name__")), labels.get("gang")
        if not (key and gang):
            continue
        row = gangs.setdefault(gang, {k: [None] * cells for k in TRENDS})[key]
        for stamp, text in series["values"]:
            cell = round((float(stamp) - start) / TREND_STEP)
            if 0 <= cell < cells:
                row[cell] = value(text)
    return gangs


def alerts_of(data) -> list[dict]:
    """The active alerts, firing before pending, then oldest first: each its name,
    state, gang and node (None where the alert has none), severity, summary, activeAt
    (RFC 3339, as Prometheus gives it) and value."""
    alerts = []
    for alert in data["alerts"]:
        labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
        alerts.append(
            {
                "name": labels.get("alertname"),
                "state": alert.get("state"),
                "gang": labels.get("gang"),
                "node": labels.get("node"),
                "severity": labels.get("severity"),
                "summary": annotations.get("summary"),
                "activeAt": alert.get("activeAt"),
                "value": alert.get("value"),
            }
        )
    return sorted(alerts, key=lambda a: (a["state"] != "firing", a["activeAt"] or "", a["name"] or "", a["gang"] or ""))


def _tagged(stdout: str) -> dict[str, str]:
    lines = {}
    for line in stdout.splitlines():
        tag, _, rest = line.partition(" ")
        lines[tag] = rest
    return lines


def read(returncode: int, stdout: str, stderr: str, trends: bool = False) -> dict:
    """The gateway command's output as {reachable, error, figures, alerts, trends}:
    figures and trends by gang, alerts a list; each None when its question got no
    usable answer, and error then says why (None when all were answered). Reachable
    is whether the figures were had."""
    lines = _tagged(stdout)
    asked = [FIGURES_TAG, ALERTS_TAG] + ([TRENDS_TAG] if trends else [])
    if not any(tag in lines for tag in asked):
        # The command never ran: SSH to the gateway failed or timed out.
        reason = _one_line(stderr) or f"exit {returncode}"
        return {"reachable": False, "error": f"the gateway did not answer: {reason}", **dict.fromkeys(PARTS)}
    view, errors = {}, {}
    readers = {
        FIGURES_TAG: figures_by_gang,
        ALERTS_TAG: alerts_of,
        TRENDS_TAG: lambda data: trends_by_gang(data, float(lines[NOW])),
    }
    for tag in PARTS:
        view[tag] = None
        if tag not in asked:
            continue
        try:
            view[tag] = readers[tag](api_data(lines.get(tag)))
        except Unanswered as error:
            errors[tag] = str(error)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            # JSON of success but not of the shape the API documents for this question.
            errors[tag] = f"an answer of an unexpected shape ({error!r})"
    return {"reachable": view[FIGURES_TAG] is not None, "error": _errors(errors, len(asked)), **view}


def _errors(errors: dict[str, str], asked: int) -> str | None:
    if not errors:
        return None
    # One cause for all (Prometheus down, most likely): said once. curl's messages of one
    # cause differ in their numbers only ("timed out after 5001 milliseconds").
    if len(errors) == asked and len({re.sub(r"\d+", "#", reason) for reason in errors.values()}) == 1:
        return next(iter(errors.values()))
    return "; ".join(f"{PARTS[tag]}: {reason}" for tag, reason in errors.items())


def gang_view(view: dict, gang: str) -> dict | None:
    """One gang's part of the view, for status's report: {window, series, figures...,
    trends when asked}; series False when Prometheus has none of the gang's yet. None
    when the figures were not had."""
    if view["figures"] is None:
        return None
    figures = view["figures"].get(gang)
    result = {"window": WINDOW, "series": figures is not None, **(figures or dict.fromkeys(FIGURES))}
    if view["trends"] is not None:
        cells = TREND_SECONDS // TREND_STEP + 1
        result["trends"] = {
            "seconds": TREND_SECONDS,
            "step": TREND_STEP,
            **view["trends"].get(gang, {k: [None] * cells for k in TRENDS}),
        }
    return result


# --- the text -----------------------------------------------------------------------------


def _finite(number) -> bool:
    return isinstance(number, float | int)


def seconds_text(seconds: float | str | None) -> str:
    if seconds is None:
        return "-"  # NaN: no request in the window
    if not _finite(seconds):
        return f"{seconds} s"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _number(number: float | str | None, digits: int = 1) -> str:
    if number is None:
        return "-"
    return f"{number:.{digits}f}" if _finite(number) else number


def _percent(share: float | str | None) -> str:
    return f"{share * 100:.0f}%" if _finite(share) else _number(share)


def figures_line(gang: dict) -> str:
    """`gang`'s figures in a line: latencies, throughput, queue, KV cache."""
    if not gang["series"]:
        return "no series of this gang in Prometheus yet (not scraped, or the rules not evaluated yet)"
    return (
        f"TTFT p50 {seconds_text(gang['ttftP50'])}, p95 {seconds_text(gang['ttftP95'])}; "
        f"ITL p50 {seconds_text(gang['interTokenP50'])}; {_number(gang['tokensPerSecond'])} tokens/s; "
        f"running {_number(gang['requestsRunning'], 0)}, waiting {_number(gang['requestsWaiting'], 0)}; "
        f"KV cache {_percent(gang['kvCacheUsed'])}"
    )


def sparkline(values: list) -> str:
    """One cell per value, its bar's height from the lowest to the highest number; a
    space where there is none (None, or an infinite quantile, which has no height).
    All equal: the lowest bar."""
    finite = [v for v in values if _finite(v)]
    low, high = (min(finite), max(finite)) if finite else (0.0, 0.0)
    cells = []
    for v in values:
        if not _finite(v):
            cells.append(" ")
        elif high == low:
            cells.append(BARS[0])
        else:
            cells.append(BARS[round((v - low) / (high - low) * (len(BARS) - 1))])
    return "".join(cells)


def trend_lines(trends: dict) -> list[str]:
    """Each trend a chart with its lowest, highest and last value beside it."""
    shows = {"tokensPerSecond": _number, "ttftP95": seconds_text, "requestsWaiting": lambda n: _number(n, 0)}
    lines = []
    for key, label in TRENDS.items():
        values, show = trends[key], shows[key]
        finite = [v for v in values if _finite(v)]
        beside = f"min {show(min(finite))}, max {show(max(finite))}, last {show(finite[-1])}" if finite else "no data"
        lines.append(f"{label:10s}{sparkline(values)}  {beside}")
    return lines


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def alert_line(alert: dict, now: datetime) -> str:
    """`VllmKvCacheFull on gang0: firing since 2026-01-05 12:03 UTC (14 min), warning: ...`"""
    where = "/".join(part for part in (alert["gang"], alert["node"]) if part)
    since = ""
    if alert["activeAt"]:
        try:
            active = datetime.fromisoformat(alert["activeAt"])
        except ValueError:
            since = f" since {alert['activeAt']}"  # not RFC 3339 after all: as given
        else:
            # Prometheus writes UTC ("...Z"); one without an offset is taken as UTC too.
            active = active.astimezone(timezone.utc) if active.tzinfo else active.replace(tzinfo=timezone.utc)
            since = f" since {active:%Y-%m-%d %H:%M} UTC ({_duration((now - active).total_seconds())})"
    summary = f": {alert['summary']}" if alert["summary"] else ""
    severity = f", {alert['severity']}" if alert["severity"] else ""
    return f"{alert['name']}{' on ' + where if where else ''}: {alert['state']}{since}{severity}{summary}"
