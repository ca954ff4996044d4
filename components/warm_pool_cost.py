"""What a warm pool costs (maxReplicas above replicas, issue 36), the pure arithmetic the
planner prints: every declared gang on, only the `replicas` always-on gangs on, and a
day's mix for a duty cycle the user gives (`plan --busy-hours N`). Plain Python, no Pulumi.

A warm gang kept stopped is billed no instance usage, but its EBS volumes (root, and the
stage volume with stageVolume ebs) are billed stopped or not
(https://aws.amazon.com/ebs/pricing/, components/idle_stop.py EBS_GP3_GB_MONTH): every
declared gang pays its volumes all the time, only the instances follow the load.
A month is the planner's: sizing.HOURS_PER_MONTH hours.
"""

from __future__ import annotations

from dataclasses import dataclass

from components import sizing

HOURS_PER_DAY = 24
BUSY_HOURS_FLAG = "--busy-hours"


def parse_busy_hours(text: str) -> int:
    """`--busy-hours N`: the hours of a day at maxReplicas gangs, an integer from 0 to 24.
    Raises ValueError naming the flag, the value and the fix."""
    try:
        hours = int(text.strip())
    except ValueError:
        hours = None
    if hours is None or not 0 <= hours <= HOURS_PER_DAY:
        raise ValueError(
            f"{BUSY_HOURS_FLAG} {text!r}: takes the hours of a day the load keeps every gang (maxReplicas) on, a "
            f"whole number from 0 to {HOURS_PER_DAY}; the other hours are priced at replicas. Fix: "
            f"{BUSY_HOURS_FLAG} 8, for example (8 busy hours a day, 16 quiet)"
        )
    return hours


@dataclass(frozen=True)
class WarmPoolCost:
    """Hourly figures of a stack of max_replicas gangs of `nodes` nodes each, `replicas` of
    them always on."""

    replicas: int
    max_replicas: int
    nodes: int
    # One GPU node running, per hour (the catalog's on-demand price).
    node_hour: float
    # One GPU node's EBS volumes (root, and a stage volume if any), per hour, running or stopped.
    node_volumes_hour: float
    # What the stack pays whatever its gangs do: gateway, NAT gateway, EFS cache, the gateway's root volume.
    shared_hour: float

    @property
    def gang_hour(self) -> float:
        """One gang's GPU instances running."""
        return self.nodes * self.node_hour

    @property
    def gang_volumes_hour(self) -> float:
        """One gang's EBS volumes: what a stopped gang still pays."""
        return self.nodes * self.node_volumes_hour

    @property
    def volumes_hour(self) -> float:
        """Every declared gang's EBS volumes, running or stopped."""
        return self.max_replicas * self.gang_volumes_hour

    def hour(self, gangs_on: int) -> float:
        """An hour with `gangs_on` gangs running and the others stopped."""
        if not 0 <= gangs_on <= self.max_replicas:
            raise ValueError(f"gangs_on {gangs_on}: the stack has {self.max_replicas} gangs")
        return self.shared_hour + self.volumes_hour + gangs_on * self.gang_hour

    @property
    def all_on_hour(self) -> float:
        return self.hour(self.max_replicas)

    @property
    def replicas_hour(self) -> float:
        return self.hour(self.replicas)

    @staticmethod
    def month(hour: float) -> float:
        return hour * sizing.HOURS_PER_MONTH

    def mix_day(self, busy_hours: int) -> float:
        """A day of `busy_hours` at every gang and the rest at `replicas`."""
        if not 0 <= busy_hours <= HOURS_PER_DAY:
            raise ValueError(f"busy_hours {busy_hours}: a day has {HOURS_PER_DAY} hours")
        return busy_hours * self.all_on_hour + (HOURS_PER_DAY - busy_hours) * self.replicas_hour

    def mix_month(self, busy_hours: int) -> float:
        """That day's mix through a month of sizing.HOURS_PER_MONTH hours."""
        return self.mix_day(busy_hours) / HOURS_PER_DAY * sizing.HOURS_PER_MONTH
