"""The netlink engine of the attach service: applies the plans of shared.attachplan,
and is the DeviceEngine (engine.py) the NRI hooks run with.

What the hooks call (all async, never blocking the event loop):

- ``NetdevEngine.attach(config, netns)`` for RunPodSandbox: one device into the pod
  netns; AttachFailed after everything done so far is undone (the device is back on
  the host), its message naming the device, interfaces, netns and failing step.
- ``NetdevEngine.detach(what, netns)`` for StopPodSandbox/RemovePodSandbox and for
  pods that are gone at Synchronize: gives one device back. ``what`` is the
  DeviceConfig, or the AttachResult when the config is gone. DetachFailed names the
  failed steps.
- ``NetdevEngine.locate(what, netns)`` for Synchronize: where the device is now.
- ``NetdevEngine.container_devices(configs)`` for CreateContainer: the RDMA device
  files as they are on this host (``rdma.check_device_nodes``).

``attach_outcome`` and ``detach_outcome`` do the same work as attach and detach and
return the whole record (AttachOutcome, ReturnOutcome: steps, failed step, rollback
errors, timing) instead of raising, for the engine's tests and benchmarks.

All are idempotent: a retried RunPodSandbox finds the device already in the pod and
converges; a return of a device that is already on the host (or never left) does
nothing and succeeds. Operations on one host device are serialized.

Each call runs in a fresh thread: it opens a netlink socket in the host netns, then
enters the pod netns (setns on that thread only) for the pod socket, sysctls, ethtool
and bpf calls (netdev_steps.py: one step at a time). Sockets live for one call. The
pod netns is opened read-only and never created.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from proto.dranet.store.v1 import store_pb2
from services.attach import rdma
from services.attach.engine import Attached, AttachFailed, DetachFailed, Location
from services.attach.netdev_steps import Run, StepFailed, apply_best_effort, apply_step, errtext
from shared.attachplan import (
    AttachObservation,
    AttachPlan,
    Condition,
    DeviceKind,
    DeviceNode,
    DeviceSpec,
    LinkLocator,
    LinkState,
    Ns,
    PlanError,
    ReturnObservation,
    ReturnPlan,
    ReturnState,
    ReturnTarget,
    Step,
    container_devices,
    plan_attach,
    plan_return,
    plan_rollback,
)
from shared.logs import log_fields
from shared.netns import NetnsGone, open_netns

log = logging.getLogger(__name__)

T = TypeVar("T")

# Link kinds attach creates on a host parent (macvlan: only tests use it, on kernels without ipvlan).
CHILD_KINDS = ("ipvlan", "macvlan")


# --- outcomes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AttachOutcome:
    """What RunPodSandbox did with one device (the shape of store AttachResult)."""

    device: str
    pod_uid: str
    host_ifname: str
    interface_name: str = ""
    ips: tuple[str, ...] = ()
    hardware_address: str = ""
    ifindex: int = 0
    conditions: tuple[Condition, ...] = ()
    attached: bool = False
    error: str = ""
    failed_step: str = ""
    rollback_errors: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()
    converged: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class ReturnOutcome:
    """What StopPodSandbox did with one device."""

    device: str
    host_ifname: str
    state: ReturnState
    error: str = ""
    note: str = ""
    steps: tuple[str, ...] = ()
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error


# --- observation ---------------------------------------------------------------------------


def _observe_attach(run: Run, spec: DeviceSpec) -> AttachObservation:
    if spec.kind == DeviceKind.RDMA_ONLY:
        return AttachObservation()
    tag = spec.altname
    if spec.kind == DeviceKind.IPVLAN:
        parent = run.link(Ns.HOST, spec.host_ifname)
        child = run.link(Ns.POD, spec.pod_ifname)
        if child is None:
            return AttachObservation(on_host=parent)
        if parent is not None and child.kind in CHILD_KINDS and child.link == parent.index:
            return AttachObservation(on_host=parent, in_pod=child)
        return AttachObservation(on_host=parent, pod_name_taken=child)
    on_host = run.link(Ns.HOST, spec.host_ifname)
    if on_host is None:
        on_host = run.sock(Ns.HOST).get_link(altname=tag)
    in_pod = taken = None
    named = run.link(Ns.POD, spec.pod_ifname)
    if named is not None:
        if tag in named.altnames:
            in_pod = named
        else:
            taken = named
    if on_host is None and in_pod is None:
        in_pod = run.sock(Ns.POD).get_link(altname=tag)
    if on_host is not None:
        run.index[(Ns.HOST, on_host.name)] = on_host.index
    return AttachObservation(on_host=on_host, in_pod=in_pod, pod_name_taken=taken)


def _observe_return(run: Run, target: ReturnTarget) -> ReturnObservation:
    try:
        run.open_pod()
    except NetnsGone:
        netns_exists = False
    else:
        netns_exists = True
    if target.kind == DeviceKind.RDMA_ONLY or not target.host_ifname:
        return ReturnObservation(netns_exists)
    in_pod = None
    if netns_exists:
        tag = target.altname

        def ours(link: LinkState) -> bool:
            if tag in link.altnames:
                return True
            if link.kind in CHILD_KINDS:
                # Our IPvlan child carries no tag: its parent must be our host device.
                parent = run.link(Ns.HOST, target.host_ifname)
                return parent is not None and link.link == parent.index
            return bool(target.mac) and link.mac == target.mac.lower()

        loc = target.locator()
        if target.kind == DeviceKind.IPVLAN:
            loc = LinkLocator(loc.names)  # a child carries no tag; its MAC is the parent's
        in_pod = run.locate(Ns.POD, loc, ours)
    on_host = None
    if in_pod is None:
        on_host = run.link(Ns.HOST, target.host_ifname) or run.sock(Ns.HOST).get_link(altname=target.altname)
    return ReturnObservation(netns_exists, in_pod=in_pod, on_host=on_host)


# --- the engine ----------------------------------------------------------------------------


class NetdevEngine:
    """Attaches and returns devices; one instance per attach service process."""

    def __init__(self, host_netns: str = "/proc/self/ns/net", dev_root: str = "/") -> None:
        # The process's own netns (the host's: the attach pod runs with hostNetwork).
        self._host_fd = open_netns(host_netns)
        # Where the host's /dev is seen: RDMA device files are checked under it.
        self.dev_root = dev_root
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def close(self) -> None:
        if self._host_fd >= 0:
            os.close(self._host_fd)
            self._host_fd = -1

    def _lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(key, threading.Lock())

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn`` in a fresh thread (it may setns); cancellation of the caller does
        not stop it, and the per-device lock is held until it ends."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def done(result: T | None, exc: BaseException | None) -> None:
            if fut.cancelled():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)  # type: ignore[arg-type]

        def body() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine
                loop.call_soon_threadsafe(done, None, exc)
            else:
                loop.call_soon_threadsafe(done, result, None)

        threading.Thread(target=body, name="attach-netdev", daemon=True).start()
        return await fut

    # --- the DeviceEngine of the hooks (engine.py) ---

    async def attach(self, config: store_pb2.DeviceConfig | DeviceSpec, netns: str) -> Attached:
        """Put one device into the pod netns ``netns`` (RunPodSandbox). AttachFailed
        after rolling back."""
        out = await self.attach_outcome(config, netns)
        if out.error:
            raise AttachFailed(out.error)
        return Attached(
            interface_name=out.interface_name,
            ips=out.ips,
            hardware_address=out.hardware_address,
            conditions=out.conditions,
            converged=out.converged,
        )

    async def detach(
        self,
        what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget,
        netns: str | None,
        mac: str = "",
    ) -> ReturnState:
        """Give one device back to the host (StopPodSandbox). ``netns`` "" or None: the
        pod netns is gone. DetachFailed when a step fails."""
        out = await self.detach_outcome(what, netns or None, mac=mac)
        if out.error:
            raise DetachFailed(out.error)
        return out.state

    async def locate(
        self,
        what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget,
        netns: str | None,
        mac: str = "",
    ) -> Location:
        """Where the device is now: in the pod (``netns`` given and the device is
        there), on the host (under its host name or, back from a dead netns, under
        another name with its altname tag), or missing. Raises PlanError or OSError."""
        target = _target(what, mac)
        return await self._in_thread(self.locate_in_thread, target, netns or None)

    def container_devices(self, configs: Sequence[store_pb2.DeviceConfig]) -> tuple[DeviceNode, ...]:
        """The RDMA device files of ``configs`` as they are under ``dev_root`` now."""
        nodes, problems = rdma.check_device_nodes(container_devices(configs), self.dev_root)
        for p in problems:
            # A node that vanished since prepare is left out rather than failing the
            # container: the runtime would refuse to create a missing device.
            log.warning(
                "RDMA device file problem",
                extra=log_fields(
                    path=p.path, problem=p.problem, pod_uid=configs[0].pod.uid if configs else None
                ),
            )
        return nodes

    # --- the whole record, never raising for a device problem (tests, benchmarks) ---

    async def attach_outcome(self, config: store_pb2.DeviceConfig | DeviceSpec, netns: str) -> AttachOutcome:
        """As attach, with what it did (or why it failed) as an AttachOutcome."""
        try:
            spec = config if isinstance(config, DeviceSpec) else DeviceSpec.from_proto(config)
        except PlanError as exc:
            dev = config.device
            return AttachOutcome(
                device=dev, pod_uid="", host_ifname="", error=str(exc), failed_step="parse config"
            )
        return await self._in_thread(self.attach_in_thread, spec, netns)

    async def detach_outcome(
        self,
        what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget,
        netns: str | None,
        *,
        mac: str = "",
    ) -> ReturnOutcome:
        """As detach, with what it did as a ReturnOutcome. ``netns`` None: the pod
        netns is gone. ``mac`` is the MAC the device had in the pod
        (AttachResult.hardware_address), to find it if someone renamed it and
        removed its altname."""
        try:
            target = _target(what, mac)
        except PlanError as exc:
            return ReturnOutcome(device=what.device, host_ifname="", state=ReturnState.GONE, error=str(exc))
        return await self._in_thread(self.detach_in_thread, target, netns)

    # --- thread bodies (public for the benchmark; never call them on the event loop) ---

    def _timed(self, key: str, fn: Callable[[], _O]) -> _O:
        """``fn()`` under the lock of device ``key``, its duration in the outcome."""
        with self._lock(key):
            start = time.perf_counter()
            out = fn()
            return _replace(out, duration_s=time.perf_counter() - start)

    def attach_in_thread(self, spec: DeviceSpec, netns: str) -> AttachOutcome:
        key = spec.host_ifname or spec.rdma_link_dev or spec.device
        out = self._timed(key, lambda: self._attach(spec, netns))
        fields = log_fields(pod=spec.pod_uid, device=spec.device, interface=spec.host_ifname, netns=netns)
        if out.error:
            log.warning("attach failed: %s", out.error, extra=fields)
        else:
            log.info(
                "attached %s as %s in %.1f ms (%d steps%s)",
                spec.host_ifname or spec.rdma_link_dev,
                out.interface_name,
                out.duration_s * 1000,
                len(out.steps),
                ", converged" if out.converged else "",
                extra=fields,
            )
        return out

    def detach_in_thread(self, target: ReturnTarget, netns: str | None) -> ReturnOutcome:
        key = target.host_ifname or target.rdma_link_dev or target.device
        out = self._timed(key, lambda: self._detach(target, netns))
        fields = log_fields(device=target.device, interface=target.host_ifname, netns=netns)
        if out.error:
            log.warning("return failed: %s", out.error, extra=fields)
        else:
            log.info(
                "return of %s: %s %s",
                target.host_ifname or target.rdma_link_dev,
                out.state,
                out.note,
                extra=fields,
            )
        return out

    def _attach(self, spec: DeviceSpec, netns: str) -> AttachOutcome:
        where = _where(spec, netns)
        base = AttachOutcome(device=spec.device, pod_uid=spec.pod_uid, host_ifname=spec.host_ifname)
        run = Run(self._host_fd, netns)
        try:
            try:
                run.open_pod()
                seen = _observe_attach(run, spec)
                plan = plan_attach(spec, netns, seen)
            except PlanError as exc:
                return _replace(base, error=str(exc), failed_step="plan")
            except OSError as exc:
                return _replace(base, error=f"{where}: {errtext(exc)}", failed_step="observe")
            return self._apply_attach(run, plan, base, where)
        finally:
            run.close()

    def _apply_attach(self, run: Run, plan: AttachPlan, base: AttachOutcome, where: str) -> AttachOutcome:
        done: list[int] = []
        extra: dict[int, tuple[Step, ...]] = {}
        applied: list[str] = []
        for i, ps in enumerate(plan.steps):
            log.debug("%s: %s", where, ps.action.describe())
            try:
                res = apply_step(run, ps.action)
            except StepFailed as failed:
                if failed.partial:
                    done.append(i)
                undo = plan_rollback(plan, done, extra)
                rb_errors = apply_best_effort(run, undo)
                msg = f"{where}: {failed}"
                if ps.origin:
                    msg = f"{where}: {ps.origin}: {failed}"
                if rb_errors:
                    msg += f"; rollback: {'; '.join(rb_errors)}"
                else:
                    msg += "; rolled back" + (
                        " (device back on the host)" if plan.kind == DeviceKind.PASSTHROUGH else ""
                    )
                return _replace(
                    base,
                    error=msg,
                    failed_step=failed.step.describe(),
                    rollback_errors=tuple(rb_errors),
                    steps=tuple(applied),
                )
            if res.changed:
                done.append(i)
                if res.undo is not None:
                    extra[i] = res.undo
            text = ps.action.describe() + ("" if res.changed else " (already so)")
            applied.append(text + (f": {', '.join(res.notes)}" if res.notes else ""))
        mac, ifindex = plan.mac, 0
        if plan.kind != DeviceKind.RDMA_ONLY:
            try:
                final = run.link(Ns.POD, plan.pod_ifname)
            except OSError:
                final = None
            if final is not None:
                mac, ifindex = final.mac, final.index
        return _replace(
            base,
            interface_name=plan.pod_ifname,
            ips=plan.ips,
            hardware_address=mac,
            ifindex=ifindex,
            conditions=plan.conditions,
            attached=True,
            steps=tuple(applied),
            converged=plan.converging,
        )

    def locate_in_thread(self, target: ReturnTarget, netns: str | None) -> Location:
        run = Run(self._host_fd, netns)
        try:
            if target.kind == DeviceKind.RDMA_ONLY or not target.host_ifname:
                return _locate_rdma(run, target)
            seen = _observe_return(run, target)
        finally:
            run.close()
        if seen.in_pod is not None:
            return Location.POD
        return Location.HOST if seen.on_host is not None else Location.MISSING

    def _detach(self, target: ReturnTarget, netns: str | None) -> ReturnOutcome:
        run = Run(self._host_fd, netns)
        base = ReturnOutcome(device=target.device, host_ifname=target.host_ifname, state=ReturnState.GONE)
        try:
            try:
                seen = _observe_return(run, target)
            except OSError as exc:
                return _replace(base, error=f"{_where_link(target, netns)}: observe: {errtext(exc)}")
            plan = plan_return(target, seen)
            return self._apply_return(run, plan, base, netns)
        finally:
            run.close()

    def _apply_return(
        self, run: Run, plan: ReturnPlan, base: ReturnOutcome, netns: str | None
    ) -> ReturnOutcome:
        errors: list[str] = []
        applied: list[str] = []
        for group in (plan.rdma_steps, plan.netdev_steps):
            for step in group:
                try:
                    apply_step(run, step)
                except StepFailed as failed:
                    errors.append(str(failed))
                    break  # the rest of this group depends on this step
                applied.append(step.describe())
        error = f"{_where_link(plan.target, netns)}: {'; '.join(errors)}" if errors else ""
        return _replace(base, state=plan.state, note=plan.note, error=error, steps=tuple(applied))


def _target(
    what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget, mac: str
) -> ReturnTarget:
    match what:
        case ReturnTarget():
            return what
        case store_pb2.AttachResult():
            return ReturnTarget.from_result(what)
        case DeviceSpec():
            return ReturnTarget.from_spec(what, mac)
        case _:
            return ReturnTarget.from_spec(DeviceSpec.from_proto(what), mac)


def _locate_rdma(run: Run, target: ReturnTarget) -> Location:
    """An RDMA-only device: its link device moves only in exclusive mode."""
    if not (target.rdma_exclusive and target.rdma_link_dev):
        return Location.HOST
    try:
        run.open_pod()
    except NetnsGone:
        pass
    else:
        if rdma.find_rdma_device(run.sock(Ns.POD, rdma.NETLINK_RDMA), target.rdma_link_dev) is not None:
            return Location.POD
    if rdma.find_rdma_device(run.sock(Ns.HOST, rdma.NETLINK_RDMA), target.rdma_link_dev) is not None:
        return Location.HOST
    return Location.MISSING


def _where(spec: DeviceSpec, netns: str) -> str:
    if spec.kind == DeviceKind.RDMA_ONLY:
        return f"device {spec.device} (RDMA {spec.rdma_link_dev}, netns {netns})"
    return _where_link(spec, netns)


def _where_link(target: DeviceSpec | ReturnTarget, netns: str | None) -> str:
    return f"device {target.device} (host {target.host_ifname}, pod {target.pod_ifname}, netns {netns})"


_O = TypeVar("_O", AttachOutcome, ReturnOutcome)


def _replace(obj: _O, **changes: object) -> _O:
    return replace(obj, **changes)  # type: ignore[arg-type]
