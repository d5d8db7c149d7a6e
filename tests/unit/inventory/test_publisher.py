"""The publisher's retry rules against an in-memory API: conflicts, outages, lost answers."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
from typing import Any

import pytest

from services.inventory.pooling import Json
from services.inventory.publisher import ApiError, Publisher, SliceList


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
        self.lists = 0

    def _maybe_fail(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    async def node_uid(self, name: str) -> str:
        self._maybe_fail()
        if not self.node_found:
            raise ApiError(404, f'nodes "{name}" not found')
        return "node-uid-1"

    async def list_slices(self, node_name: str, driver: str) -> SliceList:
        self._maybe_fail()
        self.lists += 1
        items = [
            copy.deepcopy(o)
            for o in self.objects.values()
            if o["spec"]["nodeName"] == node_name and o["spec"]["driver"] == driver
        ]
        return SliceList(items, f"v{self.lists}")

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


async def test_a_429_keeps_the_cache_and_waits_the_retry_after() -> None:
    """API Priority and Fairness refused the write without acting on it: no re-list (which
    would add load to a busy server), and no retry before its Retry-After."""
    api = MemoryApi()
    pub = publisher(api)
    pub.set_devices(devs(10))
    await pub.sync()
    assert pub.stats.lists == 1
    api.fail_next = [ApiError(429, "Too many requests, please try again later.", retry_after=0.3)] * 2
    pub.set_devices(devs(10, mtu=9000))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(pub.run(stop))
    assert await pub.wait_synced(within=5)
    waited = loop.time() - started
    stop.set()
    await task
    assert (pub.stats.errors, pub.stats.throttled, pub.stats.lists) == (2, 2, 1)
    assert waited >= 0.6  # two Retry-Afters of 0.3 s, though the backoff is at most 0.05 s
    (obj,) = api.objects.values()
    assert [d["attributes"]["dra.net/mtu"]["int"] for d in obj["spec"]["devices"]] == [9000] * 10


class WatchApi(MemoryApi):
    """Adds the watch: scripted outcomes for each watch opened, and the versions asked for."""

    def __init__(self, outcomes: list[ApiError | None]) -> None:
        super().__init__()
        self.outcomes = outcomes
        self.watched_from: list[str] = []
        self.writes_when_watched: list[int] = []
        self.done = asyncio.Event()

    async def watch_slices(self, node_name: str, driver: str, resource_version: str) -> Any:
        self.watched_from.append(resource_version)
        self.writes_when_watched.append(self.writes)
        if not self.outcomes:
            self.done.set()
            await asyncio.Event().wait()
        failure = self.outcomes.pop(0)
        if failure is not None:
            raise failure
        yield "BOOKMARK", {"metadata": {"resourceVersion": resource_version + "+"}}


async def run_publisher_and_watch(api: WatchApi, pub: Publisher) -> None:
    stop = asyncio.Event()
    runner, watcher = asyncio.create_task(pub.run(stop)), asyncio.create_task(pub.watch(stop))
    await asyncio.wait_for(api.done.wait(), 5)
    stop.set()
    await asyncio.wait_for(runner, 5)
    watcher.cancel()  # as the service does: the open watch ends with the process
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


async def test_a_throttled_watch_resumes_from_its_version_without_a_relist() -> None:
    api = WatchApi(
        [None, ApiError(429, "Too many requests", retry_after=0.01), ApiError(0, "connection reset")]
    )
    pub = publisher(api)
    pub.set_devices(devs(1))
    await run_publisher_and_watch(api, pub)
    # The watch starts from the sync's list. The first watch ended after a bookmark (the
    # server's timeout): resumed from it. The 429 resumed from the same version and kept
    # the cache; a broken watch made the sync list again, and the watch starts from that list.
    assert api.watched_from == ["v1", "v1+", "v1+", "v2"]
    assert api.lists == 2 and pub.stats.lists == 2


async def test_the_watch_makes_no_list_of_its_own() -> None:
    # A thousand nodes starting at once: one list each (the sync's), the watch starts there,
    # once the slices are written (not queued in the API server beside the creates).
    api = WatchApi([])
    pub = publisher(api)
    pub.set_devices(devs(3))
    await run_publisher_and_watch(api, pub)
    assert api.lists == 1 and api.watched_from == ["v1"] and api.writes == 1
    assert api.writes_when_watched == [1]


async def test_the_watch_waits_for_something_to_publish_and_stops() -> None:
    api = WatchApi([])
    pub = publisher(api)
    stop = asyncio.Event()
    task = asyncio.create_task(pub.watch(stop))
    await asyncio.sleep(0.05)
    assert api.watched_from == [] and api.lists == 0  # no devices yet: nothing to repair
    stop.set()
    await asyncio.wait_for(task, 1)


class EchoApi(MemoryApi):
    """A watch that sends each write's event before the write's answer, as a busy server (or
    a busy event loop) may; ``edit`` is a write by someone else."""

    def __init__(self) -> None:
        super().__init__()
        self.events: asyncio.Queue[tuple[str, Json]] = asyncio.Queue()

    async def watch_slices(self, node_name: str, driver: str, resource_version: str) -> Any:
        while True:
            yield await self.events.get()

    async def _echo(self, kind: str, obj: Json) -> None:
        self.events.put_nowait((kind, copy.deepcopy(obj)))
        await asyncio.sleep(0.02)  # the answer comes after the event has been read

    async def create_slice(self, obj: Json) -> Json:
        saved = await super().create_slice(obj)
        await self._echo("ADDED", saved)
        return saved

    async def replace_slice(self, name: str, obj: Json) -> Json:
        saved = await super().replace_slice(name, obj)
        await self._echo("MODIFIED", saved)
        return saved

    def edit(self) -> None:
        (obj,) = self.objects.values()
        obj["spec"]["devices"] = []
        obj["metadata"]["resourceVersion"] = str(next(self.rv))
        self.events.put_nowait(("MODIFIED", copy.deepcopy(obj)))


async def test_own_writes_seen_before_their_answer_cost_no_relist() -> None:
    api = EchoApi()
    pub = publisher(api)
    stop = asyncio.Event()
    runner, watcher = asyncio.create_task(pub.run(stop)), asyncio.create_task(pub.watch(stop))
    try:
        pub.set_devices(devs(3))
        assert await pub.wait_synced(within=5)
        # Two quick changes: the first update's event may come after the second update.
        pub.set_devices(devs(3, mtu=9000))
        assert await pub.wait_synced(within=5)
        pub.set_devices(devs(3, mtu=1400))
        assert await pub.wait_synced(within=5)
        await asyncio.sleep(0.1)
        assert (pub.stats.lists, pub.stats.creates, pub.stats.updates) == (1, 1, 2)
        # Someone else's change is still repaired at once, with a re-list.
        api.edit()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if api.devices() == ["d0000", "d0001", "d0002"]:
                break
        assert api.devices() == ["d0000", "d0001", "d0002"] and pub.stats.lists == 2
    finally:
        stop.set()
        await asyncio.wait_for(runner, 5)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
