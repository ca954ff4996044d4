"""How large a target's wheelhouse is: for each package of its lock, the wheel a node
of that target downloads (its Python and platform, among the files whose hashes the
lock holds), with its size as the package index reports it. Nothing is downloaded.

    venv/bin/python tools/wheelhouse_size.py             # the GPU nodes' lock
    venv/bin/python tools/wheelhouse_size.py --target cpu

Asks PyPI's JSON simple API (PEP 691) once per package; needs network access to it.
Wheels that only a local folder has (the CPU torch, the GPU-build double) are sized
from those folders. Prints the total and the largest wheels.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging import tags
from packaging.utils import parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components import node_env  # noqa: E402
from localhosts import pure_wheel  # noqa: E402

INDEX = "https://pypi.org/simple"


def supported_tags(target: node_env.NodeEnvTarget) -> list[tags.Tag]:
    """The wheel tags a node of the target accepts, best first (as pip ranks them)."""
    arch, _, libc = target.python_platform.partition("-")  # uv's spelling: x86_64-manylinux_2_39
    major, minor = (int(part) for part in libc.removeprefix("manylinux_").split("_"))
    platforms = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    version = target.python_version
    return list(tags.cpython_tags(version, platforms=platforms)) + list(
        tags.compatible_tags(version, platforms=platforms)
    )


def index_files(name: str) -> list[dict]:
    request = urllib.request.Request(f"{INDEX}/{name}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["files"]


def local_files(target: node_env.NodeEnvTarget, built: Path) -> list[dict]:
    """The wheels no index serves: the target's own folders, and its repository wheels
    (built into `built`)."""
    paths = [path for folder in target.find_links for path in Path(folder).glob("*.whl")]
    paths += [pure_wheel.build(ROOT / project, built) for project in target.repository_wheels]
    return [{"filename": p.name, "size": p.stat().st_size, "sha256": pure_wheel.sha256_of(p)} for p in paths]


def chosen_wheel(files: list[dict], hashes: set[str], ranking: dict[tags.Tag, int]) -> dict | None:
    """The best-ranked wheel among the files the lock allows, or None."""
    best, best_rank = None, None
    for file in files:
        digest = file.get("sha256") or file.get("hashes", {}).get("sha256")
        if digest not in hashes or not file["filename"].endswith(".whl"):
            continue
        ranks = [ranking[tag] for tag in parse_wheel_filename(file["filename"])[3] if tag in ranking]
        if ranks and (best_rank is None or min(ranks) < best_rank):
            best, best_rank = file, min(ranks)
    return best


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=[t.name for t in node_env.targets()], default="gpu")
    args = parser.parse_args(argv)
    target = {t.name: t for t in node_env.targets()}[args.target]
    lock = node_env.read_lock(target.lock_path.read_text())
    ranking = {tag: rank for rank, tag in enumerate(supported_tags(target))}
    with tempfile.TemporaryDirectory() as built:
        local = local_files(target, Path(built))

    def size_of(item):
        name, package = item
        hashes = {word.split(":", 1)[1] for word in package.hashes}
        # A local wheel when the lock's hash is one (the double is no index's vllm).
        wheel = chosen_wheel(local, hashes, ranking) or chosen_wheel(index_files(name), hashes, ranking)
        return name, package.version, wheel

    with ThreadPoolExecutor(8) as pool:
        sized = list(pool.map(size_of, sorted(lock.packages.items())))
    missing = [f"{name}=={version}" for name, version, wheel in sized if wheel is None]
    found = [(wheel["size"], wheel["filename"]) for _, _, wheel in sized if wheel is not None]
    total = sum(size for size, _ in found)
    print(f"{target.lock_path.relative_to(ROOT)}: {len(found)} wheels, {total / 1e9:.2f} GB")
    for size, filename in sorted(found, reverse=True)[:8]:
        print(f"  {size / 1e6:8.1f} MB  {filename}")
    if missing:
        print(f"no wheel for this platform among the locked files of: {', '.join(missing)}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
