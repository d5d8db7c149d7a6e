"""Two nodes on one control plane (issue 16, part 1): node A is the KubeCluster's own (containerd
1.7), node B a ``SecondNode`` joining it (its own kubelet, root dir, network namespace and NICs,
and containerd 2.x built from its Go module). One set of dranet's four services runs per node, as
the DaemonSet does. The real scheduler picks the node from the ResourceSlices each node's
inventory publishes; each node's prepare and attach serve only the claims allocated on it.

The module brings the two-node cluster up once (its own control plane: the last test deletes
node B's Node object); every test adds NICs of its own and removes them at the end.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from dev.cluster.second_node import SecondNode
from shared.storeclient import StoreClient
from tests.e2e.conftest import start_driver
from tests.support.kube import Kube, addresses, eventually, ip_json, link, nic_name, on

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.twonode,
    pytest.mark.slow,
]

A, B = "two-a", "two-b"
RUN_WITHIN = 180.0
GONE_WITHIN = 120.0


@dataclass
class TwoNodes:
    """The two nodes by name, and the driver serving each."""

    nodes: dict[str, KubeCluster]
    drivers: dict[str, Driver]

    @property
    def a(self) -> KubeCluster:
        return self.nodes[A]

    @property
    def b(self) -> SecondNode:
        b = self.nodes[B]
        assert isinstance(b, SecondNode)
        return b

    def logs(self) -> str:
        return "\n".join(f"=== driver of {n} ===\n{d.logs()}" for n, d in self.drivers.items())


@pytest.fixture(scope="module")
def two() -> Iterator[TwoNodes]:
    a = KubeCluster(node_name=A)
    b = SecondNode(a, node_name=B)
    t = TwoNodes({A: a, B: b}, {})
    try:
        a.start()
        b.start()
        t.drivers[A] = start_driver(a)
        t.drivers[B] = start_driver(b)
    except BaseException:
        print(a.dump_logs(), b.dump_logs(), t.logs())
        for d in t.drivers.values():
            d.stop()
        b.stop()
        a.stop()
        raise
    try:
        yield t
    finally:
        # Node by node, B first: its Pods go while its attach runs, then its driver, then it.
        for node in (b, a):
            node.delete_pods()
            t.drivers[node.node_name].stop()
        b.stop()
        a.stop()


@dataclass
class Env:
    """One test's namespace, seen from each node, and the NICs it added to each node."""

    two: TwoNodes
    kube: dict[str, Kube]
    nics: list[tuple[str, str]] = field(default_factory=list)

    def add_nic(self, node: str) -> str:
        name = nic_name(node[-1])
        self.two.nodes[node].net.add_nic(name)
        self.nics.append((node, name))
        return name

    def on_node(self, node: str, nic: str) -> dict[str, Any] | None:
        return link(self.two.nodes[node].netns, nic)

    def slices(self, node: str | None = None) -> list[dict[str, Any]]:
        """dra.net's ResourceSlices as the API server holds them (of one node, or all)."""
        path = "/apis/resource.k8s.io/v1/resourceslices"
        if node:
            path += f"?fieldSelector=spec.nodeName={node}"
        return [s for s in self.two.a.api.get(path)["items"] if s["spec"]["driver"] == "dra.net"]


@pytest.fixture
def env(two: TwoNodes, request: pytest.FixtureRequest) -> Iterator[Env]:
    ns = f"t-{secrets.token_hex(3)}"
    e = Env(two, {name: Kube(node, ns) for name, node in two.nodes.items()})
    e.kube[A].create_namespace()
    try:
        yield e
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(two.logs())
        e.kube[A].delete_namespace()  # its Pods stop while attach runs: the NICs come back first
        e.kube[A].delete_device_classes()
        for node, name in e.nics:
            subprocess.run(["ip", "-n", two.nodes[node].netns, "link", "del", name], capture_output=True)


def other(node: str) -> str:
    return B if node == A else A


def link_names(netns: str) -> set[str]:
    return {itf["ifname"] for itf in ip_json(netns, "link", "show")}


async def stored(driver: Driver, claim_uid: str) -> int:
    """How many DeviceConfigs the driver's store holds for a claim."""
    async with StoreClient(driver.run_dir / "store.sock") as store:
        return len((await store.list(claim_uid=claim_uid)).devices)


# --- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("node", [A, B], ids=["containerd-1.7", "containerd-2.x"])
async def test_claim_for_a_device_only_one_node_has_runs_there_the_whole_attach_path(
    env: Env, node: str
) -> None:
    """The selector names a NIC only ``node`` has (the other node has one too, which the
    DeviceClass alone would take): the Pod runs on ``node`` with that NIC moved into its netns
    and configured, the claim status carries networkData, and after the Pod is deleted the NIC
    is back in the node's namespace. On A through containerd 1.7, on B through 2.x."""
    k = env.kube[node]
    info = env.two.a.api.get(f"/api/v1/nodes/{node}")["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://1.7." if node == A else "containerd://2.")
    # The node's attach is registered with the node's own containerd (Configure names it).
    connected = [
        json.loads(line)
        for line in env.two.drivers[node].procs["attach"].log().splitlines()
        if '"NRI plugin connected"' in line
    ]
    ctrd = env.two.nodes[node].containerd
    assert ctrd is not None and connected
    assert connected[-1]["runtime_version"] == ctrd.version_string
    nic, decoy = env.add_nic(node), env.add_nic(other(node))
    await k.wait_published(nic)
    await env.kube[other(node)].wait_published(decoy)
    dc = k.device_class("nic")
    config = {
        "interface": {"name": "net1", "mtu": 1400, "addresses": ["10.77.1.2/24"]},
        "routes": [{"destination": "10.79.0.0/24", "gateway": "10.77.1.1"}],
    }
    k.claim_and_pod("web", dc, on(nic), configs=[{"parameters": config}])
    pod = await k.wait_phase("web", within=RUN_WITHIN)
    assert pod["spec"]["nodeName"] == node
    claim = k.get_claim("web")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["device"]) for r in results] == [("dra.net", node, nic)]

    netns = await k.pod_netns("web")
    itf = link(netns, "net1")
    assert itf is not None, link_names(netns)
    assert (itf["mtu"], itf["operstate"]) == (1400, "UP")
    assert addresses(netns, "net1") == ["10.77.1.2/24"]
    assert ("10.79.0.0/24", "10.77.1.1") in {(r["dst"], r.get("gateway")) for r in ip_json(netns, "route")}
    assert env.on_node(node, nic) is None  # gone from its node while the Pod runs
    assert env.on_node(other(node), decoy) is not None

    def status_written() -> Any:
        devices = (k.get_claim("web").get("status") or {}).get("devices") or []
        return devices[0] if devices and devices[0].get("networkData") else None

    dev = await eventually(status_written, 60, "claim status with network data")
    assert (dev["driver"], dev["pool"], dev["device"]) == ("dra.net", node, nic)
    assert dev["networkData"]["interfaceName"] == "net1"
    assert dev["networkData"]["ips"] == ["10.77.1.2/24"]
    assert {c["type"]: c["status"] for c in dev["conditions"]}["Ready"] == "True"

    k.delete_pod("web")
    await k.wait_gone("web", within=GONE_WITHIN)
    back = await eventually(lambda: env.on_node(node, nic), 60, f"{nic} back in {node}'s namespace")
    assert "UP" in back["flags"]
    assert link(netns, "net1") is None


async def test_two_pods_one_device_from_each_node_at_once(env: Env) -> None:
    """Both Pods created back to back run at the same time, each on the node of its NIC; each
    node's store holds the claim allocated on it and none of the other's."""
    nics = {node: env.add_nic(node) for node in (A, B)}
    for node, nic in nics.items():
        await env.kube[node].wait_published(nic)
    k = env.kube[A]  # the namespace is the same from both nodes
    dc = k.device_class("nic")
    for i, (node, nic) in enumerate(nics.items()):
        config = {"interface": {"name": "net1", "addresses": [f"10.77.{i + 1}.2/24"]}}
        k.claim_and_pod(f"p-{node}", dc, on(nic), configs=[{"parameters": config}])
    for node in nics:
        pod = await k.wait_phase(f"p-{node}", within=RUN_WITHIN)
        assert pod["spec"]["nodeName"] == node
    for i, (node, nic) in enumerate(nics.items()):
        # Both running now: each Pod's netns holds its own NIC, not the other's.
        netns = await env.kube[node].pod_netns(f"p-{node}")
        assert link_names(netns) == {"lo", "eth0", "net1"}
        assert addresses(netns, "net1") == [f"10.77.{i + 1}.2/24"]
        assert env.on_node(node, nic) is None
    for node in nics:
        uid = k.get_claim(f"p-{node}")["metadata"]["uid"]
        assert await stored(env.two.drivers[node], uid) == 1
        assert await stored(env.two.drivers[other(node)], uid) == 0
        assert uid in env.two.drivers[node].procs["prepare"].log()
        assert uid not in env.two.drivers[other(node)].procs["prepare"].log()
    for node in nics:
        k.delete_pod(f"p-{node}")
    for node, nic in nics.items():
        await k.wait_gone(f"p-{node}", within=GONE_WITHIN)
        await eventually(lambda n=node, x=nic: env.on_node(n, x), 60, f"{nic} back on {node}")


async def test_each_nodes_slices_carry_its_own_node_name_and_pool(env: Env) -> None:
    nics = {node: env.add_nic(node) for node in (A, B)}
    for node, nic in nics.items():
        await env.kube[node].wait_published(nic)
    slices = env.slices()
    assert {s["spec"]["nodeName"] for s in slices} == {A, B}
    for s in slices:
        node = s["spec"]["nodeName"]
        assert s["spec"]["pool"]["name"] == node
        uid = env.two.a.api.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
        owners = [(o["kind"], o["name"], o["uid"]) for o in s["metadata"]["ownerReferences"]]
        assert owners == [("Node", node, uid)]
    for node, nic in nics.items():
        own = {d["name"] for s in env.slices(node) for d in s["spec"].get("devices") or []}
        assert nic in own and nics[other(node)] not in own


async def test_stopping_node_b_driver_leaves_node_a_serving(env: Env) -> None:
    two = env.two
    nic = env.add_nic(A)
    await env.kube[A].wait_published(nic)
    two.drivers[B].stop()
    try:
        for name, p in two.drivers[B].procs.items():
            assert p.proc is None or p.proc.poll() is not None, f"{name} of {B} still runs"
        k = env.kube[A]
        k.claim_and_pod("after", k.device_class("nic"), on(nic))
        pod = await k.wait_phase("after", within=RUN_WITHIN)
        assert pod["spec"]["nodeName"] == A
        netns = await k.pod_netns("after")
        assert nic in link_names(netns)
        k.delete_pod("after")
        await k.wait_gone("after", within=GONE_WITHIN)
        await eventually(lambda: env.on_node(A, nic), 60, f"{nic} back on {A}")
    finally:
        two.drivers[B] = start_driver(two.b)


async def test_deleting_node_b_removes_its_slices(env: Env) -> None:
    """Node B dies (its kubelet SIGKILLed, so it never wipes the driver's slices; its driver
    stopped, so nothing republishes them): its slices stay until its Node object is deleted, then
    the garbage collector removes them (they are owned by the Node). Node A's stay."""
    two = env.two
    nics = {node: env.add_nic(node) for node in (A, B)}
    for node, nic in nics.items():
        await env.kube[node].wait_published(nic)
    two.b.procs["kubelet"].kill()
    two.drivers[B].stop()
    await asyncio.sleep(5)
    assert env.slices(B), "node B's slices went before its Node was deleted"
    two.a.api.call("DELETE", f"/api/v1/nodes/{B}", ok=(200, 202))
    await eventually(lambda: not env.slices(B), 60, f"{B}'s slices removed")
    assert nics[A] in {d["name"] for s in env.slices(A) for d in s["spec"].get("devices") or []}
