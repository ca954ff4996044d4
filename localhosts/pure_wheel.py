"""A reproducible wheel of a small pure-Python project: the same sources give the same
bytes, so a lock can hold the wheel's hash the way it holds an index's.

Used for the GPU-build double (tests/doubles/vllm_gpu_build), which the local hosts
install beside vLLM's CPU build and which no index serves: the fleet (fleet.py) puts
the wheel in the wheelhouse the hosts install from, tools/lock_node_env.py writes its
hash into the local hosts' lock, and tests/test_node_lock.py holds the lock to a fresh
build. It lives with the local hosts, not in tools/, because the fleet builds the wheel
and tools/ are commands that import the code, never the other way round.

A build backend (setuptools) stamps the build time into the archive and orders files as
the file system lists them; this writes fixed times and a sorted archive instead. It
reads only what such a project declares: [project] name, version, description,
requires-python, [project.entry-points.*] and [tool.setuptools] packages.

    python -m localhosts.pure_wheel PROJECT_DIR DEST_DIR     (prints the wheel's path)
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import tomllib
import zipfile
from pathlib import Path

# The earliest time a zip archive can record; any fixed time would do.
FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def wheel_contents(project_dir: Path) -> tuple[str, dict[str, bytes]]:
    """(the wheel's file name, {path in the archive: bytes}) of the project, RECORD
    included."""
    pyproject = tomllib.loads((project_dir / "pyproject.toml").read_text())
    project = pyproject["project"]
    name, version = project["name"], project["version"]
    # The wheel's file and .dist-info names (PEP 427 / the binary distribution format).
    escaped = re.sub(r"[-_.]+", "_", name).lower()
    dist_info = f"{escaped}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for package in pyproject["tool"]["setuptools"]["packages"]:
        for source in sorted((project_dir / package).rglob("*.py")):
            files[source.relative_to(project_dir).as_posix()] = source.read_bytes()
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if "description" in project:
        metadata.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        metadata.append(f"Requires-Python: {project['requires-python']}")
    files[f"{dist_info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    # The generator's name is part of the wheel's bytes, so of the hash the local hosts'
    # lock holds (locks/node-cpu-*.txt): it keeps the path this module was first written
    # at, since a new name would be a new wheel for the same sources.
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: vllm-cluster tools/pure_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    groups = project.get("entry-points", {})
    if groups:
        lines = []
        for group in sorted(groups):
            lines.append(f"[{group}]")
            lines += [f"{key} = {value}" for key, value in sorted(groups[group].items())]
            lines.append("")
        files[f"{dist_info}/entry_points.txt"] = "\n".join(lines).encode()
    record = f"{dist_info}/RECORD"
    rows = [f"{path},{_record_hash(data)},{len(data)}" for path, data in sorted(files.items())]
    files[record] = ("\n".join(rows + [f"{record},,"]) + "\n").encode()
    return f"{escaped}-{version}-py3-none-any.whl", files


def build(project_dir: Path, dest_dir: Path) -> Path:
    """Write the project's wheel into dest_dir (replacing one of the same name) and
    return its path."""
    name, files = wheel_contents(project_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    target = dest_dir / name
    partial = dest_dir / f".{name}.partial"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in sorted(files.items()):
            info = zipfile.ZipInfo(path, date_time=FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
    partial.replace(target)
    return target


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
