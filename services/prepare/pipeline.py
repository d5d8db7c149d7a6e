"""NodePrepareResources and NodeUnprepareResources for dra.net claims.

Per claim: read it from the API server (the UID must match what the kubelet
asked for), and for each allocation result of this driver look the device up in
the inventory and the store and run the seed's pipeline (shared/prepareplan.py
decides; this module does its I/O): resolve a profile when the merged config names
one (a later failure releases it), take a DHCP lease for interface.dhcp
(services/prepare/dhcp.py), then save one DeviceConfig per pod and device in the
store. With PersistentResourceSliceAttributes each device's published form, as the
inventory answered the lookup, is saved with it (a KeptDevice in the same store
transaction), so the inventory keeps it in the ResourceSlice while it is in the Pod;
unprepare's DeleteClaim removes both.
Errors are per claim and name the claim, the request, the device and the field;
a failing claim stores nothing and does not disturb the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proto.dranet.inventory.v1 import inventory_pb2 as inv
from proto.dranet.store.v1 import store_pb2 as st
from services.prepare.dhcp import DhcpClient, DhcpError
from services.prepare.inventory_client import InventoryClient, InventoryError
from services.prepare.kube import Kube, KubeError
from services.prepare.prefetch import ClaimPrefetch
from shared.logs import log_fields
from shared.netconfig import NetworkConfig, parse_network_config
from shared.prepareplan import (
    Allocated,
    DeviceInputs,
    Lease,
    NeedsLease,
    NeedsProfile,
    PlanError,
    merge_profile_answer,
    plan_device,
    provisional_record,
)
from shared.storeclient import StoreCallError, StoreClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class PreparedDevice:
    request: str
    pool: str
    device: str


@dataclass
class ClaimResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""
    # The claim came from the read-ahead of the Pod watch (services/prepare/prefetch.py).
    read_ahead: bool = False
    devices_read_ahead: int = 0  # its devices whose inventory answer was read ahead too


@dataclass
class Timings:
    """Where prepare's time goes (seconds), for the benchmark and debug logs."""

    api_read: float = 0.0
    read_ahead: int = 0  # claims that came from the Pod watch's read-ahead
    devices_read_ahead: int = 0  # inventory answers read ahead with those claims
    inventory: float = 0.0
    pipeline: float = 0.0
    store_write: float = 0.0
    store_reads: int = 0  # devices whose stored config was read before planning
    gate_wait: float = 0.0  # waiting for the safety gate's answer once the claims were planned
    plan_wall: float = 0.0  # wall time from the call's start until every claim was planned

    def add(self, other: Timings) -> None:
        self.api_read += other.api_read
        self.read_ahead += other.read_ahead
        self.devices_read_ahead += other.devices_read_ahead
        self.inventory += other.inventory
        self.pipeline += other.pipeline
        self.store_write += other.store_write
        self.store_reads += other.store_reads


class ClaimError(Exception):
    """Fails one claim; the message says which claim, request, device and why."""


class GateClosed(ClaimError):
    """The safety gate said no: the claim stops before any step with a side effect."""


class Preparer:
    """The kubelet plugin's work, independent of the gRPC surface."""

    def __init__(
        self,
        driver: str,
        node_name: str,
        kube: Kube,
        inventory: InventoryClient,
        store: StoreClient,
        require_attach: bool = True,
        dhcp: DhcpClient | None = None,
        keep_devices: bool = False,
        prefetch: ClaimPrefetch | None = None,
        liveness: Callable[[], st.AttachLiveness | None] | None = None,
    ) -> None:
        self.driver = driver
        self.node_name = node_name
        self.kube = kube
        self.inventory = inventory
        self.store = store
        self.require_attach = require_attach
        # interface.dhcp: leases on the host interfaces, in the devices' netns.
        self.dhcp = dhcp or DhcpClient()
        # PersistentResourceSliceAttributes: save a KeptDevice with each new config.
        self.keep_devices = keep_devices
        # Claims read ahead from the node's Pod watch (services/prepare/prefetch.py).
        self.prefetch = prefetch
        # The attach service's liveness as the store's watch keeps it (ClaimStatusWriter),
        # or None when that view is not current: the gate asks the store then.
        self.liveness = liveness
        self.last_timings = Timings()
        self._node_info: inv.NodeInfo | None = None

    async def node_info(self) -> inv.NodeInfo:
        # The RDMA mode is read once by the inventory at its start; the profile
        # provider does not change while it runs. Cache after the first answer.
        if self._node_info is None:
            self._node_info = await self.inventory.node_info()
        return self._node_info

    # --- prepare ------------------------------------------------------------------------

    async def prepare(
        self, claims: Sequence[ClaimRef], *, read_store: bool = False
    ) -> dict[str, ClaimResult]:
        """Prepare every claim; one result (devices or error) per claim UID.

        A device that needs neither a profile nor a DHCP lease is planned without
        reading the store: the common first prepare costs one store call, the write,
        which refuses (``expect_new``) a device that already holds a config. Then the
        whole call is planned again with ``read_store``, reading each device's stored
        config first (a kubelet retry reuses what is there; another claim's device is
        an error)."""
        self.last_timings = Timings()
        started = time.perf_counter()
        # Reading the claims and looking their devices up have no side effect: done while
        # the gate is checked. Each claim waits for the gate before anything that has one
        # (a profile, a DHCP lease); nothing is stored unless it passed.
        gate = asyncio.ensure_future(self._safety_gate())
        fetches = [asyncio.ensure_future(self._fetch_claim(c)) for c in claims]
        t_start = time.perf_counter()
        try:
            node = await self.node_info()
        except InventoryError as exc:
            await asyncio.gather(gate, *fetches, return_exceptions=True)
            return {c.uid: ClaimResult(error=f"claim {c}: {exc}") for c in claims}
        try:
            planned = await asyncio.gather(
                *(
                    self._plan_claim(c, f, node, gate, read_store)
                    for c, f in zip(claims, fetches, strict=True)
                )
            )
        except BaseException:
            gate.cancel()
            raise
        t_gate = time.perf_counter()
        self.last_timings.plan_wall = t_gate - t_start
        closed = await gate
        self.last_timings.gate_wait = time.perf_counter() - t_gate
        if closed:
            return {c.uid: ClaimResult(error=f"claim {c}: {closed}") for c in claims}
        results: dict[str, ClaimResult] = {}
        to_store: list[tuple[ClaimRef, list[st.DeviceConfig], list[st.KeptDevice]]] = []
        for claim, outcome in zip(claims, planned, strict=True):
            if isinstance(outcome, ClaimError):
                results[claim.uid] = ClaimResult(error=str(outcome))
                continue
            configs, kept, devices, timings = outcome
            self.last_timings.add(timings)
            results[claim.uid] = ClaimResult(
                devices=devices,
                read_ahead=bool(timings.read_ahead),
                devices_read_ahead=timings.devices_read_ahead,
            )
            new = [c for c in configs if c.revision == 0]
            if new:
                to_store.append((claim, new, kept))
        if to_store:
            # One durable transaction for every claim of the call.
            t0 = time.perf_counter()
            try:
                await self.store.put_devices(
                    [c for _, cfgs, _ in to_store for c in cfgs],
                    kept=[k for _, _, ks in to_store for k in ks],
                    expect_new=True,
                )
            except StoreCallError as exc:
                if exc.code == "FAILED_PRECONDITION" and not read_store:
                    # Nothing was written. Provisional records (profiles) of this call stay
                    # and are resumed by the second pass.
                    log.info(
                        "a device of the call already holds a config; planning again from the store",
                        extra=log_fields(claims=[str(c) for c in claims], reason=exc.message),
                    )
                    return await self.prepare(claims, read_store=True)
                for claim, cfgs, _ in to_store:
                    await self._release_profiles(cfgs, delete=True)
                    results[claim.uid] = ClaimResult(
                        error=f"claim {claim}: saving device configs failed: {exc}"
                    )
            self.last_timings.store_write += time.perf_counter() - t0
        t = self.last_timings
        log.debug(
            "prepare timings",
            extra={
                "claims": len(claims),
                "api_read_ms": round(t.api_read * 1000, 3),
                "read_ahead": t.read_ahead,
                "devices_read_ahead": t.devices_read_ahead,
                "inventory_ms": round(t.inventory * 1000, 3),
                "pipeline_ms": round(t.pipeline * 1000, 3),
                "store_write_ms": round(t.store_write * 1000, 3),
                "store_reads": t.store_reads,
                "gate_wait_ms": round(t.gate_wait * 1000, 3),
                "plan_wall_ms": round(t.plan_wall * 1000, 3),
                "total_ms": round((time.perf_counter() - started) * 1000, 3),
            },
        )
        for claim in claims:
            res = results[claim.uid]
            if res.error:
                log.warning(
                    "prepare failed", extra=log_fields(claim=str(claim), claim_uid=claim.uid, error=res.error)
                )
            else:
                log.info(
                    "claim prepared",
                    extra=log_fields(
                        claim=str(claim),
                        claim_uid=claim.uid,
                        devices=[d.device for d in res.devices],
                        read_ahead=res.read_ahead,
                        devices_read_ahead=res.devices_read_ahead,
                    ),
                )
        return results

    async def _safety_gate(self) -> str:
        """Why no claim may be prepared now, or "" (seed: no Pod starts without its devices)."""
        if not self.require_attach:
            return ""
        live = self.liveness() if self.liveness is not None else None
        if live is None:
            try:
                live = await self.store.get_liveness()
            except StoreCallError as exc:
                return f"the store is not reachable, retry later: {exc}"
        if not live.connected:
            return (
                "the attach service is not connected to the container runtime (NRI); "
                "a Pod started now would miss its devices, retry later"
            )
        if live.draining:
            return "the attach service is stopping (graceful stop); retry later"
        return ""

    async def _fetch_claim(self, ref: ClaimRef) -> tuple[dict[str, Any] | None, float, bool]:
        """The claim, the seconds it took, and whether it was read ahead."""
        t0 = time.perf_counter()
        claim = None
        if self.prefetch is not None:
            claim = await self.prefetch.take(ref.namespace, ref.name, ref.uid)
        ahead = claim is not None
        if claim is None:
            claim = await self.kube.get_claim(ref.namespace, ref.name)
        return claim, time.perf_counter() - t0, ahead

    async def _plan_claim(
        self,
        ref: ClaimRef,
        fetch: asyncio.Future[tuple[dict[str, Any] | None, float, bool]],
        node: inv.NodeInfo,
        gate: asyncio.Future[str],
        read_store: bool,
    ) -> tuple[list[st.DeviceConfig], list[st.KeptDevice], list[PreparedDevice], Timings] | ClaimError:
        timings = Timings()
        try:
            claim, took, ahead = await fetch
            timings.read_ahead += ahead
            timings.api_read += took
            if claim is None:
                raise ClaimError(f"claim {ref}: not found in the API server (deleted?)")
            uid = claim.get("metadata", {}).get("uid", "")
            if uid != ref.uid:
                raise ClaimError(
                    f"claim {ref}: has UID {uid}, the kubelet asked for {ref.uid} (the claim was replaced)"
                )
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                raise ClaimError(f"claim {ref}: is not allocated")
            pod = self._consumer_pod(ref, claim)
            entries = (allocation.get("devices") or {}).get("config") or []
            ours = [
                r
                for r in (allocation.get("devices") or {}).get("results") or []
                if r.get("driver") == self.driver
            ]
            configs: list[st.DeviceConfig] = []
            kept: list[st.KeptDevice] = []
            devices: list[PreparedDevice] = []
            errors: list[str] = []
            for result in ours:
                try:
                    cfg, keep = await self._prepare_device(
                        ref, pod, result, entries, node, timings, gate, read_store
                    )
                except GateClosed:
                    break  # prepare() answers every claim with the reason
                except ClaimError as exc:
                    errors.append(str(exc))
                    continue
                configs.append(cfg)
                if keep is not None:
                    kept.append(keep)
                devices.append(
                    PreparedDevice(request=result["request"], pool=result["pool"], device=result["device"])
                )
            if errors:
                # Profiles allocated in this call go back, with their provisional records.
                await self._release_profiles([c for c in configs if c.revision == 0], delete=True)
                raise ClaimError(f"claim {ref}: " + "; ".join(errors))
            return configs, kept, devices, timings
        except ClaimError as exc:
            return exc
        except (KubeError, InventoryError, StoreCallError) as exc:
            return ClaimError(f"claim {ref}: {exc}")

    def _consumer_pod(self, ref: ClaimRef, claim: dict[str, Any]) -> st.PodRef:
        """dra.net devices go into exactly one Pod: the claim's only consumer."""
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        pods = [r for r in reserved if r.get("resource") == "pods" and not r.get("apiGroup")]
        if len(pods) != 1 or len(reserved) != 1:
            raise ClaimError(
                f"claim {ref}: reservedFor must name exactly one Pod for dra.net devices, "
                f"got {[r.get('resource', '?') + '/' + r.get('name', '?') for r in reserved]}"
            )
        return st.PodRef(uid=pods[0].get("uid", ""), namespace=ref.namespace, name=pods[0].get("name", ""))

    async def _prepare_device(
        self,
        ref: ClaimRef,
        pod: st.PodRef,
        result: dict[str, Any],
        entries: list[dict[str, Any]],
        node: inv.NodeInfo,
        timings: Timings,
        gate: asyncio.Future[str],
        read_store: bool,
    ) -> tuple[st.DeviceConfig, st.KeptDevice | None]:
        """The device's config, and (PersistentResourceSliceAttributes) the device as the
        inventory publishes it; no KeptDevice for a config already stored (its own was saved
        with it). The decisions are shared/prepareplan.py's; this does their I/O.

        Without ``read_store`` a device whose plan has no side effect (no profile, no
        lease) is planned from the inventory alone, and the store's write checks that
        the device was free; anything else reads the stored config first."""
        allocated = Allocated.from_result(result)
        device, where = allocated.device, allocated.where
        try:
            allocated.check_pool(self.node_name)
        except PlanError as exc:
            raise ClaimError(str(exc)) from None

        t0 = time.perf_counter()
        lookup: asyncio.Future[inv.Device | None] = asyncio.ensure_future(
            self._lookup(ref.uid, device, timings)
        )
        if not read_store:
            known = await lookup
            timings.inventory += time.perf_counter() - t0
            t_pipe = time.perf_counter()
            planned = self._plan_without_store(ref, pod, allocated, entries, known, node)
            timings.pipeline += time.perf_counter() - t_pipe
            if planned is not None:
                return planned
            # A profile, a lease, an error or a vanished device: decided with the store's record.
            lookup = asyncio.get_running_loop().create_future()
            lookup.set_result(known)
            t0 = time.perf_counter()

        # Both lookups at once; the inventory's answer is unused when the device
        # is already prepared, which costs nothing but saves a round trip otherwise.
        timings.store_reads += 1
        try:
            existing = await self.store.get_device(pod.uid, device)
        except BaseException:
            lookup.cancel()
            raise
        if existing is not None and (existing.claim.uid != ref.uid or not existing.provisional):
            lookup.cancel()
            with contextlib.suppress(asyncio.CancelledError, InventoryError):
                await lookup
            if existing.claim.uid != ref.uid:
                raise ClaimError(
                    f"{where}: already prepared for pod {pod.namespace}/{pod.name} by claim "
                    f"{existing.claim.namespace}/{existing.claim.name}"
                )
            return existing, None  # idempotent: reuse, allocate nothing new
        dev = await lookup
        timings.inventory += time.perf_counter() - t0
        if await gate:
            raise GateClosed()
        if dev is None:
            if existing is not None:
                await self._release_profiles([existing], delete=True)
            raise ClaimError(f"{where}: no such device on node {self.node_name} (it vanished or was renamed)")

        t_pipe = time.perf_counter()
        inputs = self._inputs(ref, pod, allocated, entries, dev, node)
        profile_owned: st.DeviceConfig | None = existing
        profiled: NetworkConfig | None = None
        if existing is not None:
            # A provisional record left by an earlier attempt: resume after the
            # profile step with the profile it already holds.
            profiled = parse_network_config(existing.pod_config_json) or NetworkConfig()
        lease: Lease | None = None
        while True:
            try:
                step = plan_device(
                    inputs,
                    profiled=profiled,
                    lease=lease,
                    now_unix_nano=time.time_ns(),
                    keep=self.keep_devices,
                )
            except PlanError as exc:
                if profile_owned is not None:
                    await self._release_profiles([profile_owned], delete=True)
                raise ClaimError(str(exc)) from None
            if isinstance(step, NeedsProfile):
                profile_owned = await self._resolve_profile(inputs, step.config)
                profiled = parse_network_config(profile_owned.pod_config_json) or NetworkConfig()
            elif isinstance(step, NeedsLease):
                lease = await self._lease(step.ifname, where, profile_owned)
            else:
                timings.pipeline += time.perf_counter() - t_pipe
                if self.keep_devices and step.kept is None:
                    log.warning(
                        "the inventory did not say how it publishes the device; it leaves the "
                        "ResourceSlice while in the Pod (is the inventory older than prepare?)",
                        extra=log_fields(device=dev.name, claim_uid=ref.uid),
                    )
                return step.config, step.kept

    def _inputs(
        self,
        ref: ClaimRef,
        pod: st.PodRef,
        allocated: Allocated,
        entries: list[dict[str, Any]],
        dev: inv.Device,
        node: inv.NodeInfo,
    ) -> DeviceInputs:
        """What shared/prepareplan.py decides one device from."""
        return DeviceInputs(
            claim=st.ClaimRef(uid=ref.uid, namespace=ref.namespace, name=ref.name),
            pod=pod,
            allocated=allocated,
            entries=entries,
            dev=dev,
            node=node,
            driver=self.driver,
            node_name=self.node_name,
        )

    def _plan_without_store(
        self,
        ref: ClaimRef,
        pod: st.PodRef,
        allocated: Allocated,
        entries: list[dict[str, Any]],
        dev: inv.Device | None,
        node: inv.NodeInfo,
    ) -> tuple[st.DeviceConfig, st.KeptDevice | None] | None:
        """The device's final config when planning it needs nothing but the inventory's
        answer; None when it needs a profile or a lease, fails, or the device is gone
        (the stored record decides those)."""
        if dev is None:
            return None
        inputs = self._inputs(ref, pod, allocated, entries, dev, node)
        try:
            step = plan_device(
                inputs, profiled=None, lease=None, now_unix_nano=time.time_ns(), keep=self.keep_devices
            )
        except PlanError:
            return None
        if isinstance(step, (NeedsProfile, NeedsLease)):
            return None
        if self.keep_devices and step.kept is None:
            return None  # the slow path says why, once
        return step.config, step.kept

    async def _lookup(self, claim_uid: str, device: str, timings: Timings) -> inv.Device | None:
        """The inventory's answer for ``device``: read ahead with the claim, or asked now."""
        if self.prefetch is not None:
            found = await self.prefetch.take_device(claim_uid, device)
            if found is not None:
                timings.devices_read_ahead += 1
                return found
        return await self.inventory.get_device(device)

    async def _lease(self, ifname: str, where: str, profile_owned: st.DeviceConfig | None) -> Lease:
        """interface.dhcp (dranet prepareResourceClaim): a DHCP lease on the host interface
        (shared/prepareplan.py apply_lease says how it enters the config). No lease: the
        claim fails (nothing is stored; a profile it holds goes back)."""
        try:
            got = await self.dhcp.lease(ifname)
        except DhcpError as exc:
            if profile_owned is not None:
                await self._release_profiles([profile_owned], delete=True)
            raise ClaimError(f"{where}: interface.dhcp: {exc}") from None
        return Lease(address=got.address, routes=got.routes)

    async def _resolve_profile(self, inputs: DeviceInputs, merged: NetworkConfig) -> st.DeviceConfig:
        """Ask the profile provider, merge its answer, and save a provisional record
        so that a crash before the final save cannot lead to a second allocation."""
        config_json = await self.inventory.resolve_profile(
            inputs.dev.name, inputs.claim.uid, inputs.pod.uid, merged.profile, merged.to_json()
        )
        provisional = provisional_record(inputs, merged)
        try:
            answered = merge_profile_answer(inputs.where, merged, config_json)
        except PlanError as exc:
            await self._release_profiles([provisional])
            raise ClaimError(str(exc)) from None
        provisional.pod_config_json = answered.to_json()
        try:
            await self.store.put_devices([provisional])
        except StoreCallError as exc:
            await self._release_profiles([provisional])
            raise ClaimError(f"{inputs.where}: saving the allocated profile failed: {exc}") from None
        return provisional

    async def _release_profiles(self, configs: Sequence[st.DeviceConfig], delete: bool = False) -> None:
        for cfg in configs:
            if not cfg.profile:
                continue
            try:
                await self.inventory.release_profile(
                    cfg.device, cfg.claim.uid, cfg.profile, cfg.pod_config_json
                )
                if delete or cfg.provisional:
                    await self.store.delete_device(cfg.pod.uid, cfg.device)
            except (InventoryError, StoreCallError) as exc:
                # The provisional record stays, so unprepare or a retry releases it.
                log.error(
                    "releasing a profile failed",
                    extra=log_fields(
                        device=cfg.device, claim_uid=cfg.claim.uid, profile=cfg.profile, error=str(exc)
                    ),
                )

    # --- unprepare ----------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Release each claim's profiles and remove its configs; "" = success.
        Idempotent: a claim with nothing stored succeeds."""
        out: dict[str, str] = {}
        for ref in claims:
            try:
                stored = (await self.store.list(claim_uid=ref.uid)).devices
                for cfg in stored:
                    if cfg.profile:
                        await self.inventory.release_profile(
                            cfg.device, ref.uid, cfg.profile, cfg.pod_config_json
                        )
                removed = await self.store.delete_claim(ref.uid)
                out[ref.uid] = ""
                log.info(
                    "claim unprepared",
                    extra=log_fields(claim=str(ref), claim_uid=ref.uid, devices=[d.device for d in removed]),
                )
            except (InventoryError, StoreCallError) as exc:
                # Configs stay stored, so the kubelet's retry releases them again.
                out[ref.uid] = f"claim {ref}: {exc}"
                log.warning("unprepare failed", extra=log_fields(claim=str(ref), error=str(exc)))
        return out
