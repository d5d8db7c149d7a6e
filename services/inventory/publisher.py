"""Publishes the node's devices as resource.k8s.io/v1 ResourceSlices.

One pool per node, named after the node, driver dra.net; slices are owned by the
Node (ownerReference, controller) and named by the API server from
``<node>-dra.net-``. ``pooling.plan`` decides the writes; this module makes them
and keeps what the API server holds in a cache, so an unchanged device set costs
no API call at all. The cache is dropped and re-listed after any error (409
conflict, 404, outage) and refreshed every ``resync`` seconds, so changes made
by someone else are repaired and a create whose answer was lost never becomes a
duplicate slice.

A 429 is the exception. API Priority and Fairness sends it when the server is
busy (a thousand drivers starting at once), and it refuses the request before
acting on it: what the cache says is still true, and dropping it would add a list
to every retry, feeding the overload. The publisher keeps its cache (and the watch
its resourceVersion) and waits at least the server's Retry-After before it tries
again.

The watch tells the publisher's own writes from someone else's by resourceVersion. An
event that arrives before its write's answer (a busy server, or a busy event loop, sends
the two in either order) is held until the sync ends and judged then; the versions of
the last writes are kept too, so the event of the first of two quick writes, seen after
the second, is still known as ours. Before this, each of those cost a re-list.

On shutdown the slices are left in place, as dranet does: the kubelet deletes a
driver's slices when the plugin stays unregistered, and a restarted inventory
takes its slices over without churn.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from services.inventory import metrics, pooling
from services.inventory.pooling import Json, PublishedSlice
from shared import kubeapi

log = logging.getLogger(__name__)

# How many of the publisher's latest writes it remembers, to know their watch events as its own.
OWN_WRITES_KEPT = 64

DRIVER = "dra.net"
API_VERSION = "resource.k8s.io/v1"


# The API client's error: ``status`` is the HTTP status, 0 when there was no answer.
ApiError = kubeapi.ApiError

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


class SliceList(NamedTuple):
    items: list[Json]
    resource_version: str


class SliceClient:
    """ResourceSlice and Node calls as raw dicts over a shared/kubeapi.py KubeApi; every
    call has a timeout."""

    def __init__(self, api: kubeapi.KubeApi, timeout: float = 10.0) -> None:
        self.api = api
        self.timeout = timeout

    async def _call(self, method: str, path: str, **kw: Any) -> Json:
        return await self.api.request(method, path, deadline=self.timeout, **kw)

    async def list_slices(self, node_name: str, driver: str) -> SliceList:
        """The node's slices and the list's resourceVersion (the first page's: a paged list
        is one snapshot), from which a watch misses nothing the list did not hold."""
        out: list[Json] = []
        cont = ""
        version = ""
        while True:
            query = {"fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}", "continue": cont}
            page = await self._call("GET", SLICES, query=query)
            out.extend(page.get("items") or [])
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            cont = meta.get("continue") or ""
            if not cont:
                return SliceList(out, version)

    async def create_slice(self, obj: Json) -> Json:
        return await self._call("POST", SLICES, body=obj)

    async def replace_slice(self, name: str, obj: Json) -> Json:
        return await self._call("PUT", f"{SLICES}/{name}", body=obj)

    async def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        try:
            await self._call("DELETE", f"{SLICES}/{name}", body=body)
        except ApiError as exc:
            if exc.status != 404:
                raise

    async def watch_slices(self, node_name: str, driver: str, resource_version: str) -> Any:
        """(type, object) for every change to the node's slices from ``resource_version``;
        ends when the server ends the watch. ApiError(410) when the version is too old."""
        query = {
            "fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": 300,
        }
        async for kind, obj in self.api.watch(SLICES, query, connect_timeout=self.timeout):
            yield kind, obj

    async def node_uid(self, name: str) -> str:
        node = await self._call("GET", f"/api/v1/nodes/{name}")
        return str((node.get("metadata") or {}).get("uid", ""))


@dataclass
class PublishStats:
    """What the publisher has done since start (for logs, tests and the benchmark)."""

    creates: int = 0
    updates: int = 0
    deletes: int = 0
    lists: int = 0
    syncs: int = 0
    errors: int = 0
    throttled: int = 0  # of the errors, 429s (the cache was kept)

    @property
    def writes(self) -> int:
        return self.creates + self.updates + self.deletes


class Publisher:
    """Keeps the node's ResourceSlices equal to the last device list it was given."""

    def __init__(
        self,
        client: SliceClient,
        node_name: str,
        *,
        driver: str = DRIVER,
        resync: float = 60.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        max_per_slice: int = pooling.MAX_DEVICES_PER_SLICE,
    ) -> None:
        self.client = client
        self.node_name = node_name
        self.pool_name = node_name
        self.driver = driver
        self.resync = resync
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_per_slice = max_per_slice
        self.stats = PublishStats()
        self._desired: list[Json] | None = None
        self._version = 0  # bumps with every set_devices
        self._synced_version = 0
        self._cache: dict[str, PublishedSlice] | None = None
        self._cache_time = 0.0
        self._owner_uid = ""
        # The resourceVersion of the list the cache was built from: the watch starts there,
        # so it needs no list of its own and misses nothing between the two.
        self._listed_version = ""
        self._listed = asyncio.Event()
        self._wake = asyncio.Event()
        self._synced = asyncio.Condition()
        # Own writes: (name, resourceVersion) of the last ones, and the watch events held
        # while a sync is writing (kind, name, resourceVersion), judged when it ends.
        self._own: collections.deque[tuple[str, str]] = collections.deque(maxlen=OWN_WRITES_KEPT)
        self._syncing = False
        self._held: list[tuple[str, str, str]] = []
        self.last_error = ""

    # --- input -----------------------------------------------------------------------------------

    def set_devices(self, devices: Sequence[Json]) -> None:
        """Publish exactly ``devices`` (ResourceSlice device dicts) from now on."""
        self._desired = list(devices)
        self._version += 1
        self._wake.set()
        metrics.devices_to_publish(self._desired)

    @property
    def healthy(self) -> bool:
        """True when the latest device list is on the API server (or there has been
        nothing to publish yet: dranet publishes nothing before the first device)."""
        return self._synced_version == self._version

    async def wait_synced(self, within: float) -> bool:
        """Wait until the device list given so far is published; False on timeout."""
        target = self._version

        async def done() -> None:
            async with self._synced:
                await self._synced.wait_for(lambda: self._synced_version >= target)

        try:
            await asyncio.wait_for(done(), within)
        except TimeoutError:
            return False
        return True

    # --- loop ------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Sync whenever the devices change, retrying with backoff, until ``stop``."""
        backoff = self.backoff_initial
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                waker = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({waker, stopper}, timeout=self.resync, return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
                if stop.is_set():
                    return
                self._wake.clear()
                if self._desired is None:
                    continue
                version = self._version
                try:
                    await self.sync()
                except ApiError as exc:
                    self.stats.errors += 1
                    if exc.status == 429:
                        self.stats.throttled += 1  # refused unread: the cache still holds
                    else:
                        self._cache = None
                    self.last_error = str(exc)
                    delay = max(exc.retry_after, backoff * (0.5 + random.random() / 2))
                    log.warning(
                        "publishing ResourceSlices failed; retrying in %.1fs: %s",
                        delay,
                        exc,
                        extra={"node": self.node_name, "status": exc.status},
                    )
                    backoff = min(backoff * 2, self.backoff_max)
                    await asyncio.wait({stopper}, timeout=delay)
                    self._wake.set()
                    continue
                backoff = self.backoff_initial
                self.last_error = ""
                metrics.published()
                async with self._synced:
                    self._synced_version = max(self._synced_version, version)
                    self._synced.notify_all()
        finally:
            stopper.cancel()

    def _external(self, kind: str, name: str, version: str) -> bool:
        """Whether a watch event is a change this publisher did not make."""
        if kind == "BOOKMARK":
            return False
        cache = self._cache
        if cache is None:
            return True
        known = cache.get(name)
        if kind == "DELETED":
            return known is not None
        if (name, version) in self._own:
            return False
        return known is None or known.resource_version != version

    def _on_event(self, kind: str, obj: Json) -> None:
        """A watch event: held while a sync writes, else judged now."""
        if self._desired is None or kind == "BOOKMARK":
            return
        meta = obj.get("metadata") or {}
        event = (kind, str(meta.get("name", "")), str(meta.get("resourceVersion", "")))
        if self._syncing:
            self._held.append(event)
        else:
            self._judge([event])

    def _judge(self, events: list[tuple[str, str, str]]) -> None:
        """Drop the cache and wake a sync if any of ``events`` is someone else's change. With
        no cache a sync that lists is already due (after an error, once its backoff ends)."""
        if self._cache is None:
            return
        for kind, name, version in events:
            if self._external(kind, name, version):
                log.info(
                    "ResourceSlice changed by someone else; re-syncing",
                    extra={"node": self.node_name, "event": kind, "slice": name},
                )
                self._cache = None
                self._wake.set()
                return

    async def watch(self, stop: asyncio.Event) -> None:
        """Watch the node's slices. A change made by someone else (a kubelet wiping
        the node's slices at its start, an edit, a delete) drops the cache and wakes
        a sync at once, instead of waiting for the next resync. Our own writes are known
        by their resourceVersions (see the module's docstring).

        The watch starts from the version of the list the sync's cache came from, so a
        thousand nodes starting at once make one list each, not two, and it misses nothing
        written since. It starts once that sync has written the node's slices: when a
        thousand nodes start at once, their watches would otherwise queue in the API
        server's priority level with the creates and delay the first publish (the watch
        then replays our own creates, known as ours). Until a sync has listed (nothing
        to publish yet) there is nothing the watch could repair."""
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await self._watch(stop, stopper)
        finally:
            stopper.cancel()

    async def _watch(self, stop: asyncio.Event, stopper: asyncio.Future[Any]) -> None:
        backoff = self.backoff_initial
        version = ""
        while not stop.is_set():
            try:
                if not version:
                    listed = asyncio.ensure_future(self._listed.wait())
                    await asyncio.wait({listed, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    listed.cancel()
                    if stop.is_set():
                        return
                    version = self._listed_version
                # A watch the server ends (timeout) resumes from the last version seen.
                async for kind, obj in self.client.watch_slices(self.node_name, self.driver, version):
                    backoff = self.backoff_initial
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    self._on_event(kind, obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server went away, or the version expired (410)
                at_least = 0.0
                if isinstance(exc, ApiError) and exc.status == 429:
                    # Refused before it started: nothing was missed since ``version``, so
                    # the same watch (or list) again, later.
                    at_least = exc.retry_after
                    log.debug(
                        "slice watch throttled; trying again",
                        extra={"node": self.node_name, "error": str(exc)},
                    )
                else:
                    log.debug(
                        "slice watch ended; listing again", extra={"node": self.node_name, "error": str(exc)}
                    )
                    # Events may have been missed: re-list before trusting the cache, and
                    # watch from that list.
                    version = ""
                    self._listed.clear()
                    self._cache = None
                    self._wake.set()
                try:
                    await asyncio.wait_for(stop.wait(), max(at_least, backoff * (0.5 + random.random() / 2)))
                except TimeoutError:
                    pass
                backoff = min(backoff * 2, self.backoff_max)

    async def sync(self) -> pooling.Plan:
        """One reconciliation against the API server; raises ApiError. The watch events that
        came in meanwhile are judged after it, against what it wrote."""
        self._syncing = True
        try:
            p = await self._sync()
            if self._listed_version:
                self._listed.set()  # the watch may start (see watch())
            return p
        finally:
            self._syncing = False
            held, self._held = self._held, []
            self._judge(held)

    async def _sync(self) -> pooling.Plan:
        self.stats.syncs += 1
        desired = list(self._desired or [])
        if not self._owner_uid:
            try:
                self._owner_uid = await self.client.node_uid(self.node_name)
            except ApiError as exc:
                if exc.status == 404:
                    raise ApiError(
                        404, f"node {self.node_name} not found: its slices need it as owner"
                    ) from None
                raise
        if self._cache is None or time.monotonic() - self._cache_time > self.resync:
            items, listed_version = await self.client.list_slices(self.node_name, self.driver)
            self.stats.lists += 1
            self._cache = {}
            for obj in items:
                s = PublishedSlice.from_object(obj)
                self._cache[s.name] = s
            self._cache_time = time.monotonic()
            if listed_version:
                self._listed_version = listed_version
        cache = self._cache
        p = pooling.plan(self.pool_name, self.node_name, desired, list(cache.values()), self.max_per_slice)
        if p.empty:
            return p
        log.info(
            "updating ResourceSlices",
            extra={
                "node": self.node_name,
                "generation": p.generation,
                "slices": p.slice_count,
                "updates": len(p.updates),
                "creates": len(p.creates),
                "deletes": len(p.deletes),
                "devices": len(desired),
            },
        )
        for upd in p.updates:
            obj = dict(upd.slice.raw)
            obj["spec"] = self._spec(p, upd.devices)
            saved = await self.client.replace_slice(upd.slice.name, obj)
            self.stats.updates += 1
            s = PublishedSlice.from_object(saved)
            cache[s.name] = s
            self._own.append((s.name, s.resource_version))
        for devices in p.creates:
            saved = await self.client.create_slice(self._new_slice(p, devices))
            self.stats.creates += 1
            s = PublishedSlice.from_object(saved)
            cache[s.name] = s
            self._own.append((s.name, s.resource_version))
        for old in p.deletes:
            await self.client.delete_slice(old.name, old.uid, old.resource_version)
            self.stats.deletes += 1
            cache.pop(old.name, None)
        return p

    def _spec(self, p: pooling.Plan, devices: Sequence[Json]) -> Json:
        return pooling.slice_spec(
            self.driver, self.pool_name, self.node_name, p.generation, p.slice_count, devices
        )

    def _new_slice(self, p: pooling.Plan, devices: Sequence[Json]) -> Json:
        return {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": pooling.generate_name(self.node_name, self.driver),
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": self.node_name,
                        "uid": self._owner_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": self._spec(p, devices),
        }


async def make_api_client(kubeconfig: str) -> kubeapi.KubeApi:
    """A KubeApi from ``kubeconfig``, or the in-cluster config."""
    try:
        return kubeapi.KubeApi.load(kubeconfig or None, user_agent="dra.net/inventory")
    except (kubeapi.KubeConfigError, OSError, ssl.SSLError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster config (no --kubeconfig given)"
        raise RuntimeError(
            f"cannot load {where}: {exc}; use --no-publish to run without an API server"
        ) from None
