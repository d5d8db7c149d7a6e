"""The NRI hooks of dra.net: devices into a pod's netns while the runtime builds
it, back to the host when it stops, and recovery after every (re)connect.

What a pod gets comes from the store (prepare's DeviceConfigs); where it goes
comes from the runtime (the netns path of the event, or of Synchronize; never
stored). In memory we keep, per pod UID, the sandbox that holds its devices,
that sandbox's netns and which devices are in it (books.py, with the records
written for them), so that the runtime's retries, a pod's second sandbox, and a
late RemovePodSandbox of an old sandbox each do the right thing. The netlink work
is the engine's (engine.DeviceEngine: netdev.NetdevEngine).

Hooks of one pod run one at a time (a lock per pod), and the netlink work on
one device too (a lock per device), so a device handed from a stopping pod to
a starting one is back on the host before it moves again. The runtime holds a
node-wide lock while a hook runs: the hooks read the store once and write it
afterwards, in order (writer.py).

One module (over 800 lines) because every hook is a method over the same state of
``AttachHooks`` (the books, the locks, the recovery in progress): the parts that do not need
that state already live apart (books.py, writer.py, pins.py, engine.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.books import (
    Held,
    PodTrack,
    Records,
    Source,
    lost_message,
    netns_exists,
    pod_name,
    pod_netns,
    pod_ref,
)
from services.attach.engine import Attached, AttachFailed, DeviceEngine, Location, ReturnState
from services.attach.nri.stub import NriHandlers, mark_failed, mark_noop
from services.attach.nri.ttrpc import Code, TtrpcError
from services.attach.pins import NetnsPins, Pin
from services.attach.writer import StoreWriter
from shared.attachplan import DeviceNode
from shared.logs import log_fields
from shared.storeclient import StoreCallError, StoreClient
from shared.tasks import TaskSet

log = logging.getLogger(__name__)

T = TypeVar("T")

DRIVER = "dra.net"
# How many finished pods attach remembers (a late Stop/Remove of theirs is then a no-op).
FINISHED_KEPT = 4096


def linux_device(node: DeviceNode) -> nri_pb2.LinuxDevice:
    """An NRI LinuxDevice (what the runtime adds to the container) for ``node``."""
    dev = nri_pb2.LinuxDevice(path=node.path, type=node.type, major=node.major, minor=node.minor)
    # NRI's file_mode is a Go os.FileMode: permission bits only.
    if node.file_mode is not None:
        dev.file_mode.value = node.file_mode & 0o7777
    if node.uid is not None:
        dev.uid.value = node.uid
    if node.gid is not None:
        dev.gid.value = node.gid
    return dev


@dataclass(frozen=True)
class HookConfig:
    driver: str = DRIVER
    # Stop and Remove answer the runtime within this even when giving devices
    # back takes longer (the work goes on): a pod's stop must never fail.
    # Keep it below the stub's handler deadline.
    stop_budget_s: float = 1.0
    # Where pod netns holding our devices are pinned (pins.py); "": not pinned.
    pin_dir: str = ""


class _KeyedLocks:
    """asyncio locks by key, dropped when nobody holds or waits for them."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


@dataclass
class RecoveryReport:
    """What the last Synchronize recovery decided, for logs, health and tests."""

    counts: Counter[str] = field(default_factory=Counter)
    # (pod uid, device) -> why it is lost
    lost: dict[tuple[str, str], str] = field(default_factory=dict)


class AttachHooks(NriHandlers):
    """dra.net's NRI hooks over the store and a device engine."""

    def __init__(
        self,
        store: StoreClient,
        engine: DeviceEngine,
        writer: StoreWriter,
        config: HookConfig | None = None,
    ) -> None:
        self.store = store
        self.engine = engine
        self.writer = writer
        self.config = config or HookConfig()
        self.records = Records(self.config.driver)
        self.pods: dict[str, PodTrack] = {}
        self._locks = _KeyedLocks()
        self._tasks = TaskSet()
        self._recovered = asyncio.Event()
        self._recovered.set()
        self._recovery: asyncio.Task[None] | None = None
        # Set once a recovery has read the store since this process started: until then the
        # attach records of a gone pod are the only note of where its devices are.
        self._recovered_once = asyncio.Event()
        # Pods whose attach state was cleared after prepare let them go: a late Stop or Remove
        # of theirs needs no store read (which may not answer in time while the node is busy).
        self._finished: OrderedDict[str, None] = OrderedDict()
        self.recovery = RecoveryReport()
        self.pins = NetnsPins(self.config.pin_dir or None)

    # -- helpers ---------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        return self._tasks.spawn(coro, name)

    async def close(self, timeout_s: float = 5.0) -> None:
        """Let netlink work already started finish (never leave a device half-moved)."""
        if self._tasks:
            log.info("waiting for device work in flight", extra=log_fields(tasks=len(self._tasks)))
            await self._tasks.wait(timeout_s)

    @property
    def recovering(self) -> bool:
        """Synchronize's recovery is still moving devices (events wait for it)."""
        return not self._recovered.is_set()

    async def wait_recovered(self, timeout_s: float | None = None) -> RecoveryReport:
        """Until the recovery after the last Synchronize is done."""
        async with asyncio.timeout(timeout_s):
            await self._recovered.wait()
        return self.recovery

    @staticmethod
    def _fields(pod: PodTrack | nri_pb2.PodSandbox, what: Source | Held | None = None) -> dict[str, Any]:
        ref = pod.ref if isinstance(pod, PodTrack) else pod_ref(pod)
        src = what.source if isinstance(what, Held) else what
        return dict(
            log_fields(
                pod=ref,
                pod_uid=pod.uid,
                claim=f"{src.claim.namespace}/{src.claim.name}"
                if src is not None and src.claim.name
                else None,
                device=src.device if src is not None else None,
                ifname=src.host_ifname if src is not None else None,
            )
        )

    async def _read_pod(self, pod: nri_pb2.PodSandbox, what: str) -> st.PodState:
        try:
            return await self.store.get_pod(pod.uid)
        except StoreCallError as exc:
            log.error("cannot read the pod's stored configs", extra={**self._fields(pod), "error": str(exc)})
            raise TtrpcError(
                Code.UNAVAILABLE, f"dra.net {what} pod {pod_ref(pod)}: cannot read its stored configs: {exc}"
            ) from None

    async def _attach_one(self, cfg: st.DeviceConfig, netns: str) -> Attached:
        async with self._locks.hold("device:" + cfg.device):
            return await self.engine.attach(cfg, netns)

    async def _detach_one(self, held: Held, netns: str) -> ReturnState:
        async with self._locks.hold("device:" + held.device):
            return await self.engine.detach(held.source, netns, mac=held.mac)

    async def _give_back(self, track: PodTrack, why: str, note: str = "") -> None:
        """Return every device the sandbox holds to the host; never raises. A device
        that could not be returned stays in ``attached`` (and on record as held)."""
        for device, held in sorted(track.attached.items()):
            netns = track.netns_ref
            fields = {**self._fields(track, held), "netns": netns, "why": why}
            try:
                state = await self._detach_one(held, netns)
            except Exception as exc:
                msg = (
                    f"device {device} ({held.host_ifname}) of pod {track.ref} "
                    f"was not returned to the host: {exc}"
                )
                log.error(msg, extra=fields)
                self.writer.put_result(self.records.failed(held.source, msg, held=held))
                continue
            del track.attached[device]
            if state == ReturnState.GONE:
                msg = lost_message(held, track.ref, track.netns)
                log.error(msg, extra=fields)
                self.writer.put_result(self.records.returned(held.source, msg))
                continue
            log.info(f"device given back to the host ({state})", extra=fields)
            self.writer.put_result(self.records.returned(held.source, note))
        if not track.attached:
            track.release_netns()

    def _mark_failed(self, pod: nri_pb2.PodSandbox) -> None:
        """RunPodSandbox failed before anything moved: remember the sandbox, so its
        Stop and Remove know it holds nothing without asking the store."""
        earlier = self.pods.get(pod.uid)
        if earlier is not None and earlier.attached:
            return  # an earlier sandbox still holds devices: keep its books
        self._drop(pod.uid)
        track = self.pods[pod.uid] = PodTrack.of(pod, self.pins)
        track.failed = True

    def _drop(self, uid: str) -> None:
        track = self.pods.pop(uid, None)
        if track is not None:
            track.release_netns()

    # -- RunPodSandbox -----------------------------------------------------------------

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        task = self._spawn(self._run_pod(pod), f"run:{pod.uid}")
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # Our deadline passed: the runtime fails this sandbox and tears it
            # down. Netlink work cannot be stopped half-way; let it finish, then
            # give back what it attached.
            log.error(
                "RunPodSandbox overran its deadline; the devices go back to the host once the work ends",
                extra=self._fields(pod),
            )
            task.add_done_callback(lambda t: self._after_abandoned_run(pod, t))
            raise

    def _after_abandoned_run(self, pod: nri_pb2.PodSandbox, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is not None:
            return  # it failed: already rolled back
        self._spawn(self._release_sandbox(pod, "RunPodSandbox answered too late"), f"rollback:{pod.uid}")

    async def _release_sandbox(self, pod: nri_pb2.PodSandbox, why: str) -> None:
        async with self._locks.hold(pod.uid):
            track = self.pods.get(pod.uid)
            if track is not None and track.sandbox_id == pod.id:
                await self._give_back(track, why, note=f"{why}; the runtime gave up on sandbox {pod.id[:13]}")

    async def _run_pod(self, pod: nri_pb2.PodSandbox) -> None:
        await self._recovered.wait()
        uid = pod.uid
        async with self._locks.hold(uid):
            self._finished.pop(uid, None)
            try:
                state = await self._read_pod(pod, "RunPodSandbox")
            except TtrpcError:
                self._mark_failed(pod)
                raise
            configs = sorted((d for d in state.devices if not d.provisional), key=lambda d: d.device)
            if not configs:
                log.debug("RunPodSandbox: no devices for this pod", extra=self._fields(pod))
                mark_noop()
                return
            self.writer.touch(uid)
            netns = pod_netns(pod)
            if not netns:
                msg = f"RunPodSandbox pod {pod_ref(pod)} using host network can not claim host devices"
                log.error(msg, extra=self._fields(pod))
                for cfg in configs:
                    self.writer.put_result(self.records.failed(cfg, msg))
                self._mark_failed(pod)
                raise TtrpcError(Code.UNKNOWN, msg)

            track = self.pods.get(uid)
            if track is not None and track.sandbox_id != pod.id:
                if track.attached:
                    # The pod's earlier sandbox still holds its devices (the
                    # runtime recreates a sandbox that died): take them back first.
                    await self._give_back(track, f"the pod has a new sandbox {pod.id[:13]}")
                if track.attached:
                    msg = (
                        f"RunPodSandbox pod {pod_ref(pod)}: devices {sorted(track.attached)} are still held by "
                        f"its earlier sandbox {track.sandbox_id[:13]}"
                    )
                    raise TtrpcError(Code.UNKNOWN, msg)
                self._drop(uid)
                track = None
            if track is None:
                track = PodTrack.of(pod, self.pins)
                self.pods[uid] = track
            track.netns = netns
            track.configs = {c.device: c for c in configs}
            track.hold_netns()

            for cfg in configs:
                if cfg.device in track.attached:
                    # The runtime retried the hook for this very sandbox.
                    log.info("device already attached to this sandbox", extra=self._fields(track, cfg))
                    continue
                fields = self._fields(track, cfg)
                try:
                    done = await self._attach_one(cfg, netns)
                except AttachFailed as exc:
                    await self._fail_run(track, cfg, str(exc), fields)
                except Exception as exc:
                    log.exception("device engine failed unexpectedly", extra=fields)
                    # The engine did not say it rolled back: make sure.
                    with contextlib.suppress(Exception):
                        await self._detach_one(Held(cfg), netns)
                    await self._fail_run(track, cfg, f"device {cfg.device}: {exc}", fields)
                track.attached[cfg.device] = Held(cfg, done.hardware_address)
                self.writer.put_result(self.records.attached(cfg, done))
                log.info(
                    "device attached",
                    extra={
                        **fields,
                        "netns": netns,
                        "pod_ifname": done.interface_name,
                        "ips": list(done.ips),
                    },
                )

    async def _fail_run(self, track: PodTrack, cfg: st.DeviceConfig, error: str, fields: Any) -> NoReturn:
        msg = f"dra.net RunPodSandbox pod {track.ref}: {error}"
        log.error(msg, extra=fields)
        self.writer.put_result(self.records.failed(cfg, error))
        # All or nothing: the runtime tears this sandbox down and the kubelet retries.
        await self._give_back(track, "RunPodSandbox failed", note=f"rolled back: device {cfg.device} failed")
        track.failed = True
        raise TtrpcError(Code.UNKNOWN, msg)

    # -- CreateContainer --------------------------------------------------------------

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        if not pod_netns(pod):
            # A host-network pod holds no dra.net device: RunPodSandbox refuses one that has
            # any. Asking the store anyway would deadlock our own pod (host network): when the
            # store's container restarts, its CreateContainer would wait for the store.
            mark_noop()
            return None
        track = self.pods.get(pod.uid)
        configs: list[st.DeviceConfig]
        if track is not None and track.sandbox_id == pod.id and track.configs:
            configs = list(track.configs.values())
        else:
            state = await self._read_pod(pod, "CreateContainer")
            configs = [d for d in state.devices if not d.provisional]
        if not configs:
            mark_noop()
            return None
        self.writer.touch(pod.uid)
        devices = [linux_device(n) for n in self.engine.container_devices(configs)]
        if not devices:
            return None
        adjust = nri_pb2.ContainerAdjustment()
        adjust.linux.devices.extend(devices)
        log.info(
            "container gets RDMA device files",
            extra={**self._fields(pod), "container": container.name, "devices": [d.path for d in devices]},
        )
        return adjust

    # -- StopPodSandbox / RemovePodSandbox ----------------------------------------------

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        await self._never_fail("StopPodSandbox", pod, self._stop_pod(pod))

    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        await self._never_fail("RemovePodSandbox", pod, self._remove_pod(pod))

    async def _never_fail(self, what: str, pod: nri_pb2.PodSandbox, work: Coroutine[Any, Any, None]) -> None:
        task = self._spawn(work, f"{what}:{pod.uid}")
        try:
            async with asyncio.timeout(self.config.stop_budget_s):
                await asyncio.shield(task)
        except TimeoutError:
            log.error(
                f"{what}: giving the devices back takes longer than {self.config.stop_budget_s}s; "
                "answering the runtime now, the work goes on",
                extra=self._fields(pod),
            )
        except Exception:
            mark_failed()
            log.exception(f"{what} failed; the pod's stop goes on", extra=self._fields(pod))

    async def _track_from_store(self, pod: nri_pb2.PodSandbox) -> PodTrack | None:
        """A pod we never saw (or forgot): what the store says is in it. Within
        half the stop budget, so the hook still answers in time without the store."""
        try:
            async with asyncio.timeout(self.config.stop_budget_s / 2):
                state = await self.store.get_pod(pod.uid)
        except (StoreCallError, TimeoutError) as exc:
            why = str(exc) or f"the store did not answer within {self.config.stop_budget_s / 2:g}s"
            log.error(
                "cannot read the pod's attach state from the store; its devices stay where they are",
                extra={**self._fields(pod), "error": why},
            )
            return None
        track = PodTrack.of(pod, self.pins)
        track.configs = {d.device: d for d in state.devices if not d.provisional}
        for r in state.results:
            if r.attached:
                track.attached[r.device] = Held(track.configs.get(r.device) or r, r.hardware_address)
        return track

    async def _stop_pod(self, pod: nri_pb2.PodSandbox) -> None:
        await self._recovered.wait()
        async with self._locks.hold(pod.uid):
            track = self.pods.get(pod.uid)
            if track is None and pod.uid in self._finished:
                mark_noop()
                return
            if track is None:
                track = await self._track_from_store(pod)
                if track is None or not track.attached:
                    mark_noop()
                    return
                self.pods[pod.uid] = track
            if pod.id and track.sandbox_id and track.sandbox_id != pod.id:
                log.info(
                    "StopPodSandbox of an earlier sandbox; the devices belong to the current one",
                    extra={**self._fields(pod), "sandbox": pod.id[:13], "current": track.sandbox_id[:13]},
                )
                return
            # Some containerd versions send no netns on stop: use the one we know.
            if pod_netns(pod):
                track.netns = pod_netns(pod)
            if track.attached:
                await self._give_back(track, "pod stopped")

    async def _remove_pod(self, pod: nri_pb2.PodSandbox) -> None:
        await self._recovered.wait()
        async with self._locks.hold(pod.uid):
            track = self.pods.get(pod.uid)
            if track is not None and pod.id and track.sandbox_id != pod.id:
                log.info(
                    "RemovePodSandbox of an earlier sandbox; the pod's current sandbox keeps its state",
                    extra={**self._fields(pod), "sandbox": pod.id[:13], "current": track.sandbox_id[:13]},
                )
                return
            if track is None and pod.uid in self._finished:
                mark_noop()
                return
            if track is None:
                # A pod we never saw (attach restarted and missed it): ask the store.
                track = await self._track_from_store(pod)
                if track is None:
                    return  # the store is away: collect_garbage clears the records later
                if not track.configs and not track.attached:
                    mark_noop()
            if pod_netns(pod):
                track.netns = pod_netns(pod)
            if track.attached:
                # The netns may be gone: the engine then makes sure a device the
                # kernel gave back is under its host name again.
                await self._give_back(track, "pod removed")
                if track.attached:
                    return  # keep the books: the runtime's retry finds them again
            self._drop(pod.uid)
            self._remember_finished(pod.uid)
            if track.failed:
                # Keep why it failed for the claim status; the next attach overwrites
                # it, or it goes when prepare removes the pod's configs (collect_garbage).
                return
            self.writer.clear(pod.uid)

    # -- sandboxes that went away without a StopPodSandbox ----------------------------

    async def watch_netns(self, interval_s: float = 1.0) -> None:
        """Gives back the devices of pods whose netns the runtime removed without a
        StopPodSandbox reaching us; runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            for uid, track in list(self.pods.items()):
                if track.orphaned:
                    await self._missed_stop(uid, track.sandbox_id)

    async def _missed_stop(self, uid: str, sandbox_id: str) -> None:
        async with self._locks.hold(uid):
            track = self.pods.get(uid)
            if track is None or track.sandbox_id != sandbox_id or not track.orphaned:
                return
            log.warning(
                "the pod's netns was removed without a StopPodSandbox reaching dra.net (did the runtime "
                "restart since the pod started?); giving its devices back through our reference to the netns",
                extra={**self._fields(track), "netns": track.netns},
            )
            await self._give_back(track, "netns removed without StopPodSandbox")
            if not track.attached:
                self._drop(uid)

    # -- attach state of pods no longer prepared -------------------------------------

    async def collect_garbage(self, retry_max_s: float = 5.0) -> None:
        """Clears the attach state of pods that hold no device once prepare removed
        their configs (NodeUnprepare), so no record outlives its pod: e.g. the
        error of a pod that never started. Watches the store; runs until cancelled.

        Starts after the first recovery of this process and waits for each later one: the
        records of a pod stopped and unprepared while attach was down tell the recovery which
        devices to give back (through the netns pin); cleared first, they would stay there."""
        await self._recovered_once.wait()
        delay = 0.1
        while True:
            try:
                events = self.store.watch(initial=False)
                # Whatever was deleted while we were not watching.
                listing = await self.store.list()
                prepared = {d.pod.uid for d in listing.devices}
                ours = {r.pod_uid for r in listing.results} | {a.pod_uid for a in listing.activities}
                for uid in sorted(ours - prepared):
                    await self._collect(uid)
                async for ev in events:
                    delay = 0.1
                    if ev.type == st.WatchEvent.DELETE and ev.WhichOneof("record") == "device":
                        await self._collect(ev.device.pod.uid)
            except StoreCallError as exc:
                log.debug("store watch ended; watching again", extra=log_fields(error=str(exc)))
            await asyncio.sleep(delay)
            delay = min(delay * 2, retry_max_s)

    async def _collect(self, uid: str) -> None:
        await self._recovered.wait()
        async with self._locks.hold(uid):
            track = self.pods.get(uid)
            if track is not None and track.attached:
                return
            if self.pins.of_pod(uid):
                return  # a netns of the pod may hold our devices: the recovery gives them back
            state = await self.store.get_pod(uid)
            if state.devices or not (state.results or state.activity.last_nri_activity_unix_nano):
                return
            self._drop(uid)
            log.info("pod no longer prepared: clearing its attach state", extra=log_fields(pod_uid=uid))
            self.writer.clear(uid)
            self._remember_finished(uid)

    def _remember_finished(self, uid: str) -> None:
        self._finished[uid] = None
        self._finished.move_to_end(uid)
        while len(self._finished) > FINISHED_KEPT:
            self._finished.popitem(last=False)

    # -- Synchronize -------------------------------------------------------------------

    async def synchronize(
        self, pods: Sequence[nri_pb2.PodSandbox], containers: Sequence[nri_pb2.Container]
    ) -> Sequence[nri_pb2.ContainerUpdate]:
        """Note the live pods and recover in the background: the runtime gives
        Synchronize 2 s, recovery may move many devices. Events wait for it."""
        live: dict[str, nri_pb2.PodSandbox] = {}
        for p in pods:
            # A stopped sandbox is still listed, but its netns is gone.
            if netns_exists(pod_netns(p)):
                if p.uid in live:
                    log.warning(
                        "two sandboxes of one pod have a netns; using the later one",
                        extra={**self._fields(p), "sandbox": p.id[:13]},
                    )
                live[p.uid] = p
        previous = self._recovery
        self._recovered.clear()
        self._recovery = self._spawn(self._recover(live, previous), "recovery")
        log.info(
            "Synchronize: recovering devices",
            extra=log_fields(pods=len(pods), live_pods=len(live), containers=len(containers)),
        )
        return ()

    async def _list_store(self) -> st.ListResponse:
        delay = 0.1
        while True:
            try:
                return await self.store.list()
            except StoreCallError as exc:
                log.warning("recovery cannot list the store yet; retrying", extra=log_fields(error=str(exc)))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _recover(
        self, live: dict[str, nri_pb2.PodSandbox], previous: asyncio.Task[None] | None
    ) -> None:
        report = RecoveryReport()
        t0 = time.monotonic()
        try:
            if previous is not None and not previous.done():
                with contextlib.suppress(Exception):
                    await previous
            listing = await self._list_store()
            configs: dict[str, list[st.DeviceConfig]] = {}
            for d in listing.devices:
                if not d.provisional:
                    configs.setdefault(d.pod.uid, []).append(d)
            results: dict[str, dict[str, st.AttachResult]] = {}
            for r in listing.results:
                results.setdefault(r.pod_uid, {})[r.device] = r
            active = {a.pod_uid for a in listing.activities if a.last_nri_activity_unix_nano}
            pinned = {p.pod_uid for p in self.pins.all()}
            for uid in sorted(set(configs) | set(results) | set(self.pods) | active | pinned):
                async with self._locks.hold(uid):
                    if uid in live:
                        await self._recover_live(
                            live[uid], configs.get(uid, []), results.get(uid, {}), report
                        )
                    else:
                        await self._recover_gone(
                            uid, configs.get(uid, []), results.get(uid, {}), uid in active, report
                        )
        except Exception:
            log.exception("recovery after Synchronize failed")
            report.counts["recovery_failed"] += 1
        finally:
            self.recovery = report
            self._recovered.set()
            self._recovered_once.set()
        log.info(
            "recovery done",
            # counts has "lost" (one per lost device) with the other outcomes.
            extra=log_fields(seconds=round(time.monotonic() - t0, 3), **report.counts),
        )

    def _lost(self, report: RecoveryReport, uid: str, held: Held, pod: str, netns: str, live: bool) -> None:
        msg = lost_message(held, pod, netns)
        report.lost[(uid, held.device)] = msg
        report.counts["lost"] += 1
        log.error(msg, extra=log_fields(pod=pod, pod_uid=uid, device=held.device, ifname=held.host_ifname))
        if live:
            self.writer.put_result(self.records.failed(held.source, msg))

    async def _recover_live(
        self,
        pod: nri_pb2.PodSandbox,
        configs: list[st.DeviceConfig],
        results: dict[str, st.AttachResult],
        report: RecoveryReport,
    ) -> None:
        netns = pod_netns(pod)
        track = self.pods.get(pod.uid)
        await self._return_pinned(
            pod.uid,
            track.ref if track is not None else pod_ref(pod),
            [
                p
                for p in self.pins.of_pod(pod.uid)
                if p.sandbox_id != pod.id and (track is None or p.sandbox_id != track.sandbox_id)
            ],
            {
                d: Held(next((c for c in configs if c.device == d), r), r.hardware_address)
                for d, r in results.items()
                if r.attached
            },
            report,
        )
        if track is not None and track.sandbox_id != pod.id:
            if track.attached:
                await self._give_back(track, f"the pod's live sandbox is {pod.id[:13]}")
            self._drop(pod.uid)
            track = None
        if track is None:
            track = PodTrack.of(pod, self.pins)
            self.pods[pod.uid] = track
        track.netns = netns
        track.configs = {c.device: c for c in configs}
        track.hold_netns()
        lost: set[str] = set()
        for d, r in sorted(results.items()):
            if not r.attached or r.error or d in track.attached:
                continue
            held = Held(track.configs.get(d) or r, r.hardware_address)
            fields = {**self._fields(track, held), "netns": netns}
            try:
                where = await self.engine.locate(held.source, netns, mac=held.mac)
            except Exception as exc:
                # Cannot look: trust the record (as dranet, which only keeps the netns path).
                log.warning(
                    "cannot check a device recorded in a live pod", extra={**fields, "error": str(exc)}
                )
                where = Location.POD
            match where:
                case Location.POD:
                    track.attached[d] = held
                    report.counts["kept"] += 1
                case Location.MISSING:
                    lost.add(d)
                    self._lost(report, pod.uid, held, track.ref, netns, live=True)
                case Location.HOST:
                    log.warning("device recorded in a live pod is on the host", extra=fields)
        for cfg in configs:
            if cfg.device in track.attached or cfg.device in lost:
                continue
            res = results.get(cfg.device)
            fields = {**self._fields(track, cfg), "netns": netns}
            # A running pod without its device on record: it started while we were
            # away, or the runtime dropped us on a timeout and started it without us,
            # or we died before recording the attach. Its claim reserves the device
            # for this pod and nothing else may use it, so attach it now (a hot-add
            # for the pod) rather than leave the pod without it until it restarts;
            # if it is already in the pod this only re-checks its config.
            log.warning(
                "running pod lacks its device on record; attaching it now",
                extra={**fields, "result": "none" if res is None else (res.error or "returned")},
            )
            try:
                done = await self._attach_one(cfg, netns)
            except Exception as exc:
                log.error("attach during recovery failed", extra={**fields, "error": str(exc)})
                self.writer.put_result(self.records.failed(cfg, f"attach after a restart failed: {exc}"))
                report.counts["attach_failed"] += 1
                continue
            track.attached[cfg.device] = Held(cfg, done.hardware_address)
            self.writer.put_result(self.records.attached(cfg, done))
            report.counts["recorded" if done.converged else "attached_late"] += 1

    async def _recover_gone(
        self,
        uid: str,
        configs: list[st.DeviceConfig],
        results: dict[str, st.AttachResult],
        active: bool,
        report: RecoveryReport,
    ) -> None:
        track = self.pods.pop(uid, None)
        pins = self.pins.of_pod(uid)
        if track is None and not results and not active:
            for p in pins:  # nothing of ours on record in it
                self._unpin(p, report)
            report.counts["not_started"] += 1
            return  # prepared, not started yet: nothing of ours to undo
        by_device = {c.device: c for c in configs}
        suspects: dict[str, Held] = {}
        for d, r in results.items():
            if r.attached:
                suspects[d] = Held(by_device.get(d) or r, r.hardware_address)
        if track is not None:
            suspects.update(track.attached)
        if active:
            # RunPodSandbox ran for this pod: a device may be out without a record.
            for d, c in by_device.items():
                suspects.setdefault(d, Held(c))
        # Our reference keeps a removed netns, and the devices in it, reachable; after a restart
        # of attach, its pins do.
        places = [track.netns_ref] if track is not None else [p.path for p in pins] or [""]
        netns = places[0]
        pod = track.ref if track is not None else pod_name(configs, uid)
        failed = False
        for device, held in sorted(suspects.items()):
            fields = log_fields(pod=pod, pod_uid=uid, device=device, ifname=held.host_ifname)
            try:
                for netns in places:
                    state = await self._detach_one(held, netns)
                    if state != ReturnState.GONE:
                        break
            except Exception as exc:
                log.error("could not give back a device of a gone pod", extra={**fields, "error": str(exc)})
                report.counts["return_failed"] += 1
                failed = True
                continue
            if track is not None:
                track.attached.pop(device, None)
            if state == ReturnState.GONE:
                self._lost(report, uid, held, pod, netns or "its netns", live=False)
            else:
                log.info(f"device of a gone pod is on the host ({state})", extra=fields)
                report.counts["returned"] += 1
        if failed and track is not None:
            self.pods[uid] = track  # keep the books (and the netns): the next recovery retries
            return
        if failed:
            return  # the pins stay: the next recovery retries through them
        if track is not None:
            track.release_netns()
        for p in pins:
            self._unpin(p, report)
        self.writer.clear(uid)
        report.counts["cleared"] += 1

    def _unpin(self, pin: Pin, report: RecoveryReport) -> None:
        try:
            self.pins.unpin(pin.pod_uid, pin.sandbox_id)
            report.counts["unpinned"] += 1
        except OSError as exc:
            log.warning("cannot remove a netns pin", extra=log_fields(pod_uid=pin.pod_uid, error=str(exc)))

    async def _return_pinned(
        self, uid: str, pod: str, pins: list[Pin], suspects: dict[str, Held], report: RecoveryReport
    ) -> None:
        """Devices still in an earlier sandbox of a live pod, which only our pin keeps (the
        sandbox was rebuilt while attach was away: a node reboot, the runtime's restart): back to
        the host, so that the pod's live sandbox can get them."""
        for pin in pins:
            ok = True
            for device, held in sorted(suspects.items()):
                fields = log_fields(pod=pod, pod_uid=uid, device=device, netns=pin.path)
                try:
                    where = await self.engine.locate(held.source, pin.path, mac=held.mac)
                    if where != Location.POD:
                        continue
                    state = await self._detach_one(held, pin.path)
                except Exception as exc:
                    log.error(
                        "could not give back a device from an earlier sandbox of a pod",
                        extra={**fields, "error": str(exc)},
                    )
                    report.counts["return_failed"] += 1
                    ok = False
                    continue
                log.info(f"device given back from an earlier sandbox of the pod ({state})", extra=fields)
                report.counts["returned_from_pin"] += 1
            if ok:
                self._unpin(pin, report)
