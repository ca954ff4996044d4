"""The local fleets' networks (localhosts/fleet.py Network): make test runs the main fleet
and the replicas fleet at once, so nothing the kernel names or routes may be shared
between them: bridges, namespaces, veths, addresses, and the stack configs that point
the hosts at them."""

from __future__ import annotations

import ipaddress

from localhosts.cluster import fleet_config, instance_ips, own_hosts_config
from localhosts.fleet import MAIN_NETWORK, SECOND_NETWORK, Fleet, await_leftover_links, leftover_links_error, link_names
from tests.test_power import Clock  # a clock the wait reads and its sleep advances

NETWORKS = (MAIN_NETWORK, SECOND_NETWORK)


def fleet(tmp_path, network, nodes: int = 3) -> Fleet:
    return Fleet(tmp_path / network.bridge, nodes, authorized_key="", private_key="", network=network)


def test_the_two_networks_share_no_name_and_no_address(tmp_path):
    assert MAIN_NETWORK.bridge != SECOND_NETWORK.bridge
    # A teardown lists namespaces by prefix: neither may be the start of the other's.
    assert not MAIN_NETWORK.netns_prefix.startswith(SECOND_NETWORK.netns_prefix)
    assert not SECOND_NETWORK.netns_prefix.startswith(MAIN_NETWORK.netns_prefix)
    main, second = (ipaddress.ip_network(n.vpc_cidr) for n in NETWORKS)
    assert not main.overlaps(second)
    fleets = [fleet(tmp_path, network) for network in NETWORKS]
    for network, hosts in zip(NETWORKS, (f.hosts for f in fleets), strict=True):
        subnet = ipaddress.ip_network(network.vpc_cidr)
        assert ipaddress.ip_address(network.bridge_ip) in subnet
        assert all(ipaddress.ip_address(host.ip) in subnet for host in hosts)
        assert all(host.netns.startswith(network.netns_prefix) for host in hosts)
    names = [(host.netns, host.veth) for f in fleets for host in f.hosts]
    assert len({netns for netns, _ in names}) == len({veth for _, veth in names}) == len(names)
    assert all(len(veth) <= 15 for _, veth in names)  # the kernel's limit on an interface name


def test_the_main_network_keeps_the_addresses_make_local_has_always_had():
    assert (MAIN_NETWORK.bridge, MAIN_NETWORK.netns_prefix) == ("vcbr0", "vc-")
    assert (MAIN_NETWORK.gateway_ip, MAIN_NETWORK.node_ip(0), MAIN_NETWORK.vpc_cidr) == (
        "10.99.0.10",
        "10.99.128.1",
        "10.99.0.0/16",
    )


def test_make_local_down_finds_the_fleets_network_in_what_make_local_recorded(tmp_path):
    running = fleet(tmp_path, SECOND_NETWORK)
    adopted = Fleet.adopt(running.state())
    assert adopted.network == SECOND_NETWORK
    assert [(h.name, h.ip, h.netns) for h in adopted.hosts] == [(h.name, h.ip, h.netns) for h in running.hosts]
    # A target recorded before fleets had networks of their own ran on the main one.
    old = {key: value for key, value in running.state().items() if key != "network"}
    assert Fleet.adopt(old).network == MAIN_NETWORK


def test_the_stack_configs_point_the_hosts_at_their_own_network():
    config = fleet_config(1, SECOND_NETWORK, replicas=2)
    assert config["vpcCidr"] == config["apiAllowedCidrs"][0] == "10.98.0.0/16"
    assert config["adminCidrs"] == ["10.98.0.254/32"]
    assert config["hfEndpoint"].startswith("http://10.98.0.254:")
    assert instance_ips(1, 2, SECOND_NETWORK) == {
        "vllm-gateway-host": "10.98.0.10",
        "vllm-head": "10.98.128.1",
        "vllm-gang1-head": "10.98.128.2",
    }
    own = own_hosts_config(2, "key", network=SECOND_NETWORK)
    assert own["hosts"] == ["10.98.128.1,10.98.128.2"]
    assert own["gatewayHost"] == own["gatewayPrivateIp"] == "10.98.0.10"


def test_a_fleet_waits_for_the_veth_a_dying_namespace_of_the_last_run_still_holds():
    # Found on CI (2026-12-06): a fleet's teardown had deleted its namespaces' names, but
    # the kernel held the replicas fleet's gateway veth for about ten more minutes, and
    # the next run's `ip link add` failed "File exists" at every setup attempt.
    clock = Clock()
    gone_at = {"vd-v-gateway": 400.0, "vd-v-node3": 30.0}

    def present() -> list[str]:
        return [link for link, at in gone_at.items() if clock.now < at]

    assert await_leftover_links(present, wait_seconds=900, sleep=clock.sleep, clock=clock) == []
    assert 400 <= clock.now < 900


def test_a_veth_that_outlives_the_wait_is_named_with_the_fix():
    clock = Clock()
    left = await_leftover_links(lambda: ["vd-v-gateway"], 900, clock.sleep, clock)
    assert left == ["vd-v-gateway"]
    assert clock.now >= 900
    message = leftover_links_error(left, waited_seconds=900)
    assert "vd-v-gateway" in message and "ip link del vd-v-gateway" in message and "900 s" in message


def test_the_leftover_veths_are_every_link_of_the_network_and_no_other():
    # `ip -o link show` as iproute2 prints it: a veth's name ends at its peer's "@"; the
    # nodes an earlier run added (node3) count, the other fleet's links do not.
    listed = (
        "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\\    link/loopback\n"
        "7: vd-v-gateway@if2: <BROADCAST,MULTICAST,UP> mtu 1500 master vd-br state UP\\    link/ether\n"
        "9: vd-v-node3@if2: <BROADCAST,MULTICAST> mtu 1500 state DOWN\\    link/ether\n"
        "11: vm-v-gateway@if2: <BROADCAST,MULTICAST,UP> mtu 1500 master vm-br state UP\\    link/ether\n"
        "12: vd-br: <BROADCAST,MULTICAST,UP> mtu 1500 state UP\\    link/ether\n"
    )
    assert link_names(listed, "vd-v-") == ["vd-v-gateway", "vd-v-node3"]
