"""The ClusterSpec: the stack's config, validated, as every component reads it."""

from __future__ import annotations

from dataclasses import dataclass, field

from components import stage_volume, topology
from components.catalog import InstanceType
from components.spec.gateway import UserCertificate
from components.spec.network_placement import ExistingNetwork
from components.spec.node_storage import NODE_IMAGE_BAKE, NODE_IMAGE_NONE
from components.spec.own_hosts import OwnHosts
from components.spec.secrets import Secret


@dataclass(frozen=True)
class ClusterSpec:
    stack: str
    model: str
    model_revision: str
    hf_endpoint: str | None
    instance: InstanceType
    nodes: int  # per gang
    replicas: int  # gangs: independent copies of the model, each `nodes` nodes
    tensor_parallel_size: int
    pipeline_parallel_size: int
    efa: bool
    api_allowed_cidrs: tuple[str, ...]
    admin_cidrs: tuple[str, ...]
    allow_public_api: bool
    hf_token: Secret | None
    api_key: Secret | None
    previous_api_key: Secret | None
    vllm_version: str
    ray_version: str
    node_lock: str  # the lock every node installs, from the project directory (nodeLock)
    max_model_len: int | None
    gpu_memory_utilization: float | None
    served_model_name: str | None
    vllm_extra_args: tuple[str, ...]
    availability_zone: str | None
    vpc_cidr: str
    existing_network: ExistingNetwork | None
    ami_id: str | None
    root_volume_gib: int
    capacity_reservation_id: str | None
    capacity_block: bool
    placement_group_name: str | None
    retain_model_cache: bool
    model_cache_file_system_id: str | None
    gateway_instance_type: str
    tls: UserCertificate | None
    api_read_timeout_seconds: int
    api_rate_limit_per_second: int
    # The routes the gateway forwards (apiRoutes, or the model's: components/api_routes.py).
    api_routes: tuple[str, ...]
    warnings: tuple[str, ...] = field(default=())
    # hosts: machines the user has; None for the EC2 instances the stack creates.
    own_hosts: OwnHosts | None = None
    # idleStopMinutes: a gang's GPU instances stop after this long without a request, and
    # the gateway starts them on the next (components/idle_stop.py); None: never.
    idle_stop_minutes: int | None = None
    # wakeGiveUpMinutes: how long a wake may take before the waker gives it up
    # (idle_stop.wake_give_up_seconds); None: derived from the expected wake.
    wake_give_up_minutes: int | None = None
    # nodeImage (NodeStorage.node_image): bake, none or an AMI id launched as is.
    node_image: str = NODE_IMAGE_BAKE
    # stageVolume, resolved: "ebs" (each node's stage on a gp3 stage volume that a stop
    # keeps, components/stage_volume.py) or "instance-store" (today's: the instance store
    # when the stage fits there, else the EFS cache).
    stage_volume: str = stage_volume.STAGE_VOLUME_INSTANCE_STORE
    # maxReplicas (issue 36): every gang the stack declares, the `replicas` that always
    # serve and the warm ones the gateway starts on the queue. load_spec sets it (replicas
    # when the key is unset); None only in a spec built by hand, which then means replicas
    # (declared_gangs).
    max_replicas: int | None = None
    # apiMaxRequestsInFlightPerKey and ...PerAddress: requests in flight at the gateway per
    # API key and per client address (components/gateway_nginx.py Limits); 0: no limit.
    api_max_requests_in_flight_per_key: int = 0
    api_max_requests_in_flight_per_address: int = 0

    @property
    def on_stage_volume(self) -> bool:
        return self.stage_volume == stage_volume.STAGE_VOLUME_EBS

    @property
    def bakes_node_image(self) -> bool:
        return self.node_image == NODE_IMAGE_BAKE

    @property
    def launches_with_software(self) -> bool:
        """The nodes launch from an image that holds the node software: baked by the stack
        or brought by the user (setup then only checks the environment)."""
        return self.node_image != NODE_IMAGE_NONE

    # fabricFloorGBps: the bus bandwidth a gang's all-reduce must reach before vLLM starts
    # (components/fabric.py); None: the instance type's floor.
    fabric_floor_gbps: float | None = None

    @property
    def instance_type(self) -> str:
        return self.instance.name

    @property
    def gpus_per_node(self) -> int:
        return self.instance.gpus

    @property
    def worker_count(self) -> int:
        return self.nodes - 1

    @property
    def declared_gangs(self) -> int:
        """Every gang the stack declares (maxReplicas): each has its instances, security,
        Ray token and commands, whether it always serves or is warm."""
        return self.max_replicas if self.max_replicas is not None else self.replicas

    @property
    def has_warm_gangs(self) -> bool:
        """More gangs than always serve: the waker starts and parks the rest."""
        return self.declared_gangs > self.replicas

    def gang_role(self, gang: int) -> str:
        """topology.ALWAYS_ON for the first `replicas` gangs, topology.WARM for the rest."""
        return topology.gang_role(gang, self.replicas)

    @property
    def total_nodes(self) -> int:
        """Every GPU node of the stack, all declared gangs (warm ones too: they are
        created, hold their volumes, and run when the load needs them)."""
        return self.nodes * self.declared_gangs

    @property
    def always_on_nodes(self) -> int:
        """The GPU nodes of the gangs that always serve (0 with replicas 0)."""
        return self.nodes * self.replicas

    @property
    def needs_placement_group(self) -> bool:
        # A cluster placement group keeps the nodes on one low-latency network
        # spine; EFA requires it, and multi-node NCCL over TCP benefits too.
        return self.nodes > 1 or self.efa

    @property
    def creates_placement_group(self) -> bool:
        """The stack makes its own group unless the config names an existing one or the
        nodes launch into reserved capacity.

        A reservation decides where its instances run. Instances in a Capacity Block "are
        automatically placed close together inside Amazon EC2 UltraClusters"
        (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html), and a
        reservation made in a cluster placement group serves only instances launched into
        that group (placementGroupName). A group of the stack's own is a placement constraint
        outside the reservation: AWS ParallelCluster's PlacementGroupCapacityReservationValidator
        (aws/aws-parallelcluster, cli/src/pcluster/validators/ec2_validators.py) warns that it
        causes insufficient capacity errors "even if the capacity reservation has remaining
        capacity"."""
        return self.needs_placement_group and self.placement_group_name is None and self.capacity_reservation_id is None
