"""The hooks' books: which sandbox of a pod holds which devices (PodTrack, Held),
and the AttachResult records written for them (Records) for the claim status.

Pure apart from PodTrack's hold on the pod's netns (an open fd, and its pin): what the hooks
decide, and when, is in hooks.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.engine import Attached, Condition
from services.attach.pins import NetnsPins
from shared.logs import log_fields

log = logging.getLogger(__name__)


def pod_netns(pod: nri_pb2.PodSandbox) -> str:
    """The pod's network namespace path; '' for a host-network pod."""
    return next((n.path for n in pod.linux.namespaces if n.type == "network"), "")


def netns_exists(path: str) -> bool:
    """The runtime bind-mounts a pod's netns at its path and removes it when the
    sandbox stops, so the file says whether the netns is still there."""
    return bool(path) and os.path.exists(path)


def pod_ref(pod: nri_pb2.PodSandbox) -> str:
    return f"{pod.namespace}/{pod.name}"


Source = st.DeviceConfig | st.AttachResult


@dataclass(frozen=True)
class Held:
    """A device a sandbox holds: the config it was attached by, or (once prepare
    removed the config: NodeUnprepare can come before RemovePodSandbox) its
    attach result, and the MAC it has in the pod, to find it by."""

    source: Source
    mac: str = ""

    @property
    def device(self) -> str:
        return self.source.device

    @property
    def host_ifname(self) -> str:
        return self.source.host_ifname

    @property
    def config(self) -> st.DeviceConfig | None:
        return self.source if isinstance(self.source, st.DeviceConfig) else None


class PodTrack:
    """One pod as the hooks know it: the sandbox holding its devices and which."""

    def __init__(
        self, uid: str, namespace: str, name: str, sandbox_id: str, netns: str, pins: NetnsPins | None = None
    ) -> None:
        self.uid = uid
        self.namespace = namespace
        self.name = name
        self.sandbox_id = sandbox_id
        self.netns = netns
        # The pod's non-provisional configs as last read, by device name.
        self.configs: dict[str, st.DeviceConfig] = {}
        # Devices this sandbox holds now.
        self.attached: dict[str, Held] = {}
        # RunPodSandbox failed for this sandbox: its removal keeps the error on
        # record for the claim status (the kubelet retries with a new sandbox).
        self.failed = False
        self._netns_fd: int | None = None
        self.pins = pins or NetnsPins(None)
        self._pin: str | None = None

    def hold_netns(self) -> None:
        """Keep a reference to the pod's netns while it holds our devices. The
        runtime removes the netns path when the sandbox stops, and without another
        reference the kernel then destroys the netns: a virtual device dies with it,
        a physical one falls back to the host under its pod-side name. Our reference
        keeps the netns, and so the device, reachable until we moved it out: after a
        StopPodSandbox that needed longer than the runtime waits, or one we never
        got (containerd 1.7 sends none for sandboxes from before its restart).
        The pin (pins.py) does the same across a restart of attach itself."""
        if self._netns_fd is None and netns_exists(self.netns):
            with contextlib.suppress(OSError):
                self._netns_fd = os.open(self.netns, os.O_RDONLY | os.O_CLOEXEC)
        if self._pin is None and self._netns_fd is not None and self.pins.enabled:
            try:
                self._pin = self.pins.pin(self.uid, self.sandbox_id, f"/proc/self/fd/{self._netns_fd}")
            except OSError as exc:
                log.warning(
                    "cannot pin the pod's netns: its devices depend on attach running when it stops",
                    extra=log_fields(pod=self.ref, pod_uid=self.uid, error=str(exc)),
                )

    def release_netns(self) -> None:
        if self._netns_fd is not None:
            os.close(self._netns_fd)
            self._netns_fd = None
        if self.pins.enabled:
            try:
                self.pins.unpin(self.uid, self.sandbox_id)
                self._pin = None
            except OSError as exc:
                log.warning("cannot remove a netns pin", extra=log_fields(pod=self.ref, error=str(exc)))

    @property
    def netns_ref(self) -> str:
        """A path to the pod's netns for the engine: the runtime's, or ours once the
        runtime removed its own."""
        if not netns_exists(self.netns):
            if self._netns_fd is not None:
                return f"/proc/{os.getpid()}/fd/{self._netns_fd}"
            pinned = self.pins.get(self.uid, self.sandbox_id) if self.pins.enabled else None
            if pinned:
                return pinned
        return self.netns

    @property
    def orphaned(self) -> bool:
        """Devices still inside a netns the runtime has already removed."""
        return bool(self.attached) and self._netns_fd is not None and not netns_exists(self.netns)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def of(cls, pod: nri_pb2.PodSandbox, pins: NetnsPins | None = None) -> PodTrack:
        return cls(pod.uid, pod.namespace, pod.name, pod.id, pod_netns(pod), pins)


@dataclass(frozen=True)
class Records:
    """The AttachResults the hooks write (store records, and so the claim status)."""

    driver: str

    def base(self, src: Source) -> st.AttachResult:
        return st.AttachResult(
            pod_uid=src.pod.uid if isinstance(src, st.DeviceConfig) else src.pod_uid,
            device=src.device,
            claim=src.claim,
            pool=src.pool,
            driver=src.driver or self.driver,
            host_ifname=src.host_ifname,
        )

    def attached(self, cfg: st.DeviceConfig, done: Attached) -> st.AttachResult:
        """The device is in the pod as ``done`` says."""
        r = self.base(cfg)
        r.attached = True
        r.interface_name = done.interface_name
        r.ips.extend(done.ips)
        r.hardware_address = done.hardware_address
        now = int(time.time())
        for c in done.conditions or ready_conditions(cfg):
            r.conditions.add(
                type=c.type, status=c.status, reason=c.reason, message=c.message, last_transition_unix=now
            )
        return r

    def failed(self, src: Source, error: str, held: Held | None = None) -> st.AttachResult:
        """An error for the claim status. ``held``: the device is still in the pod."""
        r = self.base(src)
        if held is not None and isinstance(held.source, st.AttachResult):
            r.CopyFrom(held.source)
        r.attached = held is not None
        r.error = error
        r.ClearField("conditions")
        reason = "NetworkDeviceAttachFailed" if src.host_ifname else "RDMADeviceAttachFailed"
        if held is not None:
            reason = "NetworkDeviceReturnFailed"
        r.conditions.add(
            type="Ready",
            status="False",
            reason=reason,
            message=error[:1024],
            last_transition_unix=int(time.time()),
        )
        return r

    def returned(self, src: Source, note: str = "") -> st.AttachResult:
        """The device is back on the host (``note``: why, or what went wrong)."""
        r = self.base(src)
        r.attached = False
        r.error = note
        return r


def ready_conditions(cfg: st.DeviceConfig) -> tuple[Condition, ...]:
    """dranet's conditions, when the engine reports none of its own."""
    out: list[Condition] = []
    if cfg.host_ifname:
        out += [
            Condition("Ready", "True", "NetworkDeviceReady"),
            Condition("NetworkReady", "True", "NetworkReady"),
        ]
    elif cfg.rdma.link_dev:
        out.append(Condition("Ready", "True", "RDMAOnlyDeviceReady"))
    if cfg.rdma_netns_mode == "exclusive" and cfg.rdma.link_dev:
        out.append(Condition("RDMALinkReady", "True", "RDMALinkReady"))
    return tuple(out)


def lost_message(held: Held, pod: str, netns: str) -> str:
    name = held.host_ifname or (held.config.rdma.link_dev if held.config else "") or held.device
    return (
        f"device {held.device} ({name}) of pod {pod} is lost: found neither in the pod's netns "
        f"{netns or '(unknown)'} nor on the host (a veth or IPvlan child dies with its netns)"
    )


def pod_name(configs: Sequence[st.DeviceConfig], uid: str) -> str:
    for c in configs:
        if c.pod.name:
            return f"{c.pod.namespace}/{c.pod.name}"
    return uid
