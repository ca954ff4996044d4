"""The gateway's nginx site (an http-context file for conf.d): TLS on the API port, the
stack's API keys checked before anything else, only the stack's routes forwarded to the
gangs' heads (balanced, retried on another gang, handed to the waker when none serves),
the Ray dashboard and Prometheus on the admin port for adminCidrs, and Prometheus's query
API for the heads on the gateway's private address. Pure text from plain values; the
gateway's commands install it (components/services.py). The API keys' maps the site
includes are components/bootstrap.py's (api_keys_conf), beside the spec's key rules.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from components import metrics, ports
from components.api_routes import DEFAULT_GENERATION_ROUTES, KNOWN_ROUTES, WORK_ROUTES
from components.config_keys import DEFAULT_API_RATE_LIMIT_PER_SECOND, DEFAULT_API_READ_TIMEOUT_SECONDS
from components.engine_capacity import VLLM_DEFAULT_MAX_NUM_SEQS
from components.gateway_capacity import upstream_keepalive
from components.host_paths import CONFIG_DIR, TLS_DIR

# The gateway's API limits: a request body large enough for long chat histories; the
# per-client rate, the requests in flight per key and per address and the read timeout
# come from config (apiRateLimitPerSecond, apiMaxRequestsInFlightPerKey,
# apiMaxRequestsInFlightPerAddress, apiReadTimeoutSeconds), and a burst of this many
# seconds' worth of requests is let through the rate limit.
MAX_REQUEST_BODY = "4m"
RATE_LIMIT_BURST_SECONDS = 2
# A refused request (429) may be sent again after this many seconds: the Retry-After the
# gateway's 429 carries. The OpenAI SDKs wait for it before their retry (openai-python
# _base_client.py, _parse_retry_after_header: retry-after-ms, then retry-after); a request
# in flight on vLLM ends in seconds, so one second is a fair first wait.
RATE_LIMITED_RETRY_AFTER_SECONDS = 1
# The shared memory of each limit's zone: 10 MiB holds about 160,000 states of
# $binary_remote_addr (ngx_http_limit_conn_module: "One megabyte zone can keep about 32
# thousand 32-byte states or about 16 thousand 64-byte states").
LIMIT_ZONE_SIZE = "10m"
# The site sets no error_log, and configure leaves nginx.conf's level as it is (error): a
# worker out of connections says "worker_connections are not enough" at alert there
# (src/core/ngx_connection.c, ngx_get_connection); the gateway is sized so that it never
# does (components/gateway_capacity.py), and warn would add a line per large request body.
# The probe key's label (components/bootstrap.py api_keys_conf): the stack's readiness
# check and `vllm-cluster status` send it, and no per-key limit may refuse them.
PROBE_KEY_LABEL = "probe"
# vLLM's HTTP server closes an idle keep-alive connection after VLLM_HTTP_TIMEOUT_KEEP_ALIVE
# seconds (5 by default, vllm/envs.py); vllm.env sets it explicitly. nginx keeps idle
# upstream connections for 60 s unless told otherwise, and a request it sends on one the
# server has just closed fails with 502. So the gateway lets go first.
VLLM_HTTP_KEEP_ALIVE_SECONDS = 5
GATEWAY_UPSTREAM_KEEPALIVE_SECONDS = 4
# The keys the gateway accepts and the one it sends the heads, as nginx maps (an
# http-level include the site names): root-only, written by
# `vllm-cluster-gateway install-api-keys`. nginx's master reads it as root at every
# (re)load; its workers hold the maps in memory and never open the file.
API_KEYS_FILE = f"{CONFIG_DIR}/api-keys.conf"
# A map's keys must fit one bucket of its hash (nginx docs, ngx_http_map_module
# map_hash_bucket_size): "Bearer " and a key of up to spec.MAX_API_KEY_LENGTH characters.
API_KEYS_MAP_BUCKET_SIZE = 256

# The API pool's servers, one line per gang, in a file of their own: the stack sends the
# gangs (`vllm-cluster-gateway configure --gangs`), and the gateway renders the file
# from them and from the gangs drained for a restart (`drain`, `return`), so taking a gang
# out never waits for a `pulumi up`. Not under conf.d: nginx.conf includes conf.d/*.conf
# in its http block, where a bare `server` line is an error.
NGINX_UPSTREAM_INCLUDE = "/etc/nginx/vllm-cluster-upstream.inc"
# A connection to a head inside the VPC takes milliseconds: one that has not opened in
# this long is a head that is off, and the request moves on to another gang instead of
# waiting nginx's default 60 s.
GATEWAY_CONNECT_TIMEOUT_SECONDS = 3
# A request a gang could not serve is passed to another gang at most this many tries in
# all, and only within this many seconds of its first try: long enough for a dead head's
# connect timeout and a second gang, short enough that a generation which ran into the
# read timeout is not run again elsewhere (never longer than the read timeout).
GATEWAY_RETRY_TRIES = 3
GATEWAY_RETRY_WINDOW_SECONDS = 15
# The waker listens on the gateway itself: a connect that takes longer means it is down.
# Its answer may wait for one look at EC2 (its HTTP timeouts are 5 s) and the heads.
WAKER_CONNECT_TIMEOUT_SECONDS = 1
WAKER_READ_TIMEOUT_SECONDS = 20


def gateway_gangs(head_ips: dict[str, str]) -> str:
    """The value of `vllm-cluster-gateway configure --gangs`: each gang's name and the
    address of its head's vLLM, in the order given: gang0=IP:PORT,gang1=IP:PORT."""
    return ",".join(f"{gang}={ip}:{ports.VLLM_API}" for gang, ip in head_ips.items())


def nginx_site(
    dashboard_head_ip: str,
    admin_cidrs: tuple[str, ...],
    cert_path: str = f"{TLS_DIR}/cert.pem",
    key_path: str = f"{TLS_DIR}/key.pem",
    *,
    read_timeout_seconds: int = DEFAULT_API_READ_TIMEOUT_SECONDS,
    rate_limit_per_second: int = DEFAULT_API_RATE_LIMIT_PER_SECOND,
    upstream_include: str = NGINX_UPSTREAM_INCLUDE,
    waker: bool = False,
    api_routes: tuple[str, ...] = DEFAULT_GENERATION_ROUTES,
    api_keys_file: str = API_KEYS_FILE,
    nodes_prometheus_ip: str | None = None,
    keepalive: int = upstream_keepalive(1, VLLM_DEFAULT_MAX_NUM_SEQS),
    max_in_flight_per_key: int = 0,
    max_in_flight_per_address: int = 0,
) -> str:
    """The gateway's nginx site (an http-context file for conf.d): TLS on the API
    port, where a request needs one of the stack's API keys (api_keys_conf, in
    `api_keys_file`) before anything else happens, and only `api_routes` are forwarded,
    as the route itself (never the path as sent); a body limit, a read timeout and a
    per-client rate limit (none when 0), balanced over every gang's head (the servers
    are in `upstream_include`, which the gateway renders); and the Ray dashboard of one
    head (gang0's, `dashboard_head_ip`) on the admin port for adminCidrs only. With
    `waker` (a stack with idleStopMinutes), a request to a route that does the model's
    work (WORK_ROUTES) that no gang could take goes to the gateway's waker, which starts
    the stopped gangs and answers 503 with Retry-After; the other routes get a 503 and
    wake nothing. With `nodes_prometheus_ip` (the gateway's private address), Prometheus's
    query API for the heads' Ray dashboards on that address (_nginx_nodes_prometheus_server).
    `keepalive`: the idle connections to the heads each worker keeps (gateway_capacity);
    `max_in_flight_per_key` and `..._per_address`: requests in flight a key (the probe key
    never) or a client address may have (none when 0); every limit refuses with a 429 in
    OpenAI's form with Retry-After (_nginx_limits)."""
    unknown = sorted(set(api_routes) - set(KNOWN_ROUTES))
    if unknown:
        raise ValueError(f"not a route the gateway knows: {', '.join(unknown)}")
    # TLS settings go in each server block: the distribution's nginx.conf already sets
    # ssl_protocols in the http block, and a second one there is an error.
    tls = f"""    ssl_certificate {cert_path};
    ssl_certificate_key {key_path};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:vllm_tls:10m;
    server_tokens off;
"""
    limits = Limits(rate_limit_per_second, max_in_flight_per_key, max_in_flight_per_address)
    # The header names the module that rendered the site before issue 37 moved it here:
    # a new header would rewrite every gateway's site (and reload its nginx) for a comment.
    return (
        "# vllm-cluster gateway, generated by components/bootstrap.py. Do not edit on the host:\n"
        "# the next `pulumi up` writes it again. Included in nginx.conf's http block (conf.d).\n\n"
        f"{_nginx_api_keys(api_keys_file)}\n"
        f"{limits.zones()}{_nginx_upstreams(dashboard_head_ip, upstream_include, keepalive)}\n"
        f"{_nginx_api_server(tls, read_timeout_seconds, limits, waker, api_routes)}\n"
        f"{_nginx_dashboard_server(tls, admin_cidrs)}"
        + (f"\n{_nginx_nodes_prometheus_server(nodes_prometheus_ip)}" if nodes_prometheus_ip is not None else "")
    )


# The variables api_keys_conf defines: which key a request carried ("" for none the
# stack accepts), and the Authorization header the gateway sends the heads.
API_KEY_VARIABLE = "$vllm_cluster_api_key"
HEADS_AUTHORIZATION_VARIABLE = "$vllm_cluster_heads_authorization"


def _nginx_api_keys(api_keys_file: str) -> str:
    return f"""# The API keys (api_keys_conf): a root-only file, so the keys are not in this site.
map_hash_bucket_size {API_KEYS_MAP_BUCKET_SIZE};
include {api_keys_file};
"""


def _nginx_upstreams(dashboard_head_ip: str, upstream_include: str, keepalive: int) -> str:
    return f"""upstream vllm_api {{
    # Each request to the gang with the fewest requests in flight: a generation holds
    # its connection for seconds to minutes, so this balances better than taking turns.
    # A balancing method must come before keepalive (nginx docs, upstream keepalive).
    least_conn;
    # One server line per gang, written by vllm-cluster-gateway (configure, drain,
    # return): a gang drained for a restart is `down`, and the others are taken out for
    # a while after a failed try (max_fails); the file says why.
    include {upstream_include};
    # Idle connections to the heads each worker keeps: every gang's batch
    # (components/gateway_capacity.py upstream_keepalive), so the next batch reuses them
    # instead of opening connections on vLLM's API server, which shares the engine's CPU.
    keepalive {keepalive};
    # Idle connections close here before vLLM closes them
    # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE {VLLM_HTTP_KEEP_ALIVE_SECONDS} s).
    keepalive_timeout {GATEWAY_UPSTREAM_KEEPALIVE_SECONDS}s;
}}

upstream ray_dashboard {{
    server {dashboard_head_ip}:{ports.RAY_DASHBOARD};
}}
"""


def _openai_error(status: int, message: str, kind: str, code: str) -> str:
    """An error body as OpenAI's API sends it (and the OpenAI SDKs parse into their
    exceptions' messages): {"error": {"message", "type", "param", "code"}}. In an nginx
    single-quoted string: the messages hold no quote, no $ and no backslash."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    if set("'$\\\\") & set(body):
        raise ValueError(f"an error body nginx would misread: {body}")
    return f"return {status} '{body}';"


UNAUTHORIZED = _openai_error(
    401,
    "Missing or invalid API key: send the key of the stack as Authorization: Bearer KEY "
    "(pulumi stack output apiKey --show-secrets).",
    "invalid_request_error",
    "invalid_api_key",
)
NOT_FOUND = _openai_error(
    404,
    "No such route on this gateway (see the apiRoutes setting of the stack).",
    "invalid_request_error",
    "unknown_url",
)
# OpenAI's own 429 names the limit's kind as its type ("requests" or "tokens") and the code
# rate_limit_exceeded, e.g. {"message": "Rate limit reached for gpt-4o ... on requests per
# min (RPM) ...", "type": "requests", "param": null, "code": "rate_limit_exceeded"} (as
# quoted from api.openai.com in github.com/Huanshere/VideoLingo/issues/34; OpenAI's error
# codes guide: "429 - Rate limit reached for requests").
RATE_LIMITED = _openai_error(
    429,
    "Rate limit reached: too many requests at once or per second from this API key or address on this gateway "
    "(apiMaxRequestsInFlightPerKey, apiMaxRequestsInFlightPerAddress, apiRateLimitPerSecond). Retry after the "
    "seconds the Retry-After header gives.",
    "requests",
    "rate_limit_exceeded",
)
NO_GANG_SERVES = _openai_error(
    503,
    "No gang of this stack is serving now. A stack that stopped for idleness wakes on a request to a "
    "route that uses the model (such as /v1/chat/completions), not on this one.",
    "service_unavailable",
    "no_gang_serving",
)


# The variables the per-key and per-address limits count by: the key's label, or the
# client's address, and "" for the probe key, which limit_conn then does not count
# (ngx_http_limit_conn_module limit_conn_zone: "Requests with an empty key value are not
# accounted").
LIMITED_KEY_VARIABLE = "$vllm_cluster_limited_key"
LIMITED_ADDRESS_VARIABLE = "$vllm_cluster_limited_address"


@dataclass(frozen=True)
class Limits:
    """The API's limits, each off at 0: requests per second per client address
    (limit_req, with a burst of RATE_LIMIT_BURST_SECONDS' worth, nodelay), and requests in
    flight per API key and per address (limit_conn: "Not all connections are counted. A
    connection is counted only if it has a request being processed by the server", which on
    HTTP/1.1 is one request in flight, ngx_http_limit_conn_module). Every refusal is a 429
    in OpenAI's form with Retry-After (RATE_LIMITED). No queue at the gateway: vLLM's
    scheduler queues what its batch cannot run (docs/api.md says why)."""

    rate_per_second: int = 0
    in_flight_per_key: int = 0
    in_flight_per_address: int = 0

    @property
    def on(self) -> bool:
        return bool(self.rate_per_second or self.in_flight_per_key or self.in_flight_per_address)

    def zones(self) -> str:
        """The http-level zones (and the maps the in-flight limits count by)."""
        zones = ""
        if self.rate_per_second:
            zones += (
                "# Requests per second per client address (apiRateLimitPerSecond).\n"
                f"limit_req_zone $binary_remote_addr zone=vllm_api:{LIMIT_ZONE_SIZE} rate={self.rate_per_second}r/s;\n"
            )
        for limit, variable, value, zone in (
            (self.in_flight_per_key, LIMITED_KEY_VARIABLE, API_KEY_VARIABLE, "vllm_api_keys"),
            (self.in_flight_per_address, LIMITED_ADDRESS_VARIABLE, "$binary_remote_addr", "vllm_api_addresses"),
        ):
            if limit:
                zones += (
                    f"# Requests in flight by {value}; the stack's probe key never counts (its readiness check).\n"
                    f"map {API_KEY_VARIABLE} {variable} {{\n"
                    f'    {PROBE_KEY_LABEL} "";\n'
                    f"    default {value};\n"
                    "}\n"
                    f"limit_conn_zone {variable} zone={zone}:{LIMIT_ZONE_SIZE};\n"
                )
        return f"{zones}\n" if zones else ""

    def server_lines(self) -> str:
        """The server's refusal status: 429, not limit_req's and limit_conn's default 503."""
        return "    limit_req_status 429;\n    limit_conn_status 429;\n" if self.on else ""

    def location_lines(self) -> str:
        """A route's limits, and its 429 answered by @vllm_rate_limited: set in each route,
        as a location's own error_page (the waker's 502 504) replaces the server's
        (ngx_http_core_module error_page: inherited "if and only if there are no error_page
        directives defined on the current level")."""
        lines = ""
        if self.rate_per_second:
            burst = self.rate_per_second * RATE_LIMIT_BURST_SECONDS
            lines += f"        limit_req zone=vllm_api burst={burst} nodelay;\n"
        if self.in_flight_per_key:
            lines += f"        limit_conn vllm_api_keys {self.in_flight_per_key};\n"
        if self.in_flight_per_address:
            lines += f"        limit_conn vllm_api_addresses {self.in_flight_per_address};\n"
        return lines + ("        error_page 429 @vllm_rate_limited;\n" if self.on else "")

    def refusal_location(self) -> str:
        """The 429's answer: OpenAI's JSON with Retry-After ("always": add_header skips
        4xx answers without it, ngx_http_headers_module)."""
        if not self.on:
            return ""
        return f"""
    location @vllm_rate_limited {{
        add_header Retry-After {RATE_LIMITED_RETRY_AFTER_SECONDS} always;
        {RATE_LIMITED}
    }}
"""


def _nginx_waker() -> tuple[str, str]:
    """The work routes' line that hands a request no gang could take to the waker, and
    the named locations: the waker's, and the 503 the other routes give instead. error_page
    catches only nginx's own 502 and 504 (no gang answered, or none in time, after
    proxy_next_upstream's tries): without proxy_intercept_errors a 502 or 503 that vLLM
    itself sent reaches the client as it is (nginx docs, ngx_http_proxy_module
    proxy_intercept_errors). "=" without a code answers with the waker's status
    (ngx_http_core_module error_page). A named location keeps the request's URI and
    method, and nothing outside can address it. error_page is set per location: a
    location's own error_page replaces the server's (ngx_http_core_module: "inherited
    ... if and only if there are no error_page directives defined on the current level")."""
    handoff = """        # No gang could take it (all stopped by idleStopMinutes, or down): the waker on
        # this host answers, waking the stopped gangs (503 with Retry-After).
        error_page 502 504 = @vllm_waker;
"""
    locations = f"""
    location @vllm_waker {{
        # The status nginx would have sent, for the waker's answer when nothing sleeps.
        proxy_set_header X-Vllm-Cluster-Status $status;
        # The waker needs no key: the request passed the gateway's check to get here.
        proxy_set_header Authorization "";
        proxy_pass http://127.0.0.1:{ports.WAKER};
        # On this host: it answers at once (it reads EC2 for a few seconds at most).
        proxy_connect_timeout {WAKER_CONNECT_TIMEOUT_SECONDS}s;
        proxy_read_timeout {WAKER_READ_TIMEOUT_SECONDS}s;
        proxy_next_upstream off;
    }}

    location @vllm_no_gang {{
        {NO_GANG_SERVES}
    }}
"""
    return handoff, locations


def _nginx_api_server(
    tls: str,
    read_timeout_seconds: int,
    limits: Limits,
    waker: bool = False,
    api_routes: tuple[str, ...] = DEFAULT_GENERATION_ROUTES,
) -> str:
    """The OpenAI-compatible API: the key first, then only `api_routes` reach vLLM."""
    handoff, waker_locations = _nginx_waker() if waker else ("", "")
    api_locations = _nginx_api_locations(api_routes, limits, handoff, waker)
    return f"""# The OpenAI-compatible API: the key first, then only the stack's routes reach vLLM.
server {{
    listen {ports.API_HTTPS} ssl;
    listen [::]:{ports.API_HTTPS} ssl;
    server_name _;
{tls}
    client_max_body_size {MAX_REQUEST_BODY};
    # The type of the gateway's own answers (401, 404, 429, 503): OpenAI-style JSON.
    default_type application/json;
    # A path as sent that is not the route it names: a dot segment, an empty segment or
    # any percent-encoding (none of the routes has one). nginx would match its normalised
    # form (/metrics/../v1/models as /v1/models); refused before any location is chosen.
    if ($request_uri ~ "^[^?]*(/\\.\\.?(/|$|\\?)|//|%)") {{
        {NOT_FOUND}
    }}
{limits.server_lines()}{_nginx_api_proxying(read_timeout_seconds)}{api_locations}{waker_locations}{limits.refusal_location()}
    location / {{
        {NOT_FOUND}
    }}
}}
"""


def _nginx_api_proxying(read_timeout_seconds: int) -> str:
    """How the API server passes a request to the gangs' heads: the heads' own key instead
    of the client's, no buffering of a stream, its timeouts, and another gang's try when one
    could not serve it."""
    return f"""    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header X-Forwarded-For $remote_addr;
    # The heads check their own key, which only the gateway holds: the client's key
    # stops here (api_keys_conf).
    proxy_set_header Authorization {HEADS_AUTHORIZATION_VARIABLE};
    # Streaming responses (server-sent events) must not wait in a buffer.
    proxy_buffering off;
    # Between two reads from vLLM: a non-streamed generation longer than this gets 504.
    proxy_read_timeout {read_timeout_seconds}s;
    # Inside the VPC a connect takes milliseconds: a head that is off must not hold the
    # request for nginx's default 60 s before the next gang is tried.
    proxy_connect_timeout {GATEWAY_CONNECT_TIMEOUT_SECONDS}s;
    # A request a gang could not serve goes to another gang: the connection failed or
    # broke before a response header (error), did not open or answer in time (timeout),
    # or vLLM answered 502/503. A POST (every completion) that was already sent is
    # passed on only with non_idempotent; running a generation again changes nothing.
    # nginx never retries once a byte went to the client, so a stream is not restarted,
    # and the body can be sent again because proxy_request_buffering stays on.
    proxy_next_upstream error timeout http_502 http_503 non_idempotent;
    # At most this many tries in all, and none after this long since the first: a
    # generation that ran into proxy_read_timeout is not run again on another gang.
    proxy_next_upstream_tries {GATEWAY_RETRY_TRIES};
    proxy_next_upstream_timeout {min(GATEWAY_RETRY_WINDOW_SECONDS, read_timeout_seconds)}s;
"""


def _nginx_api_locations(api_routes: tuple[str, ...], limits: Limits, handoff: str, waker: bool) -> str:
    """One exact location a route: the key checked first (the rewrite phase: a request
    without a key is answered before the limits of the preaccess phase count it), then
    the limits (Limits), then vLLM; with the waker, a work route that no gang could take
    goes to it (`handoff`, _nginx_waker) and the other routes get a 503."""
    limit = limits.location_lines()
    no_gang = (
        "        # Never a reason to start a gang.\n        error_page 502 504 = @vllm_no_gang;\n" if waker else ""
    )
    # proxy_pass names the route: nginx sends exactly it (with the query string), not the
    # path as the client sent it (ngx_http_proxy_module proxy_pass: with a URI, "the part
    # of a normalized request URI matching the location is replaced by a URI specified in
    # the directive"; without one, the request URI goes "in the same form as sent by a
    # client"), so /metrics/../v1/models cannot reach vLLM's /metrics.
    return "".join(
        f"""
    location = {route} {{
        if ({API_KEY_VARIABLE} = "") {{
            {UNAUTHORIZED}
        }}
{limit}{handoff if route in WORK_ROUTES else no_gang}        proxy_pass http://vllm_api{route};
    }}
"""
        for route in api_routes
    )


def _nginx_dashboard_server(tls: str, admin_cidrs: tuple[str, ...]) -> str:
    admin_allow = "".join(f"    allow {cidr};\n" for cidr in admin_cidrs)
    return f"""# The Ray dashboard (also Ray's Jobs API, which runs code) and Prometheus: admins
# only. The security group admits adminCidrs alone; nginx checks again, Ray asks for
# its token and Prometheus for the metrics login.
server {{
    listen {ports.DASHBOARD_HTTPS} ssl;
    listen [::]:{ports.DASHBOARD_HTTPS} ssl;
    server_name _;
{tls}
{admin_allow}    deny all;

    # Prometheus on this host: the stack's metrics login (metricsLogin) on top of
    # adminCidrs, as Prometheus has none of its own. It serves everything under the
    # prefix itself (--web.route-prefix), so the path passes through unchanged.
    location {metrics.ROUTE_PREFIX}/ {{
        auth_basic "vllm-cluster metrics";
        auth_basic_user_file {metrics.HTPASSWD_FILE};
        proxy_pass http://{metrics.listen_address()};
        proxy_read_timeout 120s;
    }}

    location / {{
        proxy_pass http://ray_dashboard;
        proxy_http_version 1.1;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection "upgrade";
        proxy_read_timeout 300s;
    }}
}}
"""


def _nginx_nodes_prometheus_server(gateway_private_ip: str) -> str:
    """Prometheus listens on loopback only (metrics.listen_address()); the heads' Ray
    dashboards reach its query API here, on the gateway's private address and Prometheus's
    port (metrics.ray_prometheus_host), which the security group opens to the nodes alone.
    Ray asks that one path with GET (metrics.NODES_QUERY_PATH); everything else of
    Prometheus (its UI, /federate, the other APIs) is 404 to the nodes."""
    ip = ipaddress.ip_address(gateway_private_ip)
    listen = f"[{ip}]:{ports.PROMETHEUS}" if ip.version == 6 else f"{ip}:{ports.PROMETHEUS}"
    return f"""# Prometheus's query API for the heads' Ray dashboards (RAY_PROMETHEUS_HOST), and
# nothing else of it: the nodes only, by the security group; no TLS inside the VPC, as
# before, and Prometheus itself on loopback.
server {{
    listen {listen};
    server_name _;
    server_tokens off;

    location = {metrics.NODES_QUERY_PATH} {{
        limit_except GET {{
            deny all;
        }}
        proxy_pass http://{metrics.listen_address()};
        proxy_read_timeout 120s;
    }}

    location / {{
        return 404;
    }}
}}
"""
