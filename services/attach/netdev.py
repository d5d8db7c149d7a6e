"""The netlink engine of the attach service: applies the plans of shared.attachplan.

Entry points for the NRI hooks (all async, never blocking the event loop):

- ``NetdevEngine.attach(config, netns)`` for RunPodSandbox: one device into the pod
  netns. Returns an AttachOutcome (never raises for a device problem): on failure
  everything done so far is undone, the device is back on the host, and
  ``outcome.error`` names the device, interfaces, netns and failing step.
- ``NetdevEngine.detach(what, netns)`` for StopPodSandbox/RemovePodSandbox and for
  pods that are gone at Synchronize: gives one device back. ``what`` is the
  DeviceConfig, or the AttachResult when the config is gone.
- ``shared.attachplan.container_devices(configs)`` + ``services.attach.rdma.check_device_nodes``
  for CreateContainer.

Both are idempotent: a retried RunPodSandbox finds the device already in the pod and
converges; a return of a device that is already on the host (or never left) does
nothing and succeeds. Operations on one host device are serialized.

Each call runs in a fresh thread: it opens a netlink socket in the host netns, then
enters the pod netns (setns on that thread only) for the pod socket, sysctls, ethtool
and bpf calls. Sockets live for one call. The pod netns is opened read-only and
never created.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TypeVar

from proto.dranet.store.v1 import store_pb2
from services.attach import netdev_ebpf, netdev_ethtool, rdma
from services.attach.netdev_nl import (
    IFLA_IPVLAN_MODE,
    IFLA_MACVLAN_MODE,
    IFLA_VRF_TABLE,
    IPVLAN_MODES,
    MACVLAN_MODES,
    NETLINK_ROUTE,
    NetlinkError,
    NlSocket,
    attr_u16,
    attr_u32,
)
from services.attach.netns import NetnsError, NetnsGone, open_netns, same_netns, setns
from shared.attachplan import (
    AddAddress,
    AddAltname,
    AddNeighbor,
    AddRoute,
    AddRule,
    ApplyEthtool,
    AttachObservation,
    AttachPlan,
    Condition,
    CreateChild,
    CreateVrf,
    DelAltname,
    DeleteLink,
    DelRule,
    DetachEbpf,
    DeviceKind,
    DeviceSpec,
    LinkAttrs,
    LinkLocator,
    LinkState,
    MoveLink,
    MoveRdmaLink,
    Ns,
    PlanError,
    RenameLink,
    ReturnObservation,
    ReturnPlan,
    ReturnState,
    ReturnTarget,
    SetLink,
    SetLinkState,
    SetMaster,
    Step,
    WriteSysctl,
    plan_attach,
    plan_return,
    plan_rollback,
)
from shared.logs import log_fields

log = logging.getLogger(__name__)

T = TypeVar("T")

# Link kinds attach creates on a host parent (macvlan: only tests use it, on kernels without ipvlan).
CHILD_KINDS = ("ipvlan", "macvlan")
# Errors of an "add" that mean the thing is already there (converge, do not undo).
_EXISTS = (errno.EEXIST,)
# Errors of a "remove" that mean it is already gone.
_GONE = (errno.ENODEV, errno.ENOENT, errno.ESRCH, errno.ENODATA, errno.EADDRNOTAVAIL)


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


class Location(StrEnum):
    """Where a device is."""

    POD = "pod"
    HOST = "host"
    MISSING = "missing"


class StepFailed(Exception):
    """One step failed. partial: it changed something before failing (a move that
    moved the link but could not rename it), so its undo must run."""

    def __init__(self, step: Step, cause: BaseException, partial: bool = False) -> None:
        self.step = step
        self.cause = cause
        self.partial = partial
        super().__init__(f"step '{step.describe()}' failed: {_text(cause)}")


def _text(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        code = f"[{errno.errorcode.get(exc.errno or 0, exc.errno)}] " if exc.errno else ""
        return code + exc.strerror
    return str(exc) or type(exc).__name__


@dataclass
class _Applied:
    changed: bool = True  # False: already so, nothing to undo
    undo: tuple[Step, ...] | None = None  # replaces the planned undo
    notes: list[str] = field(default_factory=list)


# --- one run (one device, one thread) ----------------------------------------------------


class _Run:
    """The sockets and netns of one attach or return, inside its own thread."""

    def __init__(self, host_fd: int, netns_path: str | None) -> None:
        self.host_fd = host_fd
        self.netns_path = netns_path or ""
        self.pod_fd: int | None = None
        self.where = Ns.HOST
        self.socks: dict[tuple[Ns, int], NlSocket] = {}
        self.index: dict[tuple[Ns, str], int] = {}
        # The thread inherits its creator's netns; make sure it is the host's.
        setns(host_fd)

    def open_pod(self) -> None:
        if not self.netns_path:
            raise NetnsGone(errno.ENOENT, "the pod network namespace is gone (no path)")
        fd = open_netns(self.netns_path)
        if same_netns(fd, self.host_fd):
            os.close(fd)
            raise NetnsError(
                errno.EINVAL, f"{self.netns_path} is the host network namespace (host-network pod)"
            )
        self.pod_fd = fd

    def fd(self, ns: Ns) -> int:
        if ns == Ns.HOST:
            return self.host_fd
        if self.pod_fd is None:
            raise NetnsGone(errno.ENOENT, f"network namespace {self.netns_path} is not open")
        return self.pod_fd

    def enter(self, ns: Ns) -> None:
        if ns != self.where:
            setns(self.fd(ns))
            self.where = ns

    def sock(self, ns: Ns, proto: int = NETLINK_ROUTE) -> NlSocket:
        s = self.socks.get((ns, proto))
        if s is None:
            self.enter(ns)
            s = rdma.rdma_socket() if proto != NETLINK_ROUTE else NlSocket(proto)
            self.socks[(ns, proto)] = s
        return s

    def _remember(self, ns: Ns, found: LinkState | None) -> LinkState | None:
        if found is not None:
            self.index[(ns, found.name)] = found.index
        return found

    def link(self, ns: Ns, name: str) -> LinkState | None:
        return self._remember(ns, self.sock(ns).get_link(name=name))

    def resolve(self, ns: Ns, name: str) -> int:
        idx = self.index.get((ns, name))
        if idx is None:
            found = self.link(ns, name)
            if found is None:
                raise NetlinkError(errno.ENODEV, f"no interface {name} in the {ns} netns")
            idx = found.index
        return idx

    def forget(self, ns: Ns, name: str) -> None:
        self.index.pop((ns, name), None)

    def locate(
        self, ns: Ns, loc: LinkLocator, verify: Callable[[LinkState], bool] | None = None
    ) -> LinkState | None:
        """The link ``loc`` describes: by name (if ``verify`` accepts it), by altname, by MAC."""
        sock = self.sock(ns)
        for name in loc.names:
            found = sock.get_link(name=name)
            if found is not None and (verify is None or verify(found)):
                return self._remember(ns, found)
        if loc.altname:
            found = sock.get_link(altname=loc.altname)
            if found is not None:
                return self._remember(ns, found)
        if loc.mac:
            for found in sock.list_links():
                if found.mac == loc.mac.lower() and found.kind not in ("vrf", "bridge"):
                    return self._remember(ns, found)
        return None

    def close(self) -> None:
        for s in self.socks.values():
            s.close()
        self.socks.clear()
        try:
            self.enter(Ns.HOST)
        finally:
            if self.pod_fd is not None:
                os.close(self.pod_fd)
                self.pod_fd = None


# --- step executor -------------------------------------------------------------------------


def _apply(run: _Run, step: Step) -> _Applied:
    """Apply one step. Raises StepFailed naming it."""
    try:
        return _dispatch(run, step)
    except StepFailed:
        raise
    except (OSError, ValueError, PlanError) as exc:
        raise StepFailed(step, exc) from exc


def _dispatch(run: _Run, step: Step) -> _Applied:
    if isinstance(step, MoveLink):
        return _move_link(run, step)
    if isinstance(step, AddAltname):
        return _add(
            lambda: run.sock(step.ns).altname(run.resolve(step.ns, step.ifname), step.altname, add=True)
        )
    if isinstance(step, DelAltname):
        return _remove(
            lambda: run.sock(step.ns).altname(run.resolve(step.ns, step.ifname), step.altname, add=False)
        )
    if isinstance(step, RenameLink):
        idx = run.resolve(step.ns, step.ifname)
        sock = run.sock(step.ns)
        sock.set_link(idx, up=False)  # the kernel refuses to rename a running link
        sock.set_link(idx, new_name=step.new_name)
        run.forget(step.ns, step.ifname)
        run.index[(step.ns, step.new_name)] = idx
        return _Applied()
    if isinstance(step, SetLink):
        _set_link(run.sock(step.ns), run.resolve(step.ns, step.ifname), step.attrs)
        return _Applied()
    if isinstance(step, SetLinkState):
        run.sock(step.ns).set_link(run.resolve(step.ns, step.ifname), up=step.up)
        return _Applied()
    if isinstance(step, WriteSysctl):
        run.enter(step.ns)
        try:
            with open(f"/proc/sys/{step.key}", "w") as f:
                f.write(step.value)
        except FileNotFoundError:
            if step.missing_ok:
                return _Applied(changed=False, notes=[f"/proc/sys/{step.key} does not exist"])
            raise
        return _Applied()
    if isinstance(step, AddAddress):
        return _add(lambda: run.sock(step.ns).add_address(run.resolve(step.ns, step.ifname), step.cidr))
    if isinstance(step, AddRoute):
        return _add(
            lambda: run.sock(step.ns).add_route(
                run.resolve(step.ns, step.ifname),
                step.destination,
                step.gateway,
                step.source,
                step.scope,
                step.table,
            )
        )
    if isinstance(step, AddRule):
        return _add(
            lambda: run.sock(step.ns).rule(step.priority, step.source, step.destination, step.table, add=True)
        )
    if isinstance(step, DelRule):
        return _remove(
            lambda: run.sock(step.ns).rule(
                step.priority, step.source, step.destination, step.table, add=False
            )
        )
    if isinstance(step, AddNeighbor):
        run.sock(step.ns).replace_neighbor(run.resolve(step.ns, step.ifname), step.destination, step.mac)
        return _Applied()
    if isinstance(step, CreateVrf):
        return _add(
            lambda: run.sock(step.ns).create_link(
                step.name, "vrf", info_data=attr_u32(IFLA_VRF_TABLE, step.table)
            )
        )
    if isinstance(step, SetMaster):
        master = run.resolve(step.ns, step.master)
        run.sock(step.ns).set_link(run.resolve(step.ns, step.ifname), master=master)
        return _Applied()
    if isinstance(step, DeleteLink):
        found = run.link(step.ns, step.ifname)
        if found is None:
            return _Applied(changed=False)
        run.sock(step.ns).delete_link(found.index)
        run.forget(step.ns, step.ifname)
        return _Applied()
    if isinstance(step, CreateChild):
        return _create_child(run, step)
    if isinstance(step, ApplyEthtool):
        return _ethtool(run, step)
    if isinstance(step, DetachEbpf):
        idx = run.resolve(step.ns, step.ifname)
        run.enter(step.ns)
        removed = netdev_ebpf.detach_all(run.sock(step.ns), idx)
        return _Applied(changed=bool(removed), notes=removed)
    if isinstance(step, MoveRdmaLink):
        return _move_rdma(run, step)
    raise PlanError(f"no executor for step {type(step).__name__}")


def _tolerating(errnos: tuple[int, ...], fn: Callable[[], None]) -> _Applied:
    """Run ``fn``; a netlink error in ``errnos`` means it is already so (nothing to undo)."""
    try:
        fn()
    except NetlinkError as exc:
        if exc.errno in errnos:
            return _Applied(changed=False)
        raise
    return _Applied()


def _add(fn: Callable[[], None]) -> _Applied:
    return _tolerating(_EXISTS, fn)


def _remove(fn: Callable[[], None]) -> _Applied:
    return _tolerating(_GONE, fn)


def _set_link(
    sock: NlSocket, index: int, a: LinkAttrs, *, new_name: str = "", netns_fd: int | None = None
) -> None:
    """One RTM_NEWLINK with the link attributes ``a`` (and a move and rename when given)."""
    sock.set_link(
        index,
        new_name=new_name,
        netns_fd=netns_fd,
        mtu=a.mtu,
        mac=a.mac,
        gso_max_size=a.gso_max_size,
        gro_max_size=a.gro_max_size,
        gso_ipv4_max_size=a.gso_ipv4_max_size,
        gro_ipv4_max_size=a.gro_ipv4_max_size,
    )


def _identified_by(loc: LinkLocator) -> Callable[[LinkState], bool] | None:
    """A link found by name is ours only if it carries the tag or the MAC the locator
    names: a rollback must not move the pod's own interface that took our name."""
    if not loc.altname and not loc.mac:
        return None

    def check(found: LinkState) -> bool:
        return (bool(loc.altname) and loc.altname in found.altnames) or (
            bool(loc.mac) and found.mac == loc.mac.lower()
        )

    return check


def _move_link(run: _Run, step: MoveLink) -> _Applied:
    link = run.locate(step.ns, step.locator, _identified_by(step.locator))
    if link is None:
        raise NetlinkError(errno.ENODEV, f"{step.locator.describe()} not found in the {step.ns} netns")
    try:
        _set_link(
            run.sock(step.ns), link.index, step.attrs, new_name=step.new_name, netns_fd=run.fd(step.dst)
        )
    except NetlinkError as exc:
        # The kernel moves the link before it sets MAC and name: an EEXIST on the
        # name (or a refused MAC) leaves the link in the target netns under its
        # old name. Look there before deciding what to undo.
        run.forget(step.ns, link.name)
        moved = run.locate(step.dst, LinkLocator((link.name,), step.locator.altname), _same_link(link))
        raise StepFailed(step, exc, partial=moved is not None) from exc
    run.forget(step.ns, link.name)
    run.forget(step.dst, step.new_name)
    return _Applied()


def _same_link(before: LinkState) -> Callable[[LinkState], bool]:
    def check(found: LinkState) -> bool:
        return found.kind == before.kind and (found.mac == before.mac or found.index == before.index)

    return check


def _create_child(run: _Run, step: CreateChild) -> _Applied:
    parent = run.resolve(Ns.HOST, step.parent)
    if step.kind == "ipvlan":
        data = attr_u16(IFLA_IPVLAN_MODE, IPVLAN_MODES[step.mode])
    elif step.kind == "macvlan":
        data = attr_u32(IFLA_MACVLAN_MODE, MACVLAN_MODES[step.mode])
    else:
        raise PlanError(f"unsupported child kind {step.kind}")
    # Sent in the host netns, where the parent is; the kernel creates the child in the pod.
    run.sock(Ns.HOST).create_link(
        step.name, step.kind, info_data=data, parent=parent, netns_fd=run.fd(step.ns), mtu=step.mtu
    )
    return _Applied()


def _ethtool(run: _Run, step: ApplyEthtool) -> _Applied:
    run.enter(step.ns)
    try:
        prev_features = netdev_ethtool.set_features(step.ifname, dict(step.features)) if step.features else {}
    except OSError as exc:
        raise netdev_ethtool.EthtoolError(
            exc.errno or 0, f"features of {step.ifname}: {_text(exc)}"
        ) from None
    try:
        prev_flags = (
            netdev_ethtool.set_private_flags(step.ifname, dict(step.private_flags))
            if step.private_flags
            else {}
        )
    except OSError as exc:
        if prev_features:  # undo the features this step did set before failing
            netdev_ethtool.set_features(step.ifname, prev_features)
        raise netdev_ethtool.EthtoolError(
            exc.errno or 0, f"private flags of {step.ifname}: {_text(exc)}"
        ) from None
    if not prev_features and not prev_flags:
        return _Applied(changed=False)
    undo = ApplyEthtool(
        step.ns, step.ifname, tuple(sorted(prev_features.items())), tuple(sorted(prev_flags.items()))
    )
    return _Applied(undo=(undo,))


def _move_rdma(run: _Run, step: MoveRdmaLink) -> _Applied:
    src = run.sock(step.ns, rdma.NETLINK_RDMA)
    idx = rdma.find_rdma_device(src, step.name)
    if idx is None:
        if rdma.find_rdma_device(run.sock(step.dst, rdma.NETLINK_RDMA), step.name) is not None:
            return _Applied(changed=False)
        raise NetlinkError(
            errno.ENODEV, f"RDMA device {step.name} not found in the {step.ns} or {step.dst} netns"
        )
    src.rdma_set_netns(idx, run.fd(step.dst))
    return _Applied()


# --- observation ---------------------------------------------------------------------------


def _observe_attach(run: _Run, spec: DeviceSpec) -> AttachObservation:
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


def _observe_return(run: _Run, target: ReturnTarget) -> ReturnObservation:
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

    def __init__(self, host_netns: str = "/proc/self/ns/net") -> None:
        # The process's own netns (the host's: the attach pod runs with hostNetwork).
        self._host_fd = open_netns(host_netns)
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

    async def attach(self, config: store_pb2.DeviceConfig | DeviceSpec, netns: str) -> AttachOutcome:
        """Put one device into the pod netns ``netns`` (RunPodSandbox)."""
        try:
            spec = config if isinstance(config, DeviceSpec) else DeviceSpec.from_proto(config)
        except PlanError as exc:
            dev = config.device
            return AttachOutcome(
                device=dev, pod_uid="", host_ifname="", error=str(exc), failed_step="parse config"
            )
        return await self._in_thread(self.attach_in_thread, spec, netns)

    async def detach(
        self,
        what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget,
        netns: str | None,
        *,
        mac: str = "",
    ) -> ReturnOutcome:
        """Give one device back to the host (StopPodSandbox). ``netns`` None: the pod
        netns is gone. ``mac`` is the MAC the device had in the pod
        (AttachResult.hardware_address), to find it if someone renamed it and
        removed its altname."""
        try:
            target = _target(what, mac)
        except PlanError as exc:
            return ReturnOutcome(device=what.device, host_ifname="", state=ReturnState.GONE, error=str(exc))
        return await self._in_thread(self.detach_in_thread, target, netns)

    async def locate(
        self,
        what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget,
        netns: str | None,
        *,
        mac: str = "",
    ) -> Location:
        """Where the device is now: in the pod (``netns`` given and the device is
        there), on the host (under its host name or, back from a dead netns, under
        another name with its altname tag), or missing. Raises PlanError or OSError."""
        target = _target(what, mac)
        return await self._in_thread(self.locate_in_thread, target, netns)

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
        run = _Run(self._host_fd, netns)
        try:
            try:
                run.open_pod()
                seen = _observe_attach(run, spec)
                plan = plan_attach(spec, netns, seen)
            except PlanError as exc:
                return _replace(base, error=str(exc), failed_step="plan")
            except OSError as exc:
                return _replace(base, error=f"{where}: {_text(exc)}", failed_step="observe")
            return self._apply_attach(run, plan, base, where)
        finally:
            run.close()

    def _apply_attach(self, run: _Run, plan: AttachPlan, base: AttachOutcome, where: str) -> AttachOutcome:
        done: list[int] = []
        extra: dict[int, tuple[Step, ...]] = {}
        applied: list[str] = []
        for i, ps in enumerate(plan.steps):
            log.debug("%s: %s", where, ps.action.describe())
            try:
                res = _apply(run, ps.action)
            except StepFailed as failed:
                if failed.partial:
                    done.append(i)
                undo = plan_rollback(plan, done, extra)
                rb_errors = _best_effort(run, undo)
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
        run = _Run(self._host_fd, netns)
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
        run = _Run(self._host_fd, netns)
        base = ReturnOutcome(device=target.device, host_ifname=target.host_ifname, state=ReturnState.GONE)
        try:
            try:
                seen = _observe_return(run, target)
            except OSError as exc:
                return _replace(base, error=f"{_where_link(target, netns)}: observe: {_text(exc)}")
            plan = plan_return(target, seen)
            return self._apply_return(run, plan, base, netns)
        finally:
            run.close()

    def _apply_return(
        self, run: _Run, plan: ReturnPlan, base: ReturnOutcome, netns: str | None
    ) -> ReturnOutcome:
        errors: list[str] = []
        applied: list[str] = []
        for group in (plan.rdma_steps, plan.netdev_steps):
            for step in group:
                try:
                    _apply(run, step)
                except StepFailed as failed:
                    errors.append(str(failed))
                    break  # the rest of this group depends on this step
                applied.append(step.describe())
        error = f"{_where_link(plan.target, netns)}: {'; '.join(errors)}" if errors else ""
        return _replace(base, state=plan.state, note=plan.note, error=error, steps=tuple(applied))


def _target(
    what: store_pb2.DeviceConfig | store_pb2.AttachResult | DeviceSpec | ReturnTarget, mac: str
) -> ReturnTarget:
    if isinstance(what, ReturnTarget):
        return what
    if isinstance(what, store_pb2.AttachResult):
        return ReturnTarget.from_result(what)
    spec = what if isinstance(what, DeviceSpec) else DeviceSpec.from_proto(what)
    return ReturnTarget.from_spec(spec, mac)


def _locate_rdma(run: _Run, target: ReturnTarget) -> Location:
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


def _best_effort(run: _Run, steps: tuple[Step, ...]) -> list[str]:
    errors = []
    for step in steps:
        try:
            _apply(run, step)
        except StepFailed as failed:
            errors.append(str(failed))
    return errors


def _where(spec: DeviceSpec, netns: str) -> str:
    if spec.kind == DeviceKind.RDMA_ONLY:
        return f"device {spec.device} (RDMA {spec.rdma_link_dev}, netns {netns})"
    return _where_link(spec, netns)


def _where_link(target: DeviceSpec | ReturnTarget, netns: str | None) -> str:
    return f"device {target.device} (host {target.host_ifname}, pod {target.pod_ifname}, netns {netns})"


_O = TypeVar("_O", AttachOutcome, ReturnOutcome)


def _replace(obj: _O, **changes: object) -> _O:
    return replace(obj, **changes)  # type: ignore[arg-type]
