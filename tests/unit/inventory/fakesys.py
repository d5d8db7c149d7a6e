"""A fake sysfs (and /dev/infiniband) tree laid out like a real host's.

The layouts copy what a host with a Mellanox ConnectX NIC shows (kernel
Documentation/ABI/testing/sysfs-bus-pci, sysfs-class-net, sysfs-class-infiniband):

  class/net/ens1f0np0          -> ../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/ens1f0np0
  class/net/<if>/device        -> ../../../0000:3b:00.0
  bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0
  <bdf>/driver                 -> ../../../../bus/pci/drivers/mlx5_core
  <vf bdf>/physfn -> ../0000:3b:00.0, <pf bdf>/virtfn0 -> ../0000:3b:00.2
  class/infiniband/mlx5_0      -> ../../devices/.../0000:3b:00.0/infiniband/mlx5_0
  class/infiniband/mlx5_0/device -> ../../../0000:3b:00.0
  class/infiniband_verbs/uverbs0 -> ../../devices/.../0000:3b:00.0/infiniband_verbs/uverbs0 (ibdev: mlx5_0)
  class/infiniband_mad/umad0     -> ../../devices/.../0000:3b:00.0/infiniband_mad/umad0 (ibdev: mlx5_0)
  devices/virtual/net/<if> for links without a device
"""

from __future__ import annotations

import os
from pathlib import Path

# A small slice of the pci.ids format (vendor, tab device, two-tab subsystem).
PCI_IDS = """\
# test database
15b3  Mellanox Technologies
\t1017  MT27800 Family [ConnectX-5]
\t1018  MT27800 Family [ConnectX-5 Virtual Function]
\t\t15b3 0020  ConnectX-5 VF
\t101b  MT28908 Family [ConnectX-6]
8086  Intel Corporation
\t1592  Ethernet Controller E810-C for QSFP
C 02  Network controller
\t00  Ethernet controller
"""


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    os.symlink(target, path)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _rel(src_dir: Path, dst: Path) -> str:
    return os.path.relpath(dst, src_dir)


class FakeSys:
    """Builds the tree under ``root`` (sysfs) and ``dev`` (/dev)."""

    def __init__(self, root: Path, dev: Path | None = None) -> None:
        self.root = root
        self.dev = dev or root.parent / "dev"
        self.devices: dict[str, Path] = {}
        for d in ("class/net", "bus/pci/devices", "devices/virtual/net", "devices/system/node/node0"):
            (root / d).mkdir(parents=True, exist_ok=True)

    def numa_nodes(self, n: int) -> None:
        for i in range(n):
            (self.root / "devices/system/node" / f"node{i}").mkdir(parents=True, exist_ok=True)

    def numa_topology(
        self, distances: list[list[int]], sockets: list[int | None], cpus_per_node: int = 2
    ) -> None:
        """node<i>/distance (the SLIT row), node<i>/cpulist and each CPU's physical package:
        node i has CPUs i*cpus_per_node.. on socket ``sockets[i]``, or no CPU when None."""
        system = self.root / "devices/system"
        for i, row in enumerate(distances):
            node = system / "node" / f"node{i}"
            _write(node / "distance", " ".join(str(d) for d in row) + "\n")
            package = sockets[i]
            if package is None:
                _write(node / "cpulist", "\n")
                continue
            first = i * cpus_per_node
            _write(node / "cpulist", f"{first}-{first + cpus_per_node - 1}\n")
            for cpu in range(first, first + cpus_per_node):
                _write(system / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id", f"{package}\n")

    def pci(
        self,
        bdf: str,
        *,
        bridge: str = "pci0000:3a/0000:3a:00.0",
        class_code: int = 0x020000,
        vendor: str = "15b3",
        device: str = "1017",
        subsystem_vendor: str = "15b3",
        subsystem_device: str = "0020",
        numa_node: int = 0,
        driver: str | None = "mlx5_core",
        totalvfs: int | None = None,
        numvfs: int = 0,
    ) -> Path:
        """A PCI function under ``bridge`` (root complex first)."""
        d = self.root / "devices" / bridge / bdf
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "class", f"0x{class_code:06x}\n")
        _write(d / "vendor", f"0x{vendor}\n")
        _write(d / "device", f"0x{device}\n")
        _write(d / "subsystem_vendor", f"0x{subsystem_vendor}\n")
        _write(d / "subsystem_device", f"0x{subsystem_device}\n")
        _write(d / "numa_node", f"{numa_node}\n")
        bc, sc, pi = class_code >> 16, (class_code >> 8) & 0xFF, class_code & 0xFF
        _write(
            d / "modalias",
            f"pci:v0000{vendor.upper()}d0000{device.upper()}sv0000{subsystem_vendor.upper()}"
            f"sd0000{subsystem_device.upper()}bc{bc:02X}sc{sc:02X}i{pi:02X}\n",
        )
        if driver:
            drv = self.root / "bus/pci/drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            _link(d / "driver", _rel(d, drv))
        if totalvfs is not None:
            _write(d / "sriov_totalvfs", f"{totalvfs}\n")
            _write(d / "sriov_numvfs", f"{numvfs}\n")
        _link(self.root / "bus/pci/devices" / bdf, _rel(self.root / "bus/pci/devices", d))
        self.devices[bdf] = d
        return d

    def vf(self, pf: str, vf: str, index: int) -> None:
        """Link VF ``vf`` to its PF (both made with ``pci``)."""
        _link(self.devices[vf] / "physfn", f"../{pf}")
        _link(self.devices[pf] / f"virtfn{index}", f"../{vf}")

    def netdev(self, ifname: str, bdf: str | None = None) -> None:
        """class/net/<ifname>, under PCI function ``bdf`` or devices/virtual/net."""
        if bdf is None:
            d = self.root / "devices/virtual/net" / ifname
            d.mkdir(parents=True, exist_ok=True)
        else:
            d = self.devices[bdf] / "net" / ifname
            d.mkdir(parents=True, exist_ok=True)
            _link(d / "device", _rel(d, self.devices[bdf]))
        _write(d / "ifindex", "0\n")
        _link(self.root / "class/net" / ifname, _rel(self.root / "class/net", d))

    def rdma(
        self, name: str, bdf: str, *, netdev: str | None = None, node_guid: str = "0c42:a103:0016:054c"
    ) -> None:
        """An RDMA link device under ``bdf``; ``netdev`` fills its port 1 GID table (RoCE)."""
        d = self.devices[bdf] / "infiniband" / name
        (d / "ports/1/gid_attrs/ndevs").mkdir(parents=True, exist_ok=True)
        if netdev:
            _write(d / "ports/1/gid_attrs/ndevs/0", f"{netdev}\n")
            _write(d / "ports/1/gid_attrs/ndevs/1", f"{netdev}\n")
        _write(d / "node_guid", f"{node_guid}\n")
        _link(d / "device", _rel(d, self.devices[bdf]))
        _link(self.root / "class/infiniband" / name, _rel(self.root / "class/infiniband", d))

    def rdma_char(self, klass: str, name: str, bdf: str, ibdev: str) -> None:
        """class/<klass>/<name> (infiniband_verbs/uverbsN, infiniband_mad/umadN, ...)."""
        d = self.devices[bdf] / klass / name
        _write(d / "ibdev", f"{ibdev}\n")
        _link(self.root / "class" / klass / name, _rel(self.root / "class" / klass, d))

    def dev_char(self, name: str, major: int, minor: int) -> Path:
        """/dev/infiniband/<name> as a real character device (needs CAP_MKNOD)."""
        path = self.dev / "infiniband" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.mknod(path, 0o20666, os.makedev(major, minor))
            os.chmod(path, 0o666)  # as udev leaves them; mknod's mode went through the umask
        return path

    def pci_ids(self) -> Path:
        path = self.root.parent / "pci.ids"
        path.write_text(PCI_IDS)
        return path


def mellanox_host(root: Path, dev: Path | None = None) -> FakeSys:
    """The tree the integration and unit tests share: a 2-NUMA host with

    * 0000:3b:00.0 ConnectX-5 PF, netdev ens1f0np0, SR-IOV 8 total / 2 enabled,
      RDMA mlx5_0 (RoCE on ens1f0np0), uverbs0 + umad0 + issm0;
    * 0000:3b:00.2 its VF, netdev ens1f0v0, RDMA mlx5_2;
    * 0000:5e:00.0 ConnectX-6 InfiniBand (class 0x0207) with RDMA mlx5_1 and
      no netdev here (RDMA-only), on NUMA node 1;
    * 0000:af:00.0 an Intel E810 bound to vfio-pci (not published);
    * 0000:00:05.0 an eRDMA-style function (class 0x00ff00) with RDMA erdma_0.
    """
    fs = FakeSys(root, dev)
    fs.numa_nodes(2)
    fs.pci("0000:3b:00.0", totalvfs=8, numvfs=2)
    fs.pci("0000:3b:00.2", device="1018")
    fs.vf("0000:3b:00.0", "0000:3b:00.2", 0)
    fs.netdev("ens1f0np0", "0000:3b:00.0")
    fs.netdev("ens1f0v0", "0000:3b:00.2")
    fs.rdma("mlx5_0", "0000:3b:00.0", netdev="ens1f0np0")
    fs.rdma("mlx5_2", "0000:3b:00.2", netdev="ens1f0v0", node_guid="0c42:a103:0016:0550")
    fs.rdma_char("infiniband_verbs", "uverbs0", "0000:3b:00.0", "mlx5_0")
    fs.rdma_char("infiniband_mad", "umad0", "0000:3b:00.0", "mlx5_0")
    fs.rdma_char("infiniband_mad", "issm0", "0000:3b:00.0", "mlx5_0")
    fs.rdma_char("infiniband_verbs", "uverbs2", "0000:3b:00.2", "mlx5_2")
    fs.pci("0000:5e:00.0", bridge="pci0000:5d/0000:5d:02.0", class_code=0x020700, device="101b", numa_node=1)
    fs.rdma("mlx5_1", "0000:5e:00.0", node_guid="0c42:a103:0016:0551")
    fs.rdma_char("infiniband_verbs", "uverbs1", "0000:5e:00.0", "mlx5_1")
    fs.pci(
        "0000:af:00.0",
        bridge="pci0000:ae/0000:ae:00.0",
        vendor="8086",
        device="1592",
        subsystem_vendor="8086",
        subsystem_device="0002",
        driver="vfio-pci",
        numa_node=1,
    )
    fs.pci(
        "0000:00:05.0",
        bridge="pci0000:00",
        class_code=0x00FF00,
        vendor="1ded",
        device="107f",
        subsystem_vendor="1ded",
        subsystem_device="107f",
        driver="erdma",
        numa_node=-1,
    )
    fs.rdma("erdma_0", "0000:00:05.0")
    return fs
