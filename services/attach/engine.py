"""What the NRI hooks need from the netlink engine, and what they get back.

The hooks (hooks.py) decide *when* a device moves and keep the books (store,
liveness, which sandbox holds which device); the engine (netdev.py, with
netdev_steps.py, rdma.py and netns.py, planned by shared/attachplan.py) does the
netlink work. This module is the seam between the two, so the hooks can be read,
and tested, without a kernel in mind: netdev.NetdevEngine implements DeviceEngine
itself, and the hooks' tests put a stand-in in its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from proto.dranet.store.v1 import store_pb2 as st
from shared.attachplan import Condition, DeviceNode, ReturnState

__all__ = ["AttachFailed", "Attached", "Condition", "DetachFailed", "DeviceEngine", "Location", "ReturnState"]


@dataclass(frozen=True)
class Attached:
    """A device as it ended up in the pod: for the AttachResult and the claim status."""

    interface_name: str
    # CIDR form, e.g. 192.0.2.5/24.
    ips: tuple[str, ...] = ()
    hardware_address: str = ""
    conditions: tuple[Condition, ...] = ()
    # It was in the pod already; the call only checked (and re-applied) its config.
    converged: bool = False


class AttachFailed(Exception):
    """The engine could not attach a device; what it had done is rolled back
    (the device is on the host again). The message names the device and step."""


class DetachFailed(Exception):
    """The engine could not give a device back to the host."""


class Location(StrEnum):
    """Where a device is (DeviceEngine.locate)."""

    POD = "pod"  # in the pod's netns
    HOST = "host"  # in the host's netns
    MISSING = "missing"  # neither


class DeviceEngine(Protocol):
    """The netlink work for one device at a time. Every call is idempotent:
    attaching a device that is already in the pod, or returning one that is
    already on the host, succeeds without changing anything."""

    async def attach(self, config: st.DeviceConfig, netns: str) -> Attached:
        """Move and configure the device in the pod's netns (RDMA link too in
        exclusive mode). AttachFailed after rolling back."""
        ...

    async def detach(self, what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> ReturnState:
        """Give the device back to the host: RDMA link first, then the netdev
        under its host name and up; an IPvlan child is deleted. ``what`` is the
        config, or the attach result once prepare removed the config. A ``netns``
        that no longer exists (or "") means the pod's netns is gone: a device the
        kernel returned is put back under its host name. ``mac`` is the one it had
        in the pod. GONE: found neither in the pod nor on the host. DetachFailed
        when a step fails."""
        ...

    async def locate(self, what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> Location:
        """Where the device is now, without changing anything."""
        ...

    def container_devices(self, configs: Sequence[st.DeviceConfig]) -> Sequence[DeviceNode]:
        """The RDMA device files every container of the pod gets, as they are on
        this host now (a file that went away since prepare is left out)."""
        ...
