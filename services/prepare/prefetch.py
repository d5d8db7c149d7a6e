"""Claims read before the kubelet asks for them.

The kubelet calls NodePrepareResources only after it has seen a Pod bound to this node, and
then it waits for us. prepare watches the same thing (the node's Pods: field selector
``spec.nodeName``, the watch the kubelet itself holds) and GETs the claims of each new Pod
as soon as it is bound, so the claim is usually in hand, or on its way, when the call comes,
and its GET (before this, the largest single part of prepare's time) leaves the path the
Pod waits on. The API server sees no more requests than before: one GET per claim, plus one
watch per node.

A copy is used only when it is safe to: it is taken once (a retry of the kubelet reads the
claim again), it is younger than ``max_age_s``, its UID is the one the kubelet names, and
it is allocated and reserved. The scheduler writes the allocation (with the config in it)
before it binds the Pod, and both are immutable once set, so a copy read after the binding
says what a GET would. Anything else falls back to a GET. The watch is only a shortcut:
when it fails it starts again with backoff, and prepare reads its claims itself meanwhile.

With the claim in hand, the devices allocated on this node are read ahead from the
inventory too (GetDevice with the host snapshot: link, addresses, routes, rules, RDMA
files; the next largest part once the claim GET is gone). A device copy is used once, if
younger than ``device_max_age_s`` (seconds: the same window as the one between prepare
and the Pod's sandbox, where the host state is read once too), and only if the inventory
found the device: "no such device" is never taken from a read-ahead, since the device may
have been on its way back from an earlier Pod; prepare asks again itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from services.prepare.kube import Kube, KubeError
from shared.kubeapi import ApiError
from shared.metrics import NAMESPACE, REGISTRY
from shared.tasks import TaskSet

log = logging.getLogger(__name__)

MAX_AGE_S = 30.0
DEVICE_MAX_AGE_S = 5.0
SEEN_MAX_AGE_S = 600.0
WATCH_TIMEOUT_S = 300
BACKOFF_MAX_S = 30.0

PREFETCH = Counter(
    f"{NAMESPACE}_prepare_claim_prefetch_total",
    "Claims prepare needed, by whether a copy read ahead from the Pod watch was used (hit) or it "
    "read the claim itself (miss).",
    ["result"],
    registry=REGISTRY,
)

DEVICE_PREFETCH = Counter(
    f"{NAMESPACE}_prepare_device_prefetch_total",
    "Devices prepare looked up, by whether the inventory's answer read ahead with the claim was "
    "used (hit) or it asked the inventory itself (miss).",
    ["result"],
    registry=REGISTRY,
)

Key = tuple[str, str]  # namespace, name; or claim UID, device
ReadDevice = Callable[[str], Awaitable[Any]]  # InventoryClient.get_device: the device or None


def node_devices(claim: dict[str, Any], driver: str, pool: str) -> list[str]:
    """The devices allocated to ``claim`` from this driver's pool ``pool`` (this node's)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        str(r.get("device", ""))
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver and r.get("pool") == pool and r.get("device")
    ]


def pod_claim_names(pod: dict[str, Any]) -> list[str]:
    """The names of the ResourceClaims a Pod uses: those it names, and those generated
    from its templates (``status.resourceClaimStatuses``)."""
    names = [
        c["resourceClaimName"]
        for c in (pod.get("spec") or {}).get("resourceClaims") or []
        if c.get("resourceClaimName")
    ]
    names += [
        s["resourceClaimName"]
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if s.get("resourceClaimName")
    ]
    return list(dict.fromkeys(names))


def usable(claim: dict[str, Any] | None, uid: str) -> bool:
    if not claim or (claim.get("metadata") or {}).get("uid") != uid:
        return False
    status = claim.get("status") or {}
    return bool(status.get("allocation")) and bool(status.get("reservedFor"))


class ClaimPrefetch:
    """See the module docstring."""

    def __init__(
        self,
        kube: Kube,
        node_name: str,
        max_age_s: float = MAX_AGE_S,
        read_device: ReadDevice | None = None,
        driver: str = "dra.net",
        device_max_age_s: float = DEVICE_MAX_AGE_S,
    ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.max_age_s = max_age_s
        self.read_device = read_device
        self.driver = driver
        self.device_max_age_s = device_max_age_s
        self._claims: dict[Key, tuple[float, dict[str, Any]]] = {}
        self._inflight: dict[Key, asyncio.Future[dict[str, Any] | None]] = {}
        self._seen: dict[Key, float] = {}
        self._devices: dict[Key, tuple[float, Any]] = {}
        self._device_inflight: dict[Key, asyncio.Future[Any]] = {}
        self._tasks = TaskSet()
        self.watching = False

    # -- what prepare calls ------------------------------------------------------------------

    async def take(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The claim read ahead for this call, or None (then prepare GETs it)."""
        key = (namespace, name)
        claim: dict[str, Any] | None = None
        entry = self._claims.pop(key, None)
        if entry is not None and time.monotonic() - entry[0] <= self.max_age_s:
            claim = entry[1]
        elif (fut := self._inflight.get(key)) is not None:
            # Started when the Pod was bound: sooner done than a GET started now.
            with contextlib.suppress(KubeError, ApiError, asyncio.CancelledError):
                claim = await asyncio.shield(fut)
            self._claims.pop(key, None)
        if usable(claim, uid):
            PREFETCH.labels("hit").inc()
            return claim
        PREFETCH.labels("miss").inc()
        return None

    async def take_device(self, claim_uid: str, device: str) -> Any | None:
        """The inventory's answer for ``device`` read ahead with claim ``claim_uid``, or
        None (then prepare asks the inventory)."""
        if self.read_device is None:
            return None
        key = (claim_uid, device)
        found: Any = None
        entry = self._devices.pop(key, None)
        if entry is not None and time.monotonic() - entry[0] <= self.device_max_age_s:
            found = entry[1]
        elif (fut := self._device_inflight.get(key)) is not None:
            try:
                found = await asyncio.shield(fut)
            except asyncio.CancelledError:
                if not fut.cancelled():
                    raise  # prepare itself was cancelled
            self._devices.pop(key, None)
        DEVICE_PREFETCH.labels("hit" if found is not None else "miss").inc()
        return found

    # -- the watch ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.5
        while not stop.is_set():
            try:
                await self._list_and_watch(stop)
                backoff = 0.5
            except (ApiError, KubeError, ValueError) as exc:
                self.watching = False
                log.info(
                    "pod watch for claim prefetch stopped, prepare reads claims itself meanwhile",
                    extra={"error": str(exc), "retry_s": round(backoff, 1)},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        self.watching = False
        await self._tasks.cancel()

    async def _list_and_watch(self, stop: asyncio.Event) -> None:
        selector = f"spec.nodeName={self.node_name}"
        api = self.kube.api
        page = await api.request("GET", "/api/v1/pods", query={"fieldSelector": selector})
        version = str((page.get("metadata") or {}).get("resourceVersion", ""))
        for pod in page.get("items") or []:
            self._on_pod(pod)
        self.watching = True
        while not stop.is_set():
            query = {
                "fieldSelector": selector,
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": WATCH_TIMEOUT_S,
            }
            watch = api.watch("/api/v1/pods", query)
            stopping = asyncio.ensure_future(stop.wait())
            try:
                while True:
                    nxt = asyncio.ensure_future(anext(watch))
                    done, _ = await asyncio.wait({nxt, stopping}, return_when=asyncio.FIRST_COMPLETED)
                    if nxt not in done:
                        nxt.cancel()
                        with contextlib.suppress(BaseException):
                            await nxt
                        return
                    try:
                        kind, pod = nxt.result()
                    except StopAsyncIteration:
                        break  # the server ended the watch: go on from the last version
                    version = str((pod.get("metadata") or {}).get("resourceVersion", version))
                    if kind in ("ADDED", "MODIFIED"):
                        self._on_pod(pod)
            finally:
                stopping.cancel()
                await watch.aclose()
            self._prune()

    def _on_pod(self, pod: dict[str, Any]) -> None:
        self._prune()
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
            return
        namespace = meta.get("namespace", "")
        now = time.monotonic()
        for name in pod_claim_names(pod):
            key = (namespace, name)
            if key in self._seen or key in self._inflight:
                continue
            self._seen[key] = now
            self._inflight[key] = self._tasks.spawn(self._fetch(key))

    async def _fetch(self, key: Key) -> dict[str, Any] | None:
        try:
            claim = await self.kube.get_claim(*key)
        except KubeError as exc:  # prepare will GET it itself
            log.debug("claim prefetch failed", extra={"claim": f"{key[0]}/{key[1]}", "error": str(exc)})
            return None
        finally:
            self._inflight.pop(key, None)
        if claim is not None:
            self._claims[key] = (time.monotonic(), claim)
            uid = str((claim.get("metadata") or {}).get("uid", ""))
            if self.read_device is not None and usable(claim, uid):
                for device in node_devices(claim, self.driver, self.node_name):
                    dkey = (uid, device)
                    if dkey not in self._devices and dkey not in self._device_inflight:
                        self._device_inflight[dkey] = self._tasks.spawn(self._fetch_device(dkey))
        return claim

    async def _fetch_device(self, key: Key) -> Any:
        assert self.read_device is not None
        try:
            found = await self.read_device(key[1])
        except Exception as exc:  # prepare will ask the inventory itself, and report that
            log.debug("device read-ahead failed", extra={"device": key[1], "error": str(exc)})
            return None
        finally:
            self._device_inflight.pop(key, None)
        if found is not None:
            self._devices[key] = (time.monotonic(), found)
        return found

    def _prune(self) -> None:
        old = time.monotonic() - self.max_age_s
        for key in [k for k, (t, _) in self._claims.items() if t < old]:
            del self._claims[key]
        # A Pod stays Pending (image pull) long after its claims were taken: read them once.
        seen = time.monotonic() - max(self.max_age_s, SEEN_MAX_AGE_S)
        for key in [k for k, t in self._seen.items() if t < seen]:
            del self._seen[key]
        old_device = time.monotonic() - self.device_max_age_s
        for key in [k for k, (t, _) in self._devices.items() if t < old_device]:
            del self._devices[key]
