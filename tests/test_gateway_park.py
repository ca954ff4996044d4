"""`vllm-cluster-gateway drain --park [--last]`, the waker's drain of a warm gang it is about
to stop (issue 36, design decision 3), run by bash against a real nginx as
tests/test_gateway_pool.py runs the roll's drain: out of the pool only while another gang
serves (never the last, unless the waker says --last: nothing runs on it), no roll lease
(a parked gang is out for hours; a lease would stall every roll), never a gang a roll
restarts; and a parked gang's return puts it back."""

from __future__ import annotations

from tests.test_gateway_pool import assert_ran, gangs, gateway, needs_host_tools  # noqa: F401 - fixtures


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
