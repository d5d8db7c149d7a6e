"""PersistentResourceSliceAttributes: the devices prepare kept for Pods, read from the
store and kept current with a watch, for the publisher's merge (shared/slicemerge.py).

Prepare writes a KeptDevice with the claim's DeviceConfigs (in one store transaction)
and the store removes it with them when the claim is unprepared, so this side only
reads. Until the first listing has arrived the set is not ``synced`` and the inventory
publishes nothing: publishing without it would drop every device that is in a Pod. When
the store goes away the last known set stays in use and the watch starts again, its
initial listing replacing the set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from proto.dranet.store.v1 import store_pb2 as st
from services.inventory.discovery import Device
from shared.storeclient import StoreCallError, StoreClient

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (claim uid, device)


def parse_kept(kd: st.KeptDevice) -> Device:
    """The device a KeptDevice holds; ValueError says what is wrong with it."""
    try:
        entry = json.loads(kd.device_json)
    except ValueError as exc:
        raise ValueError(f"device_json is not JSON: {exc}") from None
    if not isinstance(entry, dict):
        raise ValueError("device_json is not a JSON object")
    if entry.get("name") != kd.device:
        raise ValueError(f"device_json names device {entry.get('name')!r}, the record {kd.device!r}")
    return Device.from_slice_entry(entry)


class KeptDevices:
    """The store's kept devices by (claim uid, device), and the watch that follows them."""

    def __init__(
        self,
        store: StoreClient,
        on_change: Callable[[], Awaitable[None]] | None = None,
        retry_max_s: float = 5.0,
    ) -> None:
        self.store = store
        self.on_change = on_change
        self.retry_max_s = retry_max_s
        self.by_key: dict[Key, Device] = {}
        self.synced = asyncio.Event()
        self.last_error = ""

    def devices(self) -> list[Device]:
        """The kept devices, in (claim, device) order (the merge's order)."""
        return [self.by_key[k] for k in sorted(self.by_key)]

    def _take(self, into: dict[Key, Device], kd: st.KeptDevice) -> None:
        try:
            into[(kd.claim.uid, kd.device)] = parse_kept(kd)
        except ValueError as exc:
            log.warning(
                "ignoring a kept device the inventory cannot read",
                extra={"device": kd.device, "claim_uid": kd.claim.uid, "error": str(exc)},
            )

    async def _changed(self, before: Mapping[Key, Device], first: bool = False) -> None:
        # The first listing always counts: the inventory holds its first publish for it.
        if self.on_change is None or (dict(before) == self.by_key and not first):
            return
        log.info(
            "kept devices changed",
            extra={"devices": sorted({d.name for d in self.by_key.values()}), "count": len(self.by_key)},
        )
        await self.on_change()

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the store until ``stop``: the initial listing, then every change."""
        delay = 0.1
        while not stop.is_set():
            listing: dict[Key, Device] | None = {}
            try:
                async for ev in self.store.watch(initial=True, kept_only=True):
                    delay = 0.1
                    if ev.type == st.WatchEvent.SYNCED:
                        assert listing is not None
                        before, self.by_key = self.by_key, listing
                        listing = None
                        first = not self.synced.is_set()
                        self.synced.set()
                        self.last_error = ""
                        if first:
                            log.info("kept devices loaded from the store", extra={"count": len(self.by_key)})
                        await self._changed(before, first)
                        continue
                    if ev.WhichOneof("record") != "kept":
                        continue
                    target: dict[Key, Any] = listing if listing is not None else dict(self.by_key)
                    if ev.type == st.WatchEvent.DELETE:
                        target.pop((ev.kept.claim.uid, ev.kept.device), None)
                    else:
                        self._take(target, ev.kept)
                    if listing is None:
                        before, self.by_key = self.by_key, target
                        await self._changed(before)
            except StoreCallError as exc:
                self.last_error = str(exc)
                log.info("store watch for kept devices ended; watching again", extra={"error": str(exc)})
            try:
                await asyncio.wait_for(stop.wait(), delay * (0.5 + random.random() / 2))
            except TimeoutError:
                pass
            delay = min(delay * 2, self.retry_max_s)
