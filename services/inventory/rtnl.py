"""The inventory's rtnetlink queries, decoded straight into small frozen records.

Only the attributes the inventory reads are decoded, with the shared codec
(shared/rtnl): pyroute2 decodes every attribute of every message into objects,
which measured 0.23-0.40 s for a 1,000-link dump on this machine against ~15 ms
here; the scan runs on every link event, so the cheap path matters
(tests/bench/inventory.py shows both).

Every dump retries when the kernel flags it NLM_F_DUMP_INTR, as dranet's
internal/nlwrap does (shared/rtnl/sock.py).

Call these from a worker thread (``asyncio.to_thread``); a ``Netlink`` object is
not shared between threads.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from shared.rtnl.codec import (
    FIB_RULE_HDR,
    FRA_DST,
    FRA_PRIORITY,
    FRA_SRC,
    FRA_TABLE,
    IFA_ADDRESS,
    IFA_LOCAL,
    IFADDRMSG,
    IFF_LOOPBACK,
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_EXT_MASK,
    IFLA_IFALIAS,
    IFLA_IFNAME,
    IFLA_INFO_KIND,
    IFLA_LINK,
    IFLA_LINK_NETNSID,
    IFLA_LINKINFO,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_OPERSTATE,
    NDA_DST,
    NDA_IFINDEX,
    NDA_LLADDR,
    NDMSG,
    NETLINK_RDMA,
    NETLINK_ROUTE,
    NLM_F_ACK,
    NLM_F_DUMP_INTR,
    NLM_F_MULTI,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NUD_PERMANENT,
    RT_TABLE_LOCAL,
    RT_TABLE_MAIN,
    RTA_DST,
    RTA_GATEWAY,
    RTA_MULTIPATH,
    RTA_OIF,
    RTA_PREFSRC,
    RTA_PRIORITY,
    RTA_TABLE,
    RTEXT_FILTER_SKIP_STATS,
    RTM_F_CLONED,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETNEIGH,
    RTM_GETQDISC,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_GETTFILTER,
    RTM_NEWLINK,
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_LINK,
    RTMSG,
    RTPROT_KERNEL,
    TC_H_MIN_EGRESS,
    TC_H_MIN_INGRESS,
    TCA_BPF_NAME,
    TCA_KIND,
    TCA_OPTIONS,
    TCMSG,
    NetlinkError,
    attr_str,
    attr_u32,
    cstr,
    ip_text,
    iter_nexthops,
    parse_attrs,
    u8,
    u32,
)
from shared.rtnl.sock import MAX_DUMP_ATTEMPTS, NetlinkSocket

# The names other modules (and the tests) take from here, re-exported codec names included.
__all__ = [
    "MAX_DUMP_ATTEMPTS",
    "NETLINK_RDMA",
    "NLMSG_DONE",
    "NLM_F_ACK",
    "NLM_F_DUMP_INTR",
    "NLM_F_MULTI",
    "NLM_F_REQUEST",
    "NUD_PERMANENT",
    "RTMGRP_IPV4_IFADDR",
    "RTMGRP_IPV6_IFADDR",
    "RTMGRP_LINK",
    "RTPROT_KERNEL",
    "RT_TABLE_LOCAL",
    "RT_TABLE_MAIN",
    "TC_H_MIN_EGRESS",
    "TC_H_MIN_INGRESS",
    "Addr",
    "Link",
    "Neighbor",
    "Netlink",
    "NetlinkError",
    "Qdisc",
    "Route",
    "Rule",
    "TcFilter",
    "encap_name",
    "format_mac",
    "link_type_name",
    "oper_state_name",
    "parse_attrs",
]

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


class Netlink(NetlinkSocket):
    """One netlink socket in the calling thread's network namespace: rtnetlink unless
    ``protocol`` says otherwise; ``groups`` makes it the link/address event socket."""

    def __init__(self, protocol: int = NETLINK_ROUTE, groups: int = 0) -> None:
        # 1 MiB: the event socket must not overflow while a scan runs, and any reply fits.
        super().__init__(
            protocol,
            groups,
            rcvbuf=1 << 20,
            strict_check=protocol == NETLINK_ROUTE,
            bufsize=1 << 20,
        )

    # --- links -----------------------------------------------------------------------------------

    def links(self) -> list[Link]:
        payload = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attr_u32(
            IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS
        )
        return self.dump(RTM_GETLINK, payload, _decode_link)

    def link(self, index: int = 0, name: str = "") -> Link | None:
        """One link by index or name; None when there is none."""
        payload = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
        payload += attr_u32(IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS)
        if name:
            payload += attr_str(IFLA_IFNAME, name)
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
        payload = IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, index)
        out = self.dump(RTM_GETADDR, payload, _decode_addr)
        return [a for a in out if a.index == index] if index else out

    def routes(self, oif: int = 0) -> list[Route]:
        """Routes of every table (cloned ones left out), optionally only via ``oif``."""
        out: list[Route] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            payload = RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            if oif:
                payload += attr_u32(RTA_OIF, oif)
            out.extend(self.dump(RTM_GETROUTE, payload, _decode_route))
        return [r for r in out if r.oif == oif] if oif else out

    def rules(self) -> list[Rule]:
        out: list[Rule] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            payload = FIB_RULE_HDR.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
            out.extend(self.dump(RTM_GETRULE, payload, _decode_rule))
        return out

    def neighbors(self, index: int = 0) -> list[Neighbor]:
        out: list[Neighbor] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            # Strict dumps filter on NDA_IFINDEX; a non-zero header index matches nothing.
            payload = NDMSG.pack(family, 0, 0, 0, 0)
            if index:
                payload += attr_u32(NDA_IFINDEX, index)
            out.extend(self.dump(RTM_GETNEIGH, payload, _decode_neigh))
        return [n for n in out if n.index == index] if index else out

    # --- traffic control -------------------------------------------------------------------------

    def qdiscs(self) -> list[Qdisc]:
        payload = TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        return self.dump(RTM_GETQDISC, payload, _decode_qdisc)

    def tc_filters(self, index: int, parent: int) -> list[TcFilter]:
        payload = TCMSG.pack(socket.AF_UNSPEC, index, 0, parent, 0)
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
    if mtype != RTM_NEWLINK or len(body) < IFINFOMSG.size:
        return None
    _family, ifi_type, index, flags, _change = IFINFOMSG.unpack_from(body)
    a = parse_attrs(body, IFINFOMSG.size)
    kind = ""
    info = a.get(IFLA_LINKINFO)
    if info is not None:
        kind = cstr(parse_attrs(info).get(IFLA_INFO_KIND))
    parent = u32(a.get(IFLA_LINK), 0)
    if IFLA_LINK_NETNSID in a or parent == index:
        # The peer index belongs to another namespace (veth) or is the link itself.
        parent = 0
    addr = a.get(IFLA_ADDRESS)
    return Link(
        index=index,
        name=cstr(a.get(IFLA_IFNAME)),
        kind=kind,
        ifi_type=ifi_type,
        flags=flags,
        mtu=u32(a.get(IFLA_MTU), 0),
        mac=format_mac(bytes(addr)) if addr is not None else "",
        alias=cstr(a.get(IFLA_IFALIAS)),
        operstate=u8(a.get(IFLA_OPERSTATE)),
        master=u32(a.get(IFLA_MASTER), 0),
        link=parent,
    )


def _decode_addr(mtype: int, body: memoryview) -> Addr | None:
    if len(body) < IFADDRMSG.size:
        return None
    family, prefixlen, _flags, scope, index = IFADDRMSG.unpack_from(body)
    a = parse_attrs(body, IFADDRMSG.size)
    address = ip_text(family, a.get(IFA_LOCAL) if IFA_LOCAL in a else a.get(IFA_ADDRESS))
    if not address:
        return None
    return Addr(index=index, family=family, prefixlen=prefixlen, scope=scope, address=address)


def _decode_route(mtype: int, body: memoryview) -> Route | None:
    if len(body) < RTMSG.size:
        return None
    family, dst_len, _src_len, _tos, table, protocol, scope, _rtype, flags = RTMSG.unpack_from(body)
    if flags & RTM_F_CLONED:
        return None
    a = parse_attrs(body, RTMSG.size)
    dst = ip_text(family, a.get(RTA_DST)) or ("0.0.0.0" if family == socket.AF_INET else "::")
    multipath = a.get(RTA_MULTIPATH)
    return Route(
        family=family,
        dst=f"{dst}/{dst_len}",
        gateway=ip_text(family, a.get(RTA_GATEWAY)),
        prefsrc=ip_text(family, a.get(RTA_PREFSRC)),
        scope=scope,
        table=u32(a.get(RTA_TABLE), table),
        protocol=protocol,
        oif=u32(a.get(RTA_OIF), 0),
        dst_len=dst_len,
        priority=u32(a.get(RTA_PRIORITY), 0),
        oifs=tuple(hop[2] for hop in iter_nexthops(multipath)) if multipath is not None else (),
    )


def _decode_rule(mtype: int, body: memoryview) -> Rule | None:
    if len(body) < FIB_RULE_HDR.size:
        return None
    family, dst_len, src_len, _tos, table, _r1, _r2, _action, _flags = FIB_RULE_HDR.unpack_from(body)
    a = parse_attrs(body, FIB_RULE_HDR.size)
    src = ip_text(family, a.get(FRA_SRC))
    dst = ip_text(family, a.get(FRA_DST))
    return Rule(
        family=family,
        priority=u32(a.get(FRA_PRIORITY), 0),
        src=f"{src}/{src_len}" if src else "",
        dst=f"{dst}/{dst_len}" if dst else "",
        table=u32(a.get(FRA_TABLE), table),
    )


def _decode_neigh(mtype: int, body: memoryview) -> Neighbor | None:
    if len(body) < NDMSG.size:
        return None
    family, index, state, _flags, _ntype = NDMSG.unpack_from(body)
    a = parse_attrs(body, NDMSG.size)
    ll = a.get(NDA_LLADDR)
    return Neighbor(
        index=index,
        state=state,
        dst=ip_text(family, a.get(NDA_DST)),
        lladdr=format_mac(bytes(ll)) if ll is not None else "",
    )


def _decode_qdisc(mtype: int, body: memoryview) -> Qdisc | None:
    if len(body) < TCMSG.size:
        return None
    _family, index, handle, parent, _info = TCMSG.unpack_from(body)
    a = parse_attrs(body, TCMSG.size)
    return Qdisc(index=index, kind=cstr(a.get(TCA_KIND)), handle=handle, parent=parent)


def _decode_filter(mtype: int, body: memoryview) -> TcFilter | None:
    if len(body) < TCMSG.size:
        return None
    _family, index, _handle, parent, _info = TCMSG.unpack_from(body)
    a = parse_attrs(body, TCMSG.size)
    kind = cstr(a.get(TCA_KIND))
    name = ""
    opts = a.get(TCA_OPTIONS)
    if kind == "bpf" and opts is not None:
        name = cstr(parse_attrs(opts).get(TCA_BPF_NAME))
    return TcFilter(index=index, parent=parent, kind=kind, bpf_name=name)
