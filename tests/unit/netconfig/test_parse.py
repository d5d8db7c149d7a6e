"""Strict parsing of opaque parameters: unknown fields and wrong types name the field."""

from __future__ import annotations

import json

import pytest

from shared.netconfig import (
    Addressing,
    ConfigError,
    InterfaceType,
    NetworkConfig,
    RouteConfig,
    parse_network_config,
)

FULL = {
    "profile": "gold",
    "interface": {
        "name": "net1",
        "type": "IPVLAN",
        "addresses": ["192.0.2.5/24", "2001:db8::5/64"],
        "addressing": "Unnumbered",
        "dhcp": False,
        "mtu": 9000,
        "hardwareAddr": "02:00:00:00:00:01",
        "gsoMaxSize": 65536,
        "groMaxSize": 65536,
        "gsoIPv4MaxSize": 65536,
        "groIPv4MaxSize": 65536,
        "disableEbpfPrograms": True,
        "forwarding": True,
        "arpIgnore": 1,
        "arpAnnounce": 2,
        "vrf": {"name": "vrf-blue", "table": 1100},
    },
    "routes": [{"destination": "10.0.0.0/8", "gateway": "192.0.2.1", "source": "192.0.2.5", "table": 100}],
    "rules": [{"priority": 100, "source": "192.0.2.5/32", "destination": "10.0.0.0/8", "table": 100}],
    "neighbors": [{"destination": "192.0.2.1", "hardwareAddr": "02:00:00:00:00:02"}],
    "ethtool": {"features": {"rx-checksum": True}, "privateFlags": {"flag-a": False}},
}


def test_every_field_parses_and_round_trips() -> None:
    cfg = parse_network_config(json.dumps(FULL))
    assert cfg is not None
    assert cfg.profile == "gold"
    assert cfg.interface.type is InterfaceType.IPVLAN and cfg.interface.addressing is Addressing.UNNUMBERED
    assert cfg.interface.mtu == 9000 and cfg.interface.dhcp is False and cfg.interface.arp_announce == 2
    assert cfg.interface.vrf is not None and cfg.interface.vrf.table == 1100
    assert cfg.routes == (RouteConfig("10.0.0.0/8", "192.0.2.1", "192.0.2.5", 0, 100),)
    assert cfg.ethtool is not None and cfg.ethtool.private_flags == {"flag-a": False}
    assert json.loads(cfg.to_json()) == FULL
    assert parse_network_config(cfg.to_json()) == cfg


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        (b"", None),
        ("   ", None),
        ("{}", NetworkConfig()),
        ("null", NetworkConfig()),  # Go decodes null into an empty config
        ({"interface": {"mtu": None}}, NetworkConfig()),  # null leaves a field unset
        ({"routes": []}, NetworkConfig()),
    ],
)
def test_empty_inputs(raw: object, expected: NetworkConfig | None) -> None:
    assert parse_network_config(raw) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "messages"),
    [
        ({"interfaces": {}}, ["interfaces: unknown field"]),
        ({"interface": {"mtuu": 1500}}, ["interface.mtuu: unknown field"]),
        ({"routes": [{"dest": "1.2.3.0/24"}]}, ["routes[0].dest: unknown field"]),
        ({"interface": {"vrf": {"tabel": 5}}}, ["interface.vrf.tabel: unknown field"]),
        ({"interface": {"mtu": "1500"}}, ['interface.mtu: expected an integer, got string "1500"']),
        ({"interface": {"mtu": 1500.5}}, ["interface.mtu: expected an integer, got number 1500.5"]),
        ({"interface": {"mtu": True}}, ["interface.mtu: expected an integer, got boolean true"]),
        ({"interface": {"mtu": 2**31}}, ["interface.mtu: 2147483648 does not fit in int32"]),
        ({"routes": [{"scope": 256}]}, ["routes[0].scope: 256 does not fit in uint8"]),
        ({"interface": {"dhcp": "yes"}}, ['interface.dhcp: expected a boolean, got string "yes"']),
        ({"interface": {"addresses": "10.0.0.1/24"}}, ["interface.addresses: expected an array of strings"]),
        (
            {"interface": {"addresses": ["10.0.0.1/24", 7]}},
            ["interface.addresses[1]: expected a string, got number 7"],
        ),
        ({"interface": {"type": "MACVLAN"}}, ['interface.type: unsupported value "MACVLAN"']),
        (
            {"interface": {"addressing": "unnumbered"}},
            ['interface.addressing: unsupported value "unnumbered"'],
        ),
        (
            {"ethtool": {"features": {"tso": "on"}}},
            ['ethtool.features.tso: expected a boolean, got string "on"'],
        ),
        ({"routes": {"destination": "x"}}, ["routes: expected an array of objects"]),
        ({"interface": []}, ["interface: expected an object, got array"]),
        ([1, 2], ["expected an object, got array"]),
        ("{not json", ["invalid JSON"]),
        # Every problem is reported, not only the first.
        ({"interface": {"mtu": "x", "bogus": 1}, "extra": 2}, ["interface.mtu", "interface.bogus", "extra"]),
    ],
)
def test_bad_input_names_the_field(raw: object, messages: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_network_config(raw if isinstance(raw, str) else json.dumps(raw))
    text = str(err.value)
    for m in messages:
        assert m in text, f"{m!r} not in {text!r}"
