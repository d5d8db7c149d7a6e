"""Sidecar-style upgrades on the real cluster: each of the four services is replaced in turn
(SIGTERM, then a new process) while Pods with dra.net claims are created through the API server
and deleted. The real scheduler allocates, the real kubelet prepares (retrying while prepare or
attach is away) and runs them. No Pod runs without its NIC, every NIC comes back to the node, and
no stored config is lost or left behind."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dev.cluster.kube import KubeCluster
from tests.e2e.conftest import Node
from tests.support.kube import Kube, eventually, link, nic_name, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

NICS = 4
# A Pod created while prepare or attach is away waits for the kubelet's retry (its backoff grows).
RUN_WITHIN = 240.0
GONE_WITHIN = 120.0
REG_LINE = re.compile(r'"Connection changed".*driverName="dra\.net".*connected=true')


@pytest.fixture
def nics(kube: Kube, kube_cluster: KubeCluster) -> Iterator[list[str]]:
    names = [nic_name() for _ in range(NICS)]
    for name in names:
        kube_cluster.net.add_nic(name)
    yield names
    kube.delete_namespace()  # Pods stop while attach runs: NICs come back before they go
    for name in names:
        subprocess.run(["ip", "-n", kube_cluster.netns, "link", "del", name], capture_output=True)


async def wait_published(k: Kube, *names: str, within: float = 60.0) -> None:
    def check() -> bool:
        items = k.api.get(
            f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={k.c.node_name}"
        )["items"]
        return set(names) <= {d["name"] for s in items for d in s["spec"].get("devices") or []}

    await eventually(check, within, f"devices {names} published")


async def run_pod(n: Node, dc: str, name: str, nic: str) -> tuple[str, str, float]:
    """A Pod claiming ``nic`` (renamed net-<nic>); (pod uid, netns, seconds to Running), checked
    the moment the API server first shows it running."""
    k = n.kube
    t0 = time.monotonic()
    k.claim_and_pod(name, dc, on(nic), configs=[{"parameters": {"interface": {"name": f"net-{nic}"}}}])
    pod = await k.wait_phase(name, within=RUN_WITHIN)
    took = time.monotonic() - t0
    netns = await k.pod_netns(name)
    assert netns, f"pod {name} runs without a netns"
    assert link(netns, f"net-{nic}") is not None, f"pod {name} runs without its NIC {nic}"
    assert link(n.cluster.netns, nic) is None, f"{nic} is still on the node while pod {name} runs"
    return str(pod["metadata"]["uid"]), netns, took


async def remove_pod(n: Node, name: str, nic: str) -> None:
    k = n.kube
    k.delete_pod(name)
    k.delete_claim(name)
    await k.wait_gone(name, within=GONE_WITHIN)
    back = await eventually(lambda: link(n.cluster.netns, nic), 60, f"{nic} back on the node")
    assert "UP" in back["flags"]


async def stored_devices(n: Node, pod_uid: str) -> dict[str, bytes]:
    """The store's DeviceConfigs of a pod, device -> serialized record."""
    async with n.store() as store:
        return {c.device: c.SerializeToString() for c in (await store.get_pod(pod_uid)).devices}


async def wait_registered(n: Node, since: int) -> None:
    def again() -> bool:
        data = n.cluster.procs["kubelet"].log_path.read_bytes()[since:].decode(errors="replace")
        return bool(REG_LINE.search(data))

    await eventually(again, 60, "the kubelet registered the new prepare")


async def test_each_service_replaced_while_pods_come_and_go(node: Node, nics: list[str]) -> None:
    k, d = node.kube, node.driver
    await wait_published(k, *nics)
    dc = k.device_class("nic")
    first, a, b, _spare = nics
    timings: list[float] = []

    # One pod that lives through every upgrade.
    long_uid, long_ns, took = await run_pod(node, dc, "long", first)
    timings.append(took)
    long_before = await stored_devices(node, long_uid)
    assert list(long_before) == [first]
    for round_no, service in enumerate(("store", "inventory", "prepare", "attach"), start=1):
        # Pods are created while the service is being replaced.
        names = [(f"r{round_no}-a", a), (f"r{round_no}-b", b)]
        starts = [asyncio.create_task(run_pod(node, dc, nm, nic)) for nm, nic in names]
        await asyncio.sleep(0.3)
        since = node.cluster.procs["kubelet"].log_path.stat().st_size
        await asyncio.to_thread(d.restart, service)  # SIGTERM: the container is replaced
        if service == "prepare":
            await wait_registered(node, since)
        running = await asyncio.gather(*starts)
        timings += [t for _, _, t in running]
        # The long-lived pod still has its NIC.
        assert link(long_ns, f"net-{first}") is not None, (
            f"long pod lost its NIC across the {service} upgrade"
        )
        for name, nic in names:
            await remove_pod(node, name, nic)

    # Nothing of the finished pods is left in the store; the long pod's config survived as is.
    async def only_long() -> Any:
        async with node.store() as store:
            listing = await store.list()
        pods = {dc.pod.uid for dc in listing.devices}
        results = {r.pod_uid for r in listing.results}
        return listing if pods == {long_uid} and results <= {long_uid} else None

    await eventually(only_long, 60, "the store holds the long pod only")
    assert await stored_devices(node, long_uid) == long_before
    await remove_pod(node, "long", first)

    async def empty() -> bool:
        async with node.store() as store:
            listing = await store.list()
        return not listing.devices and not listing.results

    await eventually(empty, 60, "the store is empty")
    for nic in nics:
        assert link(node.cluster.netns, nic) is not None, f"{nic} did not come back"
    print(f"pod create -> Running: min {min(timings):.1f}s, max {max(timings):.1f}s over {len(timings)}")
