"""The node software: the vLLM and Ray releases (vllmVersion, rayVersion, each at or
above its security floor) and the lock every node installs (nodeLock).
"""

from __future__ import annotations

from dataclasses import dataclass

from components import node_env, versions
from components.config_keys import NAMESPACE
from components.spec.reader import Reader


@dataclass(frozen=True)
class NodeSoftware:
    vllm_version: str
    ray_version: str
    # The lock every node installs (components/node_env.py), from the project directory.
    node_lock: str


def _check_release(reader: Reader, key: str, floor: str, pinned: str) -> str:
    value = reader.string(key) or pinned
    try:
        parsed = versions.parse_version(value)
    except ValueError as error:
        reader.fail(key, f"{error}, e.g. {pinned}")
        return value
    if parsed < versions.parse_version(floor):
        reader.fail(
            key,
            f"is below the security floor {floor} (see docs/configuration.md, 'Node software'). "
            f"Fix: pulumi config set {NAMESPACE}:{key} {pinned}",
        )
    return value


def check_node_software(reader: Reader) -> NodeSoftware:
    vllm_version = _check_release(reader, "vllmVersion", versions.VLLM_MIN_VERSION, versions.VLLM_VERSION)
    ray_version = _check_release(reader, "rayVersion", versions.RAY_MIN_VERSION, versions.RAY_VERSION)
    return NodeSoftware(
        vllm_version=vllm_version,
        ray_version=ray_version,
        node_lock=_check_node_lock(reader, vllm_version, ray_version),
    )


def _check_node_lock(reader: Reader, vllm_version: str, ray_version: str) -> str:
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
