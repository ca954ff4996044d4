"""The fabric gate: the floor a gang's all-reduce must reach before vLLM starts, and how
it is measured. Plain Python: no Pulumi.

With EFA on, setup and preflight prove that aws-ofi-nccl's plugin file is there, not that
NCCL loads it or at what speed the gang's nodes exchange: a wrong NIC, a plugin NCCL
did not load, a security group that is not self-referencing or nodes outside the
placement group leave the service up at a fraction of its bandwidth, or hanging. So
before vLLM starts, every node of a gang of several runs one all-reduce over all the
gang's GPUs (scripts/node/fabric-check, from components/node_commands.py), and the head fails
`pulumi up` when its bus bandwidth is below the floor, naming both and the likely
causes.

Sources:
- [nccl-tests] NVIDIA's nccl-tests, doc/PERFORMANCE.md: an all-reduce's bus bandwidth is
  its algorithm bandwidth (size / time) times 2 (n - 1) / n, the figure that "reflects
  how optimally the hardware is used" and is comparable to the hardware's peak
  bandwidth whatever the number of ranks. https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md
- [ec2-network] AWS's published network bandwidth of each instance type (catalog.py
  `network_gbps`, each row naming the AWS page it was read from: the accelerated
  computing specifications): the peak a node's fabric offers, EFA's included.
  https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html
- [dlami-efa] AWS's "Use EFA on the DLAMI" runs nccl-tests' all_reduce_perf, which the
  Deep Learning AMI ships built against its CUDA (the tutorial runs it from
  /usr/local/cuda-xx.x/efa/test-cuda-xx.x/), with /opt/amazon/openmpi/bin/mpirun over
  passwordless SSH from a leader node to every other node and a hostfile.
  https://docs.aws.amazon.com/dlami/latest/devguide/tutorial-efa-using.html
  Not used here: it needs the nodes to log into each other (ours never do: nothing one
  node holds runs as root on another), and it links the image's NCCL, not the one in the
  locked environment that vLLM loads. The gate runs torch.distributed's all-reduce in
  the locked environment instead: the NCCL, plugin path and interface vLLM's workers get.
- [efa-sg] EFA needs a security group that admits all traffic to and from itself
  (security.py makes one per gang).
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html#efa-start-security
"""

from __future__ import annotations

from dataclasses import dataclass

from components.catalog import InstanceType

GB_PER_GBIT = 1 / 8

# The floor is this share of the node's published network bandwidth [ec2-network], as
# bus bandwidth [nccl-tests]. A healthy fabric's all-reduce between nodes reaches most of
# its line rate at large messages; a quarter leaves room for the gate's own message size
# (below nccl-tests' largest) and a busy moment, and is still far above what a fallback
# gives: NCCL over TCP sockets on the primary interface instead of EFA, or the wrong NIC.
# [unverified] No AWS or NVIDIA page read here publishes nccl-tests' busbw per instance
# type; the share is this project's margin. fabricFloorGBps sets a stack's own floor.
FLOOR_SHARE_OF_LINE_RATE = 0.25

# A stack of hosts with no catalog type (gpusPerNode) has no published bandwidth: its
# floor assumes the slowest network such hosts are expected on, gigabit Ethernet.
HOSTS_NETWORK_GBPS = 1

# Gloo (torch's CPU collectives, over TCP on GLOO_SOCKET_IFNAME): what a node whose lock
# holds a CPU build of torch (the local hosts: node_env.local_host) measures. Its floor is
# the hosts' network's: a quarter of gigabit Ethernet. Gloo reduces on the CPU, so a
# faster link does not raise what it reaches much (1.2 GB/s between two processes over
# loopback on this machine, fabric-check measure, 64 MiB).
GLOO_FLOOR_GBPS = HOSTS_NETWORK_GBPS * GB_PER_GBIT * FLOOR_SHARE_OF_LINE_RATE

# The measurement: one message per rank, all-reduced `iterations` times after `warmup`.
# NCCL: 256 MiB per GPU, where nccl-tests' all-reduce is near its peak on EFA instances,
# and small beside what vLLM leaves free of a GPU (gpuMemoryUtilization below 1). Gloo:
# 64 MiB, about two seconds a round at its floor.
NCCL_BYTES = 256 * 2**20
NCCL_ITERATIONS = 20
NCCL_WARMUP = 5
GLOO_BYTES = 64 * 2**20
GLOO_ITERATIONS = 5
GLOO_WARMUP = 2
# How long a node's ranks wait for every rank of the gang at the head's rendezvous: the
# gang's measure commands start together (after the same preflight), give or take the
# SSH dials of the gateway.
RENDEZVOUS_TIMEOUT_SECONDS = 600
# Process start, torch's import and the communicators' setup (NCCL's with EFA: its plugin
# and the EFA endpoints) before the first byte moves: an estimate for the planner.
SETUP_SECONDS = 30


@dataclass(frozen=True)
class Floor:
    gbps: float  # bus bandwidth, GB/s
    why: str  # where it comes from, for the gate's message


@dataclass(frozen=True)
class Measurement:
    """What each node's fabric-check measure is told (besides who it is)."""

    backend: str  # "nccl" or "gloo"
    ranks_per_node: int
    bytes: int
    iterations: int
    warmup: int

    def arguments(self) -> str:
        return (
            f"--backend {self.backend} --ranks-per-node {self.ranks_per_node} --bytes {self.bytes}"
            f" --iterations {self.iterations} --warmup {self.warmup} --timeout {RENDEZVOUS_TIMEOUT_SECONDS}"
        )


def cpu_torch(lock_packages: dict[str, str]) -> bool:
    """Whether a lock's torch (its version by package name) is a CPU build (2.13.0+cpu):
    then the node has no CUDA collectives, and the gate runs Gloo."""
    return lock_packages.get("torch", "").endswith("+cpu")


def measurement(instance: InstanceType, gloo: bool) -> Measurement:
    if gloo:
        return Measurement("gloo", 1, GLOO_BYTES, GLOO_ITERATIONS, GLOO_WARMUP)
    return Measurement("nccl", instance.gpus, NCCL_BYTES, NCCL_ITERATIONS, NCCL_WARMUP)


def floor(instance: InstanceType, gloo: bool, configured_gbps: float | None = None) -> Floor:
    """The bus bandwidth the gang's all-reduce must reach: the stack's fabricFloorGBps,
    else Gloo's, else a share of the instance type's published network bandwidth (a
    stack of hosts without a catalog type: of gigabit Ethernet)."""
    if configured_gbps is not None:
        return Floor(configured_gbps, "fabricFloorGBps, the stack's own")
    if gloo:
        return Floor(
            GLOO_FLOOR_GBPS,
            f"Gloo over the hosts' network: {FLOOR_SHARE_OF_LINE_RATE:g} of {HOSTS_NETWORK_GBPS} Gbps Ethernet",
        )
    if instance.network_gbps:
        return Floor(
            instance.network_gbps * GB_PER_GBIT * FLOOR_SHARE_OF_LINE_RATE,
            f"{instance.name}: {FLOOR_SHARE_OF_LINE_RATE:g} of its {instance.network_gbps} Gbps network, AWS's figure",
        )
    return Floor(
        HOSTS_NETWORK_GBPS * GB_PER_GBIT * FLOOR_SHARE_OF_LINE_RATE,
        f"hosts without an instance type: {FLOOR_SHARE_OF_LINE_RATE:g} of {HOSTS_NETWORK_GBPS} Gbps Ethernet",
    )


def gated(nodes: int) -> bool:
    """A gang of one node has no fabric between nodes to measure (its GPUs talk over
    NVLink or PCIe inside it): only gangs of several get the gate."""
    return nodes > 1


def line_rate_gbps(instance: InstanceType, gloo: bool = False) -> float:
    """The node's network in GB/s as published [ec2-network]; gigabit Ethernet for Gloo
    and for hosts without a catalog type."""
    if gloo or not instance.network_gbps:
        return HOSTS_NETWORK_GBPS * GB_PER_GBIT
    return instance.network_gbps * GB_PER_GBIT


def check_seconds(instance: InstanceType, nodes: int, gloo: bool = False) -> float:
    """The gate's time in a cold start, for the planner: its setup, then every round at
    the node's line rate (a healthy fabric's all-reduce reaches most of it; at the floor
    it takes four times as long)."""
    if not gated(nodes):
        return 0.0
    plan = measurement(instance, gloo)
    ranks = nodes * plan.ranks_per_node
    per_round = plan.bytes * 2 * (ranks - 1) / ranks / (line_rate_gbps(instance, gloo) * 1e9)
    return SETUP_SECONDS + (plan.warmup + plan.iterations) * per_round
