"""How a node finds its gp3 stage volume (scripts/node/vllm-cluster-node find_stage_volume):
by udev's links of the volume id, never by the NVMe kernel name (which follows discovery
order), the one EBS volume that is not the root file system's disk. Run by bash as the
node runs it, over a by-id directory of links laid out as udev makes them, with
lsblk/findmnt doubles saying which disk holds /. Formatting and mounting need a block
device: not run here."""

from __future__ import annotations

import subprocess
from pathlib import Path

from test_shared_model_dir import LIBRARY, node_function

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
        env={"PATH": f"{doubles}:/usr/bin:/bin"},
    )


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
