"""PCI, SR-IOV, NUMA and RDMA attributes from a fake sysfs laid out like a real
Mellanox host, with real links (veth standing in for the NIC netdevs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from shared.rpc import channel
from tests.integration.inventory.helpers import StartInventory, ip, values, wait_devices
from tests.unit.inventory.fakesys import mellanox_host

pytestmark = [pytest.mark.netns, pytest.mark.root]


async def test_pci_sriov_numa_rdma(netns: str, start_inventory: StartInventory, workdir: Path) -> None:
    fs = mellanox_host(workdir / "sys", workdir / "dev")
    for peer in ("p0", "p1"):
        fs.netdev(peer)
    fs.dev_char("uverbs0", 231, 192)
    fs.dev_char("umad0", 231, 0)
    fs.dev_char("uverbs1", 231, 193)
    fs.dev_char("uverbs2", 231, 194)
    fs.dev_char("rdma_cm", 10, 58)
    ip(netns, "link", "add", "ens1f0np0", "type", "veth", "peer", "name", "p0")
    ip(netns, "link", "add", "ens1f0v0", "type", "veth", "peer", "name", "p1")
    ip(netns, "link", "set", "ens1f0np0", "mtu", "9000", "up")
    ip(netns, "link", "set", "ens1f0v0", "mtu", "1500")

    proc = start_inventory(
        netns,
        *("--sysfs-root", str(fs.root), "--dev-root", str(fs.dev), "--pci-ids", str(fs.pci_ids())),
        *("--filter", '"dra.net/pciAddress" in attributes'),
    )
    async with channel(proc.socket) as ch:
        stub = inventory_pb2_grpc.InventoryStub(ch)
        got = await wait_devices(stub, lambda d: "pci-0000-3b-00-0" in d)
        assert sorted(got) == [
            "p0",
            "p1",
            "pci-0000-00-05-0",
            "pci-0000-3b-00-0",
            "pci-0000-3b-00-2",
            "pci-0000-5e-00-0",
        ]
        assert [n for n, d in got.items() if d.published] == [
            "pci-0000-00-05-0",
            "pci-0000-3b-00-0",
            "pci-0000-3b-00-2",
            "pci-0000-5e-00-0",
        ]

        pf = values(got["pci-0000-3b-00-0"])
        assert {k: pf[k] for k in pf if k != "dra.net/mac"} == {
            "dra.net/pciAddress": "0000:3b:00.0",
            "dra.net/ifName": "ens1f0np0",
            "dra.net/mtu": 9000,
            "dra.net/encapsulation": "ether",
            "dra.net/alias": "",
            "dra.net/state": "lower-layer-down",
            "dra.net/type": "veth",
            "dra.net/ebpf": False,
            "dra.net/sriov": True,
            "dra.net/sriovVfs": 2,
            "dra.net/virtual": False,
            "dra.net/numaNode": 0,
            "dra.net/pciVendor": "Mellanox Technologies",
            "dra.net/pciDevice": "MT27800 Family [ConnectX-5]",
            "dra.net/pciSubsystem": "0020",
            "dra.net/rdma": True,
            "dra.net/rdmaDevice": "mlx5_0",
            "resource.kubernetes.io/numaNode": 0,
            "resource.kubernetes.io/pcieRoot": "pci0000:3a",
        }

        vf = await stub.GetDevice(pb.GetDeviceRequest(name="pci-0000-3b-00-2", with_snapshot=True))
        assert values(vf)["dra.net/isSriovVf"] is True and vf.is_sriov_vf
        assert (vf.pf_ifname, vf.pf_mtu, vf.snapshot.pf_ifname, vf.snapshot.pf_mtu) == (
            "ens1f0np0",
            9000,
            "ens1f0np0",
            9000,
        )
        assert [(c.path, c.type, c.major, c.minor) for c in vf.snapshot.rdma_dev_chars] == [
            ("/dev/infiniband/uverbs2", "c", 231, 194),
            ("/dev/infiniband/rdma_cm", "c", 10, 58),
        ]

        pfsnap = await stub.GetDevice(pb.GetDeviceRequest(name="pci-0000-3b-00-0", with_snapshot=True))
        assert [c.path for c in pfsnap.snapshot.rdma_dev_chars] == [
            "/dev/infiniband/umad0",
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/rdma_cm",
        ]
        assert (
            pfsnap.snapshot.rdma_device == "mlx5_0" and pfsnap.snapshot.rdma_dev_chars[0].file_mode == 0o666
        )

        ib = await stub.GetDevice(pb.GetDeviceRequest(name="pci-0000-5e-00-0", with_snapshot=True))
        assert ib.rdma_only and ib.rdma_device == "mlx5_1" and ib.ifname == ""
        assert values(ib)["dra.net/numaNode"] == 1 and "dra.net/ifName" not in values(ib)
        assert [c.path for c in ib.snapshot.rdma_dev_chars] == [
            "/dev/infiniband/uverbs1",
            "/dev/infiniband/rdma_cm",
        ]

        erdma = values(got["pci-0000-00-05-0"])
        assert (erdma["dra.net/rdmaDevice"], erdma["dra.net/pciVendor"]) == ("erdma_0", "unknown")
        assert "resource.kubernetes.io/numaNode" not in erdma  # numa_node -1: no affinity

        # The VF's netdev leaves the namespace (as when it is in a Pod): the PCI
        # device stays, without its netdev attributes.
        ip(netns, "link", "del", "ens1f0v0")
        got = await wait_devices(stub, lambda d: "dra.net/ifName" not in values(d["pci-0000-3b-00-2"]))
        assert values(got["pci-0000-3b-00-2"])["dra.net/rdmaDevice"] == "mlx5_2"
