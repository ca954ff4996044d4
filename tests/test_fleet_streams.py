"""tests/fleet_helpers.py streams_at_once, the fleet's many-streams client, against a local
TLS server: it holds every request in flight at once, reads each stream to its end, and
tells a complete stream from a cut one and a refusal (so the fleet's "0 reset" means what
it says)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fleet_helpers import streams_at_once

COUNT = 40


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class Server:
    """Answers each POST by its order: the first `refuse` with 429, the next `cut` with a
    stream closed before its end, the rest with a whole SSE stream in chunks. Counts how
    many requests it held at once before answering any."""

    def __init__(self, cert: Path, key: str, refuse: int = 0, cut: int = 0):
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.refuse, self.cut, self.seen, self.held_at_once = refuse, cut, 0, 0
        self.all_in = asyncio.Event()

    async def answer(self, reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        self.seen += 1
        order = self.seen
        if self.seen == COUNT:
            self.held_at_once = COUNT
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 30)
        if order <= self.refuse:
            body = b'{"error": {"code": "rate_limit_exceeded"}}'
            writer.write(
                b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in (b'data: {"choices": []}\n\n', b"data: [DONE]\n\n"):
                if order <= self.refuse + self.cut and event.startswith(b"data: [DONE]"):
                    break
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            else:
                writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()


@dataclass
class Cluster:
    endpoint: str
    cert: Path
    api_key: str = "key"
    served_model: str = "m"

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert))


def serve_and_load(certificate, **answers):
    cert, key = certificate
    server = Server(cert, key, **answers)
    ready, done = threading.Event(), {}

    def run():
        async def main():
            listener = await asyncio.start_server(server.answer, "127.0.0.1", 0, ssl=server.context, backlog=COUNT)
            done["port"] = listener.sockets[0].getsockname()[1]
            done["stop"] = asyncio.Event()
            ready.set()
            await done["stop"].wait()
            listener.close()

        done["loop"] = asyncio.new_event_loop()
        done["loop"].run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        return server, streams_at_once(Cluster(f"https://127.0.0.1:{done['port']}/v1", cert), COUNT, timeout=60)
    finally:
        done["loop"].call_soon_threadsafe(done["stop"].set)
        thread.join(10)


def test_every_request_is_in_flight_at_once_and_a_whole_stream_counts_as_served(certificate):
    server, seen = serve_and_load(certificate)
    assert seen.outcomes == {"200": COUNT} and seen.failed == 0
    assert seen.peak_in_flight == COUNT and server.held_at_once == COUNT


def test_a_cut_stream_and_a_refusal_are_failures_and_the_refusal_is_kept(certificate):
    _, seen = serve_and_load(certificate, refuse=3, cut=2)
    assert seen.outcomes == {"200": COUNT - 5, "HTTP 429": 3, "incomplete: the chunked body ended early": 2}
    assert seen.failed == 5
    headers, body = seen.refusals[0]
    assert headers["retry-after"] == "1" and "rate_limit_exceeded" in body
