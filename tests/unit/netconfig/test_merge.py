"""Seed steps 2 and 3: user over provider, then profile filling unset fields."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.netconfig import (
    EthtoolConfig,
    InterfaceConfig,
    NeighborConfig,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
    VRFConfig,
    parse_network_config,
)
from shared.netconfig.merge import merge


def cfg(raw: dict[str, Any]) -> NetworkConfig:
    c = parse_network_config(raw)
    assert c is not None
    return c


CASES = [
    # (name, user, base, expected)
    ("no base: the user's config as is", {"interface": {"mtu": 1500}}, None, {"interface": {"mtu": 1500}}),
    (
        "user scalar wins",
        {"interface": {"mtu": 1500}},
        {"interface": {"mtu": 9000}},
        {"interface": {"mtu": 1500}},
    ),
    (
        "unset user scalar takes the base",
        {"interface": {"name": "n"}},
        {"interface": {"mtu": 9000}},
        {"interface": {"name": "n", "mtu": 9000}},
    ),
    (
        "false is set and wins",
        {"interface": {"dhcp": False}},
        {"interface": {"dhcp": True}},
        {"interface": {"dhcp": False}},
    ),
    ("profile string", {}, {"profile": "p"}, {"profile": "p"}),
    (
        "addresses appended, de-duplicated, user entry kept last",
        {"interface": {"addresses": ["10.0.0.2/24", "10.0.0.9/24"]}},
        {"interface": {"addresses": ["10.0.0.9/24", "10.0.0.3/24"]}},
        {"interface": {"addresses": ["10.0.0.3/24", "10.0.0.2/24", "10.0.0.9/24"]}},
    ),
    (
        "routes keyed by destination and table; user's wins",
        {"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.254"}]},
        {
            "routes": [
                {"destination": "10.0.0.0/8", "gateway": "10.0.0.1"},
                {"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "table": 100},
            ]
        },
        {
            "routes": [
                {"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "table": 100},
                {"destination": "10.0.0.0/8", "gateway": "10.0.0.254"},
            ]
        },
    ),
    (
        "neighbors keyed by destination",
        {"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:aa"}]},
        {"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:bb"}]},
        {"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "02:00:00:00:00:aa"}]},
    ),
    (
        "rules appended, exact duplicates dropped",
        {"rules": [{"priority": 10, "table": 100}]},
        {"rules": [{"priority": 10, "table": 100}, {"priority": 20, "table": 200}]},
        {"rules": [{"priority": 20, "table": 200}, {"priority": 10, "table": 100}]},
    ),
    (
        "ethtool maps merge key by key",
        {"ethtool": {"features": {"tso": False}}},
        {"ethtool": {"features": {"tso": True, "gro": True}, "privateFlags": {"p": True}}},
        {"ethtool": {"features": {"tso": False, "gro": True}, "privateFlags": {"p": True}}},
    ),
    (
        "vrf merges field by field",
        {"interface": {"vrf": {"name": "blue"}}},
        {"interface": {"vrf": {"name": "red", "table": 1234}}},
        {"interface": {"vrf": {"name": "blue", "table": 1234}}},
    ),
    (
        "profile step: IPVLAN and addresses from the profile fill an unset user config",
        {"profile": "oke-rdma", "interface": {"name": "rdma0"}},
        {"interface": {"type": "IPVLAN", "addresses": ["10.208.0.25/12"], "name": "ignored"}},
        {
            "profile": "oke-rdma",
            "interface": {"name": "rdma0", "type": "IPVLAN", "addresses": ["10.208.0.25/12"]},
        },
    ),
]


@pytest.mark.parametrize(("name", "user", "base", "expected"), CASES, ids=[c[0] for c in CASES])
def test_merge_table(
    name: str, user: dict[str, Any], base: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    merged = merge(cfg(user), cfg(base) if base is not None else None)
    assert merged.to_dict() == cfg(expected).to_dict()


# --- properties -------------------------------------------------------------------------

ips = st.sampled_from([f"10.0.{i}.{j}/24" for i in range(3) for j in range(3)])
macs = st.sampled_from(["02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"])
opt_int = st.one_of(st.none(), st.integers(68, 9000))
opt_bool = st.one_of(st.none(), st.booleans())

routes = st.builds(
    RouteConfig,
    destination=st.sampled_from(["10.0.0.0/8", "0.0.0.0/0", "192.168.0.0/16"]),
    gateway=st.sampled_from(["", "10.0.0.1", "10.0.0.2"]),
    table=st.sampled_from([0, 100, 200]),
)
rules = st.builds(RuleConfig, priority=st.integers(0, 3), table=st.sampled_from([0, 100]))
neighbors = st.builds(
    NeighborConfig, destination=st.sampled_from(["10.0.0.1", "10.0.0.2"]), hardware_addr=macs
)
interfaces = st.builds(
    InterfaceConfig,
    name=st.sampled_from(["", "net1", "net2"]),
    addresses=st.lists(ips, max_size=4).map(tuple),
    mtu=opt_int,
    dhcp=opt_bool,
    hardware_addr=st.one_of(st.none(), macs),
    forwarding=opt_bool,
    arp_ignore=st.one_of(st.none(), st.sampled_from([0, 1, 2])),
    vrf=st.one_of(
        st.none(),
        st.builds(
            VRFConfig,
            name=st.sampled_from(["", "a", "b"]),
            table=st.one_of(st.none(), st.integers(1000, 1010)),
        ),
    ),
)
ethtools = st.one_of(
    st.none(),
    st.builds(
        EthtoolConfig,
        features=st.dictionaries(st.sampled_from(["tso", "gro", "lro"]), st.booleans(), max_size=3),
    ),
)
configs = st.builds(
    NetworkConfig,
    profile=st.sampled_from(["", "p1", "p2"]),
    interface=interfaces,
    routes=st.lists(routes, max_size=4).map(tuple),
    rules=st.lists(rules, max_size=3).map(tuple),
    neighbors=st.lists(neighbors, max_size=3).map(tuple),
    ethtool=ethtools,
)

SCALARS = ["mtu", "dhcp", "hardware_addr", "forwarding", "arp_ignore"]


@settings(max_examples=300, deadline=None)
@given(configs, configs)
def test_users_scalar_always_wins(user: NetworkConfig, base: NetworkConfig) -> None:
    merged = merge(user, base)
    for name in SCALARS:
        u = getattr(user.interface, name)
        if u is not None:
            assert getattr(merged.interface, name) == u
        else:
            assert getattr(merged.interface, name) == getattr(base.interface, name)
    if user.profile:
        assert merged.profile == user.profile
    if user.interface.name:
        assert merged.interface.name == user.interface.name
    if user.ethtool is not None:
        assert merged.ethtool is not None
        for k, v in user.ethtool.features.items():
            assert merged.ethtool.features[k] == v


@settings(max_examples=300, deadline=None)
@given(configs, configs)
def test_merging_twice_changes_nothing(user: NetworkConfig, base: NetworkConfig) -> None:
    once = merge(user, base)
    assert merge(user, once) == once
    assert merge(once, base) == once


@settings(max_examples=300, deadline=None)
@given(configs, configs)
def test_no_user_list_entry_is_lost(user: NetworkConfig, base: NetworkConfig) -> None:
    merged = merge(user, base)
    for a in user.interface.addresses:
        assert a in merged.interface.addresses
    # For keyed lists, the user's last entry for each key is the one kept.
    last_route = {(r.destination, r.table): r for r in user.routes}
    for r in last_route.values():
        assert r in merged.routes
    last_neigh = {n.destination: n for n in user.neighbors}
    for n in last_neigh.values():
        assert n in merged.neighbors
    for rule in user.rules:
        assert rule in merged.rules
    # And nothing is invented: every merged entry came from one side.
    for r in merged.routes:
        assert r in user.routes or r in base.routes
