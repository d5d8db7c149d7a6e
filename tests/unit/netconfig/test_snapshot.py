"""Seed step 5: what a Pod inherits from the host."""

from __future__ import annotations

from typing import Any

import pytest

from shared.netconfig import NeighborConfig, RouteConfig, RuleConfig, parse_network_config
from shared.netconfig.snapshot import HostSnapshot, apply_host_snapshot

HOST = HostSnapshot(
    addresses=("192.168.10.5/24", "2001:db8::5/64"),
    routes=(
        RouteConfig("192.168.10.0/24", source="192.168.10.5", scope=253, table=254),
        RouteConfig("10.0.0.0/8", gateway="192.168.10.1", table=100),
    ),
    rules=(
        RuleConfig(priority=100, source="192.168.10.5/32", table=100),
        RuleConfig(priority=200, table=300),
    ),
    neighbors=(NeighborConfig("192.168.10.1", "02:00:00:00:00:01"),),
)


def applied(raw: dict[str, Any]) -> dict[str, Any]:
    cfg = parse_network_config(raw)
    assert cfg is not None
    return apply_host_snapshot(cfg, HOST).to_dict()


def test_passthrough_copies_addresses_routes_table_rules_and_neighbors() -> None:
    out = applied({})
    assert out["interface"]["addresses"] == ["192.168.10.5/24", "2001:db8::5/64"]
    assert [r["destination"] for r in out["routes"]] == ["192.168.10.0/24", "10.0.0.0/8"]
    # Only rules that look up a table of the interface's routes.
    assert out["rules"] == [{"priority": 100, "source": "192.168.10.5/32", "table": 100}]
    assert out["neighbors"] == [{"destination": "192.168.10.1", "hardwareAddr": "02:00:00:00:00:01"}]


@pytest.mark.parametrize(
    "itf",
    [{"addresses": ["10.9.9.9/24"]}, {"dhcp": True}, {"addressing": "Unnumbered"}],
    ids=["configured", "dhcp", "unnumbered"],
)
def test_host_addresses_only_when_none_configured(itf: dict[str, Any]) -> None:
    assert applied({"interface": itf})["interface"].get("addresses") == itf.get("addresses")


def test_configured_entries_win_over_host_entries_with_the_same_key() -> None:
    out = applied(
        {
            "routes": [{"destination": "10.0.0.0/8", "gateway": "192.168.10.254", "table": 100}],
            "neighbors": [{"destination": "192.168.10.1", "hardwareAddr": "02:00:00:00:00:99"}],
        }
    )
    assert [r.get("gateway") for r in out["routes"] if r["destination"] == "10.0.0.0/8"] == ["192.168.10.254"]
    assert out["neighbors"] == [{"destination": "192.168.10.1", "hardwareAddr": "02:00:00:00:00:99"}]


def test_vrf_takes_no_host_rules() -> None:
    assert "rules" not in applied({"interface": {"vrf": {"name": "blue"}}})


def test_ipvlan_inherits_nothing() -> None:
    raw = {"interface": {"type": "IPVLAN", "addresses": ["10.208.0.25/12"]}}
    assert applied(raw) == parse_network_config(raw).to_dict()  # type: ignore[union-attr]


def test_a_host_route_keeps_its_source_only_if_the_pod_has_that_address() -> None:
    copied = applied({})
    assert copied["routes"][0]["source"] == "192.168.10.5"
    other = applied({"interface": {"addresses": ["192.168.10.77/24"]}})
    assert "source" not in other["routes"][0]
    assert other["routes"][0]["destination"] == "192.168.10.0/24"
