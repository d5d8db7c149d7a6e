"""Attribute value rules: address lists, the 64-character limit, the 32-attribute limit."""

from __future__ import annotations

import ipaddress

import pytest

from services.inventory import attributes as A
from shared.deviceattr import Attribute, AttrKind, attribute_problem


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


# SLIT rows of a 2-socket machine with 2 NUMA nodes per socket (sub-NUMA clustering).
SNC = {0: (10, 12, 20, 20), 1: (12, 10, 20, 20), 2: (20, 20, 10, 12), 3: (20, 20, 12, 10)}


@pytest.mark.parametrize(
    ("node", "distances", "sockets", "want"),
    [
        # the kernel's numa_node first, then the same-socket nodes at the smallest distance
        (0, SNC, {0: 0, 1: 0, 2: 1, 3: 1}, [0, 1]),
        (1, SNC, {0: 0, 1: 0, 2: 1, 3: 1}, [1, 0]),
        (3, SNC, {0: 0, 1: 0, 2: 1, 3: 1}, [3, 2]),
        # no socket facts: distance alone decides
        (2, SNC, {}, [2, 3]),
        # a single-node machine, or no distances: the node alone
        (0, {0: (10,)}, {0: 0}, [0]),
        (0, {}, {}, [0]),
        (1, {0: (10, 20)}, {}, [1]),
        # the node is outside its own row (a broken table): alone
        (2, {2: (10, 20)}, {}, [2]),
        # several nodes tie at the smallest distance, ascending after the device's node
        (2, {2: (11, 11, 10, 11)}, {}, [2, 0, 1, 3]),
        # a tie on another socket is left out; one whose socket is unknown stays in
        (2, {2: (11, 11, 10, 11)}, {0: 1, 1: 0, 2: 0}, [2, 1, 3]),
        # the device's own socket unknown: no socket filtering at all
        (2, {2: (11, 11, 10, 11)}, {0: 1, 1: 0}, [2, 0, 1, 3]),
        # equidistant but farther than the nearest one: not listed
        (0, {0: (10, 21, 12, 21)}, {}, [0, 2]),
    ],
)
def test_numa_node_list(
    node: int, distances: dict[int, tuple[int, ...]], sockets: dict[int, int], want: list[int]
) -> None:
    assert A.numa_node_list(node, distances, sockets) == want


@pytest.mark.parametrize(
    ("obj", "attr"),
    [
        ({"ints": [0, 1]}, Attribute.of_ints([0, 1])),
        ({"bools": [True, False]}, Attribute(AttrKind.BOOLS, (True, False))),
        ({"strings": ["a", "b"]}, Attribute(AttrKind.STRINGS, ("a", "b"))),
        ({"versions": ["1.0.0"]}, Attribute(AttrKind.VERSIONS, ("1.0.0",))),
        ({"int": 3}, Attribute.of_int(3)),
    ],
)
def test_list_attributes_round_trip(obj: dict[str, object], attr: Attribute) -> None:
    assert Attribute.from_json(obj) == attr
    assert attr.to_json() == obj
    assert attribute_problem("resource.kubernetes.io/numaNode", attr) is None


@pytest.mark.parametrize(
    "obj",
    [{"ints": []}, {"ints": [True]}, {"ints": 1}, {"strings": [1]}, {"bools": [0]}, {"lists": [1]}],
)
def test_bad_list_attributes(obj: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Attribute.from_json(obj)


def test_list_attribute_limits() -> None:
    assert "48" in str(attribute_problem("a.b/c", Attribute.of_ints(range(49))))
    assert "64" in str(attribute_problem("a.b/c", Attribute(AttrKind.STRINGS, ("x" * 65,))))
    assert "semantic" in str(attribute_problem("a.b/c", Attribute(AttrKind.VERSIONS, ("1.0",))))
