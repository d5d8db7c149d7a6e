"""PersistentResourceSliceAttributes in the inventory process against the real API server,
with a real store process: a device kept in the store (as prepare keeps it) stays in the
ResourceSlice, unchanged and without a write, while its netdev is in another namespace (a
Pod's), also across SIGKILLs of the inventory and of the store; once the claim is released
the live device is published again. With the gate off the same record is ignored and the
device leaves the slice while it is away. Writes are counted by a watch on the node's slices.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from proto.dranet.store.v1 import store_pb2 as st
from shared.rpc import channel
from shared.storeclient import StoreClient
from tests.integration.inventory.helpers import Cluster, StartInventory, ip, wait_for
from tests.integration.store.test_store_process import make_config, store_proc

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.root]

GATE = "--feature-gates=PersistentResourceSliceAttributes=true"


async def rescan(socket: str) -> None:
    async with channel(socket) as ch:
        await inventory_pb2_grpc.InventoryStub(ch).Rescan(pb.RescanRequest(wait=True))


@pytest.mark.parametrize("gate_on", [False, True], ids=["gate-off", "gate-on"])
async def test_a_kept_device_stays_published_while_away(
    netns: str, cluster: Cluster, start_inventory: StartInventory, workdir: Path, gate_on: bool
) -> None:
    pod_ns = f"{netns}-pod"
    subprocess.run(["ip", "netns", "add", pod_ns], check=True)
    store = store_proc(workdir).start()
    try:
        ip(netns, "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        ip(netns, "link", "set", "a0", "mtu", "1400", "up")
        ip(netns, "addr", "add", "10.9.0.1/24", "dev", "a0")
        args = ["--kubeconfig", cluster.kubeconfig, "--filter", '"dra.net/ifName" in attributes']
        args += ["--max-poll-interval", "1h", *([GATE] if gate_on else [])]
        inv = start_inventory(netns, *args, publish=True, node=cluster.node)
        await wait_for(lambda: "a0" in cluster.published(), what="a0 published")
        before = cluster.published()["a0"]
        assert before["attributes"]["dra.net/ipv4"] == {"string": "10.9.0.1/24"}

        # What prepare does: the config and the device as the inventory publishes it, in one put.
        async with channel(inv.socket) as ch:
            dev = await inventory_pb2_grpc.InventoryStub(ch).GetDevice(pb.GetDeviceRequest(name="a0"))
        cfg = make_config("pod-1", "a0", claim="claim-1")
        keep = st.KeptDevice(device="a0", claim=cfg.claim, pod_uid="pod-1", device_json=dev.slice_entry_json)
        async with StoreClient(store.socket) as c:
            await c.put_devices([cfg], kept=[keep])
        await rescan(inv.socket)
        w0 = cluster.slice_writes

        # Into the "Pod": the netdev leaves the node's namespace (its address goes with the move).
        ip(netns, "link", "set", "a0", "netns", pod_ns)
        await rescan(inv.socket)
        if gate_on:
            assert cluster.published()["a0"] == before
        else:
            await wait_for(lambda: "a0" not in cluster.published(), within=20, what="a0 unpublished")
        start_writes = cluster.slice_writes - w0

        # Restarts while it is away, SIGKILL both: the kept device comes back from LMDB.
        for proc in (inv, store):
            proc.kill()
            proc.start(timeout=60)
            await rescan(inv.socket)
            assert ("a0" in cluster.published()) is gate_on
            if gate_on:
                assert cluster.published()["a0"] == before
        restart_writes = cluster.slice_writes - w0 - start_writes

        # Back on the node, without its address (dranet does not restore it), down, then up:
        # each state the scans see is published (the host's values win over the kept ones).
        subprocess.run(["ip", "-n", pod_ns, "link", "set", "a0", "netns", netns], check=True)
        ip(netns, "link", "set", "a0", "up")
        await wait_for(lambda: "a0" in cluster.published(), within=20, what="a0 published again")
        await wait_for(
            lambda: (
                cluster.published()["a0"]["attributes"]["dra.net/state"]
                == before["attributes"]["dra.net/state"]
            ),
            within=20,
            what="a0 up",
        )
        await rescan(inv.socket)
        if gate_on:
            # ... the kept copy still fills what the host lacks (the address): as before.
            assert cluster.published()["a0"] == before
        else:
            assert "dra.net/ipv4" not in cluster.published()["a0"]["attributes"]
        back_writes = cluster.slice_writes - w0 - start_writes - restart_writes
        # Then the claim is released: the live device, without the address.
        async with StoreClient(store.socket) as c:
            await c.delete_claim("claim-1")
            assert (await c.list_kept()).kept == []
        await wait_for(
            lambda: "dra.net/ipv4" not in cluster.published()["a0"]["attributes"], within=20, what="live a0"
        )
        await rescan(inv.socket)
        release_writes = cluster.slice_writes - w0 - start_writes - restart_writes - back_writes
        print(
            f"PersistentResourceSliceAttributes={str(gate_on).lower()}: slice writes away={start_writes} "
            f"restarts={restart_writes} back={back_writes} released={release_writes}"
        )
        assert restart_writes == 0
        if gate_on:
            assert (start_writes, release_writes) == (0, 1)
        else:
            assert (start_writes, release_writes) == (1, 0) and back_writes >= 1
    finally:
        store.stop()
        subprocess.run(["ip", "netns", "del", pod_ns], check=False)
