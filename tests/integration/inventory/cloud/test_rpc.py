"""The profile RPCs as prepare calls them: dranet.inventory.v1 over a Unix socket,
served by a real grpc.aio server whose ResolveProfile/ReleaseProfile use
services.inventory.cloud.rpc, backed by a local webhook and a local GCE server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from services.inventory.cloud import rpc
from services.inventory.cloud.base import DeviceInfo, Hint, Providers
from services.inventory.cloud.gce import GceProvider
from services.inventory.cloud.metadata import RetryPolicy
from services.inventory.cloud.webhook import WebhookProvider
from shared.netconfig import InterfaceConfig, InterfaceType, NetworkConfig, parse_network_config
from shared.netconfig.merge import merge
from shared.rpc import UdsServer, channel
from tests.integration.inventory.cloud.fakes import GceMetadata, Webhook

DEVICES = {
    "eth0": DeviceInfo(name="eth0", ifname="eth0", mac="42:01:0a:80:00:46", pci_address="0000:00:04.0"),
}


class ProfileServicer(inventory_pb2_grpc.InventoryServicer):
    """The profile half of the inventory's servicer, as the inventory wires it."""

    def __init__(self, providers: Providers) -> None:
        self.providers = providers

    async def lookup(self, name: str) -> DeviceInfo | None:
        return DEVICES.get(name)

    async def ResolveProfile(
        self, request: pb.ResolveProfileRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResolveProfileResponse:
        return await rpc.resolve(self.providers, self.lookup, request, context)

    async def ReleaseProfile(
        self, request: pb.ReleaseProfileRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReleaseProfileResponse:
        return await rpc.release(self.providers, self.lookup, request, context)


Start = Callable[[Providers], Awaitable[inventory_pb2_grpc.InventoryStub]]


@pytest.fixture
async def inventory(tmp_path: Path) -> AsyncIterator[Start]:
    """``stub = await inventory(providers)``: a served socket and a client stub for it."""
    servers: list[UdsServer] = []
    channels: list[grpc.aio.Channel] = []

    async def start(providers: Providers) -> inventory_pb2_grpc.InventoryStub:
        sock = tmp_path / f"inventory-{len(servers)}.sock"
        servicer = ProfileServicer(providers)
        server = UdsServer(sock).add(
            lambda s: inventory_pb2_grpc.add_InventoryServicer_to_server(servicer, s)
        )
        await server.start()
        servers.append(server)
        ch = channel(sock)
        channels.append(ch)
        return inventory_pb2_grpc.InventoryStub(ch)

    yield start
    for ch in channels:
        await ch.close()
    for server in servers:
        await server.stop(0)


async def test_webhook_profiles_over_grpc(serve, inventory) -> None:
    hook = await serve(Webhook())
    provider = WebhookProvider(hook.url, startup_timeout=2.0)
    await provider.start()
    providers = Providers(hint=Hint.NONE, cloud=None, profiles=provider)
    stub = await inventory(providers)
    try:
        user = NetworkConfig(profile="python-profile", interface=InterfaceConfig(mtu=1400))
        resp = await stub.ResolveProfile(
            pb.ResolveProfileRequest(
                device="eth0",
                claim_uid="uid-1",
                profile="python-profile",
                pod_uid="pod-1",
                config_json=user.to_json(),
            ),
            timeout=10,
        )
        profile = parse_network_config(resp.config_json)
        assert profile is not None and profile.interface.addresses == ("10.200.200.1/24",)
        merged = merge(user, profile)
        assert merged.interface.mtu == 1400 and merged.interface.addresses == ("10.200.200.1/24",)
        release = pb.ReleaseProfileRequest(
            device="eth0", claim_uid="uid-1", profile="python-profile", config_json=merged.to_json()
        )
        await stub.ReleaseProfile(release, timeout=10)
        await stub.ReleaseProfile(release, timeout=10)
        assert hook.leases == {}
        # A device that left the node is still released by name.
        gone = pb.ReleaseProfileRequest(device="gone0", claim_uid="uid-1", profile="python-profile")
        await stub.ReleaseProfile(gone, timeout=10)

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ResolveProfile(
                pb.ResolveProfileRequest(device="nope", claim_uid="u", profile="python-profile"), timeout=10
            )
        assert err.value.code() is grpc.StatusCode.NOT_FOUND and "nope" in (err.value.details() or "")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ResolveProfile(
                pb.ResolveProfileRequest(
                    device="eth0", claim_uid="u", profile="p", config_json='{"interface": 1}'
                ),
                timeout=10,
            )
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "interface" in (
            err.value.details() or ""
        )

        hook.forced = (500, "whereabouts: etcd unreachable")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ResolveProfile(
                pb.ResolveProfileRequest(device="eth0", claim_uid="u2", profile="python-profile"), timeout=10
            )
        assert err.value.code() is grpc.StatusCode.UNAVAILABLE
        assert hook.url in (err.value.details() or "") and "HTTP 500" in (err.value.details() or "")
    finally:
        await provider.close()


async def test_cloud_profiles_and_no_provider_over_grpc(serve, inventory) -> None:
    meta = await serve(GceMetadata())
    gce = GceProvider(meta.url, policy=RetryPolicy(request_timeout=1.0, deadline=3.0), startup_timeout=3.0)
    await gce.start()
    with_gce = await inventory(Providers(hint=Hint.GCE, cloud=gce, profiles=gce))
    without = await inventory(Providers(hint=Hint.GCE, cloud=gce, profiles=None))
    try:
        cfg = NetworkConfig(profile="gce-managed", interface=InterfaceConfig(type=InterfaceType.IPVLAN))
        req = pb.ResolveProfileRequest(
            device="eth0", claim_uid="uid-g", profile="gce-managed", config_json=cfg.to_json()
        )
        out = parse_network_config((await with_gce.ResolveProfile(req, timeout=10)).config_json)
        assert out is not None and len(out.interface.addresses) == 1 and out.rules
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await without.ResolveProfile(req, timeout=10)
        assert err.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "no profile provider" in (err.value.details() or "")
        # Releasing without a profile provider is a no-op, as in dranet.
        await without.ReleaseProfile(pb.ReleaseProfileRequest(device="eth0", claim_uid="uid-g"), timeout=10)
    finally:
        await gce.close()
