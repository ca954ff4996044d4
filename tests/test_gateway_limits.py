"""The gateway's capacity and limits (issue 48), with real nginx:

- configure sets nginx.conf's worker_connections and worker_rlimit_nofile (which the
  conf.d site cannot), idempotently, on Debian's own nginx.conf as on the test's; a file
  of another shape is refused by name, and a refused configuration restores it.
- With the default config one client may have as many requests in flight as the stack
  holds: 64 at once from one address, none refused.
- A configured limit (requests in flight per key or per address, requests per second)
  refuses the excess at once with a 429 in OpenAI's form and Retry-After, on every route,
  the waker's too (their own error_page); the stack's probe key is never refused by the
  per-key limit.

Under tests/test_gateway_pool.py's scratch root and stand-in gangs."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from components import gateway_nginx
from tests.test_gateway_pool import (  # noqa: F401 - fixtures
    CLIENT_KEY,
    GATEWAY_SCRIPT,
    NGINX,
    Gang,
    assert_ran,
    eventually,
    gateway,
    needs_host_tools,
)

PROBE_KEY = "probe" + "q" * 43
DEBIAN_NGINX_CONF = Path("/etc/nginx/nginx.conf")


def rewrite(conf: Path, connections: int, files: int) -> subprocess.CompletedProcess:
    """The script's own nginx_conf_with_limits on `conf`, printing the result."""
    function = subprocess.run(
        ["sed", "-n", "/^nginx_conf_with_limits() {/,/^}/p", str(GATEWAY_SCRIPT)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert function.startswith("nginx_conf_with_limits() {")
    return subprocess.run(
        [
            "bash",
            "-c",
            f'{function}\nnginx_conf_with_limits "$1" "$2" "$3"',
            "_",
            str(conf),
            str(connections),
            str(files),
        ],
        capture_output=True,
        text=True,
    )


def test_debians_nginx_conf_takes_the_limits_once_and_nginx_accepts_it(tmp_path):
    if not DEBIAN_NGINX_CONF.exists():
        pytest.skip("Debian's nginx.conf is not installed")
    conf = tmp_path / "nginx.conf"
    shutil.copy(DEBIAN_NGINX_CONF, conf)
    first = rewrite(conf, 8960, 14080)
    assert first.returncode == 0, first.stderr
    text = first.stdout
    assert "\tworker_connections 8960;" in text and "worker_connections 768;" not in text
    assert text.count("worker_rlimit_nofile 14080;") == 1
    # In the main context, before events; Debian's error_log keeps its level (a warn line
    # per large request body would fill the gateway's disk).
    assert text.index("worker_rlimit_nofile") < text.index("events {")
    assert "error_log /var/log/nginx/error.log;" in text
    conf.write_text(text)
    again = rewrite(conf, 8960, 14080)
    assert again.returncode == 0 and again.stdout == text
    changed = rewrite(conf, 9000, 15000)
    assert changed.stdout.count("worker_connections") == 1 and changed.stdout.count("worker_rlimit_nofile") == 1
    checked = subprocess.run([NGINX, "-t", "-c", str(conf)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("events { worker_connections 768; }\nhttp {}\n", '"events {" line'),
        ("events {\n    use epoll;\n}\nhttp {}\n", "worker_connections"),
        ("http {\n    events {\n        worker_connections 1;\n    }\n}\n", '"events {" line'),
    ],
)
def test_an_nginx_conf_of_another_shape_is_refused_naming_what_is_missing(tmp_path, text, missing):
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    result = rewrite(conf, 8960, 14080)
    assert result.returncode != 0 and missing in result.stderr


def configure_with_limits(front, gang: Gang, site: str | None = None, connections=2048, files=4096):
    value = f"{gang.name}={gang.address}"
    return front.run(
        "configure",
        "--connections",
        str(connections),
        "--open-files",
        str(files),
        "--gangs",
        value,
        stdin=front.site() if site is None else site,
    )


def test_configure_sets_the_workers_limits_and_a_refused_site_restores_nginx_conf(gateway):  # noqa: F811
    conf = gateway.root / "etc/nginx/nginx.conf"
    gang = Gang("gang0", "127.0.0.2").start()
    try:
        assert_ran(configure_with_limits(gateway, gang))
        text = conf.read_text()
        assert "worker_connections 2048;" in text and "worker_rlimit_nofile 4096;" in text
        assert gateway.complete() == (200, "gang0")
        assert_ran(configure_with_limits(gateway, gang))
        assert conf.read_text() == text
        refused = configure_with_limits(gateway, gang, site=gateway.site() + "server {", connections=3000, files=5000)
        assert refused.returncode != 0 and "previous ones were kept" in refused.stderr
        assert conf.read_text() == text
        for bad in (("0", "10"), ("100", "50"), ("many", "10")):
            result = configure_with_limits(gateway, gang, connections=bad[0], files=bad[1])
            assert result.returncode != 0 and "--open-files" in result.stderr, bad
        assert conf.read_text() == text
        assert gateway.complete() == (200, "gang0")
    finally:
        gang.stop()


def test_nginx_conf_of_another_shape_stops_configure_with_the_fix(gateway):  # noqa: F811
    conf = gateway.root / "etc/nginx/nginx.conf"
    conf.write_text(
        conf.read_text().replace("events {\n\tworker_connections 256;\n}", "events { worker_connections 256; }")
    )
    before = conf.read_text()
    gang = Gang("gang0", "127.0.0.2").start()
    try:
        result = configure_with_limits(gateway, gang)
        assert result.returncode != 0
        assert "not of the shape configure rewrites" in result.stderr and "worker_connections 2048" in result.stderr
        assert conf.read_text() == before
    finally:
        gang.stop()


# --- the limits -------------------------------------------------------------------------------


def post(front, key: str = CLIENT_KEY, prompt: str = "hello") -> tuple[int, dict, dict]:
    """A completion: its status, headers and JSON body."""
    context = ssl.create_default_context(cafile=str(front.cert))
    context.check_hostname = False
    connection = http.client.HTTPSConnection("127.0.0.1", front.api_port, context=context, timeout=30)
    try:
        connection.request(
            "POST",
            "/v1/completions",
            body=json.dumps({"model": "m", "prompt": prompt}),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), json.loads(response.read())
    finally:
        connection.close()


def assert_refused_like_openai(status: int, headers: dict, body: dict) -> None:
    assert status == 429, body
    assert headers.get("Retry-After") == str(gateway_nginx.RATE_LIMITED_RETRY_AFTER_SECONDS)
    assert headers.get("Content-Type") == "application/json"
    assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "requests"


@pytest.fixture
def gang():
    started = Gang("gang0", "127.0.0.2").start()
    yield started
    started.stop()


def slow_requests(front, gang: Gang, count: int, key: str = CLIENT_KEY):
    """`count` slow completions at once, returned once they all reach the gang."""
    pool = ThreadPoolExecutor(count + 8)  # room for more beside them
    futures = [pool.submit(post, front, key, "slow") for _ in range(count)]
    eventually(lambda: gang.in_flight >= count, what=f"{count} in flight")
    return pool, futures


def test_with_the_default_config_one_client_has_64_in_flight_and_none_is_refused(gateway, gang):  # noqa: F811
    assert_ran(configure_with_limits(gateway, gang))
    pool, futures = slow_requests(gateway, gang, 64)
    gang.release.set()
    assert [future.result()[0] for future in futures] == [200] * 64
    pool.shutdown()


def test_requests_in_flight_per_key_refuse_the_excess_with_retry_after_but_never_the_probe(gateway, gang):  # noqa: F811
    assert_ran(gateway.install_keys({"current": CLIENT_KEY, "probe": PROBE_KEY}))
    # With the waker: the work routes' own error_page must not hide the 429's.
    site = gateway.site(max_in_flight_per_key=2, waker=True)
    assert_ran(configure_with_limits(gateway, gang, site=site))
    pool, futures = slow_requests(gateway, gang, 2)
    for _ in range(2):
        assert_refused_like_openai(*post(gateway))
    # The probe key: four at once beside the client's two, none refused.
    probes = [pool.submit(post, gateway, PROBE_KEY, "slow") for _ in range(4)]
    eventually(lambda: gang.in_flight == 6, what="the probes in flight")
    gang.release.set()
    assert [future.result()[0] for future in futures + probes] == [200] * 6
    assert gang.completions == 6
    pool.shutdown()
    # Freed as the requests end.
    assert post(gateway)[0] == 200


def test_requests_in_flight_per_address_refuse_the_excess(gateway, gang):  # noqa: F811
    assert_ran(configure_with_limits(gateway, gang, site=gateway.site(max_in_flight_per_address=3)))
    pool, futures = slow_requests(gateway, gang, 3)
    assert_refused_like_openai(*post(gateway))
    gang.release.set()
    assert [future.result()[0] for future in futures] == [200] * 3
    pool.shutdown()


def test_the_rate_limits_429_is_json_with_retry_after(gateway, gang):  # noqa: F811
    assert_ran(configure_with_limits(gateway, gang, site=gateway.site(rate_limit_per_second=1)))
    # A burst of 2 beyond the first at 1 a second, nodelay: of 8 at once, some are refused.
    barrier = threading.Barrier(8)

    def one():
        barrier.wait()
        return post(gateway)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: one(), range(8)))
    refused = [answer for answer in answers if answer[0] != 200]
    assert refused and len(refused) <= 5
    for answer in refused:
        assert_refused_like_openai(*answer)


def test_every_limit_at_once_leaves_the_probe_key_alone(gateway, gang):  # noqa: F811
    """All three limits and the waker in one site nginx accepts; the probe key is counted
    by neither in-flight limit, so the readiness check passes beside a client at its limit."""
    assert_ran(gateway.install_keys({"current": CLIENT_KEY, "probe": PROBE_KEY}))
    limits = {"rate_limit_per_second": 100, "max_in_flight_per_key": 1, "max_in_flight_per_address": 1}
    assert_ran(configure_with_limits(gateway, gang, site=gateway.site(waker=True, **limits)))
    pool, futures = slow_requests(gateway, gang, 3, key=PROBE_KEY)
    futures.append(pool.submit(post, gateway, CLIENT_KEY, "slow"))
    eventually(lambda: gang.in_flight == 4, what="the client's request beside the probes")
    assert_refused_like_openai(*post(gateway))
    gang.release.set()
    assert [future.result()[0] for future in futures] == [200] * 4
    pool.shutdown()
