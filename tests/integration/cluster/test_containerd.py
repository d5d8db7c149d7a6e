"""The containerd fixture: a real containerd 1.7 with NRI and CRI, pods with real network namespaces,
restarts, and a teardown that leaves nothing behind."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from dev.cluster import containerd as ctrd
from dev.cluster.containerd import Containerd
from dev.cluster.cri import ContainerConfig, CriClient, SandboxConfig
from tests.fixtures_runtime import exists, is_netns_mount, mounted_under

pytestmark = [pytest.mark.containerd, pytest.mark.root]

REPO = Path(__file__).resolve().parents[3]


def link_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def shims_of(c: Containerd) -> list[int]:
    return ctrd._shim_pids(c.grpc_socket)


def sandbox(name: str, uid: str, c: Containerd) -> SandboxConfig:
    return SandboxConfig(
        name=name,
        uid=uid,
        namespace="default",
        labels={"app": name},
        annotations={"test": "yes"},
        log_directory=str(c.pod_log_dir / f"default_{name}_{uid}"),
    )


async def test_pod_sandbox_and_container_with_real_netns(
    containerd: Containerd, cri_client: CriClient
) -> None:
    assert await cri_client.ready()
    name, version = await cri_client.version()
    assert name == "containerd" and version.startswith("1.7.")
    assert containerd.version.startswith("1.7.") and version.startswith(containerd.version)

    cfg = sandbox("web", "uid-web-1", containerd)
    sid = await cri_client.run_pod_sandbox(cfg)
    st = await cri_client.pod_sandbox_status(sid)
    containerd.note_netns(st.netns_path)
    assert st.ready and (st.name, st.namespace, st.uid) == ("web", "default", "uid-web-1")
    assert st.labels["app"] == "web" and st.annotations["test"] == "yes"
    assert st.netns_path.startswith("/var/run/netns/cni-")
    assert is_netns_mount(st.netns_path), f"{st.netns_path} is not a netns bind mount"
    assert ipaddress.ip_address(st.ip) in containerd.cni_subnet
    # The pod's own namespace has its eth0 on our bridge and lo, nothing of the host.
    assert os.stat(st.netns_path).st_ino != os.stat("/proc/self/ns/net").st_ino

    cid = await cri_client.create_container(sid, cfg, ContainerConfig(name="app", labels={"c": "1"}))
    await cri_client.start_container(cid)
    cs = await cri_client.container_status(cid)
    assert cs.state == "CONTAINER_RUNNING" and cs.name == "app" and cs.image.endswith("local/pause:1")
    assert [s.id for s in await cri_client.list_pod_sandboxes(labels={"app": "web"})] == [sid]
    assert [c.id for c in await cri_client.list_containers(sid)] == [cid]

    await cri_client.stop_container(cid)
    assert (await cri_client.container_status(cid)).state == "CONTAINER_EXITED"
    await cri_client.remove_container(cid)
    await cri_client.stop_pod_sandbox(sid)
    assert not is_netns_mount(st.netns_path)
    await cri_client.remove_pod_sandbox(sid)
    assert not exists(st.netns_path)
    assert await cri_client.list_pod_sandboxes(labels={"app": "web"}) == []


def test_nri_socket_and_config(containerd: Containerd) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(containerd.nri_socket))
    config = containerd.config_path.read_text()
    assert "restrict_oom_score_adj = true" in config
    assert f'socket_path = "{containerd.nri_socket}"' in config
    conflist = json.loads(next(containerd.cni_conf_dir.glob("*.conflist")).read_text())
    bridge = conflist["plugins"][0]
    assert (
        bridge["bridge"] == containerd.bridge and bridge["ipMasq"] is False and bridge["isGateway"] is False
    )
    # The pod subnet does not overlap anything this host routes.
    assert not any(
        containerd.cni_subnet.overlaps(n) for n in ctrd._host_networks() if n != containerd.cni_subnet
    )


async def test_restart_keeps_pods_and_serves_again(containerd_private: Containerd) -> None:
    c = containerd_private
    first_pid = c.pid
    async with CriClient(c.grpc_socket) as cl:
        cfg = sandbox("db", "uid-db-1", c)
        sid = await cl.run_pod_sandbox(cfg)
        st = await cl.pod_sandbox_status(sid)
        c.note_netns(st.netns_path)
        cid = await cl.create_container(sid, cfg, ContainerConfig(name="db"))
        await cl.start_container(cid)

    seconds = await c.arestart()
    assert c.running and c.pid != first_pid
    assert seconds < 10
    async with CriClient(c.grpc_socket) as cl:
        # The sandbox and its container survived the daemon restart, with the same netns.
        again = await cl.pod_sandbox_status(sid)
        assert again.ready and again.netns_path == st.netns_path and is_netns_mount(st.netns_path)
        assert (await cl.container_status(cid)).state == "CONTAINER_RUNNING"
        # And the restarted daemon runs new pods.
        cfg2 = sandbox("db2", "uid-db-2", c)
        sid2 = await cl.run_pod_sandbox(cfg2)
        assert (await cl.pod_sandbox_status(sid2)).ready

    # A crash (SIGKILL) too: the shims keep the pods, and a new daemon finds them.
    await c.akill()
    assert not c.running and shims_of(c)
    await c.astart()
    async with CriClient(c.grpc_socket) as cl:
        assert {s.id for s in await cl.list_pod_sandboxes()} == {sid, sid2}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(c.nri_socket))


async def test_close_after_crash_leaves_nothing_behind() -> None:
    c = Containerd()
    try:
        await c.astart()
        async with CriClient(c.grpc_socket) as cl:
            cfg = sandbox("gone", "uid-gone", c)
            sid = await cl.run_pod_sandbox(cfg)
            netns = (await cl.pod_sandbox_status(sid)).netns_path
            c.note_netns(netns)
            cid = await cl.create_container(sid, cfg, ContainerConfig(name="app"))
            await cl.start_container(cid)
        assert link_exists(c.bridge) and is_netns_mount(netns)
        await c.akill()
        shims = shims_of(c)
        assert shims
    finally:
        await c.aclose()
    assert not exists(netns)
    assert not link_exists(c.bridge)
    assert not exists(c.workdir)
    assert not mounted_under(c.workdir)
    assert shims_of(c) == [] and not any(ctrd._pid_alive(p) for p in shims)
    assert not exists(c._claim.path)


def test_instance_of_a_killed_owner_is_reaped() -> None:
    """A test run that died (SIGKILL) leaves containerd, a pod and its netns; the next instance
    on this host cleans them up."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dev.cluster.containerd", "run"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        sock = info["grpc_socket"]
        workdir = Path(sock).parent

        async def run_pod() -> str:
            async with CriClient(sock) as cl:
                sid = await cl.run_pod_sandbox(
                    SandboxConfig(name="orphan", uid="uid-orphan", namespace="default")
                )
                return (await cl.pod_sandbox_status(sid)).netns_path

        netns = asyncio.run(run_pod())
        claim = next(
            f for f in ctrd.CLAIMS_DIR.glob("[0-9]*") if json.loads(f.read_text())["grpc_socket"] == sock
        )
        daemon_pid = json.loads(claim.read_text())["containerd_pid"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert ctrd._pid_alive(daemon_pid) and is_netns_mount(netns)

    fresh = Containerd()
    try:
        fresh.start()  # claiming a subnet reaps instances whose owner is gone
        deadline = time.monotonic() + 5
        while ctrd._pid_alive(daemon_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not ctrd._pid_alive(daemon_pid)
        assert not workdir.exists()
        assert not exists(netns)
        # The dead owner's claim is gone (the fresh instance may have taken the same index).
        assert not claim.exists() or json.loads(claim.read_text())["workdir"] == str(fresh.workdir)
    finally:
        fresh.close()


async def test_cri_errors_surface_as_grpc_errors(cri_client: CriClient) -> None:
    with pytest.raises(grpc.RpcError) as e:
        await cri_client.pod_sandbox_status("no-such-sandbox")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
