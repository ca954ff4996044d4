"""`vllm-cluster status --stack NAME`: gang health, not process health, for each gang
and for the pool the gateway balances over. Per gang, from its head: Ray's live nodes
and GPUs against the gang's nodes, vLLM's unit and /health, the stack's probe against
that head's own vLLM (the gateway would pick any gang), and vLLM's metrics. For the
pool: the probe through the endpoint with its latency, and the gateway's view of which
gangs it sends requests to (a drained gang is out of it). The probe is a real small
request of the model's task (components/api_routes.py stack_probe): a 1-token
completion for a generation model, an embedding or a classification for a pooling one;
"completion" below is that probe.

A gang serves when its own completion succeeds: it is serving, degraded (serving
but a node or GPU is missing, or so saturated that its completion waited out the
timeout while the engine made tokens for others), down (not serving) or unknown (its
head did not answer).

Exit 0 healthy (every gang serves whole, or is stopped by idle stop while another
serves); 1 degraded (something serves, but a gang does not, lacks a node or GPU, or
the endpoint's completion fails: what is wrong is named); 2 down (no gang serves); 3
unknown (the tool could not look: no outputs, no answer from any head, and no
completion either); 4 stopped or waking (idleStopMinutes: every gang's instances are
stopped, stopping or starting, as the stack was asked to do; the next request, or
`vllm-cluster wake`, starts them). A gang drained from the gateway's
pool makes the pool degraded, named: during a roll that is the truth (it serves with
less), and a roll that failed leaves it so until an operator returns it.

With warm gangs (maxReplicas above replicas, issue 36) each gang shows its role,
always-on or warm, and why the waker last woke or stopped it (the waker's power.json);
neither changes a verdict.

Beside the verdicts, from Prometheus on the gateway (cli/prometheus_view.py): each
gang's serving figures over the rules' window (TTFT, inter-token latency, tokens/s,
the queue, the KV cache), the active alerts, and with --watch the trends of the last
15 minutes. They inform and never judge: an alert firing or Prometheus unreachable
changes no verdict and no exit code.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

from cli import prometheus_view
from cli.cluster import Cluster, Gang, stack_outputs
from cli.stack_file import read_stack
from components import bootstrap, metrics

HEALTHY, DEGRADED, DOWN, UNKNOWN, IDLE = 0, 1, 2, 3, 4
VERDICTS = {HEALTHY: "healthy", DEGRADED: "degraded", DOWN: "down", UNKNOWN: "unknown"}
# A gang's verdict, and how the pool's problems name a gang that has one.
SERVING, GANG_DEGRADED, GANG_DOWN, GANG_UNKNOWN = "serving", "degraded", "down", "unknown"
# A gang's instances as the gateway's waker sees them (idleStopMinutes; `vllm-cluster-gateway
# power`): stopped by idle stop (or `vllm-cluster stop`), stopping, or started and not yet
# serving. None of them is a fault: the next request wakes a stopped service.
POWERED_DOWN = ("stopped", "stopping", "waking")
GANG_STATES = {GANG_DEGRADED: "is degraded", GANG_DOWN: "is not serving", GANG_UNKNOWN: "is unknown"}
# status-facts on a head: the GCS and /health (10 s each at most), its completion
# (30 s at most, scripts/node/vllm-cluster-node), two metric samples 2 s apart.
FACTS_TIMEOUT = 120
DRAINED = "drained"  # the gateway's word for a gang out of its pool
# Prometheus's questions on the gateway: three curls of prometheus_view.CURL_MAX_TIME
# at most, and the SSH login.
PROMETHEUS_TIMEOUT = 30
# A gang's role (issue 36): always-on gangs (the first `replicas`) always serve; warm ones
# are kept stopped and started by the waker when requests queue, drained and stopped again
# when the load fits on one gang fewer (scripts/gateway/vllm-cluster-waker scale_in_decision).
ALWAYS_ON, WARM = "always-on", "warm"
ROLES = {
    ALWAYS_ON: "always-on (serves always, never stopped for idleness)",
    WARM: "warm (started when requests queue, stopped when the load fits on one gang fewer)",
}
# The waker's state file on the gateway (scripts/gateway/vllm-cluster-waker STATE_DIR, its
# header's "Writes"): per gang its record, with the role and why it was last woken or
# stopped (why, why_at) from issue 36 on. Read in the same login as `power`, after a line
# of its own.
POWER_FILE = "/var/lib/vllm-cluster/gateway/power.json"
POWER_FILE_MARK = "--- power.json"


def power_command() -> str:
    """`power`'s lines, then (when it succeeded) the mark and power.json: one login."""
    return f"sudo {bootstrap.GATEWAY_COMMAND} power && echo '{POWER_FILE_MARK}' && sudo cat {POWER_FILE}"


def _head_answer(result) -> dict:
    """A head's status-facts answer: {facts, factsError}, facts None when it gave none."""
    facts = None
    if result.returncode == 0 and result.stdout.strip():
        try:
            facts = json.loads(result.stdout)
        except json.JSONDecodeError:
            pass
    error = None if facts is not None else (result.stderr.strip() or "no answer from the head")
    return {"facts": facts, "factsError": error}


def _gateway_pool(result) -> dict:
    """The gateway's pool as `vllm-cluster-gateway pool` prints it, one gang a line
    (`gang1 10.0.1.9:8000 drained not-serving`): {view: name -> {address, state,
    health}, error}. view is None when the gateway gave none (one from before
    replicas has no such subcommand): status then judges without it."""
    view = {}
    if result.returncode == 0:
        for line in result.stdout.splitlines():
            fields = line.split()
            if len(fields) >= 3:
                view[fields[0]] = {"address": fields[1], "state": fields[2], "health": (fields[3:] or [None])[0]}
    if view:
        return {"view": view, "error": None}
    error = " ".join(result.stderr.split()) if result.returncode else "it listed no gang"
    return {"view": None, "error": error or f"exit {result.returncode}"}


def _power_records(text: str) -> dict[str, dict]:
    """power.json's gang records; none when it is missing or unreadable (a waker that
    never wrote it)."""
    try:
        gangs = json.loads(text).get("gangs")
    except (ValueError, AttributeError):
        return {}
    return {name: record for name, record in (gangs or {}).items() if isinstance(record, dict)}


def _in_trouble(record: dict) -> bool:
    """Whether the waker's `power` line carries trouble for this record: a start EC2
    refuses during a wake, or a wake given up (the waker's trouble())."""
    wake, failed = record.get("wake"), record.get("failed")
    return bool((wake and wake.get("refusal")) or (failed and not wake))


def _gateway_power(result) -> dict:
    """The waker's view as `vllm-cluster-gateway power` prints it, one gang a line
    (`gang1 stopped 2026-12-02T12:03:00Z`, `gang0 serving -`, and after them what EC2
    refused or why a wake was given up), then power.json after POWER_FILE_MARK:
    {view: name -> {state, since (None for -), trouble (None when nothing went wrong),
    role, why, whyAt (None when power.json does not say)}, error}; view None when the
    gateway gave none."""
    lines = result.stdout.splitlines()
    if POWER_FILE_MARK in lines:  # `power` succeeded (&&); power.json may still be missing
        at = lines.index(POWER_FILE_MARK)
        lines, records, listed = lines[:at], _power_records("\n".join(lines[at + 1 :])), True
    else:
        records, listed = {}, result.returncode == 0
    view = {}
    if listed:
        for line in lines:
            fields = line.split(None, 3)
            if len(fields) >= 2 and fields[0].startswith("gang"):
                since = fields[2] if len(fields) > 2 and fields[2] != "-" else None
                trouble = fields[3].strip() if len(fields) > 3 else None
                record = records.get(fields[0])
                if record is not None and not _in_trouble(record):
                    trouble = None  # the rest of the line is not trouble (a waker that prints more)
                role = (record or {}).get("role")
                view[fields[0]] = {
                    "state": fields[1],
                    "since": since,
                    "trouble": trouble,
                    "role": role if role in ROLES else None,
                    "why": (record or {}).get("why") or None,
                    "whyAt": (record or {}).get("why_at") or None,
                }
    if view:
        return {"view": view, "error": None}
    error = " ".join(result.stderr.split()) if result.returncode else "it listed no gang"
    return {"view": None, "error": error or f"exit {result.returncode}"}


def _powered_down(power: dict, gang_name: str) -> str | None:
    """The gang's state when the waker has it stopped, stopping or waking, else None."""
    state = ((power["view"] or {}).get(gang_name) or {}).get("state")
    return state if state in POWERED_DOWN else None


def _prometheus(result, trends: bool) -> dict:
    return prometheus_view.read(result.returncode, result.stdout, result.stderr, trends)


def snapshot(cluster: Cluster, spec, trends: bool = False) -> dict:
    """Every gang's head's status-facts, a completion through the endpoint, the
    gateway's pool and Prometheus's figures and alerts (with `trends`, the last 15
    minutes' too), asked at once (each bounded by its own timeout). Prometheus's
    questions go in one SSH call: a login costs more than all of them.

    With idleStopMinutes the waker's view comes first: a stopped or waking gang's head is
    not asked (it is off, or still booting), and no completion goes through the endpoint
    while no gang serves, as it would wake the service."""
    facts_command = f"sudo {bootstrap.NODE_COMMAND} status-facts"
    power = {"view": None, "error": None}
    if getattr(spec, "idle_stop_minutes", None):
        power = _gateway_power(cluster.ssh_gateway(power_command()))
    asleep = {gang.name: _powered_down(power, gang.name) for gang in cluster.gangs}
    all_asleep = power["view"] is not None and all(asleep.values())
    with ThreadPoolExecutor(len(cluster.gangs) + 3) as pool:
        heads = [
            None if asleep[gang.name] else pool.submit(cluster.ssh, gang.head, facts_command, FACTS_TIMEOUT)
            for gang in cluster.gangs
        ]
        endpoint = None if all_asleep else pool.submit(cluster.probe, bootstrap.stack_probe(spec))
        gateway = pool.submit(cluster.ssh_gateway, f"sudo {bootstrap.GATEWAY_COMMAND} pool")
        prometheus = pool.submit(cluster.ssh_gateway, prometheus_view.gateway_command(trends), PROMETHEUS_TIMEOUT)
        if endpoint is None:
            completion = {"status": None, "seconds": 0.0, "error": "not sent: no gang serves, and a request wakes them"}
        else:
            status, seconds, error = endpoint.result()
            completion = {"status": status, "seconds": round(seconds, 3), "error": error}
        return {
            "gangs": [
                {"facts": None, "factsError": None, "power": asleep[gang.name]}
                if head is None
                else _head_answer(head.result())
                for gang, head in zip(cluster.gangs, heads, strict=True)
            ],
            "completion": completion,
            "gateway": _gateway_pool(gateway.result()),
            "power": power,
            "prometheus": _prometheus(prometheus.result(), trends),
        }


def _http(status) -> str:
    return f"HTTP {status or 'nothing'}"


def _idle_since(power_entry: dict | None, spec) -> str | None:
    """When a stopped gang's last request was: its instances stopped idleStopMinutes after
    it (to the idle check's period), so the stop's time less that."""
    since = (power_entry or {}).get("since")
    minutes = getattr(spec, "idle_stop_minutes", None)
    if not since or not minutes:
        return None
    try:
        stopped = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (stopped - timedelta(minutes=minutes)).strftime("%Y-%m-%d %H:%M UTC")


def _asleep_gang(gang: Gang, spec, state: str, power_entry: dict | None, pool_entry: dict | None) -> dict:
    """A gang the waker has stopped, stopping or waking: no fault, and not asked."""
    idle_since = _idle_since(power_entry, spec) if state == "stopped" else None
    described = f"stopped (idle since {idle_since})" if idle_since else state
    return {
        "name": gang.name,
        "verdict": state,
        "described": described,
        # What EC2 refused during its wake, or why the waker gave the wake up (issue 34).
        "wakeTrouble": (power_entry or {}).get("trouble"),
        "serving": False,
        "notServingReason": described,
        "pool": pool_entry,
        "power": power_entry,
        "idleSince": idle_since,
        "problems": [],
        "nodes": [{"node": n.name, "ip": n.ip, "alive": None, "gpus": None} for n in gang.nodes],
        "ray": {
            "nodes": 0,
            "expectedNodes": len(gang.nodes),
            "gpus": 0,
            "expectedGpus": len(gang.nodes) * spec.gpus_per_node,
        },
        "vllm": {"unit": None, "health": None},
        "completion": None,
        "metrics": None,
    }


def assess_gang(gang: Gang, spec, answer: dict, pool_entry: dict | None, power_entry: dict | None = None) -> dict:
    """One gang's verdict from its head's facts: serving, degraded, down or unknown; or
    from the waker's view (idleStopMinutes): stopped, stopping or waking."""
    if answer.get("power"):
        return _asleep_gang(gang, spec, answer["power"], power_entry, pool_entry)
    facts = answer["facts"]
    seen = facts is not None and "ray_error" not in facts  # did we see Ray's membership at all?
    alive = (facts or {}).get("alive", {})
    gpus_expected = len(gang.nodes) * spec.gpus_per_node
    nodes = [
        {"node": n.name, "ip": n.ip, "alive": (n.ip in alive) if seen else None, "gpus": alive.get(n.ip)}
        for n in gang.nodes
    ]
    gpus = sum(alive.get(n.ip, 0) for n in gang.nodes)
    completion = (facts or {}).get("completion")
    vllm = {"unit": (facts or {}).get("vllm_unit"), "health": (facts or {}).get("health")}
    problems, not_serving = [], None
    if facts is None:
        problems.append(f"the head did not answer: {answer['factsError']}")
    else:
        problems += _membership_problems(facts, nodes, gpus, gpus_expected)
        # Whether vLLM serves goes first: it decides the verdict.
        serving_problem, not_serving = _serving_problem(gang, spec, facts, completion, vllm)
        if serving_problem:
            problems.insert(0, serving_problem)
    if facts is None:
        verdict = GANG_UNKNOWN
    elif not_serving:
        verdict = GANG_DOWN
    else:
        verdict = GANG_DEGRADED if problems else SERVING
    return {
        "name": gang.name,
        "verdict": verdict,
        "serving": verdict in (SERVING, GANG_DEGRADED),
        "notServingReason": not_serving,
        "pool": pool_entry,
        "problems": problems,
        "nodes": nodes,
        "ray": {
            "nodes": sum(bool(n["alive"]) for n in nodes),
            "expectedNodes": len(gang.nodes),
            "gpus": gpus,
            "expectedGpus": gpus_expected,
        },
        "vllm": vllm,
        "completion": completion,
        "metrics": (facts or {}).get("metrics"),
    }


def _membership_problems(facts: dict, nodes: list[dict], gpus: float, gpus_expected: int) -> list[str]:
    """What the head's Ray cluster lacks of the gang: its GCS's answer, a node, a GPU."""
    if "ray_error" in facts:
        return [f"Ray's GCS did not answer on the head: {facts['ray_error']}"]
    problems = [f"{n['node']} ({n['ip']}) is not in the Ray cluster" for n in nodes if not n["alive"]]
    if gpus < gpus_expected:
        problems.append(f"Ray has {gpus:g} of {gpus_expected} GPUs")
    return problems


def _serving_problem(
    gang: Gang, spec, facts: dict, completion: dict | None, vllm: dict
) -> tuple[str | None, str | None]:
    """(the problem with vLLM's serving, why it does not serve): a saturated engine still
    serves; one whose probe (or, from an older head, /health) fails does not."""
    # What the head's probe was, for the messages ("a completion" on a generation model).
    what = bootstrap.stack_probe(spec).what
    # A head whose status-facts predates its own completion: /health has to do.
    serves = completion["status"] == 200 if completion else vllm["health"] == 200
    if _saturated(completion):
        # Its completion waited behind a full batch the engine is working through:
        # busy, not dead (the watchdog leaves such a server alone too).
        metrics = (facts or {}).get("metrics") or {}
        return (
            f"vLLM is saturated: {what} on {gang.head.name} got no answer within "
            f"{completion['seconds']:.0f} s while the engine made {completion['tokens_while_waiting']:g} tokens "
            f"for other requests ({metrics.get('running', 0):g} running, {metrics.get('waiting', 0):g} waiting)",
            None,
        )
    if not serves:
        not_serving = f"unit {vllm['unit'] or 'unknown'}, /health {vllm['health'] or 'no answer'}"
        if completion:
            error = f" ({completion['error']})" if completion["error"] else ""
            not_serving += f", {what} on {gang.head.name} got {_http(completion['status'])}{error}"
        return f"vLLM is not serving ({not_serving})", not_serving
    return None, None


def _saturated(completion: dict | None) -> bool:
    """The head's completion got no answer in time while the engine made tokens."""
    return bool(completion) and completion["status"] == 0 and completion.get("tokens_while_waiting", 0) > 0


def _gang_problem(gang: dict) -> str:
    """A gang's problems as one of the pool's: named, so the operator knows which."""
    problems = gang["problems"]
    if gang["verdict"] == GANG_DOWN:  # its first problem says why it does not serve
        return f"{gang['name']} is not serving ({gang['notServingReason']})" + "".join(f"; {p}" for p in problems[1:])
    return f"{gang['name']} {GANG_STATES[gang['verdict']]}: " + "; ".join(problems)


def gang_role(index: int, replicas: int, power_entry: dict | None) -> str:
    """A gang's role as the waker's power.json says it (issue 36); from a waker before it,
    the stack's: the first `replicas` gangs always on, the others warm."""
    role = (power_entry or {}).get("role")
    if role in ROLES:
        return role
    return ALWAYS_ON if index < replicas else WARM


def assess(cluster: Cluster, spec, snap: dict) -> dict:
    """The pool's verdict from every gang's and the endpoint's. The top-level nodes,
    ray, vllm and metrics are gang 0's (as before replicas); verdict, exitCode,
    problems and completion (through the endpoint) are the pool's."""
    view = snap["gateway"]["view"]
    power = (snap.get("power") or {}).get("view") or {}
    gangs = [
        assess_gang(gang, spec, answer, None if view is None else view.get(gang.name), power.get(gang.name))
        for gang, answer in zip(cluster.gangs, snap["gangs"], strict=True)
    ]
    for index, (gang, report) in enumerate(zip(cluster.gangs, gangs, strict=True)):
        # Its role, and why the waker last woke or stopped it (None from a waker before issue 36).
        entry = power.get(gang.name) or {}
        report.update(role=gang_role(index, spec.replicas, entry), why=entry.get("why"), whyAt=entry.get("whyAt"))
    asleep = [g for g in gangs if g["verdict"] in POWERED_DOWN]
    drained = {g["name"] for g in gangs if (g["pool"] or {}).get("state") == DRAINED}
    completion = snap["completion"]
    problems = _pool_problems(gangs, drained, view is not None, spec, completion)
    serving_in_pool = [g for g in gangs if g["serving"] and g["name"] not in drained]
    verdict = _pool_verdict(gangs, asleep, serving_in_pool, problems, completion)
    # Informative only, after the verdict: nothing below may change it.
    prometheus = snap["prometheus"]
    for gang in gangs:
        gang["prometheus"] = prometheus_view.gang_view(prometheus, gang["name"])
    first = gangs[0]
    if verdict == IDLE:
        named = "waking" if any(g["verdict"] == "waking" for g in gangs) else "stopped"
    else:
        named = VERDICTS[verdict]
    return {
        "verdict": named,
        "exitCode": verdict,
        "problems": problems,
        "pool": {
            "serving": [g["name"] for g in serving_in_pool],
            "notServing": [g["name"] for g in gangs if not g["serving"]],
            "drained": None if view is None else sorted(drained),
            "asleep": {g["name"]: g["described"] for g in asleep},
            "gatewayError": snap["gateway"]["error"],
            "replicas": spec.replicas,
            "maxReplicas": getattr(spec, "max_replicas", None) or spec.replicas,
        },
        "gangs": gangs,
        "nodes": first["nodes"],
        "ray": first["ray"],
        "vllm": first["vllm"],
        "completion": completion,
        "metrics": first["metrics"],
        "prometheus": {"reachable": prometheus["reachable"], "error": prometheus["error"]},
        "alerts": prometheus["alerts"],
    }


def _pool_problems(gangs: list[dict], drained: set[str], pool_seen: bool, spec, completion: dict) -> list[str]:
    """The pool's problems: each gang's, named (a gang stopped by idle stop has none but
    trouble with its wake), a gang drained or missing from the gateway's pool (when the
    gateway gave its pool), and the endpoint's completion when it failed."""
    problems = []
    for gang in gangs:
        if gang["verdict"] in POWERED_DOWN:
            # Idle stop's doing, not a fault: listed with its state, not as a problem;
            # unless EC2 refuses to start it again, or its wake was given up.
            if gang.get("wakeTrouble"):
                problems.append(f"{gang['name']}: {gang['wakeTrouble']}")
            continue
        if gang["name"] in drained:
            # Out of the pool: the pool serves with less, whether a roll is under way or
            # one failed and left it so (which only an operator notices). Say which.
            problems.append(
                f"{gang['name']} is drained: out of the gateway's pool (a rolling change under way, or one that "
                f"failed: once it serves, sudo {bootstrap.GATEWAY_COMMAND} return --gang {gang['name']} on the "
                "gateway)" + "".join(f"; {p}" for p in gang["problems"])
            )
        elif gang["problems"]:
            problems += gang["problems"] if len(gangs) == 1 else [_gang_problem(gang)]
        if pool_seen and gang["pool"] is None:
            problems.append(f"{gang['name']} is not in the gateway's pool: the gateway sends it no request")
    if completion["status"] is not None and completion["status"] != 200:
        problems.append(
            f"{bootstrap.stack_probe(spec).what} through the endpoint got {_http(completion['status'])}"
            + (f" ({completion['error']})" if completion["error"] else "")
        )
    return problems


def _pool_verdict(
    gangs: list[dict], asleep: list[dict], serving_in_pool: list[dict], problems: list[str], completion: dict
) -> int:
    """The pool's exit code: stopped by idle stop, unknown, down, degraded or healthy."""
    if asleep and len(asleep) == len(gangs):
        # Every gang stopped (or waking) by idle stop: what the stack was asked to do;
        # down when EC2 will not start one again (its wake refused, or given up).
        return DOWN if problems else IDLE
    if all(g["verdict"] == GANG_UNKNOWN for g in gangs) and completion["status"] != 200:
        return UNKNOWN  # nothing answered: we cannot tell down from unreachable
    if not serving_in_pool and completion["status"] != 200:
        return DOWN
    return DEGRADED if problems else HEALTHY


def _gang_lines(gang: dict, width: int) -> list[str]:
    lines = [f"  {'node':{width}s}{'ip':17s}{'ray':9s}GPUs"]
    for node in gang["nodes"]:
        gpus = f"{node['gpus']:g}" if node["gpus"] is not None else "-"
        state = {True: "alive", False: "MISSING", None: "unknown"}[node["alive"]]
        lines.append(f"  {node['node']:{width}s}{node['ip']:17s}{state:9s}{gpus}")
    ray, vllm, completion, metrics = gang["ray"], gang["vllm"], gang["completion"], gang["metrics"]
    head = gang["nodes"][0]
    lines += [
        "",
        f"  ray         {ray['nodes']}/{ray['expectedNodes']} nodes, {ray['gpus']:g}/{ray['expectedGpus']} GPUs",
        f"  vllm        unit {vllm['unit'] or 'unknown'}, /health {vllm['health'] if vllm['health'] else 'no answer'}",
    ]
    if completion:
        lines.append(
            f"  completion  HTTP {completion['status'] or 'none'} in {completion['seconds']:.2f} s "
            f"on {head['node']} ({head['ip']})"
        )
    if metrics:
        lines.append(
            f"  metrics     running {metrics['running']:g}, waiting {metrics['waiting']:g}, "
            f"KV cache {metrics['kv_cache_usage'] * 100:.1f}%, {metrics['tokens_per_second']:.1f} tokens/s"
        )
    figures = gang["prometheus"]
    if figures:
        lines.append(f"  {'last ' + figures['window']:12s}{prometheus_view.figures_line(figures)}")
        if "trends" in figures:  # asked for --watch only
            charts = prometheus_view.trend_lines(figures["trends"])
            minutes = figures["trends"]["seconds"] // 60
            lines += [f"  {f'{minutes} min' if i == 0 else '':12s}{chart}" for i, chart in enumerate(charts)]
    return lines


def _utc(stamp: str) -> str:
    """An ISO time as the other times of status print (UTC to the minute); as given when
    it is not one."""
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return stamp
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _role_lines(gang: dict, scales: bool) -> list[str]:
    """Its role (with warm gangs only) and why the waker last woke or stopped it."""
    lines = [f"  {'role':12s}{ROLES[gang['role']]}"] if scales and gang.get("role") in ROLES else []
    if gang.get("why"):
        at = f" ({_utc(gang['whyAt'])})" if gang.get("whyAt") else ""
        lines.append(f"  {'why':12s}{gang['why']}{at}")
    return lines


def _asleep_lines(gang: dict, scales: bool = False) -> list[str]:
    """A stopped, stopping or waking gang: its state (and idle time), its nodes unasked."""
    nodes = ", ".join(node["node"] for node in gang["nodes"])
    doing = {"stopped": "stopped", "stopping": "stopping", "waking": "starting"}[gang["verdict"]]
    return [
        f"  {gang['name']:12s}{gang['verdict'].upper()}"
        + (f" (idle since {gang['idleSince']})" if gang["idleSince"] else ""),
        *_role_lines(gang, scales),
        f"  {'':12s}{nodes}: not asked, their instances are {doing}",
        *([f"  {'':12s}{gang['wakeTrouble']}"] if gang.get("wakeTrouble") else []),
    ]


def _prometheus_lines(report: dict, now: datetime) -> list[str]:
    """Prometheus unreachable in one line naming why, or the active alerts (none said)."""
    prometheus, alerts = report["prometheus"], report["alerts"]
    lines = []
    if not prometheus["reachable"]:
        where = metrics.loopback_url()
        return [f"  prometheus  unreachable ({where} on the gateway): {prometheus['error']}"]
    if prometheus["error"]:
        lines.append(f"  prometheus  {prometheus['error']}")
    if alerts is not None:
        described = [prometheus_view.alert_line(alert, now) for alert in alerts] or ["none"]
        lines += [f"  {'alerts' if i == 0 else '':12s}{text}" for i, text in enumerate(described)]
    return lines


def render(stack: str, report: dict, endpoint: str) -> str:
    """One block per gang, then the pool; with one gang, no gang headings."""
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y-%m-%d %H:%M:%S UTC")
    gangs = report["gangs"]
    width = max(10, *(len(n["node"]) + 2 for g in gangs for n in g["nodes"]))
    lines = [f"vllm-cluster status: stack {stack}   {stamp}"]
    pool = report["pool"]
    scales = pool.get("maxReplicas", 0) > pool.get("replicas", 0)
    for gang in gangs:
        lines.append("")
        if gang["verdict"] in POWERED_DOWN:
            lines += _asleep_lines(gang, scales)
            continue
        if len(gangs) > 1:
            where = f", {gang['pool']['state']}" if gang["pool"] else ""
            lines.append(f"  {gang['name']:12s}{gang['verdict'].upper()}{where}")
        lines += _role_lines(gang, scales)
        lines += _gang_lines(gang, width)
        if len(gangs) > 1:
            lines += [f"    - {problem}" for problem in gang["problems"]]
    completion, pool = report["completion"], report["pool"]
    lines.append("")
    lines += _prometheus_lines(report, now)
    if len(gangs) > 1:
        drained = f"; drained: {', '.join(pool['drained']) or 'none'}" if pool["drained"] is not None else ""
        unseen = f" (no pool view from the gateway: {pool['gatewayError']})" if pool["drained"] is None else ""
        lines.append(f"  pool        {len(pool['serving'])} of {len(gangs)} gangs serving{drained}{unseen}")
    if completion["status"] is None:
        lines.append(f"  endpoint    {completion['error']} ({endpoint})")
    else:
        lines.append(
            f"  endpoint    HTTP {completion['status'] or 'none'} in {completion['seconds']:.2f} s through {endpoint}"
        )
    lines += [
        "",
        f"  verdict     {report['verdict'].upper()}",
    ]
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
            report = assess(cluster, spec, snapshot(cluster, spec, trends=args.watch))
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
