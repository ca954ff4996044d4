"""Print the Requires-Python each given release declares on PyPI, to keep
components/versions.py REQUIRES_PYTHON true when a pin changes.

    python tools/requires_python.py vllm==0.33.0 ray==2.60.0

Reads the index's JSON simple API (PEP 691); needs network access to pypi.org.
"""

from __future__ import annotations

import json
import sys
import urllib.request

INDEX = "https://pypi.org/simple"


def requires_python(package: str, version: str) -> set[str]:
    request = urllib.request.Request(f"{INDEX}/{package}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    prefix = f"{package.replace('-', '_')}-{version}-"
    return {
        f.get("requires-python") or ""
        for f in files
        if f["filename"].startswith(prefix) and f["filename"].endswith(".whl")
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for release in argv:
        package, _, version = release.partition("==")
        found = requires_python(package, version)
        if not found:
            print(f"{release}: no wheels on {INDEX}", file=sys.stderr)
            return 1
        print(f'("{package}", "{version}"): "{" | ".join(sorted(found))}",')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
