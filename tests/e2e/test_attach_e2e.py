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
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from services.devcluster.containerd import Containerd
from services.devcluster.cri import CriClient
from services.devcluster.kubelet import Kubelet
from services.devcluster.kubelet_api import KubeApi
from tests.integration.attach import attach_env as env
from tests.support.procs import ServiceProcess
from tests.support.stack import NodeStack, sh

pytestmark = [pytest.mark.root, pytest.mark.netns, pytest.mark.containerd, pytest.mark.slow]

ALL_DEVICES = 'device.driver == "dra.net"'


def on(name: str) -> str:
    return f'device.driver == "dra.net" && device.attributes["dra.net"].ifName == "{name}"'


@dataclass
class Peer:
    """The far end of a node NIC, in a netns of its own, with an address."""

    netns: str
    name: str
    ip: str
    mac: str


@dataclass
class Cluster:
    node: NodeStack
    ctrd: Containerd
    kubelet: Kubelet
    attach: ServiceProcess

    def add_nic(self, name: str, subnet: int) -> Peer:
        peer_link = self.node.add_nic(name)
        peer_ns = f"{self.node.netns}-p{subnet}"
        sh("ip", "netns", "add", peer_ns)
        sh("ip", "link", "set", peer_link, "netns", peer_ns)
        sh("ip", "-n", peer_ns, "addr", "add", f"10.77.{subnet}.1/24", "dev", peer_link)
        sh("ip", "-n", peer_ns, "link", "set", peer_link, "up")
        mac = json.loads(sh("ip", "-j", "-n", peer_ns, "link", "show", peer_link).stdout)[0]["address"]
        return Peer(peer_ns, peer_link, f"10.77.{subnet}.1", mac)

    def node_link(self, name: str) -> dict[str, Any] | None:
        res = sh("ip", "-j", "-n", self.node.netns, "link", "show", name, check=False)
        return json.loads(res.stdout)[0] if res.returncode == 0 else None

    async def claim_status(self, name: str) -> dict[str, Any]:
        resp = await self.node.resource.read_namespaced_resource_claim(
            name, "default", _preload_content=False
        )
        status: dict[str, Any] = json.loads(await resp.read()).get("status") or {}
        return status


@pytest.fixture
def ctrd() -> Iterator[Containerd]:
    c = Containerd()
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture
async def cluster(ctrd: Containerd) -> AsyncIterator[Cluster]:
    node = NodeStack(inventory_args=["--filter", ""])
    kubelet: Kubelet | None = None
    api: KubeApi | None = None
    try:
        await node.start()
        attach = ServiceProcess(
            "services.attach",
            [
                "--run-dir",
                str(node.run_dir),
                "--nri-socket",
                str(ctrd.nri_socket),
                "--log-level",
                "DEBUG",
                "--drain-quiet",
                "1",
                "--drain-poll",
                "0.2",
            ],
            socket=node.run_dir / "attach.sock",
            log_path=node.workdir / "attach.log",
            netns=node.netns,
        )
        node.procs["attach"] = attach
        await asyncio.to_thread(attach.start)
        assert node.store is not None
        await env.wait_liveness(node.store, connected=True)
        assert node.api is not None
        api = await KubeApi.from_kubeconfig(node.api.kubeconfig_path)
        cri = CriClient(ctrd.grpc_socket)
        kubelet = Kubelet(
            node.node_name,
            node.kubelet_dir,
            cri,
            api=api,
            backoff_initial=0.2,
            backoff_max=1.0,
            wipe_slices=False,
            on_netns=ctrd.note_netns,
        )
        await kubelet.start()
        c = Cluster(node, ctrd, kubelet, attach)
        yield c
        # Pods go while attach runs, so the NICs come back to the node.
        await asyncio.to_thread(ctrd.remove_all_pods)
    except BaseException:
        print(node.logs())
        raise
    finally:
        if kubelet is not None:
            await kubelet.stop()
            await kubelet.runtime.close()
        if api is not None:
            await api.close()
        await node.stop()
        for i in range(4):
            sh("ip", "netns", "del", f"{node.netns}-p{i}", check=False)


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
