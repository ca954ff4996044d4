"""The stack's config, read once into a frozen, validated ClusterSpec.

Pure Python, no cloud calls: `load_spec` either returns a spec that every
component can trust, or raises SpecError listing every problem at once. Each
problem names the config key, the value it had and what to do, so a bad config
is fixed in one round and never reaches AWS.

The keys themselves, their types and defaults, are the contract in
components/config_keys.py (namespace `vllm-cluster`).

One module a domain, each holding its piece of the spec (a frozen dataclass whose
field names are the spec's) and the checkers that read its keys: model_source,
engine_settings, own_hosts, cluster_shape, exposure, secrets, node_software,
network_placement, capacity, node_storage, gateway, sleep_and_wake, and engine_fit
(whether the model fits the shape). Each checker records every problem on the
`reader.Reader` (never the first only) and returns its piece; `loader.load_spec` runs
them in order and lays the pieces side by side into the `cluster_spec.ClusterSpec`.
The modules import one way: reader first, the domains on it, the loader on all.

Import from here (components.spec), not from the modules: this file names the
package's surface, what the program, cli/, tools/, bench/ and tests use.
"""

from components.config_keys import (
    CONFIG_KEYS,
    DEFAULT_API_RATE_LIMIT_PER_SECOND,
    DEFAULT_API_READ_TIMEOUT_SECONDS,
    NAMESPACE,
)
from components.spec.cluster_spec import ClusterSpec
from components.spec.gateway import UserCertificate
from components.spec.loader import load_spec
from components.spec.network_placement import ExistingNetwork, existing_vpc_problems
from components.spec.node_storage import (
    MIN_ROOT_VOLUME_GIB,
    NODE_IMAGE_BAKE,
    NODE_IMAGE_NONE,
    ExistingMountTarget,
    model_cache_problems,
    model_cache_sharing_problems,
)
from components.spec.own_hosts import CREATED_INSTANCE_KEYS, host_instance_type
from components.spec.reader import SpecError
from components.spec.secrets import MAX_API_KEY_LENGTH, Secret

__all__ = [
    # The config's keys and namespace are components/config_keys.py's; the program
    # (__main__.py), cli/ and components/bootstrap.py read them from here, beside the spec.
    "CONFIG_KEYS",
    "DEFAULT_API_RATE_LIMIT_PER_SECOND",
    "DEFAULT_API_READ_TIMEOUT_SECONDS",
    "NAMESPACE",
    # Reading the config.
    "load_spec",
    "ClusterSpec",
    "SpecError",
    # The spec's parts that components take on their own.
    "ExistingNetwork",
    "Secret",
    "UserCertificate",
    "MAX_API_KEY_LENGTH",
    "MIN_ROOT_VOLUME_GIB",
    "NODE_IMAGE_BAKE",
    "NODE_IMAGE_NONE",
    "CREATED_INSTANCE_KEYS",
    "host_instance_type",
    # What the program checks on the resources it looked up (an existing VPC, file system).
    "ExistingMountTarget",
    "existing_vpc_problems",
    "model_cache_problems",
    "model_cache_sharing_problems",
]
