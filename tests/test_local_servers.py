"""The servers the local hosts reach on the bridge (the package mirror, the stand-in Hub)
listen on a fixed unprivileged port that any local user may bind first (issue 33 point 5).
Before the hosts are pointed at one, the run checks that the socket listening there is
its own server's: a port taken by another process stops the run, naming its owner,
instead of the hosts installing packages or a model from it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from localhosts.fleet import serve_on_bridge


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def http_server(port: int, tmp_path) -> list[str]:
    return [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(tmp_path), str(port)]


def test_a_server_that_bound_its_port_is_served_on(tmp_path):
    port = free_port()
    server = serve_on_bridge(http_server(port, tmp_path), "127.0.0.1", port, tmp_path / "log", what="mirror")
    try:
        assert server.poll() is None
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_port_another_process_holds_stops_the_run_naming_it(tmp_path):
    port = free_port()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{port} .*another process.*uid \d+"):
            serve_on_bridge(http_server(port, tmp_path), "127.0.0.1", port, tmp_path / "log", what="mirror")
    finally:
        squatter.close()
    # The server that could not bind was not left running.
    left = subprocess.run(["pgrep", "-f", f"http.server --bind 127.0.0.1 --directory {tmp_path}"], capture_output=True)
    assert left.returncode == 1, left.stdout


def test_a_server_that_exits_before_it_listens_stops_the_run_with_its_log(tmp_path):
    port = free_port()
    command = [sys.executable, "-c", "import sys; print('no such root', file=sys.stderr); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="hub exited with 3.*no such root"):
        serve_on_bridge(command, "127.0.0.1", port, tmp_path / "log", what="hub")
