"""A small rtnetlink (and RDMA netlink) client for the attach hot path.

Why not pyroute2's IPRoute here: on this machine its message classes cost 57-180 µs
to encode or decode one message (the kernel needs 20-40 µs to act on it), a sync
IPRoute costs about 1 ms to open, and pyroute2 0.9.7 knows neither
IFLA_GSO_IPV4_MAX_SIZE/IFLA_GRO_IPV4_MAX_SIZE nor RDMA netlink. The requests attach
sends are few and fixed, so they are encoded here with struct, and the replies
decoded into the few fields attach reads. pyroute2 stays in use for ethtool
(services/attach/netdev_ethtool.py) and in the benchmark's direct path.

A NlSocket belongs to the netns of the thread that created it, for its whole life.
It is not thread-safe; one attach run uses its own sockets.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from shared.attachplan import LinkState

NETLINK_ROUTE = 0
NETLINK_RDMA = 20
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_ACK_TLVS = 0x200  # in an NLMSG_ERROR/DONE header: extended ack attributes follow

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSGERR_ATTR_MSG = 1

RTM_NEWLINK = 16
RTM_DELLINK = 17
RTM_GETLINK = 18
RTM_NEWADDR = 20
RTM_NEWROUTE = 24
RTM_NEWNEIGH = 28
RTM_NEWRULE = 32
RTM_DELRULE = 33
RTM_DELTFILTER = 45
RTM_GETTFILTER = 46
RTM_NEWLINKPROP = 108
RTM_DELLINKPROP = 109

IFF_UP = 0x1

IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_LINKINFO = 18
IFLA_NET_NS_FD = 28
IFLA_EXT_MASK = 29
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

IFA_ADDRESS = 1
IFA_LOCAL = 2

RTA_DST = 1
RTA_OIF = 4
RTA_GATEWAY = 5
RTA_PREFSRC = 7
RTA_TABLE = 15
RTPROT_BOOT = 3  # iproute2's and vishvananda/netlink's default for added routes
RTN_UNICAST = 1

FRA_DST = 1
FRA_SRC = 2
FRA_PRIORITY = 6
FRA_TABLE = 15
FR_ACT_TO_TBL = 1

NDA_DST = 1
NDA_LLADDR = 2
NUD_PERMANENT = 0x80

TCA_KIND = 1
TCA_CHAIN = 11

RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_NET_NS_FD = 68

IPVLAN_MODES = {"l2": 0, "l3": 1, "l3s": 2}
MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}

_HDR = struct.Struct("=IHHII")  # nlmsghdr
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg
_FIBRULE = struct.Struct("=BBBBBBBBI")  # fib_rule_hdr
_NDMSG = struct.Struct("=BxxxiHBB")  # ndmsg
_TCMSG = struct.Struct("=BxxxiIII")  # tcmsg


def rdma_type(op: int) -> int:
    """RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)."""
    return (RDMA_NL_NLDEV << 10) + op


# --- attributes --------------------------------------------------------------------------


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def attr_u8(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=B", value))


def attr_u16(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=H", value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def attr_nested(kind: int, *children: bytes) -> bytes:
    return attr(kind | 0x8000, b"".join(children))  # NLA_F_NESTED


def parse_attrs(data: bytes | memoryview, offset: int = 0, end: int | None = None) -> dict[int, bytes]:
    """Attributes by type (first one wins), flags stripped."""
    out: dict[int, bytes] = {}
    for kind, payload in iter_attrs(data, offset, end):
        out.setdefault(kind, payload)
    return out


def iter_attrs(
    data: bytes | memoryview, offset: int = 0, end: int | None = None
) -> Iterator[tuple[int, bytes]]:
    end = len(data) if end is None else end
    while offset + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, offset)
        if length < 4 or offset + length > end:
            break
        yield kind & 0x3FFF, bytes(data[offset + 4 : offset + length])
        offset += (length + 3) & ~3


def _u32(b: bytes | None) -> int | None:
    return struct.unpack_from("=I", b)[0] if b and len(b) >= 4 else None


def _cstr(b: bytes | None) -> str:
    return b.split(b"\0", 1)[0].decode(errors="replace") if b else ""


def mac_text(b: bytes | None) -> str:
    return ":".join(f"{x:02x}" for x in b) if b else ""


def mac_bytes(text: str) -> bytes:
    """xx:xx:.., xx-xx-.. or xxxx.xxxx.xxxx (validated by the config layer)."""
    hexdigits = text.replace(":", "").replace("-", "").replace(".", "")
    return bytes.fromhex(hexdigits)


def ip_bytes(text: str) -> tuple[int, bytes]:
    """(family, packed address) of an IP address."""
    if ":" in text:
        return socket.AF_INET6, socket.inet_pton(socket.AF_INET6, text)
    return socket.AF_INET, socket.inet_pton(socket.AF_INET, text)


def cidr_parts(text: str) -> tuple[int, bytes, int]:
    """(family, packed address, prefix length) of ``ip/len``."""
    ip, _, bits = text.partition("/")
    family, packed = ip_bytes(ip)
    return family, packed, int(bits) if bits else len(packed) * 8


# --- messages ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    type: int
    flags: int
    seq: int
    body: bytes


class NetlinkError(OSError):
    """The kernel refused a request: errno plus its extended-ack text when given."""

    def __init__(self, code: int, kernel_msg: str = "") -> None:
        text = os.strerror(code)
        if kernel_msg:
            text += f" (kernel: {kernel_msg})"
        super().__init__(code, text)
        self.kernel_msg = kernel_msg


def decode_link(body: bytes) -> LinkState:
    """An RTM_NEWLINK reply body as a LinkState."""
    _family, _type, index, flags, _change = _IFINFO.unpack_from(body)
    a = parse_attrs(body, _IFINFO.size)
    kind = ""
    if IFLA_LINKINFO in a:
        kind = _cstr(parse_attrs(a[IFLA_LINKINFO]).get(IFLA_INFO_KIND))
    altnames: tuple[str, ...] = ()
    if IFLA_PROP_LIST in a:
        altnames = tuple(_cstr(v) for k, v in iter_attrs(a[IFLA_PROP_LIST]) if k == IFLA_ALT_IFNAME)
    return LinkState(
        name=_cstr(a.get(IFLA_IFNAME)),
        index=index,
        mac=mac_text(a.get(IFLA_ADDRESS)),
        mtu=_u32(a.get(IFLA_MTU)) or 0,
        up=bool(flags & IFF_UP),
        kind=kind,
        altnames=altnames,
        perm_mac=mac_text(a.get(IFLA_PERM_ADDRESS)),
        master=_u32(a.get(IFLA_MASTER)) or 0,
        link=_u32(a.get(IFLA_LINK)) or 0,
        gso_max_size=_u32(a.get(IFLA_GSO_MAX_SIZE)),
        gro_max_size=_u32(a.get(IFLA_GRO_MAX_SIZE)),
        gso_ipv4_max_size=_u32(a.get(IFLA_GSO_IPV4_MAX_SIZE)),
        gro_ipv4_max_size=_u32(a.get(IFLA_GRO_IPV4_MAX_SIZE)),
    )


def decode_error(body: bytes, flags: int) -> tuple[int, str]:
    """(errno, extended-ack message) of an NLMSG_ERROR body; errno 0 is an ack."""
    (code,) = struct.unpack_from("=i", body)
    msg = ""
    if code and flags & NLM_F_ACK_TLVS:
        # With NETLINK_CAP_ACK the request is not echoed: header only.
        (orig_len,) = struct.unpack_from("=I", body, 4)
        offset = 4 + (_HDR.size if flags & 0x100 else orig_len)  # NLM_F_CAPPED = 0x100
        msg = _cstr(parse_attrs(body, offset).get(NLMSGERR_ATTR_MSG))
    return -code, msg


class NlSocket:
    """A netlink socket bound in the netns of the creating thread."""

    def __init__(self, proto: int = NETLINK_ROUTE) -> None:
        self.proto = proto
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, proto)
        try:
            self.sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
            self.sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)
            self.sock.bind((0, 0))
        except OSError:
            self.sock.close()
            raise
        self._seq = 0
        # 64 KiB holds any reply attach asks for: dump chunks are at most 32 KiB and
        # link replies carry no VF list (IFLA_EXT_MASK 0).
        self._buf = bytearray(1 << 16)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> NlSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def request(self, mtype: int, flags: int, body: bytes) -> list[Message]:
        """Send one request with NLM_F_ACK and return the replies before the ack (a
        dump's messages, or a GET's answer). Raises NetlinkError."""
        self._seq += 1
        seq = self._seq
        self.sock.send(
            _HDR.pack(_HDR.size + len(body), mtype, flags | NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body
        )
        out: list[Message] = []
        while True:
            n = self.sock.recv_into(self._buf, 0, socket.MSG_TRUNC)
            if n > len(self._buf):
                raise NetlinkError(errno.EMSGSIZE, f"reply of {n} bytes does not fit")
            view = memoryview(self._buf)[:n]
            offset = 0
            while offset + _HDR.size <= n:
                length, rtype, rflags, rseq, _pid = _HDR.unpack_from(view, offset)
                if length < _HDR.size:
                    break
                body_bytes = bytes(view[offset + _HDR.size : offset + length])
                offset += (length + 3) & ~3
                if rseq != seq:
                    continue  # a late reply to an earlier request on this socket
                if rtype == NLMSG_ERROR:
                    code, msg = decode_error(body_bytes, rflags)
                    if code:
                        raise NetlinkError(code, msg)
                    return out
                if rtype == NLMSG_DONE:
                    # A dump ends with DONE; with NLM_F_ACK the kernel sends no ack after it.
                    if len(body_bytes) >= 4:
                        (code,) = struct.unpack_from("=i", body_bytes)
                        if code < 0:
                            raise NetlinkError(-code, "")
                    return out
                out.append(Message(rtype, rflags, rseq, body_bytes))

    # --- rtnetlink requests used by attach ---

    def get_link(self, name: str = "", index: int = 0, altname: str = "") -> LinkState | None:
        """One link by index, name or altname; None if there is no such link."""
        body = _IFINFO.pack(0, 0, index, 0, 0)
        if not index:
            body += attr_str(IFLA_ALT_IFNAME, altname) if altname else attr_str(IFLA_IFNAME, name)
        body += attr_u32(IFLA_EXT_MASK, 0)  # no VF info: keeps replies small
        try:
            replies = self.request(RTM_GETLINK, 0, body)
        except NetlinkError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT):
                return None
            raise
        for m in replies:
            if m.type == RTM_NEWLINK:
                return decode_link(m.body)
        return None

    def list_links(self) -> list[LinkState]:
        body = _IFINFO.pack(0, 0, 0, 0, 0) + attr_u32(IFLA_EXT_MASK, 0)
        return [
            decode_link(m.body) for m in self.request(RTM_GETLINK, NLM_F_DUMP, body) if m.type == RTM_NEWLINK
        ]

    def set_link(
        self,
        index: int = 0,
        name: str = "",
        *,
        new_name: str = "",
        netns_fd: int | None = None,
        up: bool | None = None,
        mtu: int | None = None,
        mac: str | None = None,
        master: int | None = None,
        gso_max_size: int | None = None,
        gro_max_size: int | None = None,
        gso_ipv4_max_size: int | None = None,
        gro_ipv4_max_size: int | None = None,
    ) -> None:
        """RTM_NEWLINK on an existing link, selected by index (or by name when the
        index is 0). With netns_fd the kernel moves the link first, then applies MAC,
        MTU and the new name in the target netns."""
        flags = IFF_UP if up else 0
        change = IFF_UP if up is not None else 0
        body = _IFINFO.pack(0, 0, index, flags, change)
        if not index:
            body += attr_str(IFLA_IFNAME, name)
        elif new_name:
            body += attr_str(IFLA_IFNAME, new_name)
        if mtu is not None:
            body += attr_u32(IFLA_MTU, mtu)
        if mac is not None:
            body += attr(IFLA_ADDRESS, mac_bytes(mac))
        if master is not None:
            body += attr_u32(IFLA_MASTER, master)
        for kind, value in (
            (IFLA_GSO_MAX_SIZE, gso_max_size),
            (IFLA_GRO_MAX_SIZE, gro_max_size),
            (IFLA_GSO_IPV4_MAX_SIZE, gso_ipv4_max_size),
            (IFLA_GRO_IPV4_MAX_SIZE, gro_ipv4_max_size),
        ):
            if value is not None:
                body += attr_u32(kind, value)
        if netns_fd is not None:
            body += attr_u32(IFLA_NET_NS_FD, netns_fd)
        self.request(RTM_NEWLINK, 0, body)

    def altname(self, index: int, altname: str, *, add: bool) -> None:
        body = _IFINFO.pack(0, 0, index, 0, 0) + attr_nested(
            IFLA_PROP_LIST, attr_str(IFLA_ALT_IFNAME, altname)
        )
        self.request(
            RTM_NEWLINKPROP if add else RTM_DELLINKPROP, NLM_F_EXCL | NLM_F_CREATE if add else 0, body
        )

    def create_link(
        self,
        name: str,
        kind: str,
        *,
        info_data: bytes = b"",
        parent: int | None = None,
        netns_fd: int | None = None,
        mtu: int | None = None,
    ) -> None:
        """Create a link (NLM_F_EXCL). With netns_fd the kernel creates it directly in
        that netns, its parent (IFLA_LINK) still resolved in this socket's netns."""
        body = _IFINFO.pack(0, 0, 0, 0, 0) + attr_str(IFLA_IFNAME, name)
        if parent is not None:
            body += attr_u32(IFLA_LINK, parent)
        if mtu is not None:
            body += attr_u32(IFLA_MTU, mtu)
        if netns_fd is not None:
            body += attr_u32(IFLA_NET_NS_FD, netns_fd)
        info = attr_str(IFLA_INFO_KIND, kind)
        if info_data:
            info += attr(IFLA_INFO_DATA | 0x8000, info_data)
        body += attr(IFLA_LINKINFO | 0x8000, info)
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)

    def delete_link(self, index: int) -> None:
        self.request(RTM_DELLINK, 0, _IFINFO.pack(0, 0, index, 0, 0))

    def add_address(self, index: int, cidr: str) -> None:
        family, packed, plen = cidr_parts(cidr)
        body = _IFADDR.pack(family, plen, 0, 0, index) + attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed)
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body)

    def add_route(
        self,
        oif: int,
        destination: str,
        gateway: str = "",
        source: str = "",
        scope: int = 0,
        table: int = 254,
    ) -> None:
        family, dst, plen = cidr_parts(destination)
        body = _RTMSG.pack(
            family, plen, 0, 0, table if table < 256 else 0, RTPROT_BOOT, scope, RTN_UNICAST, 0
        )
        body += attr(RTA_DST, dst) + attr_u32(RTA_OIF, oif) + attr_u32(RTA_TABLE, table)
        if gateway:
            body += attr(RTA_GATEWAY, ip_bytes(gateway)[1])
        if source:
            body += attr(RTA_PREFSRC, ip_bytes(source)[1])
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body)

    def rule(self, priority: int, source: str, destination: str, table: int, *, add: bool) -> None:
        family: int = socket.AF_INET
        attrs = attr_u32(FRA_PRIORITY, priority) + attr_u32(FRA_TABLE, table)
        src_len = dst_len = 0
        if source:
            family, packed, src_len = cidr_parts(source)
            attrs += attr(FRA_SRC, packed)
        if destination:
            family, packed, dst_len = cidr_parts(destination)
            attrs += attr(FRA_DST, packed)
        hdr = _FIBRULE.pack(family, dst_len, src_len, 0, table if table < 256 else 0, 0, 0, FR_ACT_TO_TBL, 0)
        self.request(
            RTM_NEWRULE if add else RTM_DELRULE, NLM_F_CREATE | NLM_F_EXCL if add else 0, hdr + attrs
        )

    def replace_neighbor(self, index: int, destination: str, mac: str) -> None:
        family, packed = ip_bytes(destination)
        body = _NDMSG.pack(family, index, NUD_PERMANENT, 0, 0) + attr(NDA_DST, packed)
        body += attr(NDA_LLADDR, mac_bytes(mac))
        self.request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body)

    def tc_filters(self, index: int, parent: int) -> list[tuple[int, int, int, int, str]]:
        """(handle, parent, info, chain, kind) of each tc filter under ``parent``."""
        out = []
        body = _TCMSG.pack(0, index, 0, parent, 0)
        for m in self.request(RTM_GETTFILTER, NLM_F_DUMP, body):
            _f, _i, handle, mparent, info = _TCMSG.unpack_from(m.body)
            a = parse_attrs(m.body, _TCMSG.size)
            out.append((handle, mparent, info, _u32(a.get(TCA_CHAIN)) or 0, _cstr(a.get(TCA_KIND))))
        return out

    def delete_tc_filter(
        self, index: int, handle: int, parent: int, info: int, chain: int, kind: str
    ) -> None:
        body = _TCMSG.pack(0, index, handle, parent, info) + attr_str(TCA_KIND, kind)
        if chain:
            body += attr_u32(TCA_CHAIN, chain)
        self.request(RTM_DELTFILTER, 0, body)

    # --- RDMA netlink (socket made with NETLINK_RDMA) ---

    def rdma_devices(self) -> dict[str, int]:
        """RDMA device name -> index, in this socket's netns."""
        out: dict[str, int] = {}
        for m in self.request(rdma_type(RDMA_NLDEV_CMD_GET), NLM_F_DUMP, b""):
            a = parse_attrs(m.body)
            index = _u32(a.get(RDMA_NLDEV_ATTR_DEV_INDEX))
            if index is not None:
                out[_cstr(a.get(RDMA_NLDEV_ATTR_DEV_NAME))] = index
        return out

    def rdma_set_netns(self, index: int, netns_fd: int) -> None:
        body = attr_u32(RDMA_NLDEV_ATTR_DEV_INDEX, index) + attr_u32(RDMA_NLDEV_NET_NS_FD, netns_fd)
        self.request(rdma_type(RDMA_NLDEV_CMD_SET), 0, body)
