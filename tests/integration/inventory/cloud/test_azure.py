"""Azure provider against a local IMDS (Metadata: true, api-version on every call)."""

from __future__ import annotations

import pytest

from services.inventory.cloud import azure
from services.inventory.cloud.base import DeviceInfo
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import RetryPolicy
from shared.deviceattr import Attribute
from shared.netconfig import NetworkConfig, RouteConfig, RuleConfig
from tests.integration.inventory.cloud.fakes import AzureImds, GceMetadata, OciImds
from tests.integration.inventory.cloud.support import Netns

FAST = RetryPolicy(request_timeout=1.0, deadline=3.0, initial_backoff=0.05)
NIC1 = DeviceInfo(name="eth1", ifname="eth1", mac="00:0d:3a:f8:06:ec", pci_address="0001:00:00.0")


async def test_probe(serve) -> None:
    server = await serve(AzureImds())
    assert await azure.probe(server.url)
    seen = server.requests[-1]
    assert seen.path == "/metadata/instance" and seen.headers["Metadata"] == "true"
    assert seen.query == {"api-version": azure.API_VERSION, "format": "text"}
    assert not await azure.probe((await serve(GceMetadata())).url)
    assert not await azure.probe((await serve(OciImds())).url)


async def test_node_attributes_on_every_device(serve) -> None:
    server = await serve(AzureImds())
    provider = azure.AzureProvider(server.url, policy=FAST, host=HostProbe(netns=None))
    await provider.start()
    try:
        want = {
            "azure.dra.net/vmSize": Attribute.of_string("Standard_ND128isr_GB300_v6"),
            "azure.dra.net/placementGroupId": Attribute.of_string("739e6cfb-2607-462e-9e2b-21d24b31f5ed"),
            "azure.dra.net/interconnectGroupId": Attribute.of_string("2deed8b4-d1e9-42be-a40a-9882201aa9f5"),
            "azure.dra.net/interconnectSubgroupId": Attribute.of_string(
                "0f0ba375-aaf1-4ac8-a579-a3b180d47de5"
            ),
        }
        assert await provider.device_attributes(NIC1) == want
        assert await provider.device_attributes(DeviceInfo(name="ib0")) == want
    finally:
        await provider.close()
    paths = {r.path: r.query for r in server.requests}
    assert paths["/metadata/instance/compute"] == {"api-version": "2025-11-11", "format": "json"}
    assert paths["/metadata/instance/network"] == {"api-version": "2025-11-11", "format": "json"}


@pytest.mark.root
@pytest.mark.netns
async def test_policy_routing_config_per_nic(serve, netns: Netns) -> None:
    """The second IMDS NIC gets table 101; its IPv6 default gateway comes from the host."""
    netns.link("eth1", "fda0:ad0a:cdcb:2000::5/64")
    netns.run("-6", "route", "add", "default", "via", "fe80::1234:5678:9abc", "dev", "eth1")
    netns.link("eth0", "10.224.0.4/16")
    server = await serve(AzureImds())
    provider = azure.AzureProvider(server.url, policy=FAST, host=HostProbe(netns=netns.path))
    await provider.start()
    try:
        assert await provider.provider_config(NIC1) == NetworkConfig(
            rules=(
                RuleConfig(source="10.144.133.128/26", table=101),
                RuleConfig(source="fda0:ad0a:cdcb:2000::5/128", table=101),
            ),
            routes=(
                RouteConfig(destination="0.0.0.0/0", gateway="10.144.133.129", table=101),
                RouteConfig(destination="::/0", gateway="fe80::1234:5678:9abc", table=101),
            ),
        )
        # The first NIC (IMDS writes its MAC upper-case without separators): table 100, IPv4 only.
        eth0 = DeviceInfo(name="eth0", ifname="eth0", mac="60:45:bd:a7:a2:b1")
        assert await provider.provider_config(eth0) == NetworkConfig(
            rules=(RuleConfig(source="10.224.0.0/16", table=100),),
            routes=(RouteConfig(destination="0.0.0.0/0", gateway="10.224.0.1", table=100),),
        )
        assert await provider.provider_config(DeviceInfo(name="veth", mac="ee:00:00:00:00:01")) is None
    finally:
        await provider.close()


async def test_network_metadata_failure_keeps_attributes(serve) -> None:
    server = await serve(AzureImds())
    server.network = {"interface": "not a list"}  # type: ignore[dict-item]
    provider = azure.AzureProvider(server.url, policy=FAST)
    await provider.start()
    try:
        assert provider.ready
        assert "azure.dra.net/vmSize" in await provider.device_attributes(NIC1)
        assert await provider.provider_config(NIC1) is None
    finally:
        await provider.close()
