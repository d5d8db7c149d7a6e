"""Defaulting and validation: table-driven, every message names the field and value."""

from __future__ import annotations

from typing import Any

import pytest

from shared.netconfig import ConfigError, parse_network_config
from shared.netconfig.validate import (
    default,
    finalize,
    fnv1a_32,
    interface_name_problem,
    load,
    parse_cidr,
    parse_mac,
    validate,
    validate_rdma_only,
    vrf_table_for,
)


def errors_of(raw: dict[str, Any], complete: bool = False) -> list[str]:
    cfg = parse_network_config(raw)
    assert cfg is not None
    return [str(e) for e in validate(default(cfg), complete=complete)]


VALID = [
    {},
    {"interface": {"name": "net1", "addresses": ["192.0.2.5/24", "2001:db8::5/64"], "mtu": 9000}},
    {"interface": {"name": "a.b-c_d"}},
    {"interface": {"hardwareAddr": "02:00:00:00:00:01"}},
    {"interface": {"hardwareAddr": "0200.0000.0001"}},  # Go's dotted form
    {"interface": {"dhcp": True}},
    {"interface": {"type": "PASSTHROUGH", "addressing": "Unnumbered"}},
    {"interface": {"type": "IPVLAN", "addresses": ["10.0.0.2/32"]}},
    {"interface": {"mtu": 68}},
    {"interface": {"mtu": 65535}},
    {"interface": {"arpIgnore": 8, "arpAnnounce": 0}},
    {"interface": {"gsoMaxSize": 524288, "groMaxSize": 524280}},
    {"interface": {"vrf": {"name": "blue"}}},
    {"routes": [{"destination": "0.0.0.0/0", "gateway": "192.0.2.1"}]},
    {"routes": [{"destination": "10.1.0.0/16", "scope": 253}]},
    {"routes": [{"destination": "2001:db8::/32", "gateway": "fe80::1", "table": 100}]},
    {"rules": [{"priority": 32767, "source": "10.0.0.0/8", "table": 100}]},
    {"neighbors": [{"destination": "192.0.2.1", "hardwareAddr": "02:00:00:00:00:02"}]},
    {"ethtool": {"features": {"tx-checksum-ip-generic": False}}},
]


@pytest.mark.parametrize("raw", VALID)
def test_valid_configs(raw: dict[str, Any]) -> None:
    assert errors_of(raw) == []


INVALID: list[tuple[dict[str, Any], str]] = [
    ({"interface": {"name": "this-name-is-too-long"}}, "interface.name: 'this-name-is-too-long' is 21 bytes"),
    ({"interface": {"name": "eth/0"}}, "interface.name: 'eth/0' cannot contain '/'"),
    ({"interface": {"name": "eth:0"}}, "cannot contain ':'"),
    ({"interface": {"name": "eth 0"}}, "whitespace"),
    ({"interface": {"name": ".."}}, "cannot be '.' or '..'"),
    ({"interface": {"name": "eth%d"}}, "cannot contain '%'"),
    ({"interface": {"addresses": ["192.0.2.5"]}}, "interface.addresses[0]: invalid IP CIDR '192.0.2.5'"),
    ({"interface": {"addresses": ["192.0.2.5/33"]}}, "interface.addresses[0]"),
    ({"interface": {"addresses": ["10.0.0.1/255.0.0.0"]}}, "interface.addresses[0]"),
    ({"interface": {"addresses": ["fe80::1%eth0/64"]}}, "interface.addresses[0]"),
    (
        {"interface": {"dhcp": True, "addresses": ["10.0.0.1/24"]}},
        "dhcp and addresses are mutually exclusive",
    ),
    ({"interface": {"addressing": "Unnumbered", "addresses": ["10.0.0.1/24"]}}, "Unnumbered and addresses"),
    ({"interface": {"mtu": 67}}, "interface.mtu: must be between 68 and 65535, got 67"),
    ({"interface": {"mtu": 70000}}, "got 70000"),
    (
        {"interface": {"mtu": 1200, "addresses": ["2001:db8::1/64"]}},
        "interface.mtu: 1200 is below 1280, the minimum for IPv6",
    ),
    (
        {"interface": {"hardwareAddr": "zz:00:00:00:00:01"}},
        "interface.hardwareAddr: invalid MAC address 'zz:00:00:00:00:01'",
    ),
    ({"interface": {"hardwareAddr": "01:00:5e:00:00:01"}}, "is a multicast address"),
    ({"interface": {"hardwareAddr": "00:00:00:00:00:00"}}, "all-zero"),
    ({"interface": {"gsoMaxSize": 0}}, "interface.gsoMaxSize: must be between 1 and 524288, got 0"),
    ({"interface": {"groIPv4MaxSize": 600000}}, "interface.groIPv4MaxSize"),
    ({"interface": {"arpIgnore": 5}}, "interface.arpIgnore: must be one of 0, 1, 2, 3 or 8, got 5"),
    ({"interface": {"arpAnnounce": 3}}, "interface.arpAnnounce: must be between 0 and 2, got 3"),
    ({"interface": {"vrf": {"table": 10}}}, "interface.vrf.name: cannot be empty"),
    (
        {"interface": {"vrf": {"name": "v", "table": 254}}},
        "interface.vrf.table: cannot use reserved table 254 (main)",
    ),
    ({"interface": {"vrf": {"name": "v", "table": 0}}}, "interface.vrf.table: must be between 1"),
    (
        {"interface": {"vrf": {"name": "v"}}, "rules": [{"table": 5}]},
        "rules: rules are not supported when interface.vrf is set",
    ),
    (
        {"interface": {"type": "IPVLAN", "hardwareAddr": "02:00:00:00:00:01"}},
        "interface.hardwareAddr: cannot be set for type IPVLAN",
    ),
    ({"interface": {"type": "IPVLAN", "dhcp": True}}, "interface.dhcp: is not supported for type IPVLAN"),
    ({"interface": {"type": "IPVLAN", "disableEbpfPrograms": True}}, "interface.disableEbpfPrograms"),
    ({"routes": [{"gateway": "10.0.0.1"}]}, "routes[0].destination: cannot be empty"),
    ({"routes": [{"destination": "10.0.0.0"}]}, "routes[0].destination: invalid CIDR '10.0.0.0'"),
    ({"routes": [{"destination": "10.0.0.0/8"}]}, "routes[0].gateway: must be set for universe-scope routes"),
    (
        {"routes": [{"destination": "10.0.0.0/8", "gateway": "2001:db8::1"}]},
        "routes[0].gateway: 2001:db8::1 is not the same IP family",
    ),
    ({"routes": [{"destination": "10.0.0.0/8", "gateway": "10.0.0.1", "source": "::1"}]}, "routes[0].source"),
    (
        {"routes": [{"destination": "10.0.0.0/8", "gateway": "bogus"}]},
        "routes[0].gateway: invalid IP address 'bogus'",
    ),
    ({"routes": [{"destination": "10.0.0.0/8", "scope": 200}]}, "routes[0].scope: invalid scope 200"),
    (
        {"routes": [{"destination": "10.0.0.0/8", "scope": 253, "table": -1}]},
        "routes[0].table: must be between 0",
    ),
    ({"routes": [{"destination": "10.0.0.0/8", "scope": 253, "table": 2**32}]}, "routes[0].table"),
    ({"rules": [{"priority": 40000}]}, "rules[0].priority: must be between 0 and 32767, got 40000"),
    ({"rules": [{"priority": -1}]}, "rules[0].priority"),
    (
        {"rules": [{"source": "10.0.0.0/8", "destination": "2001:db8::/32"}]},
        "rules[0]: source 10.0.0.0/8 and destination 2001:db8::/32 must be the same IP family",
    ),
    ({"rules": [{"source": "10.0.0.1"}]}, "rules[0].source: invalid CIDR '10.0.0.1'"),
    ({"neighbors": [{"hardwareAddr": "02:00:00:00:00:02"}]}, "neighbors[0].destination: cannot be empty"),
    (
        {"neighbors": [{"destination": "x", "hardwareAddr": "02:00:00:00:00:02"}]},
        "neighbors[0].destination: invalid IP address 'x'",
    ),
    ({"neighbors": [{"destination": "10.0.0.1"}]}, "neighbors[0].hardwareAddr: cannot be empty"),
    (
        {"neighbors": [{"destination": "10.0.0.1", "hardwareAddr": "nope"}]},
        "neighbors[0].hardwareAddr: invalid MAC",
    ),
    ({"ethtool": {"features": {"bad name": True}}}, "ethtool.features.bad name: invalid name"),
    ({"ethtool": {"privateFlags": {"x" * 40: True}}}, "ethtool.privateFlags"),
]


@pytest.mark.parametrize(("raw", "message"), INVALID)
def test_invalid_configs(raw: dict[str, Any], message: str) -> None:
    errs = errors_of(raw)
    assert any(message in e for e in errs), f"{message!r} not in {errs!r}"


def test_ipvlan_needs_addressing_only_once_complete() -> None:
    raw = {"interface": {"type": "IPVLAN"}}
    assert errors_of(raw) == []  # a profile may still add addresses
    assert errors_of(raw, complete=True) == [
        "interface.addresses: type IPVLAN needs addresses (from the config or a profile) or addressing Unnumbered"
    ]
    assert errors_of({"interface": {"type": "IPVLAN", "addressing": "Unnumbered"}}, complete=True) == []


def test_vrf_table_defaults_from_the_name() -> None:
    # FNV-1a 32 reference values.
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert vrf_table_for("blue") == fnv1a_32(b"blue") % 1000 + 1000
    cfg = load({"interface": {"vrf": {"name": "blue"}}})
    assert cfg is not None and cfg.interface.vrf is not None
    assert cfg.interface.vrf.table == vrf_table_for("blue")
    explicit = load({"interface": {"vrf": {"name": "blue", "table": 7}}})
    assert explicit is not None and explicit.interface.vrf is not None and explicit.interface.vrf.table == 7


def test_load_and_finalize_raise_with_every_error() -> None:
    with pytest.raises(ConfigError) as err:
        load({"interface": {"mtu": 1, "arpIgnore": 9}})
    assert len(err.value.errors) == 2
    with pytest.raises(ConfigError):
        cfg = parse_network_config({"interface": {"type": "IPVLAN"}})
        assert cfg is not None
        finalize(cfg)


def test_rdma_only_rejects_network_settings() -> None:
    cfg = parse_network_config(
        {"interface": {"name": "x", "mtu": 1500}, "routes": [{"destination": "1.0.0.0/8"}]}
    )
    assert cfg is not None
    errs = [str(e) for e in validate_rdma_only(cfg)]
    assert errs == [
        "interface: not supported for an RDMA-only device (no network interface); set: mtu, name",
        "routes: not supported for an RDMA-only device (no network interface)",
    ]
    only_profile = parse_network_config({"profile": "p"})
    assert only_profile is not None and validate_rdma_only(only_profile) == []


@pytest.mark.parametrize(
    ("text", "octets"),
    [
        ("02:00:00:00:00:01", 6),
        ("02-00-00-00-00-01", 6),
        ("0200.0000.0001", 6),
        ("02:00:00:00:00:00:00:01", 8),
        ("00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", 20),
        ("02:00:00:00:00", None),
        ("02:00:00:00:00:0g", None),
        ("0200:0000:0001", None),
        ("+2:00:00:00:00:01", None),
    ],
)
def test_parse_mac(text: str, octets: int | None) -> None:
    mac = parse_mac(text)
    assert (len(mac) if mac is not None else None) == octets


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("10.0.0.1/24", True),
        ("10.0.0.1/024", False),
        ("10.0.0.1/", False),
        ("::/0", True),
        ("1.2.3.4/32", True),
    ],
)
def test_parse_cidr(text: str, ok: bool) -> None:
    assert (parse_cidr(text) is not None) == ok


def test_interface_names_as_the_kernel_allows() -> None:
    assert interface_name_problem("eth0") is None
    assert interface_name_problem("a" * 15) is None
    assert interface_name_problem("é" * 8) is not None  # 16 bytes in UTF-8
    assert interface_name_problem("") == "cannot be empty"
