"""The stack's config, read once into a frozen, validated ClusterSpec.

Pure Python, no cloud calls: `load_spec` either returns a spec that every
component can trust, or raises SpecError listing every problem at once. Each
problem names the config key, the value it had and what to do, so a bad config
is fixed in one round and never reaches AWS.

The keys themselves, their types and defaults, are the contract in
components/config_keys.py (namespace `vllm-cluster`).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from components import (
    api_routes,
    aws_contract,
    catalog,
    host_keys,
    idle_stop,
    node_env,
    sizing,
    stage_volume,
    topology,
    versions,
)
from components.catalog import InstanceType

# CONFIG_KEYS, NAMESPACE and the gateway defaults are also imported from here by the
# program (__main__.py), cli/plan.py and components/bootstrap.py.
from components.config_keys import (  # noqa: F401
    CONFIG_KEYS,
    DEFAULT_API_RATE_LIMIT_PER_SECOND,
    DEFAULT_API_READ_TIMEOUT_SECONDS,
    DEFAULT_VPC_CIDR,
    KEYS_BY_NAME,
    MAX_API_RATE_LIMIT_PER_SECOND,
    MAX_API_READ_TIMEOUT_SECONDS,
    MAX_FABRIC_FLOOR_GBPS,
    MAX_IDLE_STOP_MINUTES,
    MAX_REPLICAS,
    MAX_WAKE_GIVE_UP_MINUTES,
    MIN_WAKE_GIVE_UP_MINUTES,
    NAMESPACE,
    ConfigKey,
    closest_key,
    unknown_keys,
)

# The Deep Learning Base AMI's own snapshot is about 100 GiB; the virtualenv with
# vLLM and its CUDA wheels adds about 10 GiB more.
MIN_ROOT_VOLUME_GIB = 150
MAX_ROOT_VOLUME_GIB = 16384
MIN_API_KEY_LENGTH = 32
# The gateway holds the keys in an nginx map whose bucket must fit "Bearer KEY"
# (bootstrap.API_KEYS_MAP_BUCKET_SIZE).
MAX_API_KEY_LENGTH = 200
# The login user with hosts when sshUser is not set: Ubuntu's, as on the AWS image.
SSH_USER_DEFAULT = "ubuntu"

# Flags the program sets itself from dedicated keys; letting vllmExtraArgs set them
# too would make two sources of truth (and --api-key would put the key on a command line).
MANAGED_VLLM_FLAGS = {
    "--tensor-parallel-size": "tensorParallelSize",
    "-tp": "tensorParallelSize",
    "--pipeline-parallel-size": "pipelineParallelSize",
    "-pp": "pipelineParallelSize",
    "--distributed-executor-backend": "(set by the program: always ray)",
    "--max-model-len": "maxModelLen",
    "--gpu-memory-utilization": "gpuMemoryUtilization",
    "--served-model-name": "servedModelName",
    "--api-key": "apiKey (it is passed through a root-only env file, never a command line)",
    "--host": "(set by the program: the head's primary IP)",
    "--port": "(set by the program)",
    "--model": "model",
}


class Secret:
    """A config value that must never be printed: repr and str hide it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<{len(self._value)} characters>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class ExistingNetwork:
    vpc_id: str
    public_subnet_id: str
    private_subnet_id: str


@dataclass(frozen=True)
class UserCertificate:
    """A certificate the user brings for the gateway, and the name it is for."""

    certificate_pem: str
    private_key: Secret
    hostname: str


@dataclass(frozen=True)
class OwnHosts:
    """Machines the user already has (hosts): the stack creates no AWS resource and
    reaches them over SSH, the nodes through the gateway as on AWS."""

    gangs: tuple[tuple[str, ...], ...]  # each gang's node private IPs, head first
    gateway_address: str  # as this machine and the API's clients reach it (IP or DNS name)
    gateway_private_ip: str  # on the nodes' network
    ssh_user: str
    ssh_private_key: Secret
    model_cache_dir: str  # the shared directory every host has mounted
    # hostKeys: known_hosts lines with a key for the gateway and every host (host_keys.py).
    host_keys: tuple[str, ...] = ()

    def host_key(self, address: str) -> str:
        """The key every connection to `address` pins (authorized_keys form)."""
        return host_keys.pinned_key(host_keys.keys_by_host(list(self.host_keys))[address]).authorized

    def known_hosts(self) -> str:
        """The known_hosts text of every machine, for the operator tools."""
        return "".join(line.strip() + "\n" for line in self.host_keys if line.strip())

    @property
    def node_ips(self) -> tuple[str, ...]:
        return tuple(ip for gang in self.gangs for ip in gang)


# nodeImage: the node software baked into an image by the stack (components/node_image.py),
# or none (every node installs it at its first setup); else an AMI id the user brings.
NODE_IMAGE_BAKE = "bake"
NODE_IMAGE_NONE = "none"


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


@dataclass(frozen=True)
class Problem:
    key: str
    value: str  # already rendered for display; secrets are never shown
    message: str

    def __str__(self) -> str:
        return f"{NAMESPACE}:{self.key} = {self.value}: {self.message}"


class SpecError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = [f"the stack's config has {len(problems)} problem(s); no resource was created:"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.problems]


# The AWS pages that state the rules the checkers enforce, linked from their errors.
# EFA is supported only on the instance types this page lists.
EFA_INSTANCE_TYPES_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types"
# "The code for an Availability Zone is its Region code followed by a letter identifier."
AVAILABILITY_ZONES_DOC = "https://docs.aws.amazon.com/global-infrastructure/latest/regions/aws-availability-zones.html"
# "The smallest VPC you can create uses a /28 netmask ..., and the largest uses a /16 netmask."
CREATE_VPC_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateVpc.html"
# How an instance type is named: family, generation, attributes, a dot and a size.
INSTANCE_TYPE_NAMES_DOC = "https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html"
# An instance launches into a Capacity Reservation or a Capacity Block by the reservation's
# id, and only in the reservation's own Availability Zone.
RESERVATION_LAUNCH_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html"
CAPACITY_BLOCK_LAUNCH_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html"
# CreatePlacementGroup's GroupName: "Constraints: Up to 255 ASCII characters".
PLACEMENT_GROUP_NAME_DOC = "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html"
PLACEMENT_GROUP_NAME_MAX = 255

# Characters that would let a value escape into a shell: ; $ ` ' " | & < > ( ) \ { } * ? ! # ~,
# whitespace and control characters. Model ids, names and vLLM words never need them.
_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_SERVED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
_SAFE_ARG = re.compile(r"^[A-Za-z0-9._:/=,@+%-]+$")
_SHELL_META = set(";$`'\"|&<>()\\{}*?!#~") | {" ", "\t", "\n", "\r"}
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._~+/=-]+$")
_AZ = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d[a-z]$")
_AMI = re.compile(r"^ami-[0-9a-f]{8,17}$")
_VPC = re.compile(r"^vpc-[0-9a-f]{8,17}$")
_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_CAPACITY_RESERVATION = re.compile(r"^cr-[0-9a-f]{8,17}$")
_FILE_SYSTEM = re.compile(r"^fs-[0-9a-f]{8,17}$")
_EC2_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
# Hugging Face revisions: branch and tag names or a commit; also a directory name on the cache.
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}(/[A-Za-z0-9][A-Za-z0-9._-]{0,99}){0,3}$")
_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?(/[A-Za-z0-9._/-]*)?$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,63}$")
_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----\s+[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----")
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z]+ )?PRIVATE KEY-----\s+[A-Za-z0-9+/=\s]+-----END ([A-Z]+ )?PRIVATE KEY-----"
)


# --- the pieces the checkers return ------------------------------------------------------
# Each concern's checker returns one of these; load_spec lays them side by side into the
# ClusterSpec, so their field names are the spec's. A field is None where the config held a
# problem: a spec is built only when there is none.


@dataclass(frozen=True)
class ModelSource:
    """What the nodes download and the name clients ask for."""

    model: str | None
    model_revision: str
    hf_endpoint: str | None
    served_model_name: str | None


@dataclass(frozen=True)
class EngineSettings:
    """vLLM settings beyond the parallelism."""

    vllm_extra_args: tuple[str, ...]
    max_model_len: int | None
    gpu_memory_utilization: float | None


@dataclass(frozen=True)
class ClusterShape:
    """The GPU nodes and how the model's ranks are laid over them."""

    instance: InstanceType | None
    nodes: int | None
    replicas: int | None
    tensor_parallel_size: int | None
    pipeline_parallel_size: int | None
    efa: bool


@dataclass(frozen=True)
class Exposure:
    """Who may reach the API and the admin paths."""

    api_allowed_cidrs: tuple[str, ...]
    admin_cidrs: tuple[str, ...]
    allow_public_api: bool


@dataclass(frozen=True)
class Secrets:
    hf_token: Secret | None
    api_key: Secret | None
    previous_api_key: Secret | None


@dataclass(frozen=True)
class NodeSoftware:
    vllm_version: str
    ray_version: str
    # The lock every node installs (components/node_env.py), from the project directory.
    node_lock: str


@dataclass(frozen=True)
class NetworkPlacement:
    """Where the nodes go: a zone, and a new VPC or an existing network."""

    availability_zone: str | None
    vpc_cidr: str
    existing_network: ExistingNetwork | None


@dataclass(frozen=True)
class Capacity:
    """Reserved capacity and the placement group the nodes launch into."""

    capacity_reservation_id: str | None
    capacity_block: bool
    placement_group_name: str | None


@dataclass(frozen=True)
class NodeStorage:
    ami_id: str | None
    root_volume_gib: int
    retain_model_cache: bool
    # An existing file system to reuse as the model cache (modelCacheFileSystemId).
    model_cache_file_system_id: str | None
    # nodeImage: NODE_IMAGE_BAKE, NODE_IMAGE_NONE or an AMI id launched as is.
    node_image: str = NODE_IMAGE_BAKE


@dataclass(frozen=True)
class GatewaySettings:
    gateway_instance_type: str
    api_read_timeout_seconds: int
    api_rate_limit_per_second: int
    api_routes: tuple[str, ...]


def _fields(piece: Any) -> dict[str, Any]:
    """A piece's fields by name, shallow (dataclasses.asdict would turn the InstanceType
    and ExistingNetwork inside into dicts)."""
    return {f.name: getattr(piece, f.name) for f in fields(piece)}


# --- reading raw values ---------------------------------------------------------------------


# Values longer than this are cut in errors: a certificate pasted into the wrong key
# should not fill the terminal.
_MAX_SHOWN = 200


def _kind(raw: Any) -> str:
    """What a value is, in the words of a stack file."""
    if isinstance(raw, bool):
        return "true/false"
    if isinstance(raw, (int, float)):
        return "a number"
    if isinstance(raw, str):
        return "text"
    if isinstance(raw, (list, tuple)):
        return "a list"
    if isinstance(raw, dict):
        return "a map"
    if isinstance(raw, datetime.date):
        return "a date"  # YAML reads an unquoted 2024-01-01 as one
    return f"a {type(raw).__name__}"


def _display(raw: Any) -> str:
    """JSON where it can be (strings quoted, lists as lists); else the value's own text (a
    YAML date); else only its kind (a number too long for Python to print)."""
    for render in (json.dumps, str):
        try:
            text = render(raw)
        except (TypeError, ValueError):
            continue
        if len(text) <= _MAX_SHOWN:
            return text
        length = len(raw) if isinstance(raw, (str, list)) else len(text)
        return f"{text[:_MAX_SHOWN]}... ({length} {'items' if isinstance(raw, list) else 'characters'})"
    return f"<{_kind(raw)}>"


def _show(key: str, raw: Any) -> str:
    """How a value appears in an error: quoted, and never the value of a secret. A key
    the program does not know may be a misspelt secret (hftoken), so its value is
    hidden too."""
    if raw is None:
        return "(not set)"
    if key not in KEYS_BY_NAME or KEYS_BY_NAME[key].secret:
        return f"<hidden, {len(raw)} characters>" if isinstance(raw, str) else f"<hidden, {_kind(raw)}>"
    return _display(raw)


def _shell_meta_in(text: str) -> str:
    found = sorted({ch for ch in text if ch in _SHELL_META or not ch.isprintable()})
    return " ".join(repr(ch) for ch in found)


def _injection_note(text: str) -> str:
    """The clause every refused name adds when it holds shell characters: the reason these
    values are checked at all is that they reach a shell on the nodes."""
    meta = _shell_meta_in(text)
    return f"; it contains {meta}, which could inject into a shell on the nodes" if meta else ""


# Whole numbers as config values: digits only (no 1e3, no 1_000), and few enough of them
# that every later sum and message stays an ordinary int.
_WHOLE_NUMBER = re.compile(r"^-?[0-9]{1,15}$")
_MAX_WHOLE_NUMBER = 10**15


def _means_unset(value: Any, definition: ConfigKey | None) -> bool:
    """Absent, empty, or the key's auto default (which Pulumi fills in from Pulumi.yaml).
    Compares like with like, so that no value is turned into text just to be compared."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        return True
    if definition is None or not definition.auto:
        return False
    if isinstance(value, str):
        return value.strip().lower() == str(definition.default).lower()
    return type(value) is type(definition.default) and value == definition.default


def _as_float(value: Any) -> float | None:
    """None for what is no number: true/false (which Python would read as 1 and 0), text
    that does not parse, an int beyond any float, a list."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except (ValueError, OverflowError):
        return None


class _Reader:
    """Parses raw config values (strings as Pulumi passes them, or native YAML
    values) into typed values, recording a Problem instead of raising. A value of
    the wrong type is one problem that names the type the key takes and how to set it."""

    def __init__(self, raw: Mapping[str, Any]):
        self.raw = raw
        self.problems: list[Problem] = []
        self.warnings: list[str] = []  # worth saying, but no reason to stop a deployment

    def fail(self, key: str, message: str, raw: Any = ...) -> None:
        value = self.raw.get(key) if raw is ... else raw
        self.problems.append(Problem(key, _show(key, value), message))

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def wrong_type(self, key: str, expected: str, placeholder: str) -> None:
        definition = KEYS_BY_NAME[key]
        if definition.type == "array":
            fix = f"pulumi config set --path '{NAMESPACE}:{key}[0]' {placeholder}"
        else:
            fix = f"pulumi config set {'--secret ' if definition.secret else ''}{NAMESPACE}:{key} {placeholder}"
        if not definition.required:
            fix += f", or pulumi config rm {NAMESPACE}:{key} for the default"
        value = self.raw.get(key)
        found = "" if isinstance(value, str) else f", not {_kind(value)}"
        self.fail(key, f"must be {expected}{found}. Fix: {fix}")

    def present(self, key: str) -> bool:
        """Set to something other than "not set": absent, empty, or the key's
        auto default (which Pulumi fills in from Pulumi.yaml) all mean unset."""
        return not _means_unset(self.raw.get(key), KEYS_BY_NAME.get(key))

    def default(self, key: str) -> Any:
        definition = KEYS_BY_NAME[key]
        return None if definition.auto else definition.default

    def string(self, key: str) -> str | None:
        if not self.present(key):
            if KEYS_BY_NAME[key].required:
                self.fail(key, f"is required. Fix: pulumi config set {NAMESPACE}:{key} VALUE")
            return self.default(key)
        value = self.raw[key]
        if not isinstance(value, str):
            self.wrong_type(key, "text (in a stack file, put it in quotes)", "TEXT")
            return None
        return value

    def integer(self, key: str) -> int | None:
        if not self.present(key):
            return self.default(key)
        value = self.raw[key]
        if isinstance(value, str) and _WHOLE_NUMBER.match(value.strip()):
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < _MAX_WHOLE_NUMBER:
            return value
        default = KEYS_BY_NAME[key].default
        example = f", e.g. {default}" if isinstance(default, int) and default > 0 else ""
        self.wrong_type(key, f"a whole number{example}", "NUMBER")
        return None

    def number(self, key: str) -> float | None:
        """A decimal number. Pulumi.yaml has no number type, so the key is declared
        a string and YAML may hand us either a float or its text."""
        if not self.present(key):
            return self.default(key)
        parsed = _as_float(self.raw[key])
        if parsed is None:
            self.wrong_type(key, "a number such as 0.90", "0.90")
        return parsed

    def boolean(self, key: str) -> bool | None:
        if not self.present(key):
            return self.default(key)
        value = self.raw[key]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if KEYS_BY_NAME[key].auto:
            self.wrong_type(key, "true or false (or auto)", "auto")
        else:
            self.wrong_type(key, "true or false", "true")
        return None

    def string_list(self, key: str) -> list[str] | None:
        example = "203.0.113.0/24" if "Cidr" in key else "--enforce-eager"
        if not self.present(key):
            if KEYS_BY_NAME[key].required:
                self.fail(
                    key,
                    "is required: a list of CIDRs. "
                    f"Fix: pulumi config set --path '{NAMESPACE}:{key}[0]' 203.0.113.0/24",
                )
                return None
            default = self.default(key)
            return list(default) if default is not None else None
        value = self.raw[key]
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError):  # not JSON, or nested deeper than Python recurses
                value = None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.wrong_type(key, f'a list of strings, e.g. ["{example}"]', example)
            return None
        return value


# --- one checker per concern -------------------------------------------------------------
# Each reads its keys, records what is wrong on the reader (every problem, never the first
# only) and returns its piece of the spec.


def _check_known_keys(reader: _Reader) -> None:
    for name in unknown_keys(reader.raw):
        guess = closest_key(name)
        reader.fail(
            name,
            "is not a setting of vllm-cluster"
            + (f"; did you mean {guess}?" if guess else "")
            + f" Fix: pulumi config rm {NAMESPACE}:{name}",
        )


def _check_model_source(reader: _Reader) -> ModelSource:
    """The model id, revision and served name reach a shell on the nodes; the hub URL is
    written to an env file."""
    model = reader.string("model")
    if model is not None and not _HF_REPO_ID.match(model):
        reader.fail(
            "model",
            "must be a Hugging Face repo id such as meta-llama/Llama-3.1-8B-Instruct" + _injection_note(model),
        )

    model_revision = reader.string("modelRevision") or "main"
    if not _REVISION.match(model_revision) or ".." in model_revision:
        reader.fail(
            "modelRevision",
            "must be a branch, tag or commit of the model repo, such as main or a 40-character commit hash"
            + _injection_note(model_revision),
        )

    hf_endpoint = reader.string("hfEndpoint")
    if hf_endpoint is not None and not _URL.match(hf_endpoint):
        reader.fail(
            "hfEndpoint",
            "must be an http(s) URL such as https://hf-mirror.example.com (letters, digits and . - : / only)",
        )

    served_model_name = reader.string("servedModelName")
    if served_model_name is not None and not _SERVED_NAME.match(served_model_name):
        reader.fail(
            "servedModelName",
            "may only hold letters, digits and . _ : / -" + _injection_note(served_model_name),
        )
    return ModelSource(model, model_revision, hf_endpoint, served_model_name)


def _check_extra_args(reader: _Reader) -> tuple[str, ...]:
    """Each item is one word of `vllm serve`: no shell characters, and none of the flags
    the program sets from its own keys."""
    extra_args = reader.string_list("vllmExtraArgs") or []
    for arg in extra_args:
        if not _SAFE_ARG.match(arg):
            reader.fail(
                "vllmExtraArgs",
                f"item {json.dumps(arg)} may only hold letters, digits and . _ : / = , @ + % -"
                + _injection_note(arg)
                + '. Put each word in its own item, e.g. ["--max-num-seqs", "64"]',
            )
            continue
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_VLLM_FLAGS:
            reader.fail("vllmExtraArgs", f"item {arg} is managed by the program; use {MANAGED_VLLM_FLAGS[flag]}")
    _check_model_task(reader, extra_args)
    return _with_vllm_dtype(reader, extra_args)


# How to say a pooling model's task, for the messages below.
_TASK_FIX = (
    'Fix: say the task as vLLM takes it, e.g. ["--runner", "pooling", "--pooler-config.task", "embed"] for an '
    "embedding model (/v1/embeddings), classify for a classifier or cross-encoder reranker (/classify, "
    '/v1/score, /v1/rerank), token_embed for late interaction (/v1/score, /v1/rerank); or ["--convert", "embed"] '
    "(or classify) to adapt a generative model"
)


def _check_model_task(reader: _Reader, extra_args: list[str]) -> None:
    """vllmExtraArgs must say what the model serves, as vLLM takes it: its routes and the
    stack's probe follow the task (components/api_routes.py, with the vLLM sources), and
    a pooling model serves no completion."""
    if api_routes.names_the_removed_task_flag(extra_args):
        reader.fail(
            "vllmExtraArgs",
            "holds --task, which is no vllm serve option: vLLM 0.22 to 0.33 exit with 'unrecognized arguments: "
            f"--task' (vllm/engine/arg_utils.py has none). {_TASK_FIX}",
        )
        return
    convert = api_routes.flag_values(extra_args).get("--convert")
    if convert is not None and convert not in api_routes.VLLM_CONVERTS:
        reader.fail(
            "vllmExtraArgs",
            f"--convert {convert!r} is not one vLLM takes: {', '.join(api_routes.VLLM_CONVERTS)} "
            "(vllm/config/model.py ConvertOption; a reward model is a pooling model of its own, no conversion). "
            f"{_TASK_FIX}",
        )
        return
    task = api_routes.model_task(extra_args)
    if task is None:
        reader.fail(
            "vllmExtraArgs",
            "do not say both that the model is a pooling one (--runner pooling, or --convert) and its task "
            "(--pooler-config.task, or --convert), which decide its routes and the request the stack sends to see "
            "that it serves; vLLM would take what is missing from the model's own config, which the stack cannot "
            f"read before the model is there. {_TASK_FIX}",
        )
    elif task not in api_routes.SERVED_TASKS:
        known = task in api_routes.VLLM_POOLING_TASKS
        reader.fail(
            "vllmExtraArgs",
            (
                f"--pooler-config.task {task}: vLLM serves that task only at /pooling "
                "(vllm/entrypoints/pooling/factories.py), a route the gateway does not forward (it takes any "
                "pooling task in the request). "
                if known
                else f"--pooler-config.task {task!r} is not a pooling task vLLM takes "
                f"({', '.join(api_routes.VLLM_POOLING_TASKS)}; vllm/tasks.py). "
            )
            + f"The gateway serves the tasks {', '.join(api_routes.SERVED_POOLING_TASKS)}. {_TASK_FIX}",
        )


def _vllm_dtype_spelling(reader: _Reader, value: str) -> str:
    """`value` of --dtype as vLLM spells it: its own spellings pass as written, the short
    ones (bf16 ...) are translated, since vLLM would refuse them."""
    if value in sizing.VLLM_DTYPE_CHOICES:
        return value
    try:
        canonical = sizing.canonical_dtype(value, "--dtype")
    except ValueError:
        # Not the planner's full list: the quantized types are no value for vLLM's --dtype.
        accepted = [spelling for spelling, name in sizing.DTYPE_SPELLINGS.items() if sizing.vllm_dtype(name)]
        reader.fail(
            "vllmExtraArgs",
            f"--dtype {value!r} is not a weight type vLLM takes; accepted: {', '.join(accepted)}. "
            "Fix: one of these after --dtype, or no --dtype for the model's own",
        )
        return value
    spelling = sizing.vllm_dtype(canonical)
    if spelling is None:
        reader.fail(
            "vllmExtraArgs",
            f"--dtype {value} is a quantized weight type; vLLM's --dtype takes only "
            f"{', '.join(sizing.VLLM_DTYPE_CHOICES)}. Quantized weights come from a quantized checkpoint "
            "(a model id that names its quantization) or --quantization. "
            'Fix: ["--quantization", "fp8"] in place of the --dtype, or drop it',
        )
        return value
    return spelling


def _with_vllm_dtype(reader: _Reader, args: list[str]) -> tuple[str, ...]:
    """The args with any --dtype value (`--dtype X` or `--dtype=X`) in vLLM's spelling."""
    out = list(args)
    for i, arg in enumerate(args):
        if arg == "--dtype":
            if i + 1 == len(args):
                reader.fail("vllmExtraArgs", 'ends with --dtype and no value. Fix: ["--dtype", "bfloat16"]')
            else:
                out[i + 1] = _vllm_dtype_spelling(reader, args[i + 1])
        elif arg.startswith("--dtype="):
            out[i] = "--dtype=" + _vllm_dtype_spelling(reader, arg.split("=", 1)[1])
    return tuple(out)


def _check_engine_settings(reader: _Reader) -> EngineSettings:
    extra_args = _check_extra_args(reader)
    max_model_len = reader.integer("maxModelLen")
    if max_model_len is not None and max_model_len < 1:
        reader.fail("maxModelLen", "must be a positive number of tokens, e.g. 8192")
    gpu_memory_utilization = reader.number("gpuMemoryUtilization")
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        reader.fail("gpuMemoryUtilization", "must be greater than 0 and at most 1, e.g. 0.90")
        gpu_memory_utilization = None
    return EngineSettings(extra_args, max_model_len, gpu_memory_utilization)


def _check_instance_type(reader: _Reader, own: OwnHosts | None) -> InstanceType | None:
    name = reader.string("instanceType")
    if own is not None and name is None:
        return None if reader.present("instanceType") else _own_host_type(reader)
    if own is None and name is None:
        if reader.present("instanceType"):
            return None  # of the wrong type: already a problem
        reader.fail(
            "instanceType",
            "is required: the GPU instance type of every node (or list the machines you already have in hosts). "
            f"Fix: pulumi config set {NAMESPACE}:instanceType g5.12xlarge",
        )
        return None
    for key in ("gpusPerNode", "gpuMemoryGiB"):
        # Read first: a value of the wrong type is that problem alone.
        if reader.integer(key) is not None:
            reader.fail(
                key,
                f"describes hosts of no catalog type, but instanceType is set and says it. Fix: pulumi config rm "
                f"{NAMESPACE}:{key}, or pulumi config rm {NAMESPACE}:instanceType",
            )
    instance = catalog.lookup(name)
    if name is not None and instance is None:
        reader.fail(
            "instanceType",
            f"is not in the catalog. Known types: {', '.join(catalog.known_instance_types())}. "
            "Fix: pick one, or add a row to components/catalog.py after checking it with "
            "aws ec2 describe-instance-types",
        )
    return instance


def _own_host_type(reader: _Reader) -> InstanceType | None:
    """The hosts' GPUs when no catalog type describes them (gpusPerNode, gpuMemoryGiB): the
    rank layout, the engine's fit and preflight need both. No price: the stack pays for none."""
    gpus, memory = reader.integer("gpusPerNode"), reader.integer("gpuMemoryGiB")
    for key, value, example in (("gpusPerNode", gpus, 8), ("gpuMemoryGiB", memory, 80)):
        if value is None or value < 1:
            reader.fail(
                key,
                "is needed with hosts when instanceType is not set: the GPUs of each host lay out the model's "
                f"ranks, and preflight checks them. Fix: pulumi config set {NAMESPACE}:{key} {example}, or "
                f"pulumi config set {NAMESPACE}:instanceType to the catalog type with your hosts' GPUs",
                raw=value,
            )
    if gpus is None or memory is None or gpus < 1 or memory < 1:
        return None
    return host_instance_type(gpus, memory)


def _check_nodes(reader: _Reader) -> int | None:
    nodes = reader.integer("nodes")
    if nodes is not None and nodes < 1:
        reader.fail("nodes", f"must be at least 1. Fix: pulumi config set {NAMESPACE}:nodes 1")
        return None
    return nodes


def _check_replicas(reader: _Reader, nodes: int | None) -> int | None:
    replicas = reader.integer("replicas")
    if replicas is None:
        return None
    if not 0 <= replicas <= MAX_REPLICAS:
        reader.fail(
            "replicas",
            f"must be between 0 and {MAX_REPLICAS}: each replica is a gang of `nodes` GPU nodes serving its own "
            f"copy of the model (0: every gang may sleep, with maxReplicas and idleStopMinutes). Fix: pulumi config "
            f"set {NAMESPACE}:replicas 2",
        )
        return None
    if replicas <= 1:
        # 0 and 1: one gang's placement at most here; more gangs by maxReplicas are
        # checked with it (_check_max_replicas).
        return replicas
    if reader.string("placementGroupName") is not None:
        if reader.string("capacityReservationId") is not None:
            # A reservation made in a cluster placement group serves only that group: the
            # other gangs' groups could not launch into it.
            fix = (
                f"pulumi config set {NAMESPACE}:replicas 1 (a reservation in a placement group serves that one "
                "group), or reserve capacity outside a placement group and remove placementGroupName"
            )
        else:
            fix = (
                f"pulumi config rm {NAMESPACE}:placementGroupName (the stack then makes one group per gang), "
                f"or pulumi config set {NAMESPACE}:replicas 1"
            )
        reader.fail(
            "replicas",
            f"is {replicas}, but placementGroupName names one existing group, and each gang needs a cluster "
            f"placement group of its own (a failure of one group's capacity must not take every gang). Fix: {fix}",
        )
        return None
    if reader.string("capacityReservationId") is not None:
        reader.warn(
            f"{replicas} replicas of {nodes or 1} node(s) launch into capacityReservationId: the "
            "reservation must hold every gang's nodes (nodes x replicas instances); this cannot be checked offline."
        )
    return replicas


def _check_parallel_sizes(reader: _Reader) -> tuple[int | None, int | None]:
    """tensorParallelSize and pipelineParallelSize as set; None for unset (derived) or refused."""
    sizes = []
    for key in ("tensorParallelSize", "pipelineParallelSize"):
        size = reader.integer(key)
        if size is not None and size < 1:
            reader.fail(key, "must be at least 1")
            size = None
        sizes.append(size)
    return sizes[0], sizes[1]


def _check_rank_layout(
    reader: _Reader, instance: InstanceType, nodes: int, tp: int | None, pp: int | None
) -> tuple[int, int]:
    """Every GPU holds one rank, and no tensor-parallel group straddles two nodes.
    Unset sizes are derived: TP the GPUs of one node, PP the number of nodes."""
    gpus = instance.gpus
    tp_value = tp if tp is not None else gpus
    pp_value = pp if pp is not None else nodes
    if tp_value > gpus:
        reader.fail(
            "tensorParallelSize",
            f"is larger than the {gpus} GPU(s) of one {instance.name}; tensor parallelism stays inside a node "
            f"(NVLink), pipeline parallelism spans nodes. Fix: tensorParallelSize {gpus}, pipelineParallelSize "
            f"{nodes}",
            raw=tp_value,
        )
    elif gpus % tp_value:
        reader.fail(
            "tensorParallelSize",
            f"must divide the {gpus} GPUs of a {instance.name} so that no tensor-parallel group straddles two "
            f"nodes. Fix: one of {', '.join(str(d) for d in range(1, gpus + 1) if gpus % d == 0)}",
            raw=tp_value,
        )
    elif tp_value * pp_value != nodes * gpus:
        need_pp = nodes * gpus // tp_value
        reader.fail(
            "pipelineParallelSize" if pp is not None else "tensorParallelSize",
            f"tensorParallelSize {tp_value} x pipelineParallelSize {pp_value} = {tp_value * pp_value} GPU(s), "
            f"but {nodes} node(s) x {gpus} GPU(s) = {nodes * gpus}: every GPU must hold one rank. "
            f"Fix: pipelineParallelSize {need_pp} with tensorParallelSize {tp_value}",
            raw=pp_value if pp is not None else tp_value,
        )
    return tp_value, pp_value


def _check_efa(reader: _Reader, instance: InstanceType, nodes: int, own: OwnHosts | None) -> bool:
    """EFA where the type has it and there is traffic between nodes, unless the config says."""
    efa = reader.boolean("efa")
    if own is not None:
        # EFA is a network interface the stack attaches when it launches an instance.
        if efa:
            reader.fail(
                "efa",
                "is true, but with hosts the stack launches no instance, and EFA interfaces are attached at "
                f"launch: NCCL uses the hosts' own network. Fix: pulumi config rm {NAMESPACE}:efa",
            )
        return False
    if efa is None:
        efa = instance.efa_supported and nodes > 1
    elif efa and not instance.efa_supported:
        efa_types = [t for t in catalog.known_instance_types() if catalog.CATALOG[t].efa_supported]
        reader.fail(
            "efa",
            f"is true, but {instance.name} has no EFA. Fix: set efa false, or use one of {', '.join(efa_types)} "
            f"(EFA-capable types: {EFA_INSTANCE_TYPES_DOC})",
        )
    if nodes > 1 and not efa:
        reader.warn(
            f"{nodes} nodes without EFA: traffic between pipeline stages goes over TCP on the primary "
            f"interface, which is slower and the usual cause of multi-node hangs when the NIC is wrong. "
            f"Set {NAMESPACE}:efa true on an EFA instance type for production."
        )
    return efa


def _check_cluster_shape(reader: _Reader, own: OwnHosts | None) -> ClusterShape:
    if own is None and _hosts_listed(reader):
        # hosts is refused above: no shape to check it against, and no instanceType to ask for.
        return ClusterShape(None, None, None, None, None, False)
    instance = _check_instance_type(reader, own)
    if own is not None:
        nodes, replicas = _own_hosts_shape(reader, own)
    else:
        nodes = _check_nodes(reader)
        replicas = _check_replicas(reader, nodes)
    tp, pp = _check_parallel_sizes(reader)
    if instance is None or nodes is None:
        # Nothing to lay the ranks over; the instance type or node count is already a problem.
        return ClusterShape(instance, nodes, replicas, tp, pp, bool(reader.boolean("efa")))
    tp, pp = _check_rank_layout(reader, instance, nodes, tp, pp)
    return ClusterShape(instance, nodes, replicas, tp, pp, _check_efa(reader, instance, nodes, own))


# --- what vLLM would refuse at its start -----------------------------------------------------
# vLLM checks both at start-up, after every resource exists and the weights are downloaded:
# - vllm/config/model.py: "User-specified max_model_len (X) is greater than the derived
#   max_model_len (max_position_embeddings=Y ...)" unless VLLM_ALLOW_LONG_MAX_MODEL_LEN;
# - vllm/v1/core/kv_cache_utils.py: "To serve at least one request with the models's max seq
#   len (X), (Y GiB KV cache is needed, which is larger than the available KV cache memory".
# And weights that exceed a GPU's memory fail with CUDA out of memory while loading. The
# spec refuses these before any resource where the model table knows the model; the
# figures are components/sizing.py's, the same that `scripts/vllm-cluster plan` prints.
_FIT_KEYS = (
    "model",
    "instanceType",
    "nodes",
    "tensorParallelSize",
    "pipelineParallelSize",
    "maxModelLen",
    "gpuMemoryUtilization",
    "vllmExtraArgs",
)


def _shape_words(instance: InstanceType, nodes: int, tp: int, pp: int) -> str:
    return f"instanceType {instance.name}, nodes {nodes}, tensorParallelSize {tp}, pipelineParallelSize {pp}"


def _smallest_fit_fix(model: sizing.ModelSize, utilization: float | None, length: int) -> str:
    option = sizing.smallest_fit(model, utilization, length)
    if option is None:
        return (
            "no configuration of the catalog up to 16 nodes holds it: serve a smaller or quantized model "
            "(scripts/vllm-cluster plan sizes one)"
        )
    return (
        f"{_shape_words(catalog.CATALOG[option.instance_type], option.nodes, option.tp, option.pp)} "
        f"(the smallest fit scripts/vllm-cluster plan finds, ${option.cost_per_hour:.2f}/h per gang), "
        "or a smaller model"
    )


def _longest_context_that_fits(tokens: int) -> int:
    """A round length at most `tokens`: whole thousands of 1,024 tokens where there are any."""
    return tokens - tokens % 1024 if tokens >= 1024 else tokens


def _check_engine_fit(reader: _Reader, source: ModelSource, engine: EngineSettings, shape: ClusterShape) -> None:
    """The model's weights and one sequence of maxModelLen in the GPUs of one gang, and
    maxModelLen within the model's context. Checked only when the keys it reads are sound and
    the model table knows the model; with a flag whose effect on memory is not modelled, a
    warning says the fit was not checked."""
    if any(p.key in _FIT_KEYS for p in reader.problems) or None in (
        source.model,
        shape.instance,
        shape.nodes,
        shape.tensor_parallel_size,
        shape.pipeline_parallel_size,
    ):
        return
    model = sizing.served_size(source.model, engine.vllm_extra_args)
    if model is None:
        return  # not in the table: `plan --params-b` sizes it, and warns when it does not fit
    unmodelled = sizing.unmodelled_memory_flags(engine.vllm_extra_args)
    if unmodelled:
        reasons = "; ".join(f"{flag}: {sizing.UNMODELLED_MEMORY_FLAGS[flag]}" for flag in unmodelled)
        reader.warn(
            f"whether {source.model} fits was not checked: vllmExtraArgs holds {reasons}, which the sizing "
            "does not model. vLLM itself checks at its start."
        )
        return
    instance, nodes = shape.instance, shape.nodes
    tp, pp = shape.tensor_parallel_size, shape.pipeline_parallel_size
    context = model.max_context
    asked = engine.max_model_len
    if asked is not None and context is not None and asked > context:
        reader.fail(
            "maxModelLen",
            f"is above {source.model}'s context of {context} tokens (max_position_embeddings in its config.json): "
            f"vLLM refuses a longer max-model-len at its start, after every resource exists. "
            f"Fix: pulumi config set {NAMESPACE}:maxModelLen {context}, or pulumi config rm {NAMESPACE}:maxModelLen "
            "for the model's own",
        )
    length = min(asked or context, context) if context is not None else asked
    the_fit = sizing.fit(model, instance, tp, pp, engine.gpu_memory_utilization, length)
    if the_fit.fits:
        return
    utilization = engine.gpu_memory_utilization or sizing.DEFAULT_GPU_MEMORY_UTILIZATION
    shape_words = _shape_words(instance, nodes, tp, pp)
    if the_fit.kv_room_per_rank_gib <= 0:
        reader.fail(
            "model",
            f"does not fit {shape_words}: its weights ({model.dtype}) need {the_fit.weights_per_rank_gib:.1f} GiB "
            f"per GPU, and a {instance.name} GPU has {instance.gpu_memory_gib:g} GiB, "
            f"{the_fit.usable_per_rank_gib:.1f} GiB usable at gpuMemoryUtilization {utilization:g}, less "
            f"{sizing.RUNTIME_OVERHEAD_GIB:g} GiB of runtime: vLLM would run out of GPU memory loading it. "
            f"Fix: {_smallest_fit_fix(model, engine.gpu_memory_utilization, length)}",
        )
        return
    held = the_fit.context_tokens or 0
    which = (
        f"maxModelLen ({length} tokens)"
        if asked is not None and length == asked
        else f"the model's own context ({length} tokens; maxModelLen is not set or above it)"
    )
    fixes = []
    if held >= 1:
        fixes.append(f"pulumi config set {NAMESPACE}:maxModelLen {_longest_context_that_fits(held)}")
    fixes.append(f"more GPUs: {_smallest_fit_fix(model, engine.gpu_memory_utilization, length)}")
    reader.fail(
        "maxModelLen",
        f"{source.model} on {shape_words}: the KV cache holds about {held} tokens per gang "
        f"({the_fit.kv_room_per_rank_gib:.1f} GiB per GPU after {the_fit.weights_per_rank_gib:.1f} GiB of weights), "
        f"fewer than one sequence of {which}, and vLLM refuses to start. Fix: {'; or '.join(fixes)}",
        raw=asked,
    )


def _world_spanning(networks: list) -> list:
    """The networks of each address family that together span all of it: 0.0.0.0/0
    itself, or the whole internet written in pieces (0.0.0.0/1 + 128.0.0.0/1)."""
    spanning = []
    for version in (4, 6):
        family = [n for n in networks if n.version == version]
        if any(n.prefixlen == 0 for n in ipaddress.collapse_addresses(family)):
            spanning += family
    return spanning


def _check_cidrs(reader: _Reader, key: str, world_allowed: bool, world_fix: str) -> tuple[str, ...]:
    cidrs = reader.string_list(key)
    if cidrs is None:
        return ()
    checked = []
    if not cidrs:
        reader.fail(key, "must name at least one CIDR; an empty list would leave the path closed to everyone")
    for cidr in cidrs:
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError:
            try:
                loose = ipaddress.ip_network(cidr, strict=False)
                hint = f"host bits are set; did you mean {loose}?"
            except ValueError:
                hint = "is not a CIDR such as 203.0.113.0/24 or 2001:db8::/48"
            reader.fail(key, f"item {json.dumps(cidr)} {hint}")
            continue
        checked.append(network)
    spanning = [] if world_allowed else _world_spanning(checked)
    if spanning:
        named = " + ".join(str(network) for network in spanning)
        reader.fail(key, f"{named} opens this path to the whole internet. Fix: {world_fix}")
    return tuple(str(network) for network in checked)


def _check_exposure(reader: _Reader) -> Exposure:
    allow_public_api = bool(reader.boolean("allowPublicApi"))
    api_allowed_cidrs = _check_cidrs(
        reader,
        "apiAllowedCidrs",
        world_allowed=allow_public_api,
        world_fix=f"list your clients' CIDRs, or pulumi config set {NAMESPACE}:allowPublicApi true "
        "if the API (guarded by its key) is meant to be public",
    )
    admin_cidrs = _check_cidrs(
        reader,
        "adminCidrs",
        world_allowed=False,
        world_fix="SSH and the Ray dashboard run arbitrary code (ShadowRay, CVE-2023-48022); "
        'list only your own network, e.g. "$(curl -s https://checkip.amazonaws.com)/32"',
    )
    _check_gateway_rule_quota(reader, api_allowed_cidrs, admin_cidrs)
    return Exposure(api_allowed_cidrs, admin_cidrs, allow_public_api)


# The gateway's inbound rules that name the nodes' group (components/security.py
# _gateway_rules): the readiness probe on the API port, and Prometheus.
GATEWAY_RULES_FROM_NODES = 2


def _check_gateway_rule_quota(
    reader: _Reader, api_allowed_cidrs: tuple[str, ...], admin_cidrs: tuple[str, ...]
) -> None:
    """The gateway's group takes one inbound rule per API CIDR, two per admin CIDR (SSH
    and the dashboard) and two from the nodes' group (the readiness probe, Ray's
    dashboards reading Prometheus; components/security.py).
    EC2 refuses a group's 61st inbound rule of a family (the default quota, IPv4 and IPv6
    counted apart) in the middle of `pulumi up`; refuse such lists here instead. A rule
    that names a group counts against both families (aws_contract's reading)."""
    for version, family in ((4, "IPv4"), (6, "IPv6")):
        api = sum(1 for cidr in api_allowed_cidrs if ipaddress.ip_network(cidr).version == version)
        admin = sum(1 for cidr in admin_cidrs if ipaddress.ip_network(cidr).version == version)
        rules = api + 2 * admin + GATEWAY_RULES_FROM_NODES
        if rules <= aws_contract.RULES_PER_GROUP:
            continue
        key = "adminCidrs" if 2 * admin >= api else "apiAllowedCidrs"
        reader.fail(
            key,
            f"with apiAllowedCidrs ({api} {family}) and adminCidrs ({admin} {family}) the gateway's security "
            f"group needs {rules} inbound {family} rules (1 per API CIDR, 2 per admin CIDR for SSH and the "
            f"dashboard, {GATEWAY_RULES_FROM_NODES} from the nodes); AWS refuses more than "
            f"{aws_contract.RULES_PER_GROUP} per group and family by default ({aws_contract.VPC_QUOTAS_SOURCE}). "
            "Fix: merge neighbouring CIDRs into wider ones (e.g. four /26 into one /24), or reach the admin "
            "paths through one VPN or office CIDR",
        )


def _check_secret_token(reader: _Reader, key: str, min_length: int = 1) -> Secret | None:
    value = reader.string(key)
    if value is None:
        return None
    if key != "hfToken" and len(value) > MAX_API_KEY_LENGTH:
        reader.fail(key, f"is longer than {MAX_API_KEY_LENGTH} characters, more than the gateway's key map holds")
        return None
    if len(value) < min_length:
        reader.fail(
            key,
            f"is shorter than {min_length} characters. Fix: leave it unset to have one generated, "
            f'or pulumi config set --secret {NAMESPACE}:{key} "$(openssl rand -hex 24)"',
        )
        return None
    if not _TOKEN_CHARS.match(value):
        reader.fail(
            key,
            "may only hold letters, digits and . _ ~ + / = - (it is written to an env file on the nodes). "
            f"Fix: pulumi config set --secret {NAMESPACE}:{key} NEW_VALUE",
        )
        return None
    return Secret(value)


def _check_secrets(reader: _Reader, secret_keys: set[str] | None) -> Secrets:
    """Secrets must have been set with --secret: a plain value sits unencrypted in the
    stack file and in state. `secret_keys` None skips that check (no stack at hand)."""
    for key in ("hfToken", "apiKey", "previousApiKey", "tlsPrivateKey"):
        if reader.present(key) and secret_keys is not None and key not in secret_keys:
            reader.fail(
                key,
                "was set in plain text: it would sit unencrypted in the stack file and in state. "
                f"Fix: pulumi config set --secret {NAMESPACE}:{key} VALUE",
            )
    return Secrets(
        hf_token=_check_secret_token(reader, "hfToken"),
        api_key=_check_secret_token(reader, "apiKey", MIN_API_KEY_LENGTH),
        previous_api_key=_check_previous_api_key(reader),
    )


def _check_previous_api_key(reader: _Reader) -> Secret | None:
    """The old key of a rotation: it needs the new one in apiKey beside it (a generated
    apiKey would lock every client out at once) and must differ from it."""
    previous = _check_secret_token(reader, "previousApiKey", MIN_API_KEY_LENGTH)
    if previous is None:
        return None
    if not reader.present("apiKey"):
        reader.fail(
            "previousApiKey",
            "is set but apiKey is not: a rotation keeps the old key here and the new one in apiKey. Fix: "
            f'pulumi config set --secret {NAMESPACE}:apiKey "$(openssl rand -hex 24)", or pulumi config rm '
            f"{NAMESPACE}:previousApiKey",
        )
    elif reader.raw.get("apiKey") == previous.reveal():
        reader.fail(
            "previousApiKey",
            f"is the same as apiKey: set apiKey to the new key. Fix: pulumi config set --secret {NAMESPACE}:apiKey "
            '"$(openssl rand -hex 24)"',
        )
    return previous


def _check_release(reader: _Reader, key: str, floor: str, pinned: str) -> str:
    value = reader.string(key) or pinned
    try:
        parsed = versions.parse_version(value)
    except ValueError as error:
        reader.fail(key, f"{error}, e.g. {pinned}")
        return value
    if parsed < versions.parse_version(floor):
        reader.fail(
            key,
            f"is below the security floor {floor} (see README, 'Node software'). "
            f"Fix: pulumi config set {NAMESPACE}:{key} {pinned}",
        )
    return value


def _check_node_software(reader: _Reader) -> NodeSoftware:
    vllm_version = _check_release(reader, "vllmVersion", versions.VLLM_MIN_VERSION, versions.VLLM_VERSION)
    ray_version = _check_release(reader, "rayVersion", versions.RAY_MIN_VERSION, versions.RAY_VERSION)
    return NodeSoftware(
        vllm_version=vllm_version,
        ray_version=ray_version,
        node_lock=_check_node_lock(reader, vllm_version, ray_version),
    )


def _check_node_lock(reader: _Reader, vllm_version: str, ray_version: str) -> str:
    """The lock the nodes install: the stack's nodeLock, else the checked-in one when
    the stack runs the pinned versions. Read and checked here, so a lock that cannot
    serve these versions stops `pulumi up` before any resource exists."""
    given = reader.string("nodeLock")
    own_lock = node_env.gpu_node(vllm_version, ray_version).lock_path.relative_to(node_env.ROOT)
    fix = (
        f"lock them with python tools/lock_node_env.py --vllm {vllm_version} --ray {ray_version} "
        f"(it writes {own_lock}), then pulumi config set {NAMESPACE}:nodeLock {own_lock}"
    )
    if given is None:
        if (vllm_version, ray_version) != (versions.VLLM_VERSION, versions.RAY_VERSION):
            reader.fail(
                "nodeLock",
                f"is not set, and the checked-in lock ({node_env.default_lock_path().relative_to(node_env.ROOT)}) "
                f"holds vLLM {versions.VLLM_VERSION} and Ray {versions.RAY_VERSION}, not the stack's vllmVersion "
                f"{vllm_version} and rayVersion {ray_version}: every node installs exactly one locked environment. "
                f"Fix: {fix}",
                raw=None,
            )
        return str(node_env.default_lock_path().relative_to(node_env.ROOT))
    path = node_env.ROOT / given
    try:
        text = path.read_text()
    except OSError as error:
        reader.fail(
            "nodeLock", f"cannot be read ({error.strerror}): it is a path from the project directory. Fix: {fix}"
        )
        return given
    problems = node_env.stack_lock_problems(text, vllm_version, ray_version)
    if problems:
        why = "; ".join(problems)
        reader.fail("nodeLock", f"is not a lock the nodes can install for this stack: {why}. Fix: {fix}")
    return given


def _check_zone(reader: _Reader, region: str | None) -> str | None:
    """A zone's name is its region's and one letter; the nodes launch in aws:region, where a
    zone of another region does not exist. Without the region (a caller that holds no
    stack) only the name's shape is checked."""
    zone = reader.string("availabilityZone")
    if zone is None:
        return None
    if not _AZ.match(zone):
        reader.fail(
            "availabilityZone",
            f"is not an Availability Zone name such as us-east-1a (its region's name and a letter; "
            f"see {AVAILABILITY_ZONES_DOC})",
        )
    elif region and zone[:-1] != region:
        reader.fail(
            "availabilityZone",
            f"is not in the stack's region {region} (aws:region): a zone's name is its region's and a letter. "
            f"Fix: a zone such as {region}a, or change aws:region (see {AVAILABILITY_ZONES_DOC})",
        )
    return zone


def _check_vpc_cidr(reader: _Reader) -> str:
    vpc_cidr = reader.string("vpcCidr") or DEFAULT_VPC_CIDR
    try:
        network = ipaddress.ip_network(vpc_cidr, strict=True)
    except ValueError:
        reader.fail("vpcCidr", "is not a CIDR such as 10.42.0.0/16")
        return vpc_cidr
    if network.version != 4 or not 16 <= network.prefixlen <= 24:
        reader.fail(
            "vpcCidr",
            f"must be an IPv4 CIDR from /16 to /24, e.g. 10.42.0.0/16 (EC2 creates no VPC larger than a /16: "
            f"see {CREATE_VPC_DOC})",
        )
    elif not network.is_private:
        reader.fail("vpcCidr", "must be a private range (RFC 1918), e.g. 10.42.0.0/16")
    return vpc_cidr


def _check_existing_network(reader: _Reader, vpc_cidr: str) -> ExistingNetwork | None:
    """vpcId, publicSubnetId and privateSubnetId: all three or none."""
    shapes = {
        "vpcId": (_VPC, "vpc-0abc12345def67890"),
        "publicSubnetId": (_SUBNET, "subnet-0abc12345def67890"),
        "privateSubnetId": (_SUBNET, "subnet-0abc12345def67890"),
    }
    ids = {key: reader.string(key) for key in shapes}
    if not any(ids.values()):
        return None
    missing = [key for key, value in ids.items() if not value]
    for key in missing:
        reader.fail(key, "must be set together with vpcId, publicSubnetId and privateSubnetId (all or none)")
    for key, value in ids.items():
        pattern, example = shapes[key]
        if value and not pattern.match(value):
            reader.fail(key, f"is not an id such as {example}")
    if vpc_cidr != DEFAULT_VPC_CIDR:
        reader.fail("vpcCidr", "applies only to a new VPC; remove it when vpcId is set")
    if missing:
        return None
    return ExistingNetwork(ids["vpcId"], ids["publicSubnetId"], ids["privateSubnetId"])


def _check_network(reader: _Reader, region: str | None) -> NetworkPlacement:
    zone = _check_zone(reader, region)
    vpc_cidr = _check_vpc_cidr(reader)
    return NetworkPlacement(zone, vpc_cidr, _check_existing_network(reader, vpc_cidr))


def _check_reservation_zone(
    reader: _Reader, reservation_id: str | None, capacity_block: bool, network: NetworkPlacement
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


def _check_placement_group_name(reader: _Reader) -> str | None:
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
    elif _shell_meta_in(name):
        reader.fail(
            "placementGroupName",
            "may not hold whitespace or shell characters here"
            + _injection_note(name)
            + ". Fix: rename the group or pick another",
        )
    else:
        return name
    return None


def _check_capacity(reader: _Reader, network: NetworkPlacement) -> Capacity:
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


def _check_node_storage(reader: _Reader) -> NodeStorage:
    ami_id = reader.string("amiId")
    if ami_id is not None and not _AMI.match(ami_id):
        reader.fail("amiId", "is not an AMI id such as ami-0123456789abcdef0")
    root_volume_gib = reader.integer("rootVolumeGiB")
    if root_volume_gib is not None and not MIN_ROOT_VOLUME_GIB <= root_volume_gib <= MAX_ROOT_VOLUME_GIB:
        reader.fail(
            "rootVolumeGiB",
            f"must be from {MIN_ROOT_VOLUME_GIB} to {MAX_ROOT_VOLUME_GIB}: the Deep Learning AMI and the vLLM "
            f"virtualenv need about {MIN_ROOT_VOLUME_GIB} GiB",
        )
    file_system_id = reader.string("modelCacheFileSystemId")
    if file_system_id is not None and not _FILE_SYSTEM.match(file_system_id):
        reader.fail(
            "modelCacheFileSystemId",
            "is not an EFS file system id such as fs-0123456789abcdef0. Fix: the id aws efs describe-file-systems "
            "shows (a destroyed stack's kept cache: the command scripts/destroy printed)",
        )
        file_system_id = None
    node_image = _check_node_image(reader, ami_id)
    return NodeStorage(ami_id, root_volume_gib, bool(reader.boolean("retainModelCache")), file_system_id, node_image)


def _check_node_image(reader: _Reader, ami_id: str | None) -> str:
    """nodeImage: bake (the default), none, or an AMI id launched as is. An AMI id beside
    amiId is refused: amiId is the base an image is baked on, nodeImage's id is launched as
    it is, and a node launches from one image."""
    value = reader.string("nodeImage")
    if value is None:
        return NODE_IMAGE_BAKE
    if value in (NODE_IMAGE_BAKE, NODE_IMAGE_NONE):
        return value
    if not _AMI.match(value):
        reader.fail(
            "nodeImage",
            f"is neither {NODE_IMAGE_BAKE}, {NODE_IMAGE_NONE} nor an AMI id such as ami-0123456789abcdef0. Fix: "
            f"pulumi config set {NAMESPACE}:nodeImage {NODE_IMAGE_BAKE} (the stack bakes the node software into an "
            f"image), {NODE_IMAGE_NONE} (every node installs it), or the id of an image you baked",
        )
        return NODE_IMAGE_BAKE
    if ami_id is not None:
        reader.fail(
            "nodeImage",
            f"is an AMI id while amiId is {ami_id}: amiId is the base image the stack bakes on (or launches with "
            f"nodeImage {NODE_IMAGE_NONE}), nodeImage's id an image launched as is. Fix: pulumi config rm "
            f"{NAMESPACE}:amiId, or set nodeImage to {NODE_IMAGE_BAKE} or {NODE_IMAGE_NONE}",
        )
    return value


def _check_api_read_timeout(reader: _Reader) -> int:
    seconds = reader.integer("apiReadTimeoutSeconds")
    if seconds is not None and not 1 <= seconds <= MAX_API_READ_TIMEOUT_SECONDS:
        reader.fail(
            "apiReadTimeoutSeconds",
            f"must be from 1 to {MAX_API_READ_TIMEOUT_SECONDS} seconds. A generation that runs longer should "
            f'stream ("stream": true: each chunk resets the gateway\'s timer). '
            f"Fix: pulumi config set {NAMESPACE}:apiReadTimeoutSeconds {DEFAULT_API_READ_TIMEOUT_SECONDS}",
        )
    return seconds if seconds is not None else DEFAULT_API_READ_TIMEOUT_SECONDS


def _check_api_rate_limit(reader: _Reader) -> int:
    per_second = reader.integer("apiRateLimitPerSecond")
    if per_second is not None and not 0 <= per_second <= MAX_API_RATE_LIMIT_PER_SECOND:
        reader.fail(
            "apiRateLimitPerSecond",
            f"must be from 0 to {MAX_API_RATE_LIMIT_PER_SECOND} requests per second per client; "
            "0 turns the limit off. "
            f"Fix: pulumi config set {NAMESPACE}:apiRateLimitPerSecond {DEFAULT_API_RATE_LIMIT_PER_SECOND}",
        )
    return per_second if per_second is not None else DEFAULT_API_RATE_LIMIT_PER_SECOND


def _check_api_routes(reader: _Reader, engine: EngineSettings) -> tuple[str, ...]:
    """apiRoutes, each a route the gateway knows, once; or the model's routes. Every model
    keeps its probe's route (components/api_routes.py stack_probe): the stack's readiness
    check and vllm-cluster status send it through the gateway."""
    configured = reader.string_list("apiRoutes")
    if not configured:
        return api_routes.default_routes(engine.vllm_extra_args)
    unknown = [route for route in configured if route not in api_routes.KNOWN_ROUTES]
    if unknown:
        reader.fail(
            "apiRoutes",
            f"names {', '.join(map(json.dumps, unknown))}, not a route the gateway forwards. Known routes: "
            f"{', '.join(api_routes.KNOWN_ROUTES)}. Fix: pulumi config set --path '{NAMESPACE}:apiRoutes[0]' "
            f"{api_routes.KNOWN_ROUTES[0]} (one item per route), or pulumi config rm {NAMESPACE}:apiRoutes",
        )
    repeated = sorted({route for route in configured if configured.count(route) > 1})
    if repeated:
        reader.fail("apiRoutes", f"names {', '.join(repeated)} more than once. Fix: list each route once")
    pooling = api_routes.is_pooling(engine.vllm_extra_args)
    if api_routes.model_task(engine.vllm_extra_args) in api_routes.SERVED_TASKS:  # the others: refused above
        probe = api_routes.stack_probe(engine.vllm_extra_args, "")
        if probe.route not in configured:
            reader.fail(
                "apiRoutes",
                f"leaves out {probe.route}, where the stack's readiness check and vllm-cluster status send "
                f"{probe.what} through the gateway to see that the model serves. Fix: add it (pulumi config set "
                f"--path '{NAMESPACE}:apiRoutes[{len(configured)}]' {probe.route})",
            )
    wrong_task = [
        route
        for route in configured
        if route in (api_routes.GENERATION_ROUTES if pooling else api_routes.POOLING_ROUTES)
    ]
    if wrong_task:
        task = "a pooling model (--runner pooling)" if pooling else "a generation model"
        reader.fail(
            "apiRoutes",
            f"names {', '.join(wrong_task)}, which {task} does not serve. Fix: remove them, or change vllmExtraArgs",
        )
    return tuple(configured)


def _check_gateway(reader: _Reader, engine: EngineSettings) -> GatewaySettings:
    gateway_instance_type = reader.string("gatewayInstanceType")
    if gateway_instance_type is not None and not _EC2_TYPE.match(gateway_instance_type):
        reader.fail(
            "gatewayInstanceType",
            f"is not an EC2 instance type such as t3.small (see {INSTANCE_TYPE_NAMES_DOC})",
        )
    return GatewaySettings(
        gateway_instance_type,
        _check_api_read_timeout(reader),
        _check_api_rate_limit(reader),
        _check_api_routes(reader, engine),
    )


def _check_user_certificate(reader: _Reader, secret_keys: set[str] | None) -> UserCertificate | None:
    """tlsCertificate, tlsPrivateKey and endpointHostname: all three or none."""
    certificate = reader.string("tlsCertificate")
    private_key = reader.string("tlsPrivateKey")
    hostname = reader.string("endpointHostname")
    if certificate is None and private_key is None and hostname is None:
        return None
    checks = (
        (
            "tlsCertificate",
            certificate,
            _PEM_CERTIFICATE.search,
            "must be a PEM certificate (-----BEGIN CERTIFICATE-----) when tlsPrivateKey or endpointHostname is set. "
            f"Fix: pulumi config set {NAMESPACE}:tlsCertificate < cert.pem, or unset all three for a generated "
            "certificate",
        ),
        (
            "tlsPrivateKey",
            private_key,
            _PEM_PRIVATE_KEY.search,
            "must be the PEM private key of tlsCertificate. "
            f"Fix: pulumi config set --secret {NAMESPACE}:tlsPrivateKey < key.pem",
        ),
        (
            "endpointHostname",
            hostname,
            _HOSTNAME.match,
            "must be the DNS name in tlsCertificate that clients use (point it at the gatewayPublicIp output), "
            f"e.g. llm.example.com. Fix: pulumi config set {NAMESPACE}:endpointHostname NAME",
        ),
    )
    ok = True
    for key, value, accepts, message in checks:
        if value is None or not accepts(value):
            reader.fail(key, message)
            ok = False
    if not ok or (secret_keys is not None and "tlsPrivateKey" not in secret_keys):
        return None
    return UserCertificate(certificate_pem=certificate, private_key=Secret(private_key), hostname=hostname)


# --- machines the user already has (hosts) -----------------------------------------------

# Keys that configure what the stack creates on AWS: with hosts it creates nothing, so a
# value here would be silently ignored.
CREATED_INSTANCE_KEYS = (
    "availabilityZone",
    "vpcCidr",
    "vpcId",
    "publicSubnetId",
    "privateSubnetId",
    "amiId",
    "nodeImage",
    "capacityReservationId",
    "capacityBlock",
    "placementGroupName",
    "rootVolumeGiB",
    "retainModelCache",
    "modelCacheFileSystemId",
    "gatewayInstanceType",
)
# Keys that describe the user's own machines: without hosts there are none.
OWN_HOST_KEYS = ("gatewayHost", "gatewayPrivateIp", "sshUser", "sshPrivateKey", "modelCacheDir")
_OPENSSH_PRIVATE_KEY = re.compile(r"-----BEGIN (OPENSSH|RSA|EC) PRIVATE KEY-----")
_LOGIN_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_ABSOLUTE_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")


def _hosts_listed(reader: _Reader) -> bool:
    """Whether hosts holds anything (Pulumi passes an array as its JSON text, and its
    default [] along with every other key's)."""
    value = reader.raw.get("hosts")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return bool(value.strip())
    return bool(value)


def _set_beyond_default(reader: _Reader, key: str) -> bool:
    """Set to something other than its default. Pulumi passes every key's Pulumi.yaml
    default to the program, so a key left alone arrives with its default value."""
    if not reader.present(key):
        return False
    default = KEYS_BY_NAME[key].default
    return str(reader.raw[key]).strip().lower() != str(default).lower()


def _ipv4(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 4
    except ValueError:
        return False


def _check_own_hosts(reader: _Reader, secret_keys: set[str] | None) -> OwnHosts | None:
    """hosts and what comes with it; None when the stack creates its instances (and then
    none of the own-host keys may be set)."""
    listed = reader.string_list("hosts")
    if not listed:
        if reader.string_list("hostKeys"):
            reader.fail(
                "hostKeys",
                "applies only to machines you already have, and hosts lists none: the stack generates the host keys "
                f"of the instances it creates. Fix: pulumi config rm {NAMESPACE}:hostKeys",
            )
        for key in OWN_HOST_KEYS:
            # Read first: a value of the wrong type is that problem alone.
            if reader.string(key) is not None:
                reader.fail(
                    key,
                    "applies only to machines you already have, and hosts lists none: the stack creates its own. "
                    f"Fix: pulumi config rm {NAMESPACE}:{key}, or list your hosts with pulumi config set --path "
                    f"'{NAMESPACE}:hosts[0]' 10.0.1.11,10.0.1.12",
                )
        return None
    for key in CREATED_INSTANCE_KEYS:
        if _set_beyond_default(reader, key):
            reader.fail(
                key,
                "configures the EC2 instances the stack creates, and with hosts it creates none (no VPC, "
                f"instance, EFS or security group). Fix: pulumi config rm {NAMESPACE}:{key}",
            )
    gangs = _check_host_gangs(reader, listed)
    gateway = reader.string("gatewayHost")
    if gateway is None or not (_ipv4(gateway) or _HOSTNAME.match(gateway)):
        reader.fail(
            "gatewayHost",
            "is needed with hosts, as an IPv4 address or DNS name: the machine that runs the TLS gateway, "
            "reached over SSH from here and over HTTPS by the API's clients; the stack reaches the hosts through "
            f"it. Fix: pulumi config set {NAMESPACE}:gatewayHost 203.0.113.10",
        )
        gateway = None
    private_ip = reader.string("gatewayPrivateIp")
    if private_ip is None and gateway is not None and _ipv4(gateway):
        private_ip = gateway
    if private_ip is None or not _ipv4(private_ip):
        reader.fail(
            "gatewayPrivateIp",
            "must be the gateway's IPv4 address on the hosts' network when gatewayHost is a DNS name (the "
            f"hosts' Prometheus and readiness checks reach it there). Fix: pulumi config set "
            f"{NAMESPACE}:gatewayPrivateIp 10.0.1.10",
        )
        private_ip = None
    user = reader.string("sshUser") or SSH_USER_DEFAULT
    if not _LOGIN_NAME.match(user):
        reader.fail("sshUser", "is not a login name such as ubuntu. Fix: pulumi config set vllm-cluster:sshUser ubuntu")
    key = reader.string("sshPrivateKey")
    if key is None or not _OPENSSH_PRIVATE_KEY.search(key):
        reader.fail(
            "sshPrivateKey",
            "is needed with hosts: the private key (OpenSSH or PEM) that logs in as sshUser on the gateway and "
            f"every host. Fix: pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/id_ed25519",
        )
        key = None
    elif secret_keys is not None and "sshPrivateKey" not in secret_keys:
        reader.fail(
            "sshPrivateKey",
            "was set in plain text: it would sit unencrypted in the stack file and in state. "
            f"Fix: pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/id_ed25519",
        )
        key = None
    cache = reader.string("modelCacheDir")
    if cache is None or not _ABSOLUTE_PATH.match(cache) or cache.rstrip("/") in ("", "/mnt/vllm-models"):
        reader.fail(
            "modelCacheDir",
            "is needed with hosts: the absolute path of a directory every host has mounted from the same shared "
            "file system (NFS or any shared mount; letters, digits and . _ - / only, not / itself or the "
            f"stack's own mount point /mnt/vllm-models). Fix: pulumi config set {NAMESPACE}:modelCacheDir "
            "/srv/models",
        )
        cache = None
    everything = (gangs, gateway, private_ip, key, cache)
    if any(value is None for value in everything):
        return None
    known = _check_host_keys(reader, gateway, [ip for gang in gangs for ip in gang])
    if known is None:
        return None
    taken = [ip for gang in gangs for ip in gang]
    if private_ip in taken:
        reader.fail(
            "gatewayPrivateIp",
            f"is {private_ip}, which hosts lists as a GPU host too: the gateway needs a machine of its own. Fix: "
            "another machine as gatewayHost",
            raw=private_ip,
        )
        return None
    return OwnHosts(gangs, gateway, private_ip, user, Secret(key), cache.rstrip("/"), known)


def _check_host_keys(reader: _Reader, gateway: str, node_ips: list[str]) -> tuple[str, ...] | None:
    """hostKeys: a known_hosts line for the gateway (as gatewayHost names it) and every
    host (as hosts names it). Without them every connection would trust whoever answers
    at the address and hand it the secrets the stack sends (issue: host keys)."""
    fix = (
        f"Fix: on each machine read its key (cat /etc/ssh/ssh_host_ed25519_key.pub), or run ssh-keyscan -t ed25519 "
        f"{gateway} {' '.join(node_ips)} from a host you trust and compare each fingerprint (ssh-keygen -lf) with the "
        f"machine's own, then pulumi config set --path '{NAMESPACE}:hostKeys[0]' '{gateway} ssh-ed25519 AAAA...' "
        "(one item per machine)"
    )
    lines = reader.string_list("hostKeys") or []
    try:
        found = host_keys.keys_by_host(lines)
    except host_keys.KnownHostsError as error:
        reader.fail("hostKeys", f"{error}. {fix}")
        return None
    missing = [address for address in [gateway, *node_ips] if address not in found]
    if missing:
        reader.fail(
            "hostKeys",
            f"has no key for {', '.join(missing)}: the stack pins the SSH host key of the gateway and of every host "
            f"before it logs in, so nobody else answering at an address receives the keys and tokens it sends. {fix}",
        )
        return None
    return tuple(line.strip() for line in lines if line.strip())


def _check_host_gangs(reader: _Reader, listed: list[str]) -> tuple[tuple[str, ...], ...] | None:
    """Each gang's hosts: IPv4 addresses, none listed twice, every gang the same size (a
    gang is one copy of the model, laid over its nodes the same way)."""
    gangs, seen, ok = [], set(), True
    for position, item in enumerate(listed):
        ips = tuple(part.strip() for part in item.split(","))
        for ip in ips:
            if not _ipv4(ip):
                reader.fail(
                    "hosts",
                    f"item {position} holds {json.dumps(ip)}, which is not an IPv4 address: each item is one gang's "
                    f"hosts, their private IPs separated by commas, head first. Fix: pulumi config set --path "
                    f"'{NAMESPACE}:hosts[{position}]' 10.0.1.11,10.0.1.12",
                )
                ok = False
            elif ip in seen:
                reader.fail(
                    "hosts",
                    f"lists {ip} twice: every node is a host of its own (one Ray node, its own GPUs). "
                    "Fix: list each host once",
                )
                ok = False
            seen.add(ip)
        gangs.append(ips)
    sizes = sorted({len(gang) for gang in gangs})
    if len(sizes) > 1:
        reader.fail(
            "hosts",
            f"has gangs of {' and '.join(map(str, sizes))} hosts: every gang serves the same model laid over its "
            "hosts the same way, so each needs as many. Fix: the same number of hosts in every item",
        )
        ok = False
    if len(gangs) > MAX_REPLICAS:
        reader.fail("hosts", f"has {len(gangs)} gangs; at most {MAX_REPLICAS} (replicas) serve behind one gateway")
        ok = False
    return tuple(gangs) if ok else None


def _own_hosts_shape(reader: _Reader, own: OwnHosts) -> tuple[int, int]:
    """nodes and replicas, as hosts lays them out; a nodes or replicas set to other
    figures would contradict it."""
    nodes, replicas = len(own.gangs[0]), len(own.gangs)
    for key, value in (("nodes", nodes), ("replicas", replicas)):
        if _set_beyond_default(reader, key) and reader.integer(key) != value:
            reader.fail(
                key,
                f"contradicts hosts, which lists {replicas} gang(s) of {nodes} host(s). Fix: pulumi config rm "
                f"{NAMESPACE}:{key} (hosts says it)",
            )
    return nodes, replicas


def _check_idle_stop(reader: _Reader) -> int | None:
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
    if reader.string("capacityReservationId") is not None or _set_beyond_default(reader, "capacityBlock"):
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
    if _hosts_listed(reader):
        reader.fail(
            "idleStopMinutes",
            f"is {minutes} with {NAMESPACE}:hosts set: those are machines of your own, and once one powers itself "
            "off nothing in the stack can start it again (the gateway wakes EC2 instances through EC2's "
            f"StartInstances). Fix: pulumi config rm {NAMESPACE}:idleStopMinutes",
        )
        refused = True
    return None if refused else minutes


def _check_wake_give_up(reader: _Reader, idle_stop_minutes: int | None) -> int | None:
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


def _check_max_replicas(reader: _Reader, replicas: int | None, idle_stop_minutes: int | None) -> int | None:
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
    if not 1 <= most <= MAX_REPLICAS:
        reader.fail(
            "maxReplicas",
            f"must be from 1 to {MAX_REPLICAS}: every gang of the stack, the `replicas` that always serve and the "
            f"warm ones the gateway starts when requests queue. Fix: pulumi config set {NAMESPACE}:maxReplicas "
            f"{max(replicas + 1, 2)}, or pulumi config rm {NAMESPACE}:maxReplicas for replicas ({replicas})",
        )
        return None
    if most < replicas:
        reader.fail(
            "maxReplicas",
            f"is {most}, below replicas ({replicas}): the gangs that always serve are among the stack's gangs. "
            f"Fix: pulumi config set {NAMESPACE}:maxReplicas {replicas} or more, or pulumi config rm "
            f"{NAMESPACE}:maxReplicas",
        )
        return None
    if most == replicas:
        return most
    key = "replicas" if replicas == 0 else "maxReplicas"
    what = (
        f"replicas is 0 (every gang may sleep; maxReplicas {most})"
        if replicas == 0
        else f"maxReplicas is {most}, above replicas ({replicas})"
    )
    refused = False
    if reader.string("capacityReservationId") is not None or _set_beyond_default(reader, "capacityBlock"):
        reservation = "capacityReservationId" if reader.present("capacityReservationId") else "capacityBlock"
        reader.fail(
            key,
            f"{what} with {NAMESPACE}:{reservation} set: reserved capacity is paid whether its instances run or "
            "not, so a warm gang kept stopped saves nothing. Fix: pulumi config rm "
            f"{NAMESPACE}:maxReplicas and set {NAMESPACE}:replicas to the gangs you want (or drop the "
            f"reservation: pulumi config rm {NAMESPACE}:{reservation})",
            raw=reader.raw.get(key),
        )
        refused = True
    if _hosts_listed(reader):
        reader.fail(
            key,
            f"{what} with {NAMESPACE}:hosts set: a warm gang is kept stopped and started by the gateway through "
            f"EC2, and nothing can start machines of your own. Fix: pulumi config rm {NAMESPACE}:maxReplicas",
            raw=reader.raw.get(key),
        )
        refused = True
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
    if refused or refused_idle_stop:
        return None
    return most


def _check_fabric_floor(reader: _Reader) -> float | None:
    """fabricFloorGBps: a bus bandwidth in GB/s above 0 and at most MAX_FABRIC_FLOOR_GBPS."""
    floor = reader.number("fabricFloorGBps")
    if floor is None:
        return None
    if not 0 < floor <= MAX_FABRIC_FLOOR_GBPS:
        reader.fail(
            "fabricFloorGBps",
            f"must be a bus bandwidth in GB/s above 0 and at most {MAX_FABRIC_FLOOR_GBPS} (GB/s, not Gbps: "
            "p5.48xlarge's 3200 Gbps is 400 GB/s). Fix: pulumi config set "
            f"{NAMESPACE}:fabricFloorGBps 12.5, or pulumi config rm {NAMESPACE}:fabricFloorGBps for the instance "
            "type's floor",
        )
        return None
    return floor


def _check_stage_volume(reader: _Reader) -> str | None:
    """stageVolume: auto (None here: resolved once the spec is whole), instance-store or ebs.
    Refused with hosts: machines of the user's own get no EC2 volume, and their stage goes
    where modelCacheDir's host puts it."""
    value = reader.string("stageVolume")
    if value is None or value == stage_volume.STAGE_VOLUME_AUTO:
        return None
    if value not in stage_volume.STAGE_VOLUME_CHOICES:
        reader.fail(
            "stageVolume",
            f"is neither {', '.join(stage_volume.STAGE_VOLUME_CHOICES)}: where each GPU node keeps its copy of its "
            f"pipeline stages. Fix: pulumi config set {NAMESPACE}:stageVolume {stage_volume.STAGE_VOLUME_AUTO} "
            "(a gp3 volume that a stop keeps when idleStopMinutes is set and it wakes faster), "
            f"{stage_volume.STAGE_VOLUME_EBS} or {stage_volume.STAGE_VOLUME_INSTANCE_STORE}",
        )
        return None
    if _hosts_listed(reader):
        reader.fail(
            "stageVolume",
            f"is {value} with {NAMESPACE}:hosts set: those are machines of your own, which get no EC2 volume and no "
            f"instance store from the stack. Fix: pulumi config rm {NAMESPACE}:stageVolume",
        )
        return None
    return value


def _resolve_stage_volume(spec: ClusterSpec, chosen: str | None) -> str:
    """stageVolume auto: ebs when idleStopMinutes is set, the stack serves from each node's
    local copy of its stage (sizing.serves_from_local_disk: the volume only changes which disk
    is under that copy's path, never vLLM's path) and the wake with the stage volume is the
    shorter by at least a Retry-After (idle_stop.stage_volume_wakes_faster), else the
    instance store. ebs on a stack that serves from the EFS cache is refused: there is no
    local copy to keep."""
    local, reason = sizing.serves_from_local_disk(spec)
    if chosen == stage_volume.STAGE_VOLUME_EBS and not local:
        raise SpecError(
            [
                Problem(
                    "stageVolume",
                    chosen,
                    f"the stack serves from the EFS cache, not from a local copy of each node's stage ({reason}), "
                    f"so there is no stage for a volume to keep. Fix: pulumi config rm {NAMESPACE}:stageVolume, or "
                    "choose an instance type whose instance store holds the stage",
                )
            ]
        )
    if chosen is not None:
        return chosen
    if (
        spec.own_hosts is None
        and spec.idle_stop_minutes
        and local
        and idle_stop.stage_volume_wakes_faster(spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size)
    ):
        return stage_volume.STAGE_VOLUME_EBS
    return stage_volume.STAGE_VOLUME_INSTANCE_STORE


def load_spec(
    raw: Mapping[str, Any],
    *,
    stack: str,
    region: str | None = None,
    secret_keys: set[str] | None = None,
) -> ClusterSpec:
    """Validate `raw` (config key without namespace -> value) and return the spec.

    `region` is the stack's aws:region, which an availabilityZone must lie in; None
    skips that check. `secret_keys` names the keys (without namespace) that were set
    with --secret; None skips that check (for callers that hold no stack, such as the
    planner).

    Raises SpecError with every problem found. Warnings that should not stop a
    deployment are returned in `spec.warnings`.
    """
    reader = _Reader(raw)
    _check_known_keys(reader)
    source = _check_model_source(reader)
    engine = _check_engine_settings(reader)
    own = _check_own_hosts(reader, secret_keys)
    shape = _check_cluster_shape(reader, own)
    exposure = _check_exposure(reader)
    secrets = _check_secrets(reader, secret_keys)
    software = _check_node_software(reader)
    network = _check_network(reader, region)
    capacity = _check_capacity(reader, network)
    storage = _check_node_storage(reader)
    if own is not None:
        # Machines the user has: nothing is launched, so no image (nodeImage set is refused above).
        storage = dataclasses.replace(storage, node_image=NODE_IMAGE_NONE)
    gateway = _check_gateway(reader, engine)
    tls = _check_user_certificate(reader, secret_keys)
    idle_stop_minutes = _check_idle_stop(reader)
    wake_give_up_minutes = _check_wake_give_up(reader, idle_stop_minutes)
    max_replicas = _check_max_replicas(reader, shape.replicas, idle_stop_minutes)
    fabric_floor_gbps = _check_fabric_floor(reader)
    chosen_stage_volume = _check_stage_volume(reader)
    _check_engine_fit(reader, source, engine, shape)
    if reader.problems:
        raise SpecError(reader.problems)
    pieces = (source, engine, shape, exposure, secrets, software, network, capacity, storage, gateway)
    spec = ClusterSpec(
        stack=stack,
        **{name: value for piece in pieces for name, value in _fields(piece).items()},
        tls=tls,
        warnings=tuple(reader.warnings),
        own_hosts=own,
        idle_stop_minutes=idle_stop_minutes,
        wake_give_up_minutes=wake_give_up_minutes,
        fabric_floor_gbps=fabric_floor_gbps,
        max_replicas=max_replicas,
    )
    spec = dataclasses.replace(spec, stage_volume=_resolve_stage_volume(spec, chosen_stage_volume))
    if idle_stop_minutes:
        # The wake the planner prints and the waker is told (components/idle_stop.py).
        wake = idle_stop.expected_wake_seconds(
            spec.model, spec.instance, spec.nodes, spec.pipeline_parallel_size, spec.on_stage_volume
        )
        warnings = [
            idle_stop.short_idle_warning(idle_stop_minutes, wake, spec.nodes, spec.instance.price_per_hour_usd),
            idle_stop.short_give_up_warning(wake_give_up_minutes, wake),
        ]
        spec = dataclasses.replace(spec, warnings=(*spec.warnings, *(w for w in warnings if w)))
    return spec


# The EFS page that states it: mounting by the file system's DNS name needs the Amazon
# DNS server and DNS hostnames in the client's VPC.
EFS_DNS_NAME_DOC = "https://docs.aws.amazon.com/efs/latest/ug/mounting-fs-mount-cmd-dns-name.html"


def existing_vpc_problems(vpc_id: str, dns_support: bool, dns_hostnames: bool) -> list[Problem]:
    """What an existing VPC (vpcId, looked up by the program) lacks for the model cache:
    the nodes mount EFS by its DNS name, which resolves only with the VPC's DNS support
    and DNS hostnames on. Support first: hostnames cannot be enabled without it."""
    missing = [
        ("enableDnsSupport", "DNS resolution", "--enable-dns-support", dns_support),
        ("enableDnsHostnames", "DNS hostnames", "--enable-dns-hostnames", dns_hostnames),
    ]
    return [
        Problem(
            "vpcId",
            _show("vpcId", vpc_id),
            f"has {attribute} off ({label}): the nodes mount the EFS model cache by its DNS name, which never "
            "resolves in this VPC, so node setup would wait ten minutes and fail. "
            f"Fix: aws ec2 modify-vpc-attribute --vpc-id {vpc_id} {flag} (see {EFS_DNS_NAME_DOC})",
        )
        for attribute, label, flag, enabled in missing
        if not enabled
    ]


# EFS: "you can create mount targets for a file system in only one VPC, and there can be only
# one mount target per Availability Zone"; a One Zone file system takes its one mount target only
# in its own zone (aws efs create-mount-target,
# https://docs.aws.amazon.com/cli/latest/reference/efs/create-mount-target.html).
EFS_MOUNT_TARGETS_DOC = "https://docs.aws.amazon.com/efs/latest/ug/manage-fs-access-create-delete-mount-targets.html"


@dataclass(frozen=True)
class ExistingMountTarget:
    mount_target_id: str
    vpc_id: str
    availability_zone: str
    # The stack's own (its interface carries the stack's efs group): made by an earlier
    # `pulumi up` of this stack, which this one updates.
    own: bool = False


def model_cache_sharing_problems(file_system_id: str, foreign_access_points: list[str]) -> list[Problem]:
    """An existing file system (modelCacheFileSystemId) that others reach through access
    points of their own: the stack replaces its file system policy with one that lets
    clients in only through the stack's access points (components/storage.py), which would
    lock them out."""
    if not foreign_access_points:
        return []
    first = sorted(foreign_access_points)[0]
    return [
        Problem(
            "modelCacheFileSystemId",
            _show("modelCacheFileSystemId", file_system_id),
            f"has access points this stack does not own ({', '.join(sorted(foreign_access_points))}: another "
            "stack's or user's, by their tags): the stack would replace the file system's policy with one that "
            "admits clients only through its own access points, and lock them out. Fix: give this stack a file "
            f"system of its own (pulumi config rm {NAMESPACE}:modelCacheFileSystemId), or remove those access "
            f"points if nothing uses them (aws efs delete-access-point --access-point-id {first})",
        )
    ]


def model_cache_problems(
    file_system_id: str,
    one_zone: str | None,
    mount_targets: list[ExistingMountTarget],
    stack_vpc_id: str | None,
    stack_zone: str,
) -> list[Problem]:
    """What keeps an existing file system (modelCacheFileSystemId, looked up by the program)
    from taking the stack's own mount target in the node subnet. `stack_vpc_id` is None for
    a VPC the stack creates, in which no mount target can be yet."""
    problems = []
    shown = _show("modelCacheFileSystemId", file_system_id)
    mount_targets = [target for target in mount_targets if not target.own]
    if one_zone is not None and one_zone != stack_zone:
        problems.append(
            Problem(
                "modelCacheFileSystemId",
                shown,
                f"is a One Zone file system in {one_zone}, but the nodes run in {stack_zone}: EFS creates its mount "
                f"target only in its own zone. Fix: pulumi config set {NAMESPACE}:availabilityZone {one_zone} "
                f"(or the private subnet of that zone with vpcId), or pulumi config rm {NAMESPACE}:"
                f"modelCacheFileSystemId for a new file system (see {EFS_MOUNT_TARGETS_DOC})",
            )
        )
    elsewhere = [t for t in mount_targets if t.vpc_id != stack_vpc_id]
    if elsewhere:
        where = ", ".join(f"{t.mount_target_id} in {t.vpc_id}" for t in elsewhere)
        vpc = stack_vpc_id or "the VPC this stack creates"
        problems.append(
            Problem(
                "modelCacheFileSystemId",
                shown,
                f"has mount targets in another VPC ({where}), and EFS gives a file system mount targets in one VPC "
                f"only: the stack's in {vpc} would be refused. Fix: aws efs delete-mount-target --mount-target-id "
                f"{elsewhere[0].mount_target_id} for each (if nothing there uses it), or deploy into that VPC with "
                f"vpcId (see {EFS_MOUNT_TARGETS_DOC})",
            )
        )
    same_zone = [t for t in mount_targets if t.vpc_id == stack_vpc_id and t.availability_zone == stack_zone]
    for target in same_zone:
        problems.append(
            Problem(
                "modelCacheFileSystemId",
                shown,
                f"already has mount target {target.mount_target_id} in {stack_zone}, the nodes' zone, and EFS allows "
                f"one mount target per zone: the stack's own would be refused. Fix: aws efs delete-mount-target "
                f"--mount-target-id {target.mount_target_id} (if nothing else mounts through it), or another "
                f"availabilityZone (see {EFS_MOUNT_TARGETS_DOC})",
            )
        )
    return problems


def host_instance_type(gpus: int, memory_gib: float) -> InstanceType:
    """A stack of hosts without a catalog type (gpusPerNode, gpuMemoryGiB): its GPUs are
    all that is known of it."""
    return InstanceType(
        name=f"host with {gpus} GPU(s) of {memory_gib} GiB",
        gpus=gpus,
        gpu_model="",
        gpu_memory_gib=float(memory_gib),
        vcpus=0,
        memory_gib=0,
        efa_supported=False,
        max_efa_interfaces=0,
        network_cards=1,
        network_gbps=0,
        price_per_hour_usd=0.0,
        price_date="",
        figures_source="the stack's gpusPerNode and gpuMemoryGiB",
        price_source="your own hosts: the stack pays for none",
    )
