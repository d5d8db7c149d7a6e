"""The development control plane's stand-in for the kube-scheduler's DRA part and the
kube-controller-manager's resource claim controller, over kubernetes-asyncio.

It keeps list+watch caches of pods, nodes, ResourceClaims, ResourceClaimTemplates,
ResourceSlices and DeviceClasses, and on every change reconciles, as the real components do:

* claim controller: a pod claim from a template gets a ResourceClaim (generateName
  ``<pod>-<claim>-``, owned by the pod, annotation ``resource.kubernetes.io/pod-claim-name``)
  recorded in ``pod.status.resourceClaimStatuses``; a reservation for a pod that is gone or done is
  removed; a claim whose last reservation goes is deallocated (its finalizer removed); a claim
  generated for a pod that is gone or done is deleted (the garbage collector's part for a gone pod).
* scheduler: a pending pod (default scheduler) gets all its claims allocated on one node
  (allocation.py), the claims get the delete-protection finalizer, then ``status.allocation`` and
  ``status.reservedFor`` in one status update (conflicts retried), and the pod is bound through
  ``pods/binding``. A pod that cannot be placed stays pending with a FailedScheduling event and is
  retried on the next change. Pods without claims are scheduled too: this plane has no other
  scheduler. A pod created with ``spec.nodeName`` is not bound again, but its claims are
  allocated on that node, which the real control plane would refuse to do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from services.devcluster import allocation
from services.devcluster.allocation import (
    FINALIZER,
    POD_CLAIM_NAME_ANNOTATION,
    AllocationAborted,
    Allocator,
    Unsatisfiable,
    claim_key,
)
from shared.logs import log_fields

log = logging.getLogger(__name__)

SCHEDULER_NAME = "default-scheduler"
CLAIM_CONTROLLER = "resourceclaim-controller"
# Field managers the real components write with (their client-go user agents).
SCHEDULER_MANAGER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
MAX_RESERVED_FOR = 256
_REQUEST_TIMEOUT = 30
_WATCH_SECONDS = 240
_CONFLICT_RETRIES = 5

Obj = dict[str, Any]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else str(meta.get("name"))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_pod_done(pod: Mapping[str, Any]) -> bool:
    """Certain that none of the pod's containers run or will run (the claim controller's test)."""
    phase = (pod.get("status") or {}).get("phase")
    spec = pod.get("spec") or {}
    return phase in ("Succeeded", "Failed") or bool(
        _meta(pod).get("deletionTimestamp") and not spec.get("nodeName")
    )


def owning_pod(claim: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the pod that controls a generated claim."""
    for ref in _meta(claim).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("apiVersion") == "v1" and ref.get("kind") == "Pod":
            return ref["name"], ref["uid"]
    return None


def generate_claim_name_base(pod_name: str, pod_claim: str) -> str:
    """generateName for a claim made from a template: ``<pod>-<claim>-``, both parts cut in proportion
    so that the name with the apiserver's 5 random characters stays within 63."""
    base = f"{pod_name}-{pod_claim}-"
    limit = 57
    if len(base) > limit:
        base = (
            pod_name[: len(pod_name) * limit // len(base)]
            + "-"
            + pod_claim[: len(pod_claim) * limit // len(base)]
        )
    return base


def claim_from_template(pod: Mapping[str, Any], pod_claim: str, template: Mapping[str, Any]) -> Obj:
    """The ResourceClaim the resource claim controller creates for one pod claim."""
    tmpl_spec = template.get("spec") or {}
    tmpl_meta = tmpl_spec.get("metadata") or {}
    annotations = dict(tmpl_meta.get("annotations") or {})
    annotations[POD_CLAIM_NAME_ANNOTATION] = pod_claim
    meta: Obj = {
        "generateName": generate_claim_name_base(_meta(pod)["name"], pod_claim),
        "namespace": _meta(pod)["namespace"],
        "ownerReferences": [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": _meta(pod)["name"],
                "uid": _meta(pod)["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "annotations": annotations,
    }
    if tmpl_meta.get("labels"):
        meta["labels"] = dict(tmpl_meta["labels"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": json.loads(json.dumps(tmpl_spec.get("spec") or {})),
    }


def _is_reserved_for(claim: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    uid = _meta(pod).get("uid")
    return any(
        r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid") == uid
        for r in (claim.get("status") or {}).get("reservedFor") or []
    )


async def _call(fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Obj:
    """One API call with raw JSON in and out (no client models), raising ApiException on failure."""
    response = await fn(*args, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT, **kwargs)
    try:
        body = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        reason = response.reason
        try:
            reason = json.loads(body).get("message") or reason
        except ValueError:
            pass
        raise ApiException(status=response.status, reason=reason)
    return json.loads(body) if body else {}


class _Informer:
    """list + watch of one resource type into a dict keyed by namespace/name."""

    def __init__(
        self, kind: str, list_fn: Callable[..., Awaitable[Any]], on_change: Callable[[str, str, Obj], None]
    ):
        self.kind = kind
        self.items: dict[str, Obj] = {}
        self.synced = asyncio.Event()
        self._list = list_fn
        self._on_change = on_change

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                body = await _call(self._list)
                version = body["metadata"]["resourceVersion"]
                fresh = {_key(o): o for o in body.get("items") or []}
                for key in self.items.keys() - fresh.keys():
                    self._on_change(self.kind, "DELETED", self.items[key])
                self.items = fresh
                self.synced.set()
                self._on_change(self.kind, "SYNC", {})
                backoff = 0.2
                while True:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except ApiException as ex:
                if ex.status != 410:
                    log.warning("%s: list/watch failed: %s", self.kind, ex.reason)
                    await asyncio.sleep(backoff)
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError) as ex:
                log.warning("%s: list/watch failed: %r", self.kind, ex)
                await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _watch(self, version: str) -> str:
        stream = watch.Watch(return_type="object")
        async with stream:
            async for event in stream.stream(
                self._list,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=_WATCH_SECONDS,
            ):
                kind, obj = event["type"], event["raw_object"]
                version = _meta(obj).get("resourceVersion", version)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.items.pop(_key(obj), None)
                else:
                    self.items[_key(obj)] = obj
                self._on_change(self.kind, kind, obj)
        return version


class AllocatorController:
    """Schedules pods with ResourceClaims and runs the claim lifecycle against one API server."""

    def __init__(self, api: client.ApiClient, *, resync_seconds: float = 30.0):
        self._api = api
        self._core = client.CoreV1Api(api)
        self._resource = client.ResourceV1Api(api)
        self._resync = resync_seconds
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._informers = {
            "pods": _Informer("pods", self._core.list_pod_for_all_namespaces, self._changed),
            "nodes": _Informer("nodes", self._core.list_node, self._changed),
            "claims": _Informer(
                "claims", self._resource.list_resource_claim_for_all_namespaces, self._changed
            ),
            "templates": _Informer(
                "templates", self._resource.list_resource_claim_template_for_all_namespaces, self._changed
            ),
            "slices": _Informer("slices", self._resource.list_resource_slice, self._changed),
            "classes": _Informer("classes", self._resource.list_device_class, self._changed),
        }
        # What this controller wrote and its watches may not show yet (the scheduler's assume cache).
        self._assumed_allocations: dict[str, Obj] = {}
        self._assumed_bindings: dict[str, str] = {}
        self._deleted_pods: OrderedDict[str, None] = OrderedDict()
        self._last_event: dict[str, str] = {}
        self.passes = 0

    @classmethod
    async def from_kubeconfig(cls, path: str, **kwargs: Any) -> AllocatorController:
        """A controller with its own client configuration (the process-wide default is left alone)."""
        configuration = client.Configuration()
        await config.load_kube_config(
            config_file=path, client_configuration=configuration, persist_config=False
        )
        return cls(client.ApiClient(configuration=configuration), **kwargs)

    async def start(self) -> None:
        for informer in self._informers.values():
            self._tasks.append(asyncio.create_task(informer.run(), name=f"allocator-{informer.kind}"))
        self._tasks.append(asyncio.create_task(self._loop(), name="allocator-reconcile"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._api.close()

    async def __aenter__(self) -> AllocatorController:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_synced(self) -> None:
        """Until every cache has listed once (callers bound it with asyncio.timeout)."""
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))

    def _changed(self, kind: str, event: str, obj: Obj) -> None:
        if kind == "pods" and event == "DELETED":
            self._deleted_pods[_meta(obj).get("uid", "")] = None
            while len(self._deleted_pods) > 10_000:
                self._deleted_pods.popitem(last=False)
            self._last_event.pop(_meta(obj).get("uid", ""), None)
        self._wake.set()

    async def _loop(self) -> None:
        await asyncio.gather(*(i.synced.wait() for i in self._informers.values()))
        while True:
            self._wake.clear()
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("allocator pass failed")
                await asyncio.sleep(1.0)
                self._wake.set()
            self.passes += 1
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._resync)
            except TimeoutError:
                pass

    async def reconcile(self) -> None:
        """One pass: release reservations, create template claims, schedule pending pods."""
        await self._release()
        await self._create_template_claims()
        await self._schedule()

    # -- views over the caches ---------------------------------------------------------------

    def _items(self, kind: str) -> list[Obj]:
        return list(self._informers[kind].items.values())

    def _get(self, kind: str, key: str) -> Obj | None:
        return self._informers[kind].items.get(key)

    def _put(self, kind: str, obj: Obj) -> None:
        """Record our own write so the next step sees it before the watch does."""
        self._informers[kind].items[_key(obj)] = obj

    def _allocation_of(self, claim: Mapping[str, Any]) -> Obj | None:
        current = (claim.get("status") or {}).get("allocation")
        if current is not None:
            return dict(current)
        return self._assumed_allocations.get(_meta(claim).get("uid", ""))

    def _effective_claims(self) -> list[Obj]:
        out = []
        live = set()
        for claim in self._items("claims"):
            uid = _meta(claim).get("uid", "")
            live.add(uid)
            status = claim.get("status") or {}
            if status.get("allocation") is not None:
                self._assumed_allocations.pop(uid, None)
            elif uid in self._assumed_allocations:
                claim = {**claim, "status": {**status, "allocation": self._assumed_allocations[uid]}}
            out.append(claim)
        for uid in list(self._assumed_allocations):
            if uid not in live:
                del self._assumed_allocations[uid]
        return out

    async def _pod_exists(self, namespace: str, name: str, uid: str) -> bool:
        if uid in self._deleted_pods:
            return False
        cached = self._get("pods", f"{namespace}/{name}")
        if cached is not None:
            return bool(_meta(cached).get("uid") == uid)
        # Not in the cache yet, or gone: only the API server can tell (as the real controller asks it).
        try:
            pod = await _call(self._core.read_namespaced_pod, name, namespace)
        except ApiException as ex:
            if ex.status == 404:
                return False
            raise
        return bool(_meta(pod).get("uid") == uid)

    # -- claim controller -------------------------------------------------------------------

    async def _release(self) -> None:
        for claim in self._items("claims"):
            try:
                await self._release_claim(claim)
            except ApiException as ex:
                # A conflict or a vanished claim: the watch brings the new state and another pass.
                log.info(
                    "claim cleanup deferred: %s",
                    ex.reason,
                    extra=log_fields(claim=claim_key(claim), code=ex.status),
                )

    async def _release_claim(self, claim: Obj) -> None:
        meta = _meta(claim)
        namespace, name = meta["namespace"], meta["name"]
        status = claim.get("status") or {}
        reserved = status.get("reservedFor") or []
        valid = []
        for ref in reserved:
            if ref.get("apiGroup") or ref.get("resource") != "pods":
                valid.append(ref)
                continue
            pod = self._get("pods", f"{namespace}/{ref.get('name')}")
            if pod is not None and _meta(pod).get("uid") == ref.get("uid"):
                if not is_pod_done(pod):
                    valid.append(ref)
            elif pod is None and await self._pod_exists(namespace, ref.get("name", ""), ref.get("uid", "")):
                valid.append(ref)
        has_finalizer = FINALIZER in (meta.get("finalizers") or [])
        if len(valid) < len(reserved):
            new_status = dict(status)
            if valid:
                new_status["reservedFor"] = valid
            else:
                new_status.pop("reservedFor", None)
                if has_finalizer:
                    # The last consumer is gone: deallocate so the devices serve other claims.
                    new_status.pop("allocation", None)
            claim = await self._write_claim_status(claim, new_status, CONTROLLER_MANAGER)
            log.info(
                "released reservation%s",
                "" if valid else " and deallocated" if has_finalizer else "",
                extra=log_fields(claim=f"{namespace}/{name}"),
            )
            if has_finalizer and (claim.get("status") or {}).get("allocation") is None:
                claim = await self._remove_finalizer(claim)
        elif has_finalizer and meta.get("deletionTimestamp") and not valid:
            if status.get("allocation") is not None:
                new_status = {k: v for k, v in status.items() if k != "allocation"}
                claim = await self._write_claim_status(claim, new_status, CONTROLLER_MANAGER)
            claim = await self._remove_finalizer(claim)
        if valid:
            return
        owner = owning_pod(claim)
        if owner is None or _meta(claim).get("deletionTimestamp"):
            return
        pod = self._get("pods", f"{namespace}/{owner[0]}")
        if pod is not None:
            gone = _meta(pod).get("uid") != owner[1] or is_pod_done(pod)
        else:
            # The garbage collector's part: the owner no longer exists.
            gone = not await self._pod_exists(namespace, owner[0], owner[1])
        if gone:
            await self._delete_claim(claim)

    async def _write_claim_status(self, claim: Obj, status: Obj, manager: str) -> Obj:
        """Replace the claim's status as ``manager``; the written claim, cached."""
        meta = _meta(claim)
        claim = await _call(
            self._resource.replace_namespaced_resource_claim_status,
            meta["name"],
            meta["namespace"],
            {**claim, "status": status},
            field_manager=manager,
        )
        self._put("claims", claim)
        return claim

    async def _remove_finalizer(self, claim: Obj) -> Obj:
        meta = _meta(claim)
        for _ in range(_CONFLICT_RETRIES):
            finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            body = {**claim, "metadata": {**meta, "finalizers": finalizers}}
            try:
                updated = await _call(
                    self._resource.replace_namespaced_resource_claim,
                    meta["name"],
                    meta["namespace"],
                    body,
                    field_manager=CONTROLLER_MANAGER,
                )
            except ApiException as ex:
                if ex.status == 404:
                    return claim
                if ex.status != 409:
                    raise
                claim = await _call(
                    self._resource.read_namespaced_resource_claim, meta["name"], meta["namespace"]
                )
                meta = _meta(claim)
                continue
            if _meta(updated).get("deletionTimestamp") and not _meta(updated).get("finalizers"):
                # That was the last finalizer of a deleted claim: it is gone now.
                self._informers["claims"].items.pop(_key(updated), None)
            else:
                self._put("claims", updated)
            return updated
        raise ApiException(
            status=409, reason=f"claim {meta['namespace']}/{meta['name']}: finalizer update conflicts"
        )

    async def _delete_claim(self, claim: Obj) -> None:
        meta = _meta(claim)
        try:
            await _call(
                self._resource.delete_namespaced_resource_claim,
                meta["name"],
                meta["namespace"],
                body={"preconditions": {"uid": meta["uid"]}, "propagationPolicy": "Background"},
            )
        except ApiException as ex:
            if ex.status not in (404, 409):
                raise
            return
        log.info("deleted claim generated for a pod that is gone", extra=log_fields(claim=_key(claim)))

    async def _create_template_claims(self) -> None:
        for pod in self._items("pods"):
            meta = _meta(pod)
            if meta.get("deletionTimestamp") or is_pod_done(pod):
                continue
            try:
                await self._pod_template_claims(pod)
            except ApiException as ex:
                log.info(
                    "claim creation deferred: %s", ex.reason, extra=log_fields(pod=_key(pod), code=ex.status)
                )

    async def _pod_template_claims(self, pod: Obj) -> None:
        meta = _meta(pod)
        namespace = meta["namespace"]
        recorded = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        created: dict[str, str] = {}
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            template_name = pod_claim.get("resourceClaimTemplateName")
            if pod_claim.get("resourceClaimName") or not template_name:
                continue
            entry = recorded.get(pod_claim["name"])
            if entry is not None:
                if not entry.get("resourceClaimName"):
                    continue
                existing = self._get("claims", f"{namespace}/{entry['resourceClaimName']}")
                if existing is not None and owning_pod(existing) == (meta["name"], meta["uid"]):
                    continue
            claim = self._find_generated(pod, pod_claim["name"])
            if claim is None:
                template = self._get("templates", f"{namespace}/{template_name}")
                if template is None:
                    await self._event(
                        pod,
                        "FailedResourceClaimCreation",
                        f'PodResourceClaim {pod_claim["name"]}: resource claim template "{template_name}": '
                        f'resourceclaimtemplate "{template_name}" not found',
                        component=CLAIM_CONTROLLER,
                    )
                    continue
                claim = await _call(
                    self._resource.create_namespaced_resource_claim,
                    namespace,
                    claim_from_template(pod, pod_claim["name"], template),
                    field_manager=CONTROLLER_MANAGER,
                )
                self._put("claims", claim)
                log.info(
                    "created claim from template %s",
                    template_name,
                    extra=log_fields(pod=_key(pod), claim=_key(claim)),
                )
            created[pod_claim["name"]] = _meta(claim)["name"]
        if created:
            await self._record_claim_statuses(pod, created)

    def _find_generated(self, pod: Obj, pod_claim: str) -> Obj | None:
        """An existing claim made for this pod claim (the controller may have failed before recording it)."""
        meta = _meta(pod)
        for claim in self._items("claims"):
            cmeta = _meta(claim)
            if cmeta.get("namespace") != meta["namespace"] or owning_pod(claim) != (
                meta["name"],
                meta["uid"],
            ):
                continue
            annotation = (cmeta.get("annotations") or {}).get(POD_CLAIM_NAME_ANNOTATION)
            if annotation == pod_claim or (
                annotation is None and cmeta["name"] == f"{meta['name']}-{pod_claim}"
            ):
                return claim
        return None

    async def _record_claim_statuses(self, pod: Obj, created: Mapping[str, str]) -> None:
        meta = _meta(pod)
        for _ in range(_CONFLICT_RETRIES):
            status = dict(pod.get("status") or {})
            entries = [e for e in status.get("resourceClaimStatuses") or [] if e.get("name") not in created]
            entries += [{"name": n, "resourceClaimName": c} for n, c in created.items()]
            status["resourceClaimStatuses"] = sorted(entries, key=lambda e: e["name"])
            try:
                updated = await _call(
                    self._core.replace_namespaced_pod_status,
                    meta["name"],
                    meta["namespace"],
                    {**pod, "status": status},
                    field_manager=CONTROLLER_MANAGER,
                )
            except ApiException as ex:
                if ex.status != 409:
                    raise
                pod = await _call(self._core.read_namespaced_pod, meta["name"], meta["namespace"])
                continue
            self._put("pods", updated)
            return
        raise ApiException(status=409, reason=f"pod {_key(pod)}: resourceClaimStatuses update conflicts")

    # -- scheduler ----------------------------------------------------------------------------

    async def _schedule(self) -> None:
        live = {_meta(p).get("uid"): p for p in self._items("pods")}
        for uid in list(self._assumed_bindings):
            pod = live.get(uid)
            if pod is None or (pod.get("spec") or {}).get("nodeName"):
                del self._assumed_bindings[uid]
        pods = [p for p in live.values() if self._wants_scheduling(p)]
        if not pods:
            return
        pods.sort(key=lambda p: (_meta(p).get("creationTimestamp", ""), _key(p)))
        claims = self._effective_claims()
        allocator = Allocator(
            self._items("slices"),
            {_meta(c)["name"]: c for c in self._items("classes")},
            allocation.in_use_devices(claims),
        )
        nodes = self._items("nodes")
        for pod in pods:
            try:
                await self._schedule_pod(pod, nodes, allocator)
            except ApiException as ex:
                log.info(
                    "scheduling deferred: %s", ex.reason, extra=log_fields(pod=_key(pod), code=ex.status)
                )
            # Later pods must not get this pod's devices.
            allocator.in_use = allocation.in_use_devices(self._effective_claims())

    def _wants_scheduling(self, pod: Obj) -> bool:
        meta = _meta(pod)
        spec = pod.get("spec") or {}
        if meta.get("deletionTimestamp") or is_pod_done(pod):
            return False
        if (spec.get("schedulerName") or SCHEDULER_NAME) != SCHEDULER_NAME:
            return False
        if spec.get("nodeName"):
            # Already placed: only claims still unallocated or unreserved need work.
            return bool(spec.get("resourceClaims"))
        return meta.get("uid") not in self._assumed_bindings

    def _pod_claims(self, pod: Obj) -> tuple[list[Obj], str | None, bool]:
        """The pod's claims, why it cannot be scheduled yet (an event), and whether to wait quietly."""
        meta = _meta(pod)
        namespace = meta["namespace"]
        statuses = {
            s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        claims = []
        for pod_claim in (pod.get("spec") or {}).get("resourceClaims") or []:
            if pod_claim.get("resourceClaimName"):
                name = pod_claim["resourceClaimName"]
            elif pod_claim.get("resourceClaimTemplateName"):
                if pod_claim["name"] not in statuses:
                    return [], None, True  # the claim controller has not created it yet
                name = statuses[pod_claim["name"]]
                if not name:
                    continue
            else:
                return (
                    [],
                    f"pod claim {pod_claim.get('name')}: neither resourceClaimName nor template is set",
                    False,
                )
            claim = self._get("claims", f"{namespace}/{name}")
            if claim is None:
                if pod_claim.get("resourceClaimTemplateName"):
                    return [], None, True
                return [], f'resourceclaim "{name}" not found', False
            cmeta = _meta(claim)
            if pod_claim.get("resourceClaimTemplateName") and owning_pod(claim) != (
                meta["name"],
                meta["uid"],
            ):
                return (
                    [],
                    f"ResourceClaim {namespace}/{name} was not created for Pod {_key(pod)} (Pod is not owner)",
                    False,
                )
            if cmeta.get("deletionTimestamp"):
                return [], f'resourceclaim "{name}" is being deleted', False
            claims.append(claim)
        return claims, None, False

    async def _schedule_pod(self, pod: Obj, nodes: list[Obj], allocator: Allocator) -> None:
        meta = _meta(pod)
        claims, problem, wait = self._pod_claims(pod)
        if wait:
            return
        if problem is not None:
            await self._event(pod, "FailedScheduling", problem)
            return
        to_allocate, allocated = [], []
        for claim in claims:
            effective = self._allocation_of(claim)
            if effective is None:
                to_allocate.append(claim)
            else:
                allocated.append(
                    {**claim, "status": {**(claim.get("status") or {}), "allocation": effective}}
                )
        unreserved = [c for c in allocated if not _is_reserved_for(c, pod)]
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound and not to_allocate and not unreserved:
            return
        for claim in unreserved:
            if len((claim.get("status") or {}).get("reservedFor") or []) >= MAX_RESERVED_FOR:
                await self._event(
                    pod, "FailedScheduling", f'resourceclaim "{_meta(claim)["name"]}" is in use'
                )
                return
        try:
            placement = await asyncio.to_thread(
                allocation.place_pod, pod, nodes, to_allocate, allocated, allocator
            )
        except (Unsatisfiable, AllocationAborted) as ex:
            await self._event(pod, "FailedScheduling", str(ex))
            return
        for claim, result in zip(to_allocate, placement.allocations, strict=True):
            self._assumed_allocations[_meta(claim)["uid"]] = result
            await self._reserve(claim, pod, result)
        for claim in unreserved:
            await self._reserve(claim, pod, None)
        if not bound:
            await self._bind(pod, placement.node)
        self._last_event.pop(meta["uid"], None)

    async def _reserve(self, claim: Obj, pod: Obj, result: Obj | None) -> None:
        """Finalizer (for a new allocation), then allocation and reservation in one status update."""
        meta = _meta(claim)
        name, namespace = meta["name"], meta["namespace"]
        reference = {"resource": "pods", "name": _meta(pod)["name"], "uid": _meta(pod)["uid"]}
        fresh = False
        for _ in range(_CONFLICT_RETRIES):
            if fresh:
                claim = await _call(self._resource.read_namespaced_resource_claim, name, namespace)
            fresh = True
            if _meta(claim).get("deletionTimestamp"):
                raise ApiException(status=409, reason=f"claim {namespace}/{name} got deleted in the meantime")
            status = dict(claim.get("status") or {})
            if result is not None:
                if status.get("allocation") is not None and status["allocation"] != result:
                    self._assumed_allocations.pop(meta["uid"], None)
                    raise ApiException(status=409, reason=f"claim {namespace}/{name} got allocated elsewhere")
                if FINALIZER not in (_meta(claim).get("finalizers") or []):
                    cmeta = dict(_meta(claim))
                    cmeta["finalizers"] = [*(cmeta.get("finalizers") or []), FINALIZER]
                    try:
                        claim = await _call(
                            self._resource.replace_namespaced_resource_claim,
                            name,
                            namespace,
                            {**claim, "metadata": cmeta},
                            field_manager=SCHEDULER_MANAGER,
                        )
                    except ApiException as ex:
                        if ex.status == 409:
                            continue
                        raise
                status = dict(claim.get("status") or {})
                status["allocation"] = result
            if not _is_reserved_for(claim, pod):
                status["reservedFor"] = [*(status.get("reservedFor") or []), reference]
            try:
                claim = await self._write_claim_status(claim, status, SCHEDULER_MANAGER)
            except ApiException as ex:
                if ex.status == 409:
                    continue
                if result is not None:
                    self._assumed_allocations.pop(meta["uid"], None)
                raise
            log.info(
                "allocated and reserved" if result is not None else "reserved",
                extra=log_fields(claim=f"{namespace}/{name}", pod=_key(pod)),
            )
            return
        if result is not None:
            self._assumed_allocations.pop(meta["uid"], None)
        raise ApiException(status=409, reason=f"claim {namespace}/{name}: status update conflicts")

    async def _bind(self, pod: Obj, node: str) -> None:
        meta = _meta(pod)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await _call(
            self._core.create_namespaced_pod_binding,
            meta["name"],
            meta["namespace"],
            body,
            field_manager=SCHEDULER_MANAGER,
        )
        self._assumed_bindings[meta["uid"]] = node
        log.info("bound pod to node %s", node, extra=log_fields(pod=_key(pod), node=node))
        await self._event(
            pod,
            "Scheduled",
            f"Successfully assigned {_key(pod)} to {node}",
            event_type="Normal",
            dedupe=False,
        )

    async def _event(
        self,
        pod: Obj,
        reason: str,
        message: str,
        *,
        event_type: str = "Warning",
        component: str = SCHEDULER_NAME,
        dedupe: bool = True,
    ) -> None:
        """A core/v1 Event on the pod; a repeat of the last message for the pod is not written again."""
        meta = _meta(pod)
        if dedupe:
            if self._last_event.get(meta["uid"]) == message:
                return
            self._last_event[meta["uid"]] = message
            log.info("%s: %s", reason, message, extra=log_fields(pod=_key(pod)))
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": component,
            "reportingInstance": f"{component}-dev",
        }
        try:
            await _call(self._core.create_namespaced_event, meta["namespace"], event)
        except ApiException as ex:
            log.warning("event not written: %s", ex.reason, extra=log_fields(pod=_key(pod)))
