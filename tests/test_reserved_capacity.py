"""Reserved capacity (capacityReservationId, capacityBlock) and the placement group the
nodes launch into, on what the launch templates really receive under the mock runtime.

A reservation decides where its instances run: a Capacity Block's instances are placed
close together inside an EC2 UltraCluster by EC2 itself, and a reservation made in a
cluster placement group serves only instances launched into that group. A placement
group of the stack's own is then a constraint outside the reservation, which AWS
ParallelCluster warns causes InsufficientInstanceCapacity although the reservation has
room (see components/spec/cluster_spec.py, ClusterSpec.creates_placement_group, for the sources)."""

import pytest
from pulumi_mocks import ec2_stack_names, run_stack

from components.spec import load_spec

PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
# Paid whether its nodes run or not: the spec refuses idleStopMinutes with it (dev sets it).
RESERVED = {"capacityReservationId": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b", "idleStopMinutes": None}
RESERVED_BLOCK = {**RESERVED, "capacityBlock": True}


@pytest.mark.parametrize("stack", ec2_stack_names())
@pytest.mark.parametrize("reservation", [RESERVED, RESERVED_BLOCK], ids=["reservation", "capacity-block"])
def test_a_reservation_gets_no_placement_group_of_the_stacks_own(stack, reservation):
    run = run_stack(stack, reservation)
    assert run.error is None, run.error
    assert run.of_type(PLACEMENT_GROUP) == []
    templates = run.of_type(TEMPLATE)
    assert templates and all("placement" not in template.inputs for template in templates)
    # The nodes still launch into the reservation.
    for template in templates:
        target = template.inputs["capacityReservationSpecification"]["capacityReservationTarget"]
        assert target["capacityReservationId"] == "cr-0123456789abcdef0"


def test_several_gangs_in_one_reservation_get_no_placement_groups_either():
    run = run_stack("prod", {"replicas": 2, **RESERVED})
    assert run.error is None, run.error
    assert run.of_type(PLACEMENT_GROUP) == []
    assert len(run.of_type(TEMPLATE)) == 2
    assert all("placement" not in template.inputs for template in run.of_type(TEMPLATE))


@pytest.mark.parametrize("reservation", [RESERVED, RESERVED_BLOCK], ids=["reservation", "capacity-block"])
def test_a_reservation_made_in_a_placement_group_launches_into_that_group(reservation):
    run = run_stack("h100", {**reservation, "placementGroupName": "reserved-pg"})
    assert run.error is None, run.error
    assert run.of_type(PLACEMENT_GROUP) == []
    assert [t.inputs["placement"] for t in run.of_type(TEMPLATE)] == [{"groupName": "reserved-pg"}]


def test_without_a_reservation_the_stack_still_makes_its_own_group():
    run = run_stack("prod")
    assert run.error is None, run.error
    [group] = run.of_type(PLACEMENT_GROUP)
    assert group.inputs["strategy"] == "cluster"


def test_the_spec_says_a_reservation_needs_no_group_of_the_stacks_own():
    base = {
        "model": "meta-llama/Llama-3.1-70B-Instruct",
        "instanceType": "p4d.24xlarge",
        "nodes": 2,
        "apiAllowedCidrs": ["203.0.113.0/24"],
        "adminCidrs": ["198.51.100.7/32"],
    }
    assert load_spec(base, stack="t").creates_placement_group
    reserved = load_spec({**base, **RESERVED}, stack="t")
    assert reserved.needs_placement_group and not reserved.creates_placement_group
    assert reserved.placement_group_name is None
