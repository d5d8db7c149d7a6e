"""rtnetlink decoding and the interrupted-dump retry, on crafted messages."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from services.inventory import rtnl
from shared.rtnl import codec


def attr(kind: int, payload: bytes) -> bytes:
    return codec.attr(kind, payload)


def u32(v: int) -> bytes:
    return struct.pack("=I", v)


def link_msg(index: int, name: str, *, kind: str = "", ifi_type: int = 1, **extra: bytes) -> memoryview:
    body = struct.pack("=BxHiII", 0, ifi_type, index, 0x1003, 0)
    body += attr(rtnl.IFLA_IFNAME, name.encode() + b"\0")
    body += attr(rtnl.IFLA_MTU, u32(9000))
    body += attr(rtnl.IFLA_ADDRESS, bytes.fromhex("0c42a116054c"))
    body += attr(rtnl.IFLA_OPERSTATE, bytes([6]))
    if kind:
        body += attr(rtnl.IFLA_LINKINFO | 0x8000, attr(rtnl.IFLA_INFO_KIND, kind.encode() + b"\0"))
    for key, value in extra.items():
        body += attr(
            {"alias": rtnl.IFLA_IFALIAS, "link": rtnl.IFLA_LINK, "netnsid": rtnl.IFLA_LINK_NETNSID}[key],
            value,
        )
    return memoryview(body)


def test_decode_link() -> None:
    got = rtnl._decode_link(
        rtnl.RTM_NEWLINK, link_msg(7, "mv0", kind="macvlan", alias=b"uplink\0", link=u32(3))
    )
    assert got == rtnl.Link(
        index=7,
        name="mv0",
        kind="macvlan",
        ifi_type=1,
        flags=0x1003,
        mtu=9000,
        mac="0c:42:a1:16:05:4c",
        alias="uplink",
        operstate=6,
        master=0,
        link=3,
    )
    assert (got.type, got.encapsulation, got.state) == ("macvlan", "ether", "up")


def test_link_in_another_namespace_has_no_parent() -> None:
    got = rtnl._decode_link(rtnl.RTM_NEWLINK, link_msg(7, "veth0", kind="veth", link=u32(12), netnsid=u32(0)))
    assert got is not None and got.link == 0


@pytest.mark.parametrize(
    ("kind", "want"),
    [("", "device"), ("tun", "tuntap"), ("veth", "veth"), ("ipoib", "ipoib"), ("vxlan", "vxlan")],
)
def test_link_type_name(kind: str, want: str) -> None:
    assert rtnl.link_type_name(kind) == want


@pytest.mark.parametrize(
    ("arphrd", "want"),
    [
        (1, "ether"),
        (32, "infiniband"),
        (772, "loopback"),
        (65534, "none"),
        (768, "ipip"),
        (799, "fcfb12"),
        (4242, "unknown4242"),
    ],
)
def test_encap_name(arphrd: int, want: str) -> None:
    assert rtnl.encap_name(arphrd) == want


@pytest.mark.parametrize(
    ("state", "want"),
    [(0, "unknown"), (1, "not-present"), (2, "down"), (3, "lower-layer-down"), (5, "dormant"), (6, "up")],
)
def test_oper_state_name(state: int, want: str) -> None:
    assert rtnl.oper_state_name(state) == want


def test_format_mac() -> None:
    assert rtnl.format_mac(bytes(6)) == ""
    assert rtnl.format_mac(bytes.fromhex("0a0b0c0d0e0f")) == "0a:0b:0c:0d:0e:0f"
    assert len(rtnl.format_mac(bytes(range(1, 21))).split(":")) == 20  # IPoIB


def test_decode_addr_prefers_local() -> None:
    body = struct.pack("=BBBBI", socket.AF_INET, 32, 0, 0, 4)
    body += attr(rtnl.IFA_ADDRESS, socket.inet_aton("10.0.0.9"))  # the peer of a point-to-point link
    body += attr(rtnl.IFA_LOCAL, socket.inet_aton("10.0.0.1"))
    got = rtnl._decode_addr(0, memoryview(body))
    assert got is not None and (got.cidr, got.index, got.scope) == ("10.0.0.1/32", 4, 0)


def test_decode_route() -> None:
    body = struct.pack("=BBBBBBBBI", socket.AF_INET6, 0, 0, 0, 254, 3, 0, 1, 0)
    body += attr(rtnl.RTA_GATEWAY, socket.inet_pton(socket.AF_INET6, "fd00::1"))
    body += attr(rtnl.RTA_OIF, u32(5))
    body += attr(rtnl.RTA_PRIORITY, u32(100))
    body += attr(rtnl.RTA_TABLE, u32(1000))
    got = rtnl._decode_route(0, memoryview(body))
    assert got is not None
    assert (got.dst, got.gateway, got.oif, got.table, got.priority, got.protocol) == (
        "::/0",
        "fd00::1",
        5,
        1000,
        100,
        3,
    )


def test_decode_route_skips_cloned_and_reads_multipath() -> None:
    cloned = struct.pack("=BBBBBBBBI", socket.AF_INET, 32, 0, 0, 254, 0, 0, 1, rtnl.RTM_F_CLONED)
    assert rtnl._decode_route(0, memoryview(cloned)) is None
    nexthops = struct.pack("=HBBi", 8, 0, 0, 3) + struct.pack("=HBBi", 8, 0, 0, 4)
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 3, 0, 1, 0)
    body += attr(rtnl.RTA_MULTIPATH, nexthops)
    got = rtnl._decode_route(0, memoryview(body))
    assert got is not None and got.oifs == (3, 4) and got.oif == 0


def test_decode_rule_and_neighbor() -> None:
    body = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 24, 0, 0, 0, 0, 1, 0)
    body += attr(rtnl.FRA_SRC, socket.inet_aton("10.1.0.0")) + attr(rtnl.FRA_PRIORITY, u32(1000))
    body += attr(rtnl.FRA_TABLE, u32(100))
    assert rtnl._decode_rule(0, memoryview(body)) == rtnl.Rule(socket.AF_INET, 1000, "10.1.0.0/24", "", 100)
    nd = struct.pack("=BxxxiHBB", socket.AF_INET, 3, rtnl.NUD_PERMANENT, 0, 1)
    nd += attr(rtnl.NDA_DST, socket.inet_aton("10.1.0.7")) + attr(
        rtnl.NDA_LLADDR, bytes.fromhex("020000000007")
    )
    assert rtnl._decode_neigh(0, memoryview(nd)) == rtnl.Neighbor(
        3, rtnl.NUD_PERMANENT, "10.1.0.7", "02:00:00:00:00:07"
    )


def test_decode_bpf_filter_name() -> None:
    body = struct.pack("=BxxxiIII", 0, 4, 1, rtnl.TC_H_MIN_INGRESS, 0)
    body += attr(rtnl.TCA_KIND, b"bpf\0")
    body += attr(rtnl.TCA_OPTIONS | 0x8000, attr(rtnl.TCA_BPF_NAME, b"cil_from_netdev\0"))
    assert rtnl._decode_filter(0, memoryview(body)) == rtnl.TcFilter(
        4, rtnl.TC_H_MIN_INGRESS, "bpf", "cil_from_netdev"
    )


def test_parse_attrs_stops_at_garbage() -> None:
    buf = attr(1, b"ab") + b"\xff\xff\x02\x00"
    assert {k: bytes(v) for k, v in rtnl.parse_attrs(buf, 0, len(buf)).items()} == {1: b"ab"}


class ScriptedNetlink(rtnl.Netlink):
    """A Netlink whose dumps replay scripted answers (no socket)."""

    def __init__(self, answers: list[list[tuple[int, int, memoryview]]]) -> None:
        self.answers = answers
        self.requests = 0

    def messages(self, msg_type: int, flags: int, payload: bytes) -> Iterator[tuple[int, int, memoryview]]:
        self.requests += 1
        yield from self.answers.pop(0)


def test_interrupted_dump_is_retried() -> None:
    one = link_msg(2, "a")
    two = link_msg(3, "b")
    nl = ScriptedNetlink(
        [
            [(rtnl.RTM_NEWLINK, rtnl.NLM_F_MULTI | rtnl.NLM_F_DUMP_INTR, one)],
            [(rtnl.RTM_NEWLINK, rtnl.NLM_F_MULTI, one), (rtnl.RTM_NEWLINK, rtnl.NLM_F_MULTI, two)],
        ]
    )
    got = nl.dump(rtnl.RTM_GETLINK, b"", rtnl._decode_link)
    assert [lk.name for lk in got] == ["a", "b"] and nl.requests == 2


def test_always_interrupted_dump_returns_the_last_result() -> None:
    intr = (rtnl.RTM_NEWLINK, rtnl.NLM_F_MULTI | rtnl.NLM_F_DUMP_INTR, link_msg(2, "a"))
    nl = ScriptedNetlink([[intr] for _ in range(rtnl.MAX_DUMP_ATTEMPTS)])
    got = nl.dump(rtnl.RTM_GETLINK, b"", rtnl._decode_link)
    assert [lk.name for lk in got] == ["a"] and nl.requests == rtnl.MAX_DUMP_ATTEMPTS


def test_interrupt_flag_on_done_counts() -> None:
    done = (rtnl.NLMSG_DONE, rtnl.NLM_F_MULTI | rtnl.NLM_F_DUMP_INTR, memoryview(b"\0\0\0\0"))
    ok = (rtnl.RTM_NEWLINK, rtnl.NLM_F_MULTI, link_msg(2, "a"))
    nl = ScriptedNetlink([[ok, done], [ok]])
    nl.dump(rtnl.RTM_GETLINK, b"", rtnl._decode_link)
    assert nl.requests == 2
