"""A test double of Prometheus's HTTP query API on the gateway, as the waker reads it
(scripts/gateway/vllm-cluster-waker query_waiting): GET <route prefix>/api/v1/query?query=...
answered with an instant vector in Prometheus's JSON envelope
(https://prometheus.io/docs/prometheus/latest/querying/api/#instant-queries: {"status":
"success", "data": {"resultType": "vector", "result": [{"metric": {...}, "value": [TIME,
"VALUE"]}]}}), or {"status": "error", "errorType", "error"} with HTTP 400 for a query it
does not know. It evaluates the waker's queries only, each from per-gang figures the test sets: `sum by
(gang) (vllm:num_requests_waiting)` from `waiting`, `sum by (gang)
(vllm:num_requests_running)` from `running`, `max by (gang) (vllm:kv_cache_usage_perc)` from
`kv`, and the client requests finished (vLLM's
finished requests less those that asked for at most one token) from `client_finished`;
`down` makes it answer 503, as Prometheus does while it replays its WAL and is not ready.
`extra` adds series as a node could make them appear (labels of its own choosing)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WAITING_QUERY = "sum by (gang) (vllm:num_requests_waiting)"
RUNNING_QUERY = "sum by (gang) (vllm:num_requests_running)"
KV_QUERY = "max by (gang) (vllm:kv_cache_usage_perc)"
CLIENT_FINISHED_QUERY = (
    'sum by (gang) (vllm:request_success_total) - sum by (gang) (vllm:request_params_max_tokens_bucket{le="1.0"})'
)


class PrometheusQueryDouble:
    def __init__(self, route_prefix: str = "/prometheus"):
        self.route_prefix = route_prefix
        # gang -> requests waiting, as vLLM's engines report them now.
        self.waiting: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.client_finished: dict[str, float] = {}
        # gang -> share of its KV cache in use, 0..1.
        self.kv: dict[str, float] = {}
        # query -> [(labels, value)]: series beyond the figures above.
        self.extra: dict[str, list[tuple[dict, float]]] = {}
        self.down = False
        self.queries: list[str] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, status: int, document: dict) -> None:
                body = json.dumps(document).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 - http.server's name
                url = urllib.parse.urlsplit(self.path)
                if url.path != f"{double.route_prefix}/api/v1/query":
                    self.answer(404, {"status": "error", "errorType": "not_found", "error": url.path})
                    return
                query = urllib.parse.parse_qs(url.query).get("query", [""])[0]
                double.queries.append(query)
                if double.down:
                    self.answer(503, {"status": "error", "errorType": "unavailable", "error": "not ready"})
                elif query not in double.figures():
                    self.answer(400, {"status": "error", "errorType": "bad_data", "error": f"unknown query {query}"})
                else:
                    now = time.time()
                    result = [
                        {"metric": {"gang": gang}, "value": [now, repr(float(value))]}
                        for gang, value in sorted(double.figures()[query].items())
                    ]
                    result += [
                        {"metric": labels, "value": [now, repr(float(value))]}
                        for labels, value in double.extra.get(query, [])
                    ]
                    self.answer(200, {"status": "success", "data": {"resultType": "vector", "result": result}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    def figures(self) -> dict[str, dict[str, float]]:
        return {
            WAITING_QUERY: self.waiting,
            RUNNING_QUERY: self.running,
            CLIENT_FINISHED_QUERY: self.client_finished,
            KV_QUERY: self.kv,
        }

    @property
    def url(self) -> str:
        """The base URL the waker is told (waker.json's prometheus), route prefix included."""
        return f"http://127.0.0.1:{self.port}{self.route_prefix}"

    def start(self) -> PrometheusQueryDouble:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
