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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any

from prometheus_client import Counter

from services.prepare.kube import Kube, KubeError
from shared.kubeapi import ApiError
from shared.metrics import NAMESPACE, REGISTRY
from shared.tasks import TaskSet

log = logging.getLogger(__name__)

MAX_AGE_S = 30.0
WATCH_TIMEOUT_S = 300
BACKOFF_MAX_S = 30.0

PREFETCH = Counter(
    f"{NAMESPACE}_prepare_claim_prefetch_total",
    "Claims prepare needed, by whether a copy read ahead from the Pod watch was used (hit) or it "
    "read the claim itself (miss).",
    ["result"],
    registry=REGISTRY,
)

Key = tuple[str, str]  # namespace, name


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

    def __init__(self, kube: Kube, node_name: str, max_age_s: float = MAX_AGE_S) -> None:
        self.kube = kube
        self.node_name = node_name
        self.max_age_s = max_age_s
        self._claims: dict[Key, tuple[float, dict[str, Any]]] = {}
        self._inflight: dict[Key, asyncio.Future[dict[str, Any] | None]] = {}
        self._seen: dict[Key, float] = {}
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
        return claim

    def _prune(self) -> None:
        old = time.monotonic() - self.max_age_s
        for key in [k for k, (t, _) in self._claims.items() if t < old]:
            del self._claims[key]
        for key in [k for k, t in self._seen.items() if t < old]:
            del self._seen[key]
