"""Reserved capacity (capacityReservationId, capacityBlock) and the existing placement
group the nodes launch into (placementGroupName).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.config_keys import NAMESPACE
from components.spec.network_placement import NetworkPlacement
from components.spec.reader import Reader, injection_note, shell_meta_in

# An instance launches into a Capacity Reservation or a Capacity Block by the reservation's
# id, and only in the reservation's own Availability Zone.
RESERVATION_LAUNCH_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html"
CAPACITY_BLOCK_LAUNCH_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html"
# CreatePlacementGroup's GroupName: "Constraints: Up to 255 ASCII characters".
PLACEMENT_GROUP_NAME_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html"
PLACEMENT_GROUP_NAME_MAX = 255
_CAPACITY_RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")


@dataclass(frozen=True)
class Capacity:
    """Reserved capacity and the placement group the nodes launch into."""

    capacity_reservation_id: str | None
    capacity_block: bool
    placement_group_name: str | None


def _check_reservation_zone(
    reader: Reader, reservation_id: str | None, capacity_block: bool, network: NetworkPlacement
) -> None:
    """A reservation serves one zone. Without availabilityZone the program picks the
    first zone (alphabetically) that offers the type, which is the reservation's zone
    only by luck. With an existing network the private subnet decides the zone."""
    if reservation_id is None or network.availability_zone is not None or network.existing_network is not None:
        return
    if capacity_block:
        kind, doc = "Capacity Block", CAPACITY_BLOCK_LAUNCH_DOC
    else:
        kind, doc = "Capacity Reservation", RESERVATION_LAUNCH_DOC
    reader.fail(
        "capacityReservationId",
        f"is set but availabilityZone is not: the nodes would launch in the first zone of the region that "
        f"offers the instance type, and a {kind} serves only its own Availability Zone. "
        f"Fix: pulumi config set {NAMESPACE}:availabilityZone to the reservation's zone "
        f"(aws ec2 describe-capacity-reservations --capacity-reservation-ids {reservation_id} "
        f"--query 'CapacityReservations[0].AvailabilityZone'). See {doc}",
    )


def _check_placement_group_name(reader: Reader) -> str | None:
    """An existing placement group by name: EC2 takes up to 255 ASCII characters; this
    program also refuses whitespace and shell characters, which no group needs."""
    name = reader.string("placementGroupName")
    if name is None:
        return None
    if not name.isascii():
        reader.fail(
            "placementGroupName",
            "must be ASCII, as EC2 placement group names are. Fix: the group's name as "
            f"aws ec2 describe-placement-groups shows it (see {PLACEMENT_GROUP_NAME_DOC})",
        )
    elif len(name) > PLACEMENT_GROUP_NAME_MAX:
        reader.fail(
            "placementGroupName",
            f"is {len(name)} characters; EC2 placement group names have at most {PLACEMENT_GROUP_NAME_MAX}. "
            "Fix: the group's name as aws ec2 describe-placement-groups shows it "
            f"(see {PLACEMENT_GROUP_NAME_DOC})",
        )
    elif shell_meta_in(name):
        reader.fail(
            "placementGroupName",
            "may not hold whitespace or shell characters here"
            + injection_note(name)
            + ". Fix: rename the group or pick another",
        )
    else:
        return name
    return None


def check_capacity(reader: Reader, network: NetworkPlacement) -> Capacity:
    reservation_id = reader.string("capacityReservationId")
    if reservation_id is not None and not _CAPACITY_RESERVATION.match(reservation_id):
        reader.fail(
            "capacityReservationId",
            "is not a Capacity Reservation id such as cr-0123456789abcdef0. Fix: the id aws ec2 "
            f"describe-capacity-reservations shows (see {RESERVATION_LAUNCH_DOC})",
        )
    capacity_block = bool(reader.boolean("capacityBlock"))
    if capacity_block and reservation_id is None:
        reader.fail(
            "capacityBlock",
            "is true, but no capacityReservationId names the block: instances launch into a Capacity Block by "
            f"its reservation id. Fix: pulumi config set {NAMESPACE}:capacityReservationId cr-... "
            f"(see {CAPACITY_BLOCK_LAUNCH_DOC})",
        )
    _check_reservation_zone(reader, reservation_id, capacity_block, network)
    return Capacity(reservation_id, capacity_block, _check_placement_group_name(reader))
