"""sysfs readers against a tree laid out like a real Mellanox host."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.inventory.sysfs import NetSysfs, RdmaLink, Sysfs, pci_address_from_path, rdma_device_for_netdev
from tests.unit.inventory.fakesys import FakeSys, mellanox_host


@pytest.fixture
def host(tmp_path: Path) -> tuple[FakeSys, Sysfs]:
    fs = mellanox_host(tmp_path / "sys", tmp_path / "dev")
    fs.netdev("veth0")
    return fs, Sysfs(tmp_path / "sys", tmp_path / "dev")


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/ens1f0np0", "0000:3b:00.0"),
        ("/sys/devices/pci0000:00/0000:00:04.0/virtio1/net/eth0", "0000:00:04.0"),
        ("/sys/devices/virtual/net/veth0", ""),
        ("/sys/devices/platform/00:05.0/net/x", "00:05.0"),
        ("", ""),
    ],
)
def test_pci_address_from_path(path: str, want: str) -> None:
    assert pci_address_from_path(path) == want


def test_netdev_pf(host: tuple[FakeSys, Sysfs]) -> None:
    _, sysfs = host
    assert sysfs.netdev("ens1f0np0") == NetSysfs(
        pci_address="0000:3b:00.0",
        virtual=False,
        sriov_totalvfs=8,
        sriov_numvfs=2,
        is_vf=False,
        pf_ifname="",
        rdma_devices=("mlx5_0",),
    )


def test_netdev_vf_knows_its_pf(host: tuple[FakeSys, Sysfs]) -> None:
    _, sysfs = host
    got = sysfs.netdev("ens1f0v0")
    assert (got.pci_address, got.is_vf, got.pf_ifname, got.sriov_totalvfs) == (
        "0000:3b:00.2",
        True,
        "ens1f0np0",
        0,
    )


def test_netdev_virtual_and_missing(host: tuple[FakeSys, Sysfs]) -> None:
    _, sysfs = host
    assert sysfs.netdev("veth0") == NetSysfs(virtual=True)
    # Not in sysfs at all (e.g. sysfs not remounted for this netns): neither PCI nor virtual.
    assert sysfs.netdev("nothere") == NetSysfs(virtual=False)


def test_pci_functions(host: tuple[FakeSys, Sysfs]) -> None:
    _, sysfs = host
    fns = {f.address: f for f in sysfs.pci_functions()}
    assert sorted(fns) == ["0000:00:05.0", "0000:3b:00.0", "0000:3b:00.2", "0000:5e:00.0", "0000:af:00.0"]
    pf = fns["0000:3b:00.0"]
    assert (pf.vendor_id, pf.device_id, pf.subsystem_device_id, pf.driver) == (
        "15b3",
        "1017",
        "0020",
        "mlx5_core",
    )
    assert (pf.numa_node, pf.pcie_root, pf.rdma_devices, pf.is_network, pf.allocatable) == (
        0,
        "pci0000:3a",
        ("mlx5_0",),
        True,
        True,
    )
    ib = fns["0000:5e:00.0"]
    assert (ib.class_code, ib.numa_node, ib.pcie_root, ib.is_network) == (0x020700, 1, "pci0000:5d", True)
    assert not fns["0000:af:00.0"].allocatable  # vfio-pci
    erdma = fns["0000:00:05.0"]
    assert (erdma.is_network, erdma.numa_node, erdma.pcie_root) == (False, None, "pci0000:00")


def test_pci_ids_from_modalias_when_files_are_missing(host: tuple[FakeSys, Sysfs]) -> None:
    fs, sysfs = host
    for name in ("class", "vendor", "device", "subsystem_vendor", "subsystem_device"):
        (fs.devices["0000:3b:00.2"] / name).unlink()
    vf = sysfs.pci_function("0000:3b:00.2")
    assert vf is not None
    assert (vf.vendor_id, vf.device_id, vf.subsystem_device_id, vf.class_code) == (
        "15b3",
        "1018",
        "0020",
        0x020000,
    )


def test_numa_nodes(host: tuple[FakeSys, Sysfs]) -> None:
    assert host[1].numa_node_count() == 2
    # Without distance or CPU files (the default tree) nothing is known.
    assert host[1].numa_distances() == {} and host[1].numa_sockets() == {}


def test_numa_distances_and_sockets(host: tuple[FakeSys, Sysfs]) -> None:
    fs, sysfs = host
    fs.numa_nodes(4)
    fs.numa_topology(
        [[10, 12, 20, 20], [12, 10, 20, 20], [20, 20, 10, 12], [20, 20, 12, 10]], [0, 0, 1, None]
    )
    assert sysfs.numa_distances() == {
        0: (10, 12, 20, 20),
        1: (12, 10, 20, 20),
        2: (20, 20, 10, 12),
        3: (20, 20, 12, 10),
    }
    # node 3 has no CPU (a memory-only node): its socket is unknown
    assert sysfs.numa_sockets() == {0: 0, 1: 0, 2: 1}
    (fs.root / "devices/system/node/node1/distance").write_text("10 x\n")
    (fs.root / "devices/system/node/node2/cpulist").write_text("0-1,junk\n")
    assert 1 not in sysfs.numa_distances() and 2 not in sysfs.numa_sockets()


def test_rdma_links(host: tuple[FakeSys, Sysfs]) -> None:
    _, sysfs = host
    links = {link.name: link for link in sysfs.rdma_links()}
    assert sorted(links) == ["erdma_0", "mlx5_0", "mlx5_1", "mlx5_2"]
    assert links["mlx5_0"].pci_address == "0000:3b:00.0" and links["mlx5_0"].netdevs == ("ens1f0np0",)
    assert links["mlx5_1"].netdevs == () and links["mlx5_1"].node_guid == bytes.fromhex("0c42a10300160551")
    assert links["erdma_0"].pci_address == "0000:00:05.0"


@pytest.mark.parametrize(
    ("ifname", "encap", "mac", "net", "want"),
    [
        # RoCE: the GID table names the netdev.
        ("ens1f0np0", "ether", "02:00:00:00:00:01", NetSysfs(), "mlx5_0"),
        # IPoIB: node GUID == last 8 bytes of the 20-byte hardware address.
        (
            "ib0",
            "infiniband",
            "00:00:10:49:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:16:05:51",
            NetSysfs(),
            "mlx5_1",
        ),
        # Neither: the first RDMA device under the netdev's PCI function.
        ("eth9", "ether", "02:00:00:00:00:09", NetSysfs(rdma_devices=("mlx5_7", "mlx5_8")), "mlx5_7"),
        ("eth9", "ether", "02:00:00:00:00:09", NetSysfs(), ""),
    ],
)
def test_rdma_device_for_netdev(ifname: str, encap: str, mac: str, net: NetSysfs, want: str) -> None:
    links = [
        RdmaLink("mlx5_0", "0000:3b:00.0", bytes.fromhex("0c42a1030016054c"), ("ens1f0np0",)),
        RdmaLink("mlx5_1", "0000:5e:00.0", bytes.fromhex("0c42a10300160551"), ()),
    ]
    assert rdma_device_for_netdev(ifname, encap, mac, net, links) == want


@pytest.mark.root
def test_rdma_char_devices(host: tuple[FakeSys, Sysfs]) -> None:
    fs, sysfs = host
    fs.dev_char("uverbs0", 231, 192)
    fs.dev_char("umad0", 231, 0)
    fs.dev_char("issm0", 231, 64)
    fs.dev_char("rdma_cm", 10, 58)
    got = [(c.path, c.type, c.major, c.minor) for c in sysfs.rdma_char_devices("mlx5_0")]
    assert got == [
        ("/dev/infiniband/issm0", "c", 231, 64),
        ("/dev/infiniband/umad0", "c", 231, 0),
        ("/dev/infiniband/uverbs0", "c", 231, 192),
        ("/dev/infiniband/rdma_cm", "c", 10, 58),
    ]
    # mlx5_2's uverbs2 has no device file under /dev: only rdma_cm remains.
    assert [c.path for c in sysfs.rdma_char_devices("mlx5_2")] == ["/dev/infiniband/rdma_cm"]
    # A regular file is not a device.
    (fs.dev / "infiniband" / "uverbs1").write_text("")
    assert sysfs.char_device("uverbs1") is None
