"""Small pure pieces: the rate limiter, snapshot selection rules, flags, pci.ids."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

import pytest

from services.inventory import rtnl
from services.inventory.__main__ import build_parser, parse_bool, parse_duration
from services.inventory.inventory import RateLimiter
from services.inventory.pciids import UNKNOWN, PciIds, find_database
from services.inventory.rdma import EXCLUSIVE, SHARED, netns_mode_from_attr
from services.inventory.snapshot import copyable_routes, rules_for_tables
from tests.unit.inventory.fakesys import PCI_IDS


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_burst_then_interval() -> None:
    clock = Clock()
    rl = RateLimiter(2.0, 3, clock)
    assert [rl.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rl.delay() == pytest.approx(2.0)  # the fourth waits one interval
    clock.now = 2.0
    assert rl.delay() == pytest.approx(2.0)  # the refilled token went to the fourth scan
    clock.now = 100.0
    assert [rl.delay() for _ in range(3)] == [0.0, 0.0, 0.0]  # refills up to the burst only


def route(dst: str, table: int = 254, protocol: int = 3, family: int = socket.AF_INET) -> rtnl.Route:
    return rtnl.Route(family, dst, "", "", 0, table, protocol, 3, int(dst.rsplit("/", 1)[1]))


def test_copyable_routes() -> None:
    routes = [
        route("10.9.0.0/16", table=100),
        route("10.1.0.0/24", protocol=rtnl.RTPROT_KERNEL),  # IPv4 kernel routes are copied
        route("10.1.0.1/32", table=rtnl.RT_TABLE_LOCAL),
        route("fe80::/64", family=socket.AF_INET6),
        route("fd00::/64", family=socket.AF_INET6, protocol=rtnl.RTPROT_KERNEL),
        route("fd01::/64", family=socket.AF_INET6),
        route("0.0.0.0/0"),
    ]
    assert [r.dst for r in copyable_routes(routes)] == [
        "10.9.0.0/16",
        "10.1.0.0/24",
        "fd01::/64",
        "0.0.0.0/0",
    ]


def test_rules_for_tables() -> None:
    rules = [
        rtnl.Rule(socket.AF_INET, 0, "", "", 255),
        rtnl.Rule(socket.AF_INET, 2000, "10.2.0.0/24", "", 200),
        rtnl.Rule(socket.AF_INET, 1000, "10.1.0.1/32", "", 100),
        rtnl.Rule(socket.AF_INET, 32766, "", "", 254),
        rtnl.Rule(socket.AF_INET6, 1000, "fd00::1/128", "", 100),
    ]
    got = rules_for_tables(rules, {100, 254, 255, 300})
    assert [(r.priority, r.table, r.family) for r in got] == [(1000, 100, 2), (1000, 100, 10)]


@pytest.mark.parametrize(
    ("text", "want"), [("2s", 2.0), ("1m", 60.0), ("1m30s", 90.0), ("500ms", 0.5), ("3", 3.0)]
)
def test_parse_duration(text: str, want: float) -> None:
    assert parse_duration(text) == want


@pytest.mark.parametrize("text", ["", "2x", "s", "-1", "1m junk"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration(text)


def test_parse_bool() -> None:
    assert parse_bool("false") is False and parse_bool("True") is True
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bool("maybe")


def test_flags_accept_dranet_spellings() -> None:
    args = build_parser().parse_args(
        [
            "--hostname-override",
            "n1",
            "--inventory-min-poll-interval",
            "1s",
            "--inventory-max-poll-interval",
            "30s",
            "--inventory-poll-burst",
            "2",
            "--move-ib-interfaces=false",
            "--cloud-provider-hint",
            "NONE",
        ]
    )
    assert (args.node_name, args.min_poll_interval, args.max_poll_interval, args.poll_burst) == (
        "n1",
        1.0,
        30.0,
        2,
    )
    assert args.move_ib_interfaces is False and args.cloud_provider_hint == "NONE"
    assert build_parser().parse_args(["--move-ib-interfaces"]).move_ib_interfaces is True


def test_pci_ids(tmp_path: Path) -> None:
    path = tmp_path / "pci.ids"
    path.write_text(PCI_IDS)
    db = PciIds(path)
    assert db.vendor_name("15b3") == "Mellanox Technologies"
    assert db.device_name("15B3", "1017") == "MT27800 Family [ConnectX-5]"
    assert db.device_name("8086", "1592") == "Ethernet Controller E810-C for QSFP"
    assert db.vendor_name("1ded") == UNKNOWN and db.device_name("15b3", "ffff") == UNKNOWN
    # The class section ("C 02") is not read as vendors.
    assert db.vendor_name("C 02") == UNKNOWN
    assert find_database(str(path)) == path
    assert PciIds(None).vendor_name("15b3") == "15b3"


def test_rdma_netns_mode_values() -> None:
    assert (netns_mode_from_attr(1), netns_mode_from_attr(0)) == (SHARED, EXCLUSIVE)
