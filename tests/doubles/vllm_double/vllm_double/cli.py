"""TEST DOUBLE of `vllm serve` for the local test fleet (no GPU, no model weights).

It imitates what the cluster depends on, not the model:
- the argument parser: the `vllm serve` flags vllm-cluster uses and other common
  ones; an unknown flag is an error (exit 2, "unrecognized arguments"), as in vLLM;
- the Ray executor: joins the running Ray cluster, reserves a placement group of
  TP x PP {"GPU": 1} bundles (PACK), fails like vLLM when it cannot be satisfied in
  time, puts one worker actor on each bundle and checks what vLLM needs to work:
  every TP group on one node, and VLLM_HOST_IP equal to the node's Ray IP on every
  worker (vLLM hangs otherwise, vllm #7815);
- the OpenAI-compatible server: /health, /v1/models, /v1/completions,
  /v1/chat/completions, /metrics, with VLLM_API_KEY guarding the /v1 routes only;
- a pooling model (`--runner pooling`, `--convert embed|classify`,
  `--pooler-config.task`; no `--task`, which vLLM refuses): the routes vLLM 0.33.0
  serves for its task and nothing else (vllm/entrypoints/pooling/factories.py
  register_pooling_api_routers): /pooling for every task; embed /v1/embeddings and
  the scoring routes; classify /classify (the double's classifier has two labels, so
  no scoring routes, as vLLM's enable_scoring_api); token_embed /v1/embeddings and the
  scoring routes; token_classify /pooling only. No /v1/completions: 404, as vLLM. A
  pooled request counts its prompt token, no generated one, and finishes with reason
  stop (vllm/v1/core/sched/scheduler.py: pooling stops as soon as there is output);
  vLLM records no max_tokens for it (vllm/v1/metrics/loggers.py);
- failure: a completion calls every worker; when a worker's node is gone the
  completion fails with HTTP 500 while /health keeps answering 200 (vllm #16259);
- metrics as vLLM's Prometheus logger exposes them (vllm/v1/metrics/loggers.py):
  gauges vllm:num_requests_running and vllm:num_requests_waiting, counters
  vllm:generation_tokens and vllm:prompt_tokens (exposed with the client library's
  _total and _created samples), vllm:request_success with one series per
  finished_reason (the double's requests all finish by length: they generate
  max_tokens), the histogram vllm:request_params_max_tokens (1-2-5 buckets up to
  --max-model-len, with _count and _sum), labels engine and model_name; the gauges
  are what the engine last reported, so they freeze when the engine hangs;
- uvicorn's keep-alive: an idle HTTP/1.1 connection is closed
  VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (an int, default 5, as vllm/envs.py reads it)
  after its last response; a proxy that sends a request on it at that moment gets
  the connection closed under it (nginx answers 502). TEST DOUBLE: each such close
  is logged ("keep-alive: closed the connection from IP"), which uvicorn does not do.

TEST DOUBLE control, for the fleet tests (never in vLLM): the engine's state is the
one word in the file named by VLLM_DOUBLE_CONTROL (default /run/vllm-double/mode),
read every step; no file (or an empty one) is a normal engine.
- saturated: a full batch of other clients' requests keeps running and producing
  tokens (counted in the gauges and counters); a new completion waits (counted as
  waiting) until the saturation ends, or is dropped when its client goes away, as
  vLLM aborts a request whose client disconnects;
- hung: the engine stops: no token, gauges frozen at their last values, completions
  wait forever (until the mode changes or their client goes away), /health stays 200.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "0.33.0"
# vLLM waits this long for its placement group (vllm/executor/ray_utils.py, PG_WAIT_TIMEOUT).
PLACEMENT_TIMEOUT_SECONDS = float(os.environ.get("VLLM_DOUBLE_PLACEMENT_TIMEOUT", "1800"))
WORKER_CALL_TIMEOUT_SECONDS = 20
# uvicorn's timeout_keep_alive in vLLM's API server (vllm/envs.py: int, default 5).
KEEP_ALIVE_SECONDS = int(os.environ.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "5"))
CONTROL = Path(os.environ.get("VLLM_DOUBLE_CONTROL", "/run/vllm-double/mode"))
MODES = ("normal", "saturated", "hung")
STEP_SECONDS = 0.25
# Requests of other clients in a saturated engine's batch (vLLM's --max-num-seqs is larger;
# what matters is that they run and produce a token each per step).
SATURATED_BATCH = 8
# vLLM's pooling tasks (vllm/tasks.py PoolingTask).
POOLING_TASKS = ("embed", "classify", "token_embed", "token_classify", "plugin")


def log(message: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [vllm-double] {message}", flush=True)


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    parser.add_argument("model_tag")
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    parser.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    parser.add_argument("--host")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key")
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--safetensors-load-strategy", choices=["lazy", "eager", "torchao"])
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--max-num-batched-tokens", type=int)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--dtype")
    parser.add_argument("--kv-cache-dtype")
    parser.add_argument("--quantization", "-q")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    parser.add_argument("--load-format")
    parser.add_argument("--download-dir")
    parser.add_argument("--tokenizer")
    parser.add_argument("--revision")
    # vllm/config/model.py RunnerOption and ConvertOption; vllm/config/pooler.py's task,
    # set through vLLM's dotted JSON arguments (vllm/utils/argparse_utils.py).
    parser.add_argument("--runner", choices=["auto", "generate", "pooling", "draft"], default="auto")
    parser.add_argument("--convert", choices=["auto", "none", "embed", "classify"], default="auto")
    parser.add_argument("--pooler-config.task", dest="pooler_task", choices=POOLING_TASKS)
    return parser


def pooling_task(args: argparse.Namespace) -> str | None:
    """The pooling task vLLM would serve, None for a generation model. The double's
    model is a generative one that a pooling runner serves as an embedding model, as
    vLLM's _get_default_convert_type does for a *ForCausalLM architecture."""
    if args.runner == "generate":
        return None
    if args.pooler_task:
        return args.pooler_task
    if args.convert in ("embed", "classify"):
        return args.convert
    return "embed" if args.runner == "pooling" else None


def pooling_routes(task: str) -> dict[str, tuple[str, ...]]:
    """The POST routes vLLM 0.33.0 serves for a pooling task, each with the body fields
    (any one group of them) its request takes (vllm/entrypoints/pooling/*/protocol.py)."""
    scoring = {
        route: (("text_1", "text_2"), ("queries", "documents"), ("data_1", "data_2"))
        for route in ("/score", "/v1/score")
    }
    scoring |= {route: (("query", "documents"),) for route in ("/rerank", "/v1/rerank", "/v2/rerank")}
    routes: dict[str, tuple[tuple[str, ...], ...]] = {"/pooling": (("input",),)}
    if task in ("embed", "token_embed"):
        routes |= {"/v1/embeddings": (("input",),)} | scoring
    if task == "classify":
        routes["/classify"] = (("input",),)
    return routes


class Engine:
    """The Ray side: a placement group, one worker actor per bundle."""

    def __init__(self, args: argparse.Namespace):
        import ray
        from ray.util.placement_group import placement_group, placement_group_table
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray = ray
        tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
        world = tp * pp
        if world > 1 and args.distributed_executor_backend != "ray":
            raise SystemExit("vllm-double: this stand-in only models the Ray executor for world size > 1")
        ray.init(address="auto", logging_level="WARNING", log_to_driver=False)
        bundles = [{"GPU": 1.0} for _ in range(world)]
        group = placement_group(bundles, strategy="PACK")
        log(f"waiting for a placement group of {world} GPU bundles (TP {tp} x PP {pp})")
        try:
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_SECONDS)
        except ray.exceptions.GetTimeoutError:
            resources = ray.cluster_resources()
            raise SystemExit(
                f"ValueError: Cannot provide a placement group of placement_group_specs={bundles} within "
                f"{PLACEMENT_TIMEOUT_SECONDS:g} seconds. See `ray status` to make sure the cluster has enough "
                f"resources. (cluster has {resources.get('GPU', 0):g} GPUs)"
            ) from None
        table = placement_group_table(group)
        bundle_nodes = [table["bundles_to_node_id"][i] for i in range(world)]
        for stage in range(pp):
            stage_nodes = set(bundle_nodes[stage * tp : (stage + 1) * tp])
            if len(stage_nodes) != 1:
                raise SystemExit(f"vllm-double: tensor-parallel group of stage {stage} spans {len(stage_nodes)} nodes")

        @ray.remote(num_gpus=1, num_cpus=0)  # as vLLM's Ray workers: a GPU, no CPU reservation
        class Worker:
            def __init__(self, rank: int):
                self.rank = rank
                self.ip = ray.util.get_node_ip_address()

            def describe(self) -> dict:
                return {
                    "rank": self.rank,
                    "ip": self.ip,
                    "vllm_host_ip": os.environ.get("VLLM_HOST_IP"),
                    "nccl_socket_ifname": os.environ.get("NCCL_SOCKET_IFNAME"),
                }

            def forward(self, tokens: int) -> int:
                return tokens

        self.workers = [
            Worker.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=i
                )
            ).remote(i)
            for i in range(world)
        ]
        described = ray.get([w.describe.remote() for w in self.workers], timeout=120)
        for worker in described:
            if worker["vllm_host_ip"] != worker["ip"]:
                raise SystemExit(
                    f"vllm-double: rank {worker['rank']} runs on {worker['ip']} but VLLM_HOST_IP is "
                    f"{worker['vllm_host_ip']!r}; vLLM would wait forever for its placement group (vllm #7815)"
                )
        self.placement = described
        log("workers: " + ", ".join(f"rank {w['rank']}@{w['ip']}" for w in described))

    def step(self, tokens: int) -> None:
        refs = [w.forward.remote(tokens) for w in self.workers]
        self.ray.get(refs, timeout=WORKER_CALL_TIMEOUT_SECONDS)


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's buckets of token counts (vllm/v1/metrics/loggers.py): 1, 2, 5, 10, 20, 50, ...
    up to max_value."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * 10**exponent > max_value:
                return buckets
            buckets.append(mantissa * 10**exponent)
        exponent += 1


def go_float(value: float) -> str:
    """A sample value as prometheus_client writes it (utils.floatToGoString)."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        return f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.") + f"e+0{dot - 1}"
    return text


def client_gone(connection: socket.socket) -> bool:
    """Whether the client closed its connection (vLLM aborts such a request)."""
    if not select.select([connection], [], [], 0)[0]:
        return False
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except OSError:  # reset by the peer: gone as well
        return True


class Server:
    def __init__(self, args: argparse.Namespace, engine: Engine | None):
        self.engine = engine
        self.model_names = args.served_model_name or [args.model_tag]
        self.task = pooling_task(args)
        self.pooling_routes = pooling_routes(self.task) if self.task else {}
        self.pooled_total = 0  # pooled requests finished (reason stop)
        self.api_key = os.environ.get("VLLM_API_KEY") or args.api_key
        self.changed = threading.Condition()
        self.running = 0  # clients' requests in the engine's batch
        self.waiting = 0
        self.others = 0  # other clients' requests in the batch (TEST DOUBLE control: saturated)
        self.requests_total = 0
        # vLLM's histogram of the max_tokens finished requests asked for: its buckets
        # (build_1_2_5_buckets(max_model_len)), a count per bucket, the sum.
        self.max_tokens_buckets = build_1_2_5_buckets(args.max_model_len or 2048)
        self.max_tokens_counts = [0] * len(self.max_tokens_buckets)
        self.max_tokens_sum = 0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.created = time.time()
        self.mode = "normal"
        self.frozen: dict[str, float] = {}  # the gauges when the engine hung
        threading.Thread(target=self.engine_loop, name="engine-loop", daemon=True).start()

    def gauges(self) -> dict[str, float]:
        """What the engine reports after a step; a hung engine reports nothing new."""
        if self.mode == "hung":
            return self.frozen
        running = self.running + self.others
        return {"running": running, "waiting": self.waiting, "kv_cache": min(running * 0.01, 1.0)}

    def read_mode(self) -> str:
        try:
            word = CONTROL.read_text().strip() or "normal"
        except FileNotFoundError:
            return "normal"
        if word not in MODES:
            log(f"TEST DOUBLE control: {CONTROL} says {word!r}, not one of {', '.join(MODES)}: ignored")
            return self.mode
        return word

    def engine_loop(self) -> None:
        """One engine step every STEP_SECONDS, following the TEST DOUBLE control."""
        failing = False
        while True:
            mode = self.read_mode()
            with self.changed:
                if mode != self.mode:
                    log(f"TEST DOUBLE control: engine {self.mode} -> {mode}")
                    if mode == "hung":
                        self.frozen = self.gauges()
                    self.mode = mode
                    if mode != "hung":  # a hung batch stays where it was
                        self.others = SATURATED_BATCH if mode == "saturated" else 0
                    self.changed.notify_all()
            if mode == "saturated":
                try:
                    if self.engine is not None:
                        self.engine.step(SATURATED_BATCH)  # through every worker, as a real step
                    with self.changed:
                        # A pooling batch makes no token but reads its prompts'.
                        if self.task:
                            self.prompt_tokens += self.others
                        else:
                            self.generation_tokens += self.others
                    failing = False
                except Exception as error:  # a lost worker: the batch makes no progress
                    if not failing:
                        log(f"engine step failed: {type(error).__name__}: the batch makes no progress")
                    failing = True
            time.sleep(STEP_SECONDS)

    def metrics(self) -> str:
        labels = f'{{engine="0",model_name="{self.model_names[0]}"}}'
        with self.changed:
            gauges = self.gauges()
            counters = {
                "prompt_tokens": self.prompt_tokens,
                "generation_tokens": self.generation_tokens,
            }
            finished = self.requests_total
            pooled = self.pooled_total
            histogram = list(zip(self.max_tokens_buckets, self.max_tokens_counts, strict=True))
            max_tokens_sum = self.max_tokens_sum
        lines = []
        for name, help_text, value in (
            ("num_requests_running", "Number of requests in model execution batches.", gauges["running"]),
            ("num_requests_waiting", "Number of requests waiting to be processed.", gauges["waiting"]),
            ("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", gauges["kv_cache"]),
        ):
            lines += [
                f"# HELP vllm:{name} {help_text}",
                f"# TYPE vllm:{name} gauge",
                f"vllm:{name}{labels} {go_float(value)}",
            ]
        for name, help_text in (
            ("prompt_tokens", "Number of prefill tokens processed."),
            ("generation_tokens", "Number of generation tokens processed."),
        ):
            # prometheus_client: a counter is written NAME_total, its creation time NAME_created.
            lines += [
                f"# HELP vllm:{name}_total {help_text}",
                f"# TYPE vllm:{name}_total counter",
                f"vllm:{name}_total{labels} {go_float(counters[name])}",
                f"# HELP vllm:{name}_created {help_text}",
                f"# TYPE vllm:{name}_created gauge",
                f"vllm:{name}_created{labels} {go_float(self.created)}",
            ]

        def labelled(name: str) -> str:
            """A series with a label of its own beside engine and model_name, in the order
            prometheus_client writes labels (sorted by name)."""
            pairs = {"engine": "0", "model_name": self.model_names[0], name: "{}"}
            # Braces doubled: the caller fills the label's value in with str.format.
            return "{{" + ",".join(f'{key}="{pairs[key]}"' for key in sorted(pairs)) + "}}"

        # One series per finish reason (vLLM's FinishReason), every one present from the start.
        reasons = labelled("finished_reason")
        help_text = "Count of successfully processed requests."
        lines += [f"# HELP vllm:request_success_total {help_text}", "# TYPE vllm:request_success_total counter"]
        for reason in ("stop", "length", "abort", "error", "repetition"):
            count = {"length": finished, "stop": pooled}.get(reason, 0)
            lines.append(f"vllm:request_success_total{reasons.format(reason)} {go_float(count)}")
        lines += [f"# HELP vllm:request_success_created {help_text}", "# TYPE vllm:request_success_created gauge"]
        for reason in ("stop", "length", "abort", "error", "repetition"):
            lines.append(f"vllm:request_success_created{reasons.format(reason)} {go_float(self.created)}")
        bucket = labelled("le")
        help_text = "Histogram of the max_tokens request parameter."
        lines += [
            f"# HELP vllm:request_params_max_tokens {help_text}",
            "# TYPE vllm:request_params_max_tokens histogram",
        ]
        cumulative = 0
        for bound, count in histogram:
            cumulative += count
            lines.append(
                f"vllm:request_params_max_tokens_bucket{bucket.format(go_float(bound))} {go_float(cumulative)}"
            )
        lines += [
            f"vllm:request_params_max_tokens_bucket{bucket.format('+Inf')} {go_float(finished)}",
            f"vllm:request_params_max_tokens_count{labels} {go_float(finished)}",
            f"vllm:request_params_max_tokens_sum{labels} {go_float(max_tokens_sum)}",
        ]
        return "\n".join(lines) + "\n"

    def unknown_model(self, body: dict) -> tuple[int, dict] | None:
        """vLLM's 404 for a model name it does not serve."""
        if body.get("model") in self.model_names:
            return None
        return 404, {
            "error": {
                "message": f"The model `{body.get('model')}` does not exist.",
                "type": "NotFoundError",
                "code": 404,
            }
        }

    def run_in_engine(self, tokens: int, gone) -> tuple[int, dict] | bool:
        """One request through the engine: waits while it is saturated or hung, then one
        step through every worker. True when it ran, False when its client went away
        first, (500, error) when a worker is lost."""
        with self.changed:
            self.waiting += 1
            try:
                # Saturated: no free slot in the batch; hung: the engine schedules nothing.
                while self.mode != "normal":
                    if gone():
                        log("request aborted: its client disconnected while it waited")
                        return False
                    self.changed.wait(0.5)
            finally:
                self.waiting -= 1
            self.running += 1
        try:
            if self.engine is not None:
                self.engine.step(tokens)
        except Exception as error:  # a lost worker: the engine cannot answer
            return 500, {
                "error": {
                    "message": f"EngineCore encountered an issue: {type(error).__name__}",
                    "type": "InternalServerError",
                    "code": 500,
                }
            }
        finally:
            with self.changed:
                self.running -= 1
        return True

    def pool(self, route: str, body: dict, gone) -> tuple[int, dict] | None:
        """(status, answer) of a pooling request; None when its client went away first."""
        unknown = self.unknown_model(body)
        if unknown:
            return unknown
        if not any(all(field in body for field in group) for group in self.pooling_routes[route]):
            wanted = " or ".join("+".join(group) for group in self.pooling_routes[route])
            return 400, {"error": {"message": f"{route} needs {wanted}", "type": "BadRequestError", "code": 400}}
        ran = self.run_in_engine(1, gone)
        if ran is not True:
            return ran or None
        with self.changed:
            self.pooled_total += 1
            self.prompt_tokens += 1
        created = int(time.time())
        return 200, {
            "id": f"pool-{created}",
            "object": "list",
            "created": created,
            "model": body["model"],
            "data": [{"index": 0, "object": "pooling", "data": [0.0]}],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }

    def complete(self, body: dict, chat: bool, gone) -> tuple[int, dict] | None:
        """(status, answer) of a completion; None when its client went away first."""
        unknown = self.unknown_model(body)
        if unknown:
            return unknown
        tokens = max(1, int(body.get("max_tokens") or 16))
        ran = self.run_in_engine(tokens, gone)
        if ran is not True:
            return ran or None
        with self.changed:
            self.requests_total += 1
            self.prompt_tokens += 1
            self.generation_tokens += tokens
            # The max_tokens the request asked for (vLLM's server sets one when the client
            # names none): its histogram bucket, the first bound at or above it.
            for index, bound in enumerate(self.max_tokens_buckets):
                if tokens <= bound:
                    self.max_tokens_counts[index] += 1
                    break
            self.max_tokens_sum += tokens
        text = " hello" * tokens
        created = int(time.time())
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        if chat:
            return 200, {
                "id": f"chatcmpl-{created}",
                "object": "chat.completion",
                "created": created,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                "usage": usage,
            }
        return 200, {
            "id": f"cmpl-{created}",
            "object": "text_completion",
            "created": created,
            "model": body["model"],
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": usage,
        }


def handler_for(server: Server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def handle(self):
            """http.server's request loop, with uvicorn's keep-alive: after a response
            the connection waits KEEP_ALIVE_SECONDS for the next request, then closes."""
            self.close_connection = True
            self.handle_one_request()
            while not self.close_connection and self.next_request_within(KEEP_ALIVE_SECONDS):
                self.handle_one_request()

        def next_request_within(self, seconds: int) -> bool:
            self.connection.settimeout(seconds)
            try:
                return self.rfile.peek(1) != b""  # b"": the client closed it
            except TimeoutError:
                # TEST DOUBLE: uvicorn closes silently; this line lets a test see who closed first.
                log(f"keep-alive: closed the connection from {self.client_address[0]}, idle for {seconds} s")
                return False
            except ConnectionError:  # reset by the client
                return False
            finally:
                self.connection.settimeout(None)

        def log_message(self, fmt, *args):  # one line per request, like uvicorn's access log
            log(f'{self.address_string()} "{self.command} {self.path}" {args[1] if len(args) > 1 else ""}')

        def reply(self, status: int, payload, content_type: str = "application/json") -> None:
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def authorized(self) -> bool:
            # vLLM's middleware guards only these prefixes; everything else stays open.
            if not server.api_key or not self.path.startswith(("/v1", "/v2", "/inference", "/cohere")):
                return True
            return self.headers.get("Authorization", "") == f"Bearer {server.api_key}"

        def do_GET(self):
            if not self.authorized():
                return self.reply(401, {"error": "Unauthorized"})
            if self.path == "/health":
                return self.reply(200, "", "text/plain")
            if self.path == "/v1/models":
                return self.reply(
                    200,
                    {
                        "object": "list",
                        "data": [{"id": name, "object": "model", "owned_by": "vllm"} for name in server.model_names],
                    },
                )
            if self.path == "/metrics":
                return self.reply(200, server.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            if self.path == "/version":
                return self.reply(200, {"version": VERSION})
            return self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self.authorized():
                return self.reply(401, {"error": "Unauthorized"})
            # A pooling model serves its task's routes and no generation one.
            served = server.pooling_routes or ("/v1/completions", "/v1/chat/completions")
            if self.path not in served:
                return self.reply(404, {"detail": "Not Found"})
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return self.reply(400, {"error": {"message": "invalid JSON", "code": 400}})

            def gone() -> bool:
                return client_gone(self.connection)

            if server.pooling_routes:
                answer = server.pool(self.path, body, gone)
            else:
                answer = server.complete(body, chat=self.path.endswith("chat/completions"), gone=gone)
            if answer is None:  # nobody to answer
                self.close_connection = True
                return None
            return self.reply(*answer)

    return Handler


def serve(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    model = Path(args.model_tag)
    if args.model_tag.startswith("/"):
        if not (model / "config.json").is_file():
            raise SystemExit(f"OSError: {model} does not appear to have a file named config.json")
    elif os.environ.get("HF_HUB_OFFLINE") == "1":
        raise SystemExit(f"OSError: {args.model_tag} is not a local folder and HF_HUB_OFFLINE=1")
    log(f"vLLM API server version {VERSION} (TEST DOUBLE) with model {args.model_tag}")
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    engine = Engine(args) if args.distributed_executor_backend == "ray" or world > 1 else None
    httpd = ThreadingHTTPServer((args.host or "0.0.0.0", args.port), handler_for(Server(args, engine)))
    log(f"Starting vLLM API server on http://{args.host or '0.0.0.0'}:{args.port}")
    httpd.serve_forever()
    return 0


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--version"]:
        print(VERSION)
        return 0
    if argv[:1] != ["serve"]:
        print("usage: vllm serve MODEL [options]  (TEST DOUBLE: only `serve` and `--version`)", file=sys.stderr)
        return 2
    return serve(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
