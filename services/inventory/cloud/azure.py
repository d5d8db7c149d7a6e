"""Microsoft Azure: the Instance Metadata Service (/metadata/instance, header
``Metadata: true``, an api-version on every call), node-level attributes under
azure.dra.net, and a provider config with policy routing per NIC: a rule from
the NIC's subnet and a default route via the subnet's first address in table
100 + the NIC's index in IMDS, plus the IPv6 equivalent through the host's IPv6
default gateway on that interface.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.inventory.cloud.base import DeviceInfo, Hint, ProviderError, string_attributes
from services.inventory.cloud.host import HostProbe
from services.inventory.cloud.metadata import DETECT_POLICY, HttpClient, RetryPolicy, json_str, probe_get
from services.inventory.cloud.provider import HttpMetadataProvider
from shared.deviceattr import Attribute
from shared.netconfig import NetworkConfig, RouteConfig, RuleConfig

log = logging.getLogger(__name__)

DEFAULT_URL = "http://169.254.169.254"
API_VERSION = "2025-11-11"
PREFIX = "azure.dra.net"
ATTR_PLACEMENT_GROUP_ID = f"{PREFIX}/placementGroupId"
ATTR_VM_SIZE = f"{PREFIX}/vmSize"
ATTR_INTERCONNECT_GROUP_ID = f"{PREFIX}/interconnectGroupId"
ATTR_INTERCONNECT_SUBGROUP_ID = f"{PREFIX}/interconnectSubgroupId"
ROUTING_TABLE_BASE = 100
_HEADERS = {"Metadata": "true"}


def normalize_mac(mac: str) -> str:
    """IMDS writes 000D3AF806EC, Linux 00:0d:3a:f8:06:ec: compare without separators or case."""
    return mac.replace(":", "").replace("-", "").lower()


def subnet_first_address(address: str, prefix: str) -> str:
    """The subnet's first usable address (Azure's gateway); ValueError when the pair
    is not an IPv4 network base, or the subnet has no room for it."""
    try:
        net = ipaddress.IPv4Network(f"{address}/{prefix}", strict=True)
    except ValueError as exc:
        raise ValueError(f"invalid IPv4 subnet {address}/{prefix}: {exc}") from None
    if net.num_addresses < 2:
        raise ValueError(f"subnet {address}/{prefix} has no room for a gateway")
    return str(net.network_address + 1)


@dataclass(frozen=True)
class AzureNic:
    mac: str
    ipv4_subnets: tuple[tuple[str, str], ...]  # (address, prefix) as IMDS writes them
    ipv6_addresses: tuple[str, ...]


@dataclass(frozen=True)
class AzureState:
    vm_size: str = ""
    placement_group_id: str = ""
    interconnect_group_id: str = ""
    interconnect_subgroup_id: str = ""
    nics: tuple[AzureNic, ...] = ()


def _obj(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def parse_network(raw: Any) -> tuple[AzureNic, ...]:
    """metadata/instance/network as AzureNic entries, in IMDS order (the order picks the table)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("interface", []), list):
        raise ProviderError("azure: network metadata: expected {'interface': [...]}")
    nics = []
    for item in raw.get("interface", []):
        if not isinstance(item, dict):
            raise ProviderError("azure: network metadata: interface entries must be objects")
        ipv4 = _obj(item, "ipv4")
        ipv6 = _obj(item, "ipv6")
        subnets = tuple(
            (json_str(s, "address"), json_str(s, "prefix"))
            for s in ipv4.get("subnet") or []
            if isinstance(s, dict)
        )
        v6 = tuple(
            json_str(a, "privateIpAddress") for a in ipv6.get("ipAddress") or [] if isinstance(a, dict)
        )
        nics.append(AzureNic(mac=json_str(item, "macAddress"), ipv4_subnets=subnets, ipv6_addresses=v6))
    return tuple(nics)


async def probe(base_url: str, policy: RetryPolicy = DETECT_POLICY) -> bool:
    """dranet's OnAzure: /metadata/instance answers 200 to a ``Metadata: true`` request."""
    return await probe_get(
        HttpClient("azure", base_url, headers=_HEADERS, policy=policy),
        "/metadata/instance",
        params={"api-version": API_VERSION, "format": "text"},
    )


class AzureProvider(HttpMetadataProvider[AzureState]):
    hint = Hint.AZURE

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        host: HostProbe | None = None,
        policy: RetryPolicy | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            HttpClient("azure", base_url, headers=_HEADERS, policy=policy), startup_timeout=startup_timeout
        )
        self.host = host or HostProbe()

    async def fetch(self) -> AzureState:
        params = {"api-version": API_VERSION, "format": "json"}
        compute = await self.client.get_json("/metadata/instance/compute", params=params)
        if not isinstance(compute, dict):
            raise ProviderError(
                f"azure: {self.client.shown('/metadata/instance/compute')}: expected an object"
            )
        nics: tuple[AzureNic, ...] = ()
        try:
            nics = parse_network(await self.client.get_json("/metadata/instance/network", params=params))
        except ProviderError as exc:
            # As dranet: without network metadata the node still gets its attributes.
            log.warning("azure network metadata not available", extra={"error": str(exc)})
        state = AzureState(
            vm_size=json_str(compute, "vmSize"),
            placement_group_id=json_str(compute, "placementGroupId"),
            interconnect_group_id=json_str(compute, "interconnectGroupId"),
            interconnect_subgroup_id=json_str(compute, "interconnectSubgroupId"),
            nics=nics,
        )
        log.info(
            "azure instance",
            extra={
                "vm_size": state.vm_size,
                "placement_group_id": state.placement_group_id,
                "nics": len(nics),
            },
        )
        return state

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        state = self.state
        if state is None:
            return {}
        return string_attributes(
            (
                (ATTR_VM_SIZE, state.vm_size),
                (ATTR_PLACEMENT_GROUP_ID, state.placement_group_id),
                (ATTR_INTERCONNECT_GROUP_ID, state.interconnect_group_id),
                (ATTR_INTERCONNECT_SUBGROUP_ID, state.interconnect_subgroup_id),
            )
        )

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        state = self.state
        if state is None or not device.mac:
            return None
        mac = normalize_mac(device.mac)
        found = next(((i, n) for i, n in enumerate(state.nics) if normalize_mac(n.mac) == mac), None)
        if found is None:
            return None
        index, nic = found
        table = ROUTING_TABLE_BASE + index
        rules: list[RuleConfig] = []
        routes: list[RouteConfig] = []
        if nic.ipv4_subnets:
            address, prefix = nic.ipv4_subnets[0]
            try:
                gateway = subnet_first_address(address, prefix)
            except ValueError as exc:
                log.warning(
                    "azure subnet has no usable gateway", extra={"device": device.name, "error": str(exc)}
                )
            else:
                rules.append(RuleConfig(source=f"{address}/{prefix}", table=table))
                routes.append(RouteConfig(destination="0.0.0.0/0", gateway=gateway, table=table))
        v6 = nic.ipv6_addresses[0] if nic.ipv6_addresses else ""
        if v6 and not _link_local(v6):
            gateway6 = await self._ipv6_gateway(device)
            if gateway6:
                rules.append(RuleConfig(source=f"{v6}/128", table=table))
                routes.append(RouteConfig(destination="::/0", gateway=gateway6, table=table))
        if not rules and not routes:
            return None
        return NetworkConfig(routes=tuple(routes), rules=tuple(rules))

    async def _ipv6_gateway(self, device: DeviceInfo) -> str | None:
        ifname = device.ifname or device.name
        try:
            return await self.host.ipv6_default_gateway(ifname)
        except Exception as exc:
            log.info("no ipv6 default gateway", extra={"device": device.name, "error": str(exc)})
            return None


def _link_local(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_link_local
    except ValueError:
        return True
