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
- failure: a completion calls every worker; when a worker's node is gone the
  completion fails with HTTP 500 while /health keeps answering 200 (vllm #16259).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = "0.33.0"
# vLLM waits this long for its placement group (vllm/executor/ray_utils.py, PG_WAIT_TIMEOUT).
PLACEMENT_TIMEOUT_SECONDS = float(os.environ.get("VLLM_DOUBLE_PLACEMENT_TIMEOUT", "1800"))
WORKER_CALL_TIMEOUT_SECONDS = 20


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
    return parser


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
            )
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
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=i)
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


class Server:
    def __init__(self, args: argparse.Namespace, engine: Engine | None):
        self.engine = engine
        self.model_names = args.served_model_name or [args.model_tag]
        self.api_key = os.environ.get("VLLM_API_KEY") or args.api_key
        self.lock = threading.Lock()
        self.running = 0
        self.requests_total = 0
        self.generation_tokens = 0

    def metrics(self) -> str:
        name = self.model_names[0]
        return (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="{name}"}} {self.running}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="{name}"}} 0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="{name}"}} {min(self.running * 0.01, 1.0)}\n'
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{model_name="{name}"}} {self.generation_tokens}\n'
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{model_name="{name}"}} {self.requests_total}\n'
        )

    def complete(self, body: dict, chat: bool) -> tuple[int, dict]:
        if body.get("model") not in self.model_names:
            return 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.", "type": "NotFoundError", "code": 404}}
        tokens = max(1, int(body.get("max_tokens") or 16))
        with self.lock:
            self.running += 1
        try:
            if self.engine is not None:
                self.engine.step(tokens)
        except Exception as error:  # a lost worker: the engine cannot answer
            return 500, {"error": {"message": f"EngineCore encountered an issue: {type(error).__name__}", "type": "InternalServerError", "code": 500}}
        finally:
            with self.lock:
                self.running -= 1
        with self.lock:
            self.requests_total += 1
            self.generation_tokens += tokens
        text = " hello" * tokens
        created = int(time.time())
        usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
        if chat:
            return 200, {"id": f"chatcmpl-{created}", "object": "chat.completion", "created": created, "model": body["model"],
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
                         "usage": usage}
        return 200, {"id": f"cmpl-{created}", "object": "text_completion", "created": created, "model": body["model"],
                     "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}


def handler_for(server: Server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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
                return self.reply(200, {"object": "list", "data": [
                    {"id": name, "object": "model", "owned_by": "vllm"} for name in server.model_names]})
            if self.path == "/metrics":
                return self.reply(200, server.metrics(), "text/plain; version=0.0.4")
            if self.path == "/version":
                return self.reply(200, {"version": VERSION})
            return self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self.authorized():
                return self.reply(401, {"error": "Unauthorized"})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self.reply(404, {"detail": "Not Found"})
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError:
                return self.reply(400, {"error": {"message": "invalid JSON", "code": 400}})
            status, payload = server.complete(body, chat=self.path.endswith("chat/completions"))
            return self.reply(status, payload)

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
