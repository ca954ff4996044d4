"""Idle stop and wake (issue 23), the pure pieces: the gateway role's policy, the waker's
configuration, how long a wake takes and what an idle hour costs. Plain Python, no Pulumi:
the program declares what these return, the planner prints them, and the fleet's stand-in
of EC2's API evaluates the very policy document the program declares.

How it works: every node of a gang powers itself off after idleStopMinutes without a
request (scripts/node/vllm-cluster-node idle-check); its launch template's shutdown
behaviour `stop` makes EC2 stop it, not terminate it, so its EBS root volume (the software,
the units) stays and no instance usage is billed while it is stopped
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html).
The gateway, which stays up, starts the gang's instances again on the next request
(scripts/gateway/vllm-cluster-waker) and answers 503 with Retry-After until it serves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping, Sequence

from components import aws_contract, config_keys, metrics, ports, sizing, stage_volume
from components.catalog import InstanceType
from components.scale_out import SCALE_IN_FRACTION, SCALE_OUT_HOLD_SECONDS, SCALE_OUT_WAITING_PER_GANG

SHUTDOWN_BEHAVIOR_DOC = (
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html"
)
# The Service Authorization Reference's table of EC2 actions: StartInstances and
# StopInstances take the instance resource type and the aws:ResourceTag/${TagKey} condition key; DescribeInstances
# lists no resource type, so it is granted on "*" only.
EC2_ACTIONS_DOC = "https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazonec2.html"
# IAM quotas: a role's inline policies at most 10,240 characters, whitespace not counted
# (components/aws_contract.py checks every declared RolePolicy against it).
IAM_QUOTAS_DOC = aws_contract.IAM_QUOTAS_SOURCE
INLINE_ROLE_POLICY_MAX_CHARS = aws_contract.INLINE_ROLE_POLICY_MAX_CHARS

# The tags the gateway's role may start instances by (components/tagging.py puts both on
# every resource of the stack, the GPU instances among them).
PROJECT_TAG = "vllm-cluster:project"
STACK_TAG = "vllm-cluster:stack"
# And a random id of the stack (components/compute.py) on every GPU instance: readable, as
# every tag is, but no other stack's instance carries it.
STACK_ID_TAG = "vllm-cluster:stack-id"

# What the waker tells a client of a stopped or waking gang: come back in 30 s. Short
# enough that a retrying client is answered within half a minute of the gang serving
# again, long enough that a wake of minutes costs a client a handful of requests.
RETRY_AFTER_SECONDS = 30

# A wake, term by term. A started instance boots the same image from the same EBS root:
# the launch-to-SSH figure of a cold start (sizing.INSTANCE_BOOT_SECONDS) stands for it.
# Ray's start on every node and its cluster check: an estimate (not measured on AWS): the
# units start Ray at boot, a node joins its head within seconds once both are up.
RAY_START_SECONDS = 30


def ec2_endpoint(region: str, dns_suffix: str) -> str:
    """EC2's regional endpoint: ec2.<region>.<the partition's DNS suffix>, such as
    https://ec2.us-east-1.amazonaws.com or https://ec2.cn-north-1.amazonaws.com.cn
    (https://docs.aws.amazon.com/general/latest/gr/ec2-service.html)."""
    return f"https://ec2.{region}.{dns_suffix}"


# To start an instance whose EBS volumes are encrypted under a customer managed KMS key,
# the caller needs these on the key ("Permissions for IAM users", Amazon EBS encryption
# requirements, https://docs.aws.amazon.com/ebs/latest/userguide/ebs-encryption-requirements.html):
# without them StartInstances is accepted and the instance falls back to stopped with
# Client.InternalError. AWS managed keys (aws/ebs) need none of the caller's.
EBS_ENCRYPTION_DOC = "https://docs.aws.amazon.com/ebs/latest/userguide/ebs-encryption-requirements.html"
EBS_KEY_ACTIONS = [
    "kms:CreateGrant",
    "kms:Decrypt",
    "kms:DescribeKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncrypt*",
]


def gateway_wake_policy(
    partition: str,
    region: str,
    account: str,
    project: str,
    stack: str,
    stack_id: str,
    ebs_customer_key_arn: str | None = None,
) -> dict:
    """The gateway role's one inline policy: start (and stop again) this stack's instances,
    and see which are stopped. StartInstances and StopInstances only on instances of this
    account and region that carry the stack's, the project's and the stack's random id's
    tag, and only in requests to this region (aws:RequestedRegion), so the gateway can start
    or stop no other machine (and terminate none); DescribeInstances
    supports no resource-level permission (EC2_ACTIONS_DOC), so it is granted on "*", in this
    region: it reads, and the waker filters by the same tags. The stack's VPC is no condition:
    EC2's instance resource has no ec2:Vpc key (EC2_ACTIONS_DOC, the instance resource type's
    condition keys), and a condition on a key the request lacks never holds.

    `ebs_customer_key_arn`: the account's default EBS key when it is a customer managed key
    (the stack's encrypted volumes use it): the role may use it, only through EC2 in this
    region (kms:ViaService), as starting those volumes needs (EBS_KEY_ACTIONS)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "StartThisStacksInstances",
                "Effect": "Allow",
                # StopInstances: a wake that never serves (EC2 started the head and refused
                # a worker, say) is given up and what it started stopped, not left billed.
                "Action": ["ec2:StartInstances", "ec2:StopInstances"],
                "Resource": f"arn:{partition}:ec2:{region}:{account}:instance/*",
                "Condition": {
                    "StringEquals": {
                        f"aws:ResourceTag/{STACK_TAG}": stack,
                        f"aws:ResourceTag/{PROJECT_TAG}": project,
                        f"aws:ResourceTag/{STACK_ID_TAG}": stack_id,
                        "aws:RequestedRegion": region,
                    }
                },
            },
            {
                "Sid": "SeeWhichInstancesAreStopped",
                "Effect": "Allow",
                "Action": ["ec2:DescribeInstances"],
                "Resource": "*",
                "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
            },
            *_ebs_key_statements(region, ebs_customer_key_arn),
        ],
    }


def _ebs_key_statements(region: str, ebs_customer_key_arn: str | None) -> list[dict]:
    """The wake policy's use of a customer managed default EBS key, through EC2 in `region`
    only; none without such a key (AWS managed keys need none of the caller's)."""
    if not ebs_customer_key_arn:
        return []
    return [
        {
            "Sid": "UseTheEbsKeyOfTheStacksVolumes",
            "Effect": "Allow",
            "Action": EBS_KEY_ACTIONS,
            "Resource": ebs_customer_key_arn,
            "Condition": {"StringEquals": {"kms:ViaService": f"ec2.{region}.amazonaws.com"}},
        }
    ]


def policy_text(policy: dict) -> str:
    """The policy as IAM receives it: compact, keys sorted (so its text is stable)."""
    return json.dumps(policy, sort_keys=True, separators=(",", ":"))


def policy_size_problems(text: str) -> list[str]:
    """What IAM would refuse of an inline role policy's size (IAM_QUOTAS_DOC): whitespace
    does not count."""
    size = aws_contract.inline_policy_size(text)
    if size > INLINE_ROLE_POLICY_MAX_CHARS:
        return [f"inline role policy of {size} characters; IAM takes {INLINE_ROLE_POLICY_MAX_CHARS} ({IAM_QUOTAS_DOC})"]
    return []


@dataclass(frozen=True)
class WakeTerm:
    name: str
    seconds: float
    assumes: str


def wake_terms(
    model_name: str, instance: InstanceType, nodes: int, pp: int | None = None, on_stage_volume: bool = False
) -> list[WakeTerm]:
    """From StartInstances to a gang that serves: the instances boot, Ray starts, each node
    copies its stage to the instance store again when it serves from there (a stop empties
    the instance store), the engine reads the weights and starts. What a cold `pulumi up`
    adds on top (efs-utils build, wheels, install, download) is on the EBS root volume or
    the shared cache already. With `on_stage_volume` (stageVolume ebs) each node's stage is on
    its gp3 stage volume, which a stop keeps: nothing is copied, the engine reads it there."""
    model = sizing.served_model_size(model_name, instance, nodes)
    loads = sizing.node_loads(model, instance, nodes, pp)
    slowest_copy = max(loads, key=lambda load: load.copy_seconds)
    slowest_load = max(loads, key=lambda load: load.load_seconds)
    if on_stage_volume:
        return _wake_terms_with_stage_volume(model, instance, nodes, pp)
    terms = [
        WakeTerm(
            "instance start",
            sizing.INSTANCE_BOOT_SECONDS,
            "start to SSH, taken as the launch-to-SSH figure of a cold start (the same image and EBS root)",
        ),
        WakeTerm("ray start", RAY_START_SECONDS, "estimate: Ray's units start at boot and the nodes join the head"),
    ]
    if slowest_copy.local:
        terms.append(
            WakeTerm(
                "stage copy",
                slowest_copy.copy_seconds,
                f"the instance store is empty after a stop: each node copies its stage (~"
                f"{slowest_copy.efs_bytes / sizing.GB:.1f} GB) from the EFS cache again at "
                f"{slowest_copy.efs_mib_s:.0f} MiB/s",
            )
        )
    terms += [
        WakeTerm(
            "model load",
            slowest_load.load_seconds,
            f"~{slowest_load.load_bytes / sizing.GB:.1f} GB per node from {slowest_load.load_from} "
            f"at {slowest_load.load_mib_s:.0f} MiB/s",
        ),
        WakeTerm(
            "engine start",
            sizing.engine_start_seconds(model.params_b),
            f"{sizing.ENGINE_START_BASE_SECONDS} s + {sizing.ENGINE_START_SECONDS_PER_B} s per billion parameters",
        ),
    ]
    return terms


def _start_terms() -> list[WakeTerm]:
    return [
        WakeTerm(
            "instance start",
            sizing.INSTANCE_BOOT_SECONDS,
            "start to SSH, taken as the launch-to-SSH figure of a cold start (the same image and EBS root)",
        ),
        WakeTerm("ray start", RAY_START_SECONDS, "estimate: Ray's units start at boot and the nodes join the head"),
    ]


def _wake_terms_with_stage_volume(
    model: sizing.ModelSize, instance: InstanceType, nodes: int, pp: int | None
) -> list[WakeTerm]:
    """The wake when each node's stage is on its gp3 stage volume (components/stage_volume.py):
    EBS keeps a volume's data across a stop, and a volume the instance wrote itself (not one
    restored from a snapshot) reads at its provisioned rate from the first block."""
    volume = stage_volume.stage_volume_for(model.name, instance, nodes, pp)
    largest = max(share.bytes for share in sizing.node_shares(model, nodes, pp or nodes))
    return [
        *_start_terms(),
        WakeTerm("stage copy", 0.0, f"none: each node's stage is on its {volume.size_gib} GiB gp3 stage volume, kept"),
        WakeTerm(
            "model load",
            largest / (volume.throughput_mib_s * sizing.MIB),
            f"~{largest / sizing.GB:.1f} GB per node from the stage volume at {volume.throughput_mib_s:,} MiB/s",
        ),
        WakeTerm(
            "engine start",
            sizing.engine_start_seconds(model.params_b),
            f"{sizing.ENGINE_START_BASE_SECONDS} s + {sizing.ENGINE_START_SECONDS_PER_B} s per billion parameters",
        ),
    ]


def expected_wake_seconds(
    model_name: str, instance: InstanceType, nodes: int, pp: int | None = None, on_stage_volume: bool = False
) -> int:
    return round(sum(term.seconds for term in wake_terms(model_name, instance, nodes, pp, on_stage_volume)))


def stage_volume_wakes_faster(model_name: str, instance: InstanceType, nodes: int, pp: int | None = None) -> bool:
    """stageVolume auto's test: whether a wake with the gp3 stage volume is shorter than one
    without (the instance store copied again, or the engine reading the EFS cache) by at
    least one Retry-After: clients waiting out a wake retry that often, so a shorter saving
    is mostly not seen, while the volumes are paid every hour (a small model's stage copies
    in seconds)."""
    saving = expected_wake_seconds(model_name, instance, nodes, pp, False) - expected_wake_seconds(
        model_name, instance, nodes, pp, True
    )
    return saving >= RETRY_AFTER_SECONDS


def short_idle_warning(
    minutes: int, wake_seconds: int, nodes: int, price_per_hour_usd: float, key: str = "idleStopMinutes"
) -> str | None:
    """A warning when the idle time is shorter than a wake of the stack (expected_wake_seconds):
    then every quiet spell longer than the idle time costs a stop and a wake, with clients
    answered 503 for the whole wake and the GPU nodes billed through it while they serve
    nobody. None when the idle time is at least the wake."""
    if minutes * 60 >= wake_seconds:
        return None
    wake_minutes = wake_seconds / 60
    billed = nodes * price_per_hour_usd * wake_seconds / 3600
    return (
        f"{key} is {minutes} min, shorter than a wake of this stack (about {wake_minutes:.1f} min: instance "
        f"start, Ray, stage copy, model load, engine start; `scripts/vllm-cluster plan` shows each term). Every "
        f"quiet spell longer than {minutes} min then costs a stop and a wake: the next request and every retry "
        f"get 503 for about {wake_minutes:.0f} min, and the {nodes} GPU node{'s' if nodes != 1 else ''} run "
        f"that long before serving (about ${billed:.2f} a wake). Fix: pulumi config set vllm-cluster:{key} "
        f"{max(minutes + 1, round(wake_minutes + 0.5))} or more"
    )


# How long a wake may take before the waker gives up, stops what it started and says why:
# three expected wakes (a cold page cache on EFS or a slow compile can double a term), and
# at least 15 minutes, for a shortage of capacity often clears within minutes and the
# waker's retries (30 s doubling to 5 min) get several tries in.
GIVE_UP_WAKES = 3
GIVE_UP_MIN_SECONDS = 900
# A node's own guard comes this much later than the waker's bound (vllm-idle-check): the
# waker, which sees the whole gang and says why, stops it first; the node powers itself off
# when the waker cannot (it is down, or the role may not stop instances).
NODE_GUARD_MARGIN_SECONDS = 600


def wake_give_up_seconds(expected_wake: int, minutes: int | None = None) -> int:
    """The waker's bound: wakeGiveUpMinutes when set (the user knows a wake of theirs the
    estimate does not), else three expected wakes, at least GIVE_UP_MIN_SECONDS."""
    if minutes:
        return minutes * 60
    return max(GIVE_UP_WAKES * expected_wake, GIVE_UP_MIN_SECONDS)


def never_served_grace_seconds(expected_wake: int, minutes: int | None = None) -> int:
    """How long a node stays up after a boot whose engine never answered (no request, no
    login, no stack command): the waker's bound and a margin."""
    return wake_give_up_seconds(expected_wake, minutes) + NODE_GUARD_MARGIN_SECONDS


def short_give_up_warning(minutes: int | None, wake_seconds: int) -> str | None:
    """A warning when wakeGiveUpMinutes is shorter than a wake of the stack: every wake the
    estimate is right about is then given up, and what it started stopped, before it
    serves. Not refused: the estimate is not a measurement of the user's account."""
    if not minutes or minutes * 60 >= wake_seconds:
        return None
    return (
        f"wakeGiveUpMinutes is {minutes} min, shorter than a wake of this stack (about {wake_seconds / 60:.1f} min; "
        "`scripts/vllm-cluster plan` shows each term): the gateway would give up a wake that is on its way and "
        "stop its GPU instances before they serve. Fix: pulumi config set vllm-cluster:wakeGiveUpMinutes "
        f"{-(-wake_seconds // 60)} or more, or pulumi config rm vllm-cluster:wakeGiveUpMinutes for three wakes"
    )


# --- warm gangs (maxReplicas, issue 36) ----------------------------------------------------
#
# When the gateway's waker starts one more warm gang (SCALE_OUT_WAITING_PER_GANG,
# SCALE_OUT_HOLD_SECONDS) and parks one again (SCALE_IN_FRACTION of one gang fewer's
# max_num_seqs, for idleStopMinutes), and why, in components/scale_out.py (metrics reads the
# scale-out threshold too).

# Prometheus on the gateway as the waker (on the same host) reaches it: loopback, under the
# route prefix every endpoint is served at.
PROMETHEUS_ON_GATEWAY = f"http://127.0.0.1:{ports.PROMETHEUS}{metrics.ROUTE_PREFIX}"


def scales(replicas: int | None, max_replicas: int | None) -> bool:
    """Whether the stack has warm gangs: more gangs than always serve."""
    return replicas is not None and max_replicas is not None and max_replicas > replicas


# A warm gang's nodes power themselves off after this many times idleStopMinutes: the
# gateway's waker parks the gang first (issue 36).
WARM_BACKSTOP_FACTOR = 2


def gang_idle_minutes(gang: int, replicas: int, max_replicas: int | None, idle_stop_minutes: int) -> int:
    """The idle time a gang's nodes are told (vllm-cluster-node idle-stop-config; 0: never
    stop). With warm gangs, the first `replicas` gangs always serve: they never stop for
    idleness. A warm gang (with replicas 0, every gang) is parked by the gateway's waker
    after idle_stop_minutes: drained from the API pool first, so that no request is cut,
    which its nodes cannot do (they power off under whatever nginx still sends them). Its
    nodes' own rule is a backstop only, for a gateway that is down: at twice the time, so
    that the waker, which sees the same idleness, always comes first."""
    if not scales(replicas, max_replicas):
        return idle_stop_minutes
    if gang < replicas:
        return 0
    return WARM_BACKSTOP_FACTOR * idle_stop_minutes


def waker_config(
    *,
    region: str,
    endpoint: str,
    stack: str,
    project: str,
    gangs: Mapping[str, Sequence[str]],
    idle_stop_minutes: int,
    expected_wake_seconds: int,
    give_up_minutes: int | None = None,
    retry_after_seconds: int = RETRY_AFTER_SECONDS,
    replicas: int | None = None,
    max_replicas: int | None = None,
    drain_timeout_seconds: int = config_keys.DEFAULT_API_READ_TIMEOUT_SECONDS,
    gang_max_num_seqs: int | None = None,
) -> str:
    """The JSON `vllm-cluster-gateway waker-config` reads on stdin: where EC2 is, which tags
    the stack's instances carry, each gang's instance ids (head first, gangs in order); with
    warm gangs (max_replicas above replicas) when to start one, when to park one (the
    requests one gang runs at once, gang_max_num_seqs: engine_capacity.spec_gang_max_num_seqs,
    which warm gangs need), where the queue and each gang's activity are read, and how long
    a park's drain waits for requests in flight (drain_timeout_seconds: the API's read
    timeout, apiReadTimeoutSeconds, the longest nginx lets a request run). The roles follow
    from replicas and gang order."""
    if scales(replicas, max_replicas) and gang_max_num_seqs is None:
        raise ValueError("waker_config: warm gangs (max_replicas above replicas) need gang_max_num_seqs")
    scaling = (
        {
            "replicas": replicas,
            "max_replicas": max_replicas,
            "scale_out_waiting_per_gang": SCALE_OUT_WAITING_PER_GANG,
            "scale_out_hold_seconds": SCALE_OUT_HOLD_SECONDS,
            "scale_in_fraction": SCALE_IN_FRACTION,
            "gang_max_num_seqs": gang_max_num_seqs,
            "prometheus": PROMETHEUS_ON_GATEWAY,
            "drain_timeout_seconds": drain_timeout_seconds,
        }
        if scales(replicas, max_replicas)
        else {}
    )
    return (
        json.dumps(
            {
                "region": region,
                "endpoint": endpoint,
                "stack": stack,
                "project": project,
                "gangs": {name: list(ids) for name, ids in gangs.items()},
                "idle_stop_minutes": idle_stop_minutes,
                "retry_after_seconds": retry_after_seconds,
                "expected_wake_seconds": expected_wake_seconds,
                "give_up_seconds": wake_give_up_seconds(expected_wake_seconds, give_up_minutes),
                **scaling,
            },
            indent=2,
        )
        + "\n"
    )


# EBS gp3 storage, the us-east-1 list price of https://aws.amazon.com/ebs/pricing/ (its gp3
# example uses $0.08 per GB-month; the page was not re-read when this was written): billed
# for the provisioned size whether the instance runs or is stopped.
EBS_GP3_GB_MONTH = 0.08


@dataclass(frozen=True)
class IdleHour:
    """What an hour without a request costs, with and without idleStopMinutes."""

    gpu_nodes: float
    gateway: float
    nat_gateway: float
    model_cache: float
    ebs: float  # the GPU nodes' and the gateway's root volumes
    # stageVolume ebs: the GPU nodes' gp3 stage volumes (components/stage_volume.py).
    stage_volumes: float = 0.0

    @property
    def without_stop(self) -> float:
        return self.gpu_nodes + self.gateway + self.nat_gateway + self.model_cache + self.ebs + self.stage_volumes

    @property
    def with_stop(self) -> float:
        # Stopped instances are not billed for usage; their volumes, the gateway, the NAT
        # gateway and EFS are.
        return self.gateway + self.nat_gateway + self.model_cache + self.ebs + self.stage_volumes


def idle_hour(
    instance: InstanceType,
    nodes: int,
    gateway_type: str,
    weights_gb: float,
    root_volume_gib: int,
    gateway_root_gib: int,
    stage_volume_hour_usd: float = 0.0,
) -> IdleHour:
    """At the planner's prices (sizing.cost) plus the EBS root volumes, which cost the same
    running or stopped. Not counted, with or without: data through the NAT gateway and public
    IPv4 addresses."""
    cost = sizing.cost(instance, nodes, gateway_type, weights_gb)
    volumes_gib = nodes * root_volume_gib + gateway_root_gib
    return IdleHour(
        gpu_nodes=cost.gpu_nodes,
        gateway=cost.gateway,
        nat_gateway=cost.nat_gateway,
        model_cache=cost.model_cache,
        ebs=volumes_gib * EBS_GP3_GB_MONTH / sizing.HOURS_PER_MONTH,
        stage_volumes=nodes * stage_volume_hour_usd,
    )
