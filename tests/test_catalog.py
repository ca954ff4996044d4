"""The instance catalog: the types users pick from, with the figures validation,
EFA layout and cost planning rely on."""

import re

import pytest

from components.catalog import CATALOG, known_instance_types, lookup

REQUIRED_TYPES = [
    "g5.xlarge",
    "g6.xlarge",
    "g5.12xlarge",
    "g5.48xlarge",
    "g6e.12xlarge",
    "g6e.48xlarge",
    "p4d.24xlarge",
    "p4de.24xlarge",
    "p5.48xlarge",
    "p5en.48xlarge",
]


@pytest.mark.parametrize("name", REQUIRED_TYPES)
def test_required_types_are_in_the_catalog(name):
    assert lookup(name) is not None


@pytest.mark.parametrize("row", list(CATALOG.values()), ids=list(CATALOG))
def test_rows_are_consistent(row):
    assert row.gpus in (1, 2, 4, 8)
    assert row.gpu_memory_gib > 0 and row.vcpus > 0 and row.memory_gib > 0
    assert row.efa_supported == (row.max_efa_interfaces > 0)
    assert row.network_cards >= 1
    assert row.price_per_hour_usd > 0
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row.price_date)
    assert "us-east-1" in row.price_source


def test_known_figures():
    # Spot checks against describe-instance-types: a wrong EFA maximum yields a
    # launch template that EC2 rejects.
    assert (CATALOG["p4d.24xlarge"].gpus, CATALOG["p4d.24xlarge"].gpu_memory_gib) == (8, 40)
    assert CATALOG["p4d.24xlarge"].max_efa_interfaces == 4
    assert CATALOG["p5.48xlarge"].max_efa_interfaces == 32
    assert CATALOG["p5en.48xlarge"].max_efa_interfaces == 16
    assert not CATALOG["g5.xlarge"].efa_supported and not CATALOG["g6.xlarge"].efa_supported
    assert CATALOG["p4de.24xlarge"].total_gpu_memory_gib == 640


def test_known_types_are_sorted_for_stable_messages():
    assert known_instance_types() == sorted(CATALOG)


SOURCES_READ_ON = "2026-11-30"


@pytest.mark.parametrize("row", list(CATALOG.values()), ids=list(CATALOG))
def test_every_row_says_where_its_figures_come_from_and_when_they_were_read(row):
    assert re.search(r"https://\S+", row.figures_source), row.name
    assert SOURCES_READ_ON in row.figures_source, row.name
    # A figure no AWS page confirmed is named, with what it rests on instead.
    assert row.unverified == "" or len(row.unverified) > 40, row.name


def test_g6e_48xlarge_has_four_efa_interfaces_one_per_network_card():
    """Listed with 1 EFA here but 4 elsewhere: EC2 allows one EFA per network card and the
    type has four cards (4 x 100 Gbps)."""
    row = CATALOG["g6e.48xlarge"]
    assert (row.max_efa_interfaces, row.network_cards) == (4, 4)
    assert "g6e.48xlarge" in row.unverified or "EFA" in row.unverified


# InstanceStorageInfo of the types the archived EC2 User Guide lists ("Instance store volumes",
# accelerated computing): disks and GB per disk, and the table of their random-read IOPS.
ARCHIVED_GUIDE_STORES = {
    "g5.xlarge": (1, 250, 40_625),
    "g5.8xlarge": (1, 900, 250_000),
    "g5.12xlarge": (1, 3800, 312_500),
    "g5.48xlarge": (2, 3800, 625_000),
    "p4d.24xlarge": (8, 1000, 2_000_000),
    "p4de.24xlarge": (8, 1000, 2_000_000),
}


@pytest.mark.parametrize("name", sorted(ARCHIVED_GUIDE_STORES))
def test_the_instance_store_is_what_the_ec2_guide_lists(name):
    disks, disk_gb, read_iops = ARCHIVED_GUIDE_STORES[name]
    row = CATALOG[name]
    assert (row.instance_store_disks, row.instance_store_disk_gb, row.instance_store_read_iops) == (
        disks,
        disk_gb,
        read_iops,
    )
    assert row.instance_store_gb == disks * disk_gb  # TotalSizeInGB
    assert "InstanceStorage.md" in row.instance_store_source


@pytest.mark.parametrize("row", list(CATALOG.values()), ids=list(CATALOG))
def test_every_instance_store_says_where_it_comes_from(row):
    """TotalSizeInGB is the disks times one disk's size; a store that no AWS page read here
    confirms says so in its source, and a row without a store has 0 of both."""
    assert row.instance_store_gb == row.instance_store_disks * row.instance_store_disk_gb
    assert (row.instance_store_gb == 0) == (row.instance_store_disks == 0)
    if row.instance_store_gb:
        assert re.search(r"https://\S+", row.instance_store_source) or row.instance_store_source.startswith(
            "unverified"
        ), row.name
    if "second-hand" in row.instance_store_source:
        assert "instance store" in row.unverified, row.name
    # IOPS only where an AWS table gives them.
    assert row.instance_store_read_iops == 0 or "ssd-perf" in row.instance_store_source, row.name
