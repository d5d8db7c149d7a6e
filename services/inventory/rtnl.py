"""Blocking rtnetlink dumps decoded straight into small frozen records.

Only the attributes the inventory reads are decoded. pyroute2 decodes every
attribute of every message into objects, which measured 0.23-0.40 s for a
1,000-link dump on this machine against ~15 ms here; the scan runs on every link
event, so the cheap path matters (tests/bench/inventory.py shows both).

Every dump retries when the kernel flags it NLM_F_DUMP_INTR (the table changed
while it was being dumped), as dranet's internal/nlwrap does: up to five
attempts, then the last, possibly inconsistent, result is used.

Call these from a worker thread (``asyncio.to_thread``); a ``Netlink`` object is
not shared between threads.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)

NETLINK_ROUTE = 0
NETLINK_RDMA = 20
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3

RTM_NEWLINK = 16
RTM_GETLINK = 18
RTM_GETADDR = 22
RTM_GETROUTE = 26
RTM_GETNEIGH = 30
RTM_GETRULE = 34
RTM_GETQDISC = 38
RTM_GETTFILTER = 46

RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100

IFF_LOOPBACK = 0x8
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_MASTER = 10
IFLA_OPERSTATE = 16
IFLA_LINKINFO = 18
IFLA_IFALIAS = 20
IFLA_EXT_MASK = 29
IFLA_LINK_NETNSID = 37
IFLA_INFO_KIND = 1
RTEXT_FILTER_SKIP_STATS = 1 << 3

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

FRA_DST = 1
FRA_SRC = 2
FRA_PRIORITY = 6
FRA_TABLE = 15

NDA_DST = 1
NDA_LLADDR = 2
NDA_IFINDEX = 8
NUD_PERMANENT = 0x80

TCA_KIND = 1
TCA_OPTIONS = 2
TCA_BPF_NAME = 7
TC_H_MIN_INGRESS = 0xFFFFFFF2
TC_H_MIN_EGRESS = 0xFFFFFFF3

MAX_DUMP_ATTEMPTS = 5

_NLMSGHDR = struct.Struct("=IHHII")
_NLATTR = struct.Struct("=HH")
_IFINFOMSG = struct.Struct("=BxHiII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_FIBRULEHDR = struct.Struct("=BBBBBBBBI")
_NDMSG = struct.Struct("=BxxxiHBB")
_TCMSG = struct.Struct("=BxxxiIII")
_U32 = struct.Struct("=I")

# vishvananda/netlink's IfInfomsg.EncapType names for ifi_type (ARPHRD_*), which
# dranet publishes as dra.net/encapsulation.
_ENCAP_NAMES: dict[int, str] = {
    0: "generic",
    1: "ether",
    2: "eether",
    3: "ax25",
    4: "pronet",
    5: "chaos",
    6: "ieee802",
    7: "arcnet",
    8: "atalk",
    15: "dlci",
    19: "atm",
    23: "metricom",
    24: "ieee1394",
    32: "infiniband",
    256: "slip",
    257: "cslip",
    258: "slip6",
    259: "cslip6",
    260: "rsrvd",
    264: "adapt",
    270: "rose",
    271: "x25",
    272: "hwx25",
    512: "ppp",
    513: "hdlc",
    516: "lapb",
    517: "ddcmp",
    518: "rawhdlc",
    768: "ipip",
    769: "tunnel6",
    770: "frad",
    771: "skip",
    772: "loopback",
    773: "ltalk",
    774: "fddi",
    775: "bif",
    776: "sit",
    777: "ip/ddp",
    778: "gre",
    779: "pimreg",
    780: "hippi",
    781: "ash",
    782: "econet",
    783: "irda",
    784: "fcpp",
    785: "fcal",
    786: "fcpl",
    787: "fcfb0",
    **{787 + i: f"fcfb{i}" for i in range(1, 13)},
    800: "tr",
    801: "ieee802.11",
    802: "ieee802.11/prism",
    803: "ieee802.11/radiotap",
    804: "ieee802.15.4",
    65534: "none",
    65535: "void",
}

# RFC 2863 IF_OPER_* as vishvananda/netlink's LinkOperState.String() spells them.
_OPER_STATES = {
    1: "not-present",
    2: "down",
    3: "lower-layer-down",
    4: "testing",
    5: "dormant",
    6: "up",
}


def encap_name(ifi_type: int) -> str:
    """dra.net/encapsulation for a link's ARPHRD type."""
    return _ENCAP_NAMES.get(ifi_type, f"unknown{ifi_type}")


def oper_state_name(state: int) -> str:
    """dra.net/state for IFLA_OPERSTATE."""
    return _OPER_STATES.get(state, "unknown")


def link_type_name(kind: str) -> str:
    """dra.net/type for an IFLA_INFO_KIND: dranet's link.Type() is the kind, except
    "tun" (reported "tuntap") and no kind at all (a plain "device")."""
    if not kind:
        return "device"
    if kind == "tun":
        return "tuntap"
    return kind


def format_mac(raw: bytes) -> str:
    """Go's net.HardwareAddr.String(); an all-zero address is reported empty."""
    if not any(raw):
        return ""
    return ":".join(f"{b:02x}" for b in raw)


class DumpInterruptedError(OSError):
    """The kernel set NLM_F_DUMP_INTR: the dump may be inconsistent."""


class NetlinkError(OSError):
    """The kernel answered a request with an error."""


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str  # IFLA_INFO_KIND, "" when absent
    ifi_type: int
    flags: int
    mtu: int
    mac: str
    alias: str
    operstate: int
    master: int
    link: int  # IFLA_LINK, 0 when absent or in another netns

    @property
    def type(self) -> str:
        return link_type_name(self.kind)

    @property
    def encapsulation(self) -> str:
        return encap_name(self.ifi_type)

    @property
    def state(self) -> str:
        return oper_state_name(self.operstate)

    @property
    def is_loopback(self) -> bool:
        return bool(self.flags & IFF_LOOPBACK)


@dataclass(frozen=True)
class Addr:
    index: int
    family: int
    prefixlen: int
    scope: int
    address: str  # IFA_LOCAL when present (point-to-point), else IFA_ADDRESS

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefixlen}"


@dataclass(frozen=True)
class Route:
    family: int
    dst: str  # CIDR; a default route is 0.0.0.0/0 or ::/0
    gateway: str
    prefsrc: str
    scope: int
    table: int
    protocol: int
    oif: int
    dst_len: int
    priority: int = 0
    oifs: tuple[int, ...] = ()  # next-hop interfaces of a multipath route


@dataclass(frozen=True)
class Rule:
    family: int
    priority: int
    src: str
    dst: str
    table: int


@dataclass(frozen=True)
class Neighbor:
    index: int
    state: int
    dst: str
    lladdr: str


@dataclass(frozen=True)
class Qdisc:
    index: int
    kind: str
    handle: int
    parent: int


@dataclass(frozen=True)
class TcFilter:
    index: int
    parent: int
    kind: str
    bpf_name: str


def parse_attrs(buf: bytes | memoryview, offset: int, end: int) -> dict[int, memoryview]:
    """Netlink attributes in ``buf[offset:end]`` by type (the first of each type)."""
    mv = memoryview(buf)
    out: dict[int, memoryview] = {}
    while offset + 4 <= end:
        length, kind = _NLATTR.unpack_from(mv, offset)
        if length < 4 or offset + length > end:
            break
        kind &= 0x3FFF  # drop NLA_F_NESTED / NLA_F_NET_BYTEORDER
        if kind not in out:
            out[kind] = mv[offset + 4 : offset + length]
        offset += (length + 3) & ~3
    return out


def _cstr(v: memoryview | None) -> str:
    if v is None:
        return ""
    return bytes(v).split(b"\0", 1)[0].decode(errors="replace")


def _u32(v: memoryview | None, default: int = 0) -> int:
    if v is None or len(v) < 4:
        return default
    return int(_U32.unpack_from(v)[0])


def _ip(family: int, v: memoryview | None) -> str:
    if v is None:
        return ""
    raw = bytes(v)
    if family == socket.AF_INET and len(raw) == 4:
        return str(ipaddress.IPv4Address(raw))
    if family == socket.AF_INET6 and len(raw) == 16:
        return str(ipaddress.IPv6Address(raw))
    return ""


def _nlattr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * ((-length) % 4)


T = TypeVar("T")


class Netlink:
    """One netlink socket in the calling thread's network namespace."""

    def __init__(self, protocol: int = NETLINK_ROUTE, groups: int = 0) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            if protocol == NETLINK_ROUTE:
                # Lets the kernel honour the filters we put in dump requests; the
                # decoders filter again, so an older kernel only costs bandwidth.
                try:
                    self.sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
                except OSError:
                    pass
            self.sock.bind((0, groups))
        except BaseException:
            self.sock.close()
            raise
        self.seq = int.from_bytes(os.urandom(2), "little")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def _send(self, msg_type: int, flags: int, payload: bytes) -> int:
        self.seq += 1
        hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, self.seq, 0)
        self.sock.send(hdr + payload)
        return self.seq

    def messages(self, msg_type: int, flags: int, payload: bytes) -> Iterator[tuple[int, int, memoryview]]:
        """Send one request and yield (type, flags, body) of each answer until DONE
        (or the single answer / ACK of a non-dump request)."""
        seq = self._send(msg_type, flags, payload)
        dump = (flags & NLM_F_DUMP) == NLM_F_DUMP
        while True:
            data = self.sock.recv(1 << 20)
            mv = memoryview(data)
            off = 0
            while off + _NLMSGHDR.size <= len(data):
                length, mtype, mflags, mseq, _pid = _NLMSGHDR.unpack_from(mv, off)
                if length < _NLMSGHDR.size:
                    return
                body = mv[off + _NLMSGHDR.size : off + length]
                off += (length + 3) & ~3
                if mseq != seq:
                    continue
                if mtype == NLMSG_DONE:
                    if mflags & NLM_F_DUMP_INTR:
                        yield (mtype, mflags, body)
                    return
                if mtype == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", body)[0]
                    if code:
                        raise NetlinkError(code, f"netlink: {os.strerror(code)}")
                    return  # ACK
                yield (mtype, mflags, body)
                if not dump and not (mflags & NLM_F_MULTI):
                    return

    def dump(self, msg_type: int, payload: bytes, decode: Callable[[int, memoryview], T | None]) -> list[T]:
        """One dump, decoded; retried while the kernel reports it interrupted."""
        last: list[T] = []
        for attempt in range(MAX_DUMP_ATTEMPTS):
            out: list[T] = []
            interrupted = False
            for mtype, mflags, body in self.messages(msg_type, NLM_F_REQUEST | NLM_F_DUMP, payload):
                if mflags & NLM_F_DUMP_INTR:
                    interrupted = True
                if mtype == NLMSG_DONE:
                    continue
                item = decode(mtype, body)
                if item is not None:
                    out.append(item)
            if not interrupted:
                return out
            last = out
            log.debug("netlink dump interrupted, retrying", extra={"attempt": attempt + 1, "type": msg_type})
        log.info("netlink dump still interrupted after %d attempts; using its result", MAX_DUMP_ATTEMPTS)
        return last

    # --- links -----------------------------------------------------------------------------------

    def links(self) -> list[Link]:
        payload = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _nlattr(
            IFLA_EXT_MASK, _U32.pack(RTEXT_FILTER_SKIP_STATS)
        )
        return self.dump(RTM_GETLINK, payload, _decode_link)

    def link(self, index: int = 0, name: str = "") -> Link | None:
        """One link by index or name; None when there is none."""
        payload = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
        payload += _nlattr(IFLA_EXT_MASK, _U32.pack(RTEXT_FILTER_SKIP_STATS))
        if name:
            payload += _nlattr(IFLA_IFNAME, name.encode() + b"\0")
        try:
            for mtype, _flags, body in self.messages(RTM_GETLINK, NLM_F_REQUEST, payload):
                return _decode_link(mtype, body)
        except NetlinkError as exc:
            if exc.errno in (errno.ENODEV, errno.ENOENT):
                return None
            raise
        return None

    # --- addresses, routes, rules, neighbours ----------------------------------------------------

    def addrs(self, index: int = 0) -> list[Addr]:
        payload = _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, index)
        out = self.dump(RTM_GETADDR, payload, _decode_addr)
        return [a for a in out if a.index == index] if index else out

    def routes(self, oif: int = 0) -> list[Route]:
        """Routes of every table (cloned ones left out), optionally only via ``oif``."""
        out: list[Route] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            payload = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            if oif:
                payload += _nlattr(RTA_OIF, _U32.pack(oif))
            out.extend(self.dump(RTM_GETROUTE, payload, _decode_route))
        return [r for r in out if r.oif == oif] if oif else out

    def rules(self) -> list[Rule]:
        out: list[Rule] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            payload = _FIBRULEHDR.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            out.extend(self.dump(RTM_GETRULE, payload, _decode_rule))
        return out

    def neighbors(self, index: int = 0) -> list[Neighbor]:
        out: list[Neighbor] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            # Strict dumps filter on NDA_IFINDEX; a non-zero header index matches nothing.
            payload = _NDMSG.pack(family, 0, 0, 0, 0)
            if index:
                payload += _nlattr(NDA_IFINDEX, _U32.pack(index))
            out.extend(self.dump(RTM_GETNEIGH, payload, _decode_neigh))
        return [n for n in out if n.index == index] if index else out

    # --- traffic control -------------------------------------------------------------------------

    def qdiscs(self) -> list[Qdisc]:
        payload = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        return self.dump(RTM_GETQDISC, payload, _decode_qdisc)

    def tc_filters(self, index: int, parent: int) -> list[TcFilter]:
        payload = _TCMSG.pack(socket.AF_UNSPEC, index, 0, parent, 0)
        try:
            return self.dump(RTM_GETTFILTER, payload, _decode_filter)
        except NetlinkError as exc:
            # No ingress/clsact qdisc on the link: nothing attached there.
            if exc.errno in (errno.EINVAL, errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
                return []
            raise

    # --- events ----------------------------------------------------------------------------------

    def drain(self) -> int:
        """Read and discard every queued multicast message; how many datagrams.
        An overflow (ENOBUFS) counts as one: something changed, rescan anyway."""
        n = 0
        while True:
            try:
                self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return n
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    n += 1
                    continue
                raise
            n += 1


def _decode_link(mtype: int, body: memoryview) -> Link | None:
    if mtype != RTM_NEWLINK or len(body) < _IFINFOMSG.size:
        return None
    _family, ifi_type, index, flags, _change = _IFINFOMSG.unpack_from(body)
    a = parse_attrs(body, _IFINFOMSG.size, len(body))
    kind = ""
    info = a.get(IFLA_LINKINFO)
    if info is not None:
        kind = _cstr(parse_attrs(info, 0, len(info)).get(IFLA_INFO_KIND))
    operstate = a.get(IFLA_OPERSTATE)
    parent = _u32(a.get(IFLA_LINK))
    if IFLA_LINK_NETNSID in a or parent == index:
        # The peer index belongs to another namespace (veth) or is the link itself.
        parent = 0
    addr = a.get(IFLA_ADDRESS)
    return Link(
        index=index,
        name=_cstr(a.get(IFLA_IFNAME)),
        kind=kind,
        ifi_type=ifi_type,
        flags=flags,
        mtu=_u32(a.get(IFLA_MTU)),
        mac=format_mac(bytes(addr)) if addr is not None else "",
        alias=_cstr(a.get(IFLA_IFALIAS)),
        operstate=operstate[0] if operstate is not None and len(operstate) else 0,
        master=_u32(a.get(IFLA_MASTER)),
        link=parent,
    )


def _decode_addr(mtype: int, body: memoryview) -> Addr | None:
    if len(body) < _IFADDRMSG.size:
        return None
    family, prefixlen, _flags, scope, index = _IFADDRMSG.unpack_from(body)
    a = parse_attrs(body, _IFADDRMSG.size, len(body))
    address = _ip(family, a.get(IFA_LOCAL) if IFA_LOCAL in a else a.get(IFA_ADDRESS))
    if not address:
        return None
    return Addr(index=index, family=family, prefixlen=prefixlen, scope=scope, address=address)


def _decode_route(mtype: int, body: memoryview) -> Route | None:
    if len(body) < _RTMSG.size:
        return None
    family, dst_len, _src_len, _tos, table, protocol, scope, _rtype, flags = _RTMSG.unpack_from(body)
    if flags & RTM_F_CLONED:
        return None
    a = parse_attrs(body, _RTMSG.size, len(body))
    dst = _ip(family, a.get(RTA_DST)) or ("0.0.0.0" if family == socket.AF_INET else "::")
    return Route(
        family=family,
        dst=f"{dst}/{dst_len}",
        gateway=_ip(family, a.get(RTA_GATEWAY)),
        prefsrc=_ip(family, a.get(RTA_PREFSRC)),
        scope=scope,
        table=_u32(a.get(RTA_TABLE), table),
        protocol=protocol,
        oif=_u32(a.get(RTA_OIF)),
        dst_len=dst_len,
        priority=_u32(a.get(RTA_PRIORITY)),
        oifs=_multipath_oifs(a.get(RTA_MULTIPATH)),
    )


_RTNEXTHOP = struct.Struct("=HBBi")


def _multipath_oifs(v: memoryview | None) -> tuple[int, ...]:
    if v is None:
        return ()
    out = []
    off = 0
    while off + _RTNEXTHOP.size <= len(v):
        length, _flags, _hops, ifindex = _RTNEXTHOP.unpack_from(v, off)
        if length < _RTNEXTHOP.size:
            break
        out.append(ifindex)
        off += (length + 3) & ~3
    return tuple(out)


def _decode_rule(mtype: int, body: memoryview) -> Rule | None:
    if len(body) < _FIBRULEHDR.size:
        return None
    family, dst_len, src_len, _tos, table, _r1, _r2, _action, _flags = _FIBRULEHDR.unpack_from(body)
    a = parse_attrs(body, _FIBRULEHDR.size, len(body))
    src = _ip(family, a.get(FRA_SRC))
    dst = _ip(family, a.get(FRA_DST))
    return Rule(
        family=family,
        priority=_u32(a.get(FRA_PRIORITY)),
        src=f"{src}/{src_len}" if src else "",
        dst=f"{dst}/{dst_len}" if dst else "",
        table=_u32(a.get(FRA_TABLE), table),
    )


def _decode_neigh(mtype: int, body: memoryview) -> Neighbor | None:
    if len(body) < _NDMSG.size:
        return None
    family, index, state, _flags, _ntype = _NDMSG.unpack_from(body)
    a = parse_attrs(body, _NDMSG.size, len(body))
    ll = a.get(NDA_LLADDR)
    return Neighbor(
        index=index,
        state=state,
        dst=_ip(family, a.get(NDA_DST)),
        lladdr=format_mac(bytes(ll)) if ll is not None else "",
    )


def _decode_qdisc(mtype: int, body: memoryview) -> Qdisc | None:
    if len(body) < _TCMSG.size:
        return None
    _family, index, handle, parent, _info = _TCMSG.unpack_from(body)
    a = parse_attrs(body, _TCMSG.size, len(body))
    return Qdisc(index=index, kind=_cstr(a.get(TCA_KIND)), handle=handle, parent=parent)


def _decode_filter(mtype: int, body: memoryview) -> TcFilter | None:
    if len(body) < _TCMSG.size:
        return None
    _family, index, _handle, parent, _info = _TCMSG.unpack_from(body)
    a = parse_attrs(body, _TCMSG.size, len(body))
    kind = _cstr(a.get(TCA_KIND))
    name = ""
    opts = a.get(TCA_OPTIONS)
    if kind == "bpf" and opts is not None:
        name = _cstr(parse_attrs(opts, 0, len(opts)).get(TCA_BPF_NAME))
    return TcFilter(index=index, parent=parent, kind=kind, bpf_name=name)
