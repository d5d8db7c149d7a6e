"""Attribute value rules: address lists, the 64-character limit, the 32-attribute limit."""

from __future__ import annotations

import ipaddress

import pytest

from services.inventory import attributes as A
from services.inventory.cloud.base import Attribute


@pytest.mark.parametrize(
    ("ip", "want"),
    [
        ("10.0.0.1", True),  # private counts, as in Go
        ("192.0.2.1", True),
        ("2001:db8::1", True),
        ("fd00::1", True),
        ("127.0.0.1", False),
        ("169.254.3.4", False),
        ("fe80::1", False),
        ("224.0.0.1", False),
        ("ff02::1", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::1", False),
        ("255.255.255.255", False),
    ],
)
def test_is_global_unicast(ip: str, want: bool) -> None:
    assert A.is_global_unicast(ipaddress.ip_address(ip)) is want


@pytest.mark.parametrize(
    ("values", "limit", "want"),
    [
        ([], 64, ("", 0)),
        (["a"], 64, ("a", 1)),
        (["aaa", "bbb", "ccc"], 7, ("aaa,bbb", 2)),
        (["aaa", "bbb", "ccc"], 11, ("aaa,bbb,ccc", 3)),
        (["aaa", "bbb", "ccc"], 10, ("aaa,bbb", 2)),
        (["toolong"], 3, ("", 0)),
    ],
)
def test_join_within(values: list[str], limit: int, want: tuple[str, int]) -> None:
    assert A.join_within(values, limit) == want


def test_address_lists_dedup_sort_and_split() -> None:
    v4, v6 = A.address_lists(
        ["10.0.0.10/24", "10.0.0.2/24", "10.0.0.2/24", "fe80::1/64", "2001:db8::1/64", "bogus", "127.0.0.1/8"]
    )
    assert v4 == ["10.0.0.10/24", "10.0.0.2/24"]  # string order, as dranet sorts
    assert v6 == ["2001:db8::1/64"]


def test_limit_keeps_dranet_attributes_first() -> None:
    attrs = {name: Attribute.of_bool(True) for name in A.DRANET_ATTRIBUTES}
    attrs.update({name: Attribute.of_int(1) for name in A.STANDARD_ATTRIBUTES})
    cloud = {f"gce.dra.net/attr{i:02d}": Attribute.of_string("x") for i in range(10)}
    kept, dropped = A.limit_attributes({**cloud, **attrs})
    assert len(kept) == A.MAX_ATTRIBUTES_PER_DEVICE == 32
    assert set(A.DRANET_ATTRIBUTES) <= set(kept) and set(A.STANDARD_ATTRIBUTES) <= set(kept)
    assert dropped == [f"gce.dra.net/attr{i:02d}" for i in range(7, 10)]


def test_limit_is_a_no_op_under_the_limit() -> None:
    attrs = {A.IF_NAME: Attribute.of_string("eth0")}
    assert A.limit_attributes(attrs) == (attrs, [])


def test_fit_string() -> None:
    assert A.fit_string("x" * 70) == "x" * 64
    assert A.fit_string("short") == "short"
