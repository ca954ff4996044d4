"""nginx's CPU per server-sent event and memory per stream under TLS, on loopback (issue 48):
the figures components/gateway_capacity.py checks the gateway's instance type with.

    python3 bench/bench_gateway_sse.py [--streams 1000] [--events 200] [--interval 0.02]

Starts, each in a session of its own and ended by its PID on the way out: an upstream
that streams `--events` chunked SSE events (an OpenAI chat chunk each, `--interval` s
apart, as vLLM's tokens) to every request, and Debian's nginx (`nginx` on PATH) with one
worker, TLS 1.3 (a self-signed key made here), proxy_buffering off and an upstream
keep-alive pool, as the gateway's site proxies the API. Then `--streams` clients read at
once through TLS. Prints the worker's CPU time over the events the clients received (its
utime + stime from /proc, so other load on the machine does not count), and its resident
memory with every stream open over idle, per stream.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHUNK = b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" token"}}]}\n\n'


async def _serve(port: int, events: int, interval: float) -> None:
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(events):
            writer.write(b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK))
            await writer.drain()
            await asyncio.sleep(interval)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


async def _read_all(port: int, streams: int) -> int:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE

    async def one() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        writer.write(b"GET /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
        await writer.drain()
        count = 0
        while data := await reader.read(65536):
            count += data.count(b"data: ")
        writer.close()
        return count

    return sum(await asyncio.gather(*[one() for _ in range(streams)]))


def _nginx_conf(folder: Path, port: int, upstream: int) -> Path:
    conf = folder / "nginx.conf"
    temp = folder / "tmp"
    temp.mkdir()
    conf.write_text(f"""pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
worker_processes 1;
worker_rlimit_nofile 20000;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {temp}; proxy_temp_path {temp}; fastcgi_temp_path {temp};
    uwsgi_temp_path {temp}; scgi_temp_path {temp};
    upstream vllm {{ server 127.0.0.1:{upstream}; keepalive 256; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {folder}/cert.pem;
        ssl_certificate_key {folder}/key.pem;
        ssl_protocols TLSv1.3;
        location / {{
            proxy_pass http://vllm;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
""")
    return conf


def _worker_stat(master: int) -> tuple[int, float, int]:
    """The worker's PID, CPU seconds (utime + stime) and resident KiB."""
    worker = int(subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()[0])
    fields = Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{worker}/status").read_text().splitlines()
        if line.startswith("VmRSS")
    )
    return worker, cpu, rss


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.02)
    args = parser.parse_args()
    if args.streams > 8000:
        parser.error("--streams: at most 8,000 (the bench's worker_connections 8192 holds two a stream)")
    started: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gateway",
             "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
            check=True, capture_output=True,
        )  # fmt: skip
        port, upstream = _free_port(), _free_port()
        code = (
            f"import asyncio, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_gateway_sse as b; "
        )
        code += f"asyncio.run(b._serve({upstream}, {args.events}, {args.interval}))"
        try:
            started.append(subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
            conf = _nginx_conf(folder, port, upstream)
            nginx = subprocess.Popen(["nginx", "-c", str(conf), "-g", "daemon off;"], start_new_session=True)
            started.append(nginx)
            time.sleep(1)
            _, cpu_before, rss_idle = _worker_stat(nginx.pid)
            loop = asyncio.new_event_loop()
            task = loop.create_task(_read_all(port, args.streams))
            # Resident memory once every stream is open (a third of the way through).
            loop.run_until_complete(asyncio.sleep(args.events * args.interval / 3))
            _, _, rss_open = _worker_stat(nginx.pid)
            events = loop.run_until_complete(task)
            _, cpu_after, _ = _worker_stat(nginx.pid)
        finally:
            for process in reversed(started):
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=10)
    cpu = cpu_after - cpu_before
    per_stream = (rss_open - rss_idle) / args.streams
    print(
        f"{args.streams} TLS streams, {events:,} events: nginx worker {cpu:.2f} s CPU, {cpu / events * 1e6:.1f} us each"
    )
    print(f"resident {rss_idle:,} KiB idle, {rss_open:,} KiB with the streams open: {per_stream:.1f} KiB a stream")


if __name__ == "__main__":
    main()
