"""What prepare takes from a DHCP ACK (services/prepare/dhcp.py): pure decoding."""

from __future__ import annotations

import ipaddress

import pytest

from services.prepare.dhcp import DhcpError, classless_static_routes, lease_from_reply
from shared.netconfig import RouteConfig

# RFC 3442 section 3's examples: 0/0 via 10.0.0.1 (1 byte), 10/8 (2), 10.17/16 (3),
# 10.27.129/24 (4), 10.229.0.128/25 (5), on-link 10.198.122.47/32.
RFC3442 = b"".join(
    bytes(d)
    for d in (
        [0, 10, 0, 0, 1],
        [8, 10, 10, 0, 0, 2],
        [16, 10, 17, 10, 0, 0, 3],
        [24, 10, 27, 129, 10, 0, 0, 4],
        [25, 10, 229, 0, 128, 10, 0, 0, 5],
        [32, 10, 198, 122, 47, 0, 0, 0, 0],
    )
)


def test_classless_static_routes_decode_every_width() -> None:
    assert classless_static_routes(RFC3442) == [
        (ipaddress.IPv4Network("0.0.0.0/0"), "10.0.0.1"),
        (ipaddress.IPv4Network("10.0.0.0/8"), "10.0.0.2"),
        (ipaddress.IPv4Network("10.17.0.0/16"), "10.0.0.3"),
        (ipaddress.IPv4Network("10.27.129.0/24"), "10.0.0.4"),
        (ipaddress.IPv4Network("10.229.0.128/25"), "10.0.0.5"),
        (ipaddress.IPv4Network("10.198.122.47/32"), "0.0.0.0"),
    ]
    # pyroute2 hands the payload over as a list of byte values.
    assert classless_static_routes(list(RFC3442)) == classless_static_routes(RFC3442)


def test_classless_static_routes_mask_host_bits_and_refuse_garbage() -> None:
    # Width 16 reads two destination octets; width 17 reads three and drops the bits past 17
    # (the kernel refuses a destination with host bits).
    assert classless_static_routes([16, 10, 1, 0, 0, 0, 1]) == [
        (ipaddress.IPv4Network("10.1.0.0/16"), "0.0.0.1")
    ]
    assert classless_static_routes([17, 10, 1, 255, 1, 1, 1, 1]) == [
        (ipaddress.IPv4Network("10.1.128.0/17"), "1.1.1.1")
    ]
    with pytest.raises(ValueError, match="truncated"):
        classless_static_routes([24, 10, 1, 2, 10, 0])
    with pytest.raises(ValueError, match="prefix width 33"):
        classless_static_routes([33, 1, 1, 1, 1, 1, 1, 1, 1, 1])


def test_lease_takes_address_mask_and_option_121_ignoring_option_3() -> None:
    lease = lease_from_reply(
        "eth1",
        "10.0.5.8",
        {
            "subnet_mask": "255.255.255.255",
            "router": ["10.0.5.1"],
            "classless_static_route": [32, 10, 0, 5, 1, 0, 0, 0, 0, 24, 10, 0, 5, 10, 0, 5, 1],
            "server_id": "169.254.169.254",
            "lease_time": 86400,
        },
    )
    assert lease.address == "10.0.5.8/32"
    # The GCE shape: the gateway as an on-link /32, then the subnet through it.
    assert lease.routes == (
        RouteConfig(destination="10.0.5.1/32", scope=253),
        RouteConfig(destination="10.0.5.0/24", gateway="10.0.5.1"),
    )
    assert (lease.server_id, lease.lease_time_s) == ("169.254.169.254", 86400)


def test_lease_without_121_uses_the_first_router_as_default_route() -> None:
    lease = lease_from_reply(
        "eth1", "192.0.2.9", {"subnet_mask": "255.255.255.0", "router": ["192.0.2.1", "192.0.2.2"]}
    )
    assert lease.address == "192.0.2.9/24"
    assert lease.routes == (RouteConfig(destination="0.0.0.0/0", gateway="192.0.2.1"),)
    assert lease_from_reply("eth1", "192.0.2.9", {"subnet_mask": "255.255.255.0"}).routes == ()


@pytest.mark.parametrize(
    ("yiaddr", "options", "message"),
    [
        ("0.0.0.0", {"subnet_mask": "255.255.255.0"}, "no address"),
        ("192.0.2.9", {}, "no subnet mask"),
        ("192.0.2.9", {"subnet_mask": "255.0.255.0"}, "invalid subnet mask"),
        (
            "192.0.2.9",
            {"subnet_mask": "255.255.255.0", "classless_static_route": [24, 1]},
            "invalid option 121",
        ),
    ],
)
def test_unusable_replies_are_errors(yiaddr: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(DhcpError, match=message):
        lease_from_reply("eth1", yiaddr, options)
