"""What the fleet's tests use beside the local hosts (localhosts/): a steady load of
completions through the gateway, and the fake hub's download counts, read with the test
double's own reader (tests/doubles/fake_hf_hub.py), which only tests import."""

from __future__ import annotations

import asyncio
import json
import resource
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

from doubles.fake_hf_hub import download_counts, revision_commit

from localhosts.cluster import MODEL, FakeHub


def downloads_per_file(hub: FakeHub, revision: str | None = None) -> dict[str, int]:
    """How often each file was downloaded from `hub` from its first byte (a resumption
    is not a second download), of one revision's commit or of any."""
    commit = revision_commit(hub.root, MODEL, revision) if revision else None
    return download_counts(hub.log, MODEL, commit)


@dataclass
class Load:
    """A bounded, steady stream of completions through the gateway, as clients send them."""

    cluster: object
    clients: int = 2
    # Tokens each completion generates; above the default, every one of them (ignore_eos,
    # vLLM's sampling parameter), so a request holds its engine slot for as long as asked.
    max_tokens: int = 4
    # Seconds a client waits for its completion: a queued one waits for those before it.
    timeout: float = 120
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        while not self._stop.is_set():
            try:
                code, body = self.cluster.request(
                    "/v1/completions",
                    {
                        "model": self.cluster.served_model,
                        "prompt": "Hello",
                        "max_tokens": self.max_tokens,
                        **({"ignore_eos": True} if self.max_tokens > 4 else {}),
                    },
                    timeout=self.timeout,
                )
                error = None if code == 200 else f"HTTP {code}: {str(body)[:200]}"
            except OSError as failure:
                error = f"{type(failure).__name__}: {failure}"
            with self._lock:
                self.sent += 1
                if error:
                    self.failed.append(error)
            time.sleep(0.1)

    def __enter__(self) -> "Load":
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.clients)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)


def boot_log(cluster, host, unit: str) -> str:
    """`unit`'s journal of the host's current boot, with epoch timestamps."""
    return cluster.fleet.ssh(host, f"sudo journalctl -b -o short-unix --no-pager -u {unit}").stdout


def first_timestamp(log: str, text: str) -> float:
    return next(float(line.split()[0]) for line in log.splitlines() if text in line)


@dataclass
class Streams:
    """What `streams_at_once` saw: each request's outcome ("200", "HTTP 429", "reset: ...",
    "incomplete: ..."), how many were in flight at the peak, and the bodies of the refusals."""

    outcomes: Counter = field(default_factory=Counter)
    peak_in_flight: int = 0
    refusals: list[tuple[dict, str]] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(count for outcome, count in self.outcomes.items() if outcome != "200")


def streams_at_once(cluster, count: int, max_tokens: int = 4, key: str | None = None, timeout: float = 900) -> Streams:
    """`count` streamed completions through the gateway, all in flight at once, as many
    clients (or one client with a connection pool) would hold them: every connection is
    opened and its TLS handshake done first, then every request is sent together, so the
    gateway holds `count` client connections (and as many to the heads, or queued in
    them) at the same moment; each stream is read to its `data: [DONE]`. From this one
    address, as one client with many requests in flight."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A connection is a descriptor here too: a client holding many raises its own limit.
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 1024)), hard))
    # A loop of its own, not asyncio.run: that leaves the thread without a current loop, and
    # the Pulumi mock runtime of a later test in the same process asks for one.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_streams(cluster, count, max_tokens, key or cluster.api_key, timeout))
    finally:
        loop.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _streams(cluster, count: int, max_tokens: int, key: str, timeout: float) -> Streams:
    url = urllib.parse.urlsplit(cluster.endpoint)
    body = json.dumps(
        {"model": cluster.served_model, "prompt": "Hello", "max_tokens": max_tokens, "stream": True}
    ).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.hostname}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    seen = Streams()
    connected, go = asyncio.Semaphore(0), asyncio.Event()
    in_flight = 0

    async def one(context: ssl.SSLContext) -> None:
        nonlocal in_flight
        try:
            reader, writer = await asyncio.open_connection(url.hostname, url.port or 443, ssl=context)
        except OSError as failure:
            connected.release()
            seen.outcomes[f"connect: {type(failure).__name__}"] += 1
            return
        connected.release()
        await go.wait()
        in_flight += 1
        seen.peak_in_flight = max(seen.peak_in_flight, in_flight)
        try:
            writer.write(request)
            await writer.drain()
            answer = await reader.read()
            seen.outcomes[_stream_outcome(answer, seen)] += 1
        except (OSError, ssl.SSLError) as failure:
            seen.outcomes[f"reset: {type(failure).__name__}"] += 1
        finally:
            in_flight -= 1
            writer.close()

    context = cluster.tls()
    tasks = [asyncio.create_task(one(context)) for _ in range(count)]
    for _ in range(count):
        await asyncio.wait_for(connected.acquire(), timeout)
    go.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    return seen


def _stream_outcome(answer: bytes, seen: Streams) -> str:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = status_line.split()
    if len(parts) < 2:
        return "incomplete: no status line"
    if parts[1] != "200":
        headers = dict(
            line.decode(errors="replace").lower().split(": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line
        )
        if len(seen.refusals) < 5:
            seen.refusals.append((headers, body.decode(errors="replace")))
        return f"HTTP {parts[1]}"
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunked(body)
        if body is None:
            return "incomplete: the chunked body ended early"
    return "200" if b"data: [DONE]" in body else "incomplete: no [DONE]"


def _dechunked(body: bytes) -> bytes | None:
    """A chunked body's bytes (RFC 9112 section 7.1), or None when it ends before its last chunk."""
    out, rest = bytearray(), body
    while True:
        size_line, found, rest = rest.partition(b"\r\n")
        if not found:
            return None
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            return bytes(out)
        if len(rest) < size + 2:
            return None
        out += rest[:size]
        rest = rest[size + 2 :]
