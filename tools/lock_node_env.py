"""Lock the nodes' Python environments, with exact versions and hashes, per target
(components/node_env.py): the GPU nodes' image and the local hosts' CPU engine.

    venv/bin/python tools/lock_node_env.py              # every target
    venv/bin/python tools/lock_node_env.py --target gpu
    venv/bin/python tools/lock_node_env.py --vllm 0.34.0     # a stack's own versions (nodeLock)

Writes locks/node-<target>-py<XY>-x86_64.txt: uv's `pip compile --generate-hashes` for
the target's Python and platform, under a header recording the inputs, which
tests/test_node_lock.py holds against components/versions.py offline. Needs the uv that
requirements-dev.txt pins (a different uv may resolve differently) and network access
to the package index; the CPU target also needs the CPU torch wheel in /opt/wheels.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components import node_env, versions  # noqa: E402
from localhosts import pure_wheel  # noqa: E402

REQUIREMENTS_DEV = ROOT / "requirements-dev.txt"


def pinned_uv_version() -> str:
    match = re.search(r"^uv==(\S+)", REQUIREMENTS_DEV.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"{REQUIREMENTS_DEV.name} pins no uv (a line uv==VERSION)")
    return match[1]


def uv_binary() -> str:
    """The uv installed beside this Python (the uv package ships its binary), checked
    against the pin."""
    try:
        from uv import find_uv_bin
    except ImportError:
        raise SystemExit(
            f"uv is not installed for {sys.executable}: pip install -r requirements-dev.txt (make test does)"
        ) from None
    uv = find_uv_bin()
    found = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    if found != pinned_uv_version():
        raise SystemExit(f"{uv} is uv {found}; requirements-dev.txt pins {pinned_uv_version()}: install that one")
    return uv


def uv_environment() -> dict[str, str]:
    """This process's environment without uv's own settings (UV_INDEX_URL,
    UV_FIND_LINKS, ...): the lock depends on node_env.py and uv's defaults only, not on
    who ran the command."""
    return {key: value for key, value in os.environ.items() if not key.startswith("UV_")}


def compile_command(uv: str, target: node_env.NodeEnvTarget) -> list[str]:
    major, minor = target.python_version
    command = [
        uv,
        "pip",
        "compile",
        "-",  # the requirements, on standard input
        "--no-config",  # no uv.toml either
        "--no-header",  # ours says how the lock was made (lock_header)
        "--generate-hashes",
        "--python-version",
        f"{major}.{minor}",
        "--python-platform",
        target.python_platform,
        "--exclude-newer",
        node_env.RESOLVED_AS_OF,
    ]
    for folder in target.find_links:
        # Not emitted into the lock: the nodes install from the wheelhouse, where these
        # wheels are too, and have no such folder (the header records it).
        command += ["--find-links", folder]
    for name in target.left_out:
        # Resolved (its own dependencies stay in the lock) but not written: not installed.
        command += ["--no-emit-package", name]
    return command


def lock_header(target: node_env.NodeEnvTarget, uv_version: str) -> str:
    fields = target.header_fields() | {"uv": uv_version}
    return (
        f"# The Python environment of {target.summary}:\n"
        "# every package at an exact version, with the hashes of its files. Generated, so do\n"
        "# not edit it; change the pins in components/versions.py (or the target in\n"
        "# components/node_env.py) and run\n"
        "#     venv/bin/python tools/lock_node_env.py\n"
        "# The inputs it was made from follow; tests/test_node_lock.py holds them against the pins.\n"
        + "".join(f"# {key}: {value}\n" for key, value in fields.items())
        + "\n"
    )


def repository_wheel_entries(target: node_env.NodeEnvTarget) -> str:
    """The lock's entries for the target's repository wheels: built here, reproducibly,
    and hashed as uv hashes an index's files."""
    entries = []
    with tempfile.TemporaryDirectory() as folder:
        for project in target.repository_wheels:
            wheel = pure_wheel.build(ROOT / project, Path(folder))
            name, version = wheel.name.split("-")[:2]
            # The comment names the wheel's builder as the committed locks do (and as
            # the wheel's own WHEEL file does), so locking again writes the same bytes.
            entries.append(
                f"{name}=={version} \\\n    --hash=sha256:{pure_wheel.sha256_of(wheel)}\n"
                f"    # built from {project} (tools/pure_wheel.py)\n"
            )
    return "".join(entries)


def lock(uv: str, target: node_env.NodeEnvTarget) -> str:
    result = subprocess.run(
        compile_command(uv, target),
        input="".join(f"{requirement}\n" for requirement in target.requirements),
        capture_output=True,
        text=True,
        env=uv_environment(),
    )
    if result.returncode != 0:
        raise SystemExit(f"uv could not lock the {target.name} target:\n{result.stderr}")
    text = lock_header(target, pinned_uv_version()) + result.stdout + repository_wheel_entries(target)
    # What the test will demand, checked before writing, so a lock that fails it is
    # never written (e.g. a wheel from a folder uv could not hash).
    problems = node_env.lock_problems(target, text)
    if problems:
        raise SystemExit("uv's lock falls short:\n" + "\n".join(problems))
    return text


def main(argv: list[str]) -> int:
    targets = {target.name: target for target in node_env.targets()}
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=sorted(targets), action="append", help="only this target (repeatable)")
    parser.add_argument("--vllm", metavar="VERSION", help="lock the GPU nodes for this vLLM (a stack's vllmVersion)")
    parser.add_argument("--ray", metavar="VERSION", help="lock the GPU nodes for this Ray (a stack's rayVersion)")
    args = parser.parse_args(argv)
    uv = uv_binary()
    if args.vllm or args.ray:
        # A stack's own versions: a lock of its own, which the stack names as nodeLock.
        chosen = [node_env.gpu_node(args.vllm or versions.VLLM_VERSION, args.ray or versions.RAY_VERSION)]
    else:
        chosen = [targets[name] for name in args.target or list(targets)]
    for target in chosen:
        text = lock(uv, target)
        target.lock_path.parent.mkdir(exist_ok=True)
        target.lock_path.write_text(text)
        packages = len(node_env.read_lock(text).packages)
        print(f"{target.lock_path.relative_to(ROOT)}: {packages} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
