"""A Pod with a dra.net claim, end to end on the development control plane and a real
containerd: the API server double and the allocator schedule it, the kubelet emulator
prepares its claim through prepare (inventory, store) and runs it through CRI, and the
attach service, registered with containerd over NRI, moves the claimed veth "NIC" into
the Pod's netns with its configuration. dranet's four services run as real processes;
the node is a network namespace holding the NICs (inventory and attach run inside it),
as the host netns would on a real node.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from tests.e2e.conftest import ALL_DEVICES, Cluster, on
from tests.integration.attach import attach_env as env
from tests.support.stack import sh

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.containerd, pytest.mark.slow]


async def test_pod_gets_its_claimed_nic_configured_and_gives_it_back(cluster: Cluster) -> None:
    node = cluster.node
    peer = cluster.add_nic("eth1", 1)
    cluster.add_nic("eth2", 2)  # another NIC the claim does not select
    await node.wait_published("eth1", "eth2")
    await node.device_class("nic", ALL_DEVICES)
    config = {
        "interface": {
            "name": "net1",
            "mtu": 1400,
            "hardwareAddr": "02:42:ac:11:00:42",
            "addresses": ["10.77.1.2/24", "10.78.1.2/24"],
        },
        "routes": [
            {"destination": "10.79.0.0/24", "gateway": peer.ip},
            {"destination": "10.80.0.0/24", "gateway": peer.ip, "table": 100},
        ],
        "rules": [{"priority": 1000, "source": "10.78.1.2/32", "table": 100}],
        "neighbors": [{"destination": peer.ip, "hardwareAddr": peer.mac}],
    }
    claim = await node.claim_for_pod("web", "nic", on("eth1"), configs=[{"parameters": config}])
    pod_uid = claim["status"]["reservedFor"][0]["uid"]
    await cluster.kubelet.wait_running(pod_uid, within=60)
    netns = cluster.kubelet.netns_path(pod_uid)
    assert netns

    link = env.link(netns, "net1")
    assert link is not None, sh("ip", "-n", env.netns_name(netns), "link").stdout
    assert (link["mtu"], link["address"], link["operstate"]) == (1400, "02:42:ac:11:00:42", "UP")
    assert cluster.node_link("eth1") is None  # gone from the node while the pod runs
    assert sorted(env.addresses(netns, "net1")) == ["10.77.1.2/24", "10.78.1.2/24"]
    assert ("10.79.0.0/24", peer.ip) in {(r["dst"], r.get("gateway")) for r in env.routes(netns)}
    assert {(r["dst"], r.get("gateway")) for r in env.routes(netns, "table", "100")} == {
        ("10.80.0.0/24", peer.ip)
    }
    assert any(r.get("priority") == 1000 and r.get("src") == "10.78.1.2" for r in env.rules(netns))
    neigh = {(n["dst"], n.get("lladdr"), tuple(n.get("state", []))) for n in env.neighbors(netns, "net1")}
    assert (peer.ip, peer.mac, ("PERMANENT",)) in neigh
    assert env.ping(netns, peer.ip)

    # prepare writes the claim status from attach's result.
    async def status_written() -> Any:
        devices = (await cluster.claim_status("web")).get("devices") or []
        return devices[0] if devices and devices[0].get("networkData") else None

    dev = await env.wait_for(status_written, 20, "claim status with network data")
    assert dev["driver"] == "dra.net" and dev["device"] == "eth1" and dev["pool"] == node.node_name
    assert dev["networkData"]["interfaceName"] == "net1"
    assert sorted(dev["networkData"]["ips"]) == ["10.77.1.2/24", "10.78.1.2/24"]
    assert dev["networkData"]["hardwareAddress"] == "02:42:ac:11:00:42"
    assert {c["type"]: c["status"] for c in dev["conditions"]}["Ready"] == "True"

    await node.core.delete_namespaced_pod("web-pod", "default")
    await cluster.kubelet.wait_gone(pod_uid, within=60)
    back = cluster.node_link("eth1")
    assert back is not None and "UP" in back["flags"]
    assert env.link(netns, "net1") is None
    assert node.store is not None

    async def forgotten() -> bool:
        assert node.store is not None
        state = await node.store.get_pod(pod_uid)
        return not state.devices and not state.results

    await env.wait_for(forgotten, 20, "store forgets the pod")


async def test_prepare_refuses_claims_while_attach_is_away(cluster: Cluster) -> None:
    """The safety gate end to end: with the attach service SIGKILLed, the kubelet's
    prepare call fails (retryably) and the pod does not start without its device; once
    attach is back, the kubelet's retry succeeds and the pod runs with the NIC."""
    node = cluster.node
    cluster.add_nic("eth3", 3)
    await node.wait_published("eth3")
    await node.device_class("nic", ALL_DEVICES)
    cluster.attach.kill()
    assert node.store is not None
    await env.wait_liveness(node.store, connected=False)
    claim = await node.claim_for_pod(
        "gated", "nic", on("eth3"), configs=[{"parameters": {"interface": {"name": "net3"}}}]
    )
    pod_uid = claim["status"]["reservedFor"][0]["uid"]

    async def refused() -> str | None:
        return cluster.kubelet.last_prepare_error(pod_uid)

    err = await env.wait_for(refused, 30, "prepare refused by the safety gate")
    assert "attach service is not connected" in err
    assert not cluster.kubelet.is_running(pod_uid)
    assert cluster.node_link("eth3") is not None

    await asyncio.to_thread(cluster.attach.start)
    await cluster.kubelet.wait_running(pod_uid, within=60)
    netns = cluster.kubelet.netns_path(pod_uid)
    assert netns and env.link(netns, "net3") is not None
    try:
        await node.core.delete_namespaced_pod("gated-pod", "default")
    except ApiException as exc:
        if exc.status != 404:
            raise
    await cluster.kubelet.wait_gone(pod_uid, within=60)
    assert cluster.node_link("eth3") is not None
