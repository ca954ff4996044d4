"""How pulumi-command 1.2.1 reaches a host, imitated with paramiko, so the replay
fails where `pulumi up` would.

pulumi-command (provider/pkg/provider/remote/connection.go, `Connection.Dial`) has
three stages, each retried up to its own `dialErrorLimit` (a stage gives up when the
failed tries exceed the limit) with pulumi's retry delays (100 ms, x1.5, at most
5 s, sdk/go/common/util/retry):
  1. an SSH connection to the proxy (the gateway): a new connection per try;
  2. a TCP connection from the proxy to the host (`direct-tcpip`): a new one per try;
     this is what waits while the host boots and port 22 is closed;
  3. the SSH handshake and login to the host over that tunnelled connection,
     `ssh.NewClientConn(conn, ...)`, retried on the SAME connection, which the first
     failure closed: a host that accepts TCP but refuses the login (/run/nologin while
     booting) fails every remaining try at once.
Without a proxy, stage 1 alone runs against the host. `perDialTimeout` is the TCP
connect timeout of each try. With `hostKey` (the stack gives every connection one),
the client offers the server only that key's algorithm and accepts that key alone
(connection.go SSHConfig: ssh.FixedHostKey, HostKeyAlgorithms); another key fails
the try like any handshake error, and is retried as one.
Then the command runs in a session with stdin sent and stdout/stderr collected.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from dataclasses import dataclass, field

import paramiko

FIRST_DELAY, BACKOFF, MAX_DELAY = 0.1, 1.5, 5.0
SSH_PORT = 22
# What a failed try raises: network errors, SSH protocol and authentication errors.
DIAL_ERRORS = (OSError, EOFError, paramiko.SSHException)


@dataclass(frozen=True)
class Endpoint:
    host: str
    user: str
    private_key: str
    dial_error_limit: int = 10
    per_dial_timeout: float = 15
    # The pinned host key, authorized_keys form ("ssh-ed25519 AAAA..."); None: not checked.
    host_key: str | None = None


@dataclass
class DialLog:
    """Every failed try, as (stage, try number, error): what pulumi logs as
    '<stage> N/LIMIT failed: retrying'."""

    failures: list[tuple[str, int, str]] = field(default_factory=list)
    # Set from another thread to stop retrying (the replay stops at a failure).
    cancelled: bool = False

    def stages(self, stage: str) -> list[str]:
        return [error for name, _, error in self.failures if name == stage]


class DialError(Exception):
    pass


def _retry(stage: str, limit: int, log: DialLog, attempt):
    delay, tries = FIRST_DELAY, 0
    while True:
        if log.cancelled:
            raise DialError(f"{stage}: cancelled")
        try:
            return attempt()
        except DIAL_ERRORS as error:
            tries += 1
            log.failures.append((stage, tries, f"{type(error).__name__}: {error}"))
            if limit >= 0 and tries > limit:
                raise DialError(f"{stage}: after {tries - 1} failed attempts: {error}") from error
            time.sleep(delay)
            delay = min(delay * BACKOFF, MAX_DELAY)


def _key(text: str) -> paramiko.PKey:
    """The stack's keys are Ed25519 in OpenSSH format (components/credentials.py)."""
    return paramiko.Ed25519Key.from_private_key(io.StringIO(text))


class HostKeyMismatch(paramiko.SSHException):
    """The host answered with a key other than the pinned one (Go's FixedHostKey: "ssh:
    host key mismatch")."""


def _pinned(endpoint: Endpoint) -> paramiko.PKey | None:
    if endpoint.host_key is None:
        return None
    key_type, blob = endpoint.host_key.split()[:2]
    return paramiko.PKey.from_type_string(key_type, base64.b64decode(blob))


def _check_host_key(endpoint: Endpoint, transport: paramiko.Transport) -> None:
    pinned = _pinned(endpoint)
    if pinned is None:
        return
    presented = transport.get_remote_server_key()
    if presented.get_name() != pinned.get_name() or presented.asbytes() != pinned.asbytes():
        raise HostKeyMismatch(
            f"ssh: handshake failed: ssh: host key mismatch ({endpoint.host} presented "
            f"{presented.get_name()} {presented.get_base64()[:24]}...)"
        )


def _offer_only_pinned_type(endpoint: Endpoint, transport: paramiko.Transport) -> None:
    """HostKeyAlgorithms: the pinned key's type alone."""
    if endpoint.host_key is not None:
        transport.get_security_options().key_types = (endpoint.host_key.split()[0],)


def _client(endpoint: Endpoint) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    pinned = _pinned(endpoint)
    if pinned is None:
        # pulumi-command without host_key: whatever the host presents.
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    else:
        # Checked in the handshake, before the login, as FixedHostKey is.
        client.get_host_keys().add(endpoint.host, pinned.get_name(), pinned)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())

    def transport(sock, **options) -> paramiko.Transport:
        made = paramiko.Transport(sock, **options)
        _offer_only_pinned_type(endpoint, made)
        return made

    try:
        client.connect(
            endpoint.host,
            SSH_PORT,
            username=endpoint.user,
            pkey=_key(endpoint.private_key),
            timeout=endpoint.per_dial_timeout,
            banner_timeout=endpoint.per_dial_timeout,
            auth_timeout=endpoint.per_dial_timeout,
            allow_agent=False,
            look_for_keys=False,
            transport_factory=transport,
        )
    except BaseException:
        client.close()
        raise
    return client


def dial(target: Endpoint, proxy: Endpoint | None, log: DialLog) -> tuple[paramiko.Transport, list]:
    """A logged-in transport to `target` (through `proxy`), and what to close after."""
    if proxy is None:
        client = _retry("Dial", target.dial_error_limit, log, lambda: _client(target))
        return client.get_transport(), [client]
    proxy_client = _retry("Dial proxy", proxy.dial_error_limit, log, lambda: _client(proxy))
    opened = [proxy_client]
    try:
        channel = _retry(
            "Dial from proxy",
            target.dial_error_limit,
            log,
            lambda: proxy_client.get_transport().open_channel(
                "direct-tcpip", (target.host, SSH_PORT), ("127.0.0.1", 0), timeout=target.per_dial_timeout
            ),
        )
        opened.append(channel)

        def handshake() -> paramiko.Transport:
            # On the same tunnelled connection every time, as ssh.NewClientConn(conn) is.
            if channel.closed:
                raise EOFError("use of closed network connection")
            transport = paramiko.Transport(channel)
            try:
                _offer_only_pinned_type(target, transport)
                transport.start_client(timeout=target.per_dial_timeout)
                _check_host_key(target, transport)
                transport.auth_publickey(target.user, _key(target.private_key))
            except BaseException:
                transport.close()  # Go's NewClientConn closes the connection on failure
                channel.close()
                raise
            return transport

        transport = _retry("Dial", target.dial_error_limit, log, handshake)
        return transport, [transport, *reversed(opened)]
    except BaseException:
        for thing in reversed(opened):
            thing.close()
        raise


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    dial_log: DialLog


class Session:
    """One remote command, as pulumi-command runs it. `close()` ends it from another
    thread (the replay stops what still runs when a command fails)."""

    def __init__(self):
        self._closers: list = []
        self._lock = threading.Lock()
        self.closed = False
        self.log = DialLog()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.log.cancelled = True
            for thing in self._closers:
                thing.close()

    def run(
        self, target: Endpoint, proxy: Endpoint | None, command: str, stdin: str, timeout: float, on_output=None
    ) -> Result:
        """`on_output(stream, chunk)`, when given, gets every chunk of output as it is
        read ("stdout" or "stderr"), and an empty one when the command starts."""
        log = self.log
        try:
            transport, closers = dial(target, proxy, log)
        except DialError as error:
            return Result(255, "", f"dial: {error}", log)
        with self._lock:
            self._closers = closers
            if self.closed:
                self.close()
        try:
            return self._exec(transport, command, stdin, timeout, log, on_output)
        finally:
            for thing in closers:
                thing.close()

    @staticmethod
    def _exec(
        transport: paramiko.Transport, command: str, stdin: str, timeout: float, log: DialLog, on_output=None
    ) -> Result:
        heard = on_output or (lambda stream, chunk: None)
        channel = transport.open_session(timeout=30)
        channel.exec_command(command)
        heard("stdout", b"")

        def feed() -> None:
            try:
                channel.sendall(stdin.encode())
                channel.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                return  # the command ended (or was closed) before reading all of stdin

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        while True:
            busy = False
            if channel.recv_ready():
                chunk = channel.recv(65536)
                out.extend(chunk)
                heard("stdout", chunk)
                busy = True
            if channel.recv_stderr_ready():
                chunk = channel.recv_stderr(65536)
                err.extend(chunk)
                heard("stderr", chunk)
                busy = True
            if busy:
                continue
            if channel.exit_status_ready() or channel.closed:
                break
            if time.monotonic() > deadline:
                channel.close()
                return Result(
                    124,
                    out.decode(errors="replace"),
                    err.decode(errors="replace") + f"\ntimed out after {timeout:g} s",
                    log,
                )
            time.sleep(0.05)
        # What arrived between the last read and the exit status.
        while channel.recv_ready():
            chunk = channel.recv(65536)
            out.extend(chunk)
            heard("stdout", chunk)
        while channel.recv_stderr_ready():
            chunk = channel.recv_stderr(65536)
            err.extend(chunk)
            heard("stderr", chunk)
        code = channel.recv_exit_status() if channel.exit_status_ready() else 255
        return Result(code, out.decode(errors="replace"), err.decode(errors="replace"), log)
