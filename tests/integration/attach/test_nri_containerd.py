"""The NRI stub against a real containerd 1.7 with NRI, driven through CRI.

containerd comes from the development control plane's fixture (a private daemon
with its own sockets, bridge and state); the stub dials its NRI socket exactly
as the attach service dials /var/run/nri/nri.sock on a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dev.cluster.containerd import Containerd
from dev.cluster.cri import ContainerConfig, CriClient, SandboxConfig
from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.stub import NriHandlers, NriStub, RuntimeInfo, StubConfig

pytestmark = [pytest.mark.containerd, pytest.mark.root]

TEST_DEVICE = "/dev/dranet-nri-test0"  # added by CreateContainer: /dev/null's numbers, 1:3


class Recorder(NriHandlers):
    """dranet's hook set (pod events + CreateContainer), recording what arrives."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []  # (hook, pod name, netns path)
        self.syncs: list[list[nri_pb2.PodSandbox]] = []
        self.changed = asyncio.Event()
        self.fail_run: Exception | None = None
        self.run_delay = 0.0
        self.adjust_annotation = ""

    def _note(self, hook: str, pod: nri_pb2.PodSandbox) -> None:
        netns = next((n.path for n in pod.linux.namespaces if n.type == "network"), "")
        self.events.append((hook, pod.name, netns))
        self.changed.set()

    async def wait_for(self, hook: str, pod: str, timeout_s: float = 10) -> tuple[str, str, str]:
        async with asyncio.timeout(timeout_s):
            while True:
                for e in self.events:
                    if e[:2] == (hook, pod):
                        return e
                self.changed.clear()
                await self.changed.wait()

    async def synchronize(
        self, pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container]
    ) -> Sequence[nri_pb2.ContainerUpdate]:
        self.syncs.append(list(pods))
        return ()

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        self._note("run", pod)
        if self.run_delay:
            await asyncio.sleep(self.run_delay)
        if self.fail_run is not None:
            raise self.fail_run

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        self._note("stop", pod)

    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        self._note("remove", pod)

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment:
        self._note("create", pod)
        adj = nri_pb2.ContainerAdjustment()
        dev = adj.linux.devices.add(path=TEST_DEVICE, type="c", major=1, minor=3)
        dev.file_mode.value = 0o666
        if self.adjust_annotation:
            adj.annotations["dra.net/test-payload"] = self.adjust_annotation
        return adj


@dataclass
class Plugin:
    stub: NriStub
    handlers: Recorder
    states: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_states(self, want: list[str], timeout_s: float = 20) -> None:
        async with asyncio.timeout(timeout_s):
            while self.states != want:
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture
def ctrd(containerd_private: Containerd) -> Containerd:
    """A containerd of the test's own: tests here restart it."""
    return containerd_private


@pytest.fixture
async def cri(ctrd: Containerd) -> AsyncIterator[CriClient]:
    async with CriClient(ctrd.grpc_socket, timeout=30) as client:
        yield client


@contextlib.asynccontextmanager
async def plugin(ctrd: Containerd, handlers: Recorder | None = None, **config: Any) -> AsyncIterator[Plugin]:
    h = handlers or Recorder()
    p: Plugin

    async def up(info: RuntimeInfo) -> None:
        p.states.append("up")
        p.changed.set()

    async def down(reason: str) -> None:
        p.states.append("down")
        p.changed.set()

    config.setdefault("backoff_initial", 0.05)
    stub = NriStub(
        h, StubConfig(socket_path=str(ctrd.nri_socket), **config), on_connected=up, on_disconnected=down
    )
    p = Plugin(stub, h)
    task = asyncio.create_task(stub.run())
    try:
        await stub.wait_connected(15)
        yield p
    finally:
        await stub.stop()
        await asyncio.wait_for(task, 10)


def sandbox(name: str, **kw: Any) -> SandboxConfig:
    return SandboxConfig(name=name, uid=str(uuid.uuid4()), namespace="nri-test", **kw)


def bundle(ctrd: Containerd, container_id: str) -> Path:
    return ctrd.state / "io.containerd.runtime.v2.task" / "k8s.io" / container_id


async def test_registers_with_containerd_and_gets_configure_and_synchronize(
    ctrd: Containerd, cri: CriClient
) -> None:
    early = sandbox("before-plugin")
    sid = await cri.run_pod_sandbox(early)
    netns = (await cri.pod_sandbox_status(sid)).netns_path
    ctrd.note_netns(netns)
    async with plugin(ctrd) as p:
        info = p.stub.runtime
        assert info is not None
        assert info.name == "containerd"
        assert info.version.startswith(ctrd.version)
        assert info.events == 0x0F
        # NRI v0.6.1 sends no timeouts: the stub assumes the documented defaults.
        assert (info.registration_timeout, info.request_timeout) == (5.0, 2.0)
        (synced,) = p.handlers.syncs
        got = {s.id: s for s in synced}
        assert got[sid].uid == early.uid and got[sid].name == "before-plugin"
        assert [n.path for n in got[sid].linux.namespaces if n.type == "network"] == [netns]


async def test_pod_events_and_a_device_adjustment_applied_by_containerd(
    ctrd: Containerd, cri: CriClient
) -> None:
    async with plugin(ctrd) as p:
        cfg = sandbox("events")
        sid = await cri.run_pod_sandbox(cfg)
        status = await cri.pod_sandbox_status(sid)
        ctrd.note_netns(status.netns_path)
        assert status.netns_path
        assert await p.handlers.wait_for("run", "events") == ("run", "events", status.netns_path)

        cid = await cri.create_container(sid, cfg, ContainerConfig(name="app"))
        await cri.start_container(cid)
        spec = json.loads((bundle(ctrd, cid) / "config.json").read_text())
        assert {"path": TEST_DEVICE, "type": "c", "major": 1, "minor": 3, "fileMode": 0o666} in spec["linux"][
            "devices"
        ]
        assert {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"} in spec["linux"][
            "resources"
        ]["devices"]
        # The runtime really created the node inside the container.
        pid = int((bundle(ctrd, cid) / "init.pid").read_text())
        st = os.stat(f"/proc/{pid}/root{TEST_DEVICE}")
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)

        await cri.stop_container(cid)
        await cri.remove_container(cid)
        await cri.stop_pod_sandbox(sid)
        await p.handlers.wait_for("stop", "events")
        await cri.remove_pod_sandbox(sid)
        await p.handlers.wait_for("remove", "events")
        hooks = [e[0] for e in p.handlers.events if e[1] == "events"]
        assert hooks == ["run", "create", "stop", "remove"]


@pytest.mark.slow
async def test_large_messages_both_ways(ctrd: Containerd, cri: CriClient) -> None:
    """Synchronize of many pods with big annotations (hundreds of KiB from Go to
    us, over many mux frames) and CreateContainer answers of 5 KiB and 256 KiB
    (from us to Go's reader, split as its own bufio writer would)."""
    pods = {}
    for i in range(12):
        cfg = sandbox(f"big-{i}", annotations={"dra.net/filler": f"{i:02d}" + "x" * 32 * 1024})
        sid = await cri.run_pod_sandbox(cfg)
        ctrd.note_netns((await cri.pod_sandbox_status(sid)).netns_path)
        pods[sid] = cfg
    h = Recorder()
    async with plugin(ctrd, h) as p:
        (synced,) = p.handlers.syncs
        got = {s.id: s for s in synced}
        assert set(pods) <= set(got)
        for sid, cfg in pods.items():
            assert got[sid].annotations["dra.net/filler"] == cfg.annotations["dra.net/filler"]
        assert sum(s.ByteSize() for s in synced) > 12 * 32 * 1024

        sid, cfg = next(iter(pods.items()))
        for name, size in (("medium", 5000), ("large", 256 * 1024)):
            h.adjust_annotation = "y" * size
            cid = await cri.create_container(sid, cfg, ContainerConfig(name=name))
            await cri.start_container(cid)
            spec = json.loads((bundle(ctrd, cid) / "config.json").read_text())
            assert spec["annotations"]["dra.net/test-payload"] == "y" * size
        assert p.stub.connects == 1  # never dropped by the runtime


@pytest.mark.slow
async def test_containerd_restart_reconnects_and_resynchronizes(ctrd: Containerd, cri: CriClient) -> None:
    async with plugin(ctrd) as p:
        cfg = sandbox("survivor")
        sid = await cri.run_pod_sandbox(cfg)
        ctrd.note_netns((await cri.pod_sandbox_status(sid)).netns_path)
        await ctrd.arestart()
        await p.wait_states(["up", "down", "up"])
        assert p.stub.connects == 2 and len(p.handlers.syncs) == 2
        assert sid in {s.id for s in p.handlers.syncs[1]}
        # Events flow on the new connection.
        cfg2 = sandbox("after-restart")
        sid2 = await cri.run_pod_sandbox(cfg2)
        ctrd.note_netns((await cri.pod_sandbox_status(sid2)).netns_path)
        await p.handlers.wait_for("run", "after-restart")


async def test_handler_error_fails_run_pod_sandbox(ctrd: Containerd, cri: CriClient) -> None:
    async with plugin(ctrd) as p:
        p.handlers.fail_run = RuntimeError("claim nri-test/c1: device eth7 is not prepared")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await cri.run_pod_sandbox(sandbox("refused"))
        assert "device eth7 is not prepared" in (e.value.details() or "")
        assert p.stub.connected and p.stub.connects == 1
        p.handlers.fail_run = None
        sid = await cri.run_pod_sandbox(sandbox("accepted"))
        ctrd.note_netns((await cri.pod_sandbox_status(sid)).netns_path)
        await p.handlers.wait_for("run", "accepted")


@pytest.mark.slow
async def test_stub_deadline_fails_the_pod_instead_of_losing_the_plugin(
    ctrd: Containerd, cri: CriClient
) -> None:
    async with plugin(ctrd, handler_timeout=0.3) as p:
        p.handlers.run_delay = 5.0
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await cri.run_pod_sandbox(sandbox("too-slow"))
        assert "deadline" in (e.value.details() or "")
        assert p.stub.connected and p.stub.connects == 1


@pytest.mark.slow
async def test_handler_over_the_runtime_timeout_drops_the_plugin_then_it_reconnects(
    ctrd: Containerd, cri: CriClient
) -> None:
    # No stub deadline: the runtime's own 2 s request timeout decides.
    async with plugin(ctrd, handler_timeout=None) as p:
        p.handlers.run_delay = 3.0
        cfg = sandbox("timed-out")
        # containerd closes the plugin and usually carries on as if it had succeeded; on a
        # loaded machine the sandbox may instead fail with the request's deadline. Either
        # way the plugin must be dropped and must reconnect.
        sid: str | None = None
        try:
            sid = await cri.run_pod_sandbox(cfg)
            ctrd.note_netns((await cri.pod_sandbox_status(sid)).netns_path)
        except grpc.aio.AioRpcError as exc:
            assert "deadline" in (exc.details() or "").lower(), exc
        p.handlers.run_delay = 0.0
        await p.wait_states(["up", "down", "up"])
        assert p.stub.connects == 2
        if sid is not None:
            assert sid in {s.id for s in p.handlers.syncs[-1]}
