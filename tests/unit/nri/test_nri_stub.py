"""The plugin stub against a scripted runtime over a real unix socket."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.stub import (
    LEGACY_VALID_EVENTS,
    NriHandlers,
    NriStub,
    RuntimeInfo,
    StubConfig,
    event_mask,
    implemented_events,
)
from services.attach.nri.ttrpc import Code, TtrpcError
from tests.unit.nri.fake_runtime import FakeRuntime

RunStub = Callable[..., NriStub]


def pod(name: str, uid: str = "", netns: str = "") -> nri_pb2.PodSandbox:
    p = nri_pb2.PodSandbox(id=f"sb-{name}", name=name, namespace="default", uid=uid or f"uid-{name}")
    if netns:
        p.linux.namespaces.add(type="network", path=netns)
    return p


class Recorder(NriHandlers):
    """dranet's hook set: pod events and CreateContainer; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.synced: list[list[str]] = []
        self.configured: list[nri_pb2.ConfigureRequest] = []
        self.delay = 0.0
        self.fail: Exception | None = None

    async def _hook(self, what: str, p: nri_pb2.PodSandbox) -> None:
        self.calls.append((what, p.name))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise self.fail

    async def configure(self, request: nri_pb2.ConfigureRequest) -> None:
        self.configured.append(request)

    async def synchronize(
        self, pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container]
    ) -> Sequence[nri_pb2.ContainerUpdate]:
        self.synced.append([p.name for p in pods])
        return [nri_pb2.ContainerUpdate(container_id="c1")]

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        await self._hook("run", pod)

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        await self._hook("stop", pod)

    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        await self._hook("remove", pod)

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment:
        await self._hook("create", pod)
        adj = nri_pb2.ContainerAdjustment()
        adj.linux.devices.add(
            path="/dev/infiniband/uverbs0", type="c", major=231, minor=192
        ).file_mode.value = 0o666
        return adj


@pytest.mark.parametrize(
    ("events", "mask"),
    [
        ((nri_pb2.RUN_POD_SANDBOX,), 0x1),
        (
            (
                nri_pb2.RUN_POD_SANDBOX,
                nri_pb2.STOP_POD_SANDBOX,
                nri_pb2.REMOVE_POD_SANDBOX,
                nri_pb2.CREATE_CONTAINER,
            ),
            0xF,
        ),
        ((nri_pb2.REMOVE_CONTAINER,), 0x400),
        ((nri_pb2.VALIDATE_CONTAINER_ADJUSTMENT,), 0x2000),
    ],
)
def test_event_mask(events: tuple[int, ...], mask: int) -> None:
    assert event_mask(*events) == mask


@pytest.mark.parametrize("bad", [nri_pb2.UNKNOWN, nri_pb2.LAST])
def test_event_mask_rejects_non_events(bad: int) -> None:
    with pytest.raises(ValueError, match=f"event {bad}"):
        event_mask(bad)


def test_mask_follows_the_overridden_hooks() -> None:
    class OnlyCreate(NriHandlers):
        async def create_container(self, pod: Any, container: Any) -> None:
            return None

    assert implemented_events(Recorder()) == [1, 2, 3, 4]
    assert NriStub(Recorder()).mask == 0x0F
    assert NriStub(OnlyCreate()).mask == 0x08
    assert NriStub(NriHandlers()).mask == 0
    assert NriStub(Recorder()).mask & ~LEGACY_VALID_EVENTS == 0


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("plugin_name", "dra net", "plugin name"),
        ("plugin_name", "", "plugin name"),
        ("plugin_idx", "0", "two digits"),
        ("plugin_idx", "1a", "two digits"),
        ("handler_timeout", 0, "handler_timeout"),
    ],
)
def test_config_validation(field: str, value: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        StubConfig(**{field: value})


async def test_register_configure_synchronize_and_events(runtime: FakeRuntime, run_stub: RunStub) -> None:
    h = Recorder()
    connected: list[RuntimeInfo] = []

    async def on_connected(info: RuntimeInfo) -> None:
        connected.append(info)

    stub = run_stub(h, on_connected=on_connected, plugin_name="dra.net", plugin_idx="07")
    peer = await runtime.next_peer()
    reg = await asyncio.wait_for(peer.registered, 5)
    assert (reg.plugin_name, reg.plugin_idx, reg.NRI_version) == ("dra.net", "07", "")
    events = await peer.configure("containerd", "1.7.24", request_timeout=3000, registration_timeout=4000)
    assert events == 0x0F
    assert (h.configured[0].runtime_name, h.configured[0].runtime_version) == ("containerd", "1.7.24")
    assert not stub.connected
    resp = await peer.synchronize([pod("a", netns="/var/run/netns/cni-a"), pod("b")])
    assert [u.container_id for u in resp.update] == ["c1"] and not resp.more
    info = await stub.wait_connected(5)
    assert info == RuntimeInfo("containerd", "1.7.24", "", 4.0, 3.0, 0x0F)
    assert connected == [info] and h.synced == [["a", "b"]]

    for ev, name in [
        (nri_pb2.RUN_POD_SANDBOX, "a"),
        (nri_pb2.STOP_POD_SANDBOX, "a"),
        (nri_pb2.REMOVE_POD_SANDBOX, "a"),
    ]:
        await peer.event(ev, pod(name))
    # Events the plugin did not ask for are answered and ignored.
    await peer.event(nri_pb2.START_CONTAINER, pod("a"))
    created = await peer.call(
        "CreateContainer",
        nri_pb2.CreateContainerRequest(pod=pod("a"), container=nri_pb2.Container(id="c", name="app")),
        nri_pb2.CreateContainerResponse,
    )
    dev = created.adjust.linux.devices[0]
    assert (dev.path, dev.type, dev.major, dev.minor, dev.file_mode.value) == (
        "/dev/infiniband/uverbs0",
        "c",
        231,
        192,
        0o666,
    )
    assert h.calls == [("run", "a"), ("stop", "a"), ("remove", "a"), ("create", "a")]


async def test_configure_may_arrive_before_the_registration_reply(
    runtime: FakeRuntime, run_stub: RunStub
) -> None:
    runtime.register_gate.clear()  # hold RegisterPlugin's answer back
    stub = run_stub(Recorder())
    peer = await runtime.next_peer()
    await asyncio.wait_for(peer.registered, 5)
    assert await peer.configure() == 0x0F
    await peer.synchronize([pod("a")])
    assert not stub.connected
    runtime.register_gate.set()
    await stub.wait_connected(5)


async def test_v012_dedicated_pod_rpcs_and_unimplemented_fallback(
    runtime: FakeRuntime, run_stub: RunStub
) -> None:
    h = Recorder()
    run_stub(h)
    peer = await runtime.next_peer()
    await peer.handshake()
    await peer.call(
        "RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=pod("x")), nri_pb2.RunPodSandboxResponse
    )
    await peer.call(
        "StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=pod("x")), nri_pb2.StopPodSandboxResponse
    )
    await peer.call(
        "RemovePodSandbox", nri_pb2.RemovePodSandboxRequest(pod=pod("x")), nri_pb2.RemovePodSandboxResponse
    )
    assert h.calls == [("run", "x"), ("stop", "x"), ("remove", "x")]
    # A hook the plugin lacks: code 12 makes a v0.12 runtime fall back to StateChange.
    with pytest.raises(TtrpcError) as e:
        await peer.call(
            "PostCreateContainer",
            nri_pb2.PostCreateContainerRequest(pod=pod("x")),
            nri_pb2.PostCreateContainerResponse,
        )
    assert (e.value.code, e.value.message) == (Code.UNIMPLEMENTED, "method PostCreateContainer")


async def test_split_synchronize(runtime: FakeRuntime, run_stub: RunStub) -> None:
    h = Recorder()
    stub = run_stub(h)
    peer = await runtime.next_peer()
    await asyncio.wait_for(peer.registered, 5)
    await peer.configure()
    for part in (["p0", "p1"], ["p2"], ["p3", "p4"]):
        resp = await peer.synchronize([pod(n) for n in part], more=True)
        assert resp.more and not resp.update
        assert not stub.connected and h.synced == []
    final = await peer.synchronize([pod("p5")], more=False)
    assert not final.more and [u.container_id for u in final.update] == ["c1"]
    assert h.synced == [["p0", "p1", "p2", "p3", "p4", "p5"]]
    await stub.wait_connected(5)


async def test_handler_error_fails_the_request(runtime: FakeRuntime, run_stub: RunStub) -> None:
    h = Recorder()
    run_stub(h)
    peer = await runtime.next_peer()
    await peer.handshake()
    h.fail = RuntimeError("claim default/c: device eth1 is gone")
    with pytest.raises(TtrpcError) as e:
        await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("a"))
    assert (e.value.code, e.value.message) == (Code.UNKNOWN, "claim default/c: device eth1 is gone")
    h.fail = TtrpcError(Code.FAILED_PRECONDITION, "store unreachable")
    with pytest.raises(TtrpcError) as e:
        await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("a"))
    assert e.value.code == Code.FAILED_PRECONDITION


async def test_slow_handler_is_cancelled_below_the_runtime_timeout(
    runtime: FakeRuntime, run_stub: RunStub, caplog: pytest.LogCaptureFixture
) -> None:
    h = Recorder()
    stub = run_stub(h, handler_timeout=0.2)
    peer = await runtime.next_peer()
    await peer.handshake()
    h.delay = 5.0
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with caplog.at_level(logging.ERROR), pytest.raises(TtrpcError) as e:
        await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("slow"))
    assert e.value.code == Code.DEADLINE_EXCEEDED
    assert 0.2 <= loop.time() - t0 < 1.0
    assert any("overran its 0.200s deadline" in r.getMessage() for r in caplog.records)
    # The plugin answered in time, so the runtime keeps it: the same connection still serves.
    h.delay = 0.0
    await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("fast"))
    assert stub.connected and stub.connects == 1


async def test_deadline_follows_a_shorter_runtime_request_timeout(
    runtime: FakeRuntime, run_stub: RunStub
) -> None:
    h = Recorder()
    run_stub(h, handler_timeout=10.0)
    peer = await runtime.next_peer()
    await peer.handshake()
    h.delay = 5.0
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TtrpcError) as e:
        # The runtime's ttrpc deadline is 0.4 s: the stub must answer within 0.75 of it.
        await peer.call("StateChange", nri_pb2.StateChangeEvent(event=1, pod=pod("a")), nri_pb2.Empty, 0.4)
    assert e.value.code == Code.DEADLINE_EXCEEDED
    assert loop.time() - t0 < 0.39


async def test_slow_but_in_time_handler_is_logged(
    runtime: FakeRuntime, run_stub: RunStub, caplog: pytest.LogCaptureFixture
) -> None:
    h = Recorder()
    run_stub(h, handler_timeout=0.2)
    peer = await runtime.next_peer()
    await peer.handshake()
    h.delay = 0.15
    with caplog.at_level(logging.WARNING):
        await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("a"))
    assert any("StateChangeEvent handler took" in r.getMessage() for r in caplog.records)


async def test_reconnects_after_the_runtime_drops_the_plugin(runtime: FakeRuntime, run_stub: RunStub) -> None:
    h = Recorder()
    states: list[str] = []

    async def up(info: RuntimeInfo) -> None:
        states.append("up")

    async def down(reason: str) -> None:
        states.append("down")

    stub = run_stub(h, on_connected=up, on_disconnected=down)
    first = await runtime.next_peer()
    await first.handshake()
    await stub.wait_connected(5)
    await first.close()
    second = await runtime.next_peer()
    await second.handshake()
    await stub.wait_connected(5)
    assert states == ["up", "down", "up"]
    assert stub.connects == 2 and stub.syncs == 2
    await second.event(nri_pb2.RUN_POD_SANDBOX, pod("after"))
    assert h.calls == [("run", "after")]


async def test_waits_for_a_runtime_that_is_not_there_yet(run_stub: RunStub, runtime: FakeRuntime) -> None:
    await runtime.stop()
    os.unlink(runtime.path)
    stub = run_stub(Recorder())
    await asyncio.sleep(0.2)  # long enough for several attempts at 0.02-0.1 s backoff
    assert stub.connects == 0 and not stub.connected
    late = FakeRuntime(runtime.path)
    await late.start()
    try:
        peer = await late.next_peer()
        await peer.handshake()
        await stub.wait_connected(5)
    finally:
        await late.stop()


async def test_reconnects_when_the_runtime_never_synchronizes(
    runtime: FakeRuntime, run_stub: RunStub
) -> None:
    stub = run_stub(Recorder(), sync_timeout=0.2)
    first = await runtime.next_peer()
    await asyncio.wait_for(first.registered, 5)
    await first.configure()
    # No Synchronize: a runtime whose sync failed keeps the socket but sends no events.
    second = await runtime.next_peer()
    assert first.conn is not None
    await asyncio.wait_for(first.conn.wait_closed(), 5)
    await second.handshake()
    await stub.wait_connected(5)


async def test_registration_rejected_then_retried(runtime: FakeRuntime, run_stub: RunStub) -> None:
    h = Recorder()
    stub = run_stub(h)
    first = await runtime.next_peer()
    await asyncio.wait_for(first.registered, 5)
    await first.close()  # what a runtime does with a plugin it refuses
    second = await runtime.next_peer()
    await second.handshake()
    await stub.wait_connected(5)


async def test_shutdown_reaches_the_handlers(runtime: FakeRuntime, run_stub: RunStub) -> None:
    down = asyncio.Event()

    class H(Recorder):
        async def shutdown(self) -> None:
            down.set()

    run_stub(H())
    peer = await runtime.next_peer()
    await peer.handshake()
    await peer.call("Shutdown", nri_pb2.Empty(), nri_pb2.Empty)
    assert down.is_set()


async def test_stop_disconnects(runtime: FakeRuntime, run_stub: RunStub) -> None:
    stub = run_stub(Recorder())
    peer = await runtime.next_peer()
    await peer.handshake()
    await stub.wait_connected(5)
    await stub.stop()
    assert peer.conn is not None
    await asyncio.wait_for(peer.conn.wait_closed(), 5)
    assert not stub.connected


class OnlyRun(NriHandlers):
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        self.ran.append(pod.name)


async def test_hooks_not_overridden_are_unsubscribed_and_answer_no_change(
    runtime: FakeRuntime, run_stub: RunStub
) -> None:
    h = OnlyRun()
    run_stub(h)
    peer = await runtime.next_peer()
    await asyncio.wait_for(peer.registered, 5)
    assert await peer.configure() == 0x1  # RunPodSandbox only
    await peer.synchronize([])
    await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("a"))
    assert h.ran == ["a"]
    # Requests for hooks the plugin lacks are not served at all (as Go's stub):
    # a runtime that sends one anyway gets UNIMPLEMENTED, never a half answer.
    for method, req, resp in [
        ("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod("a")), nri_pb2.CreateContainerResponse),
        ("StopContainer", nri_pb2.StopContainerRequest(pod=pod("a")), nri_pb2.StopContainerResponse),
    ]:
        with pytest.raises(TtrpcError) as e:
            await peer.call(method, req, resp)
        assert (e.value.code, e.value.message) == (Code.UNIMPLEMENTED, f"method {method}")
    # An unsubscribed event through StateChange is answered and ignored.
    await peer.event(nri_pb2.STOP_POD_SANDBOX, pod("a"))
    assert h.ran == ["a"]
