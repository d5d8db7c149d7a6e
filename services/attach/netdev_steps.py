"""One attach or return inside its thread: the sockets and netns it works in (``Run``)
and the executor of each plan step of shared.attachplan (``apply_step``).

netdev.py observes, plans and walks a plan; this module does one step at a time. Every
executor is idempotent in the way the plans need: an "add" of something already there
and a "remove" of something already gone succeed and report that nothing changed
(so a rollback does not undo what the step did not do).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field

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
from shared.attachplan import (
    AddAddress,
    AddAltname,
    AddNeighbor,
    AddRoute,
    AddRule,
    ApplyEthtool,
    CreateChild,
    CreateVrf,
    DelAltname,
    DeleteLink,
    DelRule,
    DetachEbpf,
    LinkAttrs,
    LinkLocator,
    LinkState,
    MoveLink,
    MoveRdmaLink,
    Ns,
    PlanError,
    RenameLink,
    SetLink,
    SetLinkState,
    SetMaster,
    Step,
    WriteSysctl,
)
from shared.netns import NetnsError, NetnsGone, open_netns, same_netns, setns

# Errors of an "add" that mean the thing is already there (converge, do not undo).
_EXISTS = (errno.EEXIST,)
# Errors of a "remove" that mean it is already gone.
_GONE = (errno.ENODEV, errno.ENOENT, errno.ESRCH, errno.ENODATA, errno.EADDRNOTAVAIL)


class StepFailed(Exception):
    """One step failed. partial: it changed something before failing (a move that
    moved the link but could not rename it), so its undo must run."""

    def __init__(self, step: Step, cause: BaseException, partial: bool = False) -> None:
        self.step = step
        self.cause = cause
        self.partial = partial
        super().__init__(f"step '{step.describe()}' failed: {errtext(cause)}")


def errtext(exc: BaseException) -> str:
    """An error as the outcome's message shows it: ``[ERRNO] text`` for an OSError."""
    if isinstance(exc, OSError) and exc.strerror:
        code = f"[{errno.errorcode.get(exc.errno or 0, exc.errno)}] " if exc.errno else ""
        return code + exc.strerror
    return str(exc) or type(exc).__name__


@dataclass
class Applied:
    """What one step did."""

    changed: bool = True  # False: already so, nothing to undo
    undo: tuple[Step, ...] | None = None  # replaces the planned undo
    notes: list[str] = field(default_factory=list)


# --- one run (one device, one thread) ----------------------------------------------------


class Run:
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


def apply_step(run: Run, step: Step) -> Applied:
    """Apply one step. Raises StepFailed naming it."""
    try:
        return _dispatch(run, step)
    except StepFailed:
        raise
    except (OSError, ValueError, PlanError) as exc:
        raise StepFailed(step, exc) from exc


def apply_best_effort(run: Run, steps: tuple[Step, ...]) -> list[str]:
    """Apply every step (a rollback): one that fails does not stop the rest. The errors."""
    errors = []
    for step in steps:
        try:
            apply_step(run, step)
        except StepFailed as failed:
            errors.append(str(failed))
    return errors


def _dispatch(run: Run, step: Step) -> Applied:
    match step:
        case MoveLink():
            return _move_link(run, step)
        case AddAltname():
            return _add(
                lambda: run.sock(step.ns).altname(run.resolve(step.ns, step.ifname), step.altname, add=True)
            )
        case DelAltname():
            return _remove(
                lambda: run.sock(step.ns).altname(run.resolve(step.ns, step.ifname), step.altname, add=False)
            )
        case RenameLink():
            return _rename_link(run, step)
        case SetLink():
            _set_link(run.sock(step.ns), run.resolve(step.ns, step.ifname), step.attrs)
            return Applied()
        case SetLinkState():
            run.sock(step.ns).set_link(run.resolve(step.ns, step.ifname), up=step.up)
            return Applied()
        case WriteSysctl():
            return _write_sysctl(run, step)
        case AddAddress():
            return _add(lambda: run.sock(step.ns).add_address(run.resolve(step.ns, step.ifname), step.cidr))
        case AddRoute():
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
        case AddRule():
            return _add(
                lambda: run.sock(step.ns).rule(
                    step.priority, step.source, step.destination, step.table, add=True
                )
            )
        case DelRule():
            return _remove(
                lambda: run.sock(step.ns).rule(
                    step.priority, step.source, step.destination, step.table, add=False
                )
            )
        case AddNeighbor():
            run.sock(step.ns).replace_neighbor(run.resolve(step.ns, step.ifname), step.destination, step.mac)
            return Applied()
        case CreateVrf():
            return _add(
                lambda: run.sock(step.ns).create_link(
                    step.name, "vrf", info_data=attr_u32(IFLA_VRF_TABLE, step.table)
                )
            )
        case SetMaster():
            master = run.resolve(step.ns, step.master)
            run.sock(step.ns).set_link(run.resolve(step.ns, step.ifname), master=master)
            return Applied()
        case DeleteLink():
            return _delete_link(run, step)
        case CreateChild():
            return _create_child(run, step)
        case ApplyEthtool():
            return _ethtool(run, step)
        case DetachEbpf():
            return _detach_ebpf(run, step)
        case MoveRdmaLink():
            return _move_rdma(run, step)
    raise PlanError(f"no executor for step {type(step).__name__}")


def _tolerating(errnos: tuple[int, ...], fn: Callable[[], None]) -> Applied:
    """Run ``fn``; a netlink error in ``errnos`` means it is already so (nothing to undo)."""
    try:
        fn()
    except NetlinkError as exc:
        if exc.errno in errnos:
            return Applied(changed=False)
        raise
    return Applied()


def _add(fn: Callable[[], None]) -> Applied:
    return _tolerating(_EXISTS, fn)


def _remove(fn: Callable[[], None]) -> Applied:
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


def _rename_link(run: Run, step: RenameLink) -> Applied:
    idx = run.resolve(step.ns, step.ifname)
    sock = run.sock(step.ns)
    sock.set_link(idx, up=False)  # the kernel refuses to rename a running link
    sock.set_link(idx, new_name=step.new_name)
    run.forget(step.ns, step.ifname)
    run.index[(step.ns, step.new_name)] = idx
    return Applied()


def _write_sysctl(run: Run, step: WriteSysctl) -> Applied:
    run.enter(step.ns)
    try:
        with open(f"/proc/sys/{step.key}", "w") as f:
            f.write(step.value)
    except FileNotFoundError:
        if step.missing_ok:
            return Applied(changed=False, notes=[f"/proc/sys/{step.key} does not exist"])
        raise
    return Applied()


def _delete_link(run: Run, step: DeleteLink) -> Applied:
    found = run.link(step.ns, step.ifname)
    if found is None:
        return Applied(changed=False)
    run.sock(step.ns).delete_link(found.index)
    run.forget(step.ns, step.ifname)
    return Applied()


def _detach_ebpf(run: Run, step: DetachEbpf) -> Applied:
    idx = run.resolve(step.ns, step.ifname)
    run.enter(step.ns)
    removed = netdev_ebpf.detach_all(run.sock(step.ns), idx)
    return Applied(changed=bool(removed), notes=removed)


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


def _move_link(run: Run, step: MoveLink) -> Applied:
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
    return Applied()


def _same_link(before: LinkState) -> Callable[[LinkState], bool]:
    def check(found: LinkState) -> bool:
        return found.kind == before.kind and (found.mac == before.mac or found.index == before.index)

    return check


def _create_child(run: Run, step: CreateChild) -> Applied:
    parent = run.resolve(Ns.HOST, step.parent)
    match step.kind:
        case "ipvlan":
            data = attr_u16(IFLA_IPVLAN_MODE, IPVLAN_MODES[step.mode])
        case "macvlan":
            data = attr_u32(IFLA_MACVLAN_MODE, MACVLAN_MODES[step.mode])
        case _:
            raise PlanError(f"unsupported child kind {step.kind}")
    # Sent in the host netns, where the parent is; the kernel creates the child in the pod.
    run.sock(Ns.HOST).create_link(
        step.name, step.kind, info_data=data, parent=parent, netns_fd=run.fd(step.ns), mtu=step.mtu
    )
    return Applied()


def _ethtool(run: Run, step: ApplyEthtool) -> Applied:
    run.enter(step.ns)
    try:
        prev_features = netdev_ethtool.set_features(step.ifname, dict(step.features)) if step.features else {}
    except OSError as exc:
        raise netdev_ethtool.EthtoolError(
            exc.errno or 0, f"features of {step.ifname}: {errtext(exc)}"
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
            exc.errno or 0, f"private flags of {step.ifname}: {errtext(exc)}"
        ) from None
    if not prev_features and not prev_flags:
        return Applied(changed=False)
    undo = ApplyEthtool(
        step.ns, step.ifname, tuple(sorted(prev_features.items())), tuple(sorted(prev_flags.items()))
    )
    return Applied(undo=(undo,))


def _move_rdma(run: Run, step: MoveRdmaLink) -> Applied:
    src = run.sock(step.ns, rdma.NETLINK_RDMA)
    idx = rdma.find_rdma_device(src, step.name)
    if idx is None:
        if rdma.find_rdma_device(run.sock(step.dst, rdma.NETLINK_RDMA), step.name) is not None:
            return Applied(changed=False)
        raise NetlinkError(
            errno.ENODEV, f"RDMA device {step.name} not found in the {step.ns} or {step.dst} netns"
        )
    src.rdma_set_netns(idx, run.fd(step.dst))
    return Applied()
