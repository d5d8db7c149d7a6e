"""dranet.inventory.v1 over <run-dir>/inventory.sock: device lookups, the host
snapshot, node facts and profile resolution for prepare."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import NoReturn

import grpc

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc as pb_grpc
from services.inventory import snapshot as snap
from services.inventory.cloud import rpc as cloud_rpc
from services.inventory.cloud.base import DeviceInfo, Providers
from services.inventory.discovery import Device
from services.inventory.inventory import Inventory, device_info
from services.inventory.publisher import Publisher
from shared.deviceattr import Attribute, AttrKind
from shared.logs import log_fields

log = logging.getLogger(__name__)


def attribute_pb(attr: Attribute) -> pb.Attribute:
    if isinstance(attr.value, tuple):
        values = list(attr.value)
        if attr.kind is AttrKind.INTS:
            return pb.Attribute(ints=pb.IntList(values=[int(v) for v in values]))
        if attr.kind is AttrKind.BOOLS:
            return pb.Attribute(bools=pb.BoolList(values=[bool(v) for v in values]))
        if attr.kind is AttrKind.VERSIONS:
            return pb.Attribute(versions=pb.StringList(values=[str(v) for v in values]))
        return pb.Attribute(strings=pb.StringList(values=[str(v) for v in values]))
    if attr.kind is AttrKind.INT:
        return pb.Attribute(int=int(attr.value))
    if attr.kind is AttrKind.BOOL:
        return pb.Attribute(bool=bool(attr.value))
    if attr.kind is AttrKind.VERSION:
        return pb.Attribute(version=str(attr.value))
    return pb.Attribute(string=str(attr.value))


def device_pb(device: Device, published: bool) -> pb.Device:
    return pb.Device(
        name=device.name,
        attributes={k: attribute_pb(v) for k, v in device.attributes.items()},
        ifname=device.ifname,
        pci_address=device.pci_address,
        rdma_device=device.rdma_device,
        rdma_only=device.rdma_only,
        is_sriov_vf=device.is_sriov_vf,
        pf_ifname=device.pf_ifname,
        mtu=device.mtu,
        ifindex=device.ifindex,
        profiles=list(device.profiles),
        provider_config_json=device.provider_config.to_json() if device.provider_config else "",
        published=published,
        type=device.type,
        slice_entry_json=json.dumps(device.slice_entry(), sort_keys=True, separators=(",", ":")),
    )


def snapshot_pb(s: snap.Snapshot) -> pb.HostSnapshot:
    return pb.HostSnapshot(
        addresses=[pb.Address(cidr=a.cidr, scope=a.scope) for a in s.addresses],
        routes=[
            pb.Route(destination=r.dst, gateway=r.gateway, source=r.prefsrc, scope=r.scope, table=r.table)
            for r in s.routes
        ],
        rules=[pb.Rule(priority=r.priority, source=r.src, destination=r.dst, table=r.table) for r in s.rules],
        neighbors=[pb.Neighbor(destination=n.dst, hardware_addr=n.lladdr) for n in s.neighbors],
        rdma_dev_chars=[
            pb.LinuxDevice(
                path=c.path,
                type=c.type,
                major=c.major,
                minor=c.minor,
                file_mode=c.file_mode,
                uid=c.uid,
                gid=c.gid,
            )
            for c in s.rdma_dev_chars
        ],
        mtu=s.mtu,
        hardware_addr=s.hardware_addr,
        ifindex=s.ifindex,
        state=s.state,
        pf_ifname=s.pf_ifname,
        pf_mtu=s.pf_mtu,
        link_ifname=s.link_ifname,
        link_mtu=s.link_mtu,
        rdma_device=s.rdma_device,
    )


class InventoryServicer(pb_grpc.InventoryServicer):
    def __init__(
        self,
        inventory: Inventory,
        *,
        node_name: str,
        rdma_netns_mode: str,
        providers: Providers,
        publisher: Publisher | None = None,
    ) -> None:
        self.inventory = inventory
        self.node_name = node_name
        self.rdma_netns_mode = rdma_netns_mode
        self.providers = providers
        self.publisher = publisher

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_InventoryServicer_to_server(self, server)

    async def _abort(
        self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str
    ) -> NoReturn:
        await context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort raises

    async def GetDevice(self, request: pb.GetDeviceRequest, context: grpc.aio.ServicerContext) -> pb.Device:
        started = time.perf_counter()
        device = await self.inventory.lookup(request.name)
        if device is None:
            await self._abort(
                context, grpc.StatusCode.NOT_FOUND, f"device {request.name} is not on node {self.node_name}"
            )
        out = device_pb(device, device.name in self.inventory.published)
        if request.with_snapshot:
            try:
                s = await asyncio.to_thread(
                    snap.read_snapshot, device.ifname, self.inventory.sysfs, device.rdma_device
                )
            except snap.InterfaceGone as exc:
                await self._abort(context, grpc.StatusCode.NOT_FOUND, f"device {device.name}: {exc}")
            except OSError as exc:
                await self._abort(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    f"device {device.name}: reading the host state: {exc}",
                )
            out.snapshot.CopyFrom(snapshot_pb(s))
            if s.pf_ifname:
                out.pf_ifname, out.pf_mtu = s.pf_ifname, s.pf_mtu
            if s.mtu:
                out.mtu = s.mtu
        log.debug(
            "device lookup",
            extra={
                **log_fields(device=device.name),
                "seconds": time.perf_counter() - started,
                "snapshot": request.with_snapshot,
            },
        )
        return out

    async def ListDevices(
        self, request: pb.ListDevicesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDevicesResponse:
        published = self.inventory.published
        devices = [
            device_pb(d, d.name in published)
            for d in self.inventory.devices.values()
            if not request.published_only or d.name in published
        ]
        return pb.ListDevicesResponse(devices=devices)

    async def GetNodeInfo(
        self, request: pb.GetNodeInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.NodeInfo:
        return pb.NodeInfo(
            node_name=self.node_name,
            rdma_netns_mode=self.rdma_netns_mode,
            cloud_provider=self.providers.cloud_name,
            has_profile_provider=self.providers.profiles is not None,
        )

    async def _device_info(self, name: str) -> DeviceInfo | None:
        device = await self.inventory.lookup(name)
        return device_info(device) if device is not None else None

    async def ResolveProfile(
        self, request: pb.ResolveProfileRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveProfileResponse:
        return await cloud_rpc.resolve(self.providers, self._device_info, request, context)

    async def ReleaseProfile(
        self, request: pb.ReleaseProfileRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseProfileResponse:
        return await cloud_rpc.release(self.providers, self._device_info, request, context)

    async def Rescan(self, request: pb.RescanRequest, context: grpc.aio.ServicerContext) -> pb.RescanResponse:
        if request.wait:
            # A scan already running may have read the host before this request.
            before = self.inventory.scans + (1 if self.inventory.scanning else 0)
            self.inventory.request_rescan()
            if not await self.inventory.wait_scan_after(before, within=30):
                await self._abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, "rescan did not finish in 30s")
            if self.publisher is not None and not await self.publisher.wait_synced(within=30):
                await self._abort(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    f"rescanned, but publishing ResourceSlices has not succeeded: {self.publisher.last_error}",
                )
        else:
            self.inventory.request_rescan()
        return pb.RescanResponse(devices=len(self.inventory.devices), published=len(self.inventory.published))
