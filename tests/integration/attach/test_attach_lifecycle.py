"""The attach service across restarts: the runtime's, its own (SIGKILL, also during a
churn of pods), the store's; its liveness as prepare's safety gate reads it; and the
graceful stop's order. Real processes, a private containerd per test, veth NICs.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dev.cluster.containerd import Containerd
from dev.cluster.cri import CriClient
from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from shared.storeclient import StoreClient
from tests.integration.attach import attach_env as env
from tests.integration.attach.attach_env import PodId, VethNic

pytestmark = [pytest.mark.containerd, pytest.mark.root, pytest.mark.netns, pytest.mark.slow]


class World(env.World):
    async def health(self) -> admin_pb2.HealthResponse:
        async with grpc.aio.insecure_channel(f"unix:{self.attach.socket}") as ch:
            return await admin_pb2_grpc.AdminStub(ch).Health(admin_pb2.HealthRequest(), timeout=5)

    async def ready(self, timeout_s: float = 30.0) -> None:
        """Connected to the runtime and done recovering."""

        async def check() -> bool:
            try:
                return (await self.health()).ready
            except grpc.aio.AioRpcError:
                return False

        await env.wait_for(check, timeout_s, "attach service ready")


@pytest.fixture
async def world(containerd_private: Containerd, tmp_path: Path) -> AsyncIterator[World]:
    ctrd = containerd_private
    store_proc = env.store_process(tmp_path).start()
    attach = env.attach_process(tmp_path, ctrd.nri_socket)
    w: World | None = None
    try:
        attach.start()
        async with StoreClient(store_proc.socket) as store, CriClient(ctrd.grpc_socket) as cri:
            w = World(tmp_path, ctrd, cri, store_proc, store, attach)
            await env.wait_liveness(store, connected=True)
            yield w
            if not attach.proc or attach.proc.poll() is not None:
                attach.start()
            await w.ready()
            await asyncio.to_thread(ctrd.remove_all_pods)
    finally:
        attach.stop()
        store_proc.stop()
        if w is not None:
            w.nics.cleanup()


def simple_config(nic: VethNic, host: int = 2) -> dict[str, Any]:
    return {"interface": {"name": "net1", "addresses": [nic.address(host)]}}


def in_pod(netns: str, nic: VethNic) -> bool:
    return env.link(netns, "net1") is not None and not nic.on_host()


async def test_liveness_follows_the_runtime_the_attach_process_and_the_store(world: World) -> None:
    live = await env.wait_liveness(world.store, connected=True)
    assert (live.runtime_name, live.draining) == ("containerd", False)
    assert (await world.health()).ready

    await world.ctrd.astop()
    await env.wait_liveness(world.store, connected=False)
    health = await world.health()
    assert not health.ready and "not connected" in health.detail
    await world.ctrd.astart()
    await env.wait_liveness(world.store, connected=True)

    world.attach.kill()
    # The store sees the stream break at once: no lease to expire.
    t0 = time.monotonic()
    await env.wait_liveness(world.store, connected=False, timeout_s=5)
    assert time.monotonic() - t0 < 2
    world.attach.start()
    live = await env.wait_liveness(world.store, connected=True)
    assert live.instance  # a new instance id

    # The store forgets liveness when it restarts; attach reports it again.
    world.store_proc.kill()
    world.store_proc.start()
    await env.wait_liveness(world.store, connected=True)


async def test_runtime_restart_keeps_devices_in_their_pods(world: World) -> None:
    nic_a, nic_b = world.nics.make(10), world.nics.make(11)
    pod_a = PodId.new("before-restart")
    await world.put(pod_a, nic_a, simple_config(nic_a))
    sid_a, ns_a = await env.run_pod(world.cri, world.ctrd, pod_a)
    assert in_pod(ns_a, nic_a)

    await world.ctrd.arestart()
    await env.wait_liveness(world.store, connected=True)
    await world.ready()
    assert in_pod(ns_a, nic_a) and env.ping(ns_a, nic_a.peer_ip)
    res = env.results_by_device(await world.store.get_pod(pod_a.uid))[nic_a.name]
    assert res.attached and not res.error

    pod_b = PodId.new("after-restart")
    await world.put(pod_b, nic_b, simple_config(nic_b))
    sid_b, ns_b = await env.run_pod(world.cri, world.ctrd, pod_b)
    assert in_pod(ns_b, nic_b)
    await env.stop_pod(world.cri, sid_b)
    assert nic_b.on_host()  # StopPodSandbox gave it back

    # containerd 1.7 sends no NRI StopPodSandbox/RemovePodSandbox for a sandbox that
    # was created before it restarted. The attach service holds a reference to the
    # pod's netns, so the veth survives the runtime removing the netns, and it sees
    # the netns path go and gives the device back.
    await env.stop_pod(world.cri, sid_a)
    await env.wait_for(nic_a.on_host, 10, f"{nic_a.name} back on the host")
    host = env.link(None, nic_a.name)
    assert host is not None and "UP" in host["flags"]
    assert any(
        "without a StopPodSandbox" in line.get("msg", "") and line.get("pod_uid") == pod_a.uid
        for line in env.attach_log_lines(world.attach)
    )

    async def returned() -> bool:
        res = env.results_by_device(await world.store.get_pod(pod_a.uid)).get(nic_a.name)
        return res is not None and not res.attached

    await env.wait_for(returned, 10, "attach result of the returned device")


async def test_restart_recovers_pods_started_and_removed_while_attach_was_down(world: World) -> None:
    nic_run, nic_late, nic_gone = world.nics.make(20), world.nics.make(21), world.nics.make(22)
    running, late, gone = PodId.new("running"), PodId.new("late"), PodId.new("gone")
    for pod, nic in ((running, nic_run), (late, nic_late), (gone, nic_gone)):
        await world.put(pod, nic, simple_config(nic))
    _, ns_run = await env.run_pod(world.cri, world.ctrd, running)
    sid_gone, ns_gone = await env.run_pod(world.cri, world.ctrd, gone)
    await asyncio.sleep(0.3)  # let the store writes land before the kill

    world.attach.kill()
    await env.wait_liveness(world.store, connected=False)
    # Without the plugin the runtime starts the pod as if it had no devices.
    _, ns_late = await env.run_pod(world.cri, world.ctrd, late)
    assert env.link(ns_late, "net1") is None and nic_late.on_host()
    world.attach.start()
    await world.ready()

    assert in_pod(ns_run, nic_run)
    assert in_pod(ns_late, nic_late) and env.ping(ns_late, nic_late.peer_ip)  # attached late
    assert in_pod(ns_gone, nic_gone)

    async def recorded() -> Any:
        res = env.results_by_device(await world.store.get_pod(late.uid)).get(nic_late.name)
        return res if res is not None and res.attached else None

    res = await env.wait_for(recorded, 10, "the late attach on record")
    assert res.interface_name == "net1" and res.ips == [nic_late.address(2)]
    await env.stop_pod(world.cri, sid_gone)
    assert nic_gone.on_host()
    lines = env.attach_log_lines(world.attach)
    assert any(
        "attaching it now" in line.get("msg", "") and line.get("device") == nic_late.name for line in lines
    )


@dataclass
class StopGate:
    """Stops of pods wait while the attach service is down (see the churn test)."""

    open: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.open.set()

    async def stop(self, cri: CriClient, sid: str) -> None:
        await self.open.wait()
        self.in_flight += 1
        try:
            await env.stop_pod(cri, sid)
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        self.open.clear()
        await env.wait_for(lambda: self.in_flight == 0, 30, "stops in flight to finish")


async def test_sigkill_during_a_churn_of_20_pods_loses_no_device(world: World) -> None:
    """Ten lanes, each a NIC used by two pods in turn (the first one deleted, the
    second left running): 20 pods. The attach service is SIGKILLed in the middle of
    a RunPodSandbox hook (right after its log says a device moved into the pod, before
    the addresses are set) and started again; RunPodSandbox calls keep coming while it
    is down (those pods start without their device and get it at recovery).

    Stops wait while it is down: a veth stand-in dies with its pod's netns when
    nobody moves it out first (a physical NIC would fall back to the host and be
    reclaimed by its altname), which is a property of veth, not of attach.
    """
    rng = random.Random(int(os.environ.get("DRANET_CHURN_SEED", "1234")))
    nics = [world.nics.make(30 + i) for i in range(10)]
    gate = StopGate()
    live: dict[str, tuple[PodId, str, VethNic]] = {}  # sandbox id -> pod, netns, nic
    started = asyncio.Event()
    starts = 0
    calls = 0

    async def lane(i: int) -> None:
        nonlocal starts, calls
        nic = nics[i]
        await asyncio.sleep(rng.random() * 0.5)
        for round_ in range(2):
            pod = PodId.new(f"churn-{i}-{round_}")
            cfg = await world.put(pod, nic, simple_config(nic, 2 + round_))
            calls += 1
            if calls == 7:
                started.set()
            sid, netns = await env.run_pod(world.cri, world.ctrd, pod)
            live[sid] = (pod, netns, nic)
            starts += 1
            if round_ == 0:
                await asyncio.sleep(rng.random() * 0.8)
                await gate.stop(world.cri, sid)
                del live[sid]
                await world.store.delete_claim(cfg.claim.uid)  # prepare's NodeUnprepare

    async def killer() -> None:
        await started.wait()
        await gate.close()
        seen = world.attach.log_path.stat().st_size
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with world.attach.log_path.open("rb") as f:
                f.seek(seen)
                new = f.read()
            if b"from host netns" in new and b'"msg": "device ' in new:
                break  # a device is on its way into a pod
            await asyncio.sleep(0.001)
        world.attach.kill()
        await asyncio.sleep(1.0)  # RunPodSandbox calls meet a runtime without our plugin
        world.attach.start()
        await world.ready()
        gate.open.set()

    await asyncio.gather(*(lane(i) for i in range(10)), killer())
    await world.ready()

    assert len(live) == 10
    for pod, netns, nic in live.values():
        assert in_pod(netns, nic), f"{nic.name} of {pod.name} is not in its pod"
        assert env.ping(netns, nic.peer_ip), f"{pod.name} cannot reach its peer"

    async def all_recorded() -> bool:
        for pod, _, nic in live.values():
            res = env.results_by_device(await world.store.get_pod(pod.uid)).get(nic.name)
            if res is None or not res.attached:
                return False
        return True

    await env.wait_for(all_recorded, 10, "attach results of the live pods")
    # Stop everything: every NIC comes home.
    await asyncio.gather(*(env.stop_pod(world.cri, sid) for sid in list(live)))
    missing = [n.name for n in nics if not n.on_host()]
    assert not missing, f"lost: {missing}"


async def test_graceful_stop_drains_serves_prepared_pods_then_leaves(world: World) -> None:
    """SIGTERM: draining=true at once (prepare's gate now refuses claims) while NRI
    is still served: a pod prepared before the stop still gets its device; the
    plugin leaves only after every prepared pod had 2 s without NRI activity."""
    world.attach.stop()
    world.attach.args += ["--drain-quiet", "2", "--drain-poll", "0.1"]
    world.attach.start()
    await env.wait_liveness(world.store, connected=True)
    nic_a, nic_b = world.nics.make(50), world.nics.make(51)
    pod_a, pod_b = PodId.new("drain-a"), PodId.new("drain-b")
    await world.put(pod_a, nic_a, simple_config(nic_a))
    await world.put(pod_b, nic_b, simple_config(nic_b))
    await env.run_pod(world.cri, world.ctrd, pod_a)

    assert world.attach.proc is not None
    world.attach.proc.send_signal(signal.SIGTERM)
    t_term = time.time_ns()
    live = await env.wait_liveness(world.store, connected=True, draining=True, timeout_s=5)
    assert live.connected
    await asyncio.sleep(0.5)
    _, ns_b = await env.run_pod(world.cri, world.ctrd, pod_b)  # served while draining
    assert in_pod(ns_b, nic_b)

    async def touched() -> int:
        return int((await world.store.get_pod(pod_b.uid)).activity.last_nri_activity_unix_nano)

    t_b = await env.wait_for(touched, 5, "pod b's NRI activity on record")
    assert t_b > t_term

    await env.wait_liveness(world.store, connected=False, timeout_s=15)
    t_left = time.time_ns()
    code = await asyncio.to_thread(world.attach.proc.wait, 15)
    assert code == 0
    assert (t_left - t_b) / 1e9 >= 2.0  # pod b's quiet period was waited out
    lines = env.attach_log_lines(world.attach)
    last_start = max(i for i, line in enumerate(lines) if line.get("msg") == "attach starting")
    order = [
        line["msg"]
        for line in lines[last_start:]
        if line.get("logger") == "services.attach.server" and line["msg"].startswith("graceful stop")
    ]
    assert order[0] == "graceful stop: draining" and order[-1] == "graceful stop: stopping the NRI plugin"
    assert "graceful stop: waiting for prepared pods to finish their NRI hooks" in order


async def test_graceful_stop_without_the_store_ends_after_one_quiet_period(world: World) -> None:
    """The store gone before attach's SIGTERM (as when a pod's containers all stop at once):
    the drain cannot list prepared pods and gives up after one quiet period, not after its
    timeout, and attach exits 0."""
    world.attach.stop()
    world.attach.args += ["--drain-quiet", "2", "--drain-poll", "0.5", "--drain-timeout", "300"]
    world.attach.start()
    await env.wait_liveness(world.store, connected=True)
    world.store_proc.kill()
    assert world.attach.proc is not None
    t0 = time.monotonic()
    world.attach.proc.send_signal(signal.SIGTERM)
    code = await asyncio.to_thread(world.attach.proc.wait, 30)
    took = time.monotonic() - t0
    assert code == 0
    assert took < 15, f"attach took {took:.1f}s to stop without its store"
    msgs = [line["msg"] for line in env.attach_log_lines(world.attach)]
    assert "graceful stop: the store is gone; stopping without its list" in msgs
    world.store_proc.start()


async def test_store_outage_fails_new_pods_retryably_and_loses_no_record(world: World) -> None:
    """With the store down, a running pod still stops cleanly (the hooks know what it
    holds) and its record is written once the store is back; a new pod cannot start
    (its configs cannot be read: the runtime fails it and the kubelet retries)."""
    nic_a, nic_b = world.nics.make(60), world.nics.make(61)
    pod_a, pod_b = PodId.new("store-a"), PodId.new("store-b")
    await world.put(pod_a, nic_a, simple_config(nic_a))
    await world.put(pod_b, nic_b, simple_config(nic_b))
    sid_a, ns_a = await env.run_pod(world.cri, world.ctrd, pod_a)
    assert in_pod(ns_a, nic_a)

    world.store_proc.kill()
    await env.stop_pod(world.cri, sid_a)
    assert nic_a.on_host()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await world.cri.run_pod_sandbox(pod_b.sandbox())
    assert "cannot read its stored configs" in (err.value.details() or "")
    assert nic_b.on_host()

    world.store_proc.start()
    await env.wait_liveness(world.store, connected=True)

    async def a_returned() -> bool:
        state = await world.store.get_pod(pod_a.uid)
        return not state.results  # the stop's "returned" record, then the remove's clear

    await env.wait_for(a_returned, 15, "pod a's records written after the outage")
    _, ns_b = await env.run_pod(world.cri, world.ctrd, pod_b)  # the kubelet's retry
    assert in_pod(ns_b, nic_b)
