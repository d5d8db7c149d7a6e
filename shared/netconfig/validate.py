"""Defaulting and validation of a NetworkConfig (dranet pkg/apis defaults.go and
validation.go, plus the interface type and addressing of v1.5).

Every message names the field path and the offending value. ``validate`` has two
levels: the user's own config is checked for what is wrong on its own
(``complete=False``), and the final merged config for what is still missing
(``complete=True``), because a profile may add addresses later.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from shared.netconfig.errors import ConfigError, FieldError, key_text
from shared.netconfig.model import (
    Addressing,
    EthtoolConfig,
    InterfaceConfig,
    InterfaceType,
    NeighborConfig,
    NetworkConfig,
    RouteConfig,
    RuleConfig,
    VRFConfig,
    parse_network_config,
)

MIN_MTU = 68  # smallest MTU IPv4 allows
MIN_IPV6_MTU = 1280  # RFC 8200: an interface carrying IPv6 needs at least this
MAX_MTU = 65535  # IP_MAX_MTU
GSO_MAX_SIZE = 524288  # include/linux/netdevice.h: 8 * GSO_LEGACY_MAX_SIZE
GRO_MAX_SIZE = 524280  # 8 * 65535
MAX_IFNAME_BYTES = 15  # IFNAMSIZ - 1
MAX_TABLE = 2**32 - 1  # route tables are u32 (RTA_TABLE / FRA_TABLE)
MAX_RULE_PRIORITY = 32767  # dranet's bound; keeps user rules before the main table (32766 is main)
RESERVED_TABLES = {253: "default", 254: "main", 255: "local"}
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
VRF_TABLE_OFFSET = 1000
ETH_GSTRING_LEN = 32
MAX_PROFILE_LEN = 253

_FEATURE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


# --- defaulting ---------------------------------------------------------------------


def fnv1a_32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def vrf_table_for(name: str) -> int:
    """The table dranet derives from a VRF name, so interfaces naming the same VRF
    share one table: fnv32a(name) % 1000 + 1000."""
    return fnv1a_32(name.encode()) % 1000 + VRF_TABLE_OFFSET


def default(cfg: NetworkConfig) -> NetworkConfig:
    """Fill defaults that depend only on the config itself (the VRF table)."""
    vrf = cfg.interface.vrf
    if vrf is not None and vrf.table is None and vrf.name:
        vrf = replace(vrf, table=vrf_table_for(vrf.name))
        return replace(cfg, interface=replace(cfg.interface, vrf=vrf))
    return cfg


# --- primitive checks ---------------------------------------------------------------


def parse_mac(text: str) -> bytes | None:
    """Go's net.ParseMAC: 6, 8 or 20 octets as xx:xx.., xx-xx.. or xxxx.xxxx.. ."""
    n = len(text)
    if n < 14:
        return None
    try:
        if text[2] in ":-":
            if (n + 1) % 3 != 0:
                return None
            sep = text[2]
            parts = text.split(sep)
            if any(len(p) != 2 for p in parts):
                return None
            octets = bytes(int(p, 16) for p in parts)
        elif text[4] == ".":
            if (n + 1) % 5 != 0:
                return None
            parts = text.split(".")
            if any(len(p) != 4 for p in parts):
                return None
            octets = b"".join(bytes.fromhex(p) for p in parts)
        else:
            return None
    except ValueError:
        return None
    if any(not all(c in "0123456789abcdefABCDEF" for c in p) for p in parts):
        return None
    return octets if len(octets) in (6, 8, 20) else None


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if "%" in text:  # zones are not addresses an interface can carry
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def parse_cidr(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface | None:
    """ "ip/prefix" with a decimal prefix length (Go's netip.ParsePrefix / net.ParseCIDR)."""
    ip_text, sep, bits = text.partition("/")
    # ASCII digits only: str.isdigit() is also true for "²" (which int() refuses) and
    # "٢٤" (which int() reads as 24, and Go does not).
    if not sep or not (bits.isascii() and bits.isdigit()) or (len(bits) > 1 and bits[0] == "0"):
        return None
    ip = parse_ip(ip_text)
    if ip is None or int(bits) > ip.max_prefixlen:
        return None
    return ipaddress.ip_interface(f"{ip}/{int(bits)}")


def interface_name_problem(name: str) -> str | None:
    """Why the kernel would refuse ``name`` as an interface name (dev_valid_name),
    or None. '%' is refused too: the kernel treats it as a name template."""
    if not name:
        return "cannot be empty"
    try:
        raw = name.encode()
    except UnicodeEncodeError:
        return "is not valid Unicode (unpaired surrogate)"
    if len(raw) > MAX_IFNAME_BYTES:
        return f"is {len(raw)} bytes, the kernel allows at most {MAX_IFNAME_BYTES}"
    if name in (".", ".."):
        return "cannot be '.' or '..'"
    if name in ("all", "default"):
        # /proc/sys/net/ipv{4,6}/conf/{all,default} are not interfaces; the kernel
        # refuses these names (and a sysctl written for them would hit every link).
        return f"cannot be {name!r}: the kernel reserves it (net/*/conf/{name} sysctls)"
    for ch in name:
        if ch in "/:%":
            return f"cannot contain {ch!r}"
        if ch.isspace() or not ch.isprintable():
            return f"cannot contain whitespace or control character {ch!r}"
        if 0xA0 in ch.encode():
            # The kernel's isspace() reads bytes as Latin-1, where 0xA0 is a space: it
            # refuses every character whose UTF-8 holds that byte ("à" is c3 a0).
            return f"cannot contain {ch!r}: its UTF-8 byte 0xa0 is whitespace to the kernel"
    return None


# --- validation ---------------------------------------------------------------------


def validate(cfg: NetworkConfig, *, complete: bool = False) -> list[FieldError]:
    """Every problem with ``cfg``. ``complete`` adds the checks that only hold once
    the provider and profile have had their say (IPvlan addressing)."""
    errs: list[FieldError] = []
    if cfg.profile and (len(cfg.profile) > MAX_PROFILE_LEN or not cfg.profile.isprintable()):
        errs.append(FieldError("profile", f"invalid profile name {cfg.profile!r}"))
    errs += _validate_interface(cfg.interface, "interface", complete=complete)
    errs += _validate_routes(cfg.routes, "routes")
    if cfg.rules:
        if cfg.interface.vrf is not None:
            errs.append(FieldError("rules", "rules are not supported when interface.vrf is set"))
        else:
            errs += _validate_rules(cfg.rules, "rules")
    errs += _validate_neighbors(cfg.neighbors, "neighbors")
    if cfg.ethtool is not None:
        errs += _validate_ethtool(cfg.ethtool, "ethtool")
    errs += _validate_mtu_families(cfg)
    return errs


def _validate_interface(itf: InterfaceConfig, path: str, *, complete: bool) -> list[FieldError]:
    errs: list[FieldError] = []
    if itf.name:
        problem = interface_name_problem(itf.name)
        if problem:
            errs.append(FieldError(f"{path}.name", f"{itf.name!r} {problem}"))
    for i, addr in enumerate(itf.addresses):
        if parse_cidr(addr) is None:
            errs.append(
                FieldError(f"{path}.addresses[{i}]", f"invalid IP CIDR {addr!r} (want e.g. 192.0.2.5/24)")
            )
    dhcp = itf.dhcp is True
    unnumbered = itf.addressing == Addressing.UNNUMBERED
    if dhcp and itf.addresses:
        errs.append(FieldError(path, "dhcp and addresses are mutually exclusive"))
    if dhcp and unnumbered:
        errs.append(FieldError(path, "dhcp and addressing Unnumbered are mutually exclusive"))
    if unnumbered and itf.addresses:
        errs.append(FieldError(path, "addressing Unnumbered and addresses are mutually exclusive"))
    if itf.mtu is not None and not MIN_MTU <= itf.mtu <= MAX_MTU:
        errs.append(FieldError(f"{path}.mtu", f"must be between {MIN_MTU} and {MAX_MTU}, got {itf.mtu}"))
    if itf.hardware_addr is not None:
        mac = parse_mac(itf.hardware_addr)
        if mac is None:
            errs.append(FieldError(f"{path}.hardwareAddr", f"invalid MAC address {itf.hardware_addr!r}"))
        elif len(mac) == 6 and mac[0] & 1:
            errs.append(FieldError(f"{path}.hardwareAddr", f"{itf.hardware_addr} is a multicast address"))
        elif not any(mac):
            errs.append(FieldError(f"{path}.hardwareAddr", f"{itf.hardware_addr} is the all-zero address"))
    for attr, json_name, hi in (
        ("gso_max_size", "gsoMaxSize", GSO_MAX_SIZE),
        ("gro_max_size", "groMaxSize", GRO_MAX_SIZE),
        ("gso_ipv4_max_size", "gsoIPv4MaxSize", GSO_MAX_SIZE),
        ("gro_ipv4_max_size", "groIPv4MaxSize", GRO_MAX_SIZE),
    ):
        value = getattr(itf, attr)
        if value is not None and not 1 <= value <= hi:
            errs.append(FieldError(f"{path}.{json_name}", f"must be between 1 and {hi}, got {value}"))
    if itf.arp_ignore is not None and itf.arp_ignore not in (0, 1, 2, 3, 8):
        errs.append(FieldError(f"{path}.arpIgnore", f"must be one of 0, 1, 2, 3 or 8, got {itf.arp_ignore}"))
    if itf.arp_announce is not None and not 0 <= itf.arp_announce <= 2:
        errs.append(FieldError(f"{path}.arpAnnounce", f"must be between 0 and 2, got {itf.arp_announce}"))
    if itf.vrf is not None:
        errs += _validate_vrf(itf.vrf, f"{path}.vrf")
    if itf.effective_type == InterfaceType.IPVLAN:
        if itf.hardware_addr is not None:
            errs.append(
                FieldError(
                    f"{path}.hardwareAddr", "cannot be set for type IPVLAN (the child uses the parent's MAC)"
                )
            )
        if dhcp:
            errs.append(
                FieldError(
                    f"{path}.dhcp", "is not supported for type IPVLAN (the child shares the parent's MAC)"
                )
            )
        if itf.disable_ebpf_programs:
            errs.append(
                FieldError(
                    f"{path}.disableEbpfPrograms",
                    "is not supported for type IPVLAN (the parent stays on the host)",
                )
            )
        if complete and not itf.addresses and not unnumbered:
            errs.append(
                FieldError(
                    f"{path}.addresses",
                    "type IPVLAN needs addresses (from the config or a profile) or addressing Unnumbered",
                )
            )
    return errs


def _validate_vrf(vrf: VRFConfig, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    if not vrf.name:
        errs.append(FieldError(f"{path}.name", "cannot be empty"))
    else:
        problem = interface_name_problem(vrf.name)
        if problem:
            errs.append(FieldError(f"{path}.name", f"{vrf.name!r} {problem}"))
    if vrf.table is not None:
        if not 1 <= vrf.table <= MAX_TABLE:
            errs.append(FieldError(f"{path}.table", f"must be between 1 and {MAX_TABLE}, got {vrf.table}"))
        elif vrf.table in RESERVED_TABLES:
            errs.append(
                FieldError(
                    f"{path}.table", f"cannot use reserved table {vrf.table} ({RESERVED_TABLES[vrf.table]})"
                )
            )
    return errs


def _same_family(a: Any, b: Any) -> bool:
    return bool(a.version == b.version)


def _validate_routes(routes: Iterable[RouteConfig], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for i, r in enumerate(routes):
        p = f"{path}[{i}]"
        dst = None
        if not r.destination:
            errs.append(FieldError(f"{p}.destination", "cannot be empty"))
        else:
            dst = parse_cidr(r.destination)
            if dst is None:
                errs.append(
                    FieldError(
                        f"{p}.destination", f"invalid CIDR {r.destination!r} (host routes use /32 or /128)"
                    )
                )
        if r.scope not in (RT_SCOPE_UNIVERSE, RT_SCOPE_LINK):
            errs.append(
                FieldError(
                    f"{p}.scope",
                    f"invalid scope {r.scope}, only link ({RT_SCOPE_LINK}) or universe ({RT_SCOPE_UNIVERSE}) allowed",
                )
            )
        if r.gateway:
            errs += _route_address(r.gateway, f"{p}.gateway", dst, r.destination)
        elif r.scope != RT_SCOPE_LINK:
            errs.append(
                FieldError(f"{p}.gateway", "must be set for universe-scope routes (or use scope 253, link)")
            )
        if r.source:
            errs += _route_address(r.source, f"{p}.source", dst, r.destination)
        if not 0 <= r.table <= MAX_TABLE:
            errs.append(FieldError(f"{p}.table", f"must be between 0 and {MAX_TABLE}, got {r.table}"))
    return errs


def _route_address(value: str, path: str, dst: Any, destination: str) -> list[FieldError]:
    """A route's gateway or source: an IP address of the destination's family
    (``dst`` is the parsed destination, None when it is not valid)."""
    ip = parse_ip(value)
    if ip is None:
        return [FieldError(path, f"invalid IP address {value!r}")]
    if dst is not None and not _same_family(dst, ip):
        return [FieldError(path, f"{value} is not the same IP family as destination {destination}")]
    return []


def _validate_rules(rules: Iterable[RuleConfig], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for i, r in enumerate(rules):
        p = f"{path}[{i}]"
        if not 0 <= r.priority <= MAX_RULE_PRIORITY:
            errs.append(
                FieldError(f"{p}.priority", f"must be between 0 and {MAX_RULE_PRIORITY}, got {r.priority}")
            )
        if not 0 <= r.table <= MAX_TABLE:
            errs.append(FieldError(f"{p}.table", f"must be between 0 and {MAX_TABLE}, got {r.table}"))
        src = dst = None
        if r.source:
            src = parse_cidr(r.source)
            if src is None:
                errs.append(FieldError(f"{p}.source", f"invalid CIDR {r.source!r}"))
        if r.destination:
            dst = parse_cidr(r.destination)
            if dst is None:
                errs.append(FieldError(f"{p}.destination", f"invalid CIDR {r.destination!r}"))
        if src is not None and dst is not None and not _same_family(src, dst):
            errs.append(
                FieldError(p, f"source {r.source} and destination {r.destination} must be the same IP family")
            )
    return errs


def _validate_neighbors(neighbors: Iterable[NeighborConfig], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for i, n in enumerate(neighbors):
        p = f"{path}[{i}]"
        if not n.destination:
            errs.append(FieldError(f"{p}.destination", "cannot be empty"))
        elif parse_ip(n.destination) is None:
            errs.append(FieldError(f"{p}.destination", f"invalid IP address {n.destination!r}"))
        if not n.hardware_addr:
            errs.append(FieldError(f"{p}.hardwareAddr", "cannot be empty"))
        elif parse_mac(n.hardware_addr) is None:
            errs.append(FieldError(f"{p}.hardwareAddr", f"invalid MAC address {n.hardware_addr!r}"))
    return errs


def _validate_ethtool(cfg: EthtoolConfig, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    for group, json_name in ((cfg.features, "features"), (cfg.private_flags, "privateFlags")):
        for name in group:
            if not _FEATURE_NAME.fullmatch(name) or len(name.encode(errors="replace")) >= ETH_GSTRING_LEN:
                errs.append(
                    FieldError(
                        f"{path}.{json_name}.{key_text(name)}",
                        f"invalid name {name!r} (letters, digits, '-', '_', '.', under {ETH_GSTRING_LEN} bytes)",
                    )
                )
    return errs


def _validate_mtu_families(cfg: NetworkConfig) -> list[FieldError]:
    mtu = cfg.interface.mtu
    if mtu is None or mtu >= MIN_IPV6_MTU:
        return []
    for i, addr in enumerate(cfg.interface.addresses):
        parsed = parse_cidr(addr)
        if parsed is not None and parsed.version == 6:
            return [
                FieldError(
                    "interface.mtu",
                    f"{mtu} is below {MIN_IPV6_MTU}, the minimum for IPv6 "
                    f"(interface.addresses[{i}] is {addr})",
                )
            ]
    return []


def validate_rdma_only(cfg: NetworkConfig) -> list[FieldError]:
    """An RDMA-only device has no netdev: any network setting is an error
    (dranet ValidateRDMAOnlyConfig). A profile is allowed."""
    errs: list[FieldError] = []
    if cfg.interface != InterfaceConfig():
        set_fields = sorted(
            k for k in cfg.interface.__dataclass_fields__ if getattr(cfg.interface, k) not in (None, "", ())
        )
        errs.append(
            FieldError(
                "interface",
                f"not supported for an RDMA-only device (no network interface); set: {', '.join(set_fields)}",
            )
        )
    for name in ("routes", "rules", "neighbors"):
        if getattr(cfg, name):
            errs.append(FieldError(name, "not supported for an RDMA-only device (no network interface)"))
    if cfg.ethtool is not None:
        errs.append(FieldError("ethtool", "not supported for an RDMA-only device (no network interface)"))
    return errs


def load(raw: Any, *, complete: bool = False) -> NetworkConfig | None:
    """Parse, default and validate opaque parameters (dranet ValidateConfig).

    None when there is no config; ConfigError with every problem otherwise.
    """
    cfg = parse_network_config(raw)
    if cfg is None:
        return None
    cfg = default(cfg)
    errs = validate(cfg, complete=complete)
    if errs:
        raise ConfigError(errs)
    return cfg


def finalize(cfg: NetworkConfig) -> NetworkConfig:
    """Step 4 of the pipeline: default and validate the merged config again."""
    cfg = default(cfg)
    errs = validate(cfg, complete=True)
    if errs:
        raise ConfigError(errs)
    return cfg
