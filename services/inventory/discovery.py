"""Device discovery: gather host facts (netlink + sysfs), then build devices.

``gather`` does the I/O (blocking: run it in a worker thread); ``build_devices``
is pure and follows dranet's scan (pkg/inventory/db.go) step by step:

1. every PCI network function (class 0x02) with a netdev-making driver becomes a
   device named after its PCI address;
2. RDMA devices whose PCI function is not one of those (e.g. eRDMA, class
   0x00ff) become RDMA-only devices;
3. every link except loopback, the ignored CNI names and (unless
   --move-ib-interfaces) IPoIB links adds its link attributes to its PCI device,
   or becomes a device of its own named after the interface;
4. PCI attributes (vendor, device, subsystem, NUMA, PCIe root) and RDMA
   attributes are added to every device that has a PCI address / netdev;
5. default-gateway uplinks and the links enslaved under them are left out.

Cloud attributes and the publish filter are added later (``inventory.py``).
"""

from __future__ import annotations

import logging
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.inventory import attributes as A
from services.inventory import rtnl
from services.inventory.bpf import TcxQuery
from services.inventory.pciids import PciIds
from services.inventory.sysfs import NetSysfs, PciFunction, RdmaLink, Sysfs, rdma_device_for_netdev
from shared.deviceattr import Attribute
from shared.names import NameSource, assign_device_names
from shared.netconfig import NetworkConfig

log = logging.getLogger(__name__)

# Links CNI plugins make that are never devices to hand out (dranet's list).
IGNORED_INTERFACE_NAMES = frozenset({"cilium_net", "cilium_host", "docker0"})


@dataclass(frozen=True)
class Device:
    """One discovered device: its published attributes and what lookups need."""

    name: str
    attributes: Mapping[str, Attribute]
    ifname: str = ""
    ifindex: int = 0
    pci_address: str = ""
    rdma_device: str = ""
    is_sriov_vf: bool = False
    pf_ifname: str = ""
    mtu: int = 0
    type: str = ""
    mac: str = ""
    provider_config: NetworkConfig | None = None
    profiles: tuple[str, ...] = ()
    # resource.k8s.io/v1 DeviceCapacity JSON by name; discovery sets none, a kept device
    # (PersistentResourceSliceAttributes) carries whatever it was published with.
    capacity: Mapping[str, Any] = field(default_factory=dict)

    @property
    def rdma_only(self) -> bool:
        """An RDMA device without a netdev (dranet's IsIBOnlyDevice)."""
        return bool(self.rdma_device) and not self.ifname

    def slice_entry(self) -> dict[str, Any]:
        """The device as a resource.k8s.io/v1 ResourceSlice ``spec.devices[]`` item."""
        entry: dict[str, Any] = {"name": self.name}
        if self.attributes:
            entry["attributes"] = {k: self.attributes[k].to_json() for k in sorted(self.attributes)}
        if self.capacity:
            entry["capacity"] = {k: self.capacity[k] for k in sorted(self.capacity)}
        return entry

    @classmethod
    def from_slice_entry(cls, entry: Mapping[str, Any]) -> Device:
        """A device from a ``spec.devices[]`` item (name, attributes, capacity); ValueError
        names a bad attribute."""
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a device needs a name, got {name!r}")
        attrs: dict[str, Attribute] = {}
        for key, value in (entry.get("attributes") or {}).items():
            try:
                attrs[key] = Attribute.from_json(value)
            except ValueError as exc:
                raise ValueError(f"device {name} attribute {key}: {exc}") from None
        capacity = entry.get("capacity") or {}
        if not isinstance(capacity, dict):
            raise ValueError(f"device {name}: capacity is not an object")
        return cls(name=name, attributes=attrs, capacity=dict(capacity))


@dataclass(frozen=True)
class HostFacts:
    """Everything one scan read from the kernel and sysfs."""

    links: list[rtnl.Link]
    addrs: Mapping[int, list[str]]  # ifindex -> CIDRs
    tc: Mapping[int, tuple[list[str], bool]]  # ifindex -> (bpf filter names, has bpf filter)
    tcx: Mapping[int, tuple[list[str], bool]]  # ifindex -> (program names, has program)
    net: Mapping[str, NetSysfs]  # ifname -> sysfs facts
    pci: list[PciFunction]
    rdma_links: list[RdmaLink]
    numa_nodes: int = 1
    # Read only for DRAListTypeAttributes: node -> its SLIT distance row, node -> the
    # socket (physical package) of its first CPU.
    numa_distances: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    numa_sockets: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ScanOptions:
    move_ib_interfaces: bool = True
    excluded_interfaces: frozenset[str] = field(default_factory=frozenset)
    # DRAListTypeAttributes: resource.kubernetes.io/numaNode as an int list.
    list_numa_attributes: bool = False


@dataclass
class _Draft:
    """A device being assembled (mutable while building, frozen at the end)."""

    attrs: dict[str, Attribute] = field(default_factory=dict)
    link: rtnl.Link | None = None
    net: NetSysfs | None = None
    pci_address: str = ""
    rdma_device: str = ""


def build_devices(facts: HostFacts, options: ScanOptions, pciids: PciIds) -> list[Device]:
    """The devices of one scan, sorted by name, without cloud attributes."""
    pci_by_addr = {fn.address: fn for fn in facts.pci}
    drafts: dict[str, _Draft] = {}  # keyed by NameSource.key
    order: list[NameSource] = []

    def add(src: NameSource, draft: _Draft) -> None:
        drafts[src.key] = draft
        order.append(src)

    # 1. PCI network functions that can be handed out.
    for fn in facts.pci:
        if not fn.is_network:
            continue
        if not fn.allocatable:
            log.debug(
                "PCI network function not published: driver %r makes no netdev",
                fn.driver,
                extra={"pci": fn.address},
            )
            continue
        d = _Draft(pci_address=fn.address)
        d.attrs[A.PCI_ADDRESS] = A.string(fn.address)
        add(NameSource(pci_address=fn.address), d)

    # 2. RDMA devices on PCI functions step 1 did not take (e.g. eRDMA).
    for rl in facts.rdma_links:
        if not rl.pci_address:
            continue
        key = NameSource(pci_address=rl.pci_address).key
        if key in drafts:
            continue
        d = _Draft(pci_address=rl.pci_address, rdma_device=rl.name)
        d.attrs[A.PCI_ADDRESS] = A.string(rl.pci_address)
        d.attrs[A.RDMA_DEVICE] = A.string(rl.name)
        add(NameSource(pci_address=rl.pci_address), d)

    # 3. Links.
    for link in facts.links:
        if link.name in IGNORED_INTERFACE_NAMES or link.is_loopback:
            continue
        if link.type == "ipoib" and not options.move_ib_interfaces:
            # The PCI function stays an RDMA-only device; its IPoIB netdev is not handed out.
            continue
        net = facts.net.get(link.name, NetSysfs(virtual=True))
        if net.pci_address:
            key = NameSource(pci_address=net.pci_address).key
            draft = drafts.get(key)
            if draft is None:
                log.warning(
                    "interface has a PCI address that the PCI scan did not find; skipping it",
                    extra={"device": link.name, "pci": net.pci_address},
                )
                continue
        else:
            if not net.virtual:
                log.debug(
                    "no PCI address for a non-virtual interface; treating it as virtual",
                    extra={"device": link.name},
                )
            draft = _Draft()
            add(NameSource(ifname=link.name), draft)
        draft.link = link
        draft.net = net
        _add_link_attributes(draft, link, facts, net)

    # 4. PCI and RDMA attributes for every device.
    multi_numa = facts.numa_nodes > 1
    for draft in drafts.values():
        pci_fn = pci_by_addr.get(draft.pci_address) if draft.pci_address else None
        if pci_fn is not None:
            numa: Attribute | None = None
            if pci_fn.numa_node is not None:
                if options.list_numa_attributes:
                    numa = Attribute.of_ints(
                        A.numa_node_list(pci_fn.numa_node, facts.numa_distances, facts.numa_sockets)
                    )
                else:
                    numa = A.integer(pci_fn.numa_node)
            _add_pci_attributes(draft, pci_fn, multi_numa, pciids, numa)
        _add_rdma_attributes(draft, facts.rdma_links, pci_by_addr)

    # 5. Leave out the uplinks.
    names = assign_device_names(order)
    devices: list[Device] = []
    for src in order:
        draft = drafts[src.key]
        dlink = draft.link
        if dlink is not None and dlink.name in options.excluded_interfaces:
            continue
        dnet = draft.net or NetSysfs()
        devices.append(
            Device(
                name=names[src.key],
                attributes=draft.attrs,
                ifname=dlink.name if dlink else "",
                ifindex=dlink.index if dlink else 0,
                pci_address=draft.pci_address,
                rdma_device=draft.rdma_device,
                is_sriov_vf=dnet.is_vf,
                pf_ifname=dnet.pf_ifname,
                mtu=dlink.mtu if dlink else 0,
                type=dlink.type if dlink else "",
                mac=dlink.mac if dlink else "",
            )
        )
    devices.sort(key=lambda d: d.name)
    return devices


def _add_link_attributes(draft: _Draft, link: rtnl.Link, facts: HostFacts, net: NetSysfs) -> None:
    attrs = draft.attrs
    attrs[A.IF_NAME] = A.string(link.name)
    attrs[A.MAC] = A.string(link.mac)
    attrs[A.MTU] = A.integer(link.mtu)
    attrs[A.ENCAPSULATION] = A.string(link.encapsulation)
    attrs[A.ALIAS] = A.string(A.fit_string(link.alias))
    attrs[A.STATE] = A.string(link.state)
    attrs[A.TYPE] = A.string(link.type)
    v4, v6 = A.address_lists(facts.addrs.get(link.index, ()))
    for key, ips in ((A.IPV4, v4), (A.IPV6, v6)):
        if not ips:
            continue
        joined, kept = A.join_within(ips)
        if joined:
            attrs[key] = A.string(joined)
        if kept < len(ips):
            log.debug(
                "address list cut to the attribute length limit",
                extra={"device": link.name, "attribute": key, "kept": kept, "total": len(ips)},
            )
    ebpf = False
    tc_names, has_tc = facts.tc.get(link.index, ([], False))
    if has_tc:
        ebpf = True
        attrs[A.TC_FILTER_NAMES] = A.string(A.join_within(tc_names)[0])
    tcx_names, has_tcx = facts.tcx.get(link.index, ([], False))
    if has_tcx:
        ebpf = True
        attrs[A.TCX_PROGRAM_NAMES] = A.string(A.join_within(tcx_names)[0])
    attrs[A.EBPF] = A.boolean(ebpf)
    sriov = net.sriov_totalvfs > 0
    attrs[A.SRIOV] = A.boolean(sriov)
    if sriov:
        attrs[A.SRIOV_VFS] = A.integer(net.sriov_numvfs)
    if net.is_vf:
        attrs[A.IS_SRIOV_VF] = A.boolean(True)
    attrs[A.VIRTUAL] = A.boolean(net.virtual)


def _add_pci_attributes(
    draft: _Draft, fn: PciFunction, multi_numa: bool, pciids: PciIds, numa: Attribute | None
) -> None:
    attrs = draft.attrs
    if numa is not None:
        # The standardized attribute is scalar, or a list with DRAListTypeAttributes; the
        # legacy dra.net/numaNode below stays scalar either way (dranet db.go).
        attrs.setdefault(A.STANDARD_NUMA_NODE, numa)
    if fn.pcie_root:
        attrs.setdefault(A.STANDARD_PCIE_ROOT, A.string(fn.pcie_root))
    # ghw reports a NUMA node only on a NUMA machine (more than one node).
    if multi_numa and fn.numa_node is not None:
        attrs.setdefault(A.NUMA_NODE, A.integer(fn.numa_node))
    attrs.setdefault(A.PCI_VENDOR, A.string(A.fit_string(pciids.vendor_name(fn.vendor_id))))
    attrs.setdefault(A.PCI_DEVICE, A.string(A.fit_string(pciids.device_name(fn.vendor_id, fn.device_id))))
    attrs.setdefault(A.PCI_SUBSYSTEM, A.string(fn.subsystem_device_id))


def _add_rdma_attributes(
    draft: _Draft, rdma_links: list[RdmaLink], pci_by_addr: Mapping[str, PciFunction]
) -> None:
    link = draft.link
    if link is not None:
        if not draft.rdma_device:
            draft.rdma_device = rdma_device_for_netdev(
                link.name, link.encapsulation, link.mac, draft.net or NetSysfs(), rdma_links
            )
    elif draft.pci_address and not draft.rdma_device:
        fn = pci_by_addr.get(draft.pci_address)
        if fn is not None and fn.rdma_devices:
            draft.rdma_device = fn.rdma_devices[0]
    if draft.rdma_device:
        draft.attrs[A.RDMA_DEVICE] = A.string(draft.rdma_device)
    draft.attrs[A.RDMA] = A.boolean(bool(draft.rdma_device))


# --- I/O ---------------------------------------------------------------------------------------


def gather(sysfs: Sysfs, tcx: TcxQuery, numa_topology: bool = False) -> HostFacts:
    """Read links, addresses, tc/tcx programs, sysfs and RDMA facts of the calling
    thread's network namespace (and the NUMA distances and sockets when
    ``numa_topology``). Blocking."""
    with rtnl.Netlink() as nl:
        links = nl.links()
        addrs: dict[int, list[str]] = defaultdict(list)
        for a in nl.addrs():
            addrs[a.index].append(a.cidr)
        tc = _tc_filters(nl, links)
    tcx_progs: dict[int, tuple[list[str], bool]] = {}
    for link in links:
        if link.is_loopback:
            continue
        names, found = tcx.programs(link.index)
        if found:
            tcx_progs[link.index] = (names, found)
    net = {link.name: sysfs.netdev(link.name) for link in links if not link.is_loopback}
    pci = sysfs.pci_functions() if sysfs.pci_devices.exists() else []
    return HostFacts(
        links=links,
        addrs=addrs,
        tc=tc,
        tcx=tcx_progs,
        net=net,
        pci=pci,
        rdma_links=sysfs.rdma_links(),
        numa_nodes=sysfs.numa_node_count(),
        numa_distances=sysfs.numa_distances() if numa_topology else {},
        numa_sockets=sysfs.numa_sockets() if numa_topology else {},
    )


def _tc_filters(nl: rtnl.Netlink, links: Iterable[rtnl.Link]) -> dict[int, tuple[list[str], bool]]:
    """BPF tc filters on the ingress/egress hooks, asked only of links that have an
    ingress or clsact qdisc: the only ones that can hold filters there."""
    hooks = {q.index for q in nl.qdiscs() if q.kind in ("clsact", "ingress")}
    known = {link.index for link in links}
    out: dict[int, tuple[list[str], bool]] = {}
    for index in sorted(hooks & known):
        names: set[str] = set()
        found = False
        for parent in (rtnl.TC_H_MIN_INGRESS, rtnl.TC_H_MIN_EGRESS):
            for f in nl.tc_filters(index, parent):
                if f.kind != "bpf":
                    continue
                found = True
                if f.bpf_name:
                    names.add(f.bpf_name)
        if found:
            out[index] = (sorted(names), True)
    return out


def excluded_uplinks() -> frozenset[str]:
    """Default-gateway uplinks of the main table (lowest metric per family, ECMP
    ties kept) and every link enslaved under them, transitively (dranet's
    getExcludedUplinkInterfaces). Blocking."""
    with rtnl.Netlink() as nl:
        routes = [r for r in nl.routes() if r.table == rtnl.RT_TABLE_MAIN and r.dst_len == 0]
        links = nl.links()
    by_index = {link.index: link for link in links}
    best: dict[int, tuple[int, set[int]]] = {}
    for r in routes:
        if r.family not in (socket.AF_INET, socket.AF_INET6):
            continue
        oifs = list(r.oifs) if r.oifs else [r.oif]
        for oif in oifs:
            if oif not in by_index:
                continue
            metric, winners = best.get(r.family, (2**32, set()))
            if r.priority < metric:
                best[r.family] = (r.priority, {oif})
            elif r.priority == metric:
                winners.add(oif)
    seeds = [i for _metric, winners in best.values() for i in winners]
    children: dict[int, list[int]] = defaultdict(list)
    for link in links:
        if link.master:
            children[link.master].append(link.index)
    excluded: set[int] = set(seeds)
    queue = list(seeds)
    while queue:
        for child in children.pop(queue.pop(), []):
            if child not in excluded:
                excluded.add(child)
                queue.append(child)
    return frozenset(by_index[i].name for i in excluded)
