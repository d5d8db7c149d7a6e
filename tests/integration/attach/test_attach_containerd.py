"""The attach service as a real process on a real containerd 1.7 with NRI, driven through
CRI, with veth "NICs" and a real store process: the device is inside the pod with its
configuration, the pod reaches the NIC's peer, and the device comes back when the pod
goes; failures, retries and a second sandbox of one pod.

The kubelet's part is played by the test: it puts the DeviceConfig in the store as
prepare would, then calls CRI.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from dev.cluster.containerd import Containerd, running
from dev.cluster.cri import ContainerConfig, CriClient, stubs
from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.stub import NriHandlers, NriStub, StubConfig
from shared.storeclient import StoreClient
from tests.integration.attach import attach_env as env
from tests.integration.attach.attach_env import NicFactory, PodId, VethNic, World

pytestmark = [pytest.mark.containerd, pytest.mark.root, pytest.mark.netns]


@pytest.fixture(scope="module")
def runtime() -> Iterator[Containerd]:
    with running() as c:
        yield c


@pytest.fixture
async def world(runtime: Containerd, tmp_path: Path) -> AsyncIterator[World]:
    runtime.start()  # a test may have stopped it
    store_proc = env.store_process(tmp_path).start()
    # A fake /dev tree for the RDMA device files (see the RDMA test).
    (tmp_path / "root" / "dev").mkdir(parents=True)
    attach = env.attach_process(tmp_path, runtime.nri_socket, "--dev-root", str(tmp_path / "root"))
    nics = NicFactory()
    try:
        attach.start()
        async with StoreClient(store_proc.socket) as store, CriClient(runtime.grpc_socket) as cri:
            await env.wait_liveness(store, connected=True)
            yield World(tmp_path, runtime, cri, store_proc, store, attach, nics)
            # Pods go while attach still runs, so their devices come back first.
            await asyncio.to_thread(runtime.remove_all_pods)
    finally:
        attach.stop()
        store_proc.stop()
        nics.cleanup()


def full_config(nic: VethNic) -> dict[str, Any]:
    """Name, MTU, MAC, two addresses, two routes (one in table 100), a rule for the
    second address, and a permanent neighbor for the peer."""
    return {
        "interface": {
            "name": "net1",
            "mtu": 1400,
            "hardwareAddr": "02:42:ac:11:00:99",
            "addresses": [nic.address(2), nic.address(3)],
        },
        "routes": [
            {"destination": "10.250.0.0/24", "gateway": nic.peer_ip},
            {"destination": "10.251.0.0/24", "gateway": nic.peer_ip, "table": 100},
        ],
        "rules": [{"priority": 1000, "source": nic.address(3).replace("/24", "/32"), "table": 100}],
        "neighbors": [{"destination": nic.peer_ip, "hardwareAddr": nic.peer_mac}],
    }


async def test_pod_gets_its_nic_configured_reaches_the_peer_and_gives_it_back(world: World) -> None:
    nic = world.nics.make(0)
    pod = PodId.new("web")
    await world.put(pod, nic, full_config(nic))
    sid, netns = await env.run_pod(world.cri, world.ctrd, pod)

    assert not nic.on_host()
    link = env.link(netns, "net1")
    assert link is not None
    assert (link["mtu"], link["address"], link["operstate"]) == (1400, "02:42:ac:11:00:99", "UP")
    assert sorted(env.addresses(netns, "net1")) == [nic.address(2), nic.address(3)]
    main = {(r["dst"], r.get("gateway")) for r in env.routes(netns) if r.get("dev") == "net1"}
    assert ("10.250.0.0/24", nic.peer_ip) in main
    table100 = {(r["dst"], r.get("gateway"), r.get("dev")) for r in env.routes(netns, "table", "100")}
    assert table100 == {("10.251.0.0/24", nic.peer_ip, "net1")}
    second = nic.address(3).split("/")[0]
    assert any(
        r.get("priority") == 1000 and r.get("src") == second and r.get("table") == "100"
        for r in env.rules(netns)
    )
    neigh = {(n["dst"], n.get("lladdr"), tuple(n.get("state", []))) for n in env.neighbors(netns, "net1")}
    assert (nic.peer_ip, nic.peer_mac, ("PERMANENT",)) in neigh
    assert env.ping(netns, nic.peer_ip)
    assert not env.ping(netns, nic.address(77).split("/")[0], count=1, timeout_s=0.5)  # nobody: ping is real

    async def recorded() -> Any:
        r = await world.result(pod, nic.name)
        return r if r is not None and r.attached else None

    r = await env.wait_for(recorded, what="attach result")
    assert (r.interface_name, r.hardware_address, r.host_ifname, r.error) == (
        "net1",
        "02:42:ac:11:00:99",
        nic.name,
        "",
    )
    assert sorted(r.ips) == [nic.address(2), nic.address(3)]
    assert (r.claim.name, r.pool, r.driver) == (f"claim-{nic.name}", env.POOL, env.DRIVER)
    assert {(c.type, c.status) for c in r.conditions} >= {("Ready", "True"), ("NetworkReady", "True")}
    assert (await world.store.get_pod(pod.uid)).activity.last_nri_activity_unix_nano > 0

    await world.cri.stop_pod_sandbox(sid)
    host = env.link(None, nic.name)
    assert host is not None and "UP" in host["flags"]
    assert env.link(netns, "net1") is None
    await world.cri.remove_pod_sandbox(sid)

    async def cleared() -> bool:
        state = await world.store.get_pod(pod.uid)
        return not state.results and not state.activity.last_nri_activity_unix_nano

    await env.wait_for(cleared, what="attach state cleared on RemovePodSandbox")
    assert [d.device for d in (await world.store.get_pod(pod.uid)).devices] == [nic.name]


async def test_failure_half_way_leaves_the_device_on_the_host_and_a_later_pod_gets_it(world: World) -> None:
    nic = world.nics.make(1)
    bad = PodId.new("bad")
    cfg = full_config(nic)
    cfg["routes"] = [*cfg["routes"], {"destination": "10.252.0.0/24", "gateway": "192.0.2.254"}]
    await world.put(bad, nic, cfg)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await world.cri.run_pod_sandbox(bad.sandbox())
    msg = err.value.details() or ""
    assert nic.name in msg and "192.0.2.254" in msg, msg
    host = env.link(None, nic.name)
    assert host is not None and "UP" in host["flags"]

    async def failed() -> Any:
        r = await world.result(bad, nic.name)
        return r if r is not None and r.error else None

    r = await env.wait_for(failed, what="error recorded")
    assert not r.attached and "192.0.2.254" in r.error
    assert [(c.type, c.status, c.reason) for c in r.conditions] == [
        ("Ready", "False", "NetworkDeviceAttachFailed")
    ]

    good = PodId.new("good")
    await world.put(good, nic, full_config(nic))
    _, netns = await env.run_pod(world.cri, world.ctrd, good)
    assert env.link(netns, "net1") is not None and env.ping(netns, nic.peer_ip)


async def test_host_network_pod_is_refused(world: World) -> None:
    nic = world.nics.make(2)
    pod = PodId.new("hostnet")
    await world.put(pod, nic, full_config(nic))
    config = world.cri.sandbox_config(pod.sandbox(host_network=True))
    # The kubelet sends no hostname for a host-network pod (runc refuses to set one
    # without a UTS namespace); the devcluster client always fills it in.
    config.hostname = ""
    _, pb_grpc = stubs()
    async with grpc.aio.insecure_channel(f"unix:{world.ctrd.grpc_socket}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.RuntimeServiceStub(ch).RunPodSandbox(
                world.cri.pb.RunPodSandboxRequest(config=config)
            )
    assert "using host network can not claim host devices" in (err.value.details() or "")
    assert nic.on_host()


async def test_second_sandbox_of_a_pod_takes_the_device_and_the_old_ones_removal_leaves_it(
    world: World,
) -> None:
    nic = world.nics.make(3)
    pod = PodId.new("again")
    await world.put(pod, nic, full_config(nic))
    sid0, ns0 = await env.run_pod(world.cri, world.ctrd, pod)
    assert env.link(ns0, "net1") is not None
    # The kubelet recreates a sandbox that died: attempt 1 of the same pod, while
    # attempt 0 is still there.
    sid1, ns1 = await env.run_pod(world.cri, world.ctrd, pod, attempt=1)
    assert env.link(ns1, "net1") is not None and env.link(ns0, "net1") is None
    await env.stop_pod(world.cri, sid0)
    assert env.link(ns1, "net1") is not None and env.ping(ns1, nic.peer_ip)

    async def attached() -> bool:
        r = await world.result(pod, nic.name)
        return r is not None and r.attached

    await env.wait_for(attached, 10, "the device on record as attached")
    await env.stop_pod(world.cri, sid1)
    assert nic.on_host()


class FailFirstRun(NriHandlers):
    """A second NRI plugin, after ours: fails the first RunPodSandbox of each pod,
    so containerd tears the sandbox down after our hook moved the device, and the
    kubelet's retry calls our hook again."""

    def __init__(self) -> None:
        self.failed: set[str] = set()

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        if pod.uid not in self.failed:
            self.failed.add(pod.uid)
            raise RuntimeError("injected failure after dra.net")


@contextlib.asynccontextmanager
async def second_plugin(ctrd: Containerd, handlers: NriHandlers) -> AsyncIterator[NriStub]:
    stub = NriStub(
        handlers, StubConfig(socket_path=str(ctrd.nri_socket), plugin_name="failer", plugin_idx="50")
    )
    task = asyncio.create_task(stub.run())
    try:
        await stub.wait_connected(15)
        yield stub
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 10)


async def test_runtime_retry_after_a_failed_sandbox_attaches_again(world: World) -> None:
    nic = world.nics.make(4)
    pod = PodId.new("retry")
    await world.put(pod, nic, full_config(nic))
    async with second_plugin(world.ctrd, FailFirstRun()):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await world.cri.run_pod_sandbox(pod.sandbox())
        assert "injected failure" in (err.value.details() or "")
        # containerd tore the sandbox down; our stop hook gave the device back.
        assert nic.on_host()
        sid, netns = await env.run_pod(world.cri, world.ctrd, pod)
    assert env.link(netns, "net1") is not None and env.ping(netns, nic.peer_ip)
    await env.stop_pod(world.cri, sid)
    assert nic.on_host()


def container_spec(ctrd: Containerd, cid: str) -> dict[str, Any]:
    path = ctrd.state / "io.containerd.runtime.v2.task" / "k8s.io" / cid / "config.json"
    return dict(json.loads(path.read_text()))


async def test_every_container_gets_the_rdma_device_files(world: World) -> None:
    """Device files from a fake /dev tree (the attach process runs with --dev-root
    <tmp>/root): character nodes with /dev/null's and /dev/zero's numbers stand in
    for uverbs0 and rdma_cm, so runc can really create them in the container."""
    dev = world.tmp / "root" / "dev" / "infiniband"
    dev.mkdir()
    os.mknod(dev / "uverbs0", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(dev / "rdma_cm", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    nic = world.nics.make(5)
    pod = PodId.new("rdma")
    rdma = st.RdmaConfig(
        dev_chars=[
            st.LinuxDevice(path="/dev/infiniband/uverbs0", type="c", major=1, minor=3, file_mode=0o666),
            st.LinuxDevice(path="/dev/infiniband/rdma_cm", type="c", major=1, minor=5),
            st.LinuxDevice(path="/dev/infiniband/umad0", type="c", major=1, minor=7),  # absent on the host
        ]
    )
    await world.put(pod, nic, full_config(nic), rdma=rdma)
    sid, netns = await env.run_pod(world.cri, world.ctrd, pod)
    assert env.link(netns, "net1") is not None
    cids = []
    for name in ("app", "sidecar"):
        cid = await world.cri.create_container(sid, pod.sandbox(), ContainerConfig(name=name))
        await world.cri.start_container(cid)
        cids.append(cid)
    for cid in cids:
        spec = container_spec(world.ctrd, cid)
        devices = {d["path"]: d for d in spec["linux"].get("devices", [])}
        assert (devices["/dev/infiniband/uverbs0"]["major"], devices["/dev/infiniband/uverbs0"]["minor"]) == (
            1,
            3,
        )
        assert devices["/dev/infiniband/uverbs0"]["fileMode"] == 0o666
        assert (devices["/dev/infiniband/rdma_cm"]["major"], devices["/dev/infiniband/rdma_cm"]["minor"]) == (
            1,
            5,
        )
        assert "/dev/infiniband/umad0" not in devices
        allowed = {
            (d.get("major"), d.get("minor")) for d in spec["linux"]["resources"]["devices"] if d["allow"]
        }
        assert {(1, 3), (1, 5)} <= allowed
        pid = int(
            (world.ctrd.state / "io.containerd.runtime.v2.task" / "k8s.io" / cid / "init.pid").read_text()
        )
        node = os.stat(f"/proc/{pid}/root/dev/infiniband/uverbs0")
        assert stat.S_ISCHR(node.st_mode) and (os.major(node.st_rdev), os.minor(node.st_rdev)) == (1, 3)


async def test_containers_of_a_pod_without_rdma_get_no_device_files(world: World) -> None:
    nic = world.nics.make(6)
    pod = PodId.new("plain")
    await world.put(pod, nic, full_config(nic))
    sid, _ = await env.run_pod(world.cri, world.ctrd, pod)
    cid = await world.cri.create_container(sid, pod.sandbox(), ContainerConfig(name="app"))
    await world.cri.start_container(cid)
    spec = container_spec(world.ctrd, cid)
    assert not any(d["path"].startswith("/dev/infiniband") for d in spec["linux"].get("devices", []))
