"""Replay what the program declared on the local fleet, as Pulumi would run it.

`user_data_of` gives each instance's user data as EC2 hands it to cloud-init;
`start_cloud_init` runs it on a host the way cloud-init does (as root, once, in the
background while sshd already answers). `replay` runs every `remote.Command` the
program declared, with its own connection (host, user, key, jump host), command
line and stdin, each as soon as the commands it depends on have finished, so
independent ones run in parallel. Nothing is re-typed here: what the program
declares is what runs.
"""

from __future__ import annotations

import base64
import gzip
import subprocess
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from cli.cluster import ssh_args
from pulumi_mocks import ProgramRun, unsecret

COMMAND = "command:remote:Command"


@dataclass(frozen=True)
class Step:
    name: str
    host: str
    user: str
    private_key: str
    proxy_host: str | None
    proxy_user: str | None
    create: str
    stdin: str
    after: tuple[str, ...]


@dataclass
class Outcome:
    step: Step
    returncode: int
    stdout: str
    stderr: str
    started: float
    finished: float

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
    """The declared commands as steps, each knowing the commands it waits for."""
    by_urn = {r.urn: r for r in run.resources}
    commands = [r for r in run.of_type(COMMAND) if only is None or r.name in only]
    names = {c.name for c in commands}
    steps = {}
    for command in commands:
        connection = unsecret(command.inputs["connection"])
        proxy = connection.get("proxy") or {}
        steps[command.name] = Step(
            name=command.name,
            host=connection["host"],
            user=connection["user"],
            private_key=unsecret(connection["privateKey"]),
            proxy_host=proxy.get("host"),
            proxy_user=proxy.get("user"),
            create=unsecret(command.inputs["create"]),
            stdin=unsecret(command.inputs.get("stdin")) or "",
            after=tuple(
                by_urn[urn].name for urn in command.dependencies if urn in by_urn and by_urn[urn].name in names
            ),
        )
    return steps


def run_step(step: Step, key_file: Path, timeout: float, running: set | None = None) -> Outcome:
    started = time.monotonic()
    # The step's own connection: its host and user, and its proxy (the gateway) if it has one.
    command = ssh_args(key_file, step.user, step.host, step.create, step.proxy_user, step.proxy_host)
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if running is not None:
        running.add(process)
    try:
        stdout, stderr = process.communicate(step.stdin, timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if running is not None:
            running.discard(process)
    return Outcome(step, process.returncode, stdout, stderr, started, time.monotonic())


def replay(run: ProgramRun, *, only: set[str] | None = None, timeout: float = 1800,
           check: bool = True) -> dict[str, Outcome]:
    """Run the declared commands (or `only` these) in dependency order, in parallel
    where the graph allows. Stops at the first failure (raising ReplayError when
    `check`), as `pulumi up` does, and ends the SSH sessions still running."""
    steps = steps_of(run, only)
    outcomes: dict[str, Outcome] = {}
    processes: set = set()
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(max_workers=max(1, len(steps))) as pool:
        keys: dict[str, Path] = {}

        def key_file(step: Step) -> Path:
            if step.private_key not in keys:
                path = Path(scratch) / f"key{len(keys)}"
                path.write_text(step.private_key)
                path.chmod(0o600)
                keys[step.private_key] = path
            return keys[step.private_key]

        pending = dict(steps)
        running: dict[Future, str] = {}
        try:
            while pending or running:
                for name, step in list(pending.items()):
                    if all(dep in outcomes for dep in step.after):
                        running[pool.submit(run_step, step, key_file(step), timeout, processes)] = name
                        del pending[name]
                if not running:
                    raise RuntimeError(f"commands wait for each other in a cycle: {sorted(pending)}")
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    name = running.pop(future)
                    outcome = future.result()
                    outcomes[name] = outcome
                    if outcome.returncode != 0:
                        if check:
                            raise ReplayError(outcome)
                        return outcomes
        finally:
            for process in list(processes):
                process.kill()
    return outcomes


def user_data_of(run: ProgramRun) -> dict[str, str]:
    """Instance resource name -> the user data script, unpacked as cloud-init does."""
    scripts = {}
    for instance in run.of_type("aws:ec2/instance:Instance"):
        packed = unsecret(instance.inputs.get("userDataBase64"))
        if packed:
            scripts[instance.name] = gzip.decompress(base64.b64decode(packed)).decode()
        elif instance.inputs.get("userData"):
            scripts[instance.name] = unsecret(instance.inputs["userData"])
    return scripts


# cloud-init's final stage runs user-data scripts as root from this directory, once.
CLOUD_INIT_SCRIPT = "/var/lib/cloud/instance/scripts/part-001"


def start_cloud_init(fleet, host, script: str) -> None:
    """Run `script` on `host` as cloud-init's final stage does: as root, in the
    background (sshd is already up), output in /var/log/cloud-init-output.log."""
    fleet.ssh(
        host,
        f"sudo install -D -m 0700 /dev/stdin {CLOUD_INIT_SCRIPT} && "
        f"sudo systemd-run --quiet --unit=cloud-final-user-data --remain-after-exit "
        f"-p StandardOutput=append:/var/log/cloud-init-output.log -p StandardError=append:/var/log/cloud-init-output.log "
        f"{CLOUD_INIT_SCRIPT}",
        input=script,
    )
