"""build_devices: dranet's scan over host facts read from a fake sysfs tree."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from services.inventory import attributes as A
from services.inventory import rtnl
from services.inventory.discovery import Device, HostFacts, ScanOptions, build_devices
from services.inventory.pciids import PciIds
from services.inventory.sysfs import NetSysfs, Sysfs
from shared.deviceattr import AttrKind
from tests.unit.inventory.fakesys import mellanox_host

_index = iter(range(2, 10_000))


def link(name: str, kind: str = "", *, ifi_type: int = 1, mac: str = "", **kw: Any) -> rtnl.Link:
    defaults: dict[str, Any] = {
        "index": next(_index),
        "flags": 0x1003,
        "mtu": 1500,
        "alias": "",
        "operstate": 6,
        "master": 0,
        "link": 0,
    }
    defaults.update(kw)
    return rtnl.Link(name=name, kind=kind, ifi_type=ifi_type, mac=mac or "02:00:00:00:00:01", **defaults)


def facts_from(sysfs: Sysfs, links: list[rtnl.Link], **kw: Any) -> HostFacts:
    return HostFacts(
        links=links,
        addrs=kw.get("addrs", {}),
        tc=kw.get("tc", {}),
        tcx=kw.get("tcx", {}),
        net={lk.name: sysfs.netdev(lk.name) for lk in links if not lk.is_loopback},
        pci=sysfs.pci_functions(),
        rdma_links=sysfs.rdma_links(),
        numa_nodes=sysfs.numa_node_count(),
    )


def values(d: Device) -> dict[str, object]:
    return {k: a.value for k, a in d.attributes.items()}


@pytest.fixture
def sysfs(tmp_path: Path) -> Sysfs:
    fs = mellanox_host(tmp_path / "sys")
    for name in ("veth0", "docker0", "cilium_host", "lo", "eth.1", "pci-0000-3b-00-0"):
        fs.netdev(name)
    fs.netdev("ib0", "0000:5e:00.0")
    return Sysfs(tmp_path / "sys")


@pytest.fixture
def pciids(tmp_path: Path) -> PciIds:
    path = tmp_path / "pci.ids"
    from tests.unit.inventory.fakesys import PCI_IDS

    path.write_text(PCI_IDS)
    return PciIds(path)


def scan(sysfs: Sysfs, pciids: PciIds, links: list[rtnl.Link], options: ScanOptions | None = None, **kw: Any):
    devices = build_devices(facts_from(sysfs, links, **kw), options or ScanOptions(), pciids)
    return {d.name: d for d in devices}


def test_mellanox_host(sysfs: Sysfs, pciids: PciIds) -> None:
    links = [
        link("lo", flags=0x49, ifi_type=772, mac=""),
        link("ens1f0np0", mac="0c:42:a1:16:05:4c", mtu=9000),
        link("ens1f0v0", mac="0c:42:a1:16:05:50"),
        link("veth0", "veth"),
        link("docker0", "bridge"),
        link("cilium_host", "veth"),
    ]
    got = scan(sysfs, pciids, links)
    assert sorted(got) == [
        "pci-0000-00-05-0",
        "pci-0000-3b-00-0",
        "pci-0000-3b-00-2",
        "pci-0000-5e-00-0",
        "veth0",
    ]
    assert values(got["pci-0000-3b-00-0"]) == {
        A.PCI_ADDRESS: "0000:3b:00.0",
        A.IF_NAME: "ens1f0np0",
        A.MAC: "0c:42:a1:16:05:4c",
        A.MTU: 9000,
        A.ENCAPSULATION: "ether",
        A.ALIAS: "",
        A.STATE: "up",
        A.TYPE: "device",
        A.EBPF: False,
        A.SRIOV: True,
        A.SRIOV_VFS: 2,
        A.VIRTUAL: False,
        A.STANDARD_NUMA_NODE: 0,
        A.STANDARD_PCIE_ROOT: "pci0000:3a",
        A.NUMA_NODE: 0,
        A.PCI_VENDOR: "Mellanox Technologies",
        A.PCI_DEVICE: "MT27800 Family [ConnectX-5]",
        A.PCI_SUBSYSTEM: "0020",
        A.RDMA: True,
        A.RDMA_DEVICE: "mlx5_0",
    }
    vf = got["pci-0000-3b-00-2"]
    assert values(vf)[A.IS_SRIOV_VF] is True and values(vf)[A.SRIOV] is False
    assert values(vf)[A.PCI_DEVICE] == "MT27800 Family [ConnectX-5 Virtual Function]"
    assert (vf.is_sriov_vf, vf.pf_ifname, vf.rdma_device, vf.ifname) == (
        True,
        "ens1f0np0",
        "mlx5_2",
        "ens1f0v0",
    )
    ib = got["pci-0000-5e-00-0"]
    assert values(ib) == {
        A.PCI_ADDRESS: "0000:5e:00.0",
        A.STANDARD_NUMA_NODE: 1,
        A.STANDARD_PCIE_ROOT: "pci0000:5d",
        A.NUMA_NODE: 1,
        A.PCI_VENDOR: "Mellanox Technologies",
        A.PCI_DEVICE: "MT28908 Family [ConnectX-6]",
        A.PCI_SUBSYSTEM: "0020",
        A.RDMA: True,
        A.RDMA_DEVICE: "mlx5_1",
    }
    assert ib.rdma_only
    erdma = got["pci-0000-00-05-0"]
    assert values(erdma) == {
        A.PCI_ADDRESS: "0000:00:05.0",
        A.RDMA_DEVICE: "erdma_0",
        A.STANDARD_PCIE_ROOT: "pci0000:00",
        A.PCI_VENDOR: "unknown",
        A.PCI_DEVICE: "unknown",
        A.PCI_SUBSYSTEM: "107f",
        A.RDMA: True,
    }
    veth = values(got["veth0"])
    assert veth[A.TYPE] == "veth" and veth[A.VIRTUAL] is True and veth[A.RDMA] is False
    assert A.PCI_ADDRESS not in veth and A.SRIOV_VFS not in veth and A.IS_SRIOV_VF not in veth


def test_attribute_kinds(sysfs: Sysfs, pciids: PciIds) -> None:
    got = scan(sysfs, pciids, [link("ens1f0np0")])
    kinds = {k: a.kind for k, a in got["pci-0000-3b-00-0"].attributes.items()}
    ints = {A.MTU, A.SRIOV_VFS, A.NUMA_NODE, A.STANDARD_NUMA_NODE}
    bools = {A.EBPF, A.SRIOV, A.VIRTUAL, A.RDMA}
    for name, kind in kinds.items():
        want = AttrKind.INT if name in ints else AttrKind.BOOL if name in bools else AttrKind.STRING
        assert kind is want, name


@pytest.mark.parametrize(("move", "ifname"), [(True, "ib0"), (False, "")])
def test_ipoib_follows_move_ib_interfaces(sysfs: Sysfs, pciids: PciIds, move: bool, ifname: str) -> None:
    mac = "00:00:10:49:fe:80:00:00:00:00:00:00:0c:42:a1:03:00:16:05:51"
    links = [link("ib0", "ipoib", ifi_type=32, mac=mac, mtu=2044)]
    dev = scan(sysfs, pciids, links, ScanOptions(move_ib_interfaces=move))["pci-0000-5e-00-0"]
    assert dev.ifname == ifname
    assert dev.rdma_device == "mlx5_1" and values(dev)[A.RDMA] is True
    assert dev.rdma_only is (not move)
    if move:
        assert values(dev)[A.ENCAPSULATION] == "infiniband" and values(dev)[A.TYPE] == "ipoib"


def test_uplinks_are_left_out(sysfs: Sysfs, pciids: PciIds) -> None:
    options = ScanOptions(excluded_interfaces=frozenset({"ens1f0np0", "veth0"}))
    got = scan(sysfs, pciids, [link("ens1f0np0"), link("veth0", "veth")], options)
    assert "pci-0000-3b-00-0" not in got and "veth0" not in got
    assert "pci-0000-3b-00-2" in got  # the VF's netdev is not in this namespace: still published


def test_single_numa_host_has_no_legacy_numa_attribute(tmp_path: Path, pciids: PciIds) -> None:
    fs = mellanox_host(tmp_path / "sys")
    import shutil

    shutil.rmtree(tmp_path / "sys/devices/system/node/node1")
    dev = scan(Sysfs(fs.root), pciids, [])["pci-0000-3b-00-0"]
    assert A.NUMA_NODE not in dev.attributes and values(dev)[A.STANDARD_NUMA_NODE] == 0


@pytest.mark.parametrize(
    ("list_form", "pf", "ib"),
    [
        # the gate off (dranet's default): scalars, as before
        (False, {"int": 0}, {"int": 1}),
        # DRAListTypeAttributes: the node, then its same-socket neighbour at the smallest distance
        (True, {"ints": [0, 1]}, {"ints": [1, 0]}),
    ],
    ids=["scalar", "list"],
)
def test_standard_numa_attribute_form(
    tmp_path: Path, pciids: PciIds, list_form: bool, pf: dict[str, object], ib: dict[str, object]
) -> None:
    fs = mellanox_host(tmp_path / "sys")
    fs.numa_nodes(4)
    fs.numa_topology([[10, 12, 20, 20], [12, 10, 20, 20], [20, 20, 10, 12], [20, 20, 12, 10]], [0, 0, 1, 1])
    sysfs = Sysfs(fs.root)
    facts = replace(
        facts_from(sysfs, [link("ens1f0np0")]),
        numa_distances=sysfs.numa_distances(),
        numa_sockets=sysfs.numa_sockets(),
    )
    got = {d.name: d for d in build_devices(facts, ScanOptions(list_numa_attributes=list_form), pciids)}
    entries = {n: d.slice_entry()["attributes"] for n, d in got.items()}
    assert entries["pci-0000-3b-00-0"][A.STANDARD_NUMA_NODE] == pf
    assert entries["pci-0000-5e-00-0"][A.STANDARD_NUMA_NODE] == ib
    # the legacy dra.net/numaNode stays a scalar either way (dranet db.go)
    assert entries["pci-0000-3b-00-0"][A.NUMA_NODE] == {"int": 0}
    # no NUMA affinity (numa_node -1): no standardized attribute in either form
    (fs.root / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.2/numa_node").write_text("-1\n")
    got = {
        d.name: d
        for d in build_devices(facts_from(sysfs, []), ScanOptions(list_numa_attributes=list_form), pciids)
    }
    assert A.STANDARD_NUMA_NODE not in got["pci-0000-3b-00-2"].attributes


def test_names_never_collide(sysfs: Sysfs, pciids: PciIds) -> None:
    # An interface literally named like a PCI device name, and one that is not a DNS label.
    got = scan(sysfs, pciids, [link("ens1f0np0"), link("pci-0000-3b-00-0", "veth"), link("eth.1", "veth")])
    by_if = {d.ifname: n for n, d in got.items()}
    assert by_if["ens1f0np0"] == "pci-0000-3b-00-0"
    assert by_if["pci-0000-3b-00-0"].startswith("net-")
    assert by_if["eth.1"].startswith("net-")
    assert len(set(got)) == len(got)


def test_addresses(sysfs: Sysfs, pciids: PciIds) -> None:
    lk = link("veth0", "veth")
    many = [f"10.0.0.{i}/24" for i in range(1, 9)]
    addrs = {
        lk.index: [
            *many,
            "169.254.1.1/16",
            "127.0.0.2/8",
            "fe80::1/64",
            "fd00::2/64",
            "2001:db8::1/64",
            "10.0.0.1/24",
        ]
    }
    v = values(scan(sysfs, pciids, [lk], addrs=addrs)["veth0"])
    # Sorted as strings and cut before the address that would pass 64 characters.
    assert v[A.IPV4] == "10.0.0.1/24,10.0.0.2/24,10.0.0.3/24,10.0.0.4/24,10.0.0.5/24"
    assert v[A.IPV6] == "2001:db8::1/64,fd00::2/64"


def test_ebpf_attributes(sysfs: Sysfs, pciids: PciIds) -> None:
    a, b, c = link("veth0", "veth"), link("eth.1", "veth"), link("pci-0000-3b-00-0", "veth")
    got = scan(
        sysfs,
        pciids,
        [a, b, c],
        tc={a.index: (["cls_a", "cls_b"], True)},
        tcx={b.index: (["tcx_prog"], True), a.index: ([], True)},
    )
    by_if = {d.ifname: values(d) for d in got.values()}
    assert by_if["veth0"][A.TC_FILTER_NAMES] == "cls_a,cls_b" and by_if["veth0"][A.EBPF] is True
    assert by_if["veth0"][A.TCX_PROGRAM_NAMES] == ""
    assert by_if["eth.1"][A.TCX_PROGRAM_NAMES] == "tcx_prog" and A.TC_FILTER_NAMES not in by_if["eth.1"]
    assert by_if["pci-0000-3b-00-0"][A.EBPF] is False


def test_hex_ids_without_a_pci_database(sysfs: Sysfs) -> None:
    dev = scan(sysfs, PciIds(None), [])["pci-0000-3b-00-0"]
    assert (values(dev)[A.PCI_VENDOR], values(dev)[A.PCI_DEVICE]) == ("15b3", "1017")


def test_interface_on_an_unscanned_pci_function_is_skipped(pciids: PciIds) -> None:
    facts = HostFacts(
        links=[link("eth7")],
        addrs={},
        tc={},
        tcx={},
        net={"eth7": NetSysfs(pci_address="0000:99:00.0")},
        pci=[],
        rdma_links=[],
    )
    assert build_devices(facts, ScanOptions(), pciids) == []


def test_long_alias_is_cut_to_the_attribute_limit(sysfs: Sysfs, pciids: PciIds) -> None:
    v = values(scan(sysfs, pciids, [link("veth0", "veth", alias="x" * 200)])["veth0"])
    assert v[A.ALIAS] == "x" * 64


def test_slice_entry(sysfs: Sysfs, pciids: PciIds) -> None:
    entry = scan(sysfs, pciids, [link("veth0", "veth", mtu=1400)])["veth0"].slice_entry()
    assert entry["name"] == "veth0"
    attrs = entry["attributes"]
    assert isinstance(attrs, dict)
    assert attrs[A.MTU] == {"int": 1400} and attrs[A.TYPE] == {"string": "veth"}
    assert attrs[A.VIRTUAL] == {"bool": True}
    assert list(attrs) == sorted(attrs)
