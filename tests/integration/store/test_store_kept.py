"""PersistentResourceSliceAttributes' records in the store, as a real process on LMDB:
KeptDevices are written with the claim's DeviceConfigs in one transaction, survive SIGKILL,
are removed with the configs (DeleteClaim, DeletePod, DeleteDevice), and a kept_only watch
sees only them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from proto.dranet.store.v1 import store_pb2 as pb
from proto.dranet.store.v1 import store_pb2_grpc
from shared.rpc import channel
from shared.storeclient import StoreCallError, StoreClient
from tests.integration.store.test_store_process import make_config, store_proc


def make_kept(pod: str, device: str, claim: str = "claim-1") -> pb.KeptDevice:
    entry = {
        "name": device,
        "attributes": {"dra.net/ifName": {"string": device}, "dra.net/mtu": {"int": 1400}},
    }
    return pb.KeptDevice(
        device=device,
        claim=pb.ClaimRef(uid=claim, namespace="default", name=f"c-{claim}"),
        pod_uid=pod,
        pool="node-a",
        device_json=json.dumps(entry),
        kept_unix_nano=1,
    )


def kept_names(listing: pb.ListKeptResponse) -> list[tuple[str, str]]:
    return [(k.claim.uid, k.device) for k in listing.kept]


async def test_kept_devices_are_durable_and_live_as_long_as_their_configs(tmp_path: Path) -> None:
    proc = store_proc(tmp_path).start()
    try:
        async with StoreClient(proc.socket) as c:
            revs = await c.put_devices(
                [make_config("p1", "eth1"), make_config("p1", "eth2", claim="c2")],
                kept=[make_kept("p1", "eth1"), make_kept("p1", "eth2", claim="c2")],
            )
            listing = await c.list_kept()
            assert kept_names(listing) == [("c2", "eth2"), ("claim-1", "eth1")]
            # One transaction: the configs and the kept devices carry one revision.
            assert {k.revision for k in listing.kept} == {revs[0]} and listing.revision == revs[0]
            assert json.loads(listing.kept[1].device_json)["attributes"]["dra.net/mtu"] == {"int": 1400}
        proc.kill()  # SIGKILL: nothing but the fsynced LMDB survives
        proc.start()
        async with StoreClient(proc.socket) as c:
            assert kept_names(await c.list_kept()) == [("c2", "eth2"), ("claim-1", "eth1")]
            # Unprepare: the claim's configs and kept devices go together.
            assert [d.device for d in await c.delete_claim("c2")] == ["eth2"]
            assert kept_names(await c.list_kept()) == [("claim-1", "eth1")]
            # DeleteDevice and DeletePod take a device's kept record with its config.
            await c.put_devices(
                [make_config("p2", "eth3", claim="c3")], kept=[make_kept("p2", "eth3", claim="c3")]
            )
            assert await c.delete_device("p2", "eth3") == 1 + 1
            await c.put_devices(
                [make_config("p3", "eth4", claim="c4")], kept=[make_kept("p3", "eth4", claim="c4")]
            )
            assert await c.delete_pod("p3") == 2
            assert kept_names(await c.list_kept()) == [("claim-1", "eth1")]
        proc.stop()
        proc.start()
        async with StoreClient(proc.socket) as c:
            assert kept_names(await c.list_kept()) == [("claim-1", "eth1")]
            assert [d.device for d in (await c.list()).devices] == ["eth1"]
    finally:
        proc.stop()


async def test_bad_kept_devices_are_refused_with_nothing_stored(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket, deadline_s=3) as c:
            for bad, where in (
                (make_kept("p1", "eth1", claim=""), "kept[0].claim.uid"),
                (make_kept("p1", "a/b"), "kept[0].device"),
                (pb.KeptDevice(device="eth1", claim=pb.ClaimRef(uid="c1")), "kept[0].device_json"),
            ):
                with pytest.raises(StoreCallError) as err:
                    await c.put_devices([make_config("p1", "eth1")], kept=[bad])
                assert err.value.code == "INVALID_ARGUMENT" and where in err.value.message
            assert (await c.list()).devices == [] and (await c.list_kept()).kept == []


async def test_kept_only_watch(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket) as c:
            await c.put_devices([make_config("p1", "eth1")], kept=[make_kept("p1", "eth1")])
            kept_events: list[pb.WatchEvent] = []
            all_events: list[pb.WatchEvent] = []
            synced = asyncio.Event()
            deleted = asyncio.Event()

            async def watch(into: list[pb.WatchEvent], kept_only: bool) -> None:
                async for ev in c.watch(initial=True, kept_only=kept_only):
                    into.append(ev)
                    if ev.type == pb.WatchEvent.SYNCED and kept_only:
                        synced.set()
                    if ev.type == pb.WatchEvent.DELETE and ev.WhichOneof("record") == "kept":
                        deleted.set()
                        return

            tasks = [
                asyncio.create_task(watch(kept_events, True)),
                asyncio.create_task(watch(all_events, False)),
            ]
            await asyncio.wait_for(synced.wait(), 5)
            await c.touch_pod("p1")
            await c.put_attach_result(pb.AttachResult(pod_uid="p1", device="eth1", attached=True))
            await c.delete_claim("claim-1")
            await asyncio.wait_for(deleted.wait(), 5)
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
            # Only kept records and the SYNCED marker: no config, result, activity or liveness.
            assert [(e.type, e.WhichOneof("record")) for e in kept_events] == [
                (pb.WatchEvent.PUT, "kept"),
                (pb.WatchEvent.SYNCED, None),
                (pb.WatchEvent.DELETE, "kept"),
            ]
            # A full watch sees kept records too, beside everything else.
            assert ("kept", pb.WatchEvent.PUT) in [(e.WhichOneof("record"), e.type) for e in all_events]
            assert "device" in {e.WhichOneof("record") for e in all_events}


async def test_unary_list_kept(tmp_path: Path) -> None:
    with store_proc(tmp_path) as proc:
        async with StoreClient(proc.socket) as c:
            await c.put_devices([], kept=[make_kept("p1", "eth1")])
        async with channel(proc.socket) as ch:
            resp = await store_pb2_grpc.PodConfigStoreStub(ch).ListKept(pb.ListKeptRequest())
            assert kept_names(resp) == [("claim-1", "eth1")]
