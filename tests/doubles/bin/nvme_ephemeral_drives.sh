#!/bin/sh
# TEST DOUBLE of the image's /opt/aws/dlami/bin/nvme_ephemeral_drives.sh, which the image's
# dlami-nvme.service runs at every boot (components/image.py NVME_SETUP_UNIT and
# NVME_SETUP_SCRIPT, with their sources). The real one joins the instance store's NVMe
# disks into one LVM volume, formats it ext4 when it is blank and mounts it at
# /opt/dlami/nvme with `mount`: no fstab line, no mount unit, so nothing but ordering
# after its unit waits for it.
#
# Here the store's "disk" is a directory of the fleet machine that localhosts/fleet.py
# binds at /var/lib/instance-store-double: kept across a reboot, emptied when the instance
# is started again after a stop (tests/fleet_ec2.py FleetEc2.start), as EC2 hands a
# stopped instance's store back blank. Formatting a blank disk takes FORMAT_SECONDS
# (/etc/instance-store-double.conf, written by the fleet), as mkfs of a large store takes
# its time; the lost+found that mke2fs makes marks it formatted.
set -eu
disk=/var/lib/instance-store-double
mount_point=/opt/dlami/nvme
# shellcheck source=/dev/null  # written by localhosts/fleet.py
. /etc/instance-store-double.conf
if mountpoint -q "$mount_point"; then
  echo "the instance store is mounted on $mount_point already"
  exit 0
fi
if [ ! -d "$disk/lost+found" ]; then
  echo "formatting the blank instance store (${FORMAT_SECONDS} s)"
  sleep "$FORMAT_SECONDS"
  mkdir -m 0700 "$disk/lost+found"
fi
mkdir -p "$mount_point"
mount --bind "$disk" "$mount_point"
# As the real script sets the mounted store's root (ParallelCluster's mount_lvm).
chmod 1777 "$mount_point"
echo "mounted the instance store on $mount_point"
