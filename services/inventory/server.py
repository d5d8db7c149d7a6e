"""dranet.inventory.v1 over <run-dir>/inventory.sock: device lookups, the host
snapshot, node facts and profile resolution for prepare."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import NoReturn

import grpc

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc as pb_grpc
from services.inventory import snapshot as snap
from services.inventory.cloud.base import (
    Attribute,
    AttrKind,
    DeviceInfo,
    ProfileError,
    ProfileErrorCode,
    Providers,
)
from services.inventory.discovery import Device
from services.inventory.inventory import Inventory
from services.inventory.publisher import Publisher
from shared.logs import log_fields
from shared.netconfig import ConfigError, NetworkConfig, parse_network_config

log = logging.getLogger(__name__)

_PROFILE_CODES = {
    ProfileErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ProfileErrorCode.INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    ProfileErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ProfileErrorCode.CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    ProfileErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}


def attribute_pb(attr: Attribute) -> pb.Attribute:
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


def device_info(name: str, device: Device | None) -> DeviceInfo:
    if device is None:
        return DeviceInfo(name=name)
    return DeviceInfo(
        name=device.name,
        ifname=device.ifname,
        mac=device.mac,
        pci_address=device.pci_address,
        rdma=bool(device.rdma_device),
        rdma_device=device.rdma_device,
    )


class InventoryServicer(pb_grpc.InventoryServicer):
    def __init__(
        self,
        inventory: Inventory,
        *,
        node_name: str,
        rdma_netns_mode: str,
        providers: Providers | None = None,
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
        providers = self.providers
        return pb.NodeInfo(
            node_name=self.node_name,
            rdma_netns_mode=self.rdma_netns_mode,
            cloud_provider=providers.cloud_name if providers is not None else "none",
            has_profile_provider=providers is not None and providers.profiles is not None,
        )

    def _config(self, config_json: str, profile: str) -> NetworkConfig:
        cfg = parse_network_config(config_json) if config_json else None
        cfg = cfg or NetworkConfig()
        if profile and not cfg.profile:
            cfg = dataclasses.replace(cfg, profile=profile)
        return cfg

    async def ResolveProfile(
        self, request: pb.ResolveProfileRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveProfileResponse:
        profiles = self.providers.profiles if self.providers is not None else None
        fields = log_fields(device=request.device, claim=request.claim_uid, pod=request.pod_uid)
        if profiles is None:
            await self._abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"node {self.node_name} has no profile provider to resolve profile {request.profile!r}",
            )
        device = await self.inventory.lookup(request.device)
        if device is None:
            await self._abort(
                context, grpc.StatusCode.NOT_FOUND, f"device {request.device} not found in inventory"
            )
        try:
            config = self._config(request.config_json, request.profile)
        except ConfigError as exc:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"config_json: {exc}")
        try:
            result = await profiles.resolve_profile(
                device_info(request.device, device), request.claim_uid, config
            )
        except ProfileError as exc:
            log.warning("profile resolution failed: %s", exc, extra=fields)
            await self._abort(context, _PROFILE_CODES.get(exc.code, grpc.StatusCode.UNKNOWN), str(exc))
        log.info("profile resolved", extra={**fields, "profile": config.profile, "provider": profiles.name})
        return pb.ResolveProfileResponse(config_json=result.to_json())

    async def ReleaseProfile(
        self, request: pb.ReleaseProfileRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseProfileResponse:
        profiles = self.providers.profiles if self.providers is not None else None
        if profiles is None:
            return pb.ReleaseProfileResponse()  # nothing was ever allocated
        # The device may be gone from the node during teardown: release by name then.
        device = self.inventory.get(request.device)
        try:
            config = self._config(request.config_json, request.profile)
        except ConfigError as exc:
            await self._abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"config_json: {exc}")
        try:
            await profiles.release_profile(device_info(request.device, device), request.claim_uid, config)
        except ProfileError as exc:
            await self._abort(context, _PROFILE_CODES.get(exc.code, grpc.StatusCode.UNKNOWN), str(exc))
        log.info(
            "profile released",
            extra={**log_fields(device=request.device, claim=request.claim_uid), "profile": config.profile},
        )
        return pb.ReleaseProfileResponse()

    async def Rescan(self, request: pb.RescanRequest, context: grpc.aio.ServicerContext) -> pb.RescanResponse:
        if request.wait:
            before = self.inventory.scans
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
