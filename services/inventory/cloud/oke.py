"""Oracle Cloud (OKE): the instance metadata service v2 (/opc/v2/, header
``Authorization: Bearer Oracle``), node-level topology attributes under
oke.dra.net, and the ``oke-rdma`` profile.

On OKE the Oracle Cloud Agent (OCA) gives each Ethernet RDMA NIC (rdmaN) an
address and host routes; moving the NIC into a pod would lose that host state.
So the provider advertises ``oke-rdma`` with interface.type IPVLAN for those NICs
and resolves it into an IPvlan child with a deterministic address:

  parent = OCA network + nicIndex * primarySubnetSize + (primaryIP - primarySubnet)   (OCA "classic" mode)
  child  = child network + (parent - OCA network)

so rdma0 at 10.224.0.25/12 gets a child 10.208.0.25/12, with an on-link route to
the child network in table 100 + nicIndex and a source rule for the child. The
primary VNIC comes from /opc/v2/vnics/ (its first entry). The OCA network and
address mode come from OCA's optional files; without the mode file the whole
host's layout is checked once before the formula is trusted.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
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
    string_attributes,
)
from services.inventory.cloud.host import ARPHRD_ETHER, HostProbe
from services.inventory.cloud.metadata import DETECT_POLICY, HttpClient, RetryPolicy, json_str, probe_get
from services.inventory.cloud.pbr import RT_SCOPE_LINK, SOURCE_ROUTING_RULE_PRIORITY
from services.inventory.cloud.provider import HttpMetadataProvider, PartialMetadata
from shared.deviceattr import Attribute
from shared.netconfig import (
    Addressing,
    InterfaceConfig,
    InterfaceType,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
)

log = logging.getLogger(__name__)

DEFAULT_URL = "http://169.254.169.254"
_HEADERS = {"Authorization": "Bearer Oracle"}
PREFIX = "oke.dra.net"
ATTR_HPC_ISLAND_ID = f"{PREFIX}/hpcIslandId"
ATTR_NETWORK_BLOCK_ID = f"{PREFIX}/networkBlockId"
ATTR_LOCAL_BLOCK_ID = f"{PREFIX}/localBlockId"
ATTR_RACK_ID = f"{PREFIX}/rackId"
ATTR_GPU_MEMORY_FABRIC = f"{PREFIX}/gpuMemoryFabricId"
ATTR_SHAPE = f"{PREFIX}/shape"
ATTR_RDMA_FABRIC_IPV6 = f"{PREFIX}/rdmaFabricIpv6"
ATTR_RDMA_FABRIC_PLANES = f"{PREFIX}/rdmaFabricPlanes"

PROFILE = "oke-rdma"
SBR_TABLE_BASE = 100
# The most RDMA NICs of an OKE shape on an IPv4 fabric; keeps tables in 100..115.
MAX_IPV4_RDMA_NICS = 16
DEFAULT_PARENT_CIDR = "10.224.0.0/12"
# One child per parent at the parent's offset; a /12 avoids the OCA network and
# the OKE pod CIDR 10.240.0.0/12.
CHILD_CIDR = "10.208.0.0/12"
DEFAULT_OCA_CONFIG_DIR = "/etc/oracle-cloud-agent/plugins/oci-hpc/oci-hpc-configure"
OCA_NETWORK_FILE = "rdma_network.json"
OCA_FEATURES_FILE = "rdma_features_enable.json"
MODE_CLASSIC = "classic"
MODE_HOST_SERIAL = "host-serial"
MODE_TOPOLOGY = "topology"
REFRESH_INTERVAL = 300.0
OCID_SUFFIX_LEN = 60  # DRA string attributes hold 64 bytes; OCIDs are ~90

_RDMA_NAME = re.compile(r"^rdma(\d+)$")


def ocid_suffix(ocid: str) -> str:
    """The unique tail of an OCID (after the last '.', at most 60 characters);
    "" for "". ValueError for something that is not an OCID."""
    if not ocid:
        return ""
    if "ocid" not in ocid:
        raise ValueError(f"not a valid OCID (missing 'ocid' prefix): {ocid!r}")
    if "." not in ocid:
        raise ValueError(f"not a valid OCID (missing '.' separator): {ocid!r}")
    return ocid.rsplit(".", 1)[1][-OCID_SUFFIX_LEN:]


def rdma_nic_index(ifname: str) -> int | None:
    """The index OCA encodes in an rdmaN name."""
    m = _RDMA_NAME.match(ifname)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Fabric:
    ipv6: bool
    planes: int


@dataclass(frozen=True)
class PrimaryVnic:
    ip: ipaddress.IPv4Address
    subnet: ipaddress.IPv4Network


@dataclass(frozen=True)
class OkeState:
    hpc_island_id: str = ""
    network_block_id: str = ""
    local_block_id: str = ""
    rack_id: str = ""
    gpu_memory_fabric: str = ""
    shape: str = ""
    fabric: Fabric | None = None
    primary_vnic: PrimaryVnic | None = None

    def merged_over(self, old: OkeState | None) -> OkeState:
        """Fields this read left empty keep their last known values."""
        if old is None:
            return self
        return OkeState(
            hpc_island_id=self.hpc_island_id or old.hpc_island_id,
            network_block_id=self.network_block_id or old.network_block_id,
            local_block_id=self.local_block_id or old.local_block_id,
            rack_id=self.rack_id or old.rack_id,
            gpu_memory_fabric=self.gpu_memory_fabric or old.gpu_memory_fabric,
            shape=self.shape or old.shape,
            fabric=self.fabric or old.fabric,
            primary_vnic=self.primary_vnic or old.primary_vnic,
        )


@dataclass(frozen=True)
class OcaConfig:
    parent_range: ipaddress.IPv4Network
    mode: str = ""  # "" when the features file was not read


def parse_host(raw: Any) -> OkeState:
    """/opc/v2/host/ into the topology fields. A malformed OCID leaves its field
    empty (the merge keeps the last good value)."""
    if not isinstance(raw, dict):
        raise ProviderError("oke: /opc/v2/host/: expected an object")
    fabric = None
    data = raw.get("rdmaFabricData")
    if isinstance(data, dict):
        ipv6, planes = data.get("ipv6"), data.get("planes")
        if isinstance(ipv6, bool) and isinstance(planes, int) and not isinstance(planes, bool):
            fabric = Fabric(ipv6=ipv6, planes=planes)
        else:
            log.info("ignoring incomplete rdmaFabricData", extra={"rdma_fabric_data": data})
    state = OkeState(
        network_block_id=json_str(raw, "networkBlockId"), rack_id=json_str(raw, "rackId"), fabric=fabric
    )
    topo = raw.get("rdmaTopologyData")
    if not isinstance(topo, dict):
        return state

    def suffix(name: str, key: str) -> str:
        try:
            return ocid_suffix(json_str(topo, key))
        except ValueError as exc:
            log.warning("ignoring invalid OCID from OCI metadata", extra={"field": name, "error": str(exc)})
            return ""

    return replace(
        state,
        hpc_island_id=suffix("HPCIslandId", "customerHPCIslandId"),
        network_block_id=suffix("NetworkBlockId", "customerNetworkBlock"),
        local_block_id=suffix("LocalBlockId", "customerLocalBlock"),
        gpu_memory_fabric=suffix("GpuMemoryFabric", "customerGpuMemoryFabric"),
    )


def parse_primary_vnic(raw: Any) -> PrimaryVnic | None:
    """The first /opc/v2/vnics/ entry (the primary VNIC, the one OCA reads); None
    while it has no IPv4 address."""
    if not isinstance(raw, list) or not raw:
        raise ProviderError("oke: /opc/v2/vnics/: expected a non-empty list")
    first = raw[0]
    if not isinstance(first, dict):
        raise ProviderError("oke: /opc/v2/vnics/[0]: expected an object")
    ip_text, subnet_text = json_str(first, "privateIp"), json_str(first, "subnetCidrBlock")
    if not ip_text:
        return None
    try:
        ip = ipaddress.ip_address(ip_text)
    except ValueError:
        raise ProviderError(f"oke: primary VNIC address {ip_text!r} is not an IP address") from None
    if not isinstance(ip, ipaddress.IPv4Address):
        return None
    if not subnet_text:
        raise ProviderError("oke: /opc/v2/vnics/[0] has no subnetCidrBlock")
    try:
        subnet = ipaddress.ip_network(subnet_text, strict=False)
    except ValueError:
        raise ProviderError(f"oke: primary VNIC subnet {subnet_text!r} is not a CIDR") from None
    if not isinstance(subnet, ipaddress.IPv4Network):
        return None
    return PrimaryVnic(ip=ip, subnet=subnet)


def load_oca_config(directory: str) -> OcaConfig:
    """OCA's rdma_network.json (rdma-network[0].default-settings.rdma_network) and
    rdma_features_enable.json (address mode). Missing or unusable files keep the
    defaults: a wrong guess only fails claims through the parent address check."""
    parent = ipaddress.IPv4Network(DEFAULT_PARENT_CIDR)
    mode = ""
    path = os.path.join(directory, OCA_NETWORK_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        value = raw["rdma-network"][0]["default-settings"]["rdma_network"]
        net = ipaddress.ip_network(value, strict=True)
        if not isinstance(net, ipaddress.IPv4Network):
            raise ValueError(f"rdma_network {value!r} is not IPv4")
        parent = net
        log.info("using OCA RDMA network", extra={"network": str(net), "file": path})
    except FileNotFoundError:
        log.debug("OCA RDMA network file absent", extra={"file": path})
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        log.warning("cannot use OCA RDMA network file", extra={"file": path, "error": str(exc)})
    path = os.path.join(directory, OCA_FEATURES_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError("expected an object")
        if raw.get("host_serial_based_rdma_ips") is True:
            mode = MODE_HOST_SERIAL
        elif raw.get("ipv4_topology_based_rdma_ips") is True:
            mode = MODE_TOPOLOGY
        else:
            mode = MODE_CLASSIC
    except FileNotFoundError:
        log.debug("OCA RDMA features file absent", extra={"file": path})
    except (OSError, ValueError) as exc:
        log.warning("cannot use OCA RDMA features file", extra={"file": path, "error": str(exc)})
    return OcaConfig(parent_range=parent, mode=mode)


def derive_parent(
    vnic: PrimaryVnic, index: int, parent_range: ipaddress.IPv4Network
) -> tuple[ipaddress.IPv4Address, int]:
    """OCA classic mode's address for RDMA NIC ``index`` and its offset in the OCA network."""
    if vnic.ip not in vnic.subnet:
        raise ValueError(f"primary VNIC address {vnic.ip} is outside its subnet {vnic.subnet}")
    if vnic.subnet.overlaps(parent_range):
        raise ValueError(f"primary VNIC subnet {vnic.subnet} overlaps the OCA RDMA network {parent_range}")
    offset = index * vnic.subnet.num_addresses + (int(vnic.ip) - int(vnic.subnet.network_address))
    if offset >= parent_range.num_addresses:
        raise ValueError(
            f"RDMA NIC index {index} with a /{vnic.subnet.prefixlen} primary VNIC subnet is outside"
            f" the OCA RDMA network {parent_range}"
        )
    return parent_range.network_address + offset, offset


def derive_addresses(
    vnic: PrimaryVnic, index: int, parent_range: ipaddress.IPv4Network
) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    """(OCA parent address, child address) of RDMA NIC ``index``."""
    if index >= MAX_IPV4_RDMA_NICS:
        raise ValueError(
            f"RDMA NIC index {index} is above the largest supported index {MAX_IPV4_RDMA_NICS - 1}"
        )
    child_range = ipaddress.IPv4Network(CHILD_CIDR)
    parent, offset = derive_parent(vnic, index, parent_range)
    if parent_range.overlaps(child_range):
        raise ValueError(f"OCA RDMA network {parent_range} overlaps the child range {child_range}")
    if vnic.subnet.overlaps(child_range):
        raise ValueError(f"primary VNIC subnet {vnic.subnet} overlaps the child range {child_range}")
    if offset >= child_range.num_addresses:
        raise ValueError(f"RDMA NIC index {index} falls outside the child range {child_range}")
    return parent, child_range.network_address + offset


def index_from_address(
    vnic: PrimaryVnic, address: ipaddress.IPv4Address, parent_range: ipaddress.IPv4Network
) -> int:
    """Invert the classic formula for an RDMA NIC without an rdmaN name."""
    if address not in parent_range:
        raise ValueError(f"address {address} is outside the OCA RDMA network {parent_range}")
    block = vnic.subnet.num_addresses
    position = int(vnic.ip) - int(vnic.subnet.network_address)
    offset = int(address) - int(parent_range.network_address)
    if offset % block != position:
        raise ValueError(
            f"address {address} does not match the primary VNIC position {position} in a /{vnic.subnet.prefixlen}"
        )
    return offset // block


async def probe(base_url: str, policy: RetryPolicy = DETECT_POLICY) -> bool:
    """dranet's OnOKE: /opc/v2/instance/ answers 200 to ``Authorization: Bearer Oracle``."""
    return await probe_get(HttpClient("oke", base_url, headers=_HEADERS, policy=policy), "/opc/v2/instance/")


class OkeProvider(HttpMetadataProvider[OkeState], ProfileProvider):
    hint = Hint.OKE

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        host: HostProbe | None = None,
        policy: RetryPolicy | None = None,
        startup_timeout: float = 10.0,
        oca_config_dir: str = DEFAULT_OCA_CONFIG_DIR,
        refresh_interval: float = REFRESH_INTERVAL,
    ) -> None:
        super().__init__(
            HttpClient("oke", base_url, headers=_HEADERS, policy=policy),
            startup_timeout=startup_timeout,
            refresh_interval=refresh_interval,
        )
        self.host = host or HostProbe()
        self.oca = load_oca_config(oca_config_dir)
        # Identify RDMA NICs by their OCA address only on nodes without rdmaN names.
        self.address_fallback = not self._has_named_rdma_nic()
        self._layout_validated = False

    def _has_named_rdma_nic(self) -> bool:
        return any(
            rdma_nic_index(n) is not None and self.host.interface_type(n) == ARPHRD_ETHER
            for n in self.host.interfaces()
        )

    async def _oca_address(self, ifname: str) -> ipaddress.IPv4Address | None:
        for iface in await self.host.ipv4_addresses(ifname):
            if iface.ip in self.oca.parent_range:
                return iface.ip
        return None

    async def is_rdma_nic(self, ifname: str) -> bool:
        """An Ethernet RDMA NIC: rdmaN, or (on nodes without such names) a NIC holding
        an OCA address. VCN NICs are Mellanox too, so hardware alone cannot tell."""
        if self.host.interface_type(ifname) != ARPHRD_ETHER:
            return False
        if rdma_nic_index(ifname) is not None:
            return True
        if not self.address_fallback:
            return False
        try:
            return await self._oca_address(ifname) is not None
        except ValueError:
            return False

    async def _has_rdma_nic(self) -> bool:
        for name in self.host.interfaces():
            if await self.is_rdma_nic(name):
                return True
        return False

    async def fetch(self) -> OkeState:
        errors: list[str] = []
        state: OkeState | None = None
        try:
            state = parse_host(await self.client.get_json("/opc/v2/host/"))
        except ProviderError as exc:
            errors.append(str(exc))
        shape = ""
        try:
            instance = await self.client.get_json("/opc/v2/instance/")
            shape = json_str(instance, "shape") if isinstance(instance, dict) else ""
        except ProviderError as exc:
            log.warning("oke instance metadata not available", extra={"error": str(exc)})
        vnic = None
        current = self.state
        if (current is None or current.primary_vnic is None) and await self._has_rdma_nic():
            try:
                vnic = parse_primary_vnic(await self.client.get_json("/opc/v2/vnics/"))
                if vnic is None:
                    errors.append("oke: the primary VNIC has no IPv4 address yet")
            except ProviderError as exc:
                errors.append(str(exc))
        if state is None and not shape and vnic is None:
            raise ProviderError("; ".join(errors) or "oke: no metadata")
        merged = replace(state or OkeState(), shape=shape, primary_vnic=vnic).merged_over(current)
        if errors:
            raise PartialMetadata(merged, "; ".join(errors))
        return merged

    async def device_attributes(self, device: DeviceInfo) -> Mapping[str, Attribute]:
        state = self.state
        if state is None:
            return {}
        attrs = string_attributes(
            (
                (ATTR_HPC_ISLAND_ID, state.hpc_island_id),
                (ATTR_NETWORK_BLOCK_ID, state.network_block_id),
                (ATTR_LOCAL_BLOCK_ID, state.local_block_id),
                (ATTR_RACK_ID, state.rack_id),
                (ATTR_GPU_MEMORY_FABRIC, state.gpu_memory_fabric),
                (ATTR_SHAPE, state.shape),
            )
        )
        if state.fabric is not None:
            attrs[ATTR_RDMA_FABRIC_IPV6] = Attribute.of_bool(state.fabric.ipv6)
            attrs[ATTR_RDMA_FABRIC_PLANES] = Attribute.of_int(state.fabric.planes)
        return attrs

    def infiniband_host_error(self, device: DeviceInfo) -> str | None:
        """Why a claim would take a native InfiniBand NIC (or its RDMA device) from
        the host, where OKE's host health checks need it; None when it would not."""
        rdma_dev = self.host.infiniband_device_for_pci(device.pci_address)
        if not rdma_dev:
            return None
        if device.mac:
            # The inventory reports a MAC only while the IPoIB netdev is attached,
            # i.e. with --move-ib-interfaces=true.
            return (
                f"the native InfiniBand NIC of {rdma_dev} stays on the host on OKE; run the inventory with"
                " --move-ib-interfaces=false and claim the RDMA device"
            )
        if self.host.rdma_exclusive_netns_mode():
            return (
                f"the native InfiniBand RDMA device {rdma_dev} stays on the host on OKE, but exclusive network"
                " namespace mode moves it into the pod; use shared mode (ib_core netns_mode=1)"
            )
        return None

    async def provider_config(self, device: DeviceInfo) -> NetworkConfig | None:
        if self.infiniband_host_error(device) is not None:
            # Advertise the profile so resolution fails the claim with the reason.
            return NetworkConfig(profile=PROFILE)
        try:
            ifname = self.host.interface_for_pci(device.pci_address)
        except ValueError:
            return None
        if not await self.is_rdma_nic(ifname):
            return None
        state = self.state
        if state is not None and state.fabric is not None and state.fabric.ipv6:
            # The profile has no IPv6 fabric support: such NICs move into the pod as before.
            return None
        return NetworkConfig(profile=PROFILE, interface=InterfaceConfig(type=InterfaceType.IPVLAN))

    async def resolve_profile(
        self, device: DeviceInfo, claim_uid: str, config: NetworkConfig
    ) -> NetworkConfig:
        where = f"oke profile {config.profile!r} for device {device.name} claim {claim_uid}"

        def fail(message: str, code: ProfileErrorCode = ProfileErrorCode.INVALID) -> ProfileError:
            return ProfileError(f"{where}: {message}", code)

        if config.profile != PROFILE:
            raise fail(f"unknown profile (OKE offers {PROFILE!r})", ProfileErrorCode.NOT_FOUND)
        ib = self.infiniband_host_error(device)
        if ib is not None:
            raise fail(ib)
        itf = config.interface
        if itf.type is InterfaceType.PASSTHROUGH:
            raise fail("the profile does not move an RDMA NIC into a pod; remove interface.type PASSTHROUGH")
        if itf.dhcp:
            raise fail("the profile does not support interface.dhcp")
        if itf.addressing is Addressing.UNNUMBERED:
            raise fail("the profile does not support interface.addressing Unnumbered")
        if itf.addresses:
            raise fail("the profile assigns the child address; remove interface.addresses")
        state = self.state
        if state is None or state.fabric is None:
            raise fail("OKE RDMA fabric data is not available yet", ProfileErrorCode.UNAVAILABLE)
        if state.fabric.ipv6:
            raise fail("the profile does not support an IPv6 RDMA fabric yet")
        if state.primary_vnic is None:
            raise fail("OKE primary VNIC metadata is not available yet", ProfileErrorCode.UNAVAILABLE)
        if self.oca.mode not in ("", MODE_CLASSIC):
            raise fail(f"the profile does not support OCA IPv4 address mode {self.oca.mode!r}")
        try:
            ifname = self.host.interface_for_pci(device.pci_address)
        except ValueError as exc:
            raise fail(str(exc)) from None
        hw = self.host.interface_type(ifname)
        if hw != ARPHRD_ETHER:
            raise fail(f"the profile needs an Ethernet parent, but {ifname} has ARPHRD type {hw}")
        arp_ignore, arp_announce = self._arp_policy(ifname, itf, fail)
        vnic, parent_range = state.primary_vnic, self.oca.parent_range
        try:
            addresses = [a.ip for a in await self.host.ipv4_addresses(ifname)]
        except ValueError as exc:
            raise fail(str(exc), ProfileErrorCode.UNAVAILABLE) from None
        index = rdma_nic_index(ifname)
        try:
            if index is None:
                oca = next((a for a in addresses if a in parent_range), None)
                if oca is None:
                    raise fail(
                        f"interface {ifname} has no address in the OCA RDMA network {parent_range} yet",
                        ProfileErrorCode.UNAVAILABLE,
                    )
                index = index_from_address(vnic, oca, parent_range)
            parent, child = derive_addresses(vnic, index, parent_range)
        except ValueError as exc:
            raise fail(f"cannot derive the child address of {ifname}: {exc}") from None
        if parent not in addresses:
            if addresses:
                raise fail(
                    f"interface {ifname} has address {addresses[0]}, but the derived OCA address is {parent}"
                )
            raise fail(
                f"interface {ifname} does not have the expected OCA address {parent} yet",
                ProfileErrorCode.UNAVAILABLE,
            )
        if self.oca.mode == "" and not self._layout_validated:
            await self._validate_classic_layout(vnic, fail)
            self._layout_validated = True
        child_len = ipaddress.IPv4Network(CHILD_CIDR).prefixlen
        out = NetworkConfig(
            interface=InterfaceConfig(
                type=InterfaceType.IPVLAN,
                addresses=(f"{child}/{child_len}",),
                arp_ignore=arp_ignore,
                arp_announce=arp_announce,
            )
        )
        if config.routes or config.rules or itf.vrf is not None:
            return out  # routing belongs to the claim
        table = SBR_TABLE_BASE + index
        return replace(
            out,
            routes=(
                RouteConfig(destination=CHILD_CIDR, source=str(child), scope=RT_SCOPE_LINK, table=table),
            ),
            rules=(RuleConfig(priority=SOURCE_ROUTING_RULE_PRIORITY, source=f"{child}/32", table=table),),
        )

    def _arp_policy(self, ifname: str, itf: InterfaceConfig, fail: Any) -> tuple[int, int]:
        """The claim's ARP settings, else the parent's, so the child answers ARP the way
        OCA configured the RDMA NIC."""
        values: dict[str, int | None] = {"arp_ignore": itf.arp_ignore, "arp_announce": itf.arp_announce}
        for setting in values:
            if values[setting] is None:
                try:
                    values[setting] = self.host.arp_sysctl(ifname, setting)
                except ValueError as exc:
                    raise fail(str(exc)) from None
        missing = [f"interface.{n}" for n, s in (("arpIgnore", "arp_ignore"), ("arpAnnounce", "arp_announce"))
                   if values[s] is None]  # fmt: skip
        if missing:
            fields = " and ".join(missing)
            raise fail(f"could not read {fields} from host interface {ifname}; set {fields} in the claim")
        ignore, announce = values["arp_ignore"], values["arp_announce"]
        assert ignore is not None and announce is not None
        return ignore, announce

    async def _validate_classic_layout(self, vnic: PrimaryVnic, fail: Any) -> None:
        """Every RDMA NIC holding an OCA address must match the classic formula: one
        NIC can match by chance under another OCA mode, a whole host cannot."""
        checked = 0
        for name in self.host.interfaces():
            if not await self.is_rdma_nic(name):
                continue
            try:
                address = await self._oca_address(name)
            except ValueError:
                continue
            if address is None:
                continue  # OCA has not configured this NIC yet
            try:
                index = rdma_nic_index(name)
                if index is None:
                    index = index_from_address(vnic, address, self.oca.parent_range)
                expected, _ = derive_parent(vnic, index, self.oca.parent_range)
            except ValueError as exc:
                raise fail(f"could not validate the OCA classic IPv4 layout: {name}: {exc}") from None
            if address != expected:
                raise fail(
                    f"could not validate the OCA classic IPv4 layout: interface {name} has address {address},"
                    f" but the derived OCA address is {expected}"
                )
            checked += 1
        if checked == 0:
            raise fail("no Ethernet RDMA NIC holds an OCA address yet", ProfileErrorCode.UNAVAILABLE)

    async def release_profile(self, device: DeviceInfo, claim_uid: str, config: NetworkConfig) -> None:
        """Nothing to free: the child address is derived, not allocated."""
