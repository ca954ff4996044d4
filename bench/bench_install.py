"""A node's install of its locked environment, three ways, side by side in one run:
from the package index with pip, from the index with uv (the fast installer), and
offline from the wheelhouse with uv, the way every node installs since the lock
(scripts/node/vllm-cluster-node install_software). Each starts cold: a new virtualenv
and an empty download cache; each installs every file of the lock, checked against its
hashes, and byte-compiles (pip does by default; the nodes ask uv to); each result is
checked against the lock (scripts/node/node-env check).

The environment is the local hosts' lock (locks/node-cpu-*.txt: vLLM's CPU build, Ray,
huggingface_hub, uv and the GPU-build double; about 1 GB of wheels, 3.7 GiB installed),
the one this machine can install; the GPU nodes' lock is the same kind of install,
larger (tools/wheelhouse_size.py gives its size).

    make bench-install    (or: venv/bin/python bench/bench_install.py [--runs 1])

Needs the index (PyPI) for the first two; the wheelhouse is filled first, outside the
timing, as the tests fill it (localhosts/fleet.py fleet_wheelhouse). Before them it times that
fill on its own (pip downloading every locked wheel into an empty folder: what the first
node does once per lock). Ends with the line
`install: index-pip A s, index-fast B s, wheelhouse C s, ratio A/C R`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components import node_env  # noqa: E402
from localhosts import pure_wheel  # noqa: E402
from localhosts.fleet import VLLM_GPU_BUILD_DOUBLE, fleet_wheelhouse  # noqa: E402

NODE_ENV = ROOT / "scripts" / "node" / "node-env"
UV = Path(sys.prefix) / "bin" / "uv"
# The Python a node makes its virtualenv with; here, the one running this.
PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


def clean_environment(workdir: Path) -> dict[str, str]:
    """This process's environment without pip's and uv's own settings (this machine's
    pip.conf adds local indexes and constraints): each installer sees the index and
    the lock only, and a cache of its own in `workdir`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["UV_CACHE_DIR"] = str(workdir / "uv-cache")
    return env


def run(*command: str, env: dict[str, str]) -> None:
    result = subprocess.run(list(command), capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... exited {result.returncode}:\n{result.stderr[-2000:]}")


def index_pip(workdir: Path, lock: Path, source: tuple[list[str], Path, Path], env: dict[str, str]) -> Path:
    extra_links, index_part, repository_part = source
    venv = workdir / "venv"
    # Without a pip of its own (this pip installs into it), so it holds the lock and nothing else.
    run(str(PYTHON), "-m", "venv", "--without-pip", str(venv), env=env)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet"]
    pip += ["--no-cache-dir", "--require-hashes", "--no-deps"]
    run(*pip, *[f"--find-links={folder}" for folder in extra_links], "-r", str(index_part), env=env)
    run(*pip, "--no-index", f"--find-links={repository_part.parent}", "-r", str(repository_part), env=env)
    return venv


def uv_install(workdir: Path, lock: Path, sources: list[str], env: dict[str, str]) -> Path:
    """A new virtualenv synced to the lock by uv, hash-checked and byte-compiled, from
    `sources` (uv's index options)."""
    venv = workdir / "venv"
    run(str(UV), "venv", "--quiet", "--offline", "--python", str(PYTHON), str(venv), env=env)
    sync = [str(UV), "pip", "sync", "--quiet", "--python", str(venv / "bin" / "python")]
    run(*sync, *sources, "--require-hashes", "--compile-bytecode", str(lock), env=env)
    return venv


def index_uv(workdir: Path, lock: Path, extra_links: list[str], env: dict[str, str]) -> Path:
    return uv_install(workdir, lock, [f"--find-links={folder}" for folder in extra_links], env)


def wheelhouse_uv(workdir: Path, lock: Path, house: Path, env: dict[str, str]) -> Path:
    """The node's own command (vllm-cluster-node install_software), with this machine's uv."""
    return uv_install(workdir, lock, ["--offline", "--no-index", f"--find-links={house}"], env)


def split_lock(target: node_env.NodeEnvTarget, folder: Path) -> tuple[Path, Path]:
    """The lock as two requirements files: what an index serves, and the repository's own
    wheels (the GPU-build double, `vllm` at the CPU build's version). pip, unlike uv, picks
    a file before it checks hashes, and would take the index's `vllm` of that version for
    the double and refuse it; so pip gets the double from its folder only."""
    ours = {node_env.normalize_name(pin.split("==")[0]) for pin in target.repository_pins()}
    lock = node_env.read_lock(target.lock_path.read_text())
    parts = {True: [], False: []}
    for name, package in sorted(lock.packages.items()):
        parts[name in ours].append(f"{name}=={package.version} {' '.join(package.hashes)}\n")
    index_part, repository_part = folder / "index.txt", folder / "repository.txt"
    index_part.write_text("".join(parts[False]))
    repository_part.write_text("".join(parts[True]))
    return index_part, repository_part


def fill_seconds(lock: Path, extra_links: list[str]) -> tuple[float, int]:
    """(seconds, bytes) for pip to download every locked wheel into an empty wheelhouse,
    as the first node of a new lock does (no cache): the one-time fetch."""
    with tempfile.TemporaryDirectory(prefix="bench-install-fill-", dir="/var/tmp") as folder:
        env = clean_environment(Path(folder))
        links = [f"--find-links={link}" for link in extra_links]
        started = time.monotonic()
        run(
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-cache-dir",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            *links,
            "--dest",
            folder,
            "-r",
            str(lock),
            env=env,
        )
        seconds = time.monotonic() - started
        return seconds, sum(p.stat().st_size for p in Path(folder).glob("*.whl"))


def timed(install, lock: Path, *args) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-install-", dir="/var/tmp") as folder:
        workdir = Path(folder)
        env = clean_environment(workdir)
        started = time.monotonic()
        venv = install(workdir, lock, *args, env)
        seconds = time.monotonic() - started
        check = subprocess.run(
            [str(venv / "bin" / "python"), "-I", str(NODE_ENV), "check", "--lock", str(lock)],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise SystemExit(f"{install.__name__} did not install the lock: {check.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="installs per way; the median is reported")
    args = parser.parse_args()
    target = node_env.local_host()
    lock = target.lock_path
    house = fleet_wheelhouse()
    locked = node_env.read_lock(lock.read_text()).packages
    wheels = sum(p.stat().st_size for p in house.glob("*.whl") if is_locked(p.name, locked))
    print(
        f"lock {lock.relative_to(ROOT)}: {len(locked)} packages, "
        f"{wheels / 1e9:.2f} GB of wheels; {os.cpu_count()} cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-install-double-") as built:
        # The wheels no index serves: the CPU torch (this machine's folder) and the double,
        # built here beside pip's split of the lock.
        pure_wheel.build(VLLM_GPU_BUILD_DOUBLE, Path(built))
        index_part, repository_part = split_lock(target, Path(built))
        ways = {
            "index-pip": (index_pip, (list(target.find_links), index_part, repository_part)),
            "index-fast": (index_uv, [*target.find_links, built]),
            "wheelhouse": (wheelhouse_uv, house),
        }
        # The first node fetches what an index serves; the double is in the wheelhouse already.
        seconds, size = fill_seconds(index_part, list(target.find_links))
        print(
            f"wheelhouse fill (pip download, once per lock): {seconds:.1f} s for {size / 1e9:.2f} GB, "
            f"{size / 1e6 / seconds:.1f} MB/s",
            flush=True,
        )
        medians = {}
        for name, (install, source) in ways.items():
            times = []
            for run_number in range(args.runs):
                seconds = timed(install, lock, source)
                times.append(seconds)
                print(f"{name}, run {run_number + 1}: {seconds:.1f} s", flush=True)
            medians[name] = statistics.median(times)
    a, b, c = medians["index-pip"], medians["index-fast"], medians["wheelhouse"]
    print(f"install: index-pip {a:.1f} s, index-fast {b:.1f} s, wheelhouse {c:.1f} s, ratio A/C {a / c:.1f}")
    return 0


def is_locked(filename: str, locked: dict) -> bool:
    """Whether a wheel in the wheelhouse is of the lock's packages and versions (the
    wheelhouse may hold older pins too)."""
    name, version = filename.split("-")[:2]
    package = locked.get(node_env.normalize_name(name))
    return package is not None and package.version == version


if __name__ == "__main__":
    sys.exit(main())
