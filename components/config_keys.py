"""The config contract: every `vllm-cluster:*` key the program reads, its Pulumi.yaml
type, description and default.

One table feeds three readers: tools/render_pulumi_yaml.py writes Pulumi.yaml's
`config:` block from it, tools/render_config_reference.py writes
docs/configuration-reference.md from it (tests/test_readme.py holds the file to it), and
components/spec/ validates a stack against it. Pure data, no cloud calls.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping

from components import api_routes, versions

NAMESPACE = "vllm-cluster"

DEFAULT_VPC_CIDR = "10.42.0.0/16"
DEFAULT_ROOT_VOLUME_GIB = 200
DEFAULT_GATEWAY_INSTANCE_TYPE = "t3.small"
# The gateway's API limits. 600 s covers a non-streamed completion of a few thousand
# tokens from a 70B model (say 8,000 tokens at 20 a second: 400 s) and frees the connection
# of a hung request within ten minutes; longer generations should stream (each chunk resets
# the timer). Above an hour a stuck request holds a connection for longer than any client
# waits: stream instead.
DEFAULT_API_READ_TIMEOUT_SECONDS = 600
MAX_API_READ_TIMEOUT_SECONDS = 3600
# Per client address, off by default (issue 48): an inference client (a backend, a batch
# job, a benchmark) opens many requests at once, and 20 a second with a burst of 40
# refused 212 of 256 requests at 64 in flight. Where asked it stops a runaway script.
# Every client behind one NAT shares it.
DEFAULT_API_RATE_LIMIT_PER_SECOND = 0
# Requests in flight per API key and per client address (nginx limit_conn), off by default:
# one client may use the whole stack's capacity. The bound: far above any stack's streams
# (components/gateway_capacity.py: 16 gangs of 1,024 are 65,536), so a typo is caught.
DEFAULT_API_MAX_REQUESTS_IN_FLIGHT = 0
MAX_API_REQUESTS_IN_FLIGHT = 100000
# Gangs behind one gateway: its nginx and a t3.small carry far more, but every gang is
# `nodes` GPU instances and the roll takes one engine start per gang.
MAX_REPLICAS = 16
MAX_API_RATE_LIMIT_PER_SECOND = 10000
# idleStopMinutes: at most a week. A longer wait saves next to nothing over never stopping,
# and a typo of minutes for seconds (3600) is still caught as out of range.
MAX_IDLE_STOP_MINUTES = 7 * 24 * 60
# wakeGiveUpMinutes: from 5 minutes (no stack's wake is shorter, and the waker's retries,
# 30 s doubling, get a few tries in) to a day (a GPU node started for nothing is not left
# running longer unseen).
MIN_WAKE_GIVE_UP_MINUTES = 5
MAX_WAKE_GIVE_UP_MINUTES = 24 * 60
# fabricFloorGBps: above any fabric EC2 offers (p5's 3200 Gbps is 400 GB/s), so a typo of
# Gbps for GB/s is still caught.
MAX_FABRIC_FLOOR_GBPS = 1000


@dataclass(frozen=True)
class ConfigKey:
    """One config key as Pulumi.yaml declares it.

    Pulumi makes every declared key without a default required, and refuses a
    plaintext default on a key declared `secret: true`. So optional keys carry a
    default that means "not set" (`auto`): "" for strings, 0 for numbers, "auto"
    for efa; the program derives the real value. The two secrets (hfToken,
    apiKey) are declared as plain optional strings, and the program itself
    refuses them unless they were set with --secret.
    """

    name: str
    type: str  # Pulumi.yaml config type: string, integer, boolean or array (of strings)
    description: str
    default: Any = None  # the Pulumi.yaml default; None for a required key
    auto: bool = False  # the default means "derive it", as the description says
    secret: bool = False  # must be set with `pulumi config set --secret`

    @property
    def required(self) -> bool:
        return self.default is None


# fmt: off
CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("model", "string",
              "Hugging Face repo id of the model to serve, e.g. Qwen/Qwen2.5-1.5B-Instruct."),
    ConfigKey("modelRevision", "string",
              "Branch, tag or commit of the model to stage and serve.", default="main"),
    ConfigKey("hfEndpoint", "string",
              "Hugging Face Hub (or mirror) URL models are downloaded from. Empty: https://huggingface.co.",
              default="", auto=True),
    ConfigKey("instanceType", "string",
              "GPU instance type for every node; one of the catalog's types. Required unless hosts is set "
              "(then optional: the catalog type whose GPUs the hosts have).",
              default="", auto=True),
    ConfigKey("nodes", "integer",
              "Number of GPU nodes: one head plus nodes - 1 workers.", default=1),
    ConfigKey("replicas", "integer",
              "Copies of the model: independent gangs of `nodes` nodes each (own Ray cluster and placement "
              "group) behind the one gateway, which balances across them and rolls changes one gang at a time. "
              "0 (every gang may sleep) only with maxReplicas and idleStopMinutes.",
              default=1),
    ConfigKey("maxReplicas", "integer",
              "Warm pool (issue 36): every gang the stack creates, the `replicas` that always serve and warm "
              "gangs, set up at `pulumi up` and then kept stopped, that the gateway starts when requests stay "
              "queued. Needs idleStopMinutes; not with capacityReservationId, capacityBlock or hosts; at "
              f"least replicas, 1 to {MAX_REPLICAS}. 0: replicas.",
              default=0, auto=True),
    ConfigKey("tensorParallelSize", "integer",
              "Tensor-parallel size; stays inside one node. 0: the GPUs of one node.", default=0, auto=True),
    ConfigKey("pipelineParallelSize", "integer",
              "Pipeline-parallel size; stages span nodes. 0: the number of nodes.", default=0, auto=True),
    ConfigKey("efa", "string",
              "EFA interfaces: true, false, or auto (on when the type supports EFA and nodes > 1).",
              default="auto", auto=True),
    ConfigKey("apiAllowedCidrs", "array",
              "CIDRs that may call the HTTPS API on the gateway."),
    ConfigKey("adminCidrs", "array",
              "CIDRs that may SSH to the gateway and reach the Ray dashboard. Never 0.0.0.0/0."),
    ConfigKey("allowPublicApi", "boolean",
              "Must be true to put 0.0.0.0/0 or ::/0 in apiAllowedCidrs.", default=False),
    ConfigKey("hfToken", "string",
              "Hugging Face token for gated models. Secret: set it with --secret. Empty: none.",
              default="", auto=True, secret=True),
    ConfigKey("apiKey", "string",
              "API key clients send as a Bearer token, 32+ characters; the gateway checks it before a request "
              "reaches a gang. Secret: set it with --secret. Empty: generated.",
              default="", auto=True, secret=True),
    ConfigKey("previousApiKey", "string",
              "To rotate apiKey without downtime: the old key, still accepted beside the new apiKey until "
              "clients have moved; then remove it. Secret: set it with --secret. Empty: no second key.",
              default="", auto=True, secret=True),
    ConfigKey("vllmVersion", "string",
              f"vLLM version on every node (floor {versions.VLLM_MIN_VERSION}). "
              "Empty: the version pinned in components/versions.py.",
              default="", auto=True),
    ConfigKey("rayVersion", "string",
              f"Ray version on every node (floor {versions.RAY_MIN_VERSION}). "
              "Empty: the version pinned in components/versions.py.",
              default="", auto=True),
    ConfigKey("nodeLock", "string",
              "The nodes' Python environment: a hash-locked requirements file (path from the project "
              "directory) holding vllmVersion, rayVersion and uv; every node installs exactly it, offline "
              "from the wheelhouse on the model cache. Empty: the checked-in lock of the pinned versions "
              "(locks/). Make one with tools/lock_node_env.py.",
              default="", auto=True),
    ConfigKey("maxModelLen", "integer",
              "vLLM --max-model-len. 0: the model's own context length.", default=0, auto=True),
    ConfigKey("gpuMemoryUtilization", "string",
              "vLLM --gpu-memory-utilization, a number in (0, 1] such as 0.90. Empty: vLLM's default.",
              default="", auto=True),
    ConfigKey("servedModelName", "string",
              "Model name clients send. Empty: the model id.", default="", auto=True),
    ConfigKey("vllmExtraArgs", "array",
              "Further vllm serve arguments, one array item per word. A pooling model says its task: "
              "--runner pooling --pooler-config.task embed, classify or token_embed, or --convert embed or "
              "classify (vllm serve has no --task).", default=[]),
    ConfigKey("availabilityZone", "string",
              "Zone for every node. Empty: the first zone of the region that offers instanceType.",
              default="", auto=True),
    ConfigKey("vpcCidr", "string",
              "CIDR of the new VPC, /16 to /24.", default=DEFAULT_VPC_CIDR),
    ConfigKey("vpcId", "string",
              "Existing VPC to deploy into, with publicSubnetId and privateSubnetId. Empty: a new VPC.",
              default="", auto=True),
    ConfigKey("publicSubnetId", "string",
              "Existing public subnet (route to an internet gateway) for the gateway.", default="", auto=True),
    ConfigKey("privateSubnetId", "string",
              "Existing private subnet (route to a NAT) for the GPU nodes.", default="", auto=True),
    ConfigKey("amiId", "string",
              "GPU node AMI. Empty: the newest AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04).",
              default="", auto=True),
    ConfigKey("nodeImage", "string",
              "The GPU nodes' machine image: bake (the node software, the lock's environment included, installed "
              "once into an image by EC2 Image Builder on the base image, amiId or the newest Deep Learning AMI; "
              "named and tagged by the lock's hash and the base, so every stack of the same lock and base reuses "
              "it, and pulumi destroy keeps it), an AMI id (an image you baked; launched as is, setup checks its "
              "environment), or none (every node installs the software at its first setup). Empty: bake; "
              "none with hosts.",
              default="", auto=True),
    ConfigKey("capacityReservationId", "string",
              "Launch the GPU nodes into this On-Demand Capacity Reservation or Capacity Block (cr-...). "
              "Empty: none.",
              default="", auto=True),
    ConfigKey("capacityBlock", "boolean",
              "capacityReservationId is a Capacity Block for ML (launched with market type capacity-block).",
              default=False),
    ConfigKey("placementGroupName", "string",
              "Existing cluster placement group for the GPU nodes, such as the one a capacity reservation was "
              "made in. Empty: the stack creates one per gang when nodes > 1 or EFA is on, none when the nodes "
              "launch into capacityReservationId (the reservation places them).",
              default="", auto=True),
    ConfigKey("rootVolumeGiB", "integer",
              "Size of each GPU node's encrypted gp3 root volume in GiB.", default=DEFAULT_ROOT_VOLUME_GIB),
    ConfigKey("tlsCertificate", "string",
              "PEM certificate (with its chain) for the gateway's HTTPS. Empty: a self-signed certificate for "
              "the gateway's IP, generated in the stack.",
              default="", auto=True),
    ConfigKey("tlsPrivateKey", "string",
              "PEM private key of tlsCertificate. Secret: set it with --secret.",
              default="", auto=True, secret=True),
    ConfigKey("endpointHostname", "string",
              "DNS name clients use for the gateway; required with tlsCertificate (it must be in the "
              "certificate).",
              default="", auto=True),
    ConfigKey("retainModelCache", "boolean",
              "Keep the EFS model cache (and the models on it) on pulumi destroy.", default=False),
    ConfigKey("modelCacheFileSystemId", "string",
              "Reuse this existing EFS file system (fs-...) as the model cache, such as one a destroyed stack kept "
              "with retainModelCache: the stack adds its own mount target, access point and TLS-only policy and "
              "never deletes the file system. It must have no mount target in another VPC or in the stack's zone. "
              "Empty: a new file system.",
              default="", auto=True),
    ConfigKey("gatewayInstanceType", "string",
              "Instance type of the gateway (no GPU).", default=DEFAULT_GATEWAY_INSTANCE_TYPE),
    ConfigKey("apiReadTimeoutSeconds", "integer",
              "Seconds the gateway waits for the next bytes of a response before it answers 504; "
              f"1 to {MAX_API_READ_TIMEOUT_SECONDS}. Generations longer than this need \"stream\": true.",
              default=DEFAULT_API_READ_TIMEOUT_SECONDS),
    ConfigKey("apiRoutes", "array",
              "The API routes the gateway forwards, each behind the API key; every other path gets 404. Any of "
              f"{', '.join(api_routes.KNOWN_ROUTES)}. Empty: the model's routes "
              f"({', '.join(api_routes.DEFAULT_GENERATION_ROUTES)}; for a pooling model, whose task vllmExtraArgs "
              f"say: embed or token_embed {', '.join(api_routes.TASK_ROUTES[api_routes.EMBED])}, classify "
              f"{', '.join(api_routes.TASK_ROUTES[api_routes.CLASSIFY])}). Must keep the route of the stack's own "
              "probe: /v1/completions, /v1/embeddings, /classify or, for token_embed, /v1/score.",
              default=[]),
    ConfigKey("apiRateLimitPerSecond", "integer",
              "API requests per second per client address at the gateway (burst: twice as many, refused beyond "
              f"it with 429 and Retry-After), up to {MAX_API_RATE_LIMIT_PER_SECOND}. Clients behind one NAT share "
              "it. 0: no limit.",
              default=DEFAULT_API_RATE_LIMIT_PER_SECOND),
    ConfigKey("apiMaxRequestsInFlightPerKey", "integer",
              "API requests one API key may have in flight at the gateway at once (apiKey and previousApiKey "
              "each; the stack's own probe key never counts); one more is refused with 429 and Retry-After. "
              f"Up to {MAX_API_REQUESTS_IN_FLIGHT}. 0: no limit beyond the gateway's capacity.",
              default=DEFAULT_API_MAX_REQUESTS_IN_FLIGHT),
    ConfigKey("apiMaxRequestsInFlightPerAddress", "integer",
              "API requests one client address may have in flight at the gateway at once (clients behind one "
              f"NAT share it); one more is refused with 429 and Retry-After. Up to {MAX_API_REQUESTS_IN_FLIGHT}. "
              "0: no limit beyond the gateway's capacity.",
              default=DEFAULT_API_MAX_REQUESTS_IN_FLIGHT),
    ConfigKey("idleStopMinutes", "integer",
              "Stop a gang's GPU instances after this many minutes without a request (EC2 stop: no instance "
              "charge while stopped); the gateway starts them again on the next request and answers 503 with "
              f"Retry-After meanwhile. 1 to {MAX_IDLE_STOP_MINUTES}. Not with capacityReservationId or hosts. "
              "0: never stop.",
              default=0, auto=True),
    ConfigKey("wakeGiveUpMinutes", "integer",
              "With idleStopMinutes: how long a wake may take before the gateway gives it up, stops what it "
              f"started and says why. {MIN_WAKE_GIVE_UP_MINUTES} to {MAX_WAKE_GIVE_UP_MINUTES}. 0: three "
              "expected wakes (`plan` shows the wake), at least 15 min.",
              default=0, auto=True),
    ConfigKey("fabricFloorGBps", "string",
              "The bus bandwidth in GB/s (nccl-tests' busbw) a gang's all-reduce must reach before vLLM starts, "
              "or `pulumi up` fails naming the figure; a number above 0, up to "
              f"{MAX_FABRIC_FLOOR_GBPS}. Gangs of one node have no gate. Empty: a quarter of the instance type's "
              "network bandwidth (components/fabric.py).",
              default="", auto=True),
    ConfigKey("stageVolume", "string",
              "Where each GPU node keeps its copy of its pipeline stages: instance-store (the instance store, "
              "empty after a stop, so every wake copies the stage again), ebs (a gp3 volume per node sized for "
              "its stage at 2,000 MiB/s, which a stop keeps; billed stopped or not: `plan` shows both wakes and "
              "the cost), or auto: ebs when idleStopMinutes is set and it wakes at least 30 s (one "
              "Retry-After) faster and the stack serves from a local copy of its stage. A change reaches nodes "
              "created from then on; running nodes keep their stage where it is. Not with hosts.",
              default="auto"),
    # Machines the user already has (components/own_hosts.py): none of the AWS resources.
    ConfigKey("hosts", "array",
              "Run on GPU machines you already have instead of creating EC2 instances: one item per gang, "
              "its hosts' private IPs separated by commas, head first (\"10.0.1.11,10.0.1.12\"). The stack "
              "reaches them through gatewayHost and creates no AWS resource. Empty: the stack creates instances.",
              default=[]),
    ConfigKey("gatewayHost", "string",
              "With hosts: the gateway machine's address (IP or DNS name) as this machine and the API's "
              "clients reach it over SSH and HTTPS.",
              default="", auto=True),
    ConfigKey("gatewayPrivateIp", "string",
              "With hosts: the gateway's IP on the GPU hosts' network, the address it reaches them from "
              "(their firewall admits it). Empty: gatewayHost (then an IP).",
              default="", auto=True),
    ConfigKey("hostKeys", "array",
              "With hosts: the SSH host key of the gateway and of every host, as known_hosts lines "
              "(\"192.0.2.11 ssh-ed25519 AAAA...\", one item each, named as gatewayHost and hosts name them). "
              "Every connection pins them; a host without one is refused.",
              default=[]),
    ConfigKey("sshUser", "string",
              "With hosts: the login user on the gateway and every host, with passwordless sudo. "
              "Empty: ubuntu.",
              default="", auto=True),
    ConfigKey("sshPrivateKey", "string",
              "With hosts: the OpenSSH private key that logs in as sshUser on the gateway and every host. "
              "Secret: pulumi config set --secret vllm-cluster:sshPrivateKey < key.",
              default="", auto=True, secret=True),
    ConfigKey("modelCacheDir", "string",
              "With hosts: a directory every host has mounted from the same shared file system (NFS or any "
              "shared mount), where the model cache and the wheelhouse live.",
              default="", auto=True),
    ConfigKey("gpusPerNode", "integer",
              "With hosts and no instanceType: GPUs in each host. 0: from instanceType.",
              default=0, auto=True),
    ConfigKey("gpuMemoryGiB", "integer",
              "With hosts and no instanceType: memory of one GPU in GiB. 0: from instanceType.",
              default=0, auto=True),
)
# fmt: on

KEYS_BY_NAME = {key.name: key for key in CONFIG_KEYS}


def unknown_keys(raw: Mapping[str, Any]) -> list[str]:
    """The keys of `raw` the program does not read, sorted so errors are deterministic.
    Compared as text: YAML may hand over a key that is not a string (`1: x`)."""
    return sorted({str(key) for key in raw} - set(KEYS_BY_NAME))


def closest_key(name: str) -> str | None:
    """The key a misspelt one most likely meant: the same name in another case first
    (hftoken -> hfToken), else the nearest by spelling."""
    lowered = name.lower()
    for key in KEYS_BY_NAME:
        if key.lower() == lowered:
            return key
    matches = difflib.get_close_matches(name, list(KEYS_BY_NAME), n=1)
    return matches[0] if matches else None
