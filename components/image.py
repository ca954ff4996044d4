"""The GPU nodes' image: every fact the program, the node scripts, preflight, the
planner and the tests rely on about it, in one place, each with its source.

The image is the AWS Deep Learning Base OSS Nvidia Driver GPU AMI for Ubuntu 24.04.
The Ubuntu 22.04 flavour cannot serve: its Python is 3.10 and vLLM 0.32 and later
declare Requires-Python >=3.11, so installing vLLM there fails (see versions.py).

Sources:
- [release-notes] AWS DLAMI release notes, "AWS Deep Learning Base OSS Nvidia Driver
  GPU AMI (Ubuntu 24.04)": the AMI name, the owner `amazon`, `python_location
  /usr/bin/python3.12`, the local NVMe instance store mounted at /opt/dlami/nvme,
  the EFA installer and aws-ofi-nccl included (read 2026-11-30, ../shared/FACTS.md
  section 9).
  https://docs.aws.amazon.com/dlami/latest/devguide/appendix-ami-release-notes.html
- [efa-guide] EC2 User Guide, "Get started with EFA and NCCL": the EFA installer puts
  libfabric and its tools (fi_info) under /opt/amazon/efa and aws-ofi-nccl under
  /opt/amazon/ofi-nccl; /opt/amazon/efa/bin is not on sudo's secure_path, so tools
  are called by full path. The installer raises the locked-memory limit in
  /etc/security/limits.d, which systemd services do not read.
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html
- [ofi-nccl] aws/aws-ofi-nccl (configure.ac `--disable-nccl-net-symlink`, src/Makefile.am
  `libnccl-net.la` and `libnccl-net-ofi.la`, read 2026-12-01); NCCL's net plugin loading
  (libnccl-net.so, or libnccl-net-${NCCL_NET_PLUGIN}.so when that is set).
  https://github.com/aws/aws-ofi-nccl
- [ubuntu-noble] Ubuntu 24.04 (noble) ships glibc 2.39 (its libc6 package, 2.39-0ubuntu8):
  the newest manylinux wheels the image runs are manylinux_2_39.
  https://packages.ubuntu.com/noble/libc6
- [ubuntu-ami] Ubuntu's EC2 images (and the DLAMI built on them): the default user
  is `ubuntu`, with passwordless sudo, set up by cloud-init.
  https://documentation.ubuntu.com/aws/en/latest/aws-how-to/instances/connect-to-instance/
- [ubuntu-manifest] Ubuntu's server cloud images list libpam-systemd in their package
  manifest (pam_systemd in common-session): systemd-logind registers every login, an
  SSH command without a terminal included, as a session (`loginctl list-sessions`).
  https://cloud-images.ubuntu.com/releases/noble/release/ubuntu-24.04-server-cloudimg-amd64.manifest
  https://www.freedesktop.org/software/systemd/man/latest/pam_systemd.html
- [nvidia-reg] NVIDIA's kernel modules create /dev/nvidia* with mode 0666 unless the
  DeviceFileMode parameter says otherwise (open-gpu-kernel-modules, kernel-open/nvidia/
  nv-reg.h, "The default mode is 0666"): a service user needs no group for the GPUs.
  https://github.com/NVIDIA/open-gpu-kernel-modules
- [linux-uverbs] The kernel creates /dev/infiniband/uverbsN, the devices EFA's libfabric
  opens, with mode 0666 (drivers/infiniband/core/uverbs_main.c, uverbs_devnode).
  https://github.com/torvalds/linux/blob/master/drivers/infiniband/core/uverbs_main.c
- [nvme-setup] How the image sets the instance store up at every boot. No AWS document
  names it (the release notes say only that it is mounted at /opt/dlami/nvme); users of
  the image report it, in public repositories that inspect or reproduce it (read
  2026-12-05): the enabled unit `dlami-nvme.service` ("Mount Ephemeral NVME Storage to
  DLAMI", Type=oneshot, After=network-online.target, WantedBy=multi-user.target) runs
  /opt/aws/dlami/bin/nvme_ephemeral_drives.sh, which joins the instance store's disks into
  one LVM volume (vg.01/lv_ephemeral), formats it ext4 when it is blank (after every start:
  EC2 hands a stopped instance's store back empty) and mounts it with `mount`: no fstab
  line, no mount unit file. Its script is AWS ParallelCluster's setup-ephemeral-drives.sh
  adapted (it says so in its header), whose code reads as described:
  https://github.com/aws/aws-parallelcluster-cookbook/blob/88ba324a292fab03b59e8832823c0b7839968156/cookbooks/aws-parallelcluster-environment/files/setup-ephemeral-drives.sh
  The image's copy is reported to exit 0 on its errors, so the unit succeeding does not
  prove the store is mounted. Where the unit file sits in the image is not reported; the
  reproductions install it in /etc/systemd/system.
- [systemd-mounts] systemd's RequiresMountsFor= adds After= only on mount units loaded when
  the unit is, and Requires= only on those with a unit file (src/core/unit.c,
  unit_add_mount_dependencies): a mount made by a script's `mount` has no unit until it
  exists, so at boot it orders nothing against the store and only ordering after the
  image's unit does.
  https://github.com/systemd/systemd/blob/main/src/core/unit.c
- [imds] EC2 User Guide, "Access instance metadata for an EC2 instance": the instance
  metadata service answers on 169.254.169.254 and, on Nitro instances with the IPv6
  endpoint on, on fd00:ec2::254; the node role's credentials are served there.
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html
"""

from __future__ import annotations

# [release-notes] The AMI the program looks up when amiId is empty: the newest one.
DLAMI_OWNER = "amazon"
DLAMI_NAME_PATTERN = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04) *"
DLAMI_DESCRIPTION = "AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04)"

# [ubuntu-manifest] logind sees every login (pam_systemd): the idle check's "nobody is
# logged in" (scripts/node/vllm-idle-check) reads logind first, then utmp. The local hosts
# lack it (localhosts/fleet.py BASE_PACKAGES says why): there only utmp's terminal logins show.
LOGIN_SESSIONS_PACKAGE = "libpam-systemd"

# [release-notes] The image's Python: where it is and which version.
PYTHON = "/usr/bin/python3.12"
PYTHON_VERSION = (3, 12)

# [ubuntu-noble] The image's C library: which binary wheels (manylinux_2_N, N <= 39) run on it.
GLIBC_VERSION = (2, 39)

# [efa-guide] Where the EFA installer puts libfabric, its tools and aws-ofi-nccl.
EFA_BIN_DIR = "/opt/amazon/efa/bin"
FI_INFO = f"{EFA_BIN_DIR}/fi_info"
EFA_LIB_DIR = "/opt/amazon/efa/lib"
# aws-ofi-nccl's NCCL net plugin; releases before 1.8 put it in lib/, later ones in
# lib/x86_64-linux-gnu: the node takes whichever exists.
OFI_NCCL_LIB_DIRS = ("/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu", "/opt/amazon/ofi-nccl/lib")
# [ofi-nccl] The file NCCL loads from those directories: aws-ofi-nccl's build installs
# libnccl-net.so, the same library as libnccl-net-ofi.so, unless configured with
# --disable-nccl-net-symlink (aws/aws-ofi-nccl configure.ac, src/Makefile.am), and NCCL
# loads libnccl-net.so when NCCL_NET_PLUGIN is unset (NCCL's net plugin documentation).
# Without it NCCL only warns and uses TCP sockets: setup and preflight refuse a node with
# EFA on that lacks it (vllm-cluster-node write_node_env, preflight-check).
OFI_NCCL_PLUGIN = "libnccl-net.so"

# [release-notes] The driver's CUDA: late-2026 releases ship driver 595 with CUDA 13.x
# (FACTS.md section 9, "Major package versions"). Preflight holds each node's
# `nvidia-smi` CUDA Version against what its lock's CUDA runtime needs; tests/test_image.py
# holds this against the GPU lock.
DRIVER_CUDA_MAJOR = 13

# The NVIDIA driver package installs nvidia-smi here (on sudo's secure_path).
NVIDIA_SMI = "/usr/bin/nvidia-smi"

# [release-notes] The image carries CUDA toolkits (its nvidia_cuda_stack), whose nvcc needs
# a host C/C++ compiler, and vLLM's engine compiles kernels at start (Triton, torch's
# inductor) with the system's C compiler. Inferred from the toolkits it ships, not read
# as a package line: check `gcc --version` on a new image.
C_COMPILER = "/usr/bin/gcc"

# [unverified] The Python headers (Python.h; python3.12-dev on Ubuntu 24.04) that Triton's
# launcher and torch's inductor compile against when the engine starts: the release notes
# do not list them. Setup installs pythonX.Y-dev when Python.h is missing
# (vllm-cluster-node ensure_python_headers), so a node serves either way; the local hosts
# (Debian 12, without them) take that path.

# [release-notes] The local NVMe instance store, formatted and mounted at boot.
NVME_MOUNT = "/opt/dlami/nvme"
# [nvme-setup] The image's unit that mounts it there at every boot, and its script. The
# stage on the instance store (vllm-prepare.service) is ordered after the unit, and refuses
# a NVME_MOUNT that is not a mount point when the type has a store (model-stage): the unit
# may have failed quietly, and on hosts that are not the image nothing orders the mount.
# [systemd-mounts] RequiresMountsFor=NVME_MOUNT alone would not order it.
NVME_SETUP_UNIT = "dlami-nvme.service"
NVME_SETUP_SCRIPT = "/opt/aws/dlami/bin/nvme_ephemeral_drives.sh"

# [nvidia-reg] [linux-uverbs] The GPUs' and EFA's device files, which the unprivileged
# service user that runs Ray and vLLM opens: world read-write on the image, so the user
# needs no group. Preflight checks it on each node (vllm-cluster-node guard-service), as
# an image may restrict them.
SERVICE_DEVICES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm")

# [imds] The addresses the service user is kept from (vllm-cluster-node guard-service).
INSTANCE_METADATA_ADDRESSES = ("169.254.169.254", "fd00:ec2::254")
# [imds] Where a node asks its own metadata (vllm-cluster-node stage_volume_launched).
INSTANCE_METADATA_URL = f"http://{INSTANCE_METADATA_ADDRESSES[0]}"

# [unverified] iptables (with its owner match) keeps the service user from the metadata
# service. Ubuntu's server images carry it for ufw, and Docker on the DLAMI needs it; setup
# installs the package when the command is missing (vllm-cluster-node guard-service), so a
# node is guarded either way. The local hosts (Debian minbase, without it) take that path.
IPTABLES = "/usr/sbin/iptables"

# [unverified] nft, nftables' command, which loads the nodes' host firewall (an nftables
# table of the stack's own: bootstrap.host_firewall; vllm-cluster-node load_firewall).
# Debian's and Ubuntu's nftables package installs it here and leaves its own
# nftables.service (which flushes the whole ruleset) disabled: its postinst enables the
# service only if it was enabled before (read in nftables_1.0.6-2+deb12u2's postinst).
# Whether the image has it is not read anywhere: setup installs the package when the
# command is missing (vllm-cluster-node ensure_nft), as on the local hosts (Debian
# minbase, without it).
NFT = "/usr/sbin/nft"

# [ubuntu-ami] The login the instance's key pair is authorized for.
DEFAULT_USER = "ubuntu"


def python_label(version: tuple[int, int] = PYTHON_VERSION) -> str:
    return f"{version[0]}.{version[1]}"
