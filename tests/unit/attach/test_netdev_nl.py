"""The rtnetlink / RDMA netlink codec of the attach engine, against hand-built bytes.

The request loop runs over a fake socket that answers with scripted datagrams, so
these tests need no kernel; tests/integration/attach/test_netdev.py runs the same
code against real netns. The RDMA messages can only be checked this way here: this
machine's kernel has no RDMA netlink.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

import pytest

from services.attach.netdev_nl import Message, NetlinkError, NlSocket
from shared.rtnl import codec as nl


def hdr(length: int, mtype: int, flags: int, seq: int) -> bytes:
    return struct.pack("=IHHII", length, mtype, flags, seq, 0)


def msg(mtype: int, body: bytes, seq: int, flags: int = 0) -> bytes:
    data = hdr(16 + len(body), mtype, flags, seq) + body
    return data + b"\0" * (-len(data) % 4)


def ack(seq: int, code: int = 0, ext_msg: str = "") -> bytes:
    body = struct.pack("=i", -code) + hdr(20, 0, 0, seq)  # capped: the request header only
    flags = 0x100  # NLM_F_CAPPED
    if ext_msg:
        body += nl.attr_str(nl.NLMSGERR_ATTR_MSG, ext_msg)
        flags |= nl.NLM_F_ACK_TLVS
    return msg(nl.NLMSG_ERROR, body, seq, flags)


class FakeSock:
    """Records what was sent; answers each send with the next scripted datagrams."""

    def __init__(self, replies: list[list[bytes]]) -> None:
        self.sent: list[bytes] = []
        self.replies = replies
        self.pending: Iterator[bytes] = iter(())

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        self.pending = iter(self.replies.pop(0))
        return len(data)

    def recv_into(self, buf: bytearray, nbytes: int = 0, flags: int = 0) -> int:
        data = next(self.pending)
        buf[: len(data)] = data
        return len(data)

    def close(self) -> None:
        pass


def fake_socket(*replies: list[bytes]) -> tuple[NlSocket, FakeSock]:
    s = NlSocket.__new__(NlSocket)
    fake = FakeSock(list(replies))
    s.sock = fake  # type: ignore[assignment]
    s.proto = nl.NETLINK_ROUTE
    s._seq = 0
    s._buf = bytearray(1 << 16)
    return s, fake


def sent_message(data: bytes) -> tuple[int, int, bytes]:
    length, mtype, flags, _seq, _pid = struct.unpack_from("=IHHII", data)
    assert length == len(data)
    return mtype, flags, data[16:]


def test_attribute_padding_and_parsing() -> None:
    a = nl.attr_str(nl.IFLA_IFNAME, "net1")  # 4 + 5 bytes, padded to 12
    assert a == struct.pack("=HH", 9, 3) + b"net1\0" + b"\0\0\0"
    blob = a + nl.attr_u32(nl.IFLA_MTU, 9000) + nl.attr_nested(nl.IFLA_PROP_LIST, nl.attr_str(53, "x"))
    parsed = nl.parse_attrs(blob)
    assert parsed[nl.IFLA_IFNAME] == b"net1\0"
    assert struct.unpack("=I", parsed[nl.IFLA_MTU]) == (9000,)
    assert nl.IFLA_PROP_LIST in parsed  # NLA_F_NESTED stripped
    assert list(nl.iter_attrs(b"\x02\x00")) == []  # truncated: ignored


def test_move_and_rename_is_one_newlink_with_netns_fd_name_and_attrs() -> None:
    s, fake = fake_socket([ack(1)])
    s.set_link(7, new_name="net1", netns_fd=5, mtu=9000, mac="02:00:00:00:00:42", gso_ipv4_max_size=65536)
    mtype, flags, body = sent_message(fake.sent[0])
    assert mtype == nl.RTM_NEWLINK and flags == nl.NLM_F_REQUEST | nl.NLM_F_ACK
    family, _t, index, iflags, change = struct.unpack_from("=BxHiII", body)
    assert (family, index, iflags, change) == (0, 7, 0, 0)
    a = nl.parse_attrs(body, 16)
    assert a[nl.IFLA_IFNAME] == b"net1\0"
    assert a[nl.IFLA_NET_NS_FD] == struct.pack("=I", 5)
    assert a[nl.IFLA_MTU] == struct.pack("=I", 9000)
    assert a[nl.IFLA_ADDRESS] == bytes.fromhex("020000000042")
    assert a[nl.IFLA_GSO_IPV4_MAX_SIZE] == struct.pack("=I", 65536)  # attr 63: pyroute2 0.9.7 lacks it


def test_link_state_by_name_selects_by_ifname_and_sets_the_up_flag_mask() -> None:
    s, fake = fake_socket([ack(1)], [ack(2)])
    s.set_link(name="eth1", up=True)
    s.set_link(3, up=False)
    _t, _f, up = sent_message(fake.sent[0])
    assert struct.unpack_from("=BxHiII", up)[2:] == (0, nl.IFF_UP, nl.IFF_UP)
    assert nl.parse_attrs(up, 16)[nl.IFLA_IFNAME] == b"eth1\0"
    _t, _f, down = sent_message(fake.sent[1])
    assert struct.unpack_from("=BxHiII", down)[2:] == (3, 0, nl.IFF_UP)


def link_reply(seq: int) -> bytes:
    body = struct.pack("=BxHiII", 0, 1, 12, nl.IFF_UP | 0x1000, 0)
    body += nl.attr_str(nl.IFLA_IFNAME, "net1") + nl.attr(nl.IFLA_ADDRESS, bytes.fromhex("0200000000aa"))
    body += nl.attr_u32(nl.IFLA_MTU, 1400) + nl.attr_u32(nl.IFLA_LINK, 4)
    body += nl.attr_nested(nl.IFLA_LINKINFO, nl.attr_str(nl.IFLA_INFO_KIND, "veth"))
    body += nl.attr_nested(
        nl.IFLA_PROP_LIST,
        nl.attr_str(nl.IFLA_ALT_IFNAME, "dranet-eth1"),
        nl.attr_str(nl.IFLA_ALT_IFNAME, "x"),
    )
    body += nl.attr_u32(nl.IFLA_GSO_MAX_SIZE, 65536)
    return msg(nl.RTM_NEWLINK, body, seq)


def test_get_link_decodes_the_reply_and_asks_without_vf_info() -> None:
    s, fake = fake_socket([link_reply(1), ack(1)])
    link = s.get_link(altname="dranet-eth1")
    assert link is not None
    assert (link.name, link.index, link.mac, link.mtu, link.up, link.kind) == (
        "net1",
        12,
        "02:00:00:00:00:aa",
        1400,
        True,
        "veth",
    )
    assert link.altnames == ("dranet-eth1", "x") and link.link == 4 and link.gso_max_size == 65536
    mtype, _f, body = sent_message(fake.sent[0])
    a = nl.parse_attrs(body, 16)
    assert mtype == nl.RTM_GETLINK
    assert a[nl.IFLA_ALT_IFNAME] == b"dranet-eth1\0" and a[nl.IFLA_EXT_MASK] == b"\0\0\0\0"


def test_missing_link_is_none_and_other_errors_carry_the_kernel_message() -> None:
    s, _ = fake_socket([ack(1, errno.ENODEV)], [ack(2, errno.EEXIST, "File exists in target")])
    assert s.get_link(name="nope") is None
    with pytest.raises(NetlinkError) as err:
        s.set_link(3, new_name="eth0", netns_fd=4)
    assert err.value.errno == errno.EEXIST
    assert "kernel: File exists in target" in str(err.value)


def test_request_skips_late_replies_and_collects_a_dump_until_done() -> None:
    late = ack(7)
    first = msg(
        nl.RTM_NEWLINK, struct.pack("=BxHiII", 0, 1, 1, 0, 0) + nl.attr_str(3, "lo"), 1, nl.NLM_F_MULTI
    )
    second = msg(
        nl.RTM_NEWLINK, struct.pack("=BxHiII", 0, 1, 2, 0, 0) + nl.attr_str(3, "eth0"), 1, nl.NLM_F_MULTI
    )
    done = msg(nl.NLMSG_DONE, struct.pack("=i", 0), 1, nl.NLM_F_MULTI)
    s, _ = fake_socket([late + first, second + done])
    assert [link.name for link in s.list_links()] == ["lo", "eth0"]


def test_address_route_rule_and_neighbor_messages() -> None:
    s, fake = fake_socket(*[[ack(i)] for i in range(1, 6)])
    s.add_address(12, "2001:db8::5/64")
    s.add_route(12, "10.0.0.0/8", gateway="192.0.2.1", source="192.0.2.5", table=1100)
    s.rule(100, "192.0.2.5/32", "", 100, add=True)
    s.rule(100, "192.0.2.5/32", "", 100, add=False)
    s.replace_neighbor(12, "192.0.2.1", "02:00:00:00:00:0a")

    t, f, body = sent_message(fake.sent[0])
    assert t == nl.RTM_NEWADDR and f & nl.NLM_F_CREATE and f & nl.NLM_F_EXCL
    assert struct.unpack_from("=BBBBI", body) == (socket.AF_INET6, 64, 0, 0, 12)
    assert nl.parse_attrs(body, 8)[nl.IFA_LOCAL] == socket.inet_pton(socket.AF_INET6, "2001:db8::5")

    t, _f, body = sent_message(fake.sent[1])
    family, dst_len, _s, _tos, table, proto, scope, rtype, _fl = struct.unpack_from("=BBBBBBBBI", body)
    assert (t, family, dst_len, table, proto, scope, rtype) == (nl.RTM_NEWROUTE, 2, 8, 0, 3, 0, 1)
    a = nl.parse_attrs(body, 12)
    assert a[nl.RTA_TABLE] == struct.pack("=I", 1100)  # > 255: only in the attribute
    assert a[nl.RTA_OIF] == struct.pack("=I", 12)
    assert a[nl.RTA_GATEWAY] == socket.inet_aton("192.0.2.1") and a[nl.RTA_PREFSRC] == socket.inet_aton(
        "192.0.2.5"
    )

    t, f, body = sent_message(fake.sent[2])
    assert t == nl.RTM_NEWRULE and f & nl.NLM_F_EXCL
    fam, dlen, slen, _tos, table, _r1, _r2, action, _fl = struct.unpack_from("=BBBBBBBBI", body)
    assert (fam, dlen, slen, table, action) == (2, 0, 32, 100, nl.FR_ACT_TO_TBL)
    a = nl.parse_attrs(body, 12)
    assert a[nl.FRA_PRIORITY] == struct.pack("=I", 100) and a[nl.FRA_SRC] == socket.inet_aton("192.0.2.5")
    assert sent_message(fake.sent[3])[0] == nl.RTM_DELRULE

    t, f, body = sent_message(fake.sent[4])
    assert t == nl.RTM_NEWNEIGH and f & nl.NLM_F_REPLACE
    fam, ifindex, state, _flags, _type = struct.unpack_from("=BxxxiHBB", body)
    assert (fam, ifindex, state) == (2, 12, nl.NUD_PERMANENT)
    assert nl.parse_attrs(body, 12)[nl.NDA_LLADDR] == bytes.fromhex("02000000000a")


def test_child_link_is_created_in_the_target_netns_on_its_host_parent() -> None:
    s, fake = fake_socket([ack(1)])
    s.create_link(
        "net1", "ipvlan", info_data=nl.attr_u16(nl.IFLA_IPVLAN_MODE, 0), parent=4, netns_fd=9, mtu=1500
    )
    t, f, body = sent_message(fake.sent[0])
    assert t == nl.RTM_NEWLINK and f & nl.NLM_F_CREATE and f & nl.NLM_F_EXCL
    a = nl.parse_attrs(body, 16)
    assert a[nl.IFLA_LINK] == struct.pack("=I", 4) and a[nl.IFLA_NET_NS_FD] == struct.pack("=I", 9)
    info = nl.parse_attrs(a[nl.IFLA_LINKINFO])
    assert info[nl.IFLA_INFO_KIND] == b"ipvlan\0"
    assert nl.parse_attrs(info[nl.IFLA_INFO_DATA])[nl.IFLA_IPVLAN_MODE] == struct.pack("=H", 0)


def test_rdma_messages() -> None:
    dev = nl.attr_u32(nl.RDMA_NLDEV_ATTR_DEV_INDEX, 3) + nl.attr_str(nl.RDMA_NLDEV_ATTR_DEV_NAME, "mlx5_0")
    done = msg(nl.NLMSG_DONE, struct.pack("=i", 0), 1, nl.NLM_F_MULTI)
    s, fake = fake_socket([msg(nl.rdma_type(nl.RDMA_NLDEV_CMD_GET), dev, 1, nl.NLM_F_MULTI), done], [ack(2)])
    assert s.rdma_devices() == {"mlx5_0": 3}
    t, f, body = sent_message(fake.sent[0])
    assert t == (5 << 10) + 1 == 5121 and f & nl.NLM_F_DUMP == nl.NLM_F_DUMP and body == b""
    s.rdma_set_netns(3, 11)
    t, _f, body = sent_message(fake.sent[1])
    assert t == 5122
    assert nl.parse_attrs(body) == {1: struct.pack("=I", 3), 68: struct.pack("=I", 11)}


def test_tc_filter_listing_and_delete() -> None:
    tc = struct.pack("=BxxxiIII", 0, 12, 1, 0xFFFFFFF2, (49152 << 16) | 0x0300)
    tc += nl.attr_str(nl.TCA_KIND, "bpf") + nl.attr_u32(nl.TCA_CHAIN, 0)
    done = msg(nl.NLMSG_DONE, struct.pack("=i", 0), 1, nl.NLM_F_MULTI)
    s, fake = fake_socket([msg(44, tc, 1, nl.NLM_F_MULTI), done], [ack(2)])
    assert s.tc_filters(12, 0xFFFFFFF2) == [(1, 0xFFFFFFF2, (49152 << 16) | 0x0300, 0, "bpf")]
    s.delete_tc_filter(12, 1, 0xFFFFFFF2, (49152 << 16) | 0x0300, 0, "bpf")
    t, _f, body = sent_message(fake.sent[1])
    assert t == nl.RTM_DELTFILTER
    assert struct.unpack_from("=BxxxiIII", body)[1:] == (12, 1, 0xFFFFFFF2, (49152 << 16) | 0x0300)


def test_message_is_plain_data() -> None:
    assert Message(1, 2, 3, b"x") == Message(1, 2, 3, b"x")
    assert nl.mac_bytes("0200.0000.00aa") == bytes.fromhex("0200000000aa")
    assert nl.cidr_parts("192.0.2.5/24") == (socket.AF_INET, socket.inet_aton("192.0.2.5"), 24)
