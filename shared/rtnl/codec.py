"""The rtnetlink and RDMA netlink wire format: constants, fixed headers, attribute
TLVs (4-byte aligned, nested), message framing and error replies. Pure: bytes in,
bytes or values out, no sockets (shared/rtnl/sock.py has the socket).

Why not pyroute2's message classes: they cost 57-180 µs to encode or decode one
message on this machine (the kernel needs 20-40 µs to act on it) and 0.23-0.40 s
to decode a 1,000-link dump, against ~15 ms here, and pyroute2 0.9.7 knows neither
IFLA_GSO_IPV4_MAX_SIZE/IFLA_GRO_IPV4_MAX_SIZE nor RDMA netlink. pyroute2 stays where
speed does not matter and it does more than a codec: ethtool's ioctl
(services/attach/netdev_ethtool.py), the cloud providers' few lookups
(services/inventory/cloud/host.py) and prepare's DHCP client.

Decoding never loops: every walk advances by at least one header. Attribute walks
are lenient by default, as the kernel's nla_for_each_attr: they stop at the first
malformed attribute and return what came before, so one odd attribute cannot fail a
scan of a thousand links; ``strict=True`` raises MalformedError naming the offset.
Message framing is always strict: a datagram that cannot be split into messages
raises MalformedError rather than losing or misreading the rest.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator
from typing import overload

Buffer = bytes | bytearray | memoryview

# --- netlink ---------------------------------------------------------------------------------

NETLINK_ROUTE = 0
NETLINK_RDMA = 20
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NETLINK_GET_STRICT_CHK = 12

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_DUMP = 0x300
NLM_F_CREATE = 0x400
# In an NLMSG_ERROR header: the request was not echoed (CAPPED), extended-ack attributes follow (ACK_TLVS).
NLM_F_CAPPED = 0x100
NLM_F_ACK_TLVS = 0x200

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSGERR_ATTR_MSG = 1

NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER
NLA_MAX_PAYLOAD = 0xFFFF - 4

# --- rtnetlink -------------------------------------------------------------------------------

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWADDR = 20
RTM_GETADDR = 22
RTM_NEWROUTE = 24
RTM_GETROUTE = 26
RTM_NEWNEIGH = 28
RTM_GETNEIGH = 30
RTM_NEWRULE = 32
RTM_DELRULE = 33
RTM_GETRULE = 34
RTM_GETQDISC = 38
RTM_DELTFILTER = 45
RTM_GETTFILTER = 46
RTM_NEWLINKPROP = 108
RTM_DELLINKPROP = 109

RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100

IFF_UP = 0x1
IFF_LOOPBACK = 0x8

IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_OPERSTATE = 16
IFLA_LINKINFO = 18
IFLA_IFALIAS = 20
IFLA_NET_NS_FD = 28
IFLA_EXT_MASK = 29
IFLA_LINK_NETNSID = 37
IFLA_GSO_MAX_SIZE = 41
IFLA_PROP_LIST = 52
IFLA_ALT_IFNAME = 53
IFLA_PERM_ADDRESS = 54
IFLA_GRO_MAX_SIZE = 58
IFLA_GSO_IPV4_MAX_SIZE = 63
IFLA_GRO_IPV4_MAX_SIZE = 64
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_VRF_TABLE = 1
IFLA_IPVLAN_MODE = 1
IFLA_MACVLAN_MODE = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3

IPVLAN_MODES = {"l2": 0, "l3": 1, "l3s": 2}
MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}

IFA_ADDRESS = 1
IFA_LOCAL = 2

RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_PRIORITY = 6
RTA_PREFSRC = 7
RTA_MULTIPATH = 9
RTA_TABLE = 15
RTM_F_CLONED = 0x200
RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255
RTPROT_KERNEL = 2
RTPROT_BOOT = 3  # iproute2's and vishvananda/netlink's default for added routes
RTN_UNICAST = 1

FRA_DST = 1
FRA_SRC = 2
FRA_PRIORITY = 6
FRA_TABLE = 15
FR_ACT_TO_TBL = 1

NDA_DST = 1
NDA_LLADDR = 2
NDA_IFINDEX = 8
NUD_PERMANENT = 0x80

TCA_KIND = 1
TCA_OPTIONS = 2
TCA_CHAIN = 11
TCA_BPF_NAME = 7
TC_H_MIN_INGRESS = 0xFFFFFFF2  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
TC_H_MIN_EGRESS = 0xFFFFFFF3  # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)

# --- RDMA netlink ----------------------------------------------------------------------------

RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68


def rdma_type(op: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)."""
    return (RDMA_NL_NLDEV << 10) + op


# --- fixed headers -----------------------------------------------------------------------------

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
NLATTR = struct.Struct("=HH")  # len, type
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, res1, res2, action, flags
NDMSG = struct.Struct("=BxxxiHBB")  # family, ifindex, state, flags, type
TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
RTNEXTHOP = struct.Struct("=HBBi")  # len, flags, hops, ifindex
_U16 = struct.Struct("=H")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")


class NetlinkError(OSError):
    """The kernel refused a request: errno plus its extended-ack text when given."""

    def __init__(self, code: int, kernel_msg: str = "") -> None:
        text = os.strerror(code)
        if kernel_msg:
            text += f" (kernel: {kernel_msg})"
        super().__init__(code, text)
        self.kernel_msg = kernel_msg


class MalformedError(OSError):
    """Netlink bytes that cannot be decoded; the message says what and at which offset."""

    def __init__(self, what: str) -> None:
        super().__init__(errno.EBADMSG, f"malformed netlink data: {what}")


def align(length: int) -> int:
    """NLMSG_ALIGN / NLA_ALIGN: the next multiple of 4."""
    return (length + 3) & ~3


# --- encoding ----------------------------------------------------------------------------------


def attr(kind: int, payload: Buffer) -> bytes:
    """One attribute, padded to 4 bytes (the length field excludes the padding)."""
    if len(payload) > NLA_MAX_PAYLOAD:
        raise ValueError(
            f"netlink attribute {kind & NLA_TYPE_MASK}: {len(payload)} bytes exceed {NLA_MAX_PAYLOAD}"
        )
    length = 4 + len(payload)
    return NLATTR.pack(length, kind) + bytes(payload) + b"\0" * (-length % 4)


def attr_u8(kind: int, value: int) -> bytes:
    return attr(kind, bytes((value,)))


def attr_u16(kind: int, value: int) -> bytes:
    return attr(kind, _U16.pack(value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, _U32.pack(value))


def attr_str(kind: int, value: str) -> bytes:
    """A NUL-terminated string attribute (NLA_NUL_STRING / NLA_STRING both accept it)."""
    return attr(kind, value.encode() + b"\0")


def attr_nested(kind: int, *children: bytes) -> bytes:
    """An attribute holding ``children`` (already encoded), flagged NLA_F_NESTED."""
    return attr(kind | NLA_F_NESTED, b"".join(children))


def message(mtype: int, flags: int, seq: int, payload: Buffer, pid: int = 0) -> bytes:
    """One netlink message: nlmsghdr + payload."""
    return NLMSGHDR.pack(NLMSGHDR.size + len(payload), mtype, flags, seq, pid) + bytes(payload)


# --- decoding ----------------------------------------------------------------------------------


def _stop(strict: bool, what: str) -> None:
    if strict:
        raise MalformedError(what)


def iter_attrs(
    data: Buffer, offset: int = 0, end: int | None = None, *, strict: bool = False
) -> Iterator[tuple[int, memoryview]]:
    """(type without flags, payload) of each attribute in ``data[offset:end]``, in order."""
    mv = memoryview(data)
    end = len(mv) if end is None else end
    while offset + 4 <= end:
        length, kind = NLATTR.unpack_from(mv, offset)
        if length < 4 or offset + length > end:
            _stop(strict, _bad_attr(offset, length, end))
            return
        yield kind & NLA_TYPE_MASK, mv[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    if offset < end:
        _stop(strict, f"{end - offset} stray bytes after the attributes at offset {offset}")


def parse_attrs(
    data: Buffer, offset: int = 0, end: int | None = None, *, strict: bool = False
) -> dict[int, memoryview]:
    """Attributes in ``data[offset:end]`` by type (the first of each type wins), flags stripped.

    The inventory decodes every attribute of a 1,000-link dump through this: it is the
    loop of iter_attrs written out, without a generator."""
    mv = memoryview(data)
    end = len(mv) if end is None else end
    out: dict[int, memoryview] = {}
    while offset + 4 <= end:
        length, kind = NLATTR.unpack_from(mv, offset)
        if length < 4 or offset + length > end:
            _stop(strict, _bad_attr(offset, length, end))
            return out
        kind &= NLA_TYPE_MASK
        if kind not in out:
            out[kind] = mv[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    if offset < end:
        _stop(strict, f"{end - offset} stray bytes after the attributes at offset {offset}")
    return out


def _bad_attr(offset: int, length: int, end: int) -> str:
    if length < 4:
        return f"attribute at offset {offset} has length {length}, shorter than its 4-byte header"
    return f"attribute at offset {offset} has length {length}, past the end at {end}"


def iter_nexthops(data: Buffer, *, strict: bool = False) -> Iterator[tuple[int, int, int, memoryview]]:
    """(flags, hops, ifindex, attributes) of each rtnexthop in an RTA_MULTIPATH payload."""
    mv = memoryview(data)
    offset, end = 0, len(mv)
    while offset + RTNEXTHOP.size <= end:
        length, flags, hops, ifindex = RTNEXTHOP.unpack_from(mv, offset)
        if length < RTNEXTHOP.size or offset + length > end:
            _stop(strict, f"next hop at offset {offset} has length {length} (header 8, end {end})")
            return
        yield flags, hops, ifindex, mv[offset + RTNEXTHOP.size : offset + length]
        offset += (length + 3) & ~3
    if offset < end:
        _stop(strict, f"{end - offset} stray bytes after the next hops at offset {offset}")


def iter_messages(data: Buffer) -> Iterator[tuple[int, int, int, memoryview]]:
    """(type, flags, seq, body) of each message of one datagram. MalformedError when
    a header is short or claims more bytes than the datagram holds."""
    mv = memoryview(data)
    offset, end = 0, len(mv)
    while offset < end:
        if offset + NLMSGHDR.size > end:
            raise MalformedError(f"{end - offset} stray bytes after the messages at offset {offset}")
        length, mtype, flags, seq, _pid = NLMSGHDR.unpack_from(mv, offset)
        if length < NLMSGHDR.size or offset + length > end:
            raise MalformedError(
                f"message at offset {offset} has length {length} (header {NLMSGHDR.size}, datagram {end})"
            )
        yield mtype, flags, seq, mv[offset + NLMSGHDR.size : offset + length]
        offset += (length + 3) & ~3


def unpack(header: struct.Struct, body: Buffer, what: str) -> tuple[int, ...]:
    """The fixed header ``what`` (e.g. "ifinfomsg") at the start of ``body``."""
    if len(body) < header.size:
        raise MalformedError(f"{what} needs {header.size} bytes, the message body has {len(body)}")
    return header.unpack_from(body)


def decode_error(body: Buffer, flags: int) -> tuple[int, str]:
    """(errno, extended-ack message) of an NLMSG_ERROR body; errno 0 is an ack."""
    if len(body) < 4:
        raise MalformedError(f"error message body of {len(body)} bytes has no error code")
    (code,) = _I32.unpack_from(body)
    msg = ""
    if code and flags & NLM_F_ACK_TLVS and len(body) >= 4 + NLMSGHDR.size:
        # CAPPED (NETLINK_CAP_ACK): only the request's header is echoed, not its payload.
        (orig_len,) = _U32.unpack_from(body, 4)
        offset = 4 + (NLMSGHDR.size if flags & NLM_F_CAPPED else orig_len)
        if offset <= len(body):
            msg = cstr(parse_attrs(body, offset).get(NLMSGERR_ATTR_MSG))
    return -code, msg


def done_errno(body: Buffer) -> int:
    """The errno an NLMSG_DONE carries when the dump failed part way (0: it did not)."""
    if len(body) < 4:
        return 0
    (code,) = _I32.unpack_from(body)
    return -code if code < 0 else 0


# --- values ------------------------------------------------------------------------------------


@overload
def u32(v: Buffer | None) -> int | None: ...
@overload
def u32(v: Buffer | None, default: int) -> int: ...
def u32(v: Buffer | None, default: int | None = None) -> int | None:
    """A u32 attribute's value; ``default`` when absent or short."""
    if v is None or len(v) < 4:
        return default
    return int(_U32.unpack_from(v)[0])


def u8(v: Buffer | None, default: int = 0) -> int:
    return v[0] if v is not None and len(v) else default


def cstr(v: Buffer | None) -> str:
    """A string attribute up to its NUL; "" when absent."""
    if v is None:
        return ""
    return bytes(v).split(b"\0", 1)[0].decode(errors="replace")


def ip_text(family: int, v: Buffer | None) -> str:
    """An address attribute as text; "" when absent or not of the family's size."""
    if v is None:
        return ""
    raw = bytes(v)
    if family == socket.AF_INET and len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    if family == socket.AF_INET6 and len(raw) == 16:
        return str(ipaddress.IPv6Address(raw))
    return ""


def mac_text(v: Buffer | None) -> str:
    """xx:xx:..; "" when absent or empty."""
    return ":".join(f"{x:02x}" for x in bytes(v)) if v else ""


def mac_bytes(text: str) -> bytes:
    """xx:xx:.., xx-xx-.. or xxxx.xxxx.xxxx (validated by the config layer)."""
    return bytes.fromhex(text.replace(":", "").replace("-", "").replace(".", ""))


def ip_bytes(text: str) -> tuple[int, bytes]:
    """(family, packed address) of an IP address."""
    if ":" in text:
        return socket.AF_INET6, socket.inet_pton(socket.AF_INET6, text)
    return socket.AF_INET, socket.inet_pton(socket.AF_INET, text)


def cidr_parts(text: str) -> tuple[int, bytes, int]:
    """(family, packed address, prefix length) of ``ip/len``; a bare address is a host prefix."""
    ip, _, bits = text.partition("/")
    family, packed = ip_bytes(ip)
    return family, packed, int(bits) if bits else len(packed) * 8
