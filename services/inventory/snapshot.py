"""The host snapshot prepare copies into a Pod, read fresh from the kernel.

What is kept follows dranet's prepare (pkg/driver/dra_hooks.go): global-scope
addresses; the interface's routes in every table but local, without IPv6
link-local destinations or IPv6 kernel routes; the rules of those routes'
tables (never main or local); permanent neighbours; the RDMA character devices
of the device's RDMA link plus rdma_cm. Blocking: call from a worker thread.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from services.inventory import rtnl
from services.inventory.sysfs import CharDevice, Sysfs, rdma_device_for_netdev

# Kinds whose IFLA_LINK is the lower device the link lives on.
_STACKED_KINDS = frozenset({"macvlan", "macvtap", "ipvlan", "ipvtap", "vlan"})


@dataclass(frozen=True)
class Snapshot:
    ifindex: int = 0
    mtu: int = 0
    hardware_addr: str = ""
    state: str = ""
    addresses: list[rtnl.Addr] = field(default_factory=list)
    routes: list[rtnl.Route] = field(default_factory=list)
    rules: list[rtnl.Rule] = field(default_factory=list)
    neighbors: list[rtnl.Neighbor] = field(default_factory=list)
    rdma_device: str = ""
    rdma_dev_chars: list[CharDevice] = field(default_factory=list)
    pf_ifname: str = ""
    pf_mtu: int = 0
    link_ifname: str = ""
    link_mtu: int = 0


class InterfaceGone(LookupError):
    """The interface is not in this network namespace (any more)."""


def copyable_routes(routes: list[rtnl.Route]) -> list[rtnl.Route]:
    """The routes dranet copies: not the local table, not IPv6 link-local
    destinations, not IPv6 routes the kernel made itself."""
    out = []
    for r in routes:
        if r.table == rtnl.RT_TABLE_LOCAL:
            continue
        if r.family == socket.AF_INET6:
            if ipaddress.ip_network(r.dst, strict=False).network_address.is_link_local:
                continue
            if r.protocol == rtnl.RTPROT_KERNEL:
                continue
        out.append(r)
    return out


def rules_for_tables(rules: list[rtnl.Rule], tables: set[int]) -> list[rtnl.Rule]:
    """Rules that look up one of ``tables``, main and local excluded, by priority."""
    wanted = {t for t in tables if t > 0 and t not in (rtnl.RT_TABLE_MAIN, rtnl.RT_TABLE_LOCAL)}
    return sorted((r for r in rules if r.table in wanted), key=lambda r: (r.priority, r.table, r.family))


def read_snapshot(ifname: str, sysfs: Sysfs, rdma_device: str = "") -> Snapshot:
    """The snapshot of ``ifname``; for an RDMA-only device (``ifname`` "") just the
    RDMA device files of ``rdma_device``. Raises InterfaceGone."""
    if not ifname:
        return Snapshot(rdma_device=rdma_device, rdma_dev_chars=_chars(sysfs, rdma_device))
    with rtnl.Netlink() as nl:
        link = nl.link(name=ifname)
        if link is None:
            raise InterfaceGone(f"interface {ifname} is not in the host network namespace")
        addrs = [a for a in nl.addrs(link.index) if a.scope == 0]
        addrs.sort(key=lambda a: a.family)
        routes = copyable_routes(nl.routes(oif=link.index))
        rules = rules_for_tables(nl.rules(), {r.table for r in routes}) if routes else []
        neighbors = [
            n for n in nl.neighbors(link.index) if n.state == rtnl.NUD_PERMANENT and n.dst and n.lladdr
        ]
        net = sysfs.netdev(ifname)
        pf_mtu = 0
        if net.is_vf and net.pf_ifname:
            pf = nl.link(name=net.pf_ifname)
            pf_mtu = pf.mtu if pf else 0
        parent_name, parent_mtu = "", 0
        if link.link and link.kind in _STACKED_KINDS:
            parent = nl.link(index=link.link)
            if parent is not None:
                parent_name, parent_mtu = parent.name, parent.mtu
    rdma = rdma_device_for_netdev(ifname, link.encapsulation, link.mac, net, sysfs.rdma_links())
    return Snapshot(
        ifindex=link.index,
        mtu=link.mtu,
        hardware_addr=link.mac,
        state=link.state,
        addresses=addrs,
        routes=routes,
        rules=rules,
        neighbors=neighbors,
        rdma_device=rdma,
        rdma_dev_chars=_chars(sysfs, rdma) if rdma else [],
        pf_ifname=net.pf_ifname if net.is_vf else "",
        pf_mtu=pf_mtu,
        link_ifname=parent_name,
        link_mtu=parent_mtu,
    )


def _chars(sysfs: Sysfs, rdma_device: str) -> list[CharDevice]:
    return sysfs.rdma_char_devices(rdma_device) if rdma_device else []
