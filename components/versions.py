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
