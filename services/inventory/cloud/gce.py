"""Google Compute Engine: the metadata server (computeMetadata/v1, header
``Metadata-Flavor: Google``), attributes under gce.dra.net keyed by MAC, and the
``gce-managed`` profile that gives IPvlan children addresses from the NIC's alias
range (IPv4) and a derived IPv6 range, with policy-based routing.
"""

from __future__ import annotations

import ipaddress
import logging
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from services.inventory.cloud.base import (
    DeviceInfo,
    Hint,
    ProfileError,
    ProfileErrorCode,
    ProfileProvider,
    ProviderError,
)
from services.inventory.cloud.ipam import IPAMError, IPRange, LeaseStore, range_from_cidr
from services.inventory.cloud.metadata import DETECT_POLICY, HttpClient, MetadataError, RetryPolicy, probe_get
from services.inventory.cloud.pbr import RT_SCOPE_LINK, SOURCE_ROUTING_RULE_PRIORITY, table_for_name
from services.inventory.cloud.provider import HttpMetadataProvider
from shared.deviceattr import Attribute
from shared.netconfig import InterfaceConfig, InterfaceType, NetworkConfig, RouteConfig, RuleConfig

log = logging.getLogger(__name__)

DEFAULT_URL = "http://169.254.169.254"
PREFIX = "gce.dra.net"
ATTR_BLOCK = f"{PREFIX}/block"
ATTR_SUB_BLOCK = f"{PREFIX}/subBlock"
ATTR_HOST = f"{PREFIX}/host"
ATTR_NETWORK_NAME = f"{PREFIX}/networkName"
ATTR_NETWORK_PROJECT_NUMBER = f"{PREFIX}/networkProjectNumber"
ATTR_IP_ALIASES = f"{PREFIX}/ipAliases"
ATTR_MACHINE_TYPE = f"{PREFIX}/machineType"

# Advertised on every device so claim-scoped resolution always runs on GCE; it
# only does something when the claim asks for an IPvlan child.
MANAGED_PROFILE = "gce-managed"
# Appended after the NIC's IPv6 prefix to carve the range children draw from.
_IPV6_WORKER_MARKER = 0xC0DE
_NETWORK = re.compile(r"^projects/(\d+)/networks/(\S+)$")
_HEADERS = {"Metadata-Flavor": "Google"}
_V1 = "/computeMetadata/v1"


def default_url(env: Mapping[str, str]) -> str:
    """GCE_METADATA_HOST (the variable Google's client libraries honour) or the link-local IP."""
    host = env.get("GCE_METADATA_HOST", "")
    return f"http://{host}" if host else DEFAULT_URL


@dataclass(frozen=True)
class GceNic:
    """One entry of instance/network-interfaces (the fields dranet reads)."""

    mac: str = ""
    ip: str = ""
    ipv6: tuple[str, ...] = ()
    mtu: int = 0
    network: str = ""
    ip_aliases: tuple[str, ...] = ()
    gateway: str = ""
    gateway_ipv6: str = ""
    nic_type: str = ""


@dataclass(frozen=True)
class GceState:
    name: str
    machine_type: str
    nics: tuple[GceNic, ...]
    topology: str = ""


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProviderError(f"gce: {where}.{key}: expected a string, got {value!r}")
    return value


def _strs(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ProviderError(f"gce: {where}.{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def parse_nics(raw: Any) -> tuple[GceNic, ...]:
    """instance/network-interfaces/?recursive=true as GceNic entries; unknown keys
    are ignored, wrong types are a ProviderError naming the field."""
    if not isinstance(raw, list):
        raise ProviderError(f"gce: network-interfaces: expected a list, got {type(raw).__name__}")
    nics = []
    for i, item in enumerate(raw):
        where = f"network-interfaces[{i}]"
        if not isinstance(item, dict):
            raise ProviderError(f"gce: {where}: expected an object")
        mtu = item.get("mtu", 0)
        if not isinstance(mtu, int) or isinstance(mtu, bool):
            raise ProviderError(f"gce: {where}.mtu: expected an integer, got {mtu!r}")
        nics.append(
            GceNic(
                mac=_str(item, "mac", where).lower(),
                ip=_str(item, "ip", where),
                ipv6=_strs(item, "ipv6", where),
                mtu=mtu,
                network=_str(item, "network", where),
                ip_aliases=_strs(item, "ipAliases", where),
                gateway=_str(item, "gateway", where),
                gateway_ipv6=_str(item, "gatewayIpv6", where),
                nic_type=_str(item, "nicType", where),
            )
        )
    return tuple(nics)


def ipv6_child_range(base_cidr: str) -> str:
    """The IPv6 range children draw from: the NIC's prefix rounded up to whole
    16-bit groups, followed by the group 0xC0DE (dranet's getIPv6Range)."""
    try:
        net = ipaddress.IPv6Network(base_cidr, strict=False)
    except ValueError as exc:
        raise ValueError(f"invalid IPv6 CIDR {base_cidr!r}: {exc}") from None
    base_bytes = (net.prefixlen + 15) // 16 * 2
    if base_bytes >= 14:
        raise ValueError(f"prefix length {net.prefixlen} of {base_cidr} leaves no room for the C0DE group")
    packed = bytearray(16)
    packed[:base_bytes] = net.network_address.packed[:base_bytes]
    packed[base_bytes] = _IPV6_WORKER_MARKER >> 8
    packed[base_bytes + 1] = _IPV6_WORKER_MARKER & 0xFF
    return f"{ipaddress.IPv6Address(bytes(packed))}/{(base_bytes + 2) * 8}"


def source_routing(nic: GceNic, config: NetworkConfig, allocated: tuple[str, ...]) -> NetworkConfig:
    """The profile output: allocated addresses plus PBR (a per-NIC table with an
    on-link route to the gateway and a default route, one source rule per address).
    When the config already has routes, rules or a VRF, routing is the user's."""
    out = NetworkConfig(interface=InterfaceConfig(addresses=allocated))
    if config.routes or config.rules or config.interface.vrf is not None:
        return out
    addrs = allocated or config.interface.addresses
    gateways: dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for text in (nic.gateway, nic.gateway_ipv6):
        try:
            gw = ipaddress.ip_address(text)
        except ValueError:
            continue
        gateways.setdefault(gw.version, gw)
    table = table_for_name(nic.mac)
    routes: list[RouteConfig] = []
    rules: list[RuleConfig] = []
    families_routed: set[int] = set()
    for text in addrs:
        try:
            ip = ipaddress.ip_interface(text).ip
        except ValueError:
            continue
        via = gateways.get(ip.version)
        if via is None:
            continue
        if ip.version not in families_routed:
            default = "0.0.0.0/0" if ip.version == 4 else "::/0"
            routes.append(
                RouteConfig(destination=f"{via}/{via.max_prefixlen}", scope=RT_SCOPE_LINK, table=table)
            )
            routes.append(RouteConfig(destination=default, gateway=str(via), table=table))
            families_routed.add(ip.version)
        rules.append(
            RuleConfig(priority=SOURCE_ROUTING_RULE_PRIORITY, source=f"{ip}/{ip.max_prefixlen}", table=table)
        )
    return replace(out, routes=tuple(routes), rules=tuple(rules))


async def probe(base_url: str, policy: RetryPolicy = DETECT_POLICY) -> bool:
    """dranet uses metadata.OnGCE: the metadata IP answers with ``Metadata-Flavor: Google``."""
    return await probe_get(
        HttpClient("gce", base_url, headers=_HEADERS, policy=policy),
        "/",
        ok_statuses=frozenset(range(100, 600)),
        accept=lambda resp: resp.header("Metadata-Flavor") == "Google",
    )


class GceProvider(HttpMetadataProvider[GceState], ProfileProvider):
    hint = Hint.GCE

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        policy: RetryPolicy | None = None,
        startup_timeout: float = 10.0,
        leases: LeaseStore | None = None,
    ) -> None:
        super().__init__(
            HttpClient("gce", base_url, headers=_HEADERS, policy=policy), startup_timeout=startup_timeout
        )
        self.leases = leases or LeaseStore()

    async def fetch(self) -> GceState:
        name = (await self.client.get_text(f"{_V1}/instance/name")).strip()
        # "projects/<number>/machineTypes/<type>": only the type matters.
        machine_type = posixpath.basename(
            (await self.client.get_text(f"{_V1}/instance/machine-type")).strip()
        )
        nics = parse_nics(
            await self.client.get_json(
                f"{_V1}/instance/network-interfaces/", params={"recursive": "true", "alt": "json"}
            )
        )
        topology = ""
        try:
            topology = (await self.client.get_text(f"{_V1}/instance/attributes/physical_host")).strip()
        except MetadataError as exc:
            # Not every VM has a physical host attribute; a 404 here is normal.
            log.info("gce physical_host not available", extra={"error": str(exc)})
        return GceState(name=name, machine_type=machine_type, nics=nics, topology=topology)

    def _nic(self, mac: str) -> GceNic | None:
        state = self.state
        if state is None or not mac:
            return None
        mac = mac.lower()
        return next((n for n in state.nics if n.mac == mac), None)

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        state = self.state
        if state is None:
            return {}
        attrs: dict[str, Attribute] = {ATTR_MACHINE_TYPE: Attribute.of_string(state.machine_type)}
        if state.topology:
            parts = state.topology.lstrip("/").split("/", 2)
            if len(parts) == 3:
                attrs[ATTR_BLOCK] = Attribute.of_string(parts[0])
                attrs[ATTR_SUB_BLOCK] = Attribute.of_string(parts[1])
                attrs[ATTR_HOST] = Attribute.of_string(parts[2])
            else:
                log.warning("cannot parse gce host topology", extra={"topology": state.topology})
        nic = self._nic(device.mac)
        if nic is None:
            return attrs
        if nic.ip_aliases:
            attrs[ATTR_IP_ALIASES] = Attribute.of_string(",".join(nic.ip_aliases))
        m = _NETWORK.match(nic.network)
        if m is None:
            # dranet publishes no cloud attribute at all for such a device.
            log.warning("cannot parse gce network", extra={"device": device.name, "network": nic.network})
            return {}
        attrs[ATTR_NETWORK_NAME] = Attribute.of_string(m.group(2))
        attrs[ATTR_NETWORK_PROJECT_NUMBER] = Attribute.of_int(int(m.group(1)))
        return attrs

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        return NetworkConfig(profile=MANAGED_PROFILE)

    def _ranges(self, nic: GceNic) -> list[IPRange]:
        ranges: list[IPRange] = []
        if nic.ipv6:
            ranges.append(range_from_cidr(ipv6_child_range(nic.ipv6[0])))
        if nic.ip_aliases:
            ranges.append(range_from_cidr(nic.ip_aliases[0]))
        return ranges

    async def resolve_profile(
        self, device: DeviceInfo, claim_uid: str, config: NetworkConfig
    ) -> NetworkConfig:
        where = f"gce profile {config.profile!r} for device {device.name} claim {claim_uid}"
        if config.profile != MANAGED_PROFILE:
            raise ProfileError(
                f"{where}: unknown profile (GCE offers {MANAGED_PROFILE!r})", ProfileErrorCode.NOT_FOUND
            )
        if self.state is None:
            raise ProfileError(f"{where}: GCE metadata not loaded yet ({self.last_error or 'loading'})")
        nic = self._nic(device.mac)
        if nic is None or config.interface.effective_type is not InterfaceType.IPVLAN:
            # Nothing dynamic to manage: passthrough keeps the host's addresses.
            return NetworkConfig()
        key = LeaseStore.key(device.name, claim_uid)
        try:
            if config.interface.addresses:
                await self.leases.reserve(key, config.interface.addresses)
                return source_routing(nic, config, ())
            ranges = self._ranges(nic)
            if not ranges:
                raise ProfileError(
                    f"{where}: NIC {nic.mac} has no alias range or IPv6 range in GCE metadata to give an IPvlan"
                    " child an address; set interface.addresses",
                    ProfileErrorCode.INVALID,
                )
            allocated = await self.leases.allocate(key, ranges)
        except IPAMError as exc:
            raise ProfileError(f"{where}: {exc}", ProfileErrorCode.CONFLICT) from None
        except ValueError as exc:
            raise ProfileError(f"{where}: {exc}", ProfileErrorCode.INVALID) from None
        return source_routing(nic, config, allocated)

    async def release_profile(self, device: DeviceInfo, claim_uid: str, config: NetworkConfig) -> None:
        try:
            freed = await self.leases.release(LeaseStore.key(device.name, claim_uid))
        except IPAMError as exc:
            raise ProfileError(
                f"gce profile release for device {device.name} claim {claim_uid}: {exc}"
            ) from None
        if freed:
            log.info(
                "released gce addresses",
                extra={"device": device.name, "claim": claim_uid, "addresses": freed},
            )
