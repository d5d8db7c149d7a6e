"""A pod that stops while attach is down keeps its devices until attach is back (netns pins,
services/attach/pins.py): real containerd, real store and attach processes, veth NICs. A veth
dies with its netns when nobody holds it, so without the pin the device would be lost; a
physical NIC would fall back to the host without its host config."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dev.cluster.containerd import Containerd
from dev.cluster.cri import CriClient
from shared.storeclient import StoreClient
from tests.integration.attach import attach_env as env
from tests.integration.attach.attach_env import PodId, VethNic
from tests.integration.attach.test_attach_lifecycle import World, in_pod, simple_config

pytestmark = [pytest.mark.containerd, pytest.mark.root, pytest.mark.netns, pytest.mark.slow]


async def _world(ctrd: Containerd, tmp_path: Path, pins: bool) -> AsyncIterator[World]:
    pin_dir = tmp_path / "pins"
    pin_dir.mkdir()
    store_proc = env.store_process(tmp_path).start()
    extra = ("--netns-pin-dir", str(pin_dir)) if pins else ()
    attach = env.attach_process(tmp_path, ctrd.nri_socket, *extra)
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
        for f in pin_dir.iterdir():
            subprocess.run(["umount", "-l", str(f)], capture_output=True)
        if w is not None:
            w.nics.cleanup()


@pytest.fixture
async def world(containerd_private: Containerd, tmp_path: Path) -> AsyncIterator[World]:
    async for w in _world(containerd_private, tmp_path, pins=True):
        yield w


@pytest.fixture
async def world_without_pins(containerd_private: Containerd, tmp_path: Path) -> AsyncIterator[World]:
    async for w in _world(containerd_private, tmp_path, pins=False):
        yield w


def _pins(w: World) -> list[str]:
    return sorted(f.name for f in (w.tmp / "pins").iterdir())


async def _start_then_stop_while_down(w: World, nic: VethNic, pod: PodId) -> str:
    await w.put(pod, nic, simple_config(nic))
    sid, netns = await env.run_pod(w.cri, w.ctrd, pod)
    assert in_pod(netns, nic)
    w.attach.kill()
    await env.wait_liveness(w.store, connected=False)
    await env.stop_pod(w.cri, sid)  # the runtime removes the netns; nobody moves the NIC out
    assert not await asyncio.to_thread(os.path.exists, netns)
    return sid


async def test_a_pod_stopped_while_attach_is_down_gets_its_device_back_through_the_pin(world: World) -> None:
    nic = world.nics.make(60)
    pod = PodId.new("stopped-while-down")
    sid = await _start_then_stop_while_down(world, nic, pod)
    assert _pins(world) == [f"{pod.uid}_{sid}"]
    assert not nic.on_host()  # still inside the pod's netns, which only the pin holds
    pinned = str(world.tmp / "pins" / f"{pod.uid}_{sid}")
    inside = subprocess.run(["nsenter", f"--net={pinned}", "ip", "link", "show", "net1"], capture_output=True)
    assert inside.returncode == 0, inside.stderr

    world.attach.start()
    await world.ready()
    assert nic.on_host(), "the NIC did not come back"
    assert env.link(None, nic.name)["operstate"] in ("UP", "LOWERLAYERDOWN", "UNKNOWN")
    assert _pins(world) == []  # the pin went with the device: the netns is free to go
    state = await world.store.get_pod(pod.uid)
    assert not state.results  # returned: nothing attached on record (the config is prepare's)
    # The same NIC serves the next pod.
    nxt = PodId.new("next")
    await world.put(nxt, nic, simple_config(nic, 3))
    sid2, ns2 = await env.run_pod(world.cri, world.ctrd, nxt)
    assert in_pod(ns2, nic) and env.ping(ns2, nic.peer_ip)
    await env.stop_pod(world.cri, sid2)
    assert nic.on_host() and _pins(world) == []


async def test_a_pod_stopped_and_unprepared_while_attach_is_down_still_gets_its_device_back(
    world: World,
) -> None:
    """The kubelet unprepares the claim right after the stop (prepare deletes its configs), so
    the restarted attach finds attach records of a pod that is no longer prepared. Its garbage
    collection must not clear them before the recovery has given the NIC back through the pin
    (found by the churn: the records went first, the pin was dropped, the veth died)."""
    nic = world.nics.make(63)
    pod = PodId.new("unprepared-while-down")
    cfg = await world.put(pod, nic, simple_config(nic))
    sid, netns = await env.run_pod(world.cri, world.ctrd, pod)
    assert in_pod(netns, nic)
    world.attach.kill()
    await env.wait_liveness(world.store, connected=False)
    await env.stop_pod(world.cri, sid)
    await world.store.delete_claim(cfg.claim.uid)  # prepare's NodeUnprepare
    assert _pins(world) == [f"{pod.uid}_{sid}"] and not nic.on_host()

    world.attach.start()
    await world.ready()
    assert nic.on_host(), "the NIC did not come back"
    assert _pins(world) == []
    state = await world.store.get_pod(pod.uid)
    assert not state.results and not state.devices  # nothing of the pod is left on record


async def test_without_pins_the_same_stop_loses_the_veth_and_says_so(world_without_pins: World) -> None:
    """What the pins prevent: the veth died with the netns; attach reports it lost."""
    w = world_without_pins
    nic = w.nics.make(61)
    pod = PodId.new("lost-without-pin")
    await _start_then_stop_while_down(w, nic, pod)
    assert _pins(w) == []
    w.attach.start()
    await w.ready()
    assert not nic.on_host()
    assert any(
        "is lost" in line.get("msg", "") and line.get("device") == nic.name
        for line in env.attach_log_lines(w.attach)
    )


async def test_a_sandbox_rebuilt_while_attach_was_down_gets_the_device_from_the_old_one(world: World) -> None:
    """A node's reboot or the runtime's restart: the pod's old sandbox, still holding the NIC
    through the pin, is replaced by a new one while attach is down. Recovery moves the NIC out
    of the old netns and into the live one."""
    nic = world.nics.make(62)
    pod = PodId.new("rebuilt")
    old = await _start_then_stop_while_down(world, nic, pod)
    await env.stop_pod(world.cri, old)
    sid, netns = await env.run_pod(world.cri, world.ctrd, pod)  # without our plugin: no device
    assert env.link(netns, "net1") is None
    world.attach.start()
    await world.ready()
    assert in_pod(netns, nic) and env.ping(netns, nic.peer_ip)
    assert _pins(world) == [f"{pod.uid}_{sid}"]
    await env.stop_pod(world.cri, sid)
    assert nic.on_host() and _pins(world) == []
