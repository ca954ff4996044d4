"""Prometheus on the gateway (components/metrics.py): the rules name metrics vLLM really
exports, every series is per gang, the targets carry gang/node/role and only heads serve
vLLM's /metrics, the configuration is one Prometheus 2.42 reads, the retention fits the
disk, and the five alerts fire when, and only when, their condition has held long enough.
The files are checked by the packaged `promtool` when this machine has one."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components import bootstrap, metrics, ports, scale_out
from components.topology import HEAD, WORKER

TESTBED_CACHE = Path(os.environ.get("VLLM_CLUSTER_TESTBED_CACHE", "/var/cache/vllm-cluster-testbed"))
LOGGERS = "lib/python3.11/site-packages/vllm/v1/metrics/loggers.py"
# vLLM's names as it defines them: self._gauge_cls(name=...), _counter_cls, _histogram_cls.
METRIC_CLASSES = {"_gauge_cls": "gauge", "_counter_cls": "counter", "_histogram_cls": "histogram"}
VLLM_NAME = re.compile(r"(?<![\w:])vllm:[A-Za-z0-9_:]+")

GANGS = [
    metrics.scrape_gang(0, ["10.42.128.10", "10.42.128.11"]),
    metrics.scrape_gang(1, ["10.42.128.20", "10.42.128.21", "10.42.128.22"]),
]


def loggers_file() -> Path:
    # Only a complete one (localhosts/fleet.py fleet_venv marks it): the fleet's worker may
    # be installing one beside this test.
    complete = [venv for venv in sorted(TESTBED_CACHE.glob("venv-*")) if (venv / ".complete").exists()]
    found = [venv / LOGGERS for venv in complete if (venv / LOGGERS).exists()]
    if not found:
        pytest.skip(f"no vLLM to read metric names from: {TESTBED_CACHE}/venv-*/{LOGGERS} is absent")
    return found[0]


def exposed_names(source: str) -> set[str]:
    """Every series name vLLM's Prometheus logger exposes, as prometheus_client writes
    them: a counter as NAME_total (a trailing _total in the name is not doubled), a
    histogram as NAME_bucket, NAME_sum and NAME_count, a gauge as NAME."""
    names = set()
    for call in ast.walk(ast.parse(source)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            continue
        kind = METRIC_CLASSES.get(call.func.attr)
        name = next(
            (k.value.value for k in call.keywords if k.arg == "name" and isinstance(k.value, ast.Constant)), None
        )
        if kind is None or name is None:
            continue
        if kind == "counter":
            names.add(name.removesuffix("_total") + "_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


@pytest.fixture(scope="module")
def vllm_exports() -> set[str]:
    return exposed_names(loggers_file().read_text())


def rules_of(text: str) -> list[dict]:
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


# --- the rules against vLLM's own names ---------------------------------------------------


def test_the_names_are_read_from_vllm_itself(vllm_exports):
    """The reader finds today's names and not the renamed ones, so the next test can fail."""
    assert {"vllm:kv_cache_usage_perc", "vllm:generation_tokens_total", "vllm:inter_token_latency_seconds_bucket"} <= (
        vllm_exports
    )
    assert "vllm:gpu_cache_usage_perc" not in vllm_exports
    assert "vllm:time_per_output_token_seconds_bucket" not in vllm_exports


def test_every_recording_rule_names_only_metrics_vllm_exports(vllm_exports):
    for rule in rules_of(metrics.recording_rules()):
        named = set(VLLM_NAME.findall(rule["expr"]))
        assert named, f"{rule['record']} reads no vLLM metric: {rule['expr']}"
        assert named <= vllm_exports, (
            f"{rule['record']} reads {sorted(named - vllm_exports)}, which vLLM does not export"
        )


def test_no_alert_names_a_metric_vllm_does_not_export(vllm_exports):
    for rule in rules_of(metrics.alert_rules()):
        named = set(VLLM_NAME.findall(rule["expr"]))
        assert named <= vllm_exports, f"{rule['alert']} reads {sorted(named - vllm_exports)}"


def test_the_issue_asks_for_each_of_these_recordings():
    recorded = [rule["record"] for rule in rules_of(metrics.recording_rules())]
    assert len(recorded) == len(set(recorded))
    wanted = {
        "vllm:time_to_first_token_seconds_bucket": {"0.5", "0.95"},
        "vllm:inter_token_latency_seconds_bucket": {"0.5", "0.95"},
        "vllm:e2e_request_latency_seconds_bucket": {"0.95"},
    }
    exprs = metrics.recording_rule_exprs().values()
    for histogram, quantiles in wanted.items():
        found = {re.match(r"histogram_quantile\(([\d.]+),", e).group(1) for e in exprs if histogram in e}
        assert found == quantiles, histogram
    for metric in ("rate(vllm:generation_tokens_total", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert any(metric in e for e in exprs), metric
    assert any("vllm:kv_cache_usage_perc" in e for e in exprs)
    assert any("rate(vllm:num_preemptions_total" in e for e in exprs)


def test_every_recording_rule_is_one_series_per_gang():
    for rule in rules_of(metrics.recording_rules()):
        # The outermost aggregation keeps gang (and le, inside histogram_quantile) only.
        groupings = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
        assert groupings, f"{rule['record']} is not aggregated: {rule['expr']}"
        assert all(g in ("gang", "gang, le") for g in groupings), rule
        assert rule["record"].startswith("gang:"), rule["record"]


# --- targets ------------------------------------------------------------------------------


def test_only_each_gangs_head_is_in_the_vllm_job_on_vllms_port():
    groups = json.loads(metrics.vllm_targets(GANGS))
    assert [g["targets"] for g in groups] == [[f"10.42.128.10:{ports.VLLM_API}"], [f"10.42.128.20:{ports.VLLM_API}"]]
    assert [g["labels"] for g in groups] == [
        {"gang": "gang0", "node": "head", "role": HEAD},
        {"gang": "gang1", "node": "gang1-head", "role": HEAD},
    ]


def test_every_node_is_in_the_ray_job_on_rays_metrics_port_with_its_gang_node_and_role():
    groups = json.loads(metrics.ray_targets(GANGS))
    labelled = {g["targets"][0]: g["labels"] for g in groups}
    every_node = {f"{n.ip}:{ports.RAY_METRICS}" for gang in GANGS for n in gang.nodes}
    assert set(labelled) == every_node and len(groups) == len(every_node)
    for labels in labelled.values():
        assert set(labels) == set(metrics.TARGET_LABELS)
    assert labelled[f"10.42.128.22:{ports.RAY_METRICS}"] == {"gang": "gang1", "node": "gang1-worker-2", "role": WORKER}


def test_an_ipv6_target_is_bracketed():
    gang = metrics.scrape_gang(0, ["fd00::10"])
    assert json.loads(metrics.ray_targets([gang]))[0]["targets"] == [f"[fd00::10]:{ports.RAY_METRICS}"]


def test_a_stack_with_no_gangs_scrapes_nothing():
    assert json.loads(metrics.vllm_targets([])) == [] and json.loads(metrics.ray_targets([])) == []


@pytest.mark.parametrize(
    "gangs, says",
    [
        ([GANGS[0], GANGS[0]], "gang name 'gang0' appears 2 times"),
        ([metrics.ScrapeGang("gang0", (metrics.ScrapeNode("worker-1", "10.0.0.1", WORKER),))], "has 0 heads"),
        ([metrics.scrape_gang(0, ["10.0.0.1", "10.0.0.1"])], "node IP '10.0.0.1' appears 2 times"),
        ([metrics.scrape_gang(0, ["10.0.0.300"])], "IP '10.0.0.300', which is not an IP address"),
        ([metrics.ScrapeGang("gang0", (metrics.ScrapeNode("head", "10.0.0.1", "boss"),))], "role 'boss'"),
    ],
)
def test_gangs_that_would_mislabel_or_misdirect_a_scrape_are_refused(gangs, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        metrics.vllm_targets(gangs)


# --- the main configuration ---------------------------------------------------------------


def test_the_config_parses_and_keeps_to_what_prometheus_2_42_reads():
    config = yaml.safe_load(metrics.prometheus_config())
    assert "scrape_config_files" not in config  # new in 2.43; Debian 12 ships 2.42
    assert set(config) == {"global", "rule_files", "scrape_configs"}


def test_the_config_reads_the_files_the_gateway_writes():
    config = yaml.safe_load(metrics.prometheus_config())
    assert config["rule_files"] == list(metrics.rule_files())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    sd_files = {name: job["file_sd_configs"][0]["files"] for name, job in jobs.items() if "file_sd_configs" in job}
    written = metrics.target_files(GANGS)
    assert sd_files == {
        "vllm": [f"{metrics.CLUSTER_DIR}/{metrics.VLLM_TARGETS}"],
        "ray": [f"{metrics.CLUSTER_DIR}/{metrics.RAY_TARGETS}"],
    }
    assert {f for files in sd_files.values() for f in files} == set(written)
    assert written[sd_files["vllm"][0]] == metrics.vllm_targets(GANGS)


def test_the_gangs_targets_come_only_from_file_sd():
    """Targets change with the gangs; the config must not, or a change would need a reload.
    The one static target is Prometheus itself, on loopback."""
    static = [
        target
        for job in yaml.safe_load(metrics.prometheus_config())["scrape_configs"]
        for group in job.get("static_configs", [])
        for target in group["targets"]
    ]
    assert static == [f"127.0.0.1:{ports.PROMETHEUS}"]


# --- retention and flags ------------------------------------------------------------------


def size_mib(flags: list[str]) -> int:
    (value,) = [f.split("=", 1)[1] for f in flags if f.startswith("--storage.tsdb.retention.size=")]
    assert value.endswith("MB"), value
    return int(value.removesuffix("MB"))


@pytest.mark.parametrize("disk_gib", [8, 20, 100])
def test_retention_size_leaves_the_headroom_the_docs_advise(disk_gib):
    size = size_mib(metrics.prometheus_flags("gw.example.com", disk_gib))
    room = (disk_gib - metrics.GATEWAY_SYSTEM_GIB) * 1024
    assert 0 < size <= 0.85 * room < disk_gib * 1024


def test_a_disk_too_small_for_prometheus_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match="larger root volume"):
        metrics.prometheus_flags("gw.example.com", metrics.GATEWAY_SYSTEM_GIB + 1)


def test_prometheus_serves_under_the_route_prefix_with_its_write_apis_off():
    """It listens on the gateway's loopback alone: nginx passes users (admin port, metrics
    login) and the heads' Ray dashboards (the query API on the private address) to it;
    nobody may delete series or stop it."""
    flags = metrics.prometheus_flags("gw.example.com", 20)
    [listen] = [f.split("=", 1)[1] for f in flags if f.startswith("--web.listen-address=")]
    assert listen == f"127.0.0.1:{ports.PROMETHEUS}"
    assert not any(f.startswith(("--web.enable-admin-api", "--web.enable-lifecycle")) for f in flags)
    assert f"--web.external-url=https://gw.example.com:{ports.DASHBOARD_HTTPS}/prometheus/" in flags
    assert "--web.route-prefix=/prometheus" in flags
    assert any(f.startswith("--storage.tsdb.retention.time=") for f in flags)


def test_the_flags_fit_in_etc_default_prometheus():
    """The packaged unit runs `/usr/bin/prometheus $ARGS` from /etc/default/prometheus:
    the flags must be plain words that file can carry."""
    bootstrap.env_file({"ARGS": " ".join(metrics.prometheus_flags("gw.example.com", 20))}, header="test")


# --- alerts -------------------------------------------------------------------------------


def test_each_alert_of_the_issue_is_there_with_a_duration():
    rules = {rule["alert"]: rule for rule in rules_of(metrics.alert_rules())}
    assert set(rules) == {"VllmEngineDown", "VllmGangHung", "VllmKvCacheFull", "VllmQueueGrowing", "RayNodeMetricsGone"}
    assert rules["VllmKvCacheFull"]["for"] == "10m" and "> 0.95" in rules["VllmKvCacheFull"]["expr"]
    for rule in rules.values():
        assert re.fullmatch(r"[1-9]\d*m", rule["for"]), rule
        assert rule["labels"]["severity"] in ("critical", "warning")


# --- the packaged promtool ----------------------------------------------------------------


# Where tools/install-test-deps unpacks Debian's prometheus package for its promtool
# (installing the package would start a Prometheus on this machine).
UNPACKED_PROMTOOL = TESTBED_CACHE / "prometheus-deb" / "usr" / "bin" / "promtool"


def promtool() -> str:
    candidates = [os.environ.get("PROMTOOL"), shutil.which("promtool"), str(UNPACKED_PROMTOOL)]
    found = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if found is None:
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail(
                f"no promtool: .ci/run (tools/install-test-deps) should have unpacked it at {UNPACKED_PROMTOOL}"
            )
        pytest.skip(
            f"no promtool: run tools/install-test-deps as root (it unpacks it at {UNPACKED_PROMTOOL}) or set PROMTOOL"
        )
    return found


@pytest.fixture
def rendered(tmp_path) -> Path:
    """Every file Prometheus reads, written under tmp_path as the gateway would write them."""
    directory = str(tmp_path)
    files = {
        **metrics.rule_files(directory),
        **metrics.target_files(GANGS, directory),
        str(tmp_path / "prometheus.yml"): metrics.prometheus_config(directory),
    }
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return tmp_path


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_config_and_its_rule_files(rendered):
    result = run_promtool("check", "config", str(rendered / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rule files found" in result.stdout + result.stderr


def test_promtool_accepts_the_rules(rendered):
    result = run_promtool(
        "check", "rules", *(str(rendered / name) for name in (metrics.RECORDING_RULES, metrics.ALERT_RULES))
    )
    assert result.returncode == 0, result.stdout + result.stderr


# Each alert's cases: input series (gang0 in trouble, gang1 not), and the times at which
# it must not yet fire and must fire, only for gang0. Series carry the labels a scrape of
# our targets gives them.
def series(metric: str, gang: str, values: str, job: str = "vllm", node: str = "head") -> dict:
    labels = f'job="{job}", gang="{gang}", node="{node}", role="head", instance="x", model_name="m", engine="0"'
    return {"series": f"{metric}{{{labels}}}", "values": values}


ALERT_CASES = {
    "VllmEngineDown": ([series("up", "gang0", "0x30"), series("up", "gang1", "1x30")], "30s", "2m"),
    "VllmGangHung": (
        [
            series("vllm:num_requests_running", "gang0", "2x30"),
            series("vllm:generation_tokens_total", "gang0", "100x30"),
            series("vllm:num_requests_running", "gang1", "2x30"),
            series("vllm:generation_tokens_total", "gang1", "0+50x30"),
        ],
        "4m",
        "8m",
    ),
    "VllmKvCacheFull": (
        [series("vllm:kv_cache_usage_perc", "gang0", "0.97x30"), series("vllm:kv_cache_usage_perc", "gang1", "0.9x30")],
        "9m",
        "11m",
    ),
    "VllmQueueGrowing": (
        [series("vllm:num_requests_waiting", "gang0", "0+1x40"), series("vllm:num_requests_waiting", "gang1", "5x40")],
        "14m",
        "18m",
    ),
    "RayNodeMetricsGone": (
        [series("up", "gang0", "0x30", job="ray", node="worker-1"), series("up", "gang0", "1x30", job="ray")],
        "4m",
        "7m",
    ),
}


def summary_for(alert: metrics.Alert, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], alert.summary)


@pytest.mark.parametrize("name", sorted(ALERT_CASES))
def test_promtool_sees_each_alert_fire_after_its_duration_and_per_gang(rendered, name):
    inputs, too_early, late_enough = ALERT_CASES[name]
    alert = next(a for a in metrics.alerts() if a.name == name)
    labels = {"gang": "gang0", "severity": alert.severity} | ({"node": "worker-1"} if "node" in alert.expr else {})
    checks = [
        {"eval_time": too_early, "alertname": name, "exp_alerts": []},
        {"eval_time": late_enough, "alertname": name, "exp_alerts": [fired_as(alert, labels)]},
    ]
    assert_promtool_sees(rendered, inputs, checks)


def fired_as(alert: metrics.Alert, labels: dict[str, str]) -> dict:
    """promtool's expected alert: its labels and its summary filled in."""
    return {"exp_labels": labels, "exp_annotations": {"summary": summary_for(alert, labels)}}


def assert_promtool_sees(rendered: Path, inputs: list[dict], checks: list[dict]) -> None:
    """promtool's unit test of the rule files in `rendered`: `inputs` every minute, then each
    check's alerts at its time."""
    test = {
        "rule_files": [metrics.RECORDING_RULES, metrics.ALERT_RULES],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": inputs, "alert_rule_test": checks}],
    }
    (rendered / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = run_promtool("test", "rules", str(rendered / "test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


# --- the metrics login --------------------------------------------------------------------

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def world_passable_dir():
    """A folder nginx's workers (www-data) can pass through: pytest's own are root's
    alone (0700 above tmp_path)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="vllm-cluster-metrics-login-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder)


def test_debians_nginx_lets_the_metrics_login_in_and_nobody_else(world_passable_dir):
    """The line htpasswd_line writes is one nginx's auth_basic takes: the right password
    reaches what it guards, a wrong one or none gets 401. nginx on loopback, guarding a
    static file as the site guards Prometheus (not a `return`: that runs before the
    access phase, where auth_basic checks)."""
    import base64
    import time
    import urllib.error
    import urllib.request

    if NGINX is None:
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail("nginx is missing: .ci/run should have installed Debian's nginx")
        pytest.skip("Debian's nginx is not installed (apt-get install nginx; .ci/run installs it)")
    tmp_path = world_passable_dir
    password = "Zq3" * 16
    users = tmp_path / "htpasswd"
    users.write_text(metrics.htpasswd_line(metrics.METRICS_USER, password))
    # As the gateway keeps it (vllm-cluster-gateway metrics): root's, readable by the
    # group nginx's workers run as, and by nobody else.
    shutil.chown(users, group="www-data")
    users.chmod(0o640)
    port = free_port()
    (tmp_path / "www" / metrics.ROUTE_PREFIX.strip("/")).mkdir(parents=True)
    (tmp_path / "www" / metrics.ROUTE_PREFIX.strip("/") / "graph").write_text("inside\n")
    (tmp_path / "nginx.conf").write_text(
        f"""daemon off;
user www-data;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{}}
http {{
    access_log off;
    client_body_temp_path {tmp_path};
    proxy_temp_path {tmp_path};
    fastcgi_temp_path {tmp_path};
    uwsgi_temp_path {tmp_path};
    scgi_temp_path {tmp_path};
    server {{
        listen 127.0.0.1:{port};
        location {metrics.ROUTE_PREFIX}/ {{
            auth_basic "vllm-cluster metrics";
            auth_basic_user_file {users};
            root {tmp_path}/www;
        }}
    }}
}}
"""
    )
    server = subprocess.Popen([NGINX, "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log")])
    try:

        def status(login: str | None) -> int:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{metrics.ROUTE_PREFIX}/graph")
            if login is not None:
                request.add_header("Authorization", "Basic " + base64.b64encode(login.encode()).decode())
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    return answer.status
            except urllib.error.HTTPError as refused:
                return refused.code

        deadline = time.monotonic() + 20
        while True:
            try:
                first = status(None)
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, (tmp_path / "error.log").read_text()
                time.sleep(0.2)
        assert first == 401
        assert status(f"{metrics.METRICS_USER}:{password}") == 200
        assert status(f"{metrics.METRICS_USER}:{password[:-1]}x") == 401
        assert status(f"admin:{password}") == 401
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_the_same_password_gives_the_same_line_and_another_another():
    """pulumi up sends the files again only when they change: the line must not change
    for the same password (a fresh random salt would re-run the command every time)."""
    line = metrics.htpasswd_line("metrics", "a" * 48)
    assert line == metrics.htpasswd_line("metrics", "a" * 48)
    assert line != metrics.htpasswd_line("metrics", "b" * 48)
    assert line.startswith("metrics:{SSHA}") and line.endswith("\n")


def test_every_file_the_gateway_gets_sits_where_the_package_and_nginx_read_it():
    files = metrics.gateway_files(GANGS, "gw.example.com", 20, metrics.htpasswd_line("metrics", "x" * 48))
    assert set(files) == {
        "/etc/prometheus/prometheus.yml",
        f"{metrics.CLUSTER_DIR}/{metrics.RECORDING_RULES}",
        f"{metrics.CLUSTER_DIR}/{metrics.ALERT_RULES}",
        f"{metrics.CLUSTER_DIR}/{metrics.VLLM_TARGETS}",
        f"{metrics.CLUSTER_DIR}/{metrics.RAY_TARGETS}",
        "/etc/default/prometheus",
        metrics.HTPASSWD_FILE,
    }
    args = bootstrap.env_file({"X": "y"}, "h")  # the same reader rules as node.env: plain words
    assert args
    defaults = files["/etc/default/prometheus"]
    assert re.search(
        r'^ARGS="--config\.file=/etc/prometheus/prometheus\.yml .*--web\.route-prefix=/prometheus"$', defaults, re.M
    )


# --- idle stop: the waker's gauge of the gangs it has asleep --------------------------------


def render_with_waker(tmp_path: Path, scaling: bool = False) -> Path:
    """Prometheus's files with idle stop (`scaling`: with warm gangs) written under tmp_path."""
    directory = str(tmp_path)
    files = {
        **metrics.rule_files(directory, waker=True, scaling=scaling),
        **metrics.target_files(GANGS, directory),
        str(tmp_path / "prometheus.yml"): metrics.prometheus_config(directory, waker=True),
    }
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return tmp_path


@pytest.fixture
def rendered_with_waker(tmp_path) -> Path:
    return render_with_waker(tmp_path)


def test_with_idle_stop_prometheus_scrapes_the_waker_and_promtool_accepts_it(rendered_with_waker):
    config = yaml.safe_load((rendered_with_waker / "prometheus.yml").read_text())
    waker = next(job for job in config["scrape_configs"] if job["job_name"] == metrics.JOB_WAKER)
    assert waker["static_configs"] == [{"targets": [f"127.0.0.1:{ports.WAKER}"]}]
    result = run_promtool("check", "config", str(rendered_with_waker / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    # Without idle stop: no waker job, and the rules as before.
    assert metrics.JOB_WAKER not in metrics.prometheus_config()
    assert metrics.ASLEEP not in metrics.alert_rules()


@pytest.mark.parametrize(
    "name, job, node", [("VllmEngineDown", "vllm", "head"), ("RayNodeMetricsGone", "ray", "worker-1")]
)
def test_a_gang_idle_stop_has_asleep_raises_no_alert_while_an_awake_one_still_does(
    rendered_with_waker, name, job, node
):
    """Both gangs' targets are down for 30 minutes; the waker has gang1 asleep (stopped,
    then waking) the whole time: only gang0's alert fires."""
    asleep = {"series": f'{metrics.ASLEEP}{{job="waker", instance="x", gang="gang1"}}', "values": "1x30"}
    awake = {"series": f'{metrics.ASLEEP}{{job="waker", instance="x", gang="gang0"}}', "values": "0x30"}
    inputs = [
        series("up", "gang0", "0x30", job=job, node=node),
        series("up", "gang1", "0x30", job=job, node=node),
        asleep,
        awake,
    ]
    alert = next(a for a in metrics.alerts(waker=True) if a.name == name)
    labels = {"gang": "gang0", "severity": alert.severity} | ({"node": node} if "node" in alert.expr else {})
    assert_promtool_sees(
        rendered_with_waker, inputs, [{"eval_time": "20m", "alertname": name, "exp_alerts": [fired_as(alert, labels)]}]
    )


def test_with_idle_stop_a_refused_wake_and_a_wake_given_up_raise_alerts_naming_the_gang_and_ecs_code(
    rendered_with_waker,
):
    """Issue 34: EC2 refusing gang1's start (its code a label) fires VllmWakeRefused after a
    minute, not at once; a wake given up fires VllmWakeGivenUp at once; gang0 neither."""
    refused = {
        "series": metrics.WAKE_REFUSED
        + '{job="waker", instance="x", gang="gang1", code="InsufficientInstanceCapacity"}',
        "values": "_ 1x10",
    }
    given_up = {"series": f'{metrics.WAKE_GIVEN_UP}{{job="waker", instance="x", gang="gang1"}}', "values": "0 0 1x10"}
    quiet = {"series": f'{metrics.WAKE_GIVEN_UP}{{job="waker", instance="x", gang="gang0"}}', "values": "0x12"}
    by_name = {a.name: a for a in metrics.alerts(waker=True)}
    refused_labels = {"gang": "gang1", "code": "InsufficientInstanceCapacity", "severity": "warning"}
    given_up_labels = {"gang": "gang1", "severity": "critical"}
    assert_promtool_sees(
        rendered_with_waker,
        [refused, given_up, quiet],
        [
            {"eval_time": "1m", "alertname": "VllmWakeRefused", "exp_alerts": []},
            {
                "eval_time": "3m",
                "alertname": "VllmWakeRefused",
                "exp_alerts": [fired_as(by_name["VllmWakeRefused"], refused_labels)],
            },
            {"eval_time": "1m", "alertname": "VllmWakeGivenUp", "exp_alerts": []},
            {
                "eval_time": "2m",
                "alertname": "VllmWakeGivenUp",
                "exp_alerts": [fired_as(by_name["VllmWakeGivenUp"], given_up_labels)],
            },
        ],
    )
    # Without idle stop there is no waker, and no such alert.
    assert metrics.WAKE_REFUSED not in metrics.alert_rules() and "VllmWakeGivenUp" not in metrics.alert_rules()


# --- warm gangs (issue 36): the pool's size and an alert when it cannot grow ---------------------


@pytest.fixture
def rendered_with_pool(tmp_path) -> Path:
    return render_with_waker(tmp_path, scaling=True)


def pool_series(serving: int, most: int) -> list[dict]:
    return [
        {"series": f'{metrics.POOL_GANGS}{{job="waker", instance="x", state="serving"}}', "values": f"{serving}x30"},
        {
            "series": f'{metrics.POOL_GANGS}{{job="waker", instance="x", state="stopped"}}',
            "values": f"{most - serving}x30",
        },
        {"series": f'{metrics.POOL_MAX_GANGS}{{job="waker", instance="x"}}', "values": f"{most}x30"},
    ]


def test_the_pool_at_max_replicas_with_requests_waiting_raises_an_alert_after_5_minutes(rendered_with_pool):
    """Both gangs of maxReplicas 2 serve, 3 and 1 requests wait (2 per gang, above the
    scale-out threshold): the waker cannot add a gang, so the alert fires after its 5
    minutes; with a gang still stopped (the waker can add it) it does not."""
    alert = next(a for a in metrics.alerts(waker=True, scaling=True) if a.name == "VllmPoolAtMaxReplicas")
    assert f"> {scale_out.SCALE_OUT_WAITING_PER_GANG:g}" in alert.expr
    waiting = [
        series("vllm:num_requests_waiting", "gang0", "3x30"),
        series("vllm:num_requests_waiting", "gang1", "1x30"),
    ]
    labels = {"severity": alert.severity}
    assert_promtool_sees(
        rendered_with_pool,
        waiting + pool_series(2, 2),
        [
            {"eval_time": "4m", "alertname": "VllmPoolAtMaxReplicas", "exp_alerts": []},
            {"eval_time": "7m", "alertname": "VllmPoolAtMaxReplicas", "exp_alerts": [fired_as(alert, labels)]},
        ],
    )
    assert_promtool_sees(
        rendered_with_pool,
        waiting + pool_series(1, 2),
        [{"eval_time": "10m", "alertname": "VllmPoolAtMaxReplicas", "exp_alerts": []}],
    )
    # Without warm gangs there is no pool to grow, and no such alert.
    assert "VllmPoolAtMaxReplicas" not in metrics.alert_rules(waker=True)
