"""Whether a local host booted: none of the local machinery's own units failed.

A host whose own boot fails is the local machinery's fault, not the stack's, and must
say so at once. Seen (issue 22): on one of five hosts systemd-user-sessions failed at
boot ("Failed to attach to cgroup /system.slice/systemd-user-sessions.service: No such
file or directory", status 219/CGROUP, on a machine with cgroup v1), so /run/nologin
stayed and the stack's login wait ran toward its 20-minute limit with nothing said.

So localhosts/fleet.py watches every boot of every host from a thread of its own:
from outside the host (in its namespaces, by nsenter: a booting host refuses SSH
logins), until the host's systemd reports the boot over. As soon as one of the
machinery's units has failed, it says so on stderr, naming the host, the unit and its
status, and boots the host again, once; a second failure is kept for the cluster's start
to report (Fleet.raise_boot_failures). The watch stands in no one's way: the replay
starts while the hosts boot and meets their refused logins, as `pulumi up` does, and
the stack's own waits keep their limits.

Whose units count: the machinery's, those of the hosts' image (its root file system,
built by debootstrap) and the doubles the fleet adds to every boot (a slow boot that
holds /run/nologin, an apt run that holds the package lists lock: they take their time
on purpose and count only if they fail; the stand-in of the image's own unit that mounts
the instance store, under the image's name). Not cloud-final-double, which runs the stack's
user data, nor the units the stack installs (nginx, Ray, vLLM): their failures are the
stack's, which its own commands and checks report.

The logic is here, free of hosts, so the unit tests drive it with fakes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from components import image

# The doubles' units the fleet enables that are part of the host's own boot; the instance
# store's is the stand-in of the image's own unit, under its name.
MACHINERY_DOUBLES = frozenset({"slow-boot-double.service", "apt-lock-double.service", image.NVME_SETUP_UNIT})
# Where the image keeps its unit files.
IMAGE_UNIT_DIRS = ("lib/systemd/system", "usr/lib/systemd/system", "etc/systemd/system")
# What `systemctl is-system-running` prints while the boot goes on; "offline" (or
# nothing, with an error) before the host's systemd answers at all.
BOOTING = frozenset({"initializing", "starting"})
NOT_YET_UP = frozenset({"", "offline"})
# The host is being powered off (a test's fault, a reboot): this boot's watch is over.
STOPPING = "stopping"
# A first boot runs the user data (cloud-init's final stage is part of it, as on EC2):
# minutes on a node. The limit is the replay's own; the watch never shortens anything.
BOOT_TIMEOUT_SECONDS = 1800.0
POLL_SECONDS = 2.0

# How one boot ended, as watched.
BOOTED = "booted"  # the boot is over and none of the machinery's units failed
FAILED = "failed"  # one of the machinery's units failed (said as soon as seen)
GONE = "gone"  # the host was powered off, or the fleet stopped, before its boot ended
UNFINISHED = "unfinished"  # still booting after BOOT_TIMEOUT_SECONDS


@dataclass(frozen=True)
class FailedUnit:
    unit: str
    status: str  # what systemctl and the journal say of its failure, on one line


@dataclass(frozen=True)
class Boot:
    outcome: str
    failed: tuple[FailedUnit, ...] = ()

    def units(self) -> str:
        return "; ".join(f"{failed.unit} ({failed.status})" for failed in self.failed)


@dataclass
class BootCheck:
    """Every boot of one host the check watched: one, or two when the first failed."""

    host: str
    boots: list[Boot] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.boots) and self.boots[-1].outcome == BOOTED

    @property
    def booted_again(self) -> bool:
        return len(self.boots) > 1

    @property
    def broken(self) -> bool:
        """Its boot failed, and again after it was booted again."""
        return self.booted_again and self.boots[-1].outcome == FAILED


class HostBootError(RuntimeError):
    """Hosts that failed to boot twice: the local machinery's fault, not the stack's."""

    def __init__(self, checks: list[BootCheck], console_logs: dict[str, Path]):
        self.checks = checks
        super().__init__(
            "\n".join(
                f"{check.host} failed to boot twice: {check.boots[-1].units()}. This is the local hosts' "
                f"fault (localhosts/), not the stack's; the host's console: {console_logs[check.host]}"
                for check in checks
            )
        )


def is_init(proc_status: str) -> bool:
    """Whether /proc/PID/status is a container's init: PID 1 in its own PID namespace
    (the last of its `NSpid:` IDs is 1, and there is more than one: this machine's own
    init has only its 1)."""
    for line in proc_status.splitlines():
        if line.startswith("NSpid:"):
            ids = line.split()[1:]
            return len(ids) > 1 and ids[-1] == "1"
    return False


def init_pid(pids: Iterable[int], proc_status: Callable[[int], str | None]) -> int | None:
    """The host's init among `pids` (the processes of its network namespace), given the
    reader of /proc/PID/status (None for a process that has exited); None before it runs."""
    return next((pid for pid in pids if is_init(proc_status(pid) or "")), None)


def failed_units(listing: str) -> list[str]:
    """The units in `systemctl --failed --no-legend --plain`: the first word of each line."""
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def image_units(rootfs: Path) -> frozenset[str]:
    """The unit files the hosts' image has (a template as `name@.service`)."""
    return frozenset(
        unit.name for folder in IMAGE_UNIT_DIRS if (rootfs / folder).is_dir() for unit in (rootfs / folder).iterdir()
    )


def is_machinery_unit(unit: str, machinery: frozenset[str]) -> bool:
    """Whether `unit` is one of `machinery` or an instance of a template in it
    (getty@tty1.service of getty@.service)."""
    if unit in machinery:
        return True
    prefix, at, rest = unit.partition("@")
    return bool(at) and f"{prefix}@.{rest.rsplit('.', 1)[-1]}" in machinery


# What systemd logs of every unit that starts, stops or fails: it names no cause.
ROUTINE_JOURNAL = (
    "Starting ",
    "Started ",
    "Finished ",
    "Failed to start ",
    "Main process exited",
    "Failed with result",
    "Deactivated successfully",
    "Consumed ",
)


def failure_status(unit: str, systemctl_status: str, journal: str) -> str:
    """One line on why `unit` failed: its `Active:` line and its process's exit
    (`status=219/CGROUP`) from `systemctl status`, and the first line of its journal
    that names a cause (systemd's "Failed to attach to cgroup ...", or the unit's own
    words), skipping what systemd logs of every unit."""
    lines = [line.strip() for line in systemctl_status.splitlines()]
    active = next((line for line in lines if line.startswith("Active:")), "")
    exits = [line for line in lines if "status=" in line]
    said = [line.strip().removeprefix(f"{unit}: ") for line in journal.splitlines() if line.strip()]
    cause = next((line for line in said if not line.startswith(ROUTINE_JOURNAL)), "")
    return "; ".join(part for part in (active, exits[-1] if exits else "", cause) if part)


# (exit status, stdout) of a command run in the host; None while the host has no
# systemd to ask (not started yet, or gone).
HostCommand = Callable[..., "tuple[int, str] | None"]


def watch_boot(
    run: HostCommand,
    machinery: frozenset[str],
    still_up: Callable[[], bool],
    timeout: float = BOOT_TIMEOUT_SECONDS,
    poll: float = POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Boot:
    """Watch one boot until it is over: FAILED as soon as one of the machinery's units has
    failed, BOOTED when systemd reports the boot over without one, GONE when the host is
    no longer up (`still_up`), UNFINISHED after `timeout`."""
    deadline = clock() + timeout
    while still_up():
        answer = run("systemctl", "is-system-running")
        state = answer[1].strip() if answer is not None else ""
        if state == STOPPING:
            return Boot(GONE)
        if state not in NOT_YET_UP:
            listing = run("systemctl", "--failed", "--no-legend", "--plain")
            failed = failed_units(listing[1] if listing else "")
            failed = [unit for unit in failed if is_machinery_unit(unit, machinery)]
            if failed:
                return Boot(FAILED, tuple(FailedUnit(unit, unit_failure(run, unit)) for unit in failed))
            if state not in BOOTING:
                return Boot(BOOTED)
        if clock() > deadline:
            return Boot(UNFINISHED)
        sleep(poll)
    return Boot(GONE)


def unit_failure(run: HostCommand, unit: str) -> str:
    status = run("systemctl", "status", "--no-pager", "--full", "--lines=0", unit)
    journal = run("journalctl", "--boot", "--unit", unit, "--output=cat", "--no-pager")
    return failure_status(unit, status[1] if status else "", journal[1] if journal else "")


def check_host_boot(
    check: BootCheck,
    watch: Callable[[], Boot],
    boot_again: Callable[[], bool],
    say: Callable[[str], None],
) -> BootCheck:
    """Watch the host's boot; if one of the machinery's units failed, say so at once and
    boot the host again (`boot_again`, False when the fleet is stopping), once, and watch
    that boot too. Each boot watched is appended to `check` as it ends."""
    first = watch()
    check.boots.append(first)
    if first.outcome == UNFINISHED:
        say(f"{check.host} is still booting after {BOOT_TIMEOUT_SECONDS:.0f} s; no unit of the local hosts failed")
    if first.outcome != FAILED:
        return check
    say(
        f"{check.host}'s boot failed: {first.units()}. This is the local hosts' fault (localhosts/), "
        f"not the stack's; booting {check.host} again, once."
    )
    if not boot_again():
        return check
    second = watch()
    check.boots.append(second)
    if second.outcome == FAILED:
        say(
            f"{check.host}'s boot failed again: {second.units()}. Booted twice, it stays broken: "
            "the local hosts cannot boot on this machine."
        )
    elif second.outcome == BOOTED:
        say(f"{check.host} booted the second time.")
    return check
