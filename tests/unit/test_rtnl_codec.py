"""The shared rtnetlink codec (shared/rtnl/codec.py) on hand-built bytes: attribute
layout and alignment, round trips, nested attributes, message framing, error replies,
and malformed input (a clear MalformedError, never a loop)."""

from __future__ import annotations

import errno
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.rtnl import codec
from shared.rtnl.codec import MalformedError


def hdr(length: int, mtype: int, flags: int = 0, seq: int = 0) -> bytes:
    return struct.pack("=IHHII", length, mtype, flags, seq, 0)


# --- encoding and alignment ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "wire"),
    [
        (b"", "04000100"),
        (b"a", "0500010061000000"),
        (b"ab", "0600010061620000"),
        (b"abc", "0700010061626300"),
        (b"abcd", "0800010061626364"),
        (b"abcde", "090001006162636465000000"),
    ],
)
def test_attribute_length_excludes_padding_and_total_is_4_aligned(payload: bytes, wire: str) -> None:
    out = codec.attr(1, payload)
    assert out.hex() == wire
    assert len(out) % 4 == 0 and len(out) == codec.align(4 + len(payload))


@pytest.mark.parametrize(
    ("encoded", "decode", "value"),
    [
        (codec.attr_u8(7, 0xAB), codec.u8, 0xAB),
        (codec.attr_u16(7, 0xBEEF), lambda v: struct.unpack("=H", v)[0], 0xBEEF),
        (codec.attr_u32(7, 0xDEADBEEF), codec.u32, 0xDEADBEEF),
        (codec.attr_str(7, "net1"), codec.cstr, "net1"),
        (codec.attr_str(7, ""), codec.cstr, ""),
        (codec.attr_str(7, "é-unicode"), codec.cstr, "é-unicode"),
    ],
)
def test_scalar_round_trips(encoded: bytes, decode, value) -> None:  # type: ignore[no-untyped-def]
    ((kind, payload),) = list(codec.iter_attrs(encoded, strict=True))
    assert kind == 7 and decode(payload) == value


def test_message_round_trip_and_alignment_between_messages() -> None:
    one = codec.message(codec.RTM_NEWLINK, codec.NLM_F_MULTI, 5, b"xyz")  # 19 bytes, padded to 20
    two = codec.message(codec.NLMSG_DONE, codec.NLM_F_MULTI, 5, struct.pack("=i", 0))
    assert len(one) == 19 and struct.unpack_from("=I", one)[0] == 19
    datagram = one + b"\0" + two
    got = [(t, f, s, bytes(b)) for t, f, s, b in codec.iter_messages(datagram)]
    assert got == [
        (codec.RTM_NEWLINK, codec.NLM_F_MULTI, 5, b"xyz"),
        (codec.NLMSG_DONE, codec.NLM_F_MULTI, 5, b"\0\0\0\0"),
    ]
    # The last message's padding may be missing from the datagram.
    assert [bytes(b) for *_h, b in codec.iter_messages(one)] == [b"xyz"]


def test_an_oversized_attribute_is_refused_when_encoding() -> None:
    with pytest.raises(ValueError, match="exceed"):
        codec.attr(3, bytes(codec.NLA_MAX_PAYLOAD + 1))
    assert len(codec.attr(3, bytes(codec.NLA_MAX_PAYLOAD))) == 0xFFFF + 1  # length fits, plus padding


# --- nested attributes ----------------------------------------------------------------------------


def test_nested_attributes_round_trip_with_the_nested_flag_stripped() -> None:
    linkinfo = codec.attr_nested(
        codec.IFLA_LINKINFO,
        codec.attr_str(codec.IFLA_INFO_KIND, "macvlan"),
        codec.attr_nested(codec.IFLA_INFO_DATA, codec.attr_u32(codec.IFLA_MACVLAN_MODE, 4)),
    )
    (length, kind) = struct.unpack_from("=HH", linkinfo)
    assert kind == codec.IFLA_LINKINFO | codec.NLA_F_NESTED and length == len(linkinfo)
    body = codec.attr_str(codec.IFLA_IFNAME, "mv0") + linkinfo + codec.attr_u32(codec.IFLA_MTU, 9000)
    a = codec.parse_attrs(body, strict=True)
    assert sorted(a) == [codec.IFLA_IFNAME, codec.IFLA_MTU, codec.IFLA_LINKINFO]
    info = codec.parse_attrs(a[codec.IFLA_LINKINFO], strict=True)
    assert codec.cstr(info[codec.IFLA_INFO_KIND]) == "macvlan"
    data = codec.parse_attrs(info[codec.IFLA_INFO_DATA], strict=True)
    assert codec.u32(data[codec.IFLA_MACVLAN_MODE]) == 4
    assert codec.u32(a[codec.IFLA_MTU]) == 9000


def test_parse_keeps_the_first_of_a_type_and_iter_keeps_all_in_order() -> None:
    props = codec.attr_str(codec.IFLA_ALT_IFNAME, "a") + codec.attr_str(codec.IFLA_ALT_IFNAME, "b")
    assert codec.cstr(codec.parse_attrs(props)[codec.IFLA_ALT_IFNAME]) == "a"
    assert [codec.cstr(v) for _k, v in codec.iter_attrs(props)] == ["a", "b"]


def test_attributes_after_a_fixed_header_and_up_to_an_end() -> None:
    body = codec.IFINFOMSG.pack(0, 1, 7, 0, 0) + codec.attr_u32(codec.IFLA_MTU, 1500)
    tail = codec.attr_u32(codec.IFLA_MASTER, 3)
    a = codec.parse_attrs(body + tail, codec.IFINFOMSG.size, len(body), strict=True)
    assert list(a) == [codec.IFLA_MTU]


def test_multipath_next_hops() -> None:
    hops = b"".join(
        codec.RTNEXTHOP.pack(8 + len(extra), 0, 0, ifindex) + extra
        for ifindex, extra in ((3, b""), (4, codec.attr(codec.RTA_GATEWAY, socket.inet_aton("10.0.0.1"))))
    )
    got = list(codec.iter_nexthops(hops, strict=True))
    assert [h[2] for h in got] == [3, 4]
    assert codec.ip_text(socket.AF_INET, codec.parse_attrs(got[1][3])[codec.RTA_GATEWAY]) == "10.0.0.1"


# --- malformed input ------------------------------------------------------------------------------

GOOD = codec.attr(1, b"ab")  # 8 bytes


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (GOOD + struct.pack("=HH", 0, 2), "offset 8 has length 0, shorter than its 4-byte header"),
        (GOOD + struct.pack("=HH", 3, 2), "offset 8 has length 3, shorter"),
        (GOOD + b"\xff\xff\x02\x00", "offset 8 has length 65535, past the end at 12"),
        (GOOD + struct.pack("=HH", 9, 2) + b"abcd", "offset 8 has length 9, past the end at 16"),
        (GOOD + b"\x02\x00", "2 stray bytes after the attributes at offset 8"),
    ],
)
def test_malformed_attributes_stop_leniently_or_raise_naming_the_offset(data: bytes, error: str) -> None:
    assert {k: bytes(v) for k, v in codec.parse_attrs(data).items()} == {1: b"ab"}
    assert [(k, bytes(v)) for k, v in codec.iter_attrs(data)] == [(1, b"ab")]
    with pytest.raises(MalformedError, match=error) as err:
        codec.parse_attrs(data, strict=True)
    assert err.value.errno == errno.EBADMSG and "malformed netlink data" in str(err.value)
    with pytest.raises(MalformedError, match=error):
        list(codec.iter_attrs(data, strict=True))


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (hdr(16, 3)[:10], "10 stray bytes after the messages at offset 0"),
        (hdr(8, 3) + b"\0" * 8, "offset 0 has length 8 \\(header 16, datagram 24\\)"),
        (hdr(0, 3), "offset 0 has length 0"),  # would never advance
        (hdr(64, 3) + b"\0" * 8, "offset 0 has length 64 \\(header 16, datagram 24\\)"),
        (hdr(20, 3) + b"\0" * 4 + hdr(20, 3), "offset 20 has length 20 \\(header 16, datagram 36\\)"),
        (hdr(16, 3) + b"\0" * 6, "6 stray bytes after the messages at offset 16"),
    ],
)
def test_malformed_datagrams_raise_naming_the_offset(data: bytes, error: str) -> None:
    with pytest.raises(MalformedError, match=error):
        list(codec.iter_messages(data))


def test_malformed_next_hops() -> None:
    short = codec.RTNEXTHOP.pack(4, 0, 0, 3)
    assert list(codec.iter_nexthops(short)) == []
    with pytest.raises(MalformedError, match="next hop at offset 0 has length 4"):
        list(codec.iter_nexthops(short, strict=True))


def test_a_short_fixed_header_is_named() -> None:
    with pytest.raises(MalformedError, match="ifinfomsg needs 16 bytes, the message body has 8"):
        codec.unpack(codec.IFINFOMSG, bytes(8), "ifinfomsg")
    assert codec.unpack(codec.TCMSG, bytes(20), "tcmsg") == (0, 0, 0, 0, 0)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=96), st.booleans())
def test_arbitrary_bytes_end_or_raise_malformed(data: bytes, strict: bool) -> None:
    # Each walk must end (every step advances) with values, or raise MalformedError.
    for walk in (
        lambda: codec.parse_attrs(data, strict=strict),
        lambda: list(codec.iter_attrs(data, strict=strict)),
        lambda: list(codec.iter_nexthops(data, strict=strict)),
        lambda: list(codec.iter_messages(data)),
        lambda: codec.decode_error(data, codec.NLM_F_ACK_TLVS),
        lambda: codec.decode_error(data, codec.NLM_F_ACK_TLVS | codec.NLM_F_CAPPED),
    ):
        try:
            walk()
        except MalformedError:
            pass


# --- error replies ----------------------------------------------------------------------------------


def error_body(code: int, ext_msg: str = "", *, capped: bool = True) -> tuple[bytes, int]:
    request = hdr(24, codec.RTM_NEWLINK, codec.NLM_F_REQUEST, 9)
    body = struct.pack("=i", -code) + (request if capped else request + b"payl" * 2)
    flags = codec.NLM_F_CAPPED if capped else 0
    if ext_msg:
        body += codec.attr_str(codec.NLMSGERR_ATTR_MSG, ext_msg)
        flags |= codec.NLM_F_ACK_TLVS
    return body, flags


@pytest.mark.parametrize(
    ("reply", "want"),
    [
        (error_body(0), (0, "")),
        (error_body(errno.ENODEV), (errno.ENODEV, "")),
        (error_body(errno.EEXIST, "File exists in target"), (errno.EEXIST, "File exists in target")),
        (error_body(errno.EINVAL, "bad attr", capped=False), (errno.EINVAL, "bad attr")),
    ],
)
def test_error_replies(reply: tuple[bytes, int], want: tuple[int, str]) -> None:
    assert codec.decode_error(*reply) == want


def test_a_truncated_error_reply_is_named_and_a_done_carries_its_errno() -> None:
    with pytest.raises(MalformedError, match="no error code"):
        codec.decode_error(b"\0\0", 0)
    assert codec.done_errno(struct.pack("=i", 0)) == 0
    assert codec.done_errno(struct.pack("=i", -errno.EMSGSIZE)) == errno.EMSGSIZE
    assert codec.done_errno(b"") == 0


def test_netlink_error_text() -> None:
    assert str(codec.NetlinkError(errno.ENODEV)) == "[Errno 19] No such device"
    err = codec.NetlinkError(errno.EEXIST, "File exists in target")
    assert err.errno == errno.EEXIST and err.kernel_msg == "File exists in target"
    assert err.strerror == "File exists (kernel: File exists in target)"


# --- values ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "raw", "text"),
    [
        (socket.AF_INET, socket.inet_aton("192.0.2.5"), "192.0.2.5"),
        (socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "2001:db8::5"), "2001:db8::5"),
        (socket.AF_INET6, socket.inet_aton("192.0.2.5"), ""),  # wrong size for the family
        (socket.AF_INET, None, ""),
    ],
)
def test_ip_text(family: int, raw: bytes | None, text: str) -> None:
    assert codec.ip_text(family, raw) == text


@pytest.mark.parametrize(
    ("text", "family", "packed", "plen"),
    [
        ("192.0.2.5/24", socket.AF_INET, socket.inet_aton("192.0.2.5"), 24),
        ("192.0.2.5", socket.AF_INET, socket.inet_aton("192.0.2.5"), 32),
        ("2001:db8::/64", socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "2001:db8::"), 64),
        ("2001:db8::1", socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "2001:db8::1"), 128),
    ],
)
def test_cidr_parts(text: str, family: int, packed: bytes, plen: int) -> None:
    assert codec.cidr_parts(text) == (family, packed, plen)


@pytest.mark.parametrize("text", ["02:00:00:00:00:aa", "02-00-00-00-00-aa", "0200.0000.00aa"])
def test_mac_round_trip(text: str) -> None:
    assert codec.mac_text(codec.mac_bytes(text)) == "02:00:00:00:00:aa"


def test_absent_or_short_values_give_the_default() -> None:
    assert codec.u32(None) is None and codec.u32(b"\1\0") is None
    assert codec.u32(None, 7) == 7 and codec.u32(struct.pack("=I", 0), 7) == 0
    assert codec.u8(None) == 0 and codec.u8(b"", 3) == 3
    assert codec.cstr(None) == "" and codec.cstr(b"eth0\0junk") == "eth0"
    assert codec.mac_text(None) == "" and codec.mac_text(b"") == ""


def test_rdma_type() -> None:
    assert codec.rdma_type(codec.RDMA_NLDEV_CMD_GET) == 5121
    assert codec.rdma_type(codec.RDMA_NLDEV_CMD_SYS_GET) == (5 << 10) + 6
