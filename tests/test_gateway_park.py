"""`vllm-cluster-gateway drain --park [--last]`, the waker's drain of a warm gang it is about
to stop (issue 36, design decision 3), run by bash against a real nginx as
tests/test_gateway_pool.py runs the roll's drain: out of the pool only while another gang
serves (never the last, unless the waker says --last: nothing runs on it), no roll lease
(a parked gang is out for hours; a lease would stall every roll), never a gang a roll
restarts; a park waits for the gang's requests in flight, new ones going to the other gang
(the waker parks a warm gang with requests running, issue 48); and a parked gang's return
puts it back."""

from __future__ import annotations

import threading
import time

from tests.test_gateway_pool import assert_ran, eventually, gangs, gateway, needs_host_tools  # noqa: F401 - fixtures


def park(gateway, gang, *flags: str, wait: int = 2):  # noqa: F811 - the fixture's name
    return gateway.run("drain", "--gang", gang.name, "--timeout", "5", "--wait", str(wait), "--park", *flags)


def test_a_parked_gang_leaves_the_pool_without_the_roll_lease_and_a_roll_goes_on(gateway, gangs):  # noqa: F811
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    result = park(gateway, gang1)
    assert_ran(result)
    assert gateway.pool() == {
        "gang0": [gang0.address, "in-pool", "serving"],
        "gang1": [gang1.address, "drained", "serving"],
    }
    journal = gateway.journal.read_text()
    assert "drain gang1: out of the API pool (parked, no roll lease; gang0 still serving)" in journal
    assert gateway.complete() == (200, "gang0")
    assert_ran(gateway.give_back(gang1))
    assert gateway.pool()["gang1"] == [gang1.address, "in-pool", "serving"]


def test_a_park_lets_the_gangs_request_in_flight_finish_while_new_ones_go_to_the_other(gateway, gangs):  # noqa: F811
    """The waker parks a warm gang with requests running (the park after an up, the
    scale-in under a trickle, issue 48): a drain, not a cut. The gang leaves the pool at
    once, the command returns only once its request answered, and only then does the waker
    stop its instances."""
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang0))  # so the slow request can only reach gang1
    slow: list[tuple[int, str]] = []
    client = threading.Thread(target=lambda: slow.append(gateway.complete("slow")))
    client.start()
    eventually(lambda: gang1.in_flight == 1, what="the slow request reaching gang1")
    assert_ran(gateway.give_back(gang0))
    parking = gateway.start("drain", "--gang", gang1.name, "--timeout", "20", "--wait", "5", "--park")
    # Out of nginx's pool: the drain says so once nginx reloaded without it.
    out = "drain gang1: out of the API pool (parked"
    eventually(lambda: gateway.journal.exists() and out in gateway.journal.read_text(), what="gang1 out of the pool")
    assert [gateway.complete() for _ in range(3)] == [(200, gang0.name)] * 3
    time.sleep(1.5)
    assert parking.poll() is None, "the park ended while its gang still had a request in flight"
    gang1.release.set()
    client.join(timeout=10)
    assert slow == [(200, gang1.name)]
    _, stderr = parking.communicate(timeout=15)
    assert parking.returncode == 0, stderr


def test_a_park_never_takes_the_last_serving_gang_out_unless_the_waker_says_last(gateway, gangs):  # noqa: F811
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    gang0.healthy = False
    refused = park(gateway, gang1)
    assert refused.returncode == 1
    assert "parking gang1 would leave the API without a server" in refused.stderr
    assert gateway.pool()["gang1"] == [gang1.address, "in-pool", "serving"]
    # replicas 0: the waker saw no request running or waiting on the last serving gang.
    assert_ran(park(gateway, gang1, "--last"))
    assert gateway.pool()["gang1"] == [gang1.address, "drained", "serving"]


def test_a_gang_a_roll_restarts_is_not_parked(gateway, gangs):  # noqa: F811
    gang0, gang1 = gangs
    assert_ran(gateway.configure(gang0, gang1))
    assert_ran(gateway.drain(gang1))  # the roll: gang1 holds the lease
    refused = park(gateway, gang1)
    assert refused.returncode == 1 and "holds the roll lease" in refused.stderr
    assert gateway.pool()["gang1"][-1] == "roll-lease"


def test_last_is_for_a_park_only(gateway, gangs):  # noqa: F811
    gang0, _ = gangs
    assert_ran(gateway.configure(*gangs))
    result = gateway.run("drain", "--gang", gang0.name, "--timeout", "5", "--wait", "0", "--last")
    assert result.returncode == 1 and "--last is for --park only" in result.stderr
