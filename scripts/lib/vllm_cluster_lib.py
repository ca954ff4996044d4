"""vllm_cluster_lib: helpers shared by the Python host scripts of vllm-cluster.

Installed at /opt/vllm-cluster/lib/vllm_cluster_lib.py by the nodes' setup command,
beside vllm-cluster-lib.sh (the shell scripts' library). ray-cluster-check,
vllm-watchdog-check and vllm-idle-check import it from ../lib relative to their own
file, so the same import works on a node (/opt/vllm-cluster/bin) and in the repository
(scripts/node). Standard library only: the scripts run with the node's virtualenv
Python, and vllm-idle-check with the image's own python3.
"""

from __future__ import annotations

import hashlib
import re


def metric_totals(text: str) -> dict[str, float]:
    """Prometheus text format (vLLM's /metrics) -> metric name: value summed over its
    label sets (one per engine, model, ...). Comments and lines that are not samples
    are skipped."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line[:1] in ("", "#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue  # not a sample line of the text format
    return totals


# One label pair of a sample line: name="value", the value with \\, \" and \n escaped.
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> (metric name, its labels, value) per sample line, for
    a figure that one label tells apart (a histogram's bucket `le`). Comments and lines
    that are not samples are skipped."""
    samples = []
    for line in text.splitlines():
        if line[:1] in ("", "#"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        try:
            samples.append((name, dict(_LABEL.findall(labels)), float(value)))
        except ValueError:
            continue  # not a sample line of the text format
    return samples


# --- the node's Python environment (node-env, preflight-check, components/node_env.py) ---

# name==version, with extras allowed (ray[default]==X.Y.Z): an exact pin.
PINNED_REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>\S+)")
_COMMENT = re.compile(r"(^|\s)#.*")


def normalize_name(name: str) -> str:
    """A distribution name as an index compares it (PEP 503): 'huggingface_hub' and
    'huggingface-hub' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_requirements_lock(text: str) -> tuple[dict[str, tuple[str, tuple[str, ...]]], list[str]]:
    """A hash-pinned requirements file (uv's or pip's `--generate-hashes` output) ->
    ({normalized name: (version, its --hash=... words)}, the requirement lines that are
    not `name==version` followed by hashes only). Read as pip reads it: continuation
    lines joined first, then comments (a '#' at the start or after white space) dropped;
    options (lines starting with '-') are skipped."""
    packages: dict[str, tuple[str, tuple[str, ...]]] = {}
    unreadable: list[str] = []
    entry = ""
    for line in text.splitlines():
        if line.endswith("\\"):
            entry += line[:-1] + " "
            continue
        words, entry = _COMMENT.sub("", entry + line).split(), ""
        if not words or words[0].startswith("-"):
            continue
        pin = PINNED_REQUIREMENT.fullmatch(words[0])
        if pin is None or not all(word.startswith("--hash=") for word in words[1:]):
            unreadable.append(" ".join(words))
            continue
        packages[normalize_name(pin["name"])] = (pin["version"], tuple(words[1:]))
    return packages, unreadable


def read_requirements_lock(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The packages of a lock that must be readable whole (on a node: the lock the stack
    sent, already checked by the program)."""
    packages, unreadable = parse_requirements_lock(text)
    if unreadable:
        raise ValueError(f"not a hash-pinned requirement: {unreadable[0]!r}")
    return packages


def installed_packages() -> dict[str, str]:
    """Every distribution in this interpreter's environment, normalized name -> version,
    sorted by name. A name found twice on sys.path counts as the first found, the one
    `import` would load."""
    from importlib import metadata

    packages: dict[str, str] = {}
    for distribution in metadata.distributions():
        name = distribution.metadata["Name"]
        if name:  # a dist-info without METADATA names nothing
            packages.setdefault(normalize_name(name), distribution.version)
    return dict(sorted(packages.items()))


def environment_fingerprint(packages: dict[str, str]) -> str:
    """sha256 of the sorted "name==version" lines: equal exactly when the environments are."""
    lines = "".join(f"{name}=={packages[name]}\n" for name in sorted(packages))
    return hashlib.sha256(lines.encode()).hexdigest()
