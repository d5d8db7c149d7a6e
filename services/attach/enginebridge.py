"""Fits the netlink engine (netdev.py, rdma.py) to what the hooks expect (engine.py):
outcomes with an error become exceptions, and device nodes become NRI LinuxDevices."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach import netdev, rdma
from services.attach.engine import Attached, AttachFailed, DetachFailed, Location, ReturnState
from services.attach.netdev import NetdevEngine
from shared.attachplan import DeviceNode, container_devices
from shared.logs import log_fields

log = logging.getLogger(__name__)


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


_LOCATIONS = {
    netdev.Location.POD: Location.POD,
    netdev.Location.HOST: Location.HOST,
    netdev.Location.MISSING: Location.MISSING,
}


class NetdevBridge:
    """The DeviceEngine the attach service runs with."""

    def __init__(self, engine: NetdevEngine | None = None, dev_root: str = "/") -> None:
        self.engine = engine or NetdevEngine()
        self.dev_root = dev_root

    def close(self) -> None:
        self.engine.close()

    async def attach(self, config: st.DeviceConfig, netns: str) -> Attached:
        out = await self.engine.attach(config, netns)
        if out.error:
            raise AttachFailed(out.error)
        return Attached(
            interface_name=out.interface_name,
            ips=out.ips,
            hardware_address=out.hardware_address,
            conditions=out.conditions,
            converged=out.converged,
        )

    async def detach(self, what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> ReturnState:
        out = await self.engine.detach(what, netns or None, mac=mac)
        if out.error:
            raise DetachFailed(out.error)
        return out.state

    async def locate(self, what: st.DeviceConfig | st.AttachResult, netns: str, mac: str = "") -> Location:
        where = await self.engine.locate(what, netns or None, mac=mac)
        return _LOCATIONS[where]

    def container_devices(self, configs: Sequence[st.DeviceConfig]) -> list[nri_pb2.LinuxDevice]:
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
        return [linux_device(n) for n in nodes]
