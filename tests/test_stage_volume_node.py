"""How a node decides whether its stage goes on a gp3 stage volume and finds it
(scripts/node/vllm-cluster-node stage_volume_launched, find_stage_volume, mount_stage_volume):
from what the node was launched with, the instance metadata's block-device-mapping (asked as
the node asks it, with an IMDSv2 token, of the metadata double in tests/doubles/ec2_api.py),
not from what the stack says now; and the volume by udev's links of the volume id, never by
the NVMe kernel name (which follows discovery order), the one EBS volume that is not the
root file system's disk. Run by bash as the node runs it, over a by-id directory of links
laid out as udev makes them, with lsblk/findmnt doubles saying which disk holds /.
Formatting and mounting need a block device: not run here."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from doubles.ec2_api import CredentialStore, InstanceMetadataDouble
from test_shared_model_dir import LIBRARY, node_function

from components import bootstrap, image, stage_volume

ROOT_VOLUME = "vol0aaaaaaaaaaaaaaaa"
STAGE_VOLUME = "vol0bbbbbbbbbbbbbbbb"


def by_id_directory(tmp_path: Path, volumes: dict[str, str]) -> Path:
    """udev's /dev/disk/by-id for EBS NVMe disks (volume id -> kernel name): the whole
    disk, its namespace link and, for the root, its partition."""
    dev, by_id = tmp_path / "dev", tmp_path / "by-id"
    dev.mkdir()
    by_id.mkdir()
    for volume, kernel in volumes.items():
        (dev / kernel).touch()
        for name in (f"nvme-Amazon_Elastic_Block_Store_{volume}", f"nvme-Amazon_Elastic_Block_Store_{volume}_1"):
            (by_id / name).symlink_to(dev / kernel)
        if volume == ROOT_VOLUME:
            (dev / f"{kernel}p1").touch()
            (by_id / f"nvme-Amazon_Elastic_Block_Store_{volume}-part1").symlink_to(dev / f"{kernel}p1")
    return by_id


def find(tmp_path: Path, volumes: dict[str, str], root_disk: str) -> subprocess.CompletedProcess:
    doubles = tmp_path / "bin"
    doubles.mkdir()
    # Doubles of util-linux: findmnt names /'s partition, lsblk its parent disk.
    (doubles / "findmnt").write_text(f"#!/bin/sh\necho /dev/{root_disk}p1\n")
    (doubles / "lsblk").write_text(f"#!/bin/sh\necho {root_disk}\n")
    for tool in doubles.iterdir():
        tool.chmod(0o755)
    by_id = by_id_directory(tmp_path, volumes)
    script = "\n".join(
        ["set -euo pipefail", f". {LIBRARY}", node_function("find_stage_volume"), f"find_stage_volume {by_id}"]
    )
    return subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{doubles}:/usr/bin:/bin", **STAGE_VOLUME_ENV},
    )


# What cluster.env tells every node about the stage volume (bootstrap.cluster_env).
STAGE_VOLUME_ENV = {
    "STAGE_VOLUME_DEVICE_NAME": stage_volume.STAGE_VOLUME_DEVICE_NAME,
    "STAGE_VOLUME_BY_ID_PREFIX": stage_volume.STAGE_VOLUME_BY_ID_PREFIX,
    "STAGE_VOLUME_IMDS_MAPPINGS": stage_volume.IMDS_BLOCK_DEVICE_MAPPING,
    "IMDS_TOKEN_PATH": stage_volume.IMDS_TOKEN_PATH,
    "STAGE_VOLUME_MOUNT": stage_volume.STAGE_VOLUME_MOUNT,
    "STAGE_VOLUME_LABEL": stage_volume.STAGE_VOLUME_LABEL,
    "NVME_MOUNT": image.NVME_MOUNT,
    "LOCAL_MODEL_ROOT": bootstrap.LOCAL_MODEL_ROOT,
}


def launched(metadata_url: str, tmp_path: Path, by_id: str = "/nonexistent") -> subprocess.CompletedProcess:
    """stage_volume_launched, then, when it says yes, mount_stage_volume as prepare-serve
    calls it (through use_stage_volume) over `by_id`; mount and mkfs doubles record what
    would have been done."""
    doubles = tmp_path / "bin"
    doubles.mkdir(exist_ok=True)
    for tool in ("mount", "mkfs.ext4", "udevadm", "blkid", "mountpoint"):
        (doubles / tool).write_text(
            f'#!/bin/sh\necho {tool} "$@" >>{tmp_path}/done\n[ {tool} != mountpoint ] || exit 1\n'
        )
        (doubles / tool).chmod(0o755)
    script = "\n".join(
        [
            "set -euo pipefail",
            f". {LIBRARY}",
            *(node_function(name) for name in ("stage_volume_launched", "mount_stage_volume", "find_stage_volume")),
            "if stage_volume_launched; then echo launched-with; "
            f"find_stage_volume() {{ ls -d {by_id} 2>/dev/null || {{ log 'found 0'; return 1; }}; }}; "
            "mount_stage_volume; else echo launched-without; fi",
        ]
    )
    return subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": f"{doubles}:/usr/bin:/bin",
            **STAGE_VOLUME_ENV,
            "STAGE_VOLUME_MOUNT": str(tmp_path / "stage"),
            "INSTANCE_METADATA_URL": metadata_url,
        },
    )


@pytest.fixture
def metadata():
    servers = []

    def start(block_devices: dict[str, str]) -> str:
        server = InstanceMetadataDouble(
            "127.0.0.1", 0, role="vllm-node-role", credentials=CredentialStore(), block_devices=block_devices
        ).start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


def test_a_node_launched_with_the_stage_volume_uses_it(metadata, tmp_path):
    url = metadata({"ami": "/dev/sda1", "root": "/dev/sda1", "ebs1": "sdf"})
    volume = tmp_path / "nvme1n1"
    volume.touch()
    run = launched(url, tmp_path, by_id=str(volume))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "launched-with"
    assert "launched with a stage volume (ebs1, /dev/sdf)" in run.stderr
    done = (tmp_path / "done").read_text()
    assert f"mkfs.ext4 -q -L vllm-stage {volume}" in done and f"mount -o noatime {volume} {tmp_path}/stage" in done


def test_a_node_launched_without_it_keeps_the_instance_store_and_says_so(metadata, tmp_path):
    """A node running before its stack chose the volume: its metadata maps the root alone
    (or other volumes, not at the stage volume's device name)."""
    for devices in ({"ami": "/dev/sda1", "root": "/dev/sda1"}, {"ami": "/dev/sda1", "ebs2": "sdg"}):
        run = launched(metadata(devices), tmp_path)
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == "launched-without"
        said = "no stage volume: this node was launched without one (the metadata maps no /dev/sdf)"
        assert f"{said}; the stage goes on {image.NVME_MOUNT}" in run.stderr
        assert not (tmp_path / "done").exists()


def test_a_node_launched_with_it_that_cannot_find_it_stops_naming_the_volume(metadata, tmp_path):
    run = launched(metadata({"root": "/dev/sda1", "ebs1": "/dev/sdf"}), tmp_path, by_id=str(tmp_path / "absent"))
    assert run.returncode != 0 and run.stdout.strip() == "launched-with"
    assert (
        "this node was launched with a stage volume (/dev/sdf in its instance metadata) but none was found"
        in run.stderr
    )
    assert "mount" not in (tmp_path / "done").read_text().replace("mountpoint", "")


def test_without_instance_metadata_there_is_no_stage_volume(tmp_path):
    """Your own hosts and the local fleet: nothing answers at the metadata address."""
    run = launched("http://127.0.0.1:9", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "launched-without"
    assert "no stage volume: no instance metadata at http://127.0.0.1:9 (not an EC2 instance)" in run.stderr


def test_the_stage_volume_is_the_ebs_volume_beside_the_root_whatever_its_kernel_name(tmp_path):
    # Discovery order put the stage volume first this boot: nvme0n1 is not the root.
    found = find(tmp_path, {STAGE_VOLUME: "nvme0n1", ROOT_VOLUME: "nvme1n1"}, root_disk="nvme1n1")
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(tmp_path / "by-id" / f"nvme-Amazon_Elastic_Block_Store_{STAGE_VOLUME}")


def test_no_volume_beside_the_root_is_said_not_guessed(tmp_path):
    found = find(tmp_path, {ROOT_VOLUME: "nvme0n1"}, root_disk="nvme0n1")
    assert found.returncode != 0 and found.stdout == ""
    assert "expected one EBS volume beside the root disk nvme0n1, found 0" in found.stderr


def test_two_volumes_beside_the_root_are_refused_rather_than_one_formatted_at_random(tmp_path):
    volumes = {ROOT_VOLUME: "nvme0n1", STAGE_VOLUME: "nvme1n1", "vol0cccccccccccccccc": "nvme2n1"}
    found = find(tmp_path, volumes, root_disk="nvme0n1")
    assert found.returncode != 0 and "found 2" in found.stderr


def test_your_own_hosts_never_ask_the_metadata_for_one(tmp_path):
    """A machine of your own may be an EC2 instance with a blank volume at /dev/sdf: not the
    stack's, never formatted. cluster.env says so with an empty INSTANCE_METADATA_URL."""
    from tests.test_bootstrap import boot, parse_env

    assert parse_env(bootstrap.cluster_env(boot(1)))["INSTANCE_METADATA_URL"] == image.INSTANCE_METADATA_URL
    own = parse_env(bootstrap.cluster_env(dataclasses.replace(boot(1), shared_model_dir="/srv/models")))
    assert own["INSTANCE_METADATA_URL"] == ""
    run = launched("", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "launched-without"
    assert "no stage volume: a stack of your own hosts" in run.stderr
