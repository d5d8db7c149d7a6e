"""OKE provider against a local OCI IMDS v2 (/opc/v2/, Authorization: Bearer Oracle),
with RDMA NICs as veth links in a test netns and a fake sysfs/procfs tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.inventory.cloud import oke
from services.inventory.cloud.base import DeviceInfo, ProfileError, ProfileErrorCode
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import RetryPolicy
from shared.deviceattr import Attribute
from shared.netconfig import (
    Addressing,
    InterfaceConfig,
    InterfaceType,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
)
from shared.netconfig.merge import merge
from shared.netconfig.validate import finalize
from tests.integration.inventory.cloud.fakes import AzureImds, GceMetadata, OciImds, oke_parent_address
from tests.integration.inventory.cloud.support import FakeHost, Netns, eventually

FAST = RetryPolicy(request_timeout=1.0, deadline=3.0, initial_backoff=0.05)
SUFFIX = "aaaaaaaa2mvjha24vj6evyafdqtis6nzqibhrnxxhzt65zkc3upy4xlrz5za"
RDMA0 = DeviceInfo(
    name="pci-0000-0c-00-0", ifname="rdma0", mac="a0:88:c2:a7:c5:04", pci_address="0000:0c:00.0", rdma=True
)
RDMA1 = DeviceInfo(
    name="pci-0000-0d-00-0", ifname="rdma1", mac="a0:88:c2:a7:c5:05", pci_address="0000:0d:00.0", rdma=True
)
ETH0 = DeviceInfo(name="pci-0000-1f-00-0", ifname="eth0", mac="02:00:17:01:9c:22", pci_address="0000:1f:00.0")
PROFILE = NetworkConfig(profile="oke-rdma", interface=InterfaceConfig(type=InterfaceType.IPVLAN))


async def test_probe(serve) -> None:
    server = await serve(OciImds())
    assert await oke.probe(server.url)
    assert server.requests[-1].headers["Authorization"] == "Bearer Oracle"
    assert server.requests[-1].path == "/opc/v2/instance/"
    assert not await oke.probe((await serve(AzureImds())).url)
    assert not await oke.probe((await serve(GceMetadata())).url)


async def test_topology_attributes(serve, tmp_path: Path) -> None:
    server = await serve(OciImds())
    provider = oke.OkeProvider(
        server.url, host=HostProbe(sysfs_root=str(tmp_path)), policy=FAST, oca_config_dir=str(tmp_path)
    )
    await provider.start()
    try:
        want = {
            "oke.dra.net/hpcIslandId": Attribute.of_string(SUFFIX),
            "oke.dra.net/networkBlockId": Attribute.of_string(SUFFIX),
            "oke.dra.net/localBlockId": Attribute.of_string(SUFFIX),
            "oke.dra.net/rackId": Attribute.of_string("c1d2e3f4a5b6"),
            "oke.dra.net/gpuMemoryFabricId": Attribute.of_string(SUFFIX),
            "oke.dra.net/shape": Attribute.of_string("BM.GPU.GB200-v3.4"),
            "oke.dra.net/rdmaFabricIpv6": Attribute.of_bool(False),
            "oke.dra.net/rdmaFabricPlanes": Attribute.of_int(4),
        }
        assert await provider.device_attributes(ETH0) == want
        # No RDMA NIC on this host: the VNIC list is never read.
        assert "/opc/v2/vnics/" not in server.paths()
    finally:
        await provider.close()


async def test_shape_without_topology_falls_back_to_host_fields(serve, tmp_path: Path) -> None:
    server = await serve(OciImds())
    del server.host["rdmaTopologyData"]
    del server.host["rdmaFabricData"]
    provider = oke.OkeProvider(
        server.url, host=HostProbe(sysfs_root=str(tmp_path)), policy=FAST, oca_config_dir=""
    )
    await provider.start()
    try:
        assert await provider.device_attributes(ETH0) == {
            "oke.dra.net/networkBlockId": Attribute.of_string("fallback-network-block"),
            "oke.dra.net/rackId": Attribute.of_string("c1d2e3f4a5b6"),
            "oke.dra.net/shape": Attribute.of_string("BM.GPU.GB200-v3.4"),
        }
    finally:
        await provider.close()


@pytest.fixture
def rdma_host(fake_host: FakeHost, netns: Netns) -> HostProbe:
    """Two OCA-configured RDMA NICs and the VCN NIC, as on a GB200 node."""
    for ifname, pci in (("rdma0", "0000:0c:00.0"), ("rdma1", "0000:0d:00.0"), ("eth0", "0000:1f:00.0")):
        fake_host.netdev(ifname, pci=pci)
        fake_host.sysctl(ifname, "arp_ignore", 1 if ifname.startswith("rdma") else 0)
        fake_host.sysctl(ifname, "arp_announce", 2 if ifname.startswith("rdma") else 0)
    netns.link("rdma0", f"{oke_parent_address(0)}/12")
    netns.link("rdma1", f"{oke_parent_address(1)}/12")
    netns.link("eth0", "10.0.0.25/16")
    return HostProbe(sysfs_root=str(fake_host.sys), procfs_root=str(fake_host.proc), netns=netns.path)


async def started(url: str, host: HostProbe, oca_dir: Path) -> oke.OkeProvider:
    provider = oke.OkeProvider(url, host=host, policy=FAST, startup_timeout=5.0, oca_config_dir=str(oca_dir))
    await provider.start()
    return provider


@pytest.mark.root
@pytest.mark.netns
async def test_oke_rdma_profile_end_to_end(serve, rdma_host: HostProbe, tmp_path: Path) -> None:
    server = await serve(OciImds())
    provider = await started(server.url, rdma_host, tmp_path)
    try:
        assert provider.state is not None and provider.state.primary_vnic is not None
        assert "/opc/v2/vnics/" in server.paths()
        # Advertised for the Ethernet RDMA NICs only, never for the VCN NIC.
        assert await provider.provider_config(RDMA0) == PROFILE
        assert await provider.provider_config(ETH0) is None

        out = await provider.resolve_profile(RDMA0, "claim-0", PROFILE)
        assert out == NetworkConfig(
            interface=InterfaceConfig(
                type=InterfaceType.IPVLAN, addresses=("10.208.0.25/12",), arp_ignore=1, arp_announce=2
            ),
            routes=(RouteConfig(destination="10.208.0.0/12", source="10.208.0.25", scope=253, table=100),),
            rules=(RuleConfig(priority=32000, source="10.208.0.25/32", table=100),),
        )
        final = finalize(merge(PROFILE, out))
        assert final.interface.effective_type is InterfaceType.IPVLAN

        out1 = await provider.resolve_profile(RDMA1, "claim-1", PROFILE)
        assert out1.interface.addresses == ("10.209.0.25/12",)
        assert out1.routes[0].table == 101 and out1.rules[0].table == 101
        # Deterministic: a retry gives the same answer; release has nothing to free.
        assert await provider.resolve_profile(RDMA1, "claim-1", PROFILE) == out1
        await provider.release_profile(RDMA1, "claim-1", PROFILE)

        # The claim's own ARP settings and routing win.
        mine = NetworkConfig(
            profile="oke-rdma",
            interface=InterfaceConfig(arp_ignore=0),
            routes=(RouteConfig(destination="10.208.0.0/12", table=7),),
        )
        out = await provider.resolve_profile(RDMA0, "claim-2", mine)
        assert out.interface.arp_ignore == 0 and out.interface.arp_announce == 2
        assert out.routes == () and out.rules == ()
    finally:
        await provider.close()


@pytest.mark.root
@pytest.mark.netns
@pytest.mark.parametrize(
    ("interface", "needle"),
    [
        (InterfaceConfig(type=InterfaceType.PASSTHROUGH), "PASSTHROUGH"),
        (InterfaceConfig(dhcp=True), "dhcp"),
        (InterfaceConfig(addressing=Addressing.UNNUMBERED), "Unnumbered"),
        (InterfaceConfig(addresses=("10.208.9.9/12",)), "interface.addresses"),
    ],
)
async def test_profile_refuses_what_it_cannot_do(
    serve, rdma_host: HostProbe, tmp_path: Path, interface: InterfaceConfig, needle: str
) -> None:
    server = await serve(OciImds())
    provider = await started(server.url, rdma_host, tmp_path)
    try:
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(
                RDMA0, "claim-x", NetworkConfig(profile="oke-rdma", interface=interface)
            )
        assert err.value.code is ProfileErrorCode.INVALID
        assert needle in str(err.value) and "claim-x" in str(err.value) and RDMA0.name in str(err.value)
    finally:
        await provider.close()


@pytest.mark.root
@pytest.mark.netns
async def test_layout_mismatch_and_other_oca_modes(
    serve, rdma_host: HostProbe, netns: Netns, tmp_path: Path
) -> None:
    server = await serve(OciImds())
    # rdma1 holds an address the classic formula does not give it.
    netns.run("addr", "flush", "dev", "rdma1")
    netns.run("addr", "add", "10.225.0.99/12", "dev", "rdma1")
    provider = await started(server.url, rdma_host, tmp_path)
    try:
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(RDMA1, "c", PROFILE)
        assert "10.225.0.99" in str(err.value) and "10.225.0.25" in str(err.value)
        # Even rdma0, which matches, is refused until the whole host checks out.
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(RDMA0, "c", PROFILE)
        assert "classic IPv4 layout" in str(err.value)
    finally:
        await provider.close()

    oca = tmp_path / "oca"
    oca.mkdir()
    (oca / "rdma_features_enable.json").write_text(json.dumps({"host_serial_based_rdma_ips": True}))
    provider = await started(server.url, rdma_host, oca)
    try:
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(RDMA0, "c", PROFILE)
        assert "host-serial" in str(err.value)
    finally:
        await provider.close()


@pytest.mark.root
@pytest.mark.netns
async def test_ipv6_fabric_moves_nics_as_before(serve, rdma_host: HostProbe, tmp_path: Path) -> None:
    server = await serve(OciImds())
    server.host["rdmaFabricData"] = {"ipv6": True, "planes": 2}
    provider = await started(server.url, rdma_host, tmp_path)
    try:
        assert await provider.provider_config(RDMA0) is None
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(RDMA0, "c", PROFILE)
        assert "IPv6 RDMA fabric" in str(err.value)
    finally:
        await provider.close()


@pytest.mark.root
@pytest.mark.netns
async def test_vnic_metadata_arrives_later(serve, rdma_host: HostProbe, tmp_path: Path) -> None:
    """A failing /opc/v2/vnics/ does not hold start-up: attributes come at once, the
    profile says it is not ready, and the background retry completes the metadata."""
    server = await serve(OciImds(broken={"/opc/v2/vnics/": 500}))
    provider = await started(server.url, rdma_host, tmp_path)
    try:
        assert provider.ready
        assert "oke.dra.net/shape" in await provider.device_attributes(RDMA0)
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(RDMA0, "c", PROFILE)
        assert err.value.code is ProfileErrorCode.UNAVAILABLE and "primary VNIC" in str(err.value)
        server.broken.clear()
        await eventually(lambda: provider.state is not None and provider.state.primary_vnic is not None, 10.0)
        out = await provider.resolve_profile(RDMA0, "c", PROFILE)
        assert out.interface.addresses == ("10.208.0.25/12",)
    finally:
        await provider.close()


async def test_native_infiniband_nic_stays_on_the_host(serve, fake_host: FakeHost, tmp_path: Path) -> None:
    fake_host.rdma("mlx5_4", "0000:5e:00.0", link_layer="InfiniBand")
    fake_host.netdev("ibp94s0", pci="0000:5e:00.0", arphrd=32)
    server = await serve(OciImds())
    host = HostProbe(sysfs_root=str(fake_host.sys), procfs_root=str(fake_host.proc))
    provider = await started(server.url, host, tmp_path)
    try:
        ipoib = DeviceInfo(
            name="ibp94s0", ifname="ibp94s0", mac="00:00:10:29:fe:80", pci_address="0000:5e:00.0"
        )
        assert await provider.provider_config(ipoib) == NetworkConfig(profile="oke-rdma")
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(ipoib, "c", NetworkConfig(profile="oke-rdma"))
        assert "--move-ib-interfaces=false" in str(err.value)
        # RDMA-only (no netdev, no MAC) is fine in shared mode, refused in exclusive mode.
        rdma_only = DeviceInfo(
            name="pci-0000-5e-00-0", pci_address="0000:5e:00.0", rdma=True, rdma_device="mlx5_4"
        )
        assert await provider.provider_config(rdma_only) is None
        fake_host.netns_mode("0")
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(rdma_only, "c", NetworkConfig(profile="oke-rdma"))
        assert "exclusive" in str(err.value)
    finally:
        await provider.close()
