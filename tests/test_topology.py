"""Pure topology: ranks, TP/PP placement, EFA interface layout, subnets."""

import ipaddress

import pytest

from components.catalog import CATALOG
from components.topology import interface_layout, node_name, plan_subnets, rank_layout, topology_summary


def test_ranks_follow_vllm_numbering_and_fill_nodes_in_order():
    layout = rank_layout(nodes=2, gpus_per_node=8, tp=8, pp=2)
    assert [p.rank for p in layout] == list(range(16))
    for p in layout:
        assert p.rank == p.pp_rank * 8 + p.tp_rank
        assert (p.node, p.gpu) == divmod(p.rank, 8)


@pytest.mark.parametrize("nodes, gpus, tp, pp", [(2, 8, 8, 2), (2, 8, 4, 4), (4, 4, 2, 8), (1, 4, 4, 1), (3, 8, 8, 3)])
def test_every_tp_group_sits_on_one_node_and_every_gpu_holds_one_rank(nodes, gpus, tp, pp):
    layout = rank_layout(nodes, gpus, tp, pp)
    for stage in range(pp):
        assert len({p.node for p in layout if p.pp_rank == stage}) == 1
    assert sorted((p.node, p.gpu) for p in layout) == [(n, g) for n in range(nodes) for g in range(gpus)]


def test_layouts_that_break_the_rules_are_refused():
    with pytest.raises(ValueError):
        rank_layout(2, 8, 8, 1)
    with pytest.raises(ValueError):
        rank_layout(3, 8, 6, 4)  # 24 ranks, but TP 6 straddles nodes


def test_topology_summary_names_head_and_workers():
    summary = topology_summary(2, 8, 8, 2)
    assert [n["role"] for n in summary["nodes"]] == ["head", "worker"]
    assert summary["nodes"][1]["ranks"] == list(range(8, 16))
    assert summary["nodes"][1]["pipelineStages"] == [1]
    assert summary["worldSize"] == 16
    assert summary["ranks"][9] == {"rank": 9, "node": 1, "gpu": 1, "tpRank": 1, "ppRank": 1}
    assert [node_name(i) for i in range(3)] == ["head", "worker-1", "worker-2"]


@pytest.mark.parametrize(
    "instance, efa_interfaces",
    [
        ("g5.12xlarge", 1),
        ("g6e.12xlarge", 1),
        ("g6e.48xlarge", 4),
        ("p4d.24xlarge", 4),
        ("p4de.24xlarge", 4),
        ("p5.48xlarge", 32),
        ("p5en.48xlarge", 16),
    ],
)
def test_efa_layout_follows_aws_rules(instance, efa_interfaces):
    row = CATALOG[instance]
    slots = interface_layout(row, efa=True)
    primary = slots[0]
    assert (primary.network_card_index, primary.device_index) == (0, 0)
    assert primary.interface_type == "interface"  # never efa-only
    assert [s for s in slots if s.is_primary] == [primary]
    efa = [s for s in slots if s.is_efa]
    assert len(efa) == efa_interfaces <= row.max_efa_interfaces
    assert all(s.interface_type == "efa-only" for s in efa)
    # card 0 device 1, then the next cards at device 0, each card used once
    assert (efa[0].network_card_index, efa[0].device_index) == (0, 1)
    assert [(s.network_card_index, s.device_index) for s in efa[1:]] == [(c, 0) for c in range(1, efa_interfaces)]
    assert max(s.network_card_index for s in slots) < row.network_cards


def test_without_efa_only_the_primary_interface():
    assert [s.interface_type for s in interface_layout(CATALOG["p4d.24xlarge"], efa=False)] == ["interface"]
    with pytest.raises(ValueError):
        interface_layout(CATALOG["g5.xlarge"], efa=True)


@pytest.mark.parametrize("vpc", ["10.42.0.0/16", "10.0.0.0/20", "192.168.4.0/24"])
def test_subnets_are_disjoint_and_inside_the_vpc(vpc):
    plan = plan_subnets(vpc)
    network = ipaddress.ip_network(vpc)
    public, private = ipaddress.ip_network(plan.public), ipaddress.ip_network(plan.private)
    assert public.subnet_of(network) and private.subnet_of(network)
    assert not public.overlaps(private)
    assert private.num_addresses >= public.num_addresses
