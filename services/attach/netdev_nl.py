"""The rtnetlink (and RDMA netlink) requests of the attach hot path.

The wire format is the shared codec's (shared/rtnl, which says why not pyroute2's
IPRoute: its message classes cost more than the kernel's work, and pyroute2 0.9.7
knows neither IFLA_GSO_IPV4_MAX_SIZE/IFLA_GRO_IPV4_MAX_SIZE nor RDMA netlink; a sync
IPRoute also costs about 1 ms to open). The requests attach sends are few and fixed,
so each is one method here, and the replies are decoded into the few fields attach
reads. pyroute2 stays for ethtool (services/attach/netdev_ethtool.py: an ioctl, not
rtnetlink, made only when a config asks for ethtool settings) and in the benchmark's
direct path.

A NlSocket belongs to the netns of the thread that created it, for its whole life.
It is not thread-safe; one attach run uses its own sockets.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from shared.attachplan import LinkState
from shared.rtnl.codec import (
    FIB_RULE_HDR,
    FR_ACT_TO_TBL,
    FRA_DST,
    FRA_PRIORITY,
    FRA_SRC,
    FRA_TABLE,
    IFA_ADDRESS,
    IFA_LOCAL,
    IFADDRMSG,
    IFF_UP,
    IFINFOMSG,
    IFLA_ADDRESS,
    IFLA_ALT_IFNAME,
    IFLA_EXT_MASK,
    IFLA_GRO_IPV4_MAX_SIZE,
    IFLA_GRO_MAX_SIZE,
    IFLA_GSO_IPV4_MAX_SIZE,
    IFLA_GSO_MAX_SIZE,
    IFLA_IFNAME,
    IFLA_INFO_DATA,
    IFLA_INFO_KIND,
    IFLA_IPVLAN_MODE,
    IFLA_LINK,
    IFLA_LINKINFO,
    IFLA_MACVLAN_MODE,
    IFLA_MASTER,
    IFLA_MTU,
    IFLA_NET_NS_FD,
    IFLA_PERM_ADDRESS,
    IFLA_PROP_LIST,
    IFLA_VRF_TABLE,
    IPVLAN_MODES,
    MACVLAN_MODES,
    NDA_DST,
    NDA_LLADDR,
    NDMSG,
    NETLINK_RDMA,
    NETLINK_ROUTE,
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NUD_PERMANENT,
    RDMA_NLDEV_ATTR_DEV_INDEX,
    RDMA_NLDEV_ATTR_DEV_NAME,
    RDMA_NLDEV_CMD_GET,
    RDMA_NLDEV_CMD_SET,
    RDMA_NLDEV_NET_NS_FD,
    RTA_DST,
    RTA_GATEWAY,
    RTA_OIF,
    RTA_PREFSRC,
    RTA_TABLE,
    RTM_DELLINK,
    RTM_DELLINKPROP,
    RTM_DELRULE,
    RTM_DELTFILTER,
    RTM_GETLINK,
    RTM_GETTFILTER,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWLINKPROP,
    RTM_NEWNEIGH,
    RTM_NEWROUTE,
    RTM_NEWRULE,
    RTMSG,
    RTN_UNICAST,
    RTPROT_BOOT,
    TCA_CHAIN,
    TCA_KIND,
    TCMSG,
    NetlinkError,
    attr,
    attr_nested,
    attr_str,
    attr_u16,
    attr_u32,
    cidr_parts,
    cstr,
    ip_bytes,
    iter_attrs,
    mac_bytes,
    mac_text,
    parse_attrs,
    rdma_type,
    u32,
    unpack,
)
from shared.rtnl.sock import NetlinkSocket

# The names other modules (and the tests) take from here, re-exported codec names included.
__all__ = [
    "IFLA_IPVLAN_MODE",
    "IFLA_MACVLAN_MODE",
    "IFLA_VRF_TABLE",
    "IPVLAN_MODES",
    "MACVLAN_MODES",
    "NETLINK_RDMA",
    "NETLINK_ROUTE",
    "Message",
    "NetlinkError",
    "NlSocket",
    "attr_u16",
    "attr_u32",
    "decode_link",
]


@dataclass(frozen=True)
class Message:
    type: int
    flags: int
    seq: int
    body: bytes


def decode_link(body: bytes | memoryview) -> LinkState:
    """An RTM_NEWLINK reply body as a LinkState."""
    _family, _type, index, flags, _change = unpack(IFINFOMSG, body, "ifinfomsg")
    a = parse_attrs(body, IFINFOMSG.size)
    kind = ""
    if IFLA_LINKINFO in a:
        kind = cstr(parse_attrs(a[IFLA_LINKINFO]).get(IFLA_INFO_KIND))
    altnames: tuple[str, ...] = ()
    if IFLA_PROP_LIST in a:
        altnames = tuple(cstr(v) for k, v in iter_attrs(a[IFLA_PROP_LIST]) if k == IFLA_ALT_IFNAME)
    return LinkState(
        name=cstr(a.get(IFLA_IFNAME)),
        index=index,
        mac=mac_text(a.get(IFLA_ADDRESS)),
        mtu=u32(a.get(IFLA_MTU)) or 0,
        up=bool(flags & IFF_UP),
        kind=kind,
        altnames=altnames,
        perm_mac=mac_text(a.get(IFLA_PERM_ADDRESS)),
        master=u32(a.get(IFLA_MASTER)) or 0,
        link=u32(a.get(IFLA_LINK)) or 0,
        gso_max_size=u32(a.get(IFLA_GSO_MAX_SIZE)),
        gro_max_size=u32(a.get(IFLA_GRO_MAX_SIZE)),
        gso_ipv4_max_size=u32(a.get(IFLA_GSO_IPV4_MAX_SIZE)),
        gro_ipv4_max_size=u32(a.get(IFLA_GRO_IPV4_MAX_SIZE)),
    )


class NlSocket(NetlinkSocket):
    """A netlink socket bound in the netns of the creating thread, with extended acks
    (the kernel's error text reaches the claim's error)."""

    def __init__(self, proto: int = NETLINK_ROUTE) -> None:
        # 64 KiB holds any reply attach asks for: dump chunks are at most 32 KiB and
        # link replies carry no VF list (IFLA_EXT_MASK 0).
        super().__init__(proto, ext_ack=True, bufsize=1 << 16)

    def request(self, mtype: int, flags: int, body: bytes) -> list[Message]:
        """Send one request with NLM_F_ACK and return the replies before the ack (a
        dump's messages, or a GET's answer). Raises NetlinkError."""
        replies = self.messages(mtype, flags | NLM_F_REQUEST | NLM_F_ACK, body)
        # Bodies are copied out of the receive buffer; self._seq is the request's once
        # the first reply is in.
        return [Message(t, f, self._seq, bytes(b)) for t, f, b in replies if t != NLMSG_DONE]

    # --- rtnetlink requests used by attach ---

    def get_link(self, name: str = "", index: int = 0, altname: str = "") -> LinkState | None:
        """One link by index, name or altname; None if there is no such link."""
        body = IFINFOMSG.pack(0, 0, index, 0, 0)
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
        body = IFINFOMSG.pack(0, 0, 0, 0, 0) + attr_u32(IFLA_EXT_MASK, 0)
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
        body = IFINFOMSG.pack(0, 0, index, flags, change)
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
        body = IFINFOMSG.pack(0, 0, index, 0, 0) + attr_nested(
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
        body = IFINFOMSG.pack(0, 0, 0, 0, 0) + attr_str(IFLA_IFNAME, name)
        if parent is not None:
            body += attr_u32(IFLA_LINK, parent)
        if mtu is not None:
            body += attr_u32(IFLA_MTU, mtu)
        if netns_fd is not None:
            body += attr_u32(IFLA_NET_NS_FD, netns_fd)
        info = attr_str(IFLA_INFO_KIND, kind)
        if info_data:
            info += attr_nested(IFLA_INFO_DATA, info_data)
        body += attr_nested(IFLA_LINKINFO, info)
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)

    def delete_link(self, index: int) -> None:
        self.request(RTM_DELLINK, 0, IFINFOMSG.pack(0, 0, index, 0, 0))

    def add_address(self, index: int, cidr: str) -> None:
        family, packed, plen = cidr_parts(cidr)
        body = IFADDRMSG.pack(family, plen, 0, 0, index) + attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed)
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
        body = RTMSG.pack(family, plen, 0, 0, table if table < 256 else 0, RTPROT_BOOT, scope, RTN_UNICAST, 0)
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
        hdr = FIB_RULE_HDR.pack(
            family, dst_len, src_len, 0, table if table < 256 else 0, 0, 0, FR_ACT_TO_TBL, 0
        )
        self.request(
            RTM_NEWRULE if add else RTM_DELRULE, NLM_F_CREATE | NLM_F_EXCL if add else 0, hdr + attrs
        )

    def replace_neighbor(self, index: int, destination: str, mac: str) -> None:
        family, packed = ip_bytes(destination)
        body = NDMSG.pack(family, index, NUD_PERMANENT, 0, 0) + attr(NDA_DST, packed)
        body += attr(NDA_LLADDR, mac_bytes(mac))
        self.request(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, body)

    def tc_filters(self, index: int, parent: int) -> list[tuple[int, int, int, int, str]]:
        """(handle, parent, info, chain, kind) of each tc filter under ``parent``."""
        out = []
        body = TCMSG.pack(0, index, 0, parent, 0)
        for m in self.request(RTM_GETTFILTER, NLM_F_DUMP, body):
            _f, _i, handle, mparent, info = unpack(TCMSG, m.body, "tcmsg")
            a = parse_attrs(m.body, TCMSG.size)
            out.append((handle, mparent, info, u32(a.get(TCA_CHAIN)) or 0, cstr(a.get(TCA_KIND))))
        return out

    def delete_tc_filter(
        self, index: int, handle: int, parent: int, info: int, chain: int, kind: str
    ) -> None:
        body = TCMSG.pack(0, index, handle, parent, info) + attr_str(TCA_KIND, kind)
        if chain:
            body += attr_u32(TCA_CHAIN, chain)
        self.request(RTM_DELTFILTER, 0, body)

    # --- RDMA netlink (socket made with NETLINK_RDMA) ---

    def rdma_devices(self) -> dict[str, int]:
        """RDMA device name -> index, in this socket's netns."""
        out: dict[str, int] = {}
        for m in self.request(rdma_type(RDMA_NLDEV_CMD_GET), NLM_F_DUMP, b""):
            a = parse_attrs(m.body)
            index = u32(a.get(RDMA_NLDEV_ATTR_DEV_INDEX))
            if index is not None:
                out[cstr(a.get(RDMA_NLDEV_ATTR_DEV_NAME))] = index
        return out

    def rdma_set_netns(self, index: int, netns_fd: int) -> None:
        body = attr_u32(RDMA_NLDEV_ATTR_DEV_INDEX, index) + attr_u32(RDMA_NLDEV_NET_NS_FD, netns_fd)
        self.request(rdma_type(RDMA_NLDEV_CMD_SET), 0, body)
