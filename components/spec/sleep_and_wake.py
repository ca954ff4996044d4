"""When gangs sleep and wake: idleStopMinutes (a gang stops after that long without a
request), wakeGiveUpMinutes (how long a wake may take) and maxReplicas (warm gangs the
gateway starts when requests queue). Each is refused with reserved capacity, which is paid
whether its instances run or not, and with own hosts, which nothing could start again.
"""

from __future__ import annotations

from components.config_keys import (
    MAX_IDLE_STOP_MINUTES,
    MAX_REPLICAS,
    MAX_WAKE_GIVE_UP_MINUTES,
    MIN_WAKE_GIVE_UP_MINUTES,
    NAMESPACE,
)
from components.spec.capacity import CAPACITY_BLOCK_LAUNCH_DOC, RESERVATION_LAUNCH_DOC
from components.spec.own_hosts import hosts_listed
from components.spec.reader import Reader, set_beyond_default


def check_idle_stop(reader: Reader) -> int | None:
    """idleStopMinutes: whole minutes, 1 to a week. Refused with reserved capacity, which is
    paid whether its instances run or not (stopping them saves nothing and may hand the slot
    to nobody), and with hosts, machines of the user's own that nothing could start again."""
    minutes = reader.integer("idleStopMinutes")
    if minutes is None:
        return None
    fix_range = (
        f"Fix: pulumi config set {NAMESPACE}:idleStopMinutes 30, or pulumi config rm {NAMESPACE}:idleStopMinutes"
    )
    if not 1 <= minutes <= MAX_IDLE_STOP_MINUTES:
        reader.fail(
            "idleStopMinutes",
            f"must be from 1 to {MAX_IDLE_STOP_MINUTES} minutes (a week): how long a gang waits without a request "
            f"before its GPU instances stop. {fix_range} to never stop",
        )
        return None
    refused = False
    if reader.string("capacityReservationId") is not None or set_beyond_default(reader, "capacityBlock"):
        key = "capacityReservationId" if reader.present("capacityReservationId") else "capacityBlock"
        doc = CAPACITY_BLOCK_LAUNCH_DOC if key == "capacityBlock" else RESERVATION_LAUNCH_DOC
        reader.fail(
            "idleStopMinutes",
            f"is {minutes} with {NAMESPACE}:{key} set: reserved capacity and Capacity Blocks are paid for whether "
            "their instances run or not, so stopping idle nodes saves nothing and leaves the paid slot unused. "
            f"Fix: pulumi config rm {NAMESPACE}:idleStopMinutes (or drop the reservation: pulumi config rm "
            f"{NAMESPACE}:{key}). See {doc}",
        )
        refused = True
    if hosts_listed(reader):
        reader.fail(
            "idleStopMinutes",
            f"is {minutes} with {NAMESPACE}:hosts set: those are machines of your own, and once one powers itself "
            "off nothing in the stack can start it again (the gateway wakes EC2 instances through EC2's "
            f"StartInstances). Fix: pulumi config rm {NAMESPACE}:idleStopMinutes",
        )
        refused = True
    return None if refused else minutes


def check_wake_give_up(reader: Reader, idle_stop_minutes: int | None) -> int | None:
    """wakeGiveUpMinutes: whole minutes, 5 to a day, and only with idleStopMinutes (without
    it nothing stops, so nothing wakes)."""
    minutes = reader.integer("wakeGiveUpMinutes")
    if not minutes:
        return None
    if not MIN_WAKE_GIVE_UP_MINUTES <= minutes <= MAX_WAKE_GIVE_UP_MINUTES:
        reader.fail(
            "wakeGiveUpMinutes",
            f"must be from {MIN_WAKE_GIVE_UP_MINUTES} to {MAX_WAKE_GIVE_UP_MINUTES} minutes: how long a wake may "
            "take before the gateway gives it up and stops what it started. Fix: pulumi config set "
            f"{NAMESPACE}:wakeGiveUpMinutes 30, or pulumi config rm {NAMESPACE}:wakeGiveUpMinutes for three "
            "expected wakes",
        )
        return None
    # An idleStopMinutes refused already is named there; one unset or 0 means never stop.
    refused_idle_stop = any(problem.key == "idleStopMinutes" for problem in reader.problems)
    if not idle_stop_minutes and not refused_idle_stop:
        reader.fail(
            "wakeGiveUpMinutes",
            f"is {minutes} without {NAMESPACE}:idleStopMinutes: nothing stops, so nothing wakes and the bound would "
            f"be ignored. Fix: pulumi config rm {NAMESPACE}:wakeGiveUpMinutes, or pulumi config set "
            f"{NAMESPACE}:idleStopMinutes 30",
        )
        return None
    return minutes


def check_max_replicas(reader: Reader, replicas: int | None, idle_stop_minutes: int | None) -> int | None:
    """maxReplicas (issue 36): every gang, `replicas` always serving and the rest warm
    (stopped until the queue needs them). Unset: replicas. Above replicas (or replicas 0)
    it needs idleStopMinutes (a warm gang sleeps again by the idle rule), and is refused
    with reserved capacity (paid whether its instances run or not: a stopped warm gang
    saves nothing) and with hosts (nothing could start them)."""
    most = reader.integer("maxReplicas")
    if replicas is None:
        return None  # replicas is refused already; nothing to hold maxReplicas to
    if not most:
        if replicas == 0:
            reader.fail(
                "replicas",
                f"is 0 (every gang may sleep) without {NAMESPACE}:maxReplicas, so the stack would have no gang at "
                f"all. Fix: pulumi config set {NAMESPACE}:maxReplicas 1 (one gang, woken by the first request; "
                f"with {NAMESPACE}:idleStopMinutes), or pulumi config set {NAMESPACE}:replicas 1",
            )
            return None
        return replicas
    if not _check_max_replicas_range(reader, most, replicas):
        return None
    if most == replicas:
        return most
    return most if _check_warm_gangs(reader, most, replicas, idle_stop_minutes) else None


def _check_max_replicas_range(reader: Reader, most: int, replicas: int) -> bool:
    """From 1 to MAX_REPLICAS, and at least replicas (the gangs that always serve are
    among the stack's gangs)."""
    if not 1 <= most <= MAX_REPLICAS:
        reader.fail(
            "maxReplicas",
            f"must be from 1 to {MAX_REPLICAS}: every gang of the stack, the `replicas` that always serve and the "
            f"warm ones the gateway starts when requests queue. Fix: pulumi config set {NAMESPACE}:maxReplicas "
            f"{max(replicas + 1, 2)}, or pulumi config rm {NAMESPACE}:maxReplicas for replicas ({replicas})",
        )
        return False
    if most < replicas:
        reader.fail(
            "maxReplicas",
            f"is {most}, below replicas ({replicas}): the gangs that always serve are among the stack's gangs. "
            f"Fix: pulumi config set {NAMESPACE}:maxReplicas {replicas} or more, or pulumi config rm "
            f"{NAMESPACE}:maxReplicas",
        )
        return False
    return True


def _check_warm_gangs(reader: Reader, most: int, replicas: int, idle_stop_minutes: int | None) -> bool:
    """Whether the stack may keep warm gangs (maxReplicas above replicas): not with what
    nothing can stop or start (_check_warm_gangs_can_sleep), only with idleStopMinutes, and
    each gang with a placement group of its own. The problem is named on replicas when it
    is 0, else on maxReplicas."""
    key = "replicas" if replicas == 0 else "maxReplicas"
    what = (
        f"replicas is 0 (every gang may sleep; maxReplicas {most})"
        if replicas == 0
        else f"maxReplicas is {most}, above replicas ({replicas})"
    )
    refused = not _check_warm_gangs_can_sleep(reader, key, what)
    refused_idle_stop = any(problem.key == "idleStopMinutes" for problem in reader.problems)
    if not idle_stop_minutes and not refused_idle_stop and not refused:
        reader.fail(
            key,
            f"{what} without {NAMESPACE}:idleStopMinutes: a warm gang goes back to sleep by the idle rule, and "
            f"without it a gang woken once would run until the stack is destroyed. Fix: pulumi config set "
            f"{NAMESPACE}:idleStopMinutes 30, or pulumi config rm {NAMESPACE}:maxReplicas",
            raw=reader.raw.get(key),
        )
        refused = True
    if reader.string("placementGroupName") is not None and most > 1:
        reader.fail(
            "maxReplicas",
            f"is {most}, but placementGroupName names one existing group, and each gang needs a cluster "
            f"placement group of its own. Fix: pulumi config rm {NAMESPACE}:placementGroupName (the stack then "
            "makes one group per gang)",
        )
        refused = True
    return not (refused or refused_idle_stop)


def _check_warm_gangs_can_sleep(reader: Reader, key: str, what: str) -> bool:
    """A warm gang saves only while it is stopped, and the gateway starts it through EC2:
    refused with reserved capacity (paid whether it runs or not) and with hosts (nothing
    can start them)."""
    allowed = True
    if reader.string("capacityReservationId") is not None or set_beyond_default(reader, "capacityBlock"):
        reservation = "capacityReservationId" if reader.present("capacityReservationId") else "capacityBlock"
        reader.fail(
            key,
            f"{what} with {NAMESPACE}:{reservation} set: reserved capacity is paid whether its instances run or "
            "not, so a warm gang kept stopped saves nothing. Fix: pulumi config rm "
            f"{NAMESPACE}:maxReplicas and set {NAMESPACE}:replicas to the gangs you want (or drop the "
            f"reservation: pulumi config rm {NAMESPACE}:{reservation})",
            raw=reader.raw.get(key),
        )
        allowed = False
    if hosts_listed(reader):
        reader.fail(
            key,
            f"{what} with {NAMESPACE}:hosts set: a warm gang is kept stopped and started by the gateway through "
            f"EC2, and nothing can start machines of your own. Fix: pulumi config rm {NAMESPACE}:maxReplicas",
            raw=reader.raw.get(key),
        )
        allowed = False
    return allowed
