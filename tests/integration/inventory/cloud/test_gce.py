"""GCE provider against a local metadata server answering like computeMetadata/v1."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from services.inventory.cloud import gce
from services.inventory.cloud.base import DeviceInfo, ProfileError, ProfileErrorCode, Providers
from services.inventory.cloud.ipam import LeaseStore
from services.inventory.cloud.metadata import RetryPolicy
from services.inventory.cloud.pbr import table_for_name
from shared.deviceattr import Attribute
from shared.netconfig import InterfaceConfig, InterfaceType, NetworkConfig, RouteConfig
from shared.netconfig.merge import merge
from shared.netconfig.validate import finalize
from tests.integration.inventory.cloud.fakes import AwsImds, GceMetadata

NIC0 = DeviceInfo(name="eth0", ifname="eth0", mac="42:01:0a:80:00:46", pci_address="0000:00:04.0")
NIC2 = DeviceInfo(name="eth2", ifname="eth2", mac="42:01:c0:a8:02:02", pci_address="0000:00:06.0")
FAST = RetryPolicy(request_timeout=1.0, deadline=3.0, initial_backoff=0.05)
IPVLAN = NetworkConfig(profile=gce.MANAGED_PROFILE, interface=InterfaceConfig(type=InterfaceType.IPVLAN))


async def started(url: str, tmp_path: Path | None = None) -> gce.GceProvider:
    leases = LeaseStore(str(tmp_path / "leases.json")) if tmp_path else LeaseStore()
    provider = gce.GceProvider(url, policy=FAST, startup_timeout=5.0, leases=leases)
    await provider.start()
    assert provider.ready, provider.last_error
    return provider


async def test_probe_needs_the_google_flavor_header(serve) -> None:
    real = await serve(GceMetadata())
    other = await serve(AwsImds())
    assert await gce.probe(real.url)
    assert not await gce.probe(other.url)


async def test_attributes_by_mac(serve) -> None:
    server = await serve(GceMetadata())
    provider = await started(server.url)
    try:
        attrs = await provider.device_attributes(NIC0)
        assert attrs == {
            "gce.dra.net/machineType": Attribute.of_string("a3-highgpu-8g"),
            "gce.dra.net/block": Attribute.of_string("CCCCCCC"),
            "gce.dra.net/subBlock": Attribute.of_string("BBBBBB"),
            "gce.dra.net/host": Attribute.of_string("AAAA"),
            "gce.dra.net/ipAliases": Attribute.of_string("10.24.3.0/24"),
            "gce.dra.net/networkName": Attribute.of_string("default"),
            "gce.dra.net/networkProjectNumber": Attribute.of_int(628944397724),
        }
        # Upper-case MAC from a different source still matches.
        upper = DeviceInfo(name="eth1", ifname="eth1", mac="42:01:C0:A8:01:02")
        attrs = await provider.device_attributes(upper)
        assert attrs["gce.dra.net/networkName"] == Attribute.of_string("aojea-dra-net-1")
        assert "gce.dra.net/ipAliases" not in attrs
        # A device the metadata does not know gets only the node-level attributes.
        veth = await provider.device_attributes(
            DeviceInfo(name="veth0", ifname="veth0", mac="ee:ee:ee:00:00:01")
        )
        assert set(veth) == {
            "gce.dra.net/machineType",
            "gce.dra.net/block",
            "gce.dra.net/subBlock",
            "gce.dra.net/host",
        }
    finally:
        await provider.close()
    v1 = [r for r in server.requests if r.path.startswith("/computeMetadata/v1/")]
    assert v1 and all(r.headers.get("Metadata-Flavor") == "Google" for r in v1)
    nics = [r for r in v1 if r.path.endswith("network-interfaces/")]
    assert nics[0].query == {"recursive": "true", "alt": "json"}


async def test_missing_physical_host_and_unparsable_network(serve) -> None:
    server = await serve(GceMetadata(physical_host=None))
    server.nics[1]["network"] = "global/networks/odd"
    provider = await started(server.url)
    try:
        attrs = await provider.device_attributes(NIC0)
        assert "gce.dra.net/block" not in attrs
        assert attrs["gce.dra.net/networkName"] == Attribute.of_string("default")
        # dranet publishes no cloud attribute for a NIC whose network it cannot parse.
        assert await provider.device_attributes(DeviceInfo(name="eth1", mac="42:01:c0:a8:01:02")) == {}
    finally:
        await provider.close()


async def test_retries_until_the_server_answers(serve) -> None:
    server = await serve(GceMetadata(fail_next=3))
    provider = await started(server.url)
    await provider.close()
    assert server.paths().count("/computeMetadata/v1/instance/name") == 4


async def test_advertises_gce_managed_and_drops_it_without_profile_provider(serve) -> None:
    server = await serve(GceMetadata())
    provider = await started(server.url)
    try:
        assert await provider.provider_config(NIC0) == NetworkConfig(profile="gce-managed")
        with_profiles = Providers(hint=provider.hint, cloud=provider, profiles=provider)
        without = Providers(hint=provider.hint, cloud=provider, profiles=None)
        assert (await with_profiles.provider_config(NIC0)) == NetworkConfig(profile="gce-managed")
        assert (await without.provider_config(NIC0)) is None
    finally:
        await provider.close()


async def test_ipvlan_profile_allocates_from_the_alias_range_with_source_routing(
    serve, tmp_path: Path
) -> None:
    server = await serve(GceMetadata())
    provider = await started(server.url, tmp_path)
    try:
        # Passthrough keeps the host's addresses: nothing to add.
        assert (
            await provider.resolve_profile(NIC0, "claim-a", NetworkConfig(profile="gce-managed"))
            == NetworkConfig()
        )

        out = await provider.resolve_profile(NIC0, "claim-a", IPVLAN)
        (addr,) = out.interface.addresses
        assert ipaddress.ip_interface(addr).network.prefixlen == 32
        ip = ipaddress.ip_interface(addr).ip
        assert ip in ipaddress.ip_network("10.24.3.0/24") and ip not in (
            ipaddress.ip_address("10.24.3.0"),
            ipaddress.ip_address("10.24.3.255"),
        )
        table = table_for_name("42:01:0a:80:00:46")
        assert [(r.destination, r.gateway, r.scope, r.table) for r in out.routes] == [
            ("10.128.0.1/32", "", 253, table),
            ("0.0.0.0/0", "10.128.0.1", 0, table),
        ]
        assert [(r.source, r.table, r.priority) for r in out.rules] == [(f"{ip}/32", table, 32000)]
        # The pipeline's step 3 and 4 accept it.
        final = finalize(merge(IPVLAN, out))
        assert final.interface.addresses == (addr,)

        # A retried prepare gets the same address; another claim gets another one.
        assert await provider.resolve_profile(NIC0, "claim-a", IPVLAN) == out
        other = await provider.resolve_profile(NIC0, "claim-b", IPVLAN)
        assert other.interface.addresses != out.interface.addresses
    finally:
        await provider.close()

    # Restart: the leases are on disk, so claim-a keeps its address and nobody else gets it.
    restarted = await started(server.url, tmp_path)
    try:
        assert await restarted.resolve_profile(NIC0, "claim-a", IPVLAN) == out
        await restarted.release_profile(NIC0, "claim-a", IPVLAN)
        await restarted.release_profile(NIC0, "claim-a", IPVLAN)  # idempotent
        assert await restarted.leases.get(LeaseStore.key("eth0", "claim-a")) is None
        assert await restarted.leases.get(LeaseStore.key("eth0", "claim-b")) == other.interface.addresses
    finally:
        await restarted.close()


async def test_ipv6_nic_gets_an_address_from_the_c0de_range(serve) -> None:
    server = await serve(GceMetadata())
    provider = await started(server.url)
    try:
        out = await provider.resolve_profile(NIC2, "claim-6", IPVLAN)
        (addr,) = out.interface.addresses
        ip = ipaddress.ip_interface(addr)
        assert ip.network.prefixlen == 128
        assert ip.ip in ipaddress.ip_network("2600:1900:4000:318:0:6:c0de:0/112")
        table = table_for_name("42:01:c0:a8:02:02")
        assert [(r.destination, r.gateway, r.table) for r in out.routes] == [
            ("fe80::1/128", "", table),
            ("::/0", "fe80::1", table),
        ]
        assert [r.source for r in out.rules] == [f"{ip.ip}/128"]
    finally:
        await provider.close()


async def test_static_addresses_are_reserved_and_conflicts_named(serve) -> None:
    server = await serve(GceMetadata())
    provider = await started(server.url)
    try:
        static = NetworkConfig(
            profile="gce-managed",
            interface=InterfaceConfig(type=InterfaceType.IPVLAN, addresses=("10.24.3.77/24",)),
        )
        out = await provider.resolve_profile(NIC0, "claim-s", static)
        assert out.interface.addresses == ()
        assert [r.source for r in out.rules] == ["10.24.3.77/32"]
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(NIC0, "claim-t", static)
        assert err.value.code is ProfileErrorCode.CONFLICT
        assert "10.24.3.77" in str(err.value) and "claim-t" in str(err.value)
        # A claim that brings its own routes owns routing: only addresses come back.
        owned = NetworkConfig(
            profile="gce-managed",
            interface=InterfaceConfig(type=InterfaceType.IPVLAN),
            routes=(RouteConfig(destination="0.0.0.0/0", gateway="10.24.3.1"),),
        )
        out = await provider.resolve_profile(NIC0, "claim-u", owned)
        assert out.routes == () and out.rules == () and len(out.interface.addresses) == 1
    finally:
        await provider.close()


async def test_unknown_profile_and_no_range(serve) -> None:
    server = await serve(GceMetadata())
    provider = await started(server.url)
    try:
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(NIC0, "c", NetworkConfig(profile="nope"))
        assert err.value.code is ProfileErrorCode.NOT_FOUND and "'nope'" in str(err.value)
        nic1 = DeviceInfo(name="eth1", ifname="eth1", mac="42:01:c0:a8:01:02")
        with pytest.raises(ProfileError) as err:
            await provider.resolve_profile(nic1, "c", IPVLAN)
        assert err.value.code is ProfileErrorCode.INVALID and "interface.addresses" in str(err.value)
    finally:
        await provider.close()
