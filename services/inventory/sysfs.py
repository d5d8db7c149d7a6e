"""What sysfs says about netdevs, PCI functions and RDMA devices.

Every path is taken under a root (``--sysfs-root``, default /sys) so tests can
point the inventory at a tree built from real layouts. Reads that fail mean "not
there": sysfs entries come and go while devices move between namespaces.

Layouts used (kernel Documentation/ABI):
  class/net/<if>                 -> ../../devices/<pci path>/<bdf>/net/<if>, or
                                    ../../devices/virtual/net/<if>
  class/net/<if>/device          -> the PCI function (absent for virtual links)
  bus/pci/devices/<bdf>          -> ../../../devices/pci<dom>:<bus>/.../<bdf>
  <bdf>/{class,vendor,device,subsystem_vendor,subsystem_device,numa_node}
  <bdf>/driver -> .../drivers/<name>; <bdf>/sriov_{totalvfs,numvfs};
  <bdf>/physfn (a VF), <bdf>/virtfnN (a PF), <bdf>/net/<if>, <bdf>/infiniband/<rdma>
  class/infiniband/<rdma>/device -> the PCI function
  class/infiniband/<rdma>/ports/<n>/gid_attrs/ndevs/<i>   (RoCE netdev names)
  class/infiniband/<rdma>/node_guid                        (IB: matches IPoIB MACs)
  class/infiniband_verbs/uverbsN/ibdev, class/infiniband_mad/{umadN,issmN}/ibdev,
  class/infiniband_cm/ucmN/ibdev -> /dev/infiniband/<same name>
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# A PCI address in a sysfs path component: [domain:]bus:device.function.
_PCI_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-9a-fA-F])$")
_PCI_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$")

# Kernel drivers that bind a PCI NIC without ever making a netdev or RDMA link
# (userspace I/O and passthrough); dranet does not publish such functions.
NON_NETDEV_DRIVERS = frozenset({"vfio-pci", "uio_pci_generic", "igb_uio", "pci-stub"})

# RDMA character device classes: (sysfs class dir, file name prefix), in the
# order dranet (rdmamap) lists them.
RDMA_CHAR_CLASSES = (
    ("infiniband_cm", "ucm"),
    ("infiniband_mad", "issm"),
    ("infiniband_mad", "umad"),
    ("infiniband_verbs", "uverbs"),
)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path, base: int = 10) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        log.debug("unparsable sysfs value", extra={"path": str(path), "value": text})
        return None


def _first_cpu(cpulist: str | None) -> int | None:
    """The lowest CPU of a kernel cpulist ("0-3,8-11"); None when empty or unparsable.
    (Every CPU of a node is on one socket, so which one is read does not matter.)"""
    cpus: list[int] = []
    for part in (cpulist or "").split(","):
        part = part.strip()
        if not part:
            continue
        first, _, _ = part.partition("-")
        try:
            cpus.append(int(first))
        except ValueError:
            return None
    return min(cpus) if cpus else None


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _link_target(link: Path) -> str:
    """Where the symlink ``link`` points, as an absolute path ("" if unreadable)."""
    try:
        dst = os.readlink(link)
    except OSError:
        return ""
    return os.path.normpath(os.path.join(link.parent, dst))


def _rdma_devices(device_dir: Path) -> tuple[str, ...]:
    """The RDMA devices of a PCI function (the directories under its infiniband/)."""
    return tuple(n for n in _listdir(device_dir / "infiniband") if (device_dir / "infiniband" / n).is_dir())


def _hex_id(text: str | None) -> str:
    """ "0x15b3\\n" -> "15b3"."""
    if not text:
        return ""
    text = text.strip().lower()
    return text[2:] if text.startswith("0x") else text


def pci_address_from_path(path: str) -> str:
    """The last component of ``path`` that is a PCI address, or ""."""
    for part in reversed(path.split("/")):
        if _PCI_ADDRESS.match(part):
            return part
    return ""


@dataclass(frozen=True)
class NetSysfs:
    """What sysfs says about one netdev."""

    pci_address: str = ""
    virtual: bool = False
    sriov_totalvfs: int = 0
    sriov_numvfs: int = 0
    is_vf: bool = False
    pf_ifname: str = ""
    # RDMA link devices under the netdev's PCI function (device/infiniband/*).
    rdma_devices: tuple[str, ...] = ()


@dataclass(frozen=True)
class PciFunction:
    """One PCI function from bus/pci/devices."""

    address: str
    class_code: int  # 0xCCSSPP
    driver: str
    vendor_id: str
    device_id: str
    subsystem_vendor_id: str
    subsystem_device_id: str
    numa_node: int | None  # None when absent or -1 (no affinity)
    pcie_root: str  # "pci0000:00", "" when unknown
    rdma_devices: tuple[str, ...] = ()

    @property
    def is_network(self) -> bool:
        """PCI base class 0x02 (network controller: Ethernet, InfiniBand, ...)."""
        return (self.class_code >> 16) == 0x02

    @property
    def allocatable(self) -> bool:
        """A bound driver that makes a netdev or RDMA link (dranet's rule)."""
        return bool(self.driver) and self.driver not in NON_NETDEV_DRIVERS


@dataclass(frozen=True)
class RdmaLink:
    """One entry of class/infiniband."""

    name: str
    pci_address: str  # "" when the device has no PCI parent (e.g. rxe, siw)
    node_guid: bytes = b""
    # (port, netdev name) pairs from ports/*/gid_attrs/ndevs/*.
    netdevs: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class CharDevice:
    """A device file found under /dev/infiniband."""

    path: str  # the path in the container's /dev, e.g. /dev/infiniband/uverbs0
    type: str  # "c" or "b"
    major: int
    minor: int
    file_mode: int
    uid: int
    gid: int


class Sysfs:
    """Readers over one sysfs root (and the /dev root for RDMA device files)."""

    def __init__(self, root: str | os.PathLike[str] = "/sys", dev_root: str | os.PathLike[str] = "/dev"):
        self.root = Path(root)
        self.dev_root = Path(dev_root)
        self.class_net = self.root / "class" / "net"
        self.pci_devices = self.root / "bus" / "pci" / "devices"
        self.class_ib = self.root / "class" / "infiniband"

    # --- netdevs ---------------------------------------------------------------------------------

    def _net_target(self, ifname: str) -> str:
        """Where class/net/<if> points, as an absolute path (or "" if unreadable)."""
        return _link_target(self.class_net / ifname)

    def netdev(self, ifname: str) -> NetSysfs:
        """PCI address, virtual flag, SR-IOV facts and RDMA links of a netdev."""
        target = self._net_target(ifname)
        virtual = target.startswith(str(self.root / "devices" / "virtual") + os.sep)
        pci = pci_address_from_path(target) if target and not virtual else ""
        if not pci:
            return NetSysfs(virtual=virtual)
        dev = self.class_net / ifname / "device"
        total = _read_int(dev / "sriov_totalvfs") or 0
        numvfs = (_read_int(dev / "sriov_numvfs") or 0) if total else 0
        is_vf = os.path.islink(dev / "physfn")
        pf = ""
        if is_vf:
            pf_nets = _listdir(dev / "physfn" / "net")
            pf = pf_nets[0] if pf_nets else ""
        rdma = _rdma_devices(dev)
        return NetSysfs(
            pci_address=pci,
            virtual=False,
            sriov_totalvfs=total,
            sriov_numvfs=numvfs,
            is_vf=is_vf,
            pf_ifname=pf,
            rdma_devices=rdma,
        )

    # --- PCI -------------------------------------------------------------------------------------

    def numa_node_count(self) -> int:
        """NUMA nodes of the machine (devices/system/node/nodeN)."""
        return len(self._numa_nodes())

    def _numa_nodes(self) -> list[int]:
        nodes = self.root / "devices" / "system" / "node"
        return sorted(int(n[4:]) for n in _listdir(nodes) if re.fullmatch(r"node\d+", n))

    def numa_distances(self) -> dict[int, tuple[int, ...]]:
        """Each NUMA node's ACPI SLIT row (devices/system/node/node<n>/distance); a node
        whose row is missing, empty or unparsable is left out."""
        out: dict[int, tuple[int, ...]] = {}
        for n in self._numa_nodes():
            text = _read(self.root / "devices" / "system" / "node" / f"node{n}" / "distance")
            try:
                row = tuple(int(f) for f in (text or "").split())
            except ValueError:
                log.debug("unparsable NUMA distances", extra={"node": n, "value": text})
                continue
            if row:
                out[n] = row
        return out

    def numa_sockets(self) -> dict[int, int]:
        """NUMA node -> the physical package of its lowest CPU (node<n>/cpulist, then
        cpu<c>/topology/physical_package_id); a node without CPUs (memory only) or
        unreadable topology is left out."""
        out: dict[int, int] = {}
        system = self.root / "devices" / "system"
        for n in self._numa_nodes():
            cpu = _first_cpu(_read(system / "node" / f"node{n}" / "cpulist"))
            if cpu is None:
                continue
            package = _read_int(system / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id")
            if package is not None:
                out[n] = package
        return out

    def pci_function(self, address: str) -> PciFunction | None:
        """The PCI function at ``address`` (full domain form), or None if absent."""
        d = self.pci_devices / address
        if not d.exists():
            return None
        class_code = _read_int(d / "class", 16)
        vendor, device = _hex_id(_read(d / "vendor")), _hex_id(_read(d / "device"))
        sub_vendor = _hex_id(_read(d / "subsystem_vendor"))
        sub_device = _hex_id(_read(d / "subsystem_device"))
        if class_code is None or not vendor:
            modalias = _parse_modalias(_read(d / "modalias"))
            if modalias is None:
                return None
            vendor, device, sub_vendor, sub_device, class_code = modalias
        driver = os.path.basename(_link_target(d / "driver"))
        numa = _read_int(d / "numa_node")
        rdma = _rdma_devices(d)
        return PciFunction(
            address=address,
            class_code=class_code,
            driver=driver,
            vendor_id=vendor,
            device_id=device,
            subsystem_vendor_id=sub_vendor,
            subsystem_device_id=sub_device,
            numa_node=numa if numa is not None and numa >= 0 else None,
            pcie_root=self.pcie_root(address),
            rdma_devices=rdma,
        )

    def pci_functions(self) -> list[PciFunction]:
        """Every PCI function of the machine."""
        out = []
        for address in _listdir(self.pci_devices):
            fn = self.pci_function(address)
            if fn is not None:
                out.append(fn)
        return out

    def pcie_root(self, address: str) -> str:
        """The PCIe root complex of a function ("pci0000:00"), from where
        bus/pci/devices/<bdf> points under devices/; "" when not resolvable."""
        if not _PCI_BDF.match(address):
            return ""
        target = _link_target(self.pci_devices / address)
        if not target:
            return ""
        rel = os.path.relpath(target, self.root / "devices")
        parts = rel.split(os.sep)
        if rel.startswith("..") or not parts[0].startswith("pci") or parts[-1] != address:
            return ""
        return parts[0]

    # --- RDMA ------------------------------------------------------------------------------------

    def rdma_links(self) -> list[RdmaLink]:
        """Every RDMA device in class/infiniband (visible from every netns)."""
        out = []
        for name in _listdir(self.class_ib):
            base = self.class_ib / name
            try:
                resolved = os.path.realpath(base / "device")
            except OSError:
                resolved = ""
            pci = pci_address_from_path(resolved) if os.path.exists(base / "device") else ""
            netdevs: list[str] = []
            for port in _listdir(base / "ports"):
                ndevs = base / "ports" / port / "gid_attrs" / "ndevs"
                for idx in _listdir(ndevs):
                    val = _read(ndevs / idx)
                    if val and val not in netdevs:
                        netdevs.append(val)
            out.append(
                RdmaLink(
                    name=name,
                    pci_address=pci,
                    node_guid=_parse_guid(_read(base / "node_guid")),
                    netdevs=tuple(netdevs),
                )
            )
        return out

    def rdma_char_devices(self, rdma_device: str) -> list[CharDevice]:
        """rdma_cm plus the ucm/issm/umad/uverbs files of ``rdma_device`` that exist,
        with their device numbers."""
        names: list[str] = []
        for class_dir, prefix in RDMA_CHAR_CLASSES:
            base = self.root / "class" / class_dir
            for entry in _listdir(base):
                if not entry.startswith(prefix):
                    continue
                # An exact match: rdmamap's substring test confuses mlx5_1 and mlx5_10.
                if _read(base / entry / "ibdev") == rdma_device:
                    names.append(entry)
                    break
        names.append("rdma_cm")
        out = []
        for name in names:
            cd = self.char_device(name)
            if cd is not None:
                out.append(cd)
        return out

    def char_device(self, name: str) -> CharDevice | None:
        """/dev/infiniband/<name> with its numbers, or None if absent or not a device."""
        path = self.dev_root / "infiniband" / name
        try:
            st = os.stat(path)
        except OSError:
            return None
        if stat.S_ISCHR(st.st_mode):
            kind = "c"
        elif stat.S_ISBLK(st.st_mode):
            kind = "b"
        else:
            return None
        return CharDevice(
            path=f"/dev/infiniband/{name}",
            type=kind,
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            file_mode=stat.S_IMODE(st.st_mode),
            uid=st.st_uid,
            gid=st.st_gid,
        )


def rdma_device_for_netdev(
    ifname: str, encapsulation: str, mac: str, net: NetSysfs, links: Iterable[RdmaLink]
) -> str:
    """The RDMA link of a netdev, as dranet finds it: RoCE by the GID table's netdev
    names, IPoIB by node GUID against the last 8 bytes of the 20-byte hardware
    address, else the first RDMA device under the netdev's PCI function."""
    links = list(links)
    if encapsulation == "ether":
        for link in links:
            if ifname in link.netdevs:
                return link.name
    elif encapsulation == "infiniband" and mac:
        raw = bytes(int(b, 16) for b in mac.split(":"))
        if len(raw) == 20:
            for link in links:
                if link.node_guid and link.node_guid == raw[12:]:
                    return link.name
    return net.rdma_devices[0] if net.rdma_devices else ""


def _parse_guid(text: str | None) -> bytes:
    """ "0c42:a103:0016:054c" -> 8 bytes; b"" when absent or malformed."""
    if not text:
        return b""
    try:
        raw = bytes.fromhex(text.replace(":", ""))
    except ValueError:
        return b""
    return raw if len(raw) == 8 else b""


def _parse_modalias(text: str | None) -> tuple[str, str, str, str, int] | None:
    """pci:v000015B3d00001017sv000015B3sd00000007bc02sc00i00 -> ids and class."""
    if not text:
        return None
    m = re.match(
        r"^pci:v0000([0-9A-Fa-f]{4})d0000([0-9A-Fa-f]{4})sv0000([0-9A-Fa-f]{4})sd0000([0-9A-Fa-f]{4})"
        r"bc([0-9A-Fa-f]{2})sc([0-9A-Fa-f]{2})i([0-9A-Fa-f]{2})",
        text,
    )
    if not m:
        return None
    v, d, sv, sd, bc, sc, pi = (g.lower() for g in m.groups())
    return v, d, sv, sd, int(bc + sc + pi, 16)
