"""dranet's device attributes: names, value rules and the per-device limits.

Names and types follow dranet pkg/apis/attributes.go and pkg/inventory/db.go;
the two standardized topology attributes are the ones dranet adds through
k8s.io/dynamic-resource-allocation/deviceattribute. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Mapping, Sequence

from shared.deviceattr import ATTRIBUTE_MAX_VALUE_LENGTH, Attribute

log = logging.getLogger(__name__)

PREFIX = "dra.net"
IF_NAME = f"{PREFIX}/ifName"
PCI_ADDRESS = f"{PREFIX}/pciAddress"
MAC = f"{PREFIX}/mac"
PCI_VENDOR = f"{PREFIX}/pciVendor"
PCI_DEVICE = f"{PREFIX}/pciDevice"
PCI_SUBSYSTEM = f"{PREFIX}/pciSubsystem"
NUMA_NODE = f"{PREFIX}/numaNode"
MTU = f"{PREFIX}/mtu"
ENCAPSULATION = f"{PREFIX}/encapsulation"
ALIAS = f"{PREFIX}/alias"
STATE = f"{PREFIX}/state"
TYPE = f"{PREFIX}/type"
IPV4 = f"{PREFIX}/ipv4"
IPV6 = f"{PREFIX}/ipv6"
TC_FILTER_NAMES = f"{PREFIX}/tcFilterNames"
TCX_PROGRAM_NAMES = f"{PREFIX}/tcxProgramNames"
EBPF = f"{PREFIX}/ebpf"
SRIOV = f"{PREFIX}/sriov"
SRIOV_VFS = f"{PREFIX}/sriovVfs"
IS_SRIOV_VF = f"{PREFIX}/isSriovVf"
VIRTUAL = f"{PREFIX}/virtual"
RDMA = f"{PREFIX}/rdma"
RDMA_DEVICE = f"{PREFIX}/rdmaDevice"

# Standardized attributes (k8s deviceattribute helpers), as dranet publishes them.
STANDARD_NUMA_NODE = "resource.kubernetes.io/numaNode"
STANDARD_PCIE_ROOT = "resource.kubernetes.io/pcieRoot"

# attributes.go order; also the keep-order when a device has more than the API allows.
DRANET_ATTRIBUTES = (
    IF_NAME,
    PCI_ADDRESS,
    MAC,
    PCI_VENDOR,
    PCI_DEVICE,
    PCI_SUBSYSTEM,
    NUMA_NODE,
    MTU,
    ENCAPSULATION,
    ALIAS,
    STATE,
    TYPE,
    IPV4,
    IPV6,
    TC_FILTER_NAMES,
    TCX_PROGRAM_NAMES,
    EBPF,
    SRIOV,
    SRIOV_VFS,
    IS_SRIOV_VF,
    VIRTUAL,
    RDMA,
    RDMA_DEVICE,
)
STANDARD_ATTRIBUTES = (STANDARD_NUMA_NODE, STANDARD_PCIE_ROOT)
_RANK = {name: i for i, name in enumerate(DRANET_ATTRIBUTES + STANDARD_ATTRIBUTES)}

# resource.k8s.io/v1 ResourceSliceMaxAttributesAndCapacitiesPerDevice.
MAX_ATTRIBUTES_PER_DEVICE = 32


def string(value: str) -> Attribute:
    return Attribute.of_string(value)


def integer(value: int) -> Attribute:
    return Attribute.of_int(value)


def boolean(value: bool) -> Attribute:
    return Attribute.of_bool(value)


def is_global_unicast(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Go's net.IP.IsGlobalUnicast, which dranet uses to pick addresses: private
    ranges count, loopback, link-local, multicast, unspecified and broadcast do not."""
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_link_local:
        return False
    return not (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"))


def join_within(values: Iterable[str], limit: int = ATTRIBUTE_MAX_VALUE_LENGTH) -> tuple[str, int]:
    """Comma-join ``values`` in order, stopping before the one that would make the
    result longer than ``limit`` (dranet's buildIPList); the string and how many
    values it holds."""
    out = ""
    kept = 0
    for value in values:
        add = len(value) + (1 if kept else 0)
        if len(out) + add > limit:
            break
        out = f"{out},{value}" if kept else value
        kept += 1
    return out, kept


def address_lists(cidrs: Iterable[str]) -> tuple[list[str], list[str]]:
    """The global-unicast IPv4 and IPv6 CIDRs, each de-duplicated and sorted as
    strings (dranet sorts before truncating so the cut is deterministic)."""
    v4: set[str] = set()
    v6: set[str] = set()
    for cidr in cidrs:
        try:
            iface = ipaddress.ip_interface(cidr)
        except ValueError:
            continue
        if not is_global_unicast(iface.ip):
            continue
        (v4 if iface.version == 4 else v6).add(str(iface))
    return sorted(v4), sorted(v6)


def fit_string(value: str) -> str:
    """A string attribute value cut to the API's 64 characters (a longer one makes
    the API server refuse the whole ResourceSlice)."""
    return value[:ATTRIBUTE_MAX_VALUE_LENGTH]


def numa_node_list(
    node: int, distances: Mapping[int, Sequence[int]], sockets: Mapping[int, int]
) -> list[int]:
    """resource.kubernetes.io/numaNode in list form (DRAListTypeAttributes), as the
    Kubernetes deviceattribute helper builds it for dranet: the device's NUMA node first,
    then, ascending, every other node at the smallest ACPI SLIT distance from it, except
    one known to be on another socket (a node whose socket is unknown stays in).

    ``distances[n]`` is node n's SLIT row (devices/system/node/node<n>/distance, one
    entry per node, in node order); ``sockets[n]`` the physical package of node n's
    first CPU. A node without a readable row, or one that is out of its own row, is
    published alone."""
    row = distances.get(node)
    if not row or node >= len(row):
        return [node]
    others = [d for i, d in enumerate(row) if i != node]
    if not others:
        return [node]
    nearest = min(others)
    socket = sockets.get(node)
    peers = []
    for i, d in enumerate(row):
        if i == node or d != nearest:
            continue
        if socket is not None and i in sockets and sockets[i] != socket:
            continue
        peers.append(i)
    return [node, *sorted(peers)]


def limit_attributes(attrs: Mapping[str, Attribute]) -> tuple[dict[str, Attribute], list[str]]:
    """At most MAX_ATTRIBUTES_PER_DEVICE attributes: dranet's own first (in
    attributes.go order), then the standardized ones, then provider attributes by
    name. Returns the kept attributes and the names dropped."""
    ordered = sorted(attrs, key=lambda k: (_RANK.get(k, len(_RANK)), k))
    keep = ordered[:MAX_ATTRIBUTES_PER_DEVICE]
    dropped = ordered[MAX_ATTRIBUTES_PER_DEVICE:]
    return {k: attrs[k] for k in keep}, dropped
