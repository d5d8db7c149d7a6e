"""The publisher's retry rules against an in-memory API: conflicts, outages, lost answers."""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

import pytest

from services.inventory.pooling import Json
from services.inventory.publisher import ApiError, Publisher


class MemoryApi:
    """Just enough of the ResourceSlice API: resourceVersions, 409s, scripted failures."""

    def __init__(self) -> None:
        self.objects: dict[str, Json] = {}
        self.rv = itertools.count(1)
        self.names = itertools.count()
        self.writes = 0
        self.fail_next: list[ApiError] = []
        self.lose_create_answer = False
        self.node_found = True

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    async def node_uid(self, name: str) -> str:
        self._maybe_fail()
        if not self.node_found:
            raise ApiError(404, f'nodes "{name}" not found')
        return "node-uid-1"

    async def list_slices(self, node_name: str, driver: str) -> list[Json]:
        self._maybe_fail()
        return [
            copy.deepcopy(o)
            for o in self.objects.values()
            if o["spec"]["nodeName"] == node_name and o["spec"]["driver"] == driver
        ]

    async def create_slice(self, obj: Json) -> Json:
        self._maybe_fail()
        self.writes += 1
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["name"] = meta.pop("generateName") + f"{next(self.names):05d}"
        meta["uid"] = f"uid-{meta['name']}"
        meta["resourceVersion"] = str(next(self.rv))
        self.objects[meta["name"]] = obj
        if self.lose_create_answer:
            self.lose_create_answer = False
            raise ApiError(0, "connection reset while reading the answer")
        return copy.deepcopy(obj)

    async def replace_slice(self, name: str, obj: Json) -> Json:
        self._maybe_fail()
        self.writes += 1
        cur = self.objects.get(name)
        if cur is None:
            raise ApiError(404, "not found")
        if cur["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified")
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self.objects[name] = obj
        return copy.deepcopy(obj)

    async def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        self._maybe_fail()
        self.writes += 1
        cur = self.objects.get(name)
        if cur is None:
            return
        if cur["metadata"]["resourceVersion"] != resource_version:
            raise ApiError(409, "precondition failed")
        del self.objects[name]

    def devices(self) -> list[str]:
        return sorted(d["name"] for o in self.objects.values() for d in o["spec"].get("devices", []))


def devs(n: int, mtu: int = 1500) -> list[Json]:
    return [{"name": f"d{i:04d}", "attributes": {"dra.net/mtu": {"int": mtu}}} for i in range(n)]


def publisher(api: MemoryApi, **kw: Any) -> Publisher:
    return Publisher(api, "node-a", backoff_initial=0.01, backoff_max=0.05, **kw)  # type: ignore[arg-type]


async def test_first_publish_shape() -> None:
    api = MemoryApi()
    pub = publisher(api)
    pub.set_devices(devs(130))
    await pub.sync()
    assert len(api.objects) == 2 and api.devices() == [f"d{i:04d}" for i in range(130)]
    for obj in api.objects.values():
        assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
        assert obj["metadata"]["name"].startswith("node-a-dra.net-")
        assert obj["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "node-uid-1", "controller": True}
        ]
        assert obj["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 2}
        assert obj["spec"]["driver"] == "dra.net" and obj["spec"]["nodeName"] == "node-a"


async def test_unchanged_devices_make_no_api_calls() -> None:
    api = MemoryApi()
    pub = publisher(api)
    pub.set_devices(devs(10))
    await pub.sync()
    writes, lists = api.writes, pub.stats.lists
    pub.set_devices(devs(10))
    p = await pub.sync()
    assert p.empty and api.writes == writes and pub.stats.lists == lists


async def test_conflict_relists_and_converges() -> None:
    api = MemoryApi()
    pub = publisher(api)
    pub.set_devices(devs(10))
    await pub.sync()
    # Someone else edits our slice: our cached resourceVersion is stale now.
    (obj,) = api.objects.values()
    obj["metadata"]["resourceVersion"] = "999"
    obj["spec"]["devices"] = obj["spec"]["devices"][:3]
    pub.set_devices(devs(10, mtu=9000))
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    assert await pub.wait_synced(within=5)
    stop.set()
    await task
    assert pub.stats.errors == 1 and pub.stats.lists == 2
    (obj,) = api.objects.values()
    assert [d["attributes"]["dra.net/mtu"]["int"] for d in obj["spec"]["devices"]] == [9000] * 10


async def test_outage_is_retried_with_backoff() -> None:
    api = MemoryApi()
    api.fail_next = [ApiError(0, "connection refused")] * 3
    pub = publisher(api)
    pub.set_devices(devs(3))
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    assert await pub.wait_synced(within=5)
    stop.set()
    await task
    assert pub.stats.errors == 3 and api.devices() == ["d0000", "d0001", "d0002"]
    assert pub.healthy


async def test_lost_create_answer_makes_no_duplicate() -> None:
    api = MemoryApi()
    api.lose_create_answer = True
    pub = publisher(api)
    pub.set_devices(devs(3))
    stop = asyncio.Event()
    task = asyncio.create_task(pub.run(stop))
    assert await pub.wait_synced(within=5)
    stop.set()
    await task
    assert len(api.objects) == 1 and api.devices() == ["d0000", "d0001", "d0002"]


async def test_missing_node_is_an_error_naming_it() -> None:
    api = MemoryApi()
    api.node_found = False
    pub = publisher(api)
    pub.set_devices(devs(1))
    with pytest.raises(ApiError, match="node node-a not found"):
        await pub.sync()


async def test_slices_of_other_pools_on_this_node_are_removed() -> None:
    api = MemoryApi()
    api.objects["legacy"] = {
        "metadata": {"name": "legacy", "uid": "u", "resourceVersion": "1"},
        "spec": {
            "driver": "dra.net",
            "nodeName": "node-a",
            "pool": {"name": "old", "generation": 9, "resourceSliceCount": 1},
        },
    }
    pub = publisher(api)
    pub.set_devices(devs(2))
    await pub.sync()
    assert "legacy" not in api.objects and api.devices() == ["d0000", "d0001"]


async def test_external_deletion_is_repaired_after_resync() -> None:
    api = MemoryApi()
    pub = publisher(api, resync=0.0)
    pub.set_devices(devs(2))
    await pub.sync()
    api.objects.clear()
    await pub.sync()
    assert api.devices() == ["d0000", "d0001"]
