"""RDMA with soft RoCE (rdma_rxe) on a real kernel: discovery, the device files prepare
stores and CreateContainer hands out, the node's RDMA netns mode, and exclusive mode.

What soft RoCE does that hardware does not (measured here, kernel 6.1):
- an rxe device is destroyed when its netdev leaves the host netns (the kernel logs
  "infiniband rxeN: set down" and it is gone; it does not come back with the netdev);
- ``rdma dev set rxeN netns X`` fails with EOPNOTSUPP ("Operation not supported"): rxe
  cannot change netns at all;
- ``rdma system set netns exclusive|shared`` fails with EBUSY while any netns besides
  init_net exists.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator

import pytest

from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.ttrpc import TtrpcError
from services.attach.rdma import check_device_nodes
from services.inventory.rdma import read_netns_mode
from shared.attachplan import DeviceNode
from tests.vm.guest.kit import (
    NODE,
    Stack,
    addrs,
    ip_batch,
    link,
    netns,
    netns_path,
    new_pod,
    pod_sandbox,
    record,
    running_stack,
    set_rdma_netns_mode,
    sh,
)

pytestmark = [pytest.mark.root, pytest.mark.netns]


def rdma_devs() -> set[str]:
    return {d["ifname"] for d in json.loads(sh("rdma", "-j", "dev", "show") or "[]")}


def make_rxe(netdev: str, rxe: str, cidr: str) -> None:
    ip_batch([f"link add {netdev} type dummy", f"addr add {cidr} dev {netdev}", f"link set {netdev} up"])
    sh("rdma", "link", "add", rxe, "type", "rxe", "netdev", netdev)


def drop_rxe(netdev: str, rxe: str) -> None:
    if rxe in rdma_devs():
        sh("rdma", "link", "delete", rxe, check=False)
    sh("ip", "link", "del", netdev, check=False)


@pytest.fixture
def rxe() -> Iterator[tuple[str, str]]:
    make_rxe("rxed0", "rxe0", "198.18.61.2/24")
    try:
        yield "rxed0", "rxe0"
    finally:
        drop_rxe("rxed0", "rxe0")


@pytest.fixture
def rxe_only() -> Iterator[str]:
    """An RDMA device whose netdev stays on the host (an RDMA-only device for attach)."""
    make_rxe("rxed1", "rxe1", "198.18.62.2/24")
    try:
        yield "rxe1"
    finally:
        drop_rxe("rxed1", "rxe1")


def real_node(path: str) -> tuple[str, int, int, int]:
    s = os.stat(path)
    return (
        "c" if stat.S_ISCHR(s.st_mode) else "?",
        os.major(s.st_rdev),
        os.minor(s.st_rdev),
        stat.S_IMODE(s.st_mode),
    )


def uverbs_of(rxe: str) -> str:
    base = "/sys/class/infiniband_verbs"
    for entry in sorted(os.listdir(base)):
        ibdev = os.path.join(base, entry, "ibdev")
        if os.path.exists(ibdev) and open(ibdev).read().strip() == rxe:
            return f"/dev/infiniband/{entry}"
    raise AssertionError(f"no uverbs device for {rxe}")


def rdma_only_config(pod: st.PodRef, rxe: str, mode: str) -> st.DeviceConfig:
    """What prepare stores for an RDMA-only device (dranet's IsIBOnlyDevice). The inventory
    publishes RDMA-only devices only for PCI functions, so soft RoCE never becomes one: the
    config is written as prepare would write it."""
    cfg = st.DeviceConfig(
        pod=pod,
        device=f"rdma-{rxe}",
        claim=st.ClaimRef(uid=f"c-{pod.uid}", namespace=pod.namespace, name=f"claim-{rxe}"),
        driver="dra.net",
        pool=NODE,
        host_ifname="",
        rdma_netns_mode=mode,
    )
    cfg.rdma.link_dev = rxe
    for path in (uverbs_of(rxe), "/dev/infiniband/rdma_cm"):
        kind, major, minor, mode_bits = real_node(path)
        cfg.rdma.dev_chars.add(path=path, type=kind, major=major, minor=minor, file_mode=mode_bits)
    return cfg


async def test_discovery_device_files_and_shared_mode(stack: Stack, rxe: tuple[str, str]) -> None:
    netdev, dev = rxe
    assert stack.rdma_netns_mode == "shared"
    await stack.inventory.scan()
    d = stack.inventory.get(netdev)
    assert d is not None and d.rdma_device == dev
    assert d.attributes["dra.net/rdma"].to_json() == {"bool": True}
    assert d.attributes["dra.net/rdmaDevice"].to_json() == {"string": dev}
    assert not any(x.rdma_only for x in stack.inventory.devices.values()), "rxe has no PCI function"

    # The device files in the snapshot are the real character devices.
    t0 = time.perf_counter()
    info = await stack.inventory_client.get_device(netdev)
    record("rdma.get_device_with_snapshot", seconds=round(time.perf_counter() - t0, 2))
    assert info is not None and info.snapshot.rdma_device == dev
    chars = {c.path: (c.type, c.major, c.minor, c.file_mode) for c in info.snapshot.rdma_dev_chars}
    uverbs = uverbs_of(dev)
    assert set(chars) == {uverbs, "/dev/infiniband/rdma_cm"}
    for path, seen in chars.items():
        assert seen == real_node(path), path

    pod = new_pod()
    ref, res = await stack.prepare(netdev, {"interface": {"name": "net1"}}, pod)
    assert not res.error, res.error
    (cfg,) = (await stack.stored(pod)).devices
    assert cfg.rdma.link_dev == dev and cfg.rdma_netns_mode == "shared"
    assert {c.path: (c.type, c.major, c.minor, c.file_mode) for c in cfg.rdma.dev_chars} == chars

    # CreateContainer's check against the real files: numbers that changed are corrected,
    # a file that is gone is dropped.
    stored = tuple(
        DeviceNode(path=c.path, type=c.type, major=c.major, minor=c.minor) for c in cfg.rdma.dev_chars
    )
    nodes, problems = check_device_nodes(stored)
    assert problems == [] and {n.path: (n.type, n.major, n.minor) for n in nodes} == {
        p: v[:3] for p, v in chars.items()
    }
    _, major, minor, _ = real_node(uverbs)
    moved = (DeviceNode(path=uverbs, type="c", major=major, minor=minor + 7),)
    fixed, problems = check_device_nodes(moved)
    assert fixed[0].minor == minor and f"is {major}:{minor} now, config says {major}:{minor + 7}" in str(
        problems[0]
    )
    gone, problems = check_device_nodes(
        (DeviceNode(path="/dev/infiniband/uverbs99", type="c", major=231, minor=255),)
    )
    assert gone == () and "cannot stat" in str(problems[0])

    # Shared mode: only the netdev moves. Soft RoCE dies with its netdev's move.
    mark = len(sh("dmesg").splitlines())
    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        assert link(ns, "net1") is not None
        assert dev not in rdma_devs(), "the kernel destroyed the rxe device when its netdev left"
        log = sh("dmesg").splitlines()[mark:]
        record("rdma.rxe_on_netdev_move", kernel=[line for line in log if dev in line])
        adj = await stack.hooks.create_container(sandbox, nri_pb2.Container(id="c1", name="main"))
        paths = sorted(x.path for x in adj.linux.devices) if adj is not None else []
        assert paths == ["/dev/infiniband/rdma_cm"], "the verbs file went with the rxe device"
        await stack.hooks.stop_pod_sandbox(sandbox)
        back = link(None, netdev)
        # Returned under its host name and up; its host addresses are not restored (as dranet).
        assert back is not None and "UP" in back["flags"] and addrs(None, netdev) == set()
    assert dev not in rdma_devs(), "soft RoCE does not come back with its netdev"
    await stack.preparer.unprepare([ref])


async def test_rdma_only_device_in_shared_mode_gets_its_files(stack: Stack, rxe_only: str) -> None:
    pod = new_pod()
    cfg = rdma_only_config(pod, rxe_only, "shared")
    await stack.store.put_devices([cfg])
    with netns() as ns:
        sandbox = pod_sandbox(pod, netns_path(ns))
        await stack.hooks.run_pod_sandbox(sandbox)
        (result,) = (await stack.stored(pod)).results
        assert result.attached and [(c.type, c.reason) for c in result.conditions] == [
            ("Ready", "RDMAOnlyDeviceReady")
        ]
        adj = await stack.hooks.create_container(sandbox, nri_pb2.Container(id="c1", name="main"))
        assert adj is not None
        got = {x.path: ("c", x.major, x.minor, x.file_mode.value) for x in adj.linux.devices}
        want = {c.path: (c.type, c.major, c.minor, c.file_mode) for c in cfg.rdma.dev_chars}
        assert got == want and all(got[p] == real_node(p) for p in got)
        await stack.hooks.stop_pod_sandbox(sandbox)
    assert rxe_only in rdma_devs()


async def test_netns_mode_is_read_at_start_and_exclusive_fails_cleanly(
    rxe: tuple[str, str], rxe_only: str
) -> None:
    netdev, dev = rxe
    assert read_netns_mode() == "shared"
    async with running_stack() as before:
        set_rdma_netns_mode("exclusive")
        try:
            assert "netns exclusive" in sh("rdma", "system", "show")
            async with running_stack() as after:
                # Read once at start, as dranet: the running inventory still says shared.
                assert (await before.inventory_client.node_info()).rdma_netns_mode == "shared"
                assert (await after.inventory_client.node_info()).rdma_netns_mode == "exclusive"
                await exclusive_mode(after, netdev, dev, rxe_only)
        finally:
            set_rdma_netns_mode("shared")
    assert read_netns_mode() == "shared"


async def exclusive_mode(stack: Stack, netdev: str, dev: str, rxe_only: str) -> None:
    # Prepare: IPvlan is refused in exclusive mode; a NIC with an RDMA device carries it.
    _, res = await stack.prepare(
        netdev, {"interface": {"type": "IPVLAN", "name": "net1", "addresses": ["198.18.61.9/24"]}}, new_pod()
    )
    assert "interface.type IPVLAN is not supported when the node's RDMA netns mode is exclusive" in res.error

    pod = new_pod()
    ref, res = await stack.prepare(netdev, {"interface": {"name": "net1"}}, pod)
    assert not res.error, res.error
    (cfg,) = (await stack.stored(pod)).devices
    assert cfg.rdma_netns_mode == "exclusive" and cfg.rdma.link_dev == dev

    with netns() as ns:
        # The netdev moves first, which destroys soft RoCE; moving the RDMA device then
        # fails and everything is rolled back.
        sandbox = pod_sandbox(pod, netns_path(ns))
        with pytest.raises(TtrpcError) as err:
            await stack.hooks.run_pod_sandbox(sandbox)
        msg = str(err.value)
        record("rdma.exclusive_passthrough_error", error=msg)
        assert dev in msg and netdev in msg, msg
        assert link(ns, "net1") is None and link(None, netdev) is not None
        assert addrs(None, netdev) == {"198.18.61.2/24"}, "the NIC is back with its address"
        (result,) = (await stack.stored(pod)).results
        assert not result.attached and dev in result.error
        assert not stack.hooks.pods[pod.uid].attached

        # An RDMA-only device: the kernel refuses to move soft RoCE.
        pod2 = new_pod()
        cfg2 = rdma_only_config(pod2, rxe_only, "exclusive")
        await stack.store.put_devices([cfg2])
        sandbox2 = pod_sandbox(pod2, netns_path(ns), sandbox="sb2")
        with pytest.raises(TtrpcError) as err:
            await stack.hooks.run_pod_sandbox(sandbox2)
        msg = str(err.value)
        record("rdma.exclusive_rdma_only_error", error=msg)
        assert rxe_only in msg and "Operation not supported" in msg, msg
        assert rxe_only in rdma_devs(), "the RDMA device is still on the host"
        (result,) = (await stack.stored(pod2)).results
        assert not result.attached and "Operation not supported" in result.error
        assert [(c.type, c.status, c.reason) for c in result.conditions] == [
            ("Ready", "False", "RDMADeviceAttachFailed")
        ]
        assert not stack.hooks.pods[pod2.uid].attached, "nothing is held for the pod"
    await stack.preparer.unprepare([ref])
    await stack.store.delete_pod(pod2.uid)
