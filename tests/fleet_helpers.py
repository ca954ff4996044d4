"""What the fleet's tests use beside the local hosts (localhosts/): a steady load of
completions through the gateway, and the fake hub's download counts, read with the test
double's own reader (tests/doubles/fake_hf_hub.py), which only tests import."""

from __future__ import annotations

import threading
import time
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
                    timeout=120,
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
