"""Sidecar-style upgrades: each of the four containers is replaced in turn
(SIGTERM, then a new process) while Pods with dra.net claims are being created
and deleted. No Pod runs without its NIC, every NIC comes back to the node, and
no stored config is lost or left behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from tests.e2e.conftest import ALL_DEVICES, Cluster, on
from tests.integration.attach import attach_env as env

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.containerd, pytest.mark.slow]

NICS = 4


async def run_pod(c: Cluster, name: str, nic: str) -> tuple[str, str]:
    """A Pod claiming ``nic`` (renamed net-<nic>); (pod uid, netns) once running
    with the NIC inside, checked the moment the kubelet reports it running."""
    claim = await c.node.claim_for_pod(
        name, "nic", on(nic), configs=[{"parameters": {"interface": {"name": f"net-{nic}"}}}]
    )
    uid = str(claim["status"]["reservedFor"][0]["uid"])
    await c.kubelet.wait_running(uid, within=90)
    netns = c.kubelet.netns_path(uid)
    assert netns, f"pod {name} runs without a netns"
    assert env.link(netns, f"net-{nic}") is not None, f"pod {name} runs without its NIC {nic}"
    assert c.node_link(nic) is None, f"{nic} is still on the node while pod {name} runs"
    return uid, netns


async def remove_pod(c: Cluster, name: str, uid: str, nic: str) -> None:
    for call in (
        c.node.core.delete_namespaced_pod(f"{name}-pod", "default"),
        c.node.resource.delete_namespaced_resource_claim(name, "default"),
    ):
        try:
            await call
        except ApiException as exc:
            if exc.status != 404:
                raise
    await c.kubelet.wait_gone(uid, within=90)

    async def back() -> Any:
        return c.node_link(nic)

    await env.wait_for(back, 20, f"{nic} back on the node")


async def test_each_service_replaced_while_pods_come_and_go(cluster: Cluster) -> None:
    c = cluster
    nics = [f"eth{i}" for i in range(1, NICS + 1)]
    for i, nic in enumerate(nics):
        c.add_nic(nic, i)
    await c.node.wait_published(*nics)
    await c.node.device_class("nic", ALL_DEVICES)
    assert c.node.store is not None

    # One pod that lives through every upgrade.
    long_uid, long_ns = await run_pod(c, "long", "eth1")
    round_no = 0
    for service in ("store", "inventory", "prepare", "attach"):
        round_no += 1
        proc = c.node.procs[service]
        # Pods are created while the service is being replaced.
        names = [(f"r{round_no}-a", "eth2"), (f"r{round_no}-b", "eth3")]
        starts = [asyncio.create_task(run_pod(c, n, nic)) for n, nic in names]
        await asyncio.sleep(0.3)
        await asyncio.to_thread(proc.stop)  # SIGTERM: the container is replaced
        await asyncio.to_thread(proc.start)
        if service == "prepare":
            await c.node.plugin()
        running = await asyncio.gather(*starts)
        # The long-lived pod still has its NIC.
        assert env.link(long_ns, "net-eth1") is not None, (
            f"long pod lost its NIC across the {service} upgrade"
        )
        for (name, nic), (uid, _) in zip(names, running, strict=True):
            await remove_pod(c, name, uid, nic)

    # Nothing of the finished pods is left in the store; the long pod's config survived.
    listing = await c.node.store.list()
    assert {d.pod.uid for d in listing.devices} == {long_uid}
    assert {r.pod_uid for r in listing.results} <= {long_uid}
    await remove_pod(c, "long", long_uid, "eth1")
    listing = await c.node.store.list()
    assert not listing.devices and not listing.results
    for nic in nics:
        assert c.node_link(nic) is not None, f"{nic} did not come back"
