"""dranet's NRI request metrics and the NRI hint, from the stub against the scripted runtime."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.stub import NriHandlers, NriStub, StubConfig, mark_failed, mark_noop
from services.attach.nri.ttrpc import TtrpcError
from shared.metrics import REGISTRY
from tests.unit.nri.fake_runtime import FakeRuntime

RunStub = Callable[..., NriStub]


def count(method: str, status: str) -> float:
    labels = {"method": method, "status": status}
    total = REGISTRY.get_sample_value("dranet_driver_nri_plugin_requests_total", labels) or 0.0
    latency = (
        REGISTRY.get_sample_value("dranet_driver_nri_plugin_requests_latency_seconds_count", labels) or 0.0
    )
    assert total == latency
    return total


class Hooks(NriHandlers):
    """RunPodSandbox: nothing to do for pods named "other", fails for "bad"; CreateContainer: noop;
    StopPodSandbox: never fails the call, but says so when its work did (in a task of its own)."""

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        if pod.name == "other":
            mark_noop()
        if pod.name == "bad":
            raise TtrpcError(2, "device failed")

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        async def work() -> None:
            mark_failed()

        await asyncio.create_task(work())

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        mark_noop()
        return None


def pod(name: str) -> nri_pb2.PodSandbox:
    return nri_pb2.PodSandbox(id=f"sb-{name}", name=name, namespace="default", uid=f"uid-{name}")


async def test_requests_are_counted_by_method_and_status(runtime: FakeRuntime, run_stub: RunStub) -> None:
    run_stub(Hooks())
    peer = await runtime.next_peer()
    before = {
        (m, s): count(m, s)
        for m in ("RunPodSandbox", "StopPodSandbox", "CreateContainer", "Synchronize", "Configure")
        for s in ("success", "failed", "noop")
    }
    await peer.handshake()
    await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("mine"))  # StateChange: named after the event
    await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("other"))
    with pytest.raises(TtrpcError):
        await peer.event(nri_pb2.RUN_POD_SANDBOX, pod("bad"))
    await peer.event(nri_pb2.STOP_POD_SANDBOX, pod("mine"))
    await peer.call(
        "CreateContainer",
        nri_pb2.CreateContainerRequest(pod=pod("mine"), container=nri_pb2.Container(name="c")),
        nri_pb2.CreateContainerResponse,
    )
    grew = {k: count(*k) - v for k, v in before.items() if count(*k) != v}
    assert grew == {
        ("Configure", "success"): 1,
        ("Synchronize", "success"): 1,
        ("RunPodSandbox", "success"): 1,
        ("RunPodSandbox", "noop"): 1,
        ("RunPodSandbox", "failed"): 1,
        ("StopPodSandbox", "failed"): 1,
        ("CreateContainer", "noop"): 1,
    }


async def test_unreachable_socket_warns_with_the_nri_hint_once_per_disconnect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stub = NriStub(
        Hooks(),
        StubConfig(socket_path=str(tmp_path / "absent.sock"), backoff_initial=0.01, backoff_max=0.01),
    )
    with caplog.at_level(logging.INFO, logger="services.attach.nri.stub"):
        task = asyncio.create_task(stub.run())
        await asyncio.sleep(0.3)
        await stub.stop()
        await asyncio.wait_for(task, 5)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert 'plugins."io.containerd.nri.v1.nri"' in warnings[0] and "disable = false" in warnings[0]
    assert "containerd 2.x" in warnings[0] and "/var/run/nri/nri.sock" in warnings[0]
    # The later attempts stay at INFO until the warning interval passes.
    assert sum("not reachable" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO) >= 3
