"""The hooks' decisions against a real store process, with the netlink engine replaced
by a ledger of where each device is.

What is checked here is the bookkeeping: which sandbox holds which device, what the
store records and in which order, what Synchronize recovers, and that Stop and
Remove never fail. The netlink work itself is tested against real containerd and
real netns in test_attach_containerd.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from dev.cluster.procs import ServiceProcess
from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.books import netns_exists
from services.attach.engine import Attached, AttachFailed, DetachFailed, Location, ReturnState
from services.attach.hooks import AttachHooks, HookConfig
from services.attach.nri.ttrpc import TtrpcError
from services.attach.writer import StoreWriter
from shared.attachplan import DeviceNode, container_devices
from shared.storeclient import StoreCallError, StoreClient
from tests.integration.attach.attach_env import wait_for

HOST = "host"


def resolve(netns: str) -> str:
    """The hooks reach a netns the runtime removed through their own fd
    (/proc/<pid>/fd/<n>); here that is the file the "netns" was."""
    if netns.startswith("/proc/"):
        return os.readlink(netns).removesuffix(" (deleted)")
    return netns


class Ledger:
    """A stand-in engine: where each device is ("host", a netns path, or "lost")."""

    def __init__(self) -> None:
        self.where: dict[str, str] = {}
        self.calls: list[tuple[str, str, str | None]] = []
        self.fail_attach: dict[str, str] = {}
        self.fail_detach: set[str] = set()
        self.attach_delay = 0.0

    async def attach(self, config: st.DeviceConfig, netns: str) -> Attached:
        self.calls.append(("attach", config.device, netns))
        if self.attach_delay:
            await asyncio.sleep(self.attach_delay)
        if config.device in self.fail_attach:
            raise AttachFailed(f"device {config.device}: {self.fail_attach[config.device]}")
        here = self.where.get(config.device, HOST)
        if here not in (HOST, netns):
            raise AttachFailed(f"device {config.device} is in {here}")
        converged = here == netns
        self.where[config.device] = netns
        return Attached(
            interface_name=f"net-{config.device}",
            ips=("192.0.2.5/24",),
            hardware_address="02:00:00:00:00:01",
            converged=converged,
        )

    async def detach(self, what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> ReturnState:
        netns = resolve(netns)
        self.calls.append(("detach", what.device, netns))
        if what.device in self.fail_detach:
            raise DetachFailed(f"device {what.device}: busy")
        here = self.where.get(what.device, HOST)
        if here == "lost":
            return ReturnState.GONE
        if here == HOST:
            return ReturnState.ALREADY_ON_HOST
        if here == netns:
            self.where[what.device] = HOST
            return ReturnState.RETURNED
        if not netns_exists(here):
            self.where[what.device] = HOST  # its netns died: the kernel gave it back
            return ReturnState.RECLAIMED
        if here != netns:
            return ReturnState.GONE  # not where we were told to look
        self.where[what.device] = HOST
        return ReturnState.RETURNED

    async def locate(self, what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> Location:
        here = self.where.get(what.device, HOST)
        if here == HOST:
            return Location.HOST
        if netns and here == netns:
            return Location.POD
        return Location.MISSING

    def container_devices(self, configs: Sequence[st.DeviceConfig]) -> Sequence[DeviceNode]:
        return container_devices(configs)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[StoreClient]:
    run = tmp_path / "run"
    proc = ServiceProcess(
        "services.store",
        ["--db-dir", str(tmp_path / "db"), "--run-dir", str(run)],
        socket=run / "store.sock",
        log_path=tmp_path / "store.log",
    ).start()
    try:
        async with StoreClient(proc.socket) as client:
            yield client
    finally:
        proc.stop()


class World:
    def __init__(self, tmp: Path, store: StoreClient) -> None:
        self.tmp = tmp
        self.store = store
        self.engine = Ledger()
        self.writer = StoreWriter(store)
        self.writer.start()
        self.hooks = AttachHooks(store, self.engine, self.writer, HookConfig(stop_budget_s=1.0))
        self.n = 0

    def netns(self) -> str:
        """A fresh "netns path" (a file: the hooks only check that it exists)."""
        self.n += 1
        p = self.tmp / f"netns-{self.n}"
        p.write_text("")
        return str(p)

    def pod(self, uid: str, netns: str, sandbox: str = "", name: str = "") -> nri_pb2.PodSandbox:
        p = nri_pb2.PodSandbox(
            id=sandbox or f"sb-{uid}-{self.n}", uid=uid, name=name or f"pod-{uid}", namespace="ns"
        )
        if netns:
            p.linux.namespaces.add(type="network", path=netns)
        p.linux.namespaces.add(type="ipc", path="")
        return p

    async def prepare(self, uid: str, *devices: str, rdma: bool = False) -> None:
        cfgs = []
        for d in devices:
            cfg = st.DeviceConfig(
                pod=st.PodRef(uid=uid, namespace="ns", name=f"pod-{uid}"),
                device=d,
                claim=st.ClaimRef(uid=f"c-{d}", namespace="ns", name=f"claim-{d}"),
                driver="dra.net",
                pool="node-1",
                host_ifname=d,
                pod_config_json=json.dumps({"interface": {"name": f"net-{d}"}}),
                rdma_netns_mode="shared",
            )
            if rdma:
                cfg.rdma.dev_chars.add(
                    path="/dev/infiniband/uverbs0", type="c", major=231, minor=192, file_mode=0o666
                )
                cfg.rdma.dev_chars.add(path="/dev/infiniband/rdma_cm", type="c", major=10, minor=58)
            cfgs.append(cfg)
        await self.store.put_devices(cfgs)

    async def results(self, uid: str) -> dict[str, st.AttachResult]:
        await self.writer.flush(5)
        return {r.device: r for r in (await self.store.get_pod(uid)).results}


@pytest.fixture
async def world(tmp_path: Path, store: StoreClient) -> AsyncIterator[World]:
    w = World(tmp_path, store)
    try:
        yield w
    finally:
        await w.hooks.close()
        await w.writer.close()


async def test_run_attaches_records_and_is_idempotent(world: World) -> None:
    await world.prepare("p1", "eth1", "eth2")
    ns = world.netns()
    pod = world.pod("p1", ns)
    await world.hooks.run_pod_sandbox(pod)
    assert world.engine.where == {"eth1": ns, "eth2": ns}
    res = await world.results("p1")
    assert {d: (r.attached, r.interface_name, list(r.ips)) for d, r in res.items()} == {
        "eth1": (True, "net-eth1", ["192.0.2.5/24"]),
        "eth2": (True, "net-eth2", ["192.0.2.5/24"]),
    }
    r = res["eth1"]
    assert (r.claim.name, r.pool, r.driver, r.host_ifname) == ("claim-eth1", "node-1", "dra.net", "eth1")
    assert [(c.type, c.status, c.reason) for c in r.conditions] == [
        ("Ready", "True", "NetworkDeviceReady"),
        ("NetworkReady", "True", "NetworkReady"),
    ]
    assert (await world.store.get_pod("p1")).activity.last_nri_activity_unix_nano > 0
    # The runtime retries the hook for the same sandbox: nothing moves again.
    calls = len(world.engine.calls)
    await world.hooks.run_pod_sandbox(pod)
    assert len(world.engine.calls) == calls


async def test_pod_without_devices_is_left_alone(world: World) -> None:
    await world.hooks.run_pod_sandbox(world.pod("nobody", world.netns()))
    assert world.engine.calls == []
    assert await world.hooks.create_container(world.pod("nobody", world.netns()), nri_pb2.Container()) is None
    state = await world.store.get_pod("nobody")
    assert not state.results and not state.activity.last_nri_activity_unix_nano


async def test_provisional_configs_are_ignored(world: World) -> None:
    cfg = st.DeviceConfig(
        pod=st.PodRef(uid="pv", name="pod-pv", namespace="ns"),
        device="eth9",
        claim=st.ClaimRef(uid="c-pv", namespace="ns", name="claim-pv"),
        host_ifname="eth9",
        provisional=True,
    )
    await world.store.put_devices([cfg])
    await world.hooks.run_pod_sandbox(world.pod("pv", world.netns()))
    assert world.engine.calls == []


async def test_host_network_pod_fails_with_dranets_message(world: World) -> None:
    await world.prepare("hn", "eth1")
    with pytest.raises(TtrpcError) as err:
        await world.hooks.run_pod_sandbox(world.pod("hn", ""))
    assert "RunPodSandbox pod ns/pod-hn using host network can not claim host devices" in str(err.value)
    res = await world.results("hn")
    assert not res["eth1"].attached and "host network" in res["eth1"].error
    assert world.engine.calls == []


async def test_with_the_store_down_host_network_containers_start_and_others_wait(tmp_path: Path) -> None:
    """Found by the churn on the real cluster: the store container was SIGKILLed, and its
    restart (a container of our own host-network pod) went through attach's CreateContainer,
    which asked the store, which was down: a deadlock, the pod never recovered. A host-network
    pod holds no dra.net device, so its containers start without the store; a pod with a
    network namespace still waits for the store (it may hold devices: fail closed)."""
    run = tmp_path / "run"
    proc = ServiceProcess(
        "services.store",
        ["--db-dir", str(tmp_path / "db"), "--run-dir", str(run)],
        socket=run / "store.sock",
        log_path=tmp_path / "store.log",
    ).start()
    proc.stop()
    async with StoreClient(proc.socket, deadline_s=1.0) as store:
        w = World(tmp_path, store)
        try:
            host_net = w.pod("driver-pod", "")
            assert await w.hooks.create_container(host_net, nri_pb2.Container(name="store")) is None
            with pytest.raises(TtrpcError) as err:
                await w.hooks.create_container(w.pod("app", w.netns()), nri_pb2.Container(name="app"))
            assert "cannot read its stored configs" in str(err.value)
        finally:
            await w.hooks.close()
            await w.writer.close()


async def test_failure_half_way_rolls_back_every_device(world: World) -> None:
    await world.prepare("p2", "eth1", "eth2")
    world.engine.fail_attach["eth2"] = "route via 203.0.113.1: network unreachable"
    ns = world.netns()
    with pytest.raises(TtrpcError) as err:
        await world.hooks.run_pod_sandbox(world.pod("p2", ns))
    assert "eth2" in str(err.value) and "network unreachable" in str(err.value)
    assert world.engine.where == {"eth1": HOST}  # eth1 given back, eth2 never left (engine rolled back)
    res = await world.results("p2")
    assert not res["eth2"].attached and "network unreachable" in res["eth2"].error
    assert [(c.type, c.status, c.reason) for c in res["eth2"].conditions] == [
        ("Ready", "False", "NetworkDeviceAttachFailed")
    ]
    assert not res["eth1"].attached and "rolled back" in res["eth1"].error
    # The kubelet's retry (a new sandbox) succeeds once the cause is gone.
    del world.engine.fail_attach["eth2"]
    ns2 = world.netns()
    await world.hooks.run_pod_sandbox(world.pod("p2", ns2))
    assert world.engine.where == {"eth1": ns2, "eth2": ns2}
    res = await world.results("p2")
    assert all(r.attached and not r.error for r in res.values())


async def test_new_sandbox_takes_devices_from_the_old_one_and_old_remove_keeps_state(world: World) -> None:
    await world.prepare("p3", "eth1")
    ns1, ns2 = world.netns(), world.netns()
    old, new = world.pod("p3", ns1, sandbox="sb-old"), world.pod("p3", ns2, sandbox="sb-new")
    await world.hooks.run_pod_sandbox(old)
    await world.hooks.run_pod_sandbox(new)
    assert world.engine.where == {"eth1": ns2}
    assert ("detach", "eth1", ns1) in world.engine.calls
    # The old sandbox's late stop and removal leave the new sandbox alone.
    await world.hooks.stop_pod_sandbox(old)
    await world.hooks.remove_pod_sandbox(old)
    assert world.engine.where == {"eth1": ns2}
    res = await world.results("p3")
    assert res["eth1"].attached
    await world.hooks.stop_pod_sandbox(new)
    assert world.engine.where == {"eth1": HOST}
    assert not (await world.results("p3"))["eth1"].attached
    await world.hooks.remove_pod_sandbox(new)
    await world.writer.flush(5)
    state = await world.store.get_pod("p3")
    assert not state.results and not state.activity.last_nri_activity_unix_nano
    assert [d.device for d in state.devices] == ["eth1"]  # prepare's config stays for NodeUnprepare


async def test_stop_and_remove_never_fail_and_remove_retries_a_failed_return(world: World) -> None:
    await world.prepare("p4", "eth1")
    ns = world.netns()
    pod = world.pod("p4", ns)
    await world.hooks.run_pod_sandbox(pod)
    world.engine.fail_detach.add("eth1")
    await world.hooks.stop_pod_sandbox(pod)  # does not raise
    res = await world.results("p4")
    assert res["eth1"].attached and "not returned" in res["eth1"].error
    os.unlink(ns)  # the runtime removed the netns; the kernel gave the device back
    world.engine.fail_detach.clear()
    await world.hooks.remove_pod_sandbox(pod)
    assert world.engine.calls[-1] == ("detach", "eth1", ns) and world.engine.where["eth1"] == HOST
    await world.writer.flush(5)
    assert not (await world.store.get_pod("p4")).results


async def test_stop_answers_within_budget_while_the_work_goes_on(world: World) -> None:
    await world.prepare("p5", "eth1")
    ns = world.netns()
    pod = world.pod("p5", ns)
    await world.hooks.run_pod_sandbox(pod)
    orig = world.engine.detach

    async def slow_detach(what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> ReturnState:
        await asyncio.sleep(1.5)
        return await orig(what, netns, mac)

    world.engine.detach = slow_detach  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await world.hooks.stop_pod_sandbox(pod)
    assert loop.time() - t0 < 1.3
    assert world.engine.where["eth1"] == ns
    await world.hooks.close(5)
    assert world.engine.where["eth1"] == HOST


async def test_run_overrunning_its_deadline_gives_devices_back_afterwards(world: World) -> None:
    await world.prepare("p6", "eth1")
    world.engine.attach_delay = 0.5
    ns = world.netns()
    pod = world.pod("p6", ns)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):  # the stub's deadline, shortened
            await world.hooks.run_pod_sandbox(pod)
    await world.hooks.close(5)
    assert world.engine.where["eth1"] == HOST


async def test_create_container_adds_rdma_files_of_every_device_once(world: World) -> None:
    await world.prepare("p7", "eth1", "eth2", rdma=True)
    pod = world.pod("p7", world.netns())
    await world.hooks.run_pod_sandbox(pod)
    adj = await world.hooks.create_container(pod, nri_pb2.Container(name="app"))
    assert adj is not None
    assert [(d.path, d.type, d.major, d.minor) for d in adj.linux.devices] == [
        ("/dev/infiniband/uverbs0", "c", 231, 192),
        ("/dev/infiniband/rdma_cm", "c", 10, 58),
    ]
    assert adj.linux.devices[0].file_mode.value == 0o666
    # A pod the hooks did not see start (attach restarted): read from the store.
    other = world.pod("p7", world.netns(), sandbox="sb-other")
    adj2 = await world.hooks.create_container(other, nri_pb2.Container(name="app"))
    assert adj2 is not None and len(adj2.linux.devices) == 2


async def test_synchronize_keeps_recovers_returns_and_reports(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    # kept: attached and recorded, pod live.
    await world.prepare("keep", "k1")
    ns_keep = world.netns()
    keep = world.pod("keep", ns_keep)
    await world.hooks.run_pod_sandbox(keep)
    # gone: attached, then the pod vanished while we were away (netns deleted, the
    # kernel returned the device under its pod name; the engine renames it back).
    await world.prepare("gone", "g1")
    ns_gone = world.netns()
    await world.hooks.run_pod_sandbox(world.pod("gone", ns_gone))
    # late: prepared, pod started while we were away.
    await world.prepare("late", "l1")
    ns_late = world.netns()
    # lost: recorded as attached, but neither in its pod nor on the host.
    await world.prepare("lost", "x1")
    ns_lost = world.netns()
    await world.hooks.run_pod_sandbox(world.pod("lost", ns_lost))
    # waiting: prepared, not started: nothing to do.
    await world.prepare("wait", "w1")
    await world.writer.flush(5)

    # A fresh process: new hooks, same store.
    await world.hooks.close()
    world.hooks = AttachHooks(world.store, world.engine, world.writer)
    os.unlink(ns_gone)
    world.engine.where["x1"] = "lost"
    live = [keep, world.pod("late", ns_late), world.pod("lost", ns_lost)]
    await world.hooks.synchronize(live, [])
    with caplog.at_level(logging.INFO, logger="services.attach.hooks"):
        report = await world.hooks.wait_recovered(10)
        await asyncio.sleep(0)  # the recovery task logs its summary right after
    # The summary is logged (a lost device once broke it: a duplicate "lost" keyword).
    (done,) = [r for r in caplog.records if r.getMessage() == "recovery done"]
    assert (done.kept, done.lost, done.returned) == (1, 1, 1)  # type: ignore[attr-defined]
    assert report.counts["kept"] == 1
    assert report.counts["attached_late"] == 1
    assert report.counts["lost"] == 1 and ("lost", "x1") in report.lost
    assert report.counts["not_started"] == 1
    assert report.counts["returned"] == 1
    assert world.engine.where == {"k1": ns_keep, "g1": HOST, "l1": ns_late, "x1": "lost"}
    assert (await world.results("late"))["l1"].attached
    assert not (await world.store.get_pod("gone")).results
    assert "lost" in (await world.results("lost"))["x1"].error
    # The kept pod's stop after the restart still finds its device.
    await world.hooks.stop_pod_sandbox(keep)
    assert world.engine.where["k1"] == HOST


async def test_hooks_wait_for_recovery_to_finish(world: World) -> None:
    await world.prepare("a", "d1")
    ns = world.netns()
    world.engine.attach_delay = 0.3
    # The pod started while we were away: recovery attaches d1 (0.3 s), and a new
    # pod's RunPodSandbox that arrives meanwhile waits for it.
    await world.hooks.synchronize([world.pod("a", ns)], [])
    await world.prepare("b", "d2")
    await world.hooks.run_pod_sandbox(world.pod("b", world.netns()))
    assert [c[:2] for c in world.engine.calls] == [("attach", "d1"), ("attach", "d2")]


async def test_a_failed_sandbox_keeps_its_error_until_prepare_lets_the_pod_go(world: World) -> None:
    await world.hooks.synchronize([], [])  # attach registered with the runtime (GC waits for that)
    await world.hooks.wait_recovered(5)
    await world.prepare("p8", "eth1")
    world.engine.fail_attach["eth1"] = "no such device"
    pod = world.pod("p8", world.netns())
    with pytest.raises(TtrpcError):
        await world.hooks.run_pod_sandbox(pod)
    # containerd stops and removes the failed sandbox right away.
    await world.hooks.stop_pod_sandbox(pod)
    await world.hooks.remove_pod_sandbox(pod)
    assert "no such device" in (await world.results("p8"))["eth1"].error
    gc = asyncio.create_task(world.hooks.collect_garbage())
    try:
        await asyncio.sleep(0.2)  # the watch is open
        await world.store.delete_claim("c-eth1")  # NodeUnprepare

        async def cleared() -> bool:
            state = await world.store.get_pod("p8")
            return not state.results and not state.activity.revision

        await wait_for(cleared, 10, "attach state of p8 cleared")
    finally:
        gc.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gc


async def test_records_of_a_pod_unprepared_while_attach_was_down_wait_for_the_recovery(world: World) -> None:
    """Attach died with eth1 in p10; the runtime stopped the pod without us and the kubelet
    unprepared it (prepare removed the configs). The restarted attach's garbage collection
    must leave p10's records to its recovery, which gives eth1 back; cleared first, nothing
    would say where eth1 is (found by the churn: a veth lost that way)."""
    await world.prepare("p10", "eth1")
    ns = world.netns()
    await world.hooks.run_pod_sandbox(world.pod("p10", ns))
    assert (await world.results("p10"))["eth1"].attached
    os.remove(ns)  # the runtime removed the netns; the device fell back to the host unnoticed
    await world.store.delete_claim("c-eth1")  # NodeUnprepare
    later = AttachHooks(world.store, world.engine, world.writer, HookConfig(stop_budget_s=1.0))
    gc = asyncio.create_task(later.collect_garbage())
    try:
        await asyncio.sleep(0.5)  # the store answers at once: a GC that did not wait has run
        kept = (await world.results("p10")).get("eth1")
        assert kept is not None and kept.attached, "GC cleared the records before the recovery"
        await later.synchronize([], [])
        report = await later.wait_recovered(10)
        assert world.engine.where["eth1"] == HOST
        assert report.counts["returned"] == 1

        async def cleared() -> bool:
            state = await world.store.get_pod("p10")
            return not state.results and not state.activity.revision

        await wait_for(cleared, 10, "attach state of p10 cleared")
    finally:
        gc.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gc
        await later.close()


async def test_a_late_stop_of_a_finished_pod_needs_no_store(
    world: World, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime may send Stop or Remove again after the pod's state was cleared (after its
    claim was unprepared). Attach remembers the pod finished and answers without a store read:
    a store that is slow or away right then is no reason for an ERROR line (found by the churn:
    "cannot read the pod's attach state", on a busy node, for a pod long done)."""
    await world.hooks.synchronize([], [])
    await world.hooks.wait_recovered(5)
    await world.prepare("p11", "eth1")
    pod = world.pod("p11", world.netns())
    await world.hooks.run_pod_sandbox(pod)
    await world.hooks.stop_pod_sandbox(pod)
    await world.hooks.remove_pod_sandbox(pod)
    assert world.engine.where["eth1"] == HOST
    gc = asyncio.create_task(world.hooks.collect_garbage())
    try:
        await asyncio.sleep(0.2)
        await world.store.delete_claim("c-eth1")  # NodeUnprepare

        async def cleared() -> bool:
            state = await world.store.get_pod("p11")
            return not state.results and not state.activity.revision

        await wait_for(cleared, 10, "attach state of p11 cleared")
    finally:
        gc.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gc

    async def away(uid: str) -> st.PodState:
        raise StoreCallError("UNAVAILABLE", "the store is away")

    monkeypatch.setattr(world.store, "get_pod", away)
    calls = len(world.engine.calls)
    with caplog.at_level(logging.INFO, logger="services.attach.hooks"):
        await world.hooks.stop_pod_sandbox(pod)
        await world.hooks.remove_pod_sandbox(pod)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert len(world.engine.calls) == calls
