"""PersistentResourceSliceAttributes in the inventory: the kept devices merged with a scan
(merge_kept), the store watch that keeps them (KeptDevices), and publishing held until they
are loaded."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from proto.dranet.store.v1 import store_pb2 as st
from services.inventory import attributes as A
from services.inventory.discovery import Device
from services.inventory.inventory import Inventory, InventoryConfig, merge_kept
from services.inventory.kept import KeptDevices, parse_kept
from shared.deviceattr import Attribute
from shared.storeclient import StoreCallError, StoreClient


def device(name: str, **attrs: Attribute) -> Device:
    return Device(name=name, attributes={f"dra.net/{k}": v for k, v in attrs.items()}, ifname=name)


def kept(name: str, claim: str = "c1", **attrs: Attribute) -> st.KeptDevice:
    return st.KeptDevice(
        device=name,
        claim=st.ClaimRef(uid=claim, namespace="ns", name="claim"),
        pod_uid="p1",
        pool="node-a",
        device_json=json.dumps(device(name, **attrs).slice_entry()),
    )


S, Int = Attribute.of_string, Attribute.of_int


def test_merge_kept_keeps_a_device_that_left_the_host() -> None:
    live = [device("a", ifName=S("a"))]
    gone = device("n1", ifName=S("n1"), mtu=Int(1400))
    merged, dropped = merge_kept(live, [gone])
    assert [d.name for d in merged] == ["a", "n1"] and not dropped
    assert merged[0] is live[0]  # untouched live devices are the scan's own objects
    assert merged[1].slice_entry() == gone.slice_entry()


def test_merge_kept_fills_what_the_live_device_lacks_and_keeps_its_lookup_fields() -> None:
    live = Device(
        name="pci-0000-3b-00-0",
        attributes={A.PCI_ADDRESS: S("0000:3b:00.0"), A.RDMA: Attribute.of_bool(False)},
        pci_address="0000:3b:00.0",
    )
    snap = Device(
        name="pci-0000-3b-00-0",
        attributes={A.PCI_ADDRESS: S("0000:3b:00.0"), A.RDMA: Attribute.of_bool(True), A.IF_NAME: S("ens1")},
    )
    ((merged,), _) = merge_kept([live], [snap])
    assert merged.slice_entry()["attributes"] == {
        A.IF_NAME: {"string": "ens1"},
        A.PCI_ADDRESS: {"string": "0000:3b:00.0"},
        A.RDMA: {"bool": False},
    }
    assert merged.pci_address == "0000:3b:00.0" and merged.ifname == ""


def test_merge_kept_stays_within_the_attribute_limit() -> None:
    provider = {f"cloud.example/a{i:02}": Int(i) for i in range(40)}
    live = Device(name="d", attributes=dict(list(provider.items())[:30]))
    snap = Device(
        name="d", attributes={A.IF_NAME: S("d"), A.MTU: Int(1500), **dict(list(provider.items())[30:32])}
    )
    ((merged,), dropped) = merge_kept([live], [snap])
    assert len(merged.attributes) == A.MAX_ATTRIBUTES_PER_DEVICE
    assert A.IF_NAME in merged.attributes and A.MTU in merged.attributes  # dranet's first
    assert dropped == {"d": ["cloud.example/a30", "cloud.example/a31"]}


def test_merge_kept_without_kept_devices_is_the_scan() -> None:
    live = [device("a"), device("b")]
    assert merge_kept(live, []) == (live, {})


@pytest.mark.parametrize(
    ("json_text", "message"),
    [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"name": "other"}', "names device 'other'"),
        ('{"name": "n1", "attributes": {"dra.net/x": {"bogus": 1}}}', "attribute dra.net/x"),
    ],
)
def test_parse_kept_refuses_what_it_cannot_publish(json_text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kept(st.KeptDevice(device="n1", device_json=json_text))


class FakeStore:
    """watch(initial=True, kept_only=True) yields the queued events; None ends the stream with
    an error (the store went away), and the next watch reads on."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[st.WatchEvent | None] = asyncio.Queue()
        self.watches = 0

    async def watch(self, initial: bool = True, kept_only: bool = False) -> AsyncIterator[st.WatchEvent]:
        assert initial and kept_only
        self.watches += 1
        while True:
            ev = await self.events.get()
            if ev is None:
                raise StoreCallError("UNAVAILABLE", "store gone")
            yield ev

    def send(self, *events: st.WatchEvent | None) -> None:
        for ev in events:
            self.events.put_nowait(ev)


def put(kd: st.KeptDevice) -> st.WatchEvent:
    return st.WatchEvent(type=st.WatchEvent.PUT, kept=kd)


def delete(kd: st.KeptDevice) -> st.WatchEvent:
    return st.WatchEvent(type=st.WatchEvent.DELETE, kept=kd)


SYNCED = st.WatchEvent(type=st.WatchEvent.SYNCED)


async def until(pred: Any, within: float = 5.0) -> None:
    for _ in range(int(within / 0.01)):
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached within {within}s")


async def test_kept_devices_follow_the_store() -> None:
    store = FakeStore()
    changes: list[list[str]] = []
    tracker: KeptDevices

    async def on_change() -> None:
        changes.append([d.name for d in tracker.devices()])

    tracker = KeptDevices(cast(StoreClient, store), on_change, retry_max_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    a, b = kept("n1", ifName=S("n1")), kept("n2", claim="c2")
    # The initial listing counts only once complete; the first one always reports (even empty).
    store.send(put(a), SYNCED, put(b), delete(a))
    await until(lambda: len(changes) == 3)
    assert changes == [["n1"], ["n1", "n2"], ["n2"]] and tracker.synced.is_set()
    # The store goes away: the last set stays; the next listing replaces it.
    store.send(None, put(a), SYNCED)
    await until(lambda: len(changes) == 4)
    assert changes[-1] == ["n1"] and store.watches == 2
    # A listing equal to what is known reports nothing; a record it cannot read is left out.
    store.send(None, put(a), put(st.KeptDevice(device="bad", claim=a.claim, device_json="{")), SYNCED)
    await until(lambda: store.watches == 3 and store.events.empty())
    await asyncio.sleep(0.05)
    assert len(changes) == 4 and [d.name for d in tracker.devices()] == ["n1"]
    stop.set()
    task.cancel()


async def test_first_publish_waits_for_the_kept_devices() -> None:
    """With the gate on the inventory publishes nothing before the kept devices are loaded,
    then publishes the scan merged with them."""
    published: list[list[str]] = []
    store = FakeStore()
    inv = Inventory(
        InventoryConfig(sysfs_root="/nonexistent"),
        on_publish=lambda ds: published.append([d.name for d in ds]),
    )
    inv.kept = KeptDevices(cast(StoreClient, store), on_change=inv.republish)
    live = [device("a", ifName=S("a"))]
    inv.devices = {d.name: d for d in live}
    async with inv._scan_lock:
        assert [d.name for d in await inv._publish(live)] == ["a"]
    inv.ready = True
    assert published == []  # held
    stop = asyncio.Event()
    task = asyncio.create_task(inv.kept.run(stop))
    store.send(put(kept("n1", ifName=S("n1"))), SYNCED)
    await until(lambda: published)
    assert published == [["a", "n1"]] and inv.published == {"a", "n1"}
    stop.set()
    task.cancel()
