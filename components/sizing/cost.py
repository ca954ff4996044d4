"""What the cluster costs an hour at us-east-1's list prices: the GPU nodes, the
gateway, the NAT gateway and the model cache on EFS.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.catalog import InstanceType

# us-east-1 on-demand list prices (aws.amazon.com/vpc/pricing, /ec2/pricing,
# /efs/pricing), checked 2026-01-21; c7i.large (a gateway that is not burstable, for a
# stack whose full batch needs more than a t3's baseline: components/gateway_capacity.py)
# from the same EC2 on-demand page, not checked since: confirm before relying on it.
GATEWAY_PRICE_PER_HOUR = {
    "t3.small": 0.0208,
    "t3.micro": 0.0104,
    "t3.medium": 0.0416,
    "t4g.small": 0.0168,
    "c7i.large": 0.08925,
}
NAT_GATEWAY_PER_HOUR = 0.045
EFS_STANDARD_GB_MONTH = 0.30
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class Cost:
    gpu_nodes: float
    gateway: float
    nat_gateway: float
    model_cache: float

    @property
    def per_hour(self) -> float:
        return self.gpu_nodes + self.gateway + self.nat_gateway + self.model_cache

    @property
    def per_day(self) -> float:
        return self.per_hour * 24


def cost(instance: InstanceType, nodes: int, gateway_type: str, weights_gb: float) -> Cost:
    return Cost(
        gpu_nodes=instance.price_per_hour_usd * nodes,
        gateway=GATEWAY_PRICE_PER_HOUR.get(gateway_type, GATEWAY_PRICE_PER_HOUR["t3.small"]),
        nat_gateway=NAT_GATEWAY_PER_HOUR,
        model_cache=weights_gb * EFS_STANDARD_GB_MONTH / HOURS_PER_MONTH,
    )
