"""A Pod with a dra.net claim, end to end on the real cluster: created through the real API server,
allocated by the real scheduler from the inventory's ResourceSlices, prepared by the real kubelet
through prepare (inventory, store), and the attach service, registered with containerd over NRI,
moves the claimed veth "NIC" from the node's network namespace into the Pod's with its
configuration. dranet's four services run as real processes (tests/e2e/conftest.py); each NIC's
far end sits in a network namespace of its own, with an address to ping.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dev.cluster.kube import KubeCluster
from tests.e2e.conftest import Node
from tests.integration.attach import attach_env as env
from tests.support.kube import Kube, eventually, link, nic_name, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

RUN_WITHIN = 180.0
GONE_WITHIN = 120.0


def sh(*argv: str) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(argv)}: {res.stderr.strip()}"
    return res.stdout


@dataclass
class Peer:
    """The far end of a node NIC, moved into a netns of its own, with an address."""

    netns: str
    name: str
    ip: str
    mac: str


class Nics:
    """NICs (and their peers' netns) one test adds; all removed at the end."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.c = cluster
        self.names: list[str] = []
        self.peer_ns: list[str] = []

    def add(self, subnet: int | None = None) -> tuple[str, Peer | None]:
        """A NIC on the node; with ``subnet``, its peer in a netns of its own at 10.77.<subnet>.1/24."""
        name = nic_name()
        peer_link = self.c.net.add_nic(name)
        self.names.append(name)
        if subnet is None:
            return name, None
        ns = f"pn-{secrets.token_hex(3)}"
        sh("ip", "netns", "add", ns)
        self.peer_ns.append(ns)
        sh("ip", "link", "set", peer_link, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"10.77.{subnet}.1/24", "dev", peer_link)
        sh("ip", "-n", ns, "link", "set", peer_link, "up")
        mac = json.loads(sh("ip", "-j", "-n", ns, "link", "show", peer_link))[0]["address"]
        return name, Peer(ns, peer_link, f"10.77.{subnet}.1", mac)

    def on_node(self, name: str) -> dict[str, Any] | None:
        return link(self.c.netns, name)

    def cleanup(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "-n", self.c.netns, "link", "del", name], capture_output=True)
        for ns in self.peer_ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def nics(kube: Kube, kube_cluster: KubeCluster) -> Iterator[Nics]:
    n = Nics(kube_cluster)
    yield n
    kube.delete_namespace()  # its Pods stop while attach runs: the NICs come back first
    n.cleanup()


async def wait_published(k: Kube, *names: str, within: float = 60.0) -> None:
    def check() -> bool:
        items = k.api.get(
            f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={k.c.node_name}"
        )["items"]
        got = {d["name"] for s in items for d in s["spec"].get("devices") or []}
        return set(names) <= got

    await eventually(check, within, f"devices {names} published")


async def test_pod_gets_its_claimed_nic_configured_and_gives_it_back(node: Node, nics: Nics) -> None:
    k = node.kube
    nic, peer = nics.add(1)
    other, _ = nics.add()  # another NIC the claim does not select
    assert peer is not None
    await wait_published(k, nic, other)
    dc = k.device_class("nic")
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
    k.claim_and_pod("web", dc, on(nic), configs=[{"parameters": config}])
    pod = await k.wait_phase("web", within=RUN_WITHIN)
    pod_uid = pod["metadata"]["uid"]
    claim = k.get_claim("web")
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod_uid]
    # A path: attach_env's checks then tell a netns that is gone from a link that is.
    netns = f"/var/run/netns/{await k.pod_netns('web')}"

    itf = env.link(netns, "net1")
    assert itf is not None, sh("ip", "-n", env.netns_name(netns), "link")
    assert (itf["mtu"], itf["address"], itf["operstate"]) == (1400, "02:42:ac:11:00:42", "UP")
    assert nics.on_node(nic) is None  # gone from the node while the pod runs
    assert nics.on_node(other) is not None
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
    def status_written() -> Any:
        devices = (k.get_claim("web").get("status") or {}).get("devices") or []
        return devices[0] if devices and devices[0].get("networkData") else None

    dev = await eventually(status_written, 60, "claim status with network data")
    assert dev["driver"] == "dra.net" and dev["device"] == nic and dev["pool"] == node.cluster.node_name
    assert dev["networkData"]["interfaceName"] == "net1"
    assert sorted(dev["networkData"]["ips"]) == ["10.77.1.2/24", "10.78.1.2/24"]
    assert dev["networkData"]["hardwareAddress"] == "02:42:ac:11:00:42"
    assert {c["type"]: c["status"] for c in dev["conditions"]}["Ready"] == "True"

    k.delete_pod("web")
    await k.wait_gone("web", within=GONE_WITHIN)
    back = await eventually(lambda: nics.on_node(nic), 60, f"{nic} back on the node")
    assert "UP" in back["flags"]
    assert env.link(netns, "net1") is None

    async def forgotten() -> bool:
        async with node.store() as store:
            state = await store.get_pod(pod_uid)
        return not state.devices and not state.results

    await eventually(forgotten, 60, "store forgets the pod")


async def test_prepare_refuses_claims_while_attach_is_away(node: Node, nics: Nics) -> None:
    """The safety gate end to end: with the attach service SIGKILLed, the kubelet's prepare call
    fails (retryably) and the pod does not start without its device; once attach is back, the
    kubelet's retry succeeds and the pod runs with the NIC."""
    k, d = node.kube, node.driver
    nic, _ = nics.add()
    await wait_published(k, nic)
    dc = k.device_class("nic")
    d.procs["attach"].kill()
    try:
        async with node.store() as store:
            await env.wait_liveness(store, connected=False, timeout_s=30)
        k.claim_and_pod("gated", dc, on(nic), configs=[{"parameters": {"interface": {"name": "net3"}}}])
        ev = await k.wait_event("gated", "attach service is not connected", within=RUN_WITHIN)
        assert "NodePrepareResources failed" in ev["message"], ev["message"]
        pod = k.get_pod("gated")
        assert pod is not None and pod["status"]["phase"] == "Pending"
        assert not any(
            "running" in (cs.get("state") or {}) for cs in pod["status"].get("containerStatuses") or []
        )
        assert nics.on_node(nic) is not None
    finally:
        d.start_one("attach")
    await k.wait_phase("gated", within=RUN_WITHIN)
    netns = await k.pod_netns("gated")
    assert netns and env.link(netns, "net3") is not None
    k.delete_pod("gated")
    await k.wait_gone("gated", within=GONE_WITHIN)
    await eventually(lambda: nics.on_node(nic), 60, f"{nic} back on the node")
