"""The kubelet emulator: DRA plugin registration, claim preparation and pods on a real runtime.

For the pods bound to its node (a watch with ``fieldSelector=spec.nodeName=<node>``) it does what
the kubelet's DRA manager and pod workers do (../shared/reference/protocols.md sections 1 and 2):

start    resolve the pod's ResourceClaims (``resourceClaimName``, or the generated name in
         ``status.resourceClaimStatuses`` for templates); each must exist, be allocated and be
         reserved for the pod; NodePrepareResources per driver for the claims not prepared yet
         (a claim shared by several pods is prepared once); then CRI RunPodSandbox,
         CreateContainer and StartContainer for each container, and the pod status (Running,
         conditions, podIP, containerStatuses). Any error: the pod is not started, a Warning event
         names the error, and the start is retried with exponential backoff.
stop     on deletionTimestamp: StopContainer, StopPodSandbox, RemovePodSandbox, then
         NodeUnprepareResources for the claims no other pod uses (retried until it succeeds), then
         the pod object is deleted with gracePeriodSeconds=0.

Every container runs the pause image: there is no registry; the pod's own image is kept in the
container's annotations. Init containers are not run. The claim checkpoint is in memory, so a new
emulator re-prepares the claims of running pods (the DRA driver must be idempotent, as with the
real kubelet after a restart) and adopts the pods' existing sandboxes and containers.

Also like the kubelet: at start it deletes the node's ResourceSlices, and 30 s after the last
plugin of a driver went away it deletes that driver's slices on the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import grpc

from services.devcluster import cri
from services.devcluster.kubelet_plugins import (
    ClaimRef,
    PluginEvent,
    PluginManager,
    PreparedDevice,
    check_prepare_response,
    check_unprepare_response,
)
from shared.logs import log_fields

log = logging.getLogger(__name__)

POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
POD_UID_LABEL = "io.kubernetes.pod.uid"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"
WIPE_DELAY = 30.0


class Api(Protocol):
    """What the emulator needs from the API server (``kubelet_api.KubeApi`` implements it)."""

    async def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(self, node: str, resource_version: str) -> Any: ...

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None: ...

    async def delete_slices(self, field_selector: str) -> None: ...


class SyncError(Exception):
    """A pod could not be started or stopped this round; retried with backoff.

    ``reason`` is the event reason the kubelet would use.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NotReady(SyncError):
    """The pod waits for something outside the kubelet (a claim name, an allocation)."""


@dataclass
class ClaimInfo:
    """One entry of the in-memory claim checkpoint."""

    ref: ClaimRef
    drivers: frozenset[str]
    pod_uids: set[str] = field(default_factory=set)
    # driver -> devices, for the drivers whose NodePrepareResources succeeded
    prepared: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)

    @property
    def is_prepared(self) -> bool:
        return set(self.prepared) >= self.drivers


@dataclass
class _PodClaim:
    pod_claim_name: str
    ref: ClaimRef
    drivers: frozenset[str]
    # request name -> driver of the devices allocated for it
    requests: Mapping[str, str]


@dataclass
class PodState:
    """What the emulator knows about one pod; read it through the Kubelet's query methods."""

    uid: str
    namespace: str
    name: str
    pod: dict[str, Any]
    deleted: bool = False  # the object is gone from the API server
    sandbox_id: str = ""
    sandbox_config: cri.SandboxConfig | None = None
    netns_path: str = ""
    ip: str = ""
    containers: dict[str, str] = field(default_factory=dict)  # name -> container id
    started_at: str = ""
    status_written: bool = False
    last_error: str = ""
    last_prepare_error: str = ""
    running: bool = False
    finished: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = pod.get("metadata") or {}
    return meta


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """(pod claim entry name, ResourceClaim name) for each ``spec.resourceClaims`` entry.

    The claim name is None while a template's generated name is not yet in the pod status; an
    entry whose status says no claim is needed (resourceClaimName unset) is left out.
    """
    statuses = {
        s.get("name"): s
        for s in ((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        if s.get("name")
    }
    out: list[tuple[str, str | None]] = []
    for rc in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = rc.get("name", "")
        if rc.get("resourceClaimName"):
            out.append((name, rc["resourceClaimName"]))
        elif rc.get("resourceClaimTemplateName"):
            st = statuses.get(name)
            if st is None:
                out.append((name, None))
            elif st.get("resourceClaimName"):
                out.append((name, st["resourceClaimName"]))
    return out


class Kubelet:
    """One node's kubelet: plugin manager, claim checkpoint, pod workers, CRI client."""

    def __init__(
        self,
        node_name: str,
        root_dir: str | os.PathLike[str],
        runtime: cri.CriClient,
        api: Api | None = None,
        pod_log_dir: str | os.PathLike[str] | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
        wipe_slices: bool = True,
        wipe_delay: float = WIPE_DELAY,
        on_netns: Callable[[str], None] | None = None,
        plugin_poll_interval: float = 0.1,
        plugin_health_interval: float = 10.0,
        plugin_health_dial_timeout: float = 20.0,
    ) -> None:
        self.node_name = node_name
        self.root_dir = Path(root_dir)
        self.registry_dir = self.root_dir / "plugins_registry"
        self.plugins_dir = self.root_dir / "plugins"
        self.runtime = runtime
        self.api = api
        self.pod_log_dir = Path(pod_log_dir or self.root_dir / "pod-logs")
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.wipe_slices = wipe_slices
        self.wipe_delay = wipe_delay
        self.on_netns = on_netns
        self.plugins = PluginManager(
            self.registry_dir,
            poll_interval=plugin_poll_interval,
            health_interval=plugin_health_interval,
            health_dial_timeout=plugin_health_dial_timeout,
            on_event=self._on_plugin_event,
        )
        self.claims: dict[str, ClaimInfo] = {}
        self.pods: dict[str, PodState] = {}
        self._claims_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._watch_task: asyncio.Task[None] | None = None
        self._wipe_tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping = False
        # Pods this kubelet finished (stopped, unprepared, deleted): late watch events are ignored.
        self._finished: set[str] = set()

    # -- queries for tests ----------------------------------------------------------------------

    def netns_path(self, pod_uid: str) -> str | None:
        """The network namespace path of the running pod ``pod_uid``."""
        p = self.pods.get(pod_uid)
        return p.netns_path if p and p.netns_path else None

    def sandbox_id(self, pod_uid: str) -> str | None:
        p = self.pods.get(pod_uid)
        return p.sandbox_id if p and p.sandbox_id else None

    def pod_ip(self, pod_uid: str) -> str | None:
        p = self.pods.get(pod_uid)
        return p.ip if p and p.ip else None

    def last_prepare_error(self, pod_uid: str) -> str | None:
        """The last NodePrepareResources error of the pod ('' once preparing succeeded)."""
        p = self.pods.get(pod_uid)
        return p.last_prepare_error if p else None

    def last_error(self, pod_uid: str) -> str | None:
        p = self.pods.get(pod_uid)
        return p.last_error if p else None

    def is_running(self, pod_uid: str) -> bool:
        p = self.pods.get(pod_uid)
        return bool(p and p.running)

    def prepared_claims(self) -> dict[str, ClaimInfo]:
        """Claim UID -> checkpoint entry, for the claims prepared for all their drivers."""
        return {uid: c for uid, c in self.claims.items() if c.is_prepared}

    async def wait_until(self, predicate: Callable[[], bool], within: float) -> None:
        """Until ``predicate()`` holds; TimeoutError after ``within`` seconds.

        Checked whenever a pod or claim changes here, and every 50 ms for predicates over
        state elsewhere (the API server, a plugin).
        """
        async with asyncio.timeout(within):
            async with self._changed:
                while not predicate():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), 0.05)

    async def wait_running(self, pod_uid: str, within: float = 30.0) -> PodState:
        await self.wait_until(lambda: self.is_running(pod_uid), within)
        return self.pods[pod_uid]

    async def wait_gone(self, pod_uid: str, within: float = 30.0) -> None:
        """Until the pod is stopped, removed and its claims unprepared."""
        await self.wait_until(lambda: pod_uid not in self.pods, within)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the plugin watcher and, with an API, the ResourceSlice wipe and the pod watch."""
        self.plugins_dir.mkdir(parents=True, exist_ok=True)
        self.pod_log_dir.mkdir(parents=True, exist_ok=True)
        if self.api is not None and self.wipe_slices:
            try:
                await self.api.delete_slices(f"spec.nodeName={self.node_name}")
            except Exception as e:
                log.warning("deleting the node's ResourceSlices failed", extra=log_fields(error=str(e)))
        await self.plugins.start()
        if self.api is not None:
            self._watch_task = asyncio.create_task(self._watch_pods(), name=f"kubelet-{self.node_name}-pods")

    async def stop(self) -> None:
        """Stop watching and the pod workers; pods keep running (like stopping a kubelet)."""
        self._stopping = True
        tasks = [t for t in (self._watch_task, *self._wipe_tasks.values()) if t]
        tasks += [p.task for p in self.pods.values() if p.task]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.plugins.stop()

    # -- plugin events: ResourceSlice wiping ----------------------------------------------------

    def _on_plugin_event(self, ev: PluginEvent) -> None:
        if self._stopping:
            return  # a stopping kubelet neither retries pods nor wipes slices
        if ev.kind == "registered":
            t = self._wipe_tasks.pop(ev.driver, None)
            if t:
                t.cancel()
            # Pods waiting for this driver retry now rather than after their backoff.
            for p in self.pods.values():
                p.wake.set()
        elif ev.kind == "deregistered" and self.api is not None and self.wipe_slices:
            if self.plugins.get(ev.driver) is None and ev.driver not in self._wipe_tasks:
                self._wipe_tasks[ev.driver] = asyncio.create_task(self._wipe_later(ev.driver))

    async def _wipe_later(self, driver: str) -> None:
        try:
            await asyncio.sleep(self.wipe_delay)
            if self.plugins.get(driver) is None and self.api is not None:
                log.info("deleting ResourceSlices of a driver gone for good", extra=log_fields(driver=driver))
                await self.api.delete_slices(f"spec.nodeName={self.node_name},spec.driver={driver}")
        except Exception as e:
            log.warning(
                "deleting a driver's ResourceSlices failed", extra=log_fields(driver=driver, error=str(e))
            )
        finally:
            self._wipe_tasks.pop(driver, None)

    # -- pod watch ------------------------------------------------------------------------------

    async def _watch_pods(self) -> None:
        assert self.api is not None
        from kubernetes_asyncio.client.exceptions import ApiException

        delay = 0.2
        while True:
            try:
                pods, rv = await self.api.list_pods(self.node_name)
                listed = {_meta(p).get("uid", ""): p for p in pods}
                for uid in [u for u in self.pods if u not in listed]:
                    self.pod_deleted(self.pods[uid].pod)
                for p in pods:
                    self.pod_updated(p)
                delay = 0.2
                while True:
                    async for typ, obj in self.api.watch_pods(self.node_name, rv):
                        rv = _meta(obj).get("resourceVersion", rv)
                        if typ in ("ADDED", "MODIFIED"):
                            self.pod_updated(obj)
                        elif typ == "DELETED":
                            self.pod_deleted(obj)
            except asyncio.CancelledError:
                raise
            except ApiException as e:
                if e.status != 410:
                    log.warning("pod watch failed", extra=log_fields(error=f"{e.status} {e.reason}"))
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            except Exception as e:
                log.warning("pod watch failed", extra=log_fields(error=repr(e)))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def pod_updated(self, pod: dict[str, Any]) -> None:
        """A pod bound to this node was added or changed (from the watch, or a test)."""
        meta = _meta(pod)
        uid = meta.get("uid", "")
        if (
            not uid
            or uid in self._finished
            or (pod.get("spec") or {}).get("nodeName") not in (None, self.node_name)
        ):
            return
        st = self.pods.get(uid)
        if st is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and not meta.get("deletionTimestamp"):
                return
            st = PodState(
                uid=uid, namespace=meta.get("namespace", "default"), name=meta.get("name", ""), pod=pod
            )
            self.pods[uid] = st
            st.task = asyncio.create_task(self._pod_worker(st), name=f"pod-{st.namespace}/{st.name}")
        else:
            st.pod = pod
        st.wake.set()

    def pod_deleted(self, pod: dict[str, Any]) -> None:
        """The pod object is gone from the API server: stop it without a final delete call."""
        st = self.pods.get(_meta(pod).get("uid", ""))
        if st is not None:
            st.deleted = True
            st.wake.set()

    # -- pod worker -----------------------------------------------------------------------------

    async def _pod_worker(self, st: PodState) -> None:
        backoff = self.backoff_initial
        delay: float | None = None
        try:
            while True:
                if delay is None:
                    await st.wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(st.wake.wait(), delay)
                st.wake.clear()
                try:
                    if st.deleted or _meta(st.pod).get("deletionTimestamp"):
                        await self._terminate(st)
                        return
                    await self._start(st)
                    delay, backoff = None, self.backoff_initial
                except SyncError as e:
                    st.last_error = str(e)
                    if not isinstance(e, NotReady):
                        await self._event(st, e.reason, str(e))
                    log.warning(
                        "pod sync failed; retrying",
                        extra=log_fields(pod=f"{st.namespace}/{st.name}", reason=e.reason, error=str(e)),
                    )
                    delay, backoff = backoff, min(backoff * 2, self.backoff_max)
                except Exception as e:
                    st.last_error = repr(e)
                    log.exception(
                        "pod sync crashed; retrying", extra=log_fields(pod=f"{st.namespace}/{st.name}")
                    )
                    delay, backoff = backoff, min(backoff * 2, self.backoff_max)
                finally:
                    await self._notify()
        finally:
            if st.finished:
                self._finished.add(st.uid)
                self.pods.pop(st.uid, None)
                await self._notify()

    async def _event(self, st: PodState, reason: str, message: str, typ: str = "Warning") -> None:
        if self.api is None:
            return
        now = _now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{st.name}.{secrets.token_hex(8)}", "namespace": st.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": st.namespace,
                "name": st.name,
                "uid": st.uid,
            },
            "reason": reason,
            "message": message,
            "type": typ,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
        }
        try:
            await self.api.create_event(st.namespace, event)
        except Exception as e:
            log.warning(
                "recording an event failed", extra=log_fields(pod=f"{st.namespace}/{st.name}", error=str(e))
            )

    # -- claims ---------------------------------------------------------------------------------

    async def _resolve_claims(self, st: PodState) -> list[_PodClaim]:
        out: list[_PodClaim] = []
        for pod_claim, claim_name in pod_claim_names(st.pod):
            if claim_name is None:
                raise NotReady(
                    "FailedPrepareDynamicResources",
                    f"pod {st.namespace}/{st.name}: no ResourceClaim name for entry {pod_claim} in "
                    "status.resourceClaimStatuses yet",
                )
            if self.api is None:
                raise SyncError("FailedPrepareDynamicResources", "no API server to read ResourceClaims from")
            claim = await self.api.get_claim(st.namespace, claim_name)
            if claim is None:
                raise NotReady(
                    "FailedPrepareDynamicResources", f"ResourceClaim {st.namespace}/{claim_name} not found"
                )
            out.append(self._check_claim(st, pod_claim, claim))
        return out

    def _check_claim(self, st: PodState, pod_claim: str, claim: Mapping[str, Any]) -> _PodClaim:
        meta = _meta(claim)
        name = meta.get("name", "")
        status = claim.get("status") or {}
        allocation = status.get("allocation")
        if not allocation:
            raise NotReady(
                "FailedPrepareDynamicResources", f"ResourceClaim {st.namespace}/{name} is not allocated"
            )
        reserved = {r.get("uid") for r in status.get("reservedFor") or []}
        if st.uid not in reserved:
            raise NotReady(
                "FailedPrepareDynamicResources",
                f"pod {st.namespace}/{st.name} ({st.uid}) is not allowed to use ResourceClaim "
                f"{st.namespace}/{name}: not in status.reservedFor",
            )
        results = (allocation.get("devices") or {}).get("results") or []
        requests = {}
        for r in results:
            # "req/sub" (a subrequest) belongs to request "req".
            requests[str(r.get("request", "")).split("/", 1)[0]] = str(r.get("driver", ""))
        return _PodClaim(
            pod_claim_name=pod_claim,
            ref=ClaimRef(namespace=st.namespace, uid=meta.get("uid", ""), name=name),
            drivers=frozenset(r.get("driver", "") for r in results),
            requests=requests,
        )

    async def _prepare(self, st: PodState, claims: Sequence[_PodClaim]) -> None:
        async with self._claims_lock:
            for c in claims:
                info = self.claims.get(c.ref.uid)
                if info is None:
                    info = self.claims[c.ref.uid] = ClaimInfo(ref=c.ref, drivers=c.drivers)
                info.pod_uids.add(st.uid)
            by_driver: dict[str, list[ClaimRef]] = {}
            for c in claims:
                info = self.claims[c.ref.uid]
                for d in sorted(c.drivers - set(info.prepared)):
                    by_driver.setdefault(d, []).append(c.ref)
            errors: list[str] = []
            for driver, refs in by_driver.items():
                errors += await self._prepare_driver(driver, refs)
            if errors:
                msg = "; ".join(errors)
                st.last_prepare_error = msg
                raise SyncError("FailedPrepareDynamicResources", msg)
            st.last_prepare_error = ""

    async def _prepare_driver(self, driver: str, refs: list[ClaimRef]) -> list[str]:
        plugin = self.plugins.get(driver)
        if plugin is None:
            return [f"DRA driver {driver} is not registered"]
        try:
            results = await plugin.node_prepare_resources(refs)
        except grpc.RpcError as e:
            return [f"NodePrepareResources of driver {driver} failed: {e.code().name}: {e.details()}"]
        ok, errors = check_prepare_response(driver, refs, results)
        if errors:
            return errors
        for uid, res in ok.items():
            self.claims[uid].prepared[driver] = res.devices
        return []

    async def _unprepare(self, st: PodState) -> None:
        async with self._claims_lock:
            mine = [c for c in self.claims.values() if st.uid in c.pod_uids]
            unused = [c for c in mine if c.pod_uids == {st.uid}]
            by_driver: dict[str, list[ClaimRef]] = {}
            for c in unused:
                for d in sorted(c.prepared):
                    by_driver.setdefault(d, []).append(c.ref)
            errors: list[str] = []
            for driver, refs in by_driver.items():
                plugin = self.plugins.get(driver)
                if plugin is None:
                    errors.append(f"DRA driver {driver} is not registered")
                    continue
                try:
                    results = await plugin.node_unprepare_resources(refs)
                except grpc.RpcError as e:
                    errors.append(
                        f"NodeUnprepareResources of driver {driver} failed: {e.code().name}: {e.details()}"
                    )
                    continue
                done, errs = check_unprepare_response(driver, refs, results)
                errors += errs
                if not errs:
                    for uid in done:
                        self.claims[uid].prepared.pop(driver, None)
            if errors:
                raise SyncError("FailedUnprepareDynamicResources", "; ".join(errors))
            for c in mine:
                c.pod_uids.discard(st.uid)
                if not c.pod_uids:
                    self.claims.pop(c.ref.uid, None)

    def _cdi_devices(self, container: Mapping[str, Any], claims: Sequence[_PodClaim]) -> tuple[str, ...]:
        by_pod_claim = {c.pod_claim_name: c for c in claims}
        ids: list[str] = []
        for ref in (container.get("resources") or {}).get("claims") or []:
            c = by_pod_claim.get(ref.get("name", ""))
            info = self.claims.get(c.ref.uid) if c else None
            if c is None or info is None:
                continue
            want = ref.get("request")
            for devices in info.prepared.values():
                for d in devices:
                    if not want or not d.request_names or want in d.request_names:
                        ids += [i for i in d.cdi_device_ids if i not in ids]
        return tuple(ids)

    # -- start ----------------------------------------------------------------------------------

    def _sandbox_config(self, st: PodState) -> cri.SandboxConfig:
        meta = _meta(st.pod)
        spec = st.pod.get("spec") or {}
        labels = {
            **(meta.get("labels") or {}),
            POD_NAME_LABEL: st.name,
            POD_NAMESPACE_LABEL: st.namespace,
            POD_UID_LABEL: st.uid,
        }
        annotations = {
            **(meta.get("annotations") or {}),
            "kubernetes.io/config.source": "api",
            "kubernetes.io/config.seen": _now(),
        }
        sysctls = {
            s["name"]: str(s.get("value", ""))
            for s in (spec.get("securityContext") or {}).get("sysctls") or []
            if s.get("name")
        }
        privileged = any(
            (c.get("securityContext") or {}).get("privileged") for c in spec.get("containers") or []
        )
        return cri.SandboxConfig(
            name=st.name,
            uid=st.uid,
            namespace=st.namespace,
            labels=labels,
            annotations=annotations,
            hostname=spec.get("hostname") or st.name,
            log_directory=str(self.pod_log_dir / f"{st.namespace}_{st.name}_{st.uid}"),
            host_network=bool(spec.get("hostNetwork")),
            privileged=privileged,
            sysctls=sysctls,
        )

    async def _start(self, st: PodState) -> None:
        if st.running:
            if not st.status_written:
                await self._write_status(st)
            return
        claims = await self._resolve_claims(st)
        await self._prepare(st, claims)
        await self._notify()
        await self._ensure_sandbox(st)
        spec = st.pod.get("spec") or {}
        existing = {c.name: c for c in await self.runtime.list_containers(st.sandbox_id)}
        for container in spec.get("containers") or []:
            name = container.get("name", "")
            have = existing.get(name)
            if have is not None and have.state == "CONTAINER_RUNNING":
                st.containers[name] = have.id
                continue
            st.containers[name] = await self._run_container(
                st, container, claims, attempt=0 if have is None else 1
            )
        st.running = True
        st.started_at = st.started_at or _now()
        st.last_error = ""
        log.info(
            "pod running",
            extra=log_fields(pod=f"{st.namespace}/{st.name}", sandbox=st.sandbox_id, netns=st.netns_path),
        )
        await self._notify()
        await self._write_status(st)

    async def _ensure_sandbox(self, st: PodState) -> None:
        if st.sandbox_id:
            return
        try:
            mine = await self.runtime.list_pod_sandboxes(labels={POD_UID_LABEL: st.uid})
            ready = [s for s in mine if s.ready]
            cfg = self._sandbox_config(st)
            if ready:
                # Adopt the sandbox a previous emulator started (kubelet restart).
                sid = max(ready, key=lambda s: s.attempt).id
                cfg = replace(cfg, attempt=max(s.attempt for s in ready))
            else:
                cfg = replace(cfg, attempt=max((s.attempt + 1 for s in mine), default=0))
                sid = await self.runtime.run_pod_sandbox(cfg)
            status = await self.runtime.pod_sandbox_status(sid)
        except grpc.RpcError as e:
            raise SyncError(
                "FailedCreatePodSandBox", f"RunPodSandbox: {e.code().name}: {e.details()}"
            ) from None
        st.sandbox_id, st.sandbox_config = sid, cfg
        st.netns_path, st.ip = status.netns_path, status.ip
        if self.on_netns and st.netns_path:
            self.on_netns(st.netns_path)

    async def _run_container(
        self, st: PodState, container: Mapping[str, Any], claims: Sequence[_PodClaim], attempt: int
    ) -> str:
        assert st.sandbox_config is not None
        name = container.get("name", "")
        cfg = cri.ContainerConfig(
            name=name,
            attempt=attempt,
            labels={
                CONTAINER_NAME_LABEL: name,
                POD_NAME_LABEL: st.name,
                POD_NAMESPACE_LABEL: st.namespace,
                POD_UID_LABEL: st.uid,
            },
            annotations={
                "io.kubernetes.container.restartCount": str(attempt),
                "io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
                "dranet.devcluster/requested-image": str(container.get("image", "")),
            },
            env={e["name"]: str(e.get("value", "")) for e in container.get("env") or [] if "name" in e},
            privileged=bool((container.get("securityContext") or {}).get("privileged")),
            cdi_devices=self._cdi_devices(container, claims),
        )
        try:
            cid = await self.runtime.create_container(st.sandbox_id, st.sandbox_config, cfg)
        except grpc.RpcError as e:
            raise SyncError("Failed", f"CreateContainer {name}: {e.code().name}: {e.details()}") from None
        try:
            await self.runtime.start_container(cid)
        except grpc.RpcError as e:
            with contextlib.suppress(grpc.RpcError):
                await self.runtime.remove_container(cid)
            raise SyncError("Failed", f"StartContainer {name}: {e.code().name}: {e.details()}") from None
        return cid

    async def _write_status(self, st: PodState) -> None:
        if self.api is None:
            st.status_written = True
            return
        now = _now()
        old = {c.get("type"): c for c in (st.pod.get("status") or {}).get("conditions") or []}
        conds = []
        for typ in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"):
            prev = old.get(typ)
            if typ == "PodScheduled" and prev:
                conds.append(prev)
                continue
            conds.append(
                {
                    "type": typ,
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": (prev or {}).get("lastTransitionTime")
                    if (prev or {}).get("status") == "True"
                    else now,
                }
            )
        statuses = []
        for container in (st.pod.get("spec") or {}).get("containers") or []:
            name = container.get("name", "")
            statuses.append(
                {
                    "name": name,
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": cri.PAUSE_IMAGE,
                    "containerID": f"containerd://{st.containers.get(name, '')}",
                    "state": {"running": {"startedAt": st.started_at}},
                }
            )
        status: dict[str, Any] = {
            "phase": "Running",
            "conditions": conds,
            "startTime": (st.pod.get("status") or {}).get("startTime") or st.started_at,
            "containerStatuses": statuses,
        }
        if st.ip:
            status["podIP"] = st.ip
            status["podIPs"] = [{"ip": st.ip}]
        try:
            await self.api.patch_pod_status(st.namespace, st.name, status)
            st.status_written = True
        except Exception as e:
            raise SyncError(
                "FailedStatusUpdate", f"updating the status of pod {st.namespace}/{st.name}: {e}"
            ) from e

    # -- stop -----------------------------------------------------------------------------------

    async def _terminate(self, st: PodState) -> None:
        await self._kill_pod(st)
        await self._unprepare(st)
        if not st.deleted and self.api is not None:
            try:
                await self.api.delete_pod(st.namespace, st.name, st.uid)
            except Exception as e:
                raise SyncError("FailedDelete", f"deleting pod {st.namespace}/{st.name}: {e}") from e
        st.finished = True
        log.info("pod removed", extra=log_fields(pod=f"{st.namespace}/{st.name}"))

    async def _kill_pod(self, st: PodState) -> None:
        grace = _meta(st.pod).get("deletionGracePeriodSeconds")
        grace = min(int(grace), 30) if grace is not None else 0
        try:
            sandboxes = [s.id for s in await self.runtime.list_pod_sandboxes(labels={POD_UID_LABEL: st.uid})]
            for sid in sandboxes:
                for c in await self.runtime.list_containers(sid):
                    if c.state in ("CONTAINER_RUNNING", "CONTAINER_CREATED"):
                        await self.runtime.stop_container(c.id, grace)
                await self.runtime.stop_pod_sandbox(sid)
                await self.runtime.remove_pod_sandbox(sid)
        except grpc.RpcError as e:
            raise SyncError(
                "FailedKillPod", f"stopping pod {st.namespace}/{st.name}: {e.code().name}: {e.details()}"
            ) from None
        st.running = False
        st.sandbox_id = ""
        st.netns_path = ""
        st.containers.clear()
        await self._notify()


__all__ = [
    "Api",
    "ClaimInfo",
    "Kubelet",
    "NotReady",
    "PodState",
    "SyncError",
    "pod_claim_names",
]


def main(argv: list[str] | None = None) -> None:
    """``python -m services.devcluster.kubelet``: one node's kubelet emulator until SIGTERM."""
    import argparse

    from services.devcluster.kubelet_api import KubeApi
    from shared import service

    p = argparse.ArgumentParser(prog="python -m services.devcluster.kubelet", description=main.__doc__)
    p.add_argument("--node-name", required=True)
    p.add_argument("--root-dir", default="/var/lib/kubelet", help="holds plugins_registry/ and plugins/")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--runtime-endpoint", required=True, help="the CRI socket (containerd's gRPC socket)")
    p.add_argument("--pod-log-dir", default=None)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)

    async def run(stop: asyncio.Event) -> None:
        api = await KubeApi.from_kubeconfig(args.kubeconfig)
        runtime = cri.CriClient(args.runtime_endpoint)
        kubelet = Kubelet(args.node_name, args.root_dir, runtime, api=api, pod_log_dir=args.pod_log_dir)
        try:
            await kubelet.start()
            log.info("kubelet emulator running", extra=log_fields(node=args.node_name, root=args.root_dir))
            await stop.wait()
        finally:
            await kubelet.stop()
            await runtime.close()
            await api.close()

    service.run("kubelet", args.log_level, run)


if __name__ == "__main__":
    main()
