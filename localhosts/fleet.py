"""The local fleet: real Debian hosts, each with its own IP, systemd as PID 1 and
sshd, booted with systemd-nspawn in network namespaces on one bridge (see
../shared/TESTBED.md). A gateway host and N GPU-node hosts stand in for the EC2
instances; the program's user data and remote commands run on them unchanged.

What is not real here, and why: EFS is one shared directory bind-mounted where the
user data mounts the model cache (the user data finds it mounted and goes on, as
on a re-run in AWS), and the tests fill its wheelhouse from this machine's registries
(fleet_wheelhouse), where on AWS the first node's setup downloads it; Ray's GPUs are
logical (`--num-gpus`). The node hosts boot from a host image (host_image) into which
the node's own install step (`vllm-cluster-node bake`) ran once per lock, as GPU nodes
launch from a baked machine image: their setup finds the environment already the lock
and only checks it. With VLLM_CLUSTER_FLEET_BAKED_HOSTS=0 they boot from the base image
and each installs the locked environment from the wheelhouse itself at setup, offline,
as a node of the plain Deep Learning AMI does. Everything else (systemd units, sshd, the SSH jump through the
gateway, nginx with TLS, Ray with token auth, env files) is what runs on AWS.

The hosts behave like the real image where it matters (components/image.py): the
login user `ubuntu` with passwordless sudo and sudo's secure_path; `/run/nologin`
until systemd-user-sessions runs, held back by a slow boot; the user data run by
cloud-init's final stage after multi-user.target; on the gateway, an apt run that
holds the package lists lock at first boot, and nginx installed from a package
mirror (a local one on the bridge, with Debian's own packages); on the nodes,
nvidia-smi and fi_info where the image has them, and the instance store, mounted at
/opt/dlami/nvme at every boot by a stand-in of the image's own unit and script (its
"disk" a directory of this machine's, kept across a reboot and emptied by a start after
a stop, as EC2 does). The stand-ins are test doubles that
live in tests/doubles (the project keeps every stand-in there, named as one): this
module copies them into the hosts, where the real tools live, as files by path, and
never imports them.

Every boot of a host is checked in the background (localhosts/boot_check.py): a unit
of the hosts' own that fails at boot is reported on stderr at once, as the local
machinery's fault, and the host booted again, once.

Needs root, systemd-nspawn, debootstrap, overlayfs and network namespaces.
The base root file system, the node hosts' image, the wheelhouse and the tests' own
virtualenv are cached in $VLLM_CLUSTER_TESTBED_CACHE (default /var/cache/vllm-cluster-testbed).

As a command, from the repository's root:
    python -m localhosts.fleet --nodes 3   (boots, prints, tears down on Ctrl-C)
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cli.cluster import ssh_args
from components import bootstrap, image, node_env
from localhosts import boot_check, pure_wheel

ROOT = Path(__file__).resolve().parent.parent

CACHE_DIR = Path(os.environ.get("VLLM_CLUSTER_TESTBED_CACHE", "/var/cache/vllm-cluster-testbed"))
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "openssh-client",
    "iproute2",
    "curl",
    "python3",
    "sudo",
    "openssl",
    "procps",
    "ca-certificates",
    # Not image.LOGIN_SESSIONS_PACKAGE (pam_systemd), which the image has: with it, logins
    # to the saturated one-core node hosts timed out in sshd's banner exchange (the main
    # fleet's hung-engine test, CI run of 5756ae4). Here logind sees no SSH login; the idle
    # check's utmp does see a login with a terminal, which the fleet's idle test opens.
    # The image has a C compiler (components/image.py, C_COMPILER): vLLM's engine compiles
    # its kernels at start (torch's inductor on this CPU build).
    "gcc",
    "g++",
    "libc6-dev",
    # vLLM's CPU build (the engine the fleet runs in place of the GPU build) loads its
    # kernels from a library linked against libnuma.
    "libnuma1",
)
# What the hosts install from the package mirror: the gateway nginx at boot, the nodes
# their Python's headers at setup (the image may lack them as Debian's does: vLLM's
# engine compiles its kernels against them).
# And iptables and nftables, which the image is taken to have (components/image.py
# IPTABLES, NFT) and which the nodes' setup installs where they are missing, as here: the
# one keeps the service user that runs Ray and vLLM from the metadata service, the other
# holds the host firewall. (Debian's iptables recommends nftables, but the mirror must not
# depend on that.) And the AWS SDK the gateway's waker-config installs with idle stop
# (python3-botocore).
MIRROR_PACKAGES = ("nginx", "prometheus", "python3.11-dev", "iptables", "nftables", "python3-botocore")
DOUBLES = ROOT / "tests" / "doubles"
VLLM_GPU_BUILD_DOUBLE = DOUBLES / "vllm_gpu_build"
# Where the fleet's own plumbing (not a stand-in for any tool of the image) lives on a host.
FLEET_LIB = "/usr/local/lib/vllm-cluster-fleet"
# How long a booting host refuses logins (/run/nologin) after sshd answers: a GPU
# instance boots much slower than the small gateway, so its nodes are still refusing
# logins when the gateway already lets the stack through. And how long the gateway's
# first-boot apt run holds the package lists lock.
NOLOGIN_SECONDS = {
    "gateway": int(os.environ.get("VLLM_CLUSTER_FLEET_GATEWAY_NOLOGIN_SECONDS", "8")),
    "node": int(os.environ.get("VLLM_CLUSTER_FLEET_NODE_NOLOGIN_SECONDS", "30")),
}
APT_LOCK_SECONDS = int(os.environ.get("VLLM_CLUSTER_FLEET_APT_LOCK_SECONDS", "40"))
# How long the stand-in of the image's instance store setup takes to format a blank store
# (after the first boot and after every start that follows a stop): the real one makes an
# LVM volume and an ext4 file system over up to terabytes. Long enough that a unit not
# ordered after it runs first.
NVME_FORMAT_SECONDS = int(os.environ.get("VLLM_CLUSTER_FLEET_NVME_FORMAT_SECONDS", "8"))
# Where a node host sees its instance store's "disk" (Fleet.instance_store_disk), which the
# stand-in of the image's script mounts at image.NVME_MOUNT.
INSTANCE_STORE_DISK = "/var/lib/instance-store-double"
MIRROR_PORT = 8766

PREFIX_LENGTH = 16
SSH_USER = image.DEFAULT_USER


@dataclass(frozen=True)
class Network:
    """One fleet's network: its bridge, the /16 its hosts live in (the stack's vpcCidr)
    and the prefix of its namespaces' names. Fleets on different networks run at once
    on one machine: make test runs its two fleets side by side."""

    bridge: str
    netns_prefix: str
    second_octet: int

    @property
    def vpc_cidr(self) -> str:
        return f"10.{self.second_octet}.0.0/{PREFIX_LENGTH}"

    @property
    def bridge_ip(self) -> str:
        """This machine's address on the bridge: the package mirror, the fake hub."""
        return f"10.{self.second_octet}.0.254"

    @property
    def gateway_ip(self) -> str:
        return f"10.{self.second_octet}.0.10"

    def node_ip(self, index: int) -> str:
        # The program's node subnet for vpcCidr 10.N.0.0/16 is 10.N.128.0/17.
        return f"10.{self.second_octet}.128.{index + 1}"

    def state(self) -> dict:
        return {"bridge": self.bridge, "netns_prefix": self.netns_prefix, "second_octet": self.second_octet}


# `make local`'s and the main fleet's (tests/test_fleet.py).
MAIN_NETWORK = Network("vcbr0", "vc-", 99)
# The replicas fleet's (tests/test_fleet_replicas.py), which runs beside the main one.
SECOND_NETWORK = Network("vcbr1", "vd-", 98)


def in_ci() -> bool:
    return bool(os.environ.get("VLLM_CLUSTER_CI"))


def why_no_fleet() -> str | None:
    """None when this machine can host the fleet, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the fleet needs root (network namespaces, mounts, systemd-nspawn)"
    for tool in ("systemd-nspawn", "debootstrap", "ip", "ssh", "ssh-keygen", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install systemd-container debootstrap openssh-client iproute2)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    # A name under no fleet's prefix: a fleet's teardown check, running beside this in
    # another pytest worker, counts every namespace under its own as left behind.
    probe = f"vcprobe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create network namespaces: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=True)
    return None


def _run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


# How long a fleet waits for the veths of a fleet that stopped just before it. A
# namespace whose name `ip netns del` removed lives on while anything still holds it (a
# host's last process, a socket), and its veth with it: on CI (2026-12-06) the replicas
# fleet's gateway veth outlived its teardown by about ten minutes, and the next fleet's
# `ip link add` failed "File exists".
LEFTOVER_LINK_WAIT_SECONDS = 900
LEFTOVER_LINK_POLL_SECONDS = 5


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def link_names(ip_link_output: str, prefix: str) -> list[str]:
    """The links `ip -o link show` lists whose names start with `prefix` ("7: vd-v-gateway@if2:
    <...>": a veth's name ends at its peer's "@")."""
    names = (line.split(":", 2)[1].strip().split("@")[0] for line in ip_link_output.splitlines() if ":" in line)
    return [name for name in names if name.startswith(prefix)]


def _links_named(prefix: str) -> list[str]:
    return link_names(_run("ip", "-o", "link", "show").stdout, prefix)


def _namespaces_named(prefix: str) -> list[str]:
    # `ip netns list` prints "vd-gateway (id: 3)": the name is the line's first word.
    names = (line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines() if line.strip())
    return [name for name in names if name.startswith(prefix)]


def await_leftover_links(
    present: Callable[[], list[str]],
    wait_seconds: float,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> list[str]:
    """Waits up to `wait_seconds` until `present()` lists no link; returns those still there."""
    deadline = clock() + wait_seconds
    while True:
        left = present()
        if not left or clock() >= deadline:
            return left
        sleep(LEFTOVER_LINK_POLL_SECONDS)


def leftover_links_error(left: list[str], waited_seconds: float) -> str:
    return (
        f"the veths {', '.join(left)} of an earlier fleet on this network are still there after "
        f"{waited_seconds:.0f} s (a process may still hold its namespace: look for one with "
        f"`ip netns identify PID`). Once nothing runs in it, remove them: "
        + "; ".join(f"ip link del {link}" for link in left)
    )


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


# --- cached images -------------------------------------------------------------------


@contextmanager
def building(item: str) -> Iterator[None]:
    """One builder of a cached item at a time, across processes and threads: `make test`
    runs three pytest workers (each fleet's and the rest, Makefile), and tests in each reach
    for the images, which on a new machine are not built yet. An flock on the item's own
    lock file; a caller that waited checks again and finds the item built."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with open(CACHE_DIR / f".{item}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


PROVISION = f"""set -eu
useradd --create-home --shell /bin/bash {SSH_USER}
echo '{SSH_USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-cloud-init-users
chmod 440 /etc/sudoers.d/90-cloud-init-users
rm -f /etc/ssh/ssh_host_*
"""


def base_rootfs() -> tuple[Path, Path]:
    """A Debian root file system with systemd, sshd and a sudo user like EC2's, and a
    package mirror (a flat apt repository) with what the hosts install at boot, both
    built once by debootstrap and apt and cached."""
    digest = _digest(*BASE_PACKAGES, PROVISION, *MIRROR_PACKAGES)
    target, mirror = CACHE_DIR / f"rootfs-{SUITE}-{digest}", CACHE_DIR / f"apt-mirror-{SUITE}-{digest}"

    def built() -> bool:
        return (target / ".complete").exists() and (mirror / "Release").exists()

    if built():
        return target, mirror
    with building("rootfs"):
        if built():
            return target, mirror
        scratch = Path(tempfile.mkdtemp(prefix="rootfs-building-", dir=CACHE_DIR))
        try:
            debootstrap = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}"]
            _run(*debootstrap, SUITE, str(scratch), MIRROR)
            _run("chroot", str(scratch), "/bin/sh", "-c", PROVISION)
            _fill_mirror(scratch, mirror)
            (scratch / ".complete").write_text(f"{SUITE} {' '.join(BASE_PACKAGES)}\n")
            if target.exists():
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch)
    return target, mirror


def _fill_mirror(rootfs: Path, mirror: Path) -> None:
    """Download MIRROR_PACKAGES and what they need beyond `rootfs` (from Debian, with
    the root file system's own apt), and index them as a flat repository."""
    shutil.copy("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
    _run("chroot", str(rootfs), "apt-get", "-q", "update")
    _run("chroot", str(rootfs), "apt-get", "-q", "-y", "--download-only", "install", *MIRROR_PACKAGES)
    if mirror.exists():
        shutil.rmtree(mirror)
    mirror.mkdir(parents=True)
    for deb in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        shutil.move(str(deb), mirror / deb.name)
    _run("chroot", str(rootfs), "apt-get", "clean")
    for lists in (rootfs / "var" / "lib" / "apt" / "lists").glob("*_*"):
        lists.unlink()
    entries = []
    for deb in sorted(mirror.glob("*.deb")):
        control = _run("dpkg-deb", "-f", str(deb)).stdout.rstrip("\n")
        data = deb.read_bytes()
        entries.append(
            f"{control}\nFilename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    packages = "\n".join(entries).encode()
    (mirror / "Packages").write_bytes(packages)
    (mirror / "Release").write_text(
        "Origin: vllm-cluster-fleet\nLabel: vllm-cluster-fleet\nSuite: fleet\nCodename: fleet\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}\n"
        f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )


NODE_ENV_SCRIPT = ROOT / "scripts" / "node" / "node-env"


def fleet_wheelhouse() -> Path:
    """Every wheel of the local hosts' lock (locks/, components/node_env.local_host),
    fetched from this machine's registries (the index, and /opt/wheels for the CPU
    torch) and checked against the lock's hashes, the way a node fills the wheelhouse
    on the model cache: by the node's own scripts/node/node-env, with pip downloading
    what it lacks. The GPU-build double's wheel, which no index serves, is built here
    (localhosts/pure_wheel.py), as the lock's hash for it was. Cached; a change of pins
    fetches only the wheels that changed. About 1 GiB."""
    target = node_env.local_host()
    house = CACHE_DIR / "wheelhouse"
    incoming, missing_file = house / ".incoming", house / ".incoming" / "missing.txt"

    def missing() -> int:
        command = [sys.executable, str(NODE_ENV_SCRIPT), "wheelhouse", "--lock", str(target.lock_path)]
        return int(_run(*command, "--wheelhouse", str(house), "--missing", str(missing_file)).stdout)

    with building("wheelhouse"):
        incoming.mkdir(parents=True, exist_ok=True)
        pure_wheel.build(VLLM_GPU_BUILD_DOUBLE, incoming)
        if missing():
            find_links = [f"--find-links={folder}" for folder in target.find_links]
            download = ["--no-deps", "--require-hashes", "--only-binary=:all:", "--dest", str(incoming)]
            _run(sys.executable, "-m", "pip", "download", "--quiet", *download, *find_links, "-r", str(missing_file))
            left = missing()
            if left:
                raise RuntimeError(f"{left} locked packages have no wheel in {house} after downloading: {missing_file}")
    return house


def link_wheelhouse(house: Path, dest: Path) -> None:
    """The wheelhouse, as the nodes find it once its writer filled it: hard links to the
    cached wheels (the writer replaces files, never writes into one). Under the cache's
    lock: `make test` starts two fleets at once, and each start refreshes the cache
    (fleet_wheelhouse renames files into it), so a copy beside it could list a file
    that is gone before it is linked."""
    with building("wheelhouse"):
        _run("cp", "-al", str(house), str(dest))


# As scripts/node/node-env's install: offline, every file checked against the lock, and
# byte-compiled (without it the first `import vllm` in a test compiled vLLM, torch and
# transformers itself, minutes on a busy machine). Part of the cache's name, so a cached
# environment made with other options is made again.
FLEET_VENV_SYNC_OPTIONS = ("--offline", "--no-index", "--require-hashes", "--compile-bytecode")


def fleet_venv_dir() -> Path:
    """Where fleet_venv keeps the environment of this Python and the lock's pins."""
    lock = node_env.local_host().lock_path.read_text()
    return CACHE_DIR / f"venv-{_digest(sys.version, lock, *FLEET_VENV_SYNC_OPTIONS)}"


def fleet_venv() -> Path:
    """The local hosts' environment on this machine, for what the tests themselves run
    with it (tests/tiny_model.py builds the model with its torch and transformers): the
    lock, installed with uv offline from the fleet's wheelhouse, as a node installs it.
    Cached (about 3.7 GiB). The hosts install their own, inside the booted hosts."""
    lock = node_env.local_host().lock_path
    target = fleet_venv_dir()
    if (target / ".complete").exists():
        return target
    with building("venv"):
        if (target / ".complete").exists():
            return target
        house = fleet_wheelhouse()
        uv = Path(sys.prefix) / "bin" / "uv"
        if not uv.exists():
            raise RuntimeError(f"no uv at {uv}: the fleet's virtualenv is installed with it (requirements-dev.txt)")
        if target.exists():
            shutil.rmtree(target)
        python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
        _run(str(uv), "venv", "--quiet", "--python", str(python), str(target))
        # uv's cache beside the virtualenv, on the same file system: the virtualenv's files
        # are hard links to the unpacked wheels there (no copy of 3.7 GiB).
        offline = [*FLEET_VENV_SYNC_OPTIONS, f"--find-links={house}"]
        into = ["--quiet", "--python", str(target / "bin" / "python"), "--cache-dir", str(CACHE_DIR / "uv")]
        _run(str(uv), "pip", "sync", *into, *offline, str(lock))
        (target / ".complete").write_text("ok\n")
    return target


# --- the node hosts' image: the node software baked in --------------------------------

# What the node's install step runs (`vllm-cluster-node bake`), put where the stack's setup
# command puts it (components/bootstrap.py node_setup_script), with its mode: part of the
# host image's name, so a change of one of them, as of the lock, bakes a new image.
BAKE_FILES = {
    bootstrap.NODE_COMMAND: (bootstrap.NODE_SCRIPTS / "vllm-cluster-node", 0o755),
    f"{bootstrap.BIN_DIR}/node-env": (bootstrap.NODE_SCRIPTS / "node-env", 0o755),
    bootstrap.LIBRARY_PATH: (bootstrap.SCRIPT_LIBRARY, 0o644),
    bootstrap.PYTHON_LIBRARY_PATH: (bootstrap.PYTHON_LIBRARY, 0o644),
}
# Where the bake finds what this machine hands it: under /run, which systemd-nspawn mounts
# as a tmpfs, so the image keeps none of it (nor the mount points).
BAKE_TRANSPORT = "/run/vllm-cluster-bake"
# How long another host image stays after a new one is baked, unless hosts run on it.
HOST_IMAGE_KEPT_SECONDS = 3600


def image_facts() -> str:
    """What `vllm-cluster-node bake --facts` reads: the image's facts (components/image.py)
    and the service user, under the names cluster.env gives them (components/bootstrap.py)."""
    values = {"IMAGE_PYTHON": image.PYTHON, "IPTABLES": image.IPTABLES, "NFT": image.NFT}
    values["SERVICE_USER"] = bootstrap.SERVICE_USER
    return bootstrap.env_file(values, header="The image's facts for vllm-cluster-node bake (localhosts/fleet.py).")


def baked_hosts_by_default() -> bool:
    """Whether node hosts boot from the host image: yes, unless VLLM_CLUSTER_FLEET_BAKED_HOSTS
    is 0 (make bench-fleet compares both)."""
    return os.environ.get("VLLM_CLUSTER_FLEET_BAKED_HOSTS", "1") != "0"


def host_image_dir(rootfs: Path) -> Path:
    """Where the host image over `rootfs` for the local hosts' lock is cached: named by the
    base image, the lock, the facts and every file the bake runs."""
    lock = node_env.local_host().lock_path.read_text()
    files = [f"{path} {mode:o}\n{source.read_text()}" for path, (source, mode) in sorted(BAKE_FILES.items())]
    return CACHE_DIR / f"host-image-{_digest(rootfs.name, lock, image_facts(), *files)}"


def host_image(rootfs: Path, mirror: Path) -> Path:
    """The node hosts' image: a layer over `rootfs` (an overlay's lower layer, above it)
    into which the node's own install step ran once for the lock, as EC2 Image Builder
    runs it on a builder instance: the scripts and the lock where the setup command puts
    them, then `vllm-cluster-node bake`, which runs install_node_software, the function the
    node's setup runs (the locked environment from the wheelhouse with the locked uv,
    offline and hash-checked, the Python headers, iptables, nftables). Built in a
    container of its own with no network: the wheelhouse (fleet_wheelhouse) and the
    package mirror are bound into it. Its output is kept beside it (bake.log). Cached;
    the images of other locks or scripts are removed, but not one a host still runs on."""
    target = host_image_dir(rootfs)
    layer = target / "layer"
    if (target / ".complete").exists():
        return layer
    with building("host-image"):
        if (target / ".complete").exists():
            return layer
        house = fleet_wheelhouse()
        scratch = Path(tempfile.mkdtemp(prefix="host-image-building-", dir=CACHE_DIR))
        try:
            _bake(rootfs, mirror, house, scratch)
            (scratch / ".complete").write_text(f"over {rootfs.name}\n")
            if target.exists():
                shutil.rmtree(target)
            scratch.rename(target)
        finally:
            if scratch.exists():
                shutil.rmtree(scratch)
        _remove_other_host_images(target)
    return layer


def _bake(rootfs: Path, mirror: Path, house: Path, scratch: Path) -> None:
    """Run `vllm-cluster-node bake` on an overlay of `rootfs` whose upper directory,
    scratch/layer, becomes the image."""
    layer, work, root, transport = (scratch / name for name in ("layer", "work", "root", "transport"))
    machine = f"host-image-bake-{os.getpid()}"
    for folder in (layer, work, root, transport):
        folder.mkdir()
    _run("mount", "-t", "overlay", "overlay", "-o", f"lowerdir={rootfs},upperdir={layer},workdir={work}", str(root))
    try:
        for path, (source, mode) in BAKE_FILES.items():
            _install_file(root, path, source.read_bytes(), mode)
        _install_file(root, bootstrap.NODE_LOCK_PATH, node_env.local_host().lock_path.read_bytes(), 0o644)
        link_wheelhouse(house, transport / "wheelhouse")
        (transport / "image.env").write_text(image_facts())
        # apt reads the package mirror as a local repository: the bake has no network.
        (transport / "sources.list").write_text(f"deb [trusted=yes] file:{BAKE_TRANSPORT}/apt-mirror ./\n")
        # As the hosts are started (Fleet._start_host): in this process's unit, under a
        # machine name of its own (nspawn keeps per-machine state under /run/systemd/nspawn).
        command = ["systemd-nspawn", "-D", str(root), "--register=no", "--keep-unit", "-M", machine]
        command += ["--as-pid2", "--private-network"]
        command += ["--console=pipe", "--resolv-conf=off", "--timezone=off", "--link-journal=no", "--quiet"]
        command += [
            f"--bind-ro={mirror}:{BAKE_TRANSPORT}/apt-mirror",
            f"--bind={transport / 'wheelhouse'}:{BAKE_TRANSPORT}/wheelhouse",
        ]
        command += [f"--bind-ro={transport / 'image.env'}:{BAKE_TRANSPORT}/image.env"]
        command += [f"--bind-ro={transport / 'sources.list'}:/etc/apt/sources.list"]
        command += [bootstrap.NODE_COMMAND, "bake", "--wheelhouse", f"{BAKE_TRANSPORT}/wheelhouse"]
        command += ["--facts", f"{BAKE_TRANSPORT}/image.env"]
        with open(scratch / "bake.log", "wb") as log:
            baked = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        if baked.returncode != 0:
            said = (scratch / "bake.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"baking the node hosts' image failed (exit {baked.returncode}):\n{said}")
    finally:
        _run("umount", str(root))
        propagate = Path("/run/systemd/nspawn/propagate") / machine
        if propagate.is_dir() and not any(propagate.iterdir()):
            propagate.rmdir()
    for folder in (work, transport):
        shutil.rmtree(folder)
    root.rmdir()


def _install_file(root: Path, path: str, content: bytes, mode: int) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content)
    target.chmod(mode)


def _remove_other_host_images(keep: Path, mounts: str | None = None) -> None:
    """Every cached host image but `keep` (each about 5 GiB), except one a mounted overlay
    still has as a layer (hosts of `make local` left running on an older one) and one baked
    within the last hour (another checkout's, which its fleet may be about to mount).
    `mounts`: the mount table (/proc/self/mounts)."""
    mounted = Path("/proc/self/mounts").read_text() if mounts is None else mounts
    for other in CACHE_DIR.glob("host-image-*"):
        complete = other / ".complete"
        if other == keep or f"{other}/" in mounted:
            continue
        if complete.exists() and time.time() - complete.stat().st_mtime < HOST_IMAGE_KEPT_SECONDS:
            continue
        shutil.rmtree(other)


# --- servers on the bridge -----------------------------------------------------------


def _tcp_listeners(port: int) -> list[tuple[str, int, int]]:
    """(address, uid, socket inode) of every IPv4 socket listening on `port` in this
    network namespace (the kernel's /proc/net/tcp: little-endian hex address, state 0A)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, port_hex = fields[1].split(":")
        if fields[3] == "0A" and int(port_hex, 16) == port:
            found.append((socket.inet_ntoa(bytes.fromhex(address)[::-1]), int(fields[7]), int(fields[9])))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def serve_on_bridge(command: list[str], address: str, port: int, log: Path, what: str, timeout: float = 60):
    """Start `command`, a server the hosts will reach at address:port, and return it once
    the socket listening there is its own. The port is a fixed unprivileged one, which any
    local user may bind first: then the hosts would install from, or stage a model from,
    that user's server. Another process's listener there, or our server's exit before it
    listens, stops the run with what happened (issue 33 point 5)."""

    def taken() -> str | None:
        for listening, uid, _ in _tcp_listeners(port):
            if listening in (address, "0.0.0.0"):
                return f"{listening}:{port} is held by another process (uid {uid}), not this run's {what}"
        return None

    if (held := taken()) is not None:
        raise RuntimeError(f"{address}:{port} cannot serve the hosts' {what}: {held}. Fix: stop that process")
    with open(log, "ab") as output:
        server = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            said = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            held = taken()
            reason = f" ({held})" if held else ""
            raise RuntimeError(f"the hosts' {what} exited with {server.returncode} before it listened{reason}: {said}")
        # Listeners first: a socket listening by then was opened before, so its inode is
        # among the server's descriptors if it is the server's. One bound by another
        # process meanwhile makes the server's own bind fail: it exits (above).
        listeners = _tcp_listeners(port)
        if any(inode in _socket_inodes(server.pid) for _, _, inode in listeners):
            return server
        if time.monotonic() > deadline:
            server.terminate()
            server.wait(timeout=10)
            raise RuntimeError(f"the hosts' {what} did not listen on {address}:{port} within {timeout:.0f} s")
        time.sleep(0.05)


# --- hosts ---------------------------------------------------------------------------


class AdoptedProcess:
    """A process another run of this program started and left running (`make local`),
    with the part of Popen's interface the teardown uses. It is not our child, so it
    cannot be waited for: it is gone when its PID is, or when the PID now names a
    process that started at another time (a reused PID is never signalled)."""

    def __init__(self, pid: int, started: str):
        self.pid, self.started = pid, started

    @staticmethod
    def start_time(pid: int) -> str:
        """The kernel's start time of `pid` (field 22 of /proc/PID/stat); '' if there is
        no such process or it has exited (a zombie, not yet reaped by its parent)."""
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            return ""
        return "" if fields[0] == "Z" else fields[19]

    def poll(self) -> int | None:
        return None if self.start_time(self.pid) == self.started else 0

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.2)
        return 0


def process_state(process) -> dict | None:
    """What AdoptedProcess needs to find `process` again, from another program."""
    if process is None or process.poll() is not None:
        return None
    return {"pid": process.pid, "started": AdoptedProcess.start_time(process.pid)}


def adopt(state: dict | None) -> AdoptedProcess | None:
    return AdoptedProcess(state["pid"], state["started"]) if state else None


def running_nspawns() -> dict[str, AdoptedProcess]:
    """Each running systemd-nspawn by the container name it was given (its `-M`): the
    parent, not a child it forked that has not yet exec'd its own program. One pass over
    /proc for a whole fleet."""
    found: dict[int, tuple[str, int]] = {}  # pid: (machine, parent pid)
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            if Path(argv[0]).name != "systemd-nspawn" or "-M" not in argv[:-1]:
                continue
            status = (cmdline.parent / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited while we listed
        machine = argv[argv.index("-M") + 1]
        found[int(cmdline.parent.name)] = (machine, int(status.split("PPid:")[1].split()[0]))
    running = {}
    for pid, (machine, parent) in found.items():
        if parent not in found and (started := AdoptedProcess.start_time(pid)):
            running[machine] = AdoptedProcess(pid, started)
    return running


@dataclass
class Host:
    name: str
    ip: str
    role: str  # "gateway" or "node"
    dir: Path
    netns_prefix: str  # its fleet's network's (Network.netns_prefix)
    process: subprocess.Popen | None = None
    binds: list[str] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"{self.netns_prefix}{self.name}"

    @property
    def veth(self) -> str:
        return f"{self.netns_prefix}v-{self.name}"[:15]

    @property
    def root(self) -> Path:
        return self.dir / "root"


def nvidia_smi_double_conf(gpus_per_node: int, gpu_name: str, gpu_memory_mib: int) -> str:
    """The nvidia-smi double's configuration: the GPUs it reports, and a driver of the
    image's CUDA (components/image.py DRIVER_CUDA_MAJOR): 580 brought CUDA 13.0."""
    return (
        f"GPUS={gpus_per_node}\nNAME={gpu_name}\nMEMORY_MIB={gpu_memory_mib}\n"
        f"DRIVER=580.95.05\nCUDA={image.DRIVER_CUDA_MAJOR}.0\n"
    )


class Fleet:
    """A gateway and `nodes` GPU-node hosts. Use as a context manager: everything it
    made (hosts, namespaces, the bridge, mounts, files) is removed on exit, also
    when a test fails."""

    def __init__(
        self,
        workdir: Path,
        nodes: int,
        authorized_key: str,
        private_key: str,
        gpus_per_node: int = 4,
        gpu_name: str = "NVIDIA A10G",
        gpu_memory_mib: int = 23028,
        efa_devices: int = 0,
        user_data: dict[str, str] | None = None,
        host_keys: dict[str, str] | None = None,
        wait_for_ssh: bool = True,
        model_cache_dir: str | None = None,
        network: Network = MAIN_NETWORK,
        baked_hosts: bool | None = None,
    ):
        """`user_data`: host name -> the script EC2 would hand that host (run at first
        boot as cloud-init's final stage does). `host_keys`: host name -> its SSH host key
        (private, OpenSSH), installed before sshd first starts as cloud-init's ssh module
        does with the user data's ssh_keys (or the key a user's own machine already has);
        a host without one gets keys of its own, as an image's first boot makes them.
        `wait_for_ssh=False` returns as soon as the hosts are started, as EC2 reports an
        instance running while it boots.
        `model_cache_dir`: hosts a user already has (config hosts) have the shared
        directory mounted there (modelCacheDir), and the stack binds it as the model
        cache and its wheels/ as the wheelhouse itself; None: EFS's two trees, mounted
        where the user data finds them. `network`: its bridge and addresses (another
        fleet may run on another network at the same time). `baked_hosts`: the node hosts
        boot from the host image (host_image) or, False, from the base image (None:
        baked_hosts_by_default)."""
        self.network = network
        self.baked_hosts = baked_hosts_by_default() if baked_hosts is None else baked_hosts
        # The node hosts' image layer over the base image (host_image), when baked.
        self.node_image: Path | None = None
        self.workdir = Path(workdir)
        self.authorized_key = authorized_key.strip()
        self.key_file = self.workdir / "ssh-key"
        self.shared = self.workdir / "model-cache"
        # The wheelhouse's own tree on the same file system (its own access point on AWS).
        self.wheelhouse = self.workdir / "wheelhouse"
        self.model_cache_dir = model_cache_dir
        if model_cache_dir is not None:
            self.wheelhouse = self.shared / "wheels"  # where the stack's setup looks for it
        self.gateway = self._host("gateway", network.gateway_ip, "gateway")
        self.nodes = [self._host(f"node{i}", network.node_ip(i), "node") for i in range(nodes)]
        self._private_key = private_key
        # What the nvidia-smi double reports on every node host (default: a g5.12xlarge).
        self.gpu_conf = nvidia_smi_double_conf(gpus_per_node, gpu_name, gpu_memory_mib)
        # What the fi_info double reports on every node host: the type's EFA interfaces.
        self.efa_devices = efa_devices
        self.user_data = dict(user_data or {})
        self.host_keys = dict(host_keys or {})
        # Every host's public key by address: what the fleet's own ssh pins.
        self.known_hosts = self.workdir / "known_hosts"
        self.wait_at_start = wait_for_ssh
        self._start_bookkeeping()

    def _start_bookkeeping(self) -> None:
        """What the fleet will have made and started, for the teardown to undo, and the
        checks of the hosts' boots: all empty until start()."""
        self._mirror: subprocess.Popen | None = None
        self._made_bridge = False
        self.run_id = f"{os.getpid()}{int(time.time()) % 100000}"
        self._netns: list[str] = []
        self._mounts: list[Path] = []
        # Host name -> the check of its latest boot (localhosts/boot_check.py), and the
        # threads that check them. The lock keeps a check from booting a host again
        # while the fleet stops.
        self.boot_checks: dict[str, boot_check.BootCheck] = {}
        self._boot_checkers: list[threading.Thread] = []
        self._machinery_units: frozenset[str] = frozenset()
        self._stopping = threading.Event()
        self._boot_lock = threading.Lock()

    def _host(self, name: str, ip: str, role: str) -> Host:
        return Host(name, ip, role, self.workdir / name, self.network.netns_prefix)

    @property
    def hosts(self) -> list[Host]:
        return [self.gateway, *self.nodes]

    def __enter__(self) -> "Fleet":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- bring-up --------------------------------------------------------------------

    def start(self) -> None:
        (rootfs, mirror), house = base_rootfs(), fleet_wheelhouse()
        self.node_image = host_image(rootfs, mirror) if self.baked_hosts else None
        self._machinery_units = boot_check.image_units(rootfs) | boot_check.MACHINERY_DOUBLES
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.key_file.write_text(self._private_key)
        self.key_file.chmod(0o600)
        self.known_hosts.write_text("")
        self.shared.mkdir(exist_ok=True)
        self._network()
        self._serve_mirror(mirror)
        link_wheelhouse(house, self.wheelhouse)
        for host in self.hosts:
            self._prepare(host, rootfs)
            if host.role == "node":
                host.binds = self._node_binds(host)
        with ThreadPoolExecutor(len(self.hosts)) as pool:
            list(pool.map(lambda host: self.boot(host, wait=self.wait_at_start), self.hosts))

    def _serve_mirror(self, mirror: Path) -> None:
        """The package mirror on the bridge, where the hosts' apt sources point: started
        once its port is known to be its own (serve_on_bridge)."""
        command = [sys.executable, "-m", "http.server", "--bind", self.network.bridge_ip]
        command += ["--directory", str(mirror), str(MIRROR_PORT)]
        self._mirror = serve_on_bridge(
            command, self.network.bridge_ip, MIRROR_PORT, self.workdir / "apt-mirror.log", what="package mirror"
        )

    def _network(self) -> None:
        self._remove_leftovers()
        bridge = self.network.bridge
        _run("ip", "link", "add", bridge, "type", "bridge")
        self._made_bridge = True
        _run("ip", "addr", "add", f"{self.network.bridge_ip}/{PREFIX_LENGTH}", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        for host in self.hosts:
            self._plug(host)

    def _plug(self, host: Host) -> None:
        """The host's network namespace, on the bridge at its own IP."""
        _run("ip", "netns", "add", host.netns)
        self._netns.append(host.netns)
        _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _run("ip", "link", "set", host.veth, "master", self.network.bridge, "up")
        _run("ip", "-n", host.netns, "addr", "add", f"{host.ip}/{PREFIX_LENGTH}", "dev", "eth0")
        _run("ip", "-n", host.netns, "link", "set", "eth0", "up")
        _run("ip", "-n", host.netns, "link", "set", "lo", "up")

    def add_node(self, user_data: str | None = None, host_key: str | None = None) -> Host:
        """One more GPU-node host, at the next free address, started with `user_data` (and
        the SSH `host_key` its user data installs) and not waited for: a new instance EC2
        launches into the running fleet, as Pulumi creates a replacement before it deletes
        the old one. Removed with the fleet."""
        rootfs, _ = base_rootfs()
        index = len(self.nodes)
        host = self._host(f"node{index}", self.network.node_ip(index), "node")
        if user_data is not None:
            self.user_data[host.name] = user_data
        if host_key is not None:
            self.host_keys[host.name] = host_key
        self.nodes.append(host)
        self._plug(host)
        self._prepare(host, rootfs)
        host.binds = self._node_binds(host)
        self.boot(host, wait=False)
        return host

    def _node_binds(self, host: Host) -> list[str]:
        """The model cache, and the host's instance store "disk" where the stand-in of the
        image's script finds it."""
        return [*self._model_cache_binds(host), f"--bind={self.instance_store_disk(host)}:{INSTANCE_STORE_DISK}"]

    @staticmethod
    def instance_store_disk(host: Host) -> Path:
        """The node host's instance store as this machine holds it: a directory beside its
        root file system (so never on the root volume the host writes), which the stand-in
        of the image's script formats (if blank) and mounts at image.NVME_MOUNT at every
        boot. A reboot keeps it; EC2 hands it back blank on a start after a stop
        (tests/fleet_ec2.py FleetEc2.start empties it)."""
        return host.dir / "instance-store"

    def _model_cache_binds(self, host: Host) -> list[str]:
        """The model cache, where the node's setup finds it mounted. On AWS only the
        wheelhouse writer's role may write the wheelhouse's access point (EFS refuses the
        others' writes; components/storage.py): here a read-only bind imitates that, for
        every host but the one whose user data makes it the writer, as its instance
        profile does on AWS. The model tree likewise: only gang 0's nodes' roles may
        write it (topology.writes_model_tree), so another gang's node, whose name its
        user data gives with its gang's prefix (topology.gang_prefix), binds it read-only."""
        if self.model_cache_dir is not None:
            # A shared mount the user made: every host the same, read-write.
            return [f"--bind={self.shared}:{self.model_cache_dir}"]
        user_data = self.user_data.get(host.name, "")
        writer = "WHEELHOUSE_WRITER=true" in user_data
        model_writer = re.search(r"^NODE_NAME=gang[0-9]+-", user_data, re.MULTILINE) is None
        return [
            f"--bind{'' if model_writer else '-ro'}={self.shared}:/mnt/vllm-models",
            f"--bind{'' if writer else '-ro'}={self.wheelhouse}:/mnt/vllm-wheelhouse",
        ]

    def _remove_leftovers(self) -> None:
        """A fleet of an earlier run that was killed before its teardown: same names, ours.
        Its bridge means a fleet is up (or was killed): refused at once. Its veths alone
        mean a fleet that stopped moments ago: waited for (await_leftover_links)."""
        bridge = self.network.bridge
        if _link_exists(bridge):
            raise RuntimeError(
                f"bridge {bridge} exists: another fleet is running on its network, or a killed run left it. "
                f"Remove it with: ip link del {bridge}; ip netns list | grep {self.network.netns_prefix}"
            )
        prefix = self.network.netns_prefix
        namespaces = _namespaces_named(prefix)
        if namespaces:
            # Named namespaces are a fleet not torn down, not one the kernel is still freeing.
            raise RuntimeError(
                f"network namespaces {', '.join(namespaces)} exist: a fleet on this network is running or "
                f"was killed before its teardown. Remove them with: "
                + "; ".join(f"ip netns del {name}" for name in namespaces)
            )
        # Every veth of this network, the nodes an earlier run added (add_node) among them.
        veths = functools.partial(_links_named, f"{prefix}v-")
        left = await_leftover_links(veths, LEFTOVER_LINK_WAIT_SECONDS, time.sleep, time.monotonic)
        if left:
            raise RuntimeError(leftover_links_error(left, LEFTOVER_LINK_WAIT_SECONDS))

    def _prepare(self, host: Host, rootfs: Path) -> None:
        """The host's root file system, before its first boot: its own layer over the
        image, its names, keys and package sources, the doubles where the image has the
        real tools, the user data cloud-init finds, and the login's key."""
        self._mount_root(host, rootfs)
        (host.root / "etc" / "hostname").write_text(f"{host.name}\n")
        (host.root / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n{host.ip} {host.name}\n")
        self._install_host_keys(host)
        # The image's package sources point at a mirror; here, the fleet's own.
        (host.root / "etc" / "apt" / "sources.list").write_text(
            f"deb [trusted=yes] http://{self.network.bridge_ip}:{MIRROR_PORT}/ ./\n"
        )
        for listed in (host.root / "etc" / "apt" / "sources.list.d").glob("*"):
            listed.unlink()
        self._install_double(host, "bin/cloud-final", f"{FLEET_LIB}/cloud-final")
        self._enable_double(host, "cloud-final-double.service")
        self._enable_double(host, "slow-boot-double.service")
        (host.root / "etc" / "slow-boot-double.conf").write_text(f"NOLOGIN_SECONDS={NOLOGIN_SECONDS[host.role]}\n")
        if host.role == "gateway":
            # The host that runs apt at first boot (nginx) meets another apt holding the lists lock.
            self._install_double(host, "bin/hold-apt-lists-lock", f"{FLEET_LIB}/hold-apt-lists-lock")
            self._enable_double(host, "apt-lock-double.service")
            (host.root / "etc" / "apt-lock-double.conf").write_text(f"APT_LOCK_SECONDS={APT_LOCK_SECONDS}\n")
        if host.role == "node":
            self._install_node_doubles(host)
        if host.name in self.user_data:
            # Where cloud-init keeps the user data EC2 handed it at launch.
            script = host.root / "var" / "lib" / "cloud" / "instance" / "scripts" / "part-001"
            script.parent.mkdir(parents=True, exist_ok=True)
            script.write_text(self.user_data[host.name])
            script.chmod(0o700)
        ssh_dir = host.root / "home" / SSH_USER / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        # What EC2 and cloud-init do with the instance's key pair.
        (ssh_dir / "authorized_keys").write_text(self.authorized_key + "\n")
        uid_gid = _uid_gid(host.root, SSH_USER)
        for path in (ssh_dir, ssh_dir / "authorized_keys"):
            os.chown(path, *uid_gid)
        (ssh_dir / "authorized_keys").chmod(0o600)

    def _mount_root(self, host: Host, rootfs: Path) -> None:
        """The host's root: a layer of its own (overlayfs) over the image, which its
        writes never reach."""
        for sub in ("upper", "work", "root"):
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
        # A node host's disk: the host image over the base image, when baked.
        lower = f"{self.node_image}:{rootfs}" if host.role == "node" and self.node_image else str(rootfs)
        _run(
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={host.dir / 'upper'},workdir={host.dir / 'work'}",
            str(host.root),
        )
        self._mounts.append(host.root)

    def _install_node_doubles(self, host: Host) -> None:
        """No GPU and no EFA here: the doubles, where the image has the real tools; and
        the locked-memory limit and instance store a GPU instance has."""
        self._install_double(host, "bin/nvidia-smi", image.NVIDIA_SMI)
        (host.root / "etc" / "nvidia-smi-double.conf").write_text(self.gpu_conf)
        self._install_double(host, "bin/fi_info", image.FI_INFO)
        (host.root / "etc" / "fi-info-double.conf").write_text(f"EFA_DEVICES={self.efa_devices}\n")
        if self.efa_devices:
            # With EFA on, aws-ofi-nccl's NCCL plugin, where the image has it.
            plugin = f"{image.OFI_NCCL_LIB_DIRS[0]}/{image.OFI_NCCL_PLUGIN}"
            self._install_double(host, f"lib/{image.OFI_NCCL_PLUGIN}", plugin)
        # This machine cannot grant more locked memory than its own hard limit (no
        # CAP_SYS_RESOURCE: 8 MiB here, unlimited on EC2), which is also systemd's
        # default for services. A lower default keeps a unit that lifts its limit (it
        # gets the host's maximum) apart from one that does not (it keeps the default).
        conf = host.root / "etc" / "systemd" / "system.conf.d" / "fleet-limits.conf"
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("[Manager]\nDefaultLimitMEMLOCK=64K\n")
        # The image formats the instance store and mounts it at every boot, by a unit of
        # its own (components/image.py NVME_MOUNT, NVME_SETUP_UNIT): here the stand-ins
        # of its unit and script, where the image has them, mount the host's "disk"
        # (instance_store_disk) after a while, as the real one takes its time.
        self._make_nvme_mount_point(host)
        self.instance_store_disk(host).mkdir(exist_ok=True)
        self._install_double(host, "bin/nvme_ephemeral_drives.sh", image.NVME_SETUP_SCRIPT)
        self._enable_double(host, image.NVME_SETUP_UNIT)
        (host.root / "etc" / "instance-store-double.conf").write_text(f"FORMAT_SECONDS={NVME_FORMAT_SECONDS}\n")

    def _install_host_keys(self, host: Host) -> None:
        """The host's SSH host keys, before its sshd first starts: the one it was given
        (cloud-init's ssh module: the image's keys deleted, the given key written 0600, its
        public half 0644; cloudinit/config/cc_ssh.py), or keys of its own. Its public
        ed25519 key joins the fleet's known_hosts."""
        ssh = host.root / "etc" / "ssh"
        if host.name in self.host_keys:
            for old in ssh.glob("ssh_host_*key*"):
                old.unlink()
            private = ssh / "ssh_host_ed25519_key"
            private.write_text(self.host_keys[host.name])
            private.chmod(0o600)
            public = _run("ssh-keygen", "-y", "-f", str(private)).stdout
            (ssh / "ssh_host_ed25519_key.pub").write_text(public)
            (ssh / "ssh_host_ed25519_key.pub").chmod(0o644)
        else:
            _run("ssh-keygen", "-A", "-f", str(host.root))
        key_type, blob = (ssh / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        with self.known_hosts.open("a") as known:
            known.write(f"{host.ip} {key_type} {blob}\n")

    @staticmethod
    def _make_nvme_mount_point(host: Host) -> None:
        """The mount point on the root volume, root's, 0755: what a stage written before the
        mount fills, and the mount then hides (the image's script would make it too)."""
        nvme = host.root / image.NVME_MOUNT.lstrip("/")
        nvme.mkdir(parents=True, exist_ok=True)
        for path in (nvme.parent, nvme):  # /opt/dlami and the mount point (/opt is the base's)
            os.chown(path, 0, 0)
            path.chmod(0o755)

    @staticmethod
    def _install_double(host: Host, double: str, path: str) -> None:
        target = host.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DOUBLES / double, target)
        target.chmod(0o755)

    @staticmethod
    def _enable_double(host: Host, unit: str) -> None:
        """A test double's systemd unit, enabled as `systemctl enable` would."""
        units = host.root / "etc" / "systemd" / "system"
        shutil.copy(DOUBLES / "units" / unit, units / unit)
        wants = units / "multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        link = wants / unit
        if not link.is_symlink():
            link.symlink_to(f"/etc/systemd/system/{unit}")

    def boot(self, host: Host, wait: bool = True) -> None:
        """Start the host and, in the background, check its boot (never waited for here:
        the replay starts while hosts boot); with `wait`, return once SSH logs in."""
        self._start_host(host)
        self._check_boot_in_background(host)
        if wait:
            self.wait_for_ssh(host)

    def _start_host(self, host: Host) -> None:
        log = open(host.dir / "console.log", "ab")
        host.process = subprocess.Popen(
            # A machine name of this run's own: nspawn keeps per-machine state under
            # /run/systemd/nspawn that an earlier run's container may have left behind.
            [
                "systemd-nspawn",
                "-D",
                str(host.root),
                "--boot",
                "--register=no",
                "--keep-unit",
                f"--network-namespace-path=/run/netns/{host.netns}",
                # Root on an instance may change its own firewall (the nodes' setup keeps
                # the service user from the metadata service with iptables): here only in
                # the host's own network namespace, which this run made.
                "--capability=CAP_NET_ADMIN",
                "-M",
                self.machine(host),
                f"--hostname={host.name}",
                *self._cpu_affinity(host),
                *host.binds,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def machine(self, host: Host) -> str:
        return f"{host.name}-{self.run_id}"

    def _cpu_affinity(self, host: Host) -> list[str]:
        """Each node host of a fleet gets a core of its own (round robin over this
        machine's), as each EC2 instance has its own: the real engine's OpenMP threads on
        two hosts sharing all cores spin against each other (pipeline stages ran ~18x
        slower). Two fleets side by side (make test) each spread theirs the same way, so
        on 2 cores each core carries one node of each fleet."""
        if host.role != "node":
            return []
        cores = sorted(os.sched_getaffinity(0))
        return [f"--cpu-affinity={cores[self.nodes.index(host) % len(cores)]}"]

    def wait_for_ssh(self, host: Host, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout + NOLOGIN_SECONDS[host.role]
        while time.monotonic() < deadline:
            if host.process is not None and host.process.poll() is not None:
                raise RuntimeError(f"{host.name} exited while booting; see {host.dir / 'console.log'}")
            if self.ssh(host, "true", check=False, timeout=30).returncode == 0:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{host.name} ({host.ip}) did not answer SSH within {timeout:g} s")

    # --- operating ---------------------------------------------------------------------

    def ssh_command(self, host: Host, command: str) -> list[str]:
        """Nodes through the gateway, as the stack reaches them."""
        jump = self.network.gateway_ip if host.role == "node" else None
        return ssh_args(self.key_file, self.known_hosts, SSH_USER, host.ip, command, SSH_USER, jump)

    def ssh(
        self, host: Host, command: str, *, input: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.ssh_command(host, command), input=input, capture_output=True, text=True, timeout=timeout
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{host.name}: {command!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result

    def power_off(self, host: Host, timeout: float = 20) -> None:
        """SIGTERM to the host's nspawn (an orderly poweroff inside); if the host has not
        halted in `timeout` seconds, SIGKILL to every process in its network namespace
        (its init included: a plug pulled), then to nspawn."""
        if host.process is None or host.process.poll() is not None:
            return
        host.process.send_signal(signal.SIGTERM)
        try:
            host.process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            pass
        for pid in self.processes_of(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it exited between the listing and the kill
        try:
            host.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(host.process.pid, signal.SIGKILL)
            host.process.wait(timeout=10)

    def _kill_what_is_left(self, timeout: float = 20) -> None:
        """Whatever still runs in a host's namespace after the power-off: a host booted
        again after `make local` recorded its PID (a reboot starts a new nspawn), or one
        that did not halt. Its init killed, its nspawn exits."""
        deadline = time.monotonic() + timeout
        for host in self.hosts:
            while host.netns in self._netns and (left := self.processes_of(host)):
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue  # it exited between the listing and the kill
                if time.monotonic() > deadline:
                    print(f"fleet: {host.name}: processes {left} outlived SIGKILL", file=sys.stderr)
                    break
                time.sleep(0.2)

    @staticmethod
    def processes_of(host: Host) -> list[int]:
        """Every process inside the host's network namespace (all of them ours)."""
        listed = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True)
        return [int(pid) for pid in listed.stdout.split()]

    def reboot(self, host: Host) -> None:
        self.power_off(host)
        self.boot(host)

    # --- each boot checked (localhosts/boot_check.py) ------------------------------------

    def _check_boot_in_background(self, host: Host) -> None:
        thread = threading.Thread(target=self._check_boot, args=(host,), name=f"boot-check-{host.name}", daemon=True)
        self._boot_checkers.append(thread)
        thread.start()

    def _check_boot(self, host: Host) -> None:
        check = self.boot_checks[host.name] = boot_check.BootCheck(host.name)
        boot_check.check_host_boot(
            check,
            watch=lambda: self._watch_boot(host),
            boot_again=lambda: self._boot_again(host),
            say=lambda message: print(f"localhosts: {message}", file=sys.stderr, flush=True),
        )

    def _watch_boot(self, host: Host) -> boot_check.Boot:
        """Watch the boot of the host's running nspawn; over when that one is (powered
        off, booted anew by a test) or the fleet stops."""
        process = host.process

        def still_up() -> bool:
            return not self._stopping.is_set() and host.process is process and process.poll() is None

        return boot_check.watch_boot(lambda *command: self._in_host(host, *command), self._machinery_units, still_up)

    def _in_host(self, host: Host, *command: str) -> tuple[int, str] | None:
        """(exit status, stdout) of `command` run inside the host (its mount and PID
        namespaces, entered through its init), as root and without a login (which a
        booting host refuses); None while the host has no init, or lost it."""

        def proc_status(pid: int) -> str | None:
            try:
                return Path(f"/proc/{pid}/status").read_text()
            except FileNotFoundError:
                return None  # it exited between the listing and the read

        init = boot_check.init_pid(self.processes_of(host), proc_status)
        if init is None:
            return None
        entered = ["nsenter", f"--target={init}", "--mount", "--pid", "--", *command]
        result = subprocess.run(entered, capture_output=True, text=True, timeout=60)
        if result.stderr.startswith("nsenter:"):
            return None  # the init exited between the listing and the entering
        return result.returncode, result.stdout

    def _boot_again(self, host: Host) -> bool:
        """Power the host off and boot it again, with its disk (user data, binds) as it
        is; not when the fleet is stopping (False then)."""
        with self._boot_lock:
            if self._stopping.is_set():
                return False
            self.power_off(host)
            self._start_host(host)
            return True

    def wait_for_boot_checks(self, timeout: float) -> dict[str, boot_check.BootCheck]:
        """The checks of every host's latest boot, once the checks started so far ended
        (or `timeout` seconds passed)."""
        deadline = time.monotonic() + timeout
        for thread in list(self._boot_checkers):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return dict(self.boot_checks)

    def raise_boot_failures(self, cause: BaseException | None = None) -> None:
        """HostBootError naming each host whose boot failed twice, and its units (raised
        from `cause`, what failed because of it), if there is such a host."""
        broken = [check for check in self.boot_checks.values() if check.broken]
        if broken:
            consoles = {host.name: host.dir / "console.log" for host in self.hosts}
            raise boot_check.HostBootError(broken, consoles) from cause

    # --- left running, torn down later (make local, make local-down) ------------------------

    def state(self) -> dict:
        """Everything the teardown needs, as JSON: `Fleet.adopt(state).stop()` in another
        process removes this fleet."""
        return {
            "workdir": str(self.workdir),
            "nodes": len(self.nodes),
            "run_id": self.run_id,
            "hosts": {host.name: process_state(host.process) for host in self.hosts},
            "mirror": process_state(self._mirror),
            "netns": list(self._netns),
            "mounts": [str(mount) for mount in self._mounts],
            "bridge": self._made_bridge,
            "network": self.network.state(),
        }

    @classmethod
    def adopt(cls, state: dict) -> "Fleet":
        # A target recorded before fleets had networks of their own ran on the main one.
        network = Network(**state["network"]) if "network" in state else MAIN_NETWORK
        fleet = cls(Path(state["workdir"]), state["nodes"], authorized_key="", private_key="", network=network)
        fleet.run_id = state["run_id"]
        running = running_nspawns()
        for host in fleet.hosts:
            # A host booted again since (a reboot, an idle stop and wake) runs in an nspawn
            # the state never recorded: found by its run's machine name, the teardown powers
            # it off and waits for it, not only for its namespace to empty.
            host.process = running.get(fleet.machine(host)) or adopt(state["hosts"].get(host.name))
        fleet._mirror = adopt(state["mirror"])
        fleet._netns = list(state["netns"])
        fleet._mounts = [Path(mount) for mount in state["mounts"]]
        fleet._made_bridge = state["bridge"]
        return fleet

    # --- teardown ------------------------------------------------------------------------

    def stop(self) -> None:
        with self._boot_lock:  # no boot check boots a host again from now on
            self._stopping.set()

        def power_off(host: Host) -> None:
            try:
                self.power_off(host)
            except (OSError, subprocess.SubprocessError) as error:
                print(f"fleet: stopping {host.name}: {error}", file=sys.stderr)

        with ThreadPoolExecutor(len(self.hosts)) as pool:
            list(pool.map(power_off, self.hosts))
        self._kill_what_is_left()
        if self._mirror is not None:
            self._mirror.terminate()
            self._mirror.wait(timeout=10)
            self._mirror = None
        for mount in reversed(self._mounts):
            subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)
        self._mounts.clear()
        for netns in self._netns:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        self._netns.clear()
        if self._made_bridge:
            subprocess.run(["ip", "link", "del", self.network.bridge], capture_output=True)
            self._made_bridge = False
        for host in self.hosts:
            if host.dir.exists():
                shutil.rmtree(host.dir / "upper", ignore_errors=True)
                shutil.rmtree(host.dir / "work", ignore_errors=True)
            # What nspawn made for this run's machine and could not remove itself.
            propagate = Path("/run/systemd/nspawn/propagate") / self.machine(host)
            if propagate.is_dir() and not any(propagate.iterdir()):
                propagate.rmdir()


def _uid_gid(root: Path, user: str) -> tuple[int, int]:
    for line in (root / "etc" / "passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise KeyError(user)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-cluster-fleet"))
    args = parser.parse_args()
    reason = why_no_fleet()
    if reason:
        print(f"cannot host the fleet: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        key = Path(scratch) / "key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        with Fleet(args.workdir, args.nodes, (Path(scratch) / "key.pub").read_text(), key.read_text()) as fleet:
            print(f"gateway {fleet.gateway.ip}; nodes " + ", ".join(h.ip for h in fleet.nodes))
            print(f"ssh: {' '.join(fleet.ssh_command(fleet.nodes[0], ''))}")
            print("Ctrl-C tears the fleet down.")
            try:
                signal.pause()
            except KeyboardInterrupt:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
