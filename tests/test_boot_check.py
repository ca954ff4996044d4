"""The check of each local host's boot (localhosts/boot_check.py), without hosts: a unit
of the machinery's that fails is found as soon as it has failed and named with its
cause; the units the stack owns and the doubles that merely take their time do not
count; a failed host is booted again once, and a second failure is raised naming the
host and the unit. The fleet test (tests/test_fleet.py) holds every real host's boot
to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from localhosts import boot_check
from localhosts.boot_check import BOOTED, FAILED, GONE, UNFINISHED, Boot, BootCheck, FailedUnit
from localhosts.fleet import Fleet

# As a host's /proc/PID/status shows them (only the lines that matter here).
CONTAINER_INIT = "Name:\tsystemd\nPid:\t31583\nNSpid:\t31583\t1\n"
CONTAINER_PROCESS = "Name:\tsshd\nPid:\t31600\nNSpid:\t31600\t45\n"
THIS_MACHINES_INIT = "Name:\tsystemd\nPid:\t1\nNSpid:\t1\n"

# What a host's systemd 252 printed for the failure seen in issue 22 (status 219/CGROUP).
USER_SESSIONS_STATUS = """\
× systemd-user-sessions.service - Permit User Sessions
     Loaded: loaded (/lib/systemd/system/systemd-user-sessions.service; static)
     Active: failed (Result: exit-code) since Wed 2026-12-02 08:35:50 UTC; 1s ago
       Docs: man:systemd-user-sessions.service(8)
    Process: 37 ExecStart=/lib/systemd/systemd-user-sessions start (code=exited, status=219/CGROUP)
   Main PID: 37 (code=exited, status=219/CGROUP)
"""
USER_SESSIONS = "systemd-user-sessions.service"
USER_SESSIONS_JOURNAL = "\n".join(
    [
        f"Starting {USER_SESSIONS} - Permit User Sessions...",
        f"{USER_SESSIONS}: Failed to attach to cgroup /system.slice/{USER_SESSIONS}: No such file or directory",
        f"{USER_SESSIONS}: Failed at step CGROUP spawning /lib/systemd/systemd-user-sessions: "
        "No such file or directory",
        f"{USER_SESSIONS}: Main process exited, code=exited, status=219/CGROUP",
        f"{USER_SESSIONS}: Failed with result 'exit-code'.",
        f"Failed to start {USER_SESSIONS} - Permit User Sessions.",
    ]
)
# The image's units and the doubles of the boot, as the fleet gathers them.
MACHINERY = (
    frozenset({"systemd-user-sessions.service", "ssh.service", "getty@.service", "systemd-journald.service"})
    | boot_check.MACHINERY_DOUBLES
)


def test_the_hosts_init_is_pid_1_of_its_own_pid_namespace():
    assert boot_check.is_init(CONTAINER_INIT)
    assert not boot_check.is_init(CONTAINER_PROCESS)
    assert not boot_check.is_init(THIS_MACHINES_INIT)
    assert not boot_check.is_init("Name:\tkthreadd\n")
    statuses = {40: CONTAINER_PROCESS, 41: None, 42: CONTAINER_INIT}  # 41 exited meanwhile
    assert boot_check.init_pid([40, 41, 42], statuses.get) == 42
    assert boot_check.init_pid([40, 41], statuses.get) is None  # not started yet


def test_failed_units_are_the_first_word_of_systemctls_plain_listing():
    listing = (
        "cloud-final-double.service loaded failed failed TEST DOUBLE: cloud-init final stage (user data)\n"
        "getty@tty1.service         loaded failed failed Getty on tty1\n"
    )
    assert boot_check.failed_units(listing) == ["cloud-final-double.service", "getty@tty1.service"]
    assert boot_check.failed_units("") == []


def test_the_machinerys_units_are_the_images_and_the_boots_doubles_not_the_stacks(tmp_path):
    for folder, unit in (
        ("usr/lib/systemd/system", "systemd-user-sessions.service"),
        ("etc/systemd/system", "x.service"),
    ):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / unit).write_text("")
    assert boot_check.image_units(tmp_path) == {"systemd-user-sessions.service", "x.service"}

    def machinery(unit: str) -> bool:
        return boot_check.is_machinery_unit(unit, MACHINERY)

    assert machinery("systemd-user-sessions.service") and machinery("getty@tty1.service")
    assert machinery("slow-boot-double.service") and machinery("apt-lock-double.service")
    assert machinery("dlami-nvme.service")  # the stand-in of the image's own unit
    # The stack's user data (run by the cloud-init double) and the stack's own units.
    assert not any(map(machinery, ("cloud-final-double.service", "nginx.service", "vllm.service", "ray-head.service")))
    assert not machinery("ssh@.socket")  # another kind than the template's


def test_a_failure_is_told_by_its_state_its_exit_and_its_cause():
    status = boot_check.failure_status("systemd-user-sessions.service", USER_SESSIONS_STATUS, USER_SESSIONS_JOURNAL)
    assert status == (
        "Active: failed (Result: exit-code) since Wed 2026-12-02 08:35:50 UTC; 1s ago; "
        "Main PID: 37 (code=exited, status=219/CGROUP); "
        "Failed to attach to cgroup /system.slice/systemd-user-sessions.service: No such file or directory"
    )
    # A unit that says why itself, and one whose journal names no cause.
    said = "Starting x.service - X...\nno GPU found\nx.service: Failed with result 'exit-code'.\n"
    assert boot_check.failure_status("x.service", "", said) == "no GPU found"
    assert boot_check.failure_status("x.service", "", "Failed to start x.service - X.\n") == ""


class FakeHost:
    """A host's systemd as the check asks it: one (state, failed units) per poll; a
    state of None while the host has no systemd to ask."""

    def __init__(self, *polls: tuple[str | None, list[str]]):
        self.polls = list(polls)
        self.failed: list[str] = []
        self.commands: list[tuple[str, ...]] = []

    def __call__(self, *command: str) -> tuple[int, str] | None:
        self.commands.append(command)
        if command == ("systemctl", "is-system-running"):
            state, self.failed = self.polls.pop(0)
            return None if state is None else (0 if state == "running" else 1, f"{state}\n")
        if command[:2] == ("systemctl", "--failed"):
            return 0, "".join(f"{unit} loaded failed failed {unit}\n" for unit in self.failed)
        if command[:2] == ("systemctl", "status"):
            return 3, USER_SESSIONS_STATUS if command[-1] == "systemd-user-sessions.service" else ""
        if command[0] == "journalctl":
            return 0, USER_SESSIONS_JOURNAL if "systemd-user-sessions.service" in command else ""
        raise AssertionError(f"unexpected command {command}")


def watch(host: FakeHost, still_up=lambda: True, timeout: float = 100.0) -> Boot:
    ticks = iter(range(0, 10_000, 2))  # a clock that moves by the poll's 2 s per look
    return boot_check.watch_boot(
        host, MACHINERY, still_up, timeout=timeout, clock=lambda: next(ticks), sleep=lambda s: None
    )


def test_a_boot_is_over_once_systemd_says_so_and_the_slow_doubles_do_not_count():
    host = FakeHost(
        (None, []),  # nspawn started, no init yet
        ("offline", []),  # the init runs, its systemd does not answer yet
        ("starting", []),  # slow-boot-double holds /run/nologin: the boot goes on
        ("starting", ["cloud-final-double.service", "nginx.service"]),  # the stack's failures
        ("degraded", ["cloud-final-double.service", "nginx.service"]),
    )
    assert watch(host) == Boot(BOOTED)
    assert not host.polls


def test_a_failed_unit_of_the_machinery_is_found_at_once_with_its_cause():
    host = FakeHost(("starting", []), ("starting", ["systemd-user-sessions.service", "vllm.service"]))
    boot = watch(host)  # while the boot still goes on: nobody waits for its end
    assert boot.outcome == FAILED
    assert boot.failed == (
        FailedUnit(
            "systemd-user-sessions.service",
            boot_check.failure_status("systemd-user-sessions.service", USER_SESSIONS_STATUS, USER_SESSIONS_JOURNAL),
        ),
    )
    assert "status=219/CGROUP" in boot.units() and "Failed to attach to cgroup" in boot.units()
    # A double of the boot that fails counts like any unit of the image.
    assert watch(FakeHost(("starting", ["slow-boot-double.service"]))).outcome == FAILED


def test_a_boot_ends_its_watch_when_the_host_goes_or_takes_too_long():
    assert watch(FakeHost(("stopping", []))) == Boot(GONE)
    assert watch(FakeHost(), still_up=lambda: False) == Boot(GONE)
    assert watch(FakeHost(*[("starting", [])] * 10), timeout=10) == Boot(UNFINISHED)


FAILED_BOOT = Boot(FAILED, (FailedUnit("systemd-user-sessions.service", "status=219/CGROUP"),))


def check(*boots: Boot, stopping: bool = False) -> tuple[BootCheck, int, list[str]]:
    """check_host_boot over watches that end as `boots`: (the check, how often the host
    was booted again, what it said)."""
    watches, booted_again, said = iter(boots), [], []

    def boot_again() -> bool:
        booted_again.append(1)
        return not stopping

    result = boot_check.check_host_boot(BootCheck("node3"), lambda: next(watches), boot_again, said.append)
    return result, len(booted_again), said


def test_a_good_boot_is_passed_and_nothing_is_said():
    result, booted_again, said = check(Boot(BOOTED))
    assert result.passed and not result.booted_again and not result.broken
    assert booted_again == 0 and said == []


def test_a_failed_boot_is_said_at_once_and_the_host_booted_again_once():
    result, booted_again, said = check(FAILED_BOOT, Boot(BOOTED))
    assert booted_again == 1 and result.passed and result.booted_again and not result.broken
    assert said[0].startswith("node3's boot failed: systemd-user-sessions.service (status=219/CGROUP)")
    assert "the local hosts' fault" in said[0] and "not the stack's" in said[0] and "again, once" in said[0]
    assert said[1] == "node3 booted the second time."


def test_a_second_failure_is_not_booted_again_and_the_host_is_broken():
    result, booted_again, said = check(FAILED_BOOT, FAILED_BOOT, Boot(BOOTED))
    assert booted_again == 1 and result.broken and not result.passed
    assert result.boots == [FAILED_BOOT, FAILED_BOOT]
    assert "failed again: systemd-user-sessions.service" in said[1]


def test_a_stopping_fleet_boots_no_host_again():
    result, booted_again, _ = check(FAILED_BOOT, Boot(BOOTED), stopping=True)
    assert booted_again == 1 and result.boots == [FAILED_BOOT] and not result.passed


def test_the_fleet_boots_a_failed_host_again_once_and_its_start_raises_naming_host_and_unit(
    tmp_path, monkeypatch, capsys
):
    """Fleet's wiring, its hosts faked: the check's line on stderr, one power-off and one
    start, and HostBootError from raise_boot_failures."""
    fleet = Fleet(tmp_path, 1, authorized_key="", private_key="")
    node = fleet.nodes[0]
    done: list[str] = []
    monkeypatch.setattr(fleet, "_watch_boot", lambda host: FAILED_BOOT)
    monkeypatch.setattr(fleet, "power_off", lambda host: done.append(f"power_off {host.name}"))
    monkeypatch.setattr(fleet, "_start_host", lambda host: done.append(f"start {host.name}"))
    fleet.raise_boot_failures()  # nothing checked yet: nothing to raise
    fleet._check_boot(node)
    assert done == ["power_off node0", "start node0"]
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("localhosts: node0's boot failed: systemd-user-sessions.service (status=219/CGROUP)")
    assert err[1].startswith("localhosts: node0's boot failed again")
    failure = RuntimeError("vllm-login-head exited 1")
    with pytest.raises(boot_check.HostBootError) as raised:
        fleet.raise_boot_failures(cause=failure)
    assert raised.value.__cause__ is failure
    message = str(raised.value)
    assert message.startswith("node0 failed to boot twice: systemd-user-sessions.service (status=219/CGROUP)")
    assert "not the stack's" in message and str(Path(tmp_path) / "node0" / "console.log") in message
