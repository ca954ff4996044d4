"""Replay what the program declared on the local fleet, as Pulumi would run it.

`user_data_of` gives each instance's user data as EC2 hands it to cloud-init (the
fleet runs it at boot as cloud-init's final stage does). `replay` runs every
`remote.Command` the program declared, with its own connection (host, user, key,
jump host, dial limits), command line and stdin, each as soon as the commands it
depends on have finished, so independent ones run in parallel, and dials as
pulumi-command does (ssh_dial.py), so it can start while the hosts still
boot, as `pulumi up` does once EC2 reports an instance running. Nothing is
re-typed here: what the program declares is what runs.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import itertools
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from cli.mock_runtime import STDOUT_REFERENCE, ProgramRun, unsecret
from components import host_keys
from localhosts.ssh_dial import DialLog, Endpoint, Session

COMMAND = "command:remote:Command"


@dataclass(frozen=True)
class Step:
    name: str
    target: Endpoint
    proxy: Endpoint | None
    create: str
    stdin: str
    after: tuple[str, ...]

    @property
    def host(self) -> str:
        return self.target.host


@dataclass
class OutputClock:
    """When each line of a command's output arrived over its SSH session: a remote
    command silent for longer than a NAT's or firewall's idle timeout loses its
    connection (pulumi-command's client sends no keepalives). Fed by the session
    (ssh_dial.py `Session.run(on_output=...)`) with every chunk as it is read; a
    line counts when its end arrives, each stream (stdout, stderr) on its own."""

    opened: float | None = None  # when the command started (its session was open)
    closed: float | None = None
    lines: list[tuple[float, str, str]] = field(default_factory=list)  # (arrived, stream, text)
    _partial: dict[str, tuple[float, bytes]] = field(default_factory=dict)

    def receive(self, stream: str, chunk: bytes, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        if self.opened is None:
            self.opened = at
        _, pending = self._partial.pop(stream, (at, b""))
        *ended, rest = (pending + chunk).split(b"\n")
        self.lines += [(at, stream, line.decode(errors="replace")) for line in ended]
        if rest:
            self._partial[stream] = (at, rest)

    def close(self, at: float | None = None) -> None:
        """The command ended: an unfinished last line counts from its last bytes."""
        self.closed = time.monotonic() if at is None else at
        for stream, (arrived, rest) in self._partial.items():
            self.lines.append((arrived, stream, rest.decode(errors="replace")))
        self._partial.clear()
        self.lines.sort(key=lambda line: line[0])

    def longest_silence(self) -> tuple[float, str | None]:
        """(seconds, the line before it: None at the start) of the longest time without
        a line, from the start to the end of the command."""
        if self.opened is None:
            return 0.0, None  # no session was opened (the dial failed)
        marks = [(self.opened, None)] + [(at, text) for at, _, text in self.lines]
        marks.append((self.closed if self.closed is not None else marks[-1][0], None))
        gaps = [(later[0] - earlier[0], earlier[1]) for earlier, later in itertools.pairwise(marks)]
        return max(gaps, key=lambda gap: gap[0])


@dataclass
class Outcome:
    step: Step
    returncode: int
    stdout: str
    stderr: str
    started: float
    finished: float
    dial_log: DialLog
    output: OutputClock = field(default_factory=OutputClock)

    @property
    def seconds(self) -> float:
        return self.finished - self.started


class ReplayError(Exception):
    def __init__(self, outcome: Outcome):
        self.outcome = outcome
        super().__init__(
            f"{outcome.step.name} on {outcome.step.host} exited {outcome.returncode}:\n"
            f"--- stdout\n{outcome.stdout[-3000:]}\n--- stderr\n{outcome.stderr[-3000:]}"
        )


def steps_of(run: ProgramRun, only: set[str] | None = None) -> dict[str, Step]:
    """The declared commands (or `only` these) as steps, each knowing the commands it
    waits for. Pulumi waits for a resource's dependencies also when they do not change
    (their step still waits for theirs): a command that is not run here passes on its
    own dependencies, so a replay of only the changed commands keeps the program's order."""
    by_urn = {r.urn: r for r in run.resources}
    commands = [r for r in run.of_type(COMMAND) if only is None or r.name in only]
    names = {c.name for c in commands}

    def waits_for(resource, seen: set[str]) -> set[str]:
        found = set()
        for urn in resource.dependencies:
            if urn not in by_urn or urn in seen:
                continue
            seen.add(urn)
            dependency = by_urn[urn]
            if dependency.name in names:
                found.add(dependency.name)
            else:
                found |= waits_for(dependency, seen)
        return found

    steps = {}
    for command in commands:
        connection = unsecret(command.inputs["connection"])
        proxy = connection.get("proxy")
        steps[command.name] = Step(
            name=command.name,
            target=_endpoint(connection),
            proxy=_endpoint(proxy) if proxy else None,
            create=unsecret(command.inputs["create"]),
            stdin=unsecret(command.inputs.get("stdin")) or "",
            after=tuple(sorted(waits_for(command, set()))),
        )
    return steps


def _endpoint(connection: dict) -> Endpoint:
    """A connection's host, user, key and dial limits (pulumi-command's defaults
    where the program left them out)."""
    return Endpoint(
        host=connection["host"],
        user=connection.get("user", "root"),
        private_key=unsecret(connection["privateKey"]),
        dial_error_limit=int(connection.get("dialErrorLimit", 10)),
        per_dial_timeout=float(connection.get("perDialTimeout", 15)),
        host_key=unsecret(connection.get("hostKey")),
    )


def run_step(step: Step, timeout: float, running: set | None = None) -> Outcome:
    started = time.monotonic()
    session, clock = Session(), OutputClock()
    if running is not None:
        running.add(session)
    try:
        result = session.run(step.target, step.proxy, step.create, step.stdin, timeout, clock.receive)
    finally:
        if running is not None:
            running.discard(session)
    finished = time.monotonic()
    clock.close(at=finished)
    return Outcome(step, result.returncode, result.stdout, result.stderr, started, finished, result.dial_log, clock)


def replay(
    run: ProgramRun, *, only: set[str] | None = None, timeout: float = 1800, check: bool = True
) -> dict[str, Outcome]:
    """Run the declared commands (or `only` these) in dependency order, in parallel
    where the graph allows. Stops at the first failure (raising ReplayError when
    `check`), as `pulumi up` does, and ends the SSH sessions still running."""
    return _run_steps(steps_of(run, only), timeout, check)


def delete_steps(run: ProgramRun, only: set[str] | None = None) -> dict[str, Step]:
    """The declared commands that have a delete (or `only` these) as steps that run it,
    each after every such command that depends on it, as `pulumi destroy` deletes a
    resource after its dependents. pulumi-command runs the delete with the command's
    connection and stdin as its state holds them (remote/commandController.go Delete,
    commandOutputs.go run)."""
    steps = steps_of(run)
    deleting = {c.name: unsecret(c.inputs["delete"]) for c in run.of_type(COMMAND) if c.inputs.get("delete")}
    if only is not None:
        deleting = {name: line for name, line in deleting.items() if name in only}

    def dependents(name: str) -> set[str]:
        found, frontier = set(), {name}
        while frontier:
            frontier = {other for other, step in steps.items() if frontier & set(step.after)} - found
            found |= frontier
        return found & set(deleting)

    return {
        name: dataclasses.replace(steps[name], create=line, after=tuple(sorted(dependents(name))))
        for name, line in deleting.items()
    }


def destroy(
    run: ProgramRun, *, only: set[str] | None = None, timeout: float = 600, check: bool = True
) -> dict[str, Outcome]:
    """Run the delete of every declared command that has one (or of `only` these), as
    `pulumi destroy` (or a replacement's end) does: dependents first."""
    return _run_steps(delete_steps(run, only), timeout, check)


# Each command's last stdout by its name, as a stack's state keeps it: a replay of only
# the changed commands hands on the unchanged ones' outputs from here, as `pulumi up`
# hands them on from the state. (A process that brings up several fleets brings each up
# whole first, so a name's entry is its fleet's.)
_outputs_in_state: dict[str, str] = {}


def with_outputs(step: Step, outcomes: dict[str, Outcome]) -> Step:
    """The step with the stdout of every command its stdin uses in place of the
    reference the mock run left there (cli/mock_runtime.stdout_reference), as
    pulumi-command hands it on: the output less one trailing newline
    (remote/commandOutputs.go, strings.TrimSuffix(stdout, "\\n")). A command this
    replay did not run gives what it printed when it last ran."""

    def output_of(match) -> str:
        name = match.group(1)
        if name in outcomes:
            return outcomes[name].stdout.removesuffix("\n")
        if name in _outputs_in_state:
            return _outputs_in_state[name]
        raise RuntimeError(f"{step.name}'s stdin uses the output of {name}, which has never run: replay it first")

    return dataclasses.replace(step, stdin=STDOUT_REFERENCE.sub(output_of, step.stdin))


def _run_steps(steps: dict[str, Step], timeout: float, check: bool) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    sessions: set = set()
    with ThreadPoolExecutor(max_workers=max(1, len(steps))) as pool:
        pending = dict(steps)
        running: dict[Future, str] = {}
        try:
            while pending or running:
                for name, step in list(pending.items()):
                    if all(dep in outcomes for dep in step.after):
                        running[pool.submit(run_step, with_outputs(step, outcomes), timeout, sessions)] = name
                        del pending[name]
                if not running:
                    raise RuntimeError(f"commands wait for each other in a cycle: {sorted(pending)}")
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    name = running.pop(future)
                    outcome = future.result()
                    outcomes[name] = outcome
                    if outcome.returncode == 0:
                        _outputs_in_state[name] = outcome.stdout.removesuffix("\n")
                    if outcome.returncode != 0:
                        if check:
                            raise ReplayError(outcome)
                        return outcomes
        finally:
            for session in list(sessions):
                session.close()
    return outcomes


def user_data_parts_of(run: ProgramRun) -> dict[str, host_keys.UserDataParts]:
    """Instance resource name -> its user data unpacked and taken apart as cloud-init
    does: the script its final stage runs, and the host key its ssh module installs."""
    parts = {}
    for instance in run.of_type("aws:ec2/instance:Instance"):
        packed = unsecret(instance.inputs.get("userDataBase64"))
        if packed:
            parts[instance.name] = host_keys.user_data_parts(gzip.decompress(base64.b64decode(packed)).decode())
        elif instance.inputs.get("userData"):
            parts[instance.name] = host_keys.user_data_parts(unsecret(instance.inputs["userData"]))
    return parts


def user_data_of(run: ProgramRun) -> dict[str, str]:
    """Instance resource name -> the user data script cloud-init's final stage runs."""
    return {name: parts.script for name, parts in user_data_parts_of(run).items()}


def host_keys_of(run: ProgramRun) -> dict[str, str]:
    """Instance resource name -> the SSH host key (private, OpenSSH) its user data installs."""
    return {name: parts.host_private_key for name, parts in user_data_parts_of(run).items() if parts.host_private_key}
