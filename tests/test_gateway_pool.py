"""The gateway's API pool: `vllm-cluster-gateway configure --gangs`, `drain`, `return` and
`pool`, run by bash as on the gateway, against a real nginx serving the site
components/bootstrap.py renders, with stand-ins for each gang's vLLM on loopback
(127.0.0.x). A planned restart of one gang must fail no request: the drained gang finishes
what it has, new requests go to the others, only one serving gang is out at a time and
never the last one; and a gang that cannot take a request passes it on to another.

The script runs under a scratch root (its paths rewritten, as tests/test_host_ports.py
does for the node script), with its own nginx (own prefix, configuration and PID, stopped
by PID) and stand-ins for what would touch the machine: systemctl signals that nginx,
logger writes a file, id says root. curl and ss are the real ones."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from components import bootstrap, gateway_nginx, ports
from tests.test_bootstrap import self_signed_pair

ROOT = Path(__file__).resolve().parent.parent
GATEWAY_SCRIPT = ROOT / "scripts" / "gateway" / "vllm-cluster-gateway"
LIBRARY = ROOT / "scripts" / "lib" / "vllm-cluster-lib.sh"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
# The keys as the stack would send them: a client's current and previous key, and the
# heads' own, which only the gateway sends (components/bootstrap.py api_keys_conf).
CLIENT_KEY = "client" + "c" * 42
PREVIOUS_KEY = "previous" + "p" * 40
HEADS_KEY = "heads" + "h" * 43


@pytest.fixture(autouse=True)
def needs_host_tools():
    """Debian's nginx, and what the gateway probes with (curl, and ss from iproute2)."""
    missing = [
        package
        for package, tool in (("nginx", NGINX), ("curl", "curl"), ("iproute2", "ss"))
        if not tool or not shutil.which(tool)
    ]
    if missing:
        if os.environ.get("VLLM_CLUSTER_CI"):
            pytest.fail(f"{', '.join(missing)} missing: .ci/run should have installed them (tools/install-test-deps)")
        pytest.skip(f"{', '.join(missing)} not installed (tools/install-test-deps installs them as root)")


def free_port(ip: str) -> int:
    with socket.socket() as probe:
        probe.bind((ip, 0))
        return probe.getsockname()[1]


def eventually(condition, timeout: float = 10, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)


# --- a gang's vLLM, as the gateway sees it -------------------------------------------------


class Gang:
    """A stand-in for one gang's vLLM on 127.0.0.x: /health (200, or 503 when not
    healthy), /v1/models and /v1/completions answering with the gang's name. A completion
    whose prompt says "slow" waits for `release`; in "drop" mode a completion is read and
    the connection closed without an answer (a vLLM that died with the request)."""

    def __init__(self, name: str, ip: str):
        self.name, self.ip = name, ip
        self.port = free_port(ip)
        self.healthy = True
        self.mode = "serve"
        self.release = threading.Event()
        self.completions = 0
        self.in_flight = 0
        # Every request as it arrived: (method, path, Authorization header).
        self.seen: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def start(self) -> Gang:
        gang = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn, so nginx keeps connections

            def log_message(self, *args):
                pass

            def answer(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                gang.seen.append(("GET", self.path, self.headers.get("Authorization")))
                if self.path == "/health":
                    self.answer(200 if gang.healthy else 503, {})
                else:
                    self.answer(200, {"gang": gang.name})

            def do_POST(self):
                gang.seen.append(("POST", self.path, self.headers.get("Authorization")))
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with gang.lock:
                    gang.completions += 1
                if gang.mode == "drop":
                    self.close_connection = True
                    return
                if b"slow" in body:
                    with gang.lock:
                        gang.in_flight += 1
                    gang.release.wait(30)
                    with gang.lock:
                        gang.in_flight -= 1
                self.answer(200, {"gang": gang.name})

        self.server = ThreadingHTTPServer((self.ip, self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.release.set()
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# --- the gateway under a scratch root --------------------------------------------------------


class Gateway:
    """vllm-cluster-gateway and its nginx under `root`."""

    def __init__(self, root: Path):
        self.root = root
        self.script = root / "opt/vllm-cluster/bin/vllm-cluster-gateway"
        self.include = root / "etc/nginx/vllm-cluster-upstream.inc"
        self.journal = root / "journal"
        self.error_log = root / "log/error.log"
        self.api_port, self.dashboard_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        self.env = {**os.environ, "PATH": f"{root}/bin:{os.environ['PATH']}"}
        self.cert = root / "etc/vllm-cluster/tls/cert.pem"
        self.api_keys = root / "etc/vllm-cluster/api-keys.conf"
        self.started: list[subprocess.Popen] = []

    def run(self, *args: str, stdin: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(self.script), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def start(self, *args: str) -> subprocess.Popen:
        """The command in the background (a drain that is to wait)."""
        process = subprocess.Popen(
            ["bash", str(self.script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self.started.append(process)
        return process

    def site(self, **overrides) -> str:
        """The site the stack sends, listening on loopback ports of this test instead of
        443 and 8443 (and not on IPv6)."""
        site = gateway_nginx.nginx_site(
            "127.0.0.9",
            ("127.0.0.1/32",),
            str(self.cert),
            str(self.root / "etc/vllm-cluster/tls/key.pem"),
            upstream_include=str(self.include),
            api_keys_file=str(self.api_keys),
            **overrides,
        )
        for port, local in ((ports.API_HTTPS, self.api_port), (ports.DASHBOARD_HTTPS, self.dashboard_port)):
            assert f"    listen {port} ssl;\n" in site and f"    listen [::]:{port} ssl;\n" in site
            site = site.replace(f"    listen {port} ssl;\n", f"    listen 127.0.0.1:{local} ssl;\n")
            site = site.replace(f"    listen [::]:{port} ssl;\n", "")
        return site

    def configure(self, *gangs: Gang, site: str | None = None, keep: bool = False) -> subprocess.CompletedProcess:
        """configure as the stack runs it: with replicas --keep-old-heads (`keep`)."""
        value = ",".join(f"{gang.name}={gang.address}" for gang in gangs)
        flags = ["--keep-old-heads"] if keep else []
        return self.run("configure", "--gangs", value, *flags, stdin=self.site() if site is None else site)

    def drain(self, gang: Gang, timeout: int = 10, wait: int = 5) -> subprocess.CompletedProcess:
        return self.run("drain", "--gang", gang.name, "--timeout", str(timeout), "--wait", str(wait))

    def give_back(self, gang: Gang) -> subprocess.CompletedProcess:
        return self.run("return", "--gang", gang.name)

    def pool(self) -> dict[str, list[str]]:
        """`pool`'s lines by gang: [address, in-pool|drained, serving|not-serving, (roll-lease)]."""
        result = self.run("pool")
        assert result.returncode == 0, result.stderr
        return {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()}

    def servers(self) -> dict[str, str]:
        """The include's server lines by address, without the trailing comment."""
        lines = [line.split("#")[0].strip() for line in self.include.read_text().splitlines()]
        return {line.split()[1]: line for line in lines if line.startswith("server ")}

    def install_keys(self, keys: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """install-api-keys as the stack runs it: the maps on stdin."""
        keys = {"current": CLIENT_KEY} if keys is None else keys
        return self.run("install-api-keys", stdin=bootstrap.api_keys_conf(keys, HEADS_KEY))

    def request(
        self, method: str, path: str, body: dict | None = None, key: str | None = CLIENT_KEY
    ) -> tuple[int, dict | str]:
        """A request with `key` as its Bearer token (none when None), its path sent exactly
        as given (http.client does not normalise it, as curl --path-as-is)."""
        context = ssl.create_default_context(cafile=str(self.cert))
        context.check_hostname = False
        connection = http.client.HTTPSConnection("127.0.0.1", self.api_port, context=context, timeout=30)
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        try:
            payload = None if body is None else json.dumps(body)
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read().decode()
        finally:
            connection.close()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text

    def complete(self, prompt: str = "hello") -> tuple[int, str]:
        """A completion through the gateway: its status and the gang that answered."""
        status, answer = self.request("POST", "/v1/completions", {"model": "m", "prompt": prompt})
        return status, answer["gang"] if isinstance(answer, dict) else answer


RELOAD_SETTLE = "readonly RELOAD_SETTLE_SECONDS=30\n"


def short_reload_settle(gateway: Gateway, seconds: int) -> None:
    """A reload nginx does not take fails after `seconds` here, not 30."""
    script = gateway.script.read_text()
    assert RELOAD_SETTLE in script
    gateway.script.write_text(script.replace(RELOAD_SETTLE, f"readonly RELOAD_SETTLE_SECONDS={seconds}\n"))


def write_stand_in(path: Path, text: str) -> None:
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)


@pytest.fixture
def gateway(tmp_path):
    root = tmp_path / "root"
    for folder in (
        "etc/nginx/conf.d",
        "etc/vllm-cluster/tls",
        "opt/vllm-cluster/bin",
        "opt/vllm-cluster/lib",
        "var/lib/vllm-cluster",
        "bin",
        "log",
        "run",
        "tmp",
    ):
        (root / folder).mkdir(parents=True)
    # Every host path the script and its library use, moved under the scratch root.
    moved = (
        "/etc/nginx",
        "/etc/prometheus",
        "/etc/default",
        "/etc/ssh",
        "/etc/vllm-cluster",
        "/opt/vllm-cluster",
        "/var/lib/vllm-cluster",
        "/run/vllm-cluster",
        "/run/sshd",
    )
    script, library = GATEWAY_SCRIPT.read_text(), LIBRARY.read_text()
    for path in moved:
        script, library = script.replace(path, f"{root}{path}"), library.replace(path, f"{root}{path}")
    # The reload's settle time stays the product's 30 s: SECONDS counts whole seconds, and a
    # niced nginx reload plus the script's ps/awk polls can take seconds on a loaded CI
    # machine. The one test that needs nginx to miss it shortens it (short_reload_settle).
    assert RELOAD_SETTLE in script
    for text in (script, library):
        code = [line.replace(f"{root}/", "ROOT:") for line in text.splitlines() if not line.lstrip().startswith("#")]
        left = [line for line in code if re.search(r"(?<![\w.])/(etc|opt|var|run|srv|usr/local)/", line)]
        assert not left, f"host paths outside the scratch root: {left}"
    gateway = Gateway(root)
    gateway.script.write_text(script)
    (root / "opt/vllm-cluster/lib/vllm-cluster-lib.sh").write_text(library)
    self_signed_pair(root / "etc/vllm-cluster/tls")

    # nginx.conf where the script keeps it (configure --connections rewrites it), in the
    # shape of Debian's and Ubuntu's: the events block over lines of its own.
    conf = root / "etc/nginx/nginx.conf"
    pid_file = root / "run/nginx.pid"
    conf.write_text(f"""{"user root;  # a test instance: its workers need no other user" if os.geteuid() == 0 else ""}
pid {pid_file};
error_log {gateway.error_log} info;
worker_processes 1;
events {{
\tworker_connections 256;
}}
http {{
    access_log {root}/log/access.log;
    client_body_temp_path {root}/tmp/client_body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    include {root}/etc/nginx/conf.d/*.conf;
}}
""")
    nginx_args = [NGINX, "-p", f"{root}/", "-e", str(gateway.error_log), "-c", str(conf)]
    write_stand_in(root / "bin/nginx", f'exec {" ".join(nginx_args)} "$@"\n')
    # systemctl for this nginx alone, as Debian's nginx.service runs it: reload is its
    # ExecReload, `nginx -s reload`, which signals the master and returns at once, before
    # the master has read the new configuration; show gives the master as MainPID.
    write_stand_in(
        root / "bin/systemctl",
        f"""master=$(cat {pid_file} 2>/dev/null) || master=""
case "$1" in
  is-active) [ -n "$master" ] && kill -0 "$master" 2>/dev/null ;;
  enable) ;;
  reload|reload-or-restart)
    [ -n "$master" ] || {{ echo "systemctl stand-in: the test's nginx is not running" >&2; exit 1; }}
    kill -HUP "$master" ;;
  show)
    [ "$*" = "show -p MainPID --value nginx" ] || {{ echo "systemctl stand-in: unexpected: $*" >&2; exit 1; }}
    echo "${{master:-0}}" ;;
  *) echo "systemctl stand-in: unexpected: $*" >&2; exit 1 ;;
esac
""",
    )
    write_stand_in(root / "bin/logger", f'echo "$*" >>{gateway.journal}\n')
    write_stand_in(root / "bin/id", "echo 0\n")

    # nginx first, with no site yet: configure reloads it as systemd would.
    nginx = subprocess.Popen([*nginx_args, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: pid_file.exists() and pid_file.read_text().strip() == str(nginx.pid), what="nginx start")
        # The stack installs the keys before its first configure (components/gateway_commands.py).
        assert_ran(gateway.install_keys())
        yield gateway
    finally:
        for process in [*gateway.started, nginx]:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture
def gangs():
    started = [Gang("gang0", "127.0.0.2").start(), Gang("gang1", "127.0.0.3").start()]
    yield started
    for gang in started:
        gang.stop()


def assert_ran(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr


# --- configure -------------------------------------------------------------------------------


def test_configure_puts_one_server_per_gang_in_the_pool_and_both_serve(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert gateway.servers() == {
        gang0.address: f"server {gang0.address} max_fails=1 fail_timeout=10s;",
        gang1.address: f"server {gang1.address} max_fails=1 fail_timeout=10s;",
    }
    answered = {gateway.complete()[1] for _ in range(6)}
    assert answered == {"gang0", "gang1"}
    assert gateway.pool() == {
        "gang0": [gang0.address, "in-pool", "serving"],
        "gang1": [gang1.address, "in-pool", "serving"],
    }
    again = gateway.configure(gang0, gang1)
    assert_ran(again)
    assert "unchanged" in again.stderr


def test_configure_reads_the_gangs_as_the_stack_writes_them(gateway):
    heads = {"gang0": "10.42.128.10", "gang1": "10.42.0.20"}
    assert_ran(gateway.run("configure", "--gangs", gateway_nginx.gateway_gangs(heads), stdin=gateway.site()))
    assert list(gateway.servers()) == [f"{ip}:{ports.VLLM_API}" for ip in heads.values()]
    assert (gateway.root / "var/lib/vllm-cluster/gateway/gangs").read_text() == "".join(
        f"{gang} {ip}:{ports.VLLM_API}\n" for gang, ip in heads.items()
    )


def test_configure_needs_the_gangs_and_keeps_the_last_good_site_and_pool_when_nginx_refuses(gateway, gangs):
    gang0, gang1 = gangs
    missing = gateway.run("configure", stdin=gateway.site())
    assert missing.returncode != 0 and "--gangs gang0=IP:PORT" in missing.stderr
    malformed = gateway.run("configure", "--gangs", "gang0=10.0.0.1", stdin=gateway.site())
    assert malformed.returncode != 0 and "NAME=IP:PORT" in malformed.stderr
    assert_ran(gateway.configure(gang0))
    site = (gateway.root / "etc/nginx/conf.d/vllm-cluster.conf").read_text()
    include = gateway.include.read_text()

    refused = gateway.configure(gang0, gang1, site=gateway.site().replace("deny all;", "deny all"))
    assert refused.returncode != 0 and "previous ones were kept" in refused.stderr
    assert (gateway.root / "etc/nginx/conf.d/vllm-cluster.conf").read_text() == site
    assert gateway.include.read_text() == include
    assert set(gateway.pool()) == {"gang0"}
    assert gateway.complete() == (200, "gang0")


def test_a_gang_no_longer_listed_loses_its_mark_and_its_lease_and_a_new_one_enters_drained(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang1))
    assert gateway.pool()["gang1"][1:] == ["drained", "serving", "roll-lease"]
    # gang1 replaced by a gang2 whose head does not serve yet (a later replica).
    gang2 = Gang("gang2", "127.0.0.4")
    assert_ran(gateway.configure(gang0, gang2))
    journal = gateway.journal.read_text()
    assert "forgot gang1's drained mark" in journal and "released gang1's roll lease" in journal
    assert "configure: gang2 enters the pool drained" in journal
    assert gateway.pool() == {
        "gang0": [gang0.address, "in-pool", "serving"],
        "gang2": [gang2.address, "drained", "not-serving"],
    }
    assert [gateway.complete()[1] for _ in range(3)] == ["gang0"] * 3


def test_one_gang_clears_any_mark_and_lease_a_failed_roll_left(gateway, gangs):
    """A stack of one replica never drains: a roll that failed before the stack went down
    to one gang must not keep its only gang out of the pool."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang0))
    assert_ran(gateway.configure(gang0))
    assert gateway.pool() == {"gang0": [gang0.address, "in-pool", "serving"]}
    assert gateway.complete() == (200, "gang0")


def test_the_new_pool_takes_the_very_next_request_once_the_gateway_command_returns(gateway, gangs):
    """nginx.service's reload signals nginx and returns before nginx read the new pool.
    The stack sends its readiness completion right after `return`, and a roll drains the
    next gang right after: a request the moment the command exits must see the new pool,
    every time (CI once caught the old pool answering)."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    for _ in range(5):
        for gang in gangs:
            assert_ran(gateway.configure(gang))
            assert gateway.complete() == (200, gang.name)


def test_a_reload_nginx_does_not_take_fails_the_command_and_says_so(gateway, gangs):
    """A master that does not act on the reload (here: stopped) keeps the old pool. The
    command must not report a pool nginx does not use: a drain would then wait on a
    gang that still gets requests, and a return would claim a gang is back."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    short_reload_settle(gateway, 3)
    master = int((gateway.root / "run/nginx.pid").read_text())
    os.kill(master, signal.SIGSTOP)
    try:
        result = gateway.configure(gang0)
    finally:
        os.kill(master, signal.SIGCONT)
    assert result.returncode != 0
    assert "nginx did not take the new configuration: after 3 s worker" in result.stderr, result.stderr
    assert "of the old one still takes connections" in result.stderr


# --- drain and return ------------------------------------------------------------------------


def test_a_gang_drained_before_configure_lists_it_starts_out_of_the_pool(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0))
    early = gateway.drain(gang1, wait=0)
    assert_ran(early)
    assert "not listed by configure yet" in early.stderr
    assert_ran(gateway.configure(gang0, gang1))
    assert gateway.servers()[gang1.address] == f"server {gang1.address} down;"
    assert gateway.pool()["gang1"] == [gang1.address, "drained", "serving"]
    assert [gateway.complete()[1] for _ in range(3)] == ["gang0"] * 3


def test_a_drained_gang_finishes_its_request_while_new_ones_go_to_the_other(gateway, gangs):
    assert_ran(gateway.configure(*gangs))
    slow: list[tuple[int, str]] = []
    client = threading.Thread(target=lambda: slow.append(gateway.complete("slow")))
    client.start()
    eventually(lambda: sum(gang.in_flight for gang in gangs) == 1, what="the slow request reaching a gang")
    busy, other = gangs if gangs[0].in_flight else gangs[::-1]

    drain = gateway.start("drain", "--gang", busy.name, "--timeout", "20", "--wait", "5")
    eventually(lambda: gateway.include.exists() and "down" in gateway.servers()[busy.address], what="the mark")
    assert gateway.servers()[other.address].endswith("max_fails=0;")  # the last gang in the pool
    assert [gateway.complete() for _ in range(4)] == [(200, other.name)] * 4
    time.sleep(1.5)
    assert drain.poll() is None, "the drain ended while its gang still had a request in flight"

    busy.release.set()
    client.join(timeout=10)
    assert slow == [(200, busy.name)]
    _, stderr = drain.communicate(timeout=15)
    assert drain.returncode == 0, stderr
    assert f"drain {busy.name}: drained in" in stderr
    assert gateway.pool()[busy.name][1:] == ["drained", "serving", "roll-lease"]
    journal = gateway.journal.read_text()
    assert "-t vllm-cluster-gateway" in journal and f"drain {busy.name}: out of the API pool" in journal


def test_a_drain_that_hits_its_timeout_goes_on_with_a_warning(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang1))  # so the slow request can only reach gang0
    client = threading.Thread(target=lambda: gateway.complete("slow"))
    client.start()
    eventually(lambda: gang0.in_flight == 1, what="the slow request reaching gang0")
    assert_ran(gateway.give_back(gang1))
    started = time.monotonic()
    result = gateway.drain(gang0, timeout=1)
    assert_ran(result)
    # gang0 holds the request 30 s: still in flight means the drain gave up on it rather
    # than waiting for it to finish. The bound (generous: a niced CI worker forks slowly)
    # only catches a drain that took about as long as the request.
    assert gang0.in_flight == 1, f"the drain waited for the request to finish: {result.stderr}"
    assert time.monotonic() - started < 25, result.stderr
    assert "WARNING: 1 connection(s)" in result.stderr and "still open after 1 s" in result.stderr
    gang0.release.set()
    client.join(timeout=10)


def test_a_drain_that_cannot_count_connections_fails_instead_of_calling_the_gang_drained(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    write_stand_in(gateway.root / "bin/ss", "echo 'ss: cannot open netlink socket' >&2; exit 1\n")
    result = gateway.drain(gang0)
    assert result.returncode == 1 and f"ss could not count the connections to {gang0.address}" in result.stderr
    assert "drained in" not in result.stderr
    assert gateway.pool()["gang0"][1] == "drained"  # out of the pool, as it was asked: return brings it back


def test_a_second_drain_waits_for_the_first_gangs_return(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang0))
    # Each look of the drain takes the pool lock with flock (and releases it with flock -u):
    # the stand-in counts the takes.
    looks = gateway.root / "looks"
    write_stand_in(
        gateway.root / "bin/flock", f'[ "$1" = -u ] || echo "$PPID" >>{looks}\nexec {shutil.which("flock")} "$@"\n'
    )
    waiting = gateway.start("drain", "--gang", "gang1", "--timeout", "5", "--wait", "30")

    def looked(times: int) -> bool:
        assert waiting.poll() is None, "gang1's drain ended while gang0 held the roll lease"
        return looks.exists() and looks.read_text().split().count(str(waiting.pid)) >= times

    # Its second look (it looks every 2 s) is over when it starts its third.
    eventually(lambda: looked(3), timeout=30, what="the drain's third look")
    assert waiting.poll() is None, "gang1's drain went on while gang0 held the roll lease"
    assert "down" not in gateway.servers()[gang1.address]
    assert gateway.complete() == (200, "gang1")

    assert_ran(gateway.give_back(gang0))
    _, stderr = waiting.communicate(timeout=15)
    assert waiting.returncode == 0, stderr
    assert "gang0 holds the roll lease" in stderr
    assert gateway.pool() == {
        "gang0": [gang0.address, "in-pool", "serving"],
        "gang1": [gang1.address, "drained", "serving", "roll-lease"],
    }
    assert gateway.complete() == (200, "gang0")
    # The roll's order, as the operator reads it back from the journal.
    steps = [line.split(" -- ", 1)[1] for line in gateway.journal.read_text().splitlines()]
    taken = [step.split(":")[0] for step in steps if ": out of the API pool" in step or step.startswith("return")]
    assert taken == ["drain gang0", "return gang0", "drain gang1"]


def test_two_drains_at_once_take_one_gang_out(gateway, gangs):
    """Whichever drain comes first, one gang is out at the end. gang0 first: gang1's
    waits for its lease and gives up. gang1 first: gang0's, earlier in the order, takes
    the lease from it (as from a failed roll's) and gang1 serves again."""
    assert_ran(gateway.configure(*gangs))
    drains = [gateway.start("drain", "--gang", gang.name, "--timeout", "5", "--wait", "2") for gang in gangs]
    results = [(process.wait(timeout=30), process.stderr.read()) for process in drains]
    states = gateway.pool()
    assert sorted(state[1] for state in states.values()) == ["drained", "in-pool"], (states, results)
    holder = next(name for name, state in states.items() if state[1] == "drained")
    assert states[holder][-1] == "roll-lease"
    if holder == "gang0" and results[1][0] == 0:
        assert "released gang1's roll lease" in gateway.journal.read_text()
    else:
        assert sorted(code for code, _ in results) == [0, 1], results
        refused = next(stderr for code, stderr in results if code)
        assert f"{holder} holds the roll lease" in refused
        assert f"release it: sudo vllm-cluster-gateway return --gang {holder}" in refused


def test_a_drain_with_no_other_gang_serving_waits_then_keeps_the_gang_in_the_pool(gateway, gangs):
    """Taking out the last serving gang would leave no server, restart or not: after
    waiting (up to --wait, at most a minute) for another gang to serve, the drain takes
    the lease (the roll stays in order) and leaves the gang in the pool."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    gang1.healthy = False
    started = time.monotonic()
    result = gateway.drain(gang0, wait=2)
    assert_ran(result)
    # It waited its --wait (2 s), not the 60 s NO_OTHER_GANG_GRACE_SECONDS; the bound leaves
    # room for a niced CI worker's slow forks and late wake-ups.
    assert 2 <= time.monotonic() - started < 30
    assert f"gang1 (no 200 from http://{gang1.address}/health)" in result.stderr
    assert "without gang0 the API would have no server" in result.stderr
    assert "drain gang0: stays in the API pool (NOT drained: no other gang serves" in gateway.journal.read_text()
    assert gateway.pool()["gang0"] == [gang0.address, "in-pool", "serving", "roll-lease"]
    assert gateway.complete() == (200, "gang0")


def test_the_only_gang_is_never_drained_while_it_serves(gateway, gangs):
    gang0, _ = gangs
    assert_ran(gateway.configure(gang0))
    assert gateway.servers() == {gang0.address: f"server {gang0.address} max_fails=0;"}
    result = gateway.drain(gang0, wait=0)
    assert result.returncode == 1 and "gang0 is the only gang" in result.stderr
    assert gateway.complete() == (200, "gang0")


def test_a_gang_that_does_not_serve_is_drained_without_the_lease_when_no_gang_serves(gateway, gangs):
    """The first `pulumi up`: no gang serves yet, so no drain waits and every gang starts at once."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    gang0.healthy = gang1.healthy = False
    for gang in gangs:
        result = gateway.drain(gang, wait=0)
        assert_ran(result)
        assert "no roll lease needed" in result.stderr
    assert gateway.pool() == {
        "gang0": [gang0.address, "drained", "not-serving"],
        "gang1": [gang1.address, "drained", "not-serving"],
    }


def test_a_broken_gang_takes_the_lease_while_another_serves_so_the_next_waits_for_its_return(gateway, gangs):
    """gang0 broken, gang1 serving: gang0's drain takes the lease, so gang1 is not taken
    out until gang0 serves again and returns (the roll would otherwise leave no server)."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    gang0.healthy = False
    assert_ran(gateway.drain(gang0, wait=0))
    assert gateway.pool()["gang0"] == [gang0.address, "drained", "not-serving", "roll-lease"]
    waiting = gateway.drain(gang1, wait=2)
    assert waiting.returncode == 1 and "gang0 holds the roll lease" in waiting.stderr
    assert gateway.pool()["gang1"][1] == "in-pool"
    gang0.healthy = True
    assert_ran(gateway.give_back(gang0))
    assert_ran(gateway.drain(gang1, wait=0))
    assert gateway.pool()["gang1"][1:] == ["drained", "serving", "roll-lease"]


def test_a_drain_run_again_goes_on_and_return_restores_the_gang(gateway, gangs):
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang0))
    again = gateway.drain(gang0, wait=0)
    assert_ran(again)
    assert "already drained" in again.stderr
    assert gateway.servers()[gang0.address] == f"server {gang0.address} down;"
    assert [gateway.complete()[1] for _ in range(3)] == ["gang1"] * 3

    assert_ran(gateway.give_back(gang0))
    assert gateway.servers()[gang0.address] == f"server {gang0.address} max_fails=1 fail_timeout=10s;"
    assert gateway.pool()["gang0"] == [gang0.address, "in-pool", "serving"]
    assert "gang0" in {gateway.complete()[1] for _ in range(4)}
    twice = gateway.give_back(gang0)
    assert_ran(twice)
    assert "in the pool already" in twice.stderr
    assert "return gang0: back in the API pool; roll lease released" in gateway.journal.read_text()


# --- retries on another gang ---------------------------------------------------------------


def test_a_completion_goes_to_another_gang_when_one_refuses_connections(gateway, gangs):
    _, gang1 = gangs
    refusing = Gang("gang0", "127.0.0.4")  # never started: nothing listens there
    assert_ran(gateway.configure(refusing, gang1))
    assert [gateway.complete() for _ in range(4)] == [(200, "gang1")] * 4
    assert "connect() failed (111: Connection refused) while connecting to upstream" in gateway.error_log.read_text()


def test_a_completion_already_sent_to_a_gang_that_dies_is_sent_to_another(gateway, gangs):
    """A POST is retried once sent only with non_idempotent: here the gang reads it and
    closes the connection without an answer."""
    gang0, gang1 = gangs
    gang0.mode = "drop"
    assert_ran(gateway.configure(gang0, gang1))
    answers = []
    while gang0.completions == 0 and len(answers) < 6:
        answers.append(gateway.complete())
    assert gang0.completions >= 1, "no completion reached the dying gang"
    assert answers == [(200, "gang1")] * len(answers)


def test_the_last_gang_in_the_pool_is_not_taken_out_by_one_failure(gateway, gangs):
    """With the other gang drained (a `down` server), nginx would count failures of the
    last one and answer "no live upstreams" for fail_timeout after a single refused
    connection. So the last one has max_fails=0."""
    gang0, _ = gangs
    late = Gang("gang1", "127.0.0.5")
    assert_ran(gateway.configure(gang0, late))
    gang0.healthy = False
    assert_ran(gateway.drain(gang0, wait=0))
    assert gateway.servers()[late.address] == f"server {late.address} max_fails=0;"
    assert gateway.complete()[0] == 502  # nothing listens yet
    late.start()
    try:
        assert gateway.complete() == (200, "gang1")
    finally:
        late.stop()


@pytest.mark.parametrize(
    "args",
    [
        ("return", "--gang"),
        ("drain", "--gang", "gang0", "--timeout"),
        ("configure", "--gangs"),
        ("wait-login", "--host", "10.0.0.5", "--user"),
    ],
)
def test_an_option_without_its_value_is_named_not_a_silent_exit(gateway, args):
    """status tells an operator to type `return --gang NAME`: one typed without the
    name gets told which option lacks its value."""
    result = gateway.run(*args)
    assert result.returncode != 0
    assert f"{args[0]}: {args[-1]} needs a value" in result.stderr, result.stderr


# --- a replaced gang: the old head serves until the new one does ---------------------------


def test_a_replaced_gang_keeps_serving_at_its_old_head_until_its_return_at_the_new_one(gateway, gangs):
    """A launch-template change replaces the nodes: the stack's configure runs as soon as
    the new heads have addresses, long before they serve. The old heads, which Pulumi
    deletes only at the end, keep the pool; the gang's drain takes nothing out and no
    lease; its return, after start-vllm's completion on the new head, switches."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    new1 = Gang("gang1", "127.0.0.4")  # not started: the new head does not serve yet
    configured = gateway.configure(gang0, new1, keep=True)
    assert_ran(configured)
    assert "gang1 keeps serving at" in configured.stderr, configured.stderr
    assert gateway.pool() == {
        "gang0": [gang0.address, "in-pool", "serving"],
        "gang1": [gang1.address, "in-pool", "serving"],
    }
    drained = gateway.run("drain", "--gang", "gang1", "--address", new1.address, "--timeout", "5", "--wait", "5")
    assert_ran(drained)
    assert "replaced" in drained.stderr, drained.stderr
    assert gateway.pool()["gang1"] == [gang1.address, "in-pool", "serving"]  # no lease, not drained
    assert {gateway.complete()[1] for _ in range(6)} == {"gang0", "gang1"}
    assert gang1.completions > 0
    # The other gang's own roll is not held up by the replacement.
    assert_ran(gateway.drain(gang0))
    assert_ran(gateway.give_back(gang0))

    new1.start()
    try:
        before = gang1.completions
        assert_ran(gateway.run("return", "--gang", "gang1", "--address", new1.address))
        assert gateway.pool() == {
            "gang0": [gang0.address, "in-pool", "serving"],
            "gang1": [new1.address, "in-pool", "serving"],
        }
        assert gateway.servers() == {
            gang0.address: f"server {gang0.address} max_fails=1 fail_timeout=10s;",
            new1.address: f"server {new1.address} max_fails=1 fail_timeout=10s;",
        }
        for _ in range(6):
            gateway.complete()
        assert gang1.completions == before and new1.completions > 0
        # The stack's next configure names the new head: nothing moves.
        again = gateway.configure(gang0, new1, keep=True)
        assert_ran(again)
        assert "unchanged" in again.stderr
    finally:
        new1.stop()


def test_one_gang_moves_to_its_new_head_only_once_that_serves(gateway, gangs):
    """With --keep-old-heads a replaced gang keeps its old head until the new one serves.
    (One replica: the stack configures after start-vllm's completion on the new head,
    without it: that head is the one even if its vLLM went down since, for the old host
    is about to be deleted.)"""
    gang0, _ = gangs
    assert_ran(gateway.configure(gang0))
    new0 = Gang("gang0", "127.0.0.4")
    early = gateway.configure(new0, keep=True)
    assert_ran(early)
    assert gateway.pool() == {"gang0": [gang0.address, "in-pool", "serving"]}
    assert gateway.complete() == (200, "gang0")
    new0.start()
    try:
        moved = gateway.configure(new0, keep=True)
        assert_ran(moved)
        assert gateway.pool() == {"gang0": [new0.address, "in-pool", "serving"]}
        before = gang0.completions
        assert gateway.complete() == (200, "gang0") and new0.completions == 1 and gang0.completions == before
    finally:
        new0.stop()


def test_a_replaced_gang_whose_old_head_is_gone_moves_at_once_and_enters_drained(gateway, gangs):
    """Reserved capacity replaces delete-first: the old head is gone before the new one
    has an address. Nothing to keep: the gang moves, drained until its return."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    gang1.stop()
    new1 = Gang("gang1", "127.0.0.4")
    assert_ran(gateway.configure(gang0, new1, keep=True))
    assert gateway.pool() == {
        "gang0": [gang0.address, "in-pool", "serving"],
        "gang1": [new1.address, "drained", "not-serving"],
    }
    assert [gateway.complete()[1] for _ in range(3)] == ["gang0"] * 3


def test_a_lease_left_by_a_later_gang_is_released_when_an_earlier_gang_drains(gateway, gangs):
    """A `pulumi up` that failed in gang1's turn left gang1's lease. The next roll drains
    gang0 first and gang1's drain waits for gang0's: gang0 waiting for gang1's lease would
    wait out its whole --wait (about two hours) and fail. The later gang's lease goes;
    gang1 (it serves) is back in the pool, so gang0 goes out while gang1 serves."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang1))
    assert gateway.pool()["gang1"][1:] == ["drained", "serving", "roll-lease"]
    result = gateway.drain(gang0, wait=4)
    assert_ran(result)
    assert "released gang1's roll lease" in gateway.journal.read_text()
    assert gateway.pool() == {
        "gang0": [gang0.address, "drained", "serving", "roll-lease"],
        "gang1": [gang1.address, "in-pool", "serving"],
    }
    assert [gateway.complete()[1] for _ in range(3)] == ["gang1"] * 3
    # An earlier gang's lease still holds a later gang back.
    waiting = gateway.drain(gang1, wait=2)
    assert waiting.returncode == 1 and "gang0 holds the roll lease" in waiting.stderr


def test_one_gang_configured_after_its_vllm_takes_the_new_head_even_if_it_stopped_serving(gateway, gangs):
    """The stack of one replica configures after start-vllm passed on the new head, and
    Pulumi deletes the old head right after: keeping the old one because the new vLLM
    went down in between would leave the pool on a deleted host, and no later `pulumi
    up` would run configure again."""
    gang0, _ = gangs
    assert_ran(gateway.configure(gang0))
    new0 = Gang("gang0", "127.0.0.4")  # not serving
    assert_ran(gateway.configure(new0))
    assert gateway.pool() == {"gang0": [new0.address, "in-pool", "not-serving"]}
