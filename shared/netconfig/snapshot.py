"""Seed step 5: add the host snapshot to the final config (dranet dra_hooks.go:381).

Passthrough: with no addresses configured (and no DHCP, not Unnumbered) the
interface's global host addresses are copied; the host routes through the
interface are added, with the rules of their tables (not with a VRF: the VRF
table does the lookup), and its permanent neighbors. A configured entry wins
over a host entry with the same key (route destination+table, neighbor
destination). A host route whose preferred source is not one of the Pod's
addresses (the config set other addresses) keeps no source: the kernel refuses
a prefsrc the interface does not carry ("Invalid prefsrc address"). IPvlan: the
parent stays on the host with its addresses and routes, so nothing is copied
(addresses and routes come only from the config or a profile).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from shared.netconfig.model import (
    Addressing,
    InterfaceType,
    NeighborConfig,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
)


@dataclass(frozen=True)
class HostSnapshot:
    """The host-side L3 state of one interface, as the inventory reports it."""

    addresses: Sequence[str] = ()
    routes: Sequence[RouteConfig] = ()
    rules: Sequence[RuleConfig] = ()
    neighbors: Sequence[NeighborConfig] = ()


def apply_host_snapshot(cfg: NetworkConfig, host: HostSnapshot) -> NetworkConfig:
    """``cfg`` with what the Pod inherits from the host added."""
    itf = cfg.interface
    if itf.effective_type == InterfaceType.IPVLAN:
        return cfg
    if not itf.addresses and itf.dhcp is not True and itf.addressing != Addressing.UNNUMBERED:
        itf = replace(itf, addresses=tuple(host.addresses))
    route_keys = {(r.destination, r.table) for r in cfg.routes}
    pod_ips = {a.split("/", 1)[0] for a in itf.addresses}
    routes = list(cfg.routes) + [
        r if not r.source or r.source in pod_ips else replace(r, source="")
        for r in host.routes
        if (r.destination, r.table) not in route_keys
    ]
    rules = list(cfg.rules)
    if itf.vrf is None:
        tables = {r.table for r in host.routes}
        rules += [r for r in host.rules if r.table in tables and r not in rules]
    neigh_keys = {n.destination for n in cfg.neighbors}
    neighbors = list(cfg.neighbors) + [n for n in host.neighbors if n.destination not in neigh_keys]
    return replace(cfg, interface=itf, routes=tuple(routes), rules=tuple(rules), neighbors=tuple(neighbors))
