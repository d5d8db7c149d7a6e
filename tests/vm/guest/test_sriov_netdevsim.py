"""SR-IOV with netdevsim (built out of tree for the guest kernel): a PF with VFs.

What netdevsim exposes, and what it does not (kernel 6.1, measured here):
- it is a device on the netdevsim bus, not PCI: /sys/class/net/<if>/device points at
  /sys/devices/netdevsimN, which has sriov_numvfs but no sriov_totalvfs, and no
  physfn/virtfnN links; the PF and every VF representor share that one device directory;
- VFs get no netdev of their own: in legacy eswitch mode they are only "vf N" entries
  (IFLA_VFINFO_LIST) of the PF; in switchdev mode each VF gets a representor netdev with
  devlink flavour "pcivf" (pfnum 0, vfnum N), phys_port_name "pf0vfN" and the PF's
  phys_switch_id;
- at most 4 VFs unless raised through debugfs (netdevsim/netdevsimN/max_vfs).

The inventory reads SR-IOV from the PCI layout (sriov_totalvfs, physfn, virtfnN), as
dranet does: on netdevsim's own sysfs it rightly finds no SR-IOV at all. The second test
therefore lays the real netdevsim topology (its devlink ports and VF count) out as PCI
functions in a sysfs tree, and runs the inventory and prepare on it with the real netlink
state (names, MTUs) of the real netdevsim netdevs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.inventory.filter import DEFAULT_FILTER, DeviceFilter
from services.inventory.inventory import Inventory, InventoryConfig
from tests.unit.inventory.fakesys import FakeSys
from tests.vm.guest.kit import (
    addrs,
    link,
    netns,
    netns_path,
    new_pod,
    pod_sandbox,
    record,
    running_stack,
    sh,
    wait_until,
)

pytestmark = [pytest.mark.root, pytest.mark.netns]

NSIM_BUS = Path("/sys/bus/netdevsim")
NUMVFS = 4


@dataclass
class Nsim:
    id: int
    pf: str
    vfs: dict[int, str]  # vfnum -> representor netdev
    switch_id: str

    @property
    def sysdir(self) -> Path:
        return NSIM_BUS / "devices" / f"netdevsim{self.id}"


def devlink_ports(dev_id: int) -> dict[str, dict[str, object]]:
    ports = json.loads(sh("devlink", "-j", "port", "show"))["port"]
    return {k: v for k, v in ports.items() if k.startswith(f"netdevsim/netdevsim{dev_id}/")}


def make_nsim(dev_id: int, numvfs: int, prefix: str) -> Nsim:
    (NSIM_BUS / "new_device").write_text(f"{dev_id} 1")
    sysdir = NSIM_BUS / "devices" / f"netdevsim{dev_id}"
    wait_until("the netdevsim port", lambda: any(True for _ in (sysdir / "net").iterdir()))
    max_vfs = Path(f"/sys/kernel/debug/netdevsim/netdevsim{dev_id}/max_vfs")
    if numvfs > 4 and max_vfs.exists():
        max_vfs.write_text(str(numvfs))
    (sysdir / "sriov_numvfs").write_text(str(numvfs))
    sh("devlink", "dev", "eswitch", "set", f"netdevsim/netdevsim{dev_id}", "mode", "switchdev")
    wait_until("the VF representors", lambda: len(devlink_ports(dev_id)) == numvfs + 1)
    pf, vfs, renames = "", {}, []
    for port in devlink_ports(dev_id).values():
        name = str(port["netdev"])
        if port["flavour"] == "physical":
            pf = f"{prefix}p0"
            renames.append((name, pf))
        else:
            assert port["flavour"] == "pcivf" and port["pfnum"] == 0
            vfs[int(port["vfnum"])] = f"{prefix}v{port['vfnum']}"  # type: ignore[call-overload]
            renames.append((name, vfs[int(port["vfnum"])]))  # type: ignore[call-overload]
    for old, new in renames:
        sh("ip", "link", "set", old, "name", new)
    switch_id = Path(f"/sys/class/net/{pf}/phys_switch_id").read_text().strip()
    return Nsim(dev_id, pf, vfs, switch_id)


def drop_nsim(n: Nsim) -> None:
    (NSIM_BUS / "del_device").write_text(str(n.id))


@pytest.fixture(scope="module")
def nsim() -> Iterator[Nsim]:
    n = make_nsim(11, NUMVFS, "nsa")
    try:
        yield n
    finally:
        drop_nsim(n)


def values(dev: object) -> dict[str, object]:
    return {k: next(iter(v.to_json().values())) for k, v in dev.attributes.items()}  # type: ignore[attr-defined]


def check_what_netdevsim_exposes(nsim: Nsim) -> None:
    """The kernel side, exactly (see the module docstring)."""
    assert (nsim.sysdir / "sriov_numvfs").read_text().strip() == str(NUMVFS)
    assert not (nsim.sysdir / "sriov_totalvfs").exists()
    for ifname in (nsim.pf, *nsim.vfs.values()):
        dev = Path(f"/sys/class/net/{ifname}/device")
        assert dev.resolve() == nsim.sysdir.resolve(), "PF and representors share the bus device"
        assert not (dev / "physfn").exists() and not list(dev.glob("virtfn*"))
        assert Path(f"/sys/class/net/{ifname}/phys_switch_id").read_text().strip() == nsim.switch_id
    for vfnum, rep in nsim.vfs.items():
        assert Path(f"/sys/class/net/{rep}/phys_port_name").read_text().strip() == f"pf0vf{vfnum}"
    pf_link = json.loads(sh("ip", "-j", "-d", "link", "show", nsim.pf))[0]
    assert len(pf_link.get("vfinfo_list", [])) == NUMVFS, "VFs show only as the PF's vf entries"


async def test_what_netdevsim_exposes_and_what_the_inventory_makes_of_it(nsim: Nsim) -> None:
    check_what_netdevsim_exposes(nsim)
    inv = Inventory(InventoryConfig(), device_filter=DeviceFilter(DEFAULT_FILTER))
    await inv.start()
    await inv.scan()
    pf = inv.get(nsim.pf)
    assert pf is not None and nsim.pf in inv.published
    v = values(pf)
    assert v["dra.net/sriov"] is False and "dra.net/sriovVfs" not in v and "dra.net/isSriovVf" not in v
    assert v["dra.net/virtual"] is False and "dra.net/pciAddress" not in v
    for rep in nsim.vfs.values():
        d = inv.get(rep)
        assert d is not None and not d.is_sriov_vf and d.pf_ifname == ""
        assert "dra.net/isSriovVf" not in values(d)
    record("sriov.netdevsim_native", pf_attributes=v)


def pci_mirror(root: Path, n: Nsim) -> FakeSys:
    """The real netdevsim PF and VF representors laid out as PCI functions: PF 0000:5a:00.0
    with sriov_totalvfs/numvfs from the real device, VF N at 0000:5a:00.(N+1) with
    physfn/virtfnN links, each function's net/ holding the real netdev's name."""
    fs = FakeSys(root / "sys", root / "dev")
    numvfs = int((n.sysdir / "sriov_numvfs").read_text())
    pf_bdf = "0000:5a:00.0"
    fs.pci(pf_bdf, vendor="1af4", device="1041", driver="netdevsim", totalvfs=numvfs, numvfs=numvfs)
    fs.netdev(n.pf, pf_bdf)
    for vfnum, rep in sorted(n.vfs.items()):
        bdf = f"0000:5a:00.{vfnum + 1}"
        fs.pci(bdf, vendor="1af4", device="1041", driver="netdevsim")
        fs.vf(pf_bdf, bdf, vfnum)
        fs.netdev(rep, bdf)
    for ifname in os.listdir("/sys/class/net"):  # everything else: as virtual as it is
        if ifname not in (n.pf, *n.vfs.values()):
            fs.netdev(ifname)
    return fs


async def test_sriov_attributes_vf_to_pf_and_the_vf_mtu_check(nsim: Nsim, tmp_path: Path) -> None:
    fs = pci_mirror(tmp_path, nsim)
    config = InventoryConfig(sysfs_root=str(fs.root), dev_root=str(fs.dev))
    async with running_stack(config) as stack:
        await stack.inventory.scan()
        pf = next(d for d in stack.inventory.devices.values() if d.ifname == nsim.pf)
        v = values(pf)
        assert (v["dra.net/sriov"], v["dra.net/sriovVfs"], v["dra.net/pciAddress"]) == (
            True,
            NUMVFS,
            "0000:5a:00.0",
        )
        vfs = {d.ifname: d for d in stack.inventory.devices.values() if d.ifname in nsim.vfs.values()}
        assert len(vfs) == NUMVFS
        for d in vfs.values():
            assert d.is_sriov_vf and d.pf_ifname == nsim.pf and values(d)["dra.net/isSriovVf"] is True
        record("sriov.pci_mirror", pf_attributes=v, vf_devices=sorted(d.name for d in vfs.values()))

        vf = vfs[nsim.vfs[0]]
        info = await stack.inventory_client.get_device(vf.name)
        assert info is not None and (info.pf_ifname, info.pf_mtu) == (nsim.pf, 1500)

        # Prepare refuses a VF MTU above its PF's (read live from the kernel).
        pod = new_pod()
        _, res = await stack.prepare(vf.name, {"interface": {"name": "net1", "mtu": 9000}}, pod)
        assert f"interface.mtu 9000 exceeds PF {nsim.pf} MTU 1500" in res.error, res.error
        assert not (await stack.stored(pod)).devices

        sh("ip", "link", "set", nsim.pf, "mtu", "9000")
        try:
            ref, res = await stack.prepare(vf.name, {"interface": {"name": "net1", "mtu": 9000}}, pod)
            assert not res.error, res.error
            _, res2 = await stack.prepare(vf.name, {"interface": {"name": "net2", "mtu": 9001}}, new_pod())
            assert f"interface.mtu 9001 exceeds PF {nsim.pf} MTU 9000" in res2.error, res2.error

            # And the VF (its representor netdev) moves into the Pod and comes back.
            with netns() as ns:
                sandbox = pod_sandbox(pod, netns_path(ns))
                await stack.hooks.run_pod_sandbox(sandbox)
                n1 = link(ns, "net1")
                assert n1 is not None and n1["mtu"] == 9000
                await stack.hooks.stop_pod_sandbox(sandbox)
                assert link(None, vf.ifname) is not None and addrs(None, vf.ifname) == set()
            await stack.preparer.unprepare([ref])
        finally:
            sh("ip", "link", "set", nsim.pf, "mtu", "1500")
