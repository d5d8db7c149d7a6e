"""Claim status from attach results: status.devices of each ResourceClaim.

The attach service holds no Kubernetes credentials; it records what it did in
the store. This watcher turns those records into the claim's status.devices
(driver, pool, device, conditions, networkData): this driver's entries are
replaced as a whole and other drivers' entries kept (``Kube.apply_claim_devices``),
so an entry disappears when its result does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from proto.dranet.store.v1 import store_pb2 as st
from services.prepare.kube import Kube, KubeError
from shared.logs import log_fields
from shared.storeclient import StoreCallError, StoreClient

log = logging.getLogger(__name__)

MAX_CONDITIONS = 8  # resource.k8s.io/v1 AllocatedDeviceStatus.conditions
MAX_IPS = 16  # NetworkDeviceData.ips


def _rfc3339(unix: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix or time.time()))


def device_status(result: st.AttachResult, driver: str) -> dict[str, Any]:
    """The AllocatedDeviceStatus entry for one attach result."""
    entry: dict[str, Any] = {"driver": result.driver or driver, "pool": result.pool, "device": result.device}
    conditions = [
        {
            "type": c.type,
            "status": c.status or "True",
            "reason": c.reason or c.type,
            "message": c.message[:32768],
            "lastTransitionTime": _rfc3339(c.last_transition_unix),
        }
        for c in result.conditions[:MAX_CONDITIONS]
    ]
    if conditions:
        entry["conditions"] = conditions
    network: dict[str, Any] = {}
    if result.interface_name:
        network["interfaceName"] = result.interface_name
    if result.ips:
        network["ips"] = list(result.ips[:MAX_IPS])
    if result.hardware_address:
        network["hardwareAddress"] = result.hardware_address
    if network:
        entry["networkData"] = network
    return entry


class ClaimStatusWriter:
    """Watches attach results in the store and applies each claim's status.devices."""

    def __init__(self, store: StoreClient, kube: Kube, driver: str, debounce_s: float = 0.05) -> None:
        self.store = store
        self.kube = kube
        self.driver = driver
        self.debounce_s = debounce_s
        # claim uid -> (namespace, name, {(pod uid, device): result})
        self._claims: dict[str, tuple[str, str, dict[tuple[str, str], st.AttachResult]]] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self.applied = 0
        # The attach service's liveness as the store's watch last told it: the safety gate
        # reads it here instead of asking the store on each prepare. None until the watch
        # has synced and whenever it is down; the gate then asks the store.
        self.attach: st.AttachLiveness | None = None

    def _on_result(self, result: st.AttachResult, deleted: bool) -> None:
        uid = result.claim.uid
        if not uid:
            return
        _, _, results = self._claims.setdefault(uid, (result.claim.namespace, result.claim.name, {}))
        key = (result.pod_uid, result.device)
        if deleted:
            results.pop(key, None)
        else:
            results[key] = result
        self._dirty.add(uid)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        writer = asyncio.create_task(self._writer(stop))
        try:
            while not stop.is_set():
                try:
                    await self._watch()
                except StoreCallError as exc:
                    log.warning("store watch ended; watching again", extra={"error": str(exc)})
                await asyncio.sleep(0.5)
        finally:
            writer.cancel()

    async def _watch(self) -> None:
        synced = False
        seen: st.AttachLiveness | None = None
        try:
            async for ev in self.store.watch(initial=True):
                record = ev.WhichOneof("record")
                if record == "result":
                    self._on_result(ev.result, ev.type == st.WatchEvent.DELETE)
                elif record == "liveness":
                    seen = ev.liveness
                    if synced:
                        self.attach = seen
                elif ev.type == st.WatchEvent.SYNCED:
                    synced = True
                    self.attach = seen
        finally:
            self.attach = None

    async def _writer(self, stop: asyncio.Event) -> None:
        backoff = 0.2
        while not stop.is_set():
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.debounce_s)
            dirty, self._dirty = self._dirty, set()
            failed: set[str] = set()
            for uid in dirty:
                if uid not in self._claims:
                    continue
                ns, name, results = self._claims[uid]
                devices = [device_status(r, self.driver) for r in results.values() if r.attached or r.error]
                try:
                    exists = await self.kube.apply_claim_devices(ns, name, devices)
                    self.applied += 1
                    if not exists or not results:
                        self._claims.pop(uid, None)
                    log.debug(
                        "claim status applied", extra=log_fields(claim=f"{ns}/{name}", devices=len(devices))
                    )
                except KubeError as exc:
                    if exc.status == 422:
                        # Refused as invalid: retrying the same write cannot succeed. The known
                        # case is upstream's, see Kube.apply_claim_devices.
                        log.warning(
                            "claim status refused by the API server; not retried",
                            extra=log_fields(claim=f"{ns}/{name}", error=str(exc)),
                        )
                        continue
                    log.warning(
                        "claim status apply failed", extra=log_fields(claim=f"{ns}/{name}", error=str(exc))
                    )
                    failed.add(uid)
            if failed:
                self._dirty |= failed
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self._wake.set()
            else:
                backoff = 0.2
