"""ResourceSlices published by the inventory process (in a netns) to the real API server of
the session's cluster, as the chart's ServiceAccount: shape, schema, following links,
zero-write rescans, outages (the kube-apiserver stopped and started again), conflicts.

Each test publishes for a Node of its own (``cluster.node``); writes are counted by a watch
on that node's slices (``helpers.SliceWatch``)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_asyncio import client

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from shared.rpc import channel
from tests.integration.inventory.helpers import Cluster, StartInventory, ip, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.root]


def ours(cluster: Cluster) -> set[str]:
    """Published device names, without the host's PCI NICs (their netdevs are elsewhere)."""
    return {n for n in cluster.published() if not n.startswith("pci-")}


def check_pool(cluster: Cluster, node_uid: str) -> None:
    node = cluster.node
    slices = cluster.slices()
    assert slices, "no ResourceSlice"
    gens = {s["spec"]["pool"]["generation"] for s in slices}
    assert len(gens) == 1, f"mixed generations {gens}"
    names = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    assert len(names) == len(set(names)), "a device is published twice"
    for s in slices:
        spec, meta = s["spec"], s["metadata"]
        assert spec["driver"] == "dra.net" and spec["nodeName"] == node
        assert spec["pool"]["name"] == node and spec["pool"]["resourceSliceCount"] == len(slices)
        assert len(spec.get("devices", [])) <= 128
        assert meta["generateName"] == f"{node}-dra.net-" and meta["name"].startswith(f"{node}-dra.net-")
        assert meta["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
        kubernetes_validate.validate(
            {k: v for k, v in s.items() if k in ("apiVersion", "kind", "metadata", "spec")},
            "1.34.0",
            strict=True,
        )


async def node_uid(cluster: Cluster) -> str:
    node: Any = await client.CoreV1Api(cluster.client).read_node(cluster.node)
    return str(node.metadata.uid)


def fill(ns: str) -> None:
    ip(ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    ip(ns, "link", "set", "v0", "up")
    ip(ns, "addr", "add", "10.1.0.1/24", "dev", "v0")
    ip(ns, "link", "add", "mv0", "link", "v0", "type", "macvlan", "mode", "bridge")
    ip(ns, "link", "add", "br0", "type", "bridge")
    ip(ns, "addr", "add", "192.0.2.1/24", "dev", "br0")
    ip(ns, "addr", "add", "2001:db8::1/64", "dev", "br0", "nodad")
    ip(ns, "link", "add", "vx0", "type", "vxlan", "id", "42", "dstport", "4789", "dev", "v0")
    ip(ns, "link", "set", "br0", "alias", "test bridge")


async def test_slices_follow_links_and_noop_rescans_write_nothing(
    netns: str, cluster: Cluster, start_inventory: StartInventory
) -> None:
    fill(netns)
    proc = start_inventory(
        netns,
        "--kubeconfig",
        cluster.kubeconfig,
        "--max-poll-interval",
        "1h",
        publish=True,
        node=cluster.node,
    )
    uid = await node_uid(cluster)
    await wait_for(lambda: ours(cluster) == {"br0", "mv0", "vx0"}, what="first publish")
    check_pool(cluster, uid)
    br0 = cluster.published()["br0"]["attributes"]
    assert br0["dra.net/ifName"] == {"string": "br0"}
    assert br0["dra.net/type"] == {"string": "bridge"}
    assert br0["dra.net/ipv4"] == {"string": "192.0.2.1/24"}
    assert br0["dra.net/ipv6"] == {"string": "2001:db8::1/64"}
    assert br0["dra.net/alias"] == {"string": "test bridge"}
    assert br0["dra.net/virtual"] == {"bool": True} and br0["dra.net/mtu"] == {"int": 1500}
    assert cluster.published()["mv0"]["attributes"]["dra.net/type"] == {"string": "macvlan"}

    async with channel(proc.socket) as ch:
        stub = inventory_pb2_grpc.InventoryStub(ch)
        # No-op rescans, asked for and woken by a link event that changes nothing published.
        writes = cluster.slice_writes
        await stub.Rescan(pb.RescanRequest(wait=True))
        ip(netns, "link", "set", "v1", "up")  # a veth: not published
        await asyncio.sleep(0.5)
        await stub.Rescan(pb.RescanRequest(wait=True))
        assert cluster.slice_writes == writes

        # Add, rename, delete: each reflected, each one write (one slice).
        ip(netns, "link", "add", "br1", "type", "bridge")
        await wait_for(lambda: "br1" in ours(cluster), within=20, what="link add")
        ip(netns, "link", "set", "br1", "name", "br-renamed")
        await wait_for(lambda: "br-renamed" in ours(cluster) and "br1" not in ours(cluster), 20, "rename")
        ip(netns, "link", "del", "vx0")
        await wait_for(lambda: ours(cluster) == {"br0", "mv0", "br-renamed"}, within=20, what="link delete")
        assert cluster.slice_writes == writes + 3
        check_pool(cluster, uid)


async def test_many_devices_pool_into_slices_of_at_most_128(
    netns: str, cluster: Cluster, start_inventory: StartInventory
) -> None:
    for i in range(140):
        ip(netns, "link", "add", f"b{i:03d}", "type", "bridge")
    start_inventory(
        netns,
        "--kubeconfig",
        cluster.kubeconfig,
        "--max-poll-interval",
        "1h",
        publish=True,
        node=cluster.node,
    )
    uid = await node_uid(cluster)
    await wait_for(lambda: len(ours(cluster)) == 140, within=60, what="140 bridges published")
    total = len(cluster.published())
    assert len(cluster.slices()) == math.ceil(total / 128) == 2
    check_pool(cluster, uid)
    writes = cluster.slice_writes
    ip(netns, "link", "set", "b007", "mtu", "1400")
    await wait_for(
        lambda: cluster.published()["b007"]["attributes"]["dra.net/mtu"] == {"int": 1400}, 20, "mtu change"
    )
    await asyncio.sleep(0.5)
    assert cluster.slice_writes == writes + 1  # one slice rewritten, generation kept
    assert {s["spec"]["pool"]["generation"] for s in cluster.slices()} == {1}
    check_pool(cluster, uid)


async def test_outage_conflict_restart_without_duplicates(
    netns: str, cluster: Cluster, start_inventory: StartInventory
) -> None:
    fill(netns)
    proc = start_inventory(
        netns,
        "--kubeconfig",
        cluster.kubeconfig,
        "--max-poll-interval",
        "2s",
        publish=True,
        node=cluster.node,
    )
    uid = await node_uid(cluster)
    await wait_for(lambda: ours(cluster) == {"br0", "mv0", "vx0"}, what="first publish")

    # The API server goes away; links change meanwhile; it comes back with its state (etcd's).
    await cluster.stop_api_server()
    ip(netns, "link", "add", "br1", "type", "bridge")
    await asyncio.sleep(2)
    await cluster.start_api_server()
    # The inventory's retry backoff grows to 30s during the outage.
    await wait_for(lambda: "br1" in ours(cluster), within=90, what="publish after the outage")
    check_pool(cluster, uid)

    # Someone else edits our slice (stale resourceVersion in the inventory's cache):
    # the inventory puts its devices back, without a second slice.
    api = client.ResourceV1Api(cluster.client)
    (mine,) = [s for s in cluster.slices() if any(d["name"] == "br0" for d in s["spec"]["devices"])]
    edited = dict(mine)
    edited["spec"] = {**mine["spec"], "devices": [d for d in mine["spec"]["devices"] if d["name"] != "br0"]}
    await api.replace_resource_slice(mine["metadata"]["name"], edited)
    ip(netns, "link", "add", "br2", "type", "bridge")
    await wait_for(lambda: {"br0", "br2"} <= ours(cluster), within=40, what="repair after the edit")
    check_pool(cluster, uid)

    # Someone deletes it outright: recreated.
    for s in cluster.slices():
        await api.delete_resource_slice(s["metadata"]["name"])
    await wait_for(lambda: ours(cluster) == {"br0", "br1", "br2", "mv0", "vx0"}, within=40, what="recreate")
    check_pool(cluster, uid)

    # A graceful stop leaves the slices (the kubelet removes them if the plugin stays
    # away); a restarted inventory takes them over without writing.
    before = {s["metadata"]["name"] for s in cluster.slices()}
    proc.stop()
    assert {s["metadata"]["name"] for s in cluster.slices()} == before
    writes = cluster.slice_writes
    proc.start()
    async with channel(proc.socket) as ch:
        await inventory_pb2_grpc.InventoryStub(ch).Rescan(pb.RescanRequest(wait=True))
    assert cluster.slice_writes == writes


async def test_slices_wiped_by_someone_else_come_back_at_once(
    netns: str, cluster: Cluster, start_inventory: StartInventory
) -> None:
    """The kubelet deletes the node's slices when it starts; the inventory sees
    it on its slice watch and publishes again right away, not at the next
    resync (one minute here), and with no link change to wake it."""
    fill(netns)
    start_inventory(
        netns,
        "--kubeconfig",
        cluster.kubeconfig,
        "--max-poll-interval",
        "60s",
        publish=True,
        node=cluster.node,
    )
    uid = await node_uid(cluster)
    await wait_for(lambda: ours(cluster) == {"br0", "mv0", "vx0"}, what="first publish")
    api = client.ResourceV1Api(cluster.client)
    await api.delete_collection_resource_slice(
        field_selector=f"spec.nodeName={cluster.node}", _preload_content=False
    )
    took = await wait_for(
        lambda: ours(cluster) == {"br0", "mv0", "vx0"}, within=20, what="republish after a wipe"
    )
    print(f"slices back {took:.2f}s after the wipe")
    check_pool(cluster, uid)
    # An edit that drops a device is repaired the same way.
    (mine,) = [s for s in cluster.slices() if any(d["name"] == "br0" for d in s["spec"]["devices"])]
    edited = dict(mine)
    edited["spec"] = {**mine["spec"], "devices": [d for d in mine["spec"]["devices"] if d["name"] != "br0"]}
    await api.replace_resource_slice(mine["metadata"]["name"], edited)
    await wait_for(lambda: "br0" in ours(cluster), within=20, what="repair after an edit")
    check_pool(cluster, uid)
    # Our own writes do not feed back: once settled, nothing more is written.
    settled = cluster.slice_writes
    await asyncio.sleep(2)
    assert cluster.slice_writes == settled
