"""ResourceSlice device names from interface names and PCI addresses (dranet pkg/names).

A device name must be a DNS-1123 label. An interface name that already is one is
used as it is; any other becomes ``net-`` + the lower-case, unpadded base32 of
its bytes. A PCI device becomes ``pci-`` + its address with ':' and '.' turned
into '-'. Both encodings are injective, so two different interfaces never get the
same encoded name; ``assign_device_names`` settles the remaining corner case of
an interface literally named like another device's encoded name.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass

INTERFACE_PREFIX = "net"
PCI_PREFIX = "pci"
DNS1123_LABEL_MAX = 63
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def is_dns1123_label(value: str) -> bool:
    # fullmatch: with match, "$" also matches before a trailing newline.
    return len(value) <= DNS1123_LABEL_MAX and bool(_DNS1123_LABEL.fullmatch(value))


def encode_interface_name(ifname: str) -> str:
    """``net-`` + lower-case unpadded base32 of the name, whatever the name is."""
    payload = base64.b32encode(ifname.encode()).decode().rstrip("=").lower()
    return f"{INTERFACE_PREFIX}-{payload}"


def normalize_interface_name(ifname: str) -> str:
    """The device name dranet gives an interface ("" for "")."""
    if not ifname:
        return ""
    if is_dns1123_label(ifname):
        return ifname
    return encode_interface_name(ifname)


def normalize_pci_address(address: str) -> str:
    """``0000:8a:00.0`` -> ``pci-0000-8a-00-0``."""
    return f"{PCI_PREFIX}-" + address.replace(":", "-").replace(".", "-").lower()


def decode_interface_name(name: str) -> str | None:
    """The interface name behind an encoded ``net-`` name, or None if it is not one."""
    prefix = f"{INTERFACE_PREFIX}-"
    if not name.startswith(prefix):
        return None
    payload = name[len(prefix) :].upper()
    payload += "=" * (-len(payload) % 8)
    try:
        return base64.b32decode(payload).decode()
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class NameSource:
    """What a device is named after: a PCI address (wins) or an interface name."""

    ifname: str = ""
    pci_address: str = ""

    @property
    def key(self) -> str:
        return f"pci:{self.pci_address}" if self.pci_address else f"if:{self.ifname}"


def assign_device_names(sources: Iterable[NameSource]) -> dict[str, str]:
    """Device name for each source, keyed by ``NameSource.key``, with no two equal.

    Names depend only on each device's own identity, except when an interface's
    literal name equals a name that another device gets by encoding (a PCI name
    or a ``net-`` encoding). Then the encoded name stays with its owner, and the
    literal one falls back to its own (injective) ``net-`` encoding.
    """
    items = list(dict.fromkeys(sources))
    encoded_owner: dict[str, str] = {}
    literal: list[NameSource] = []
    names: dict[str, str] = {}
    for src in items:
        if src.pci_address:
            name = normalize_pci_address(src.pci_address)
            encoded_owner[name] = src.key
            names[src.key] = name
        elif src.ifname and not is_dns1123_label(src.ifname):
            name = encode_interface_name(src.ifname)
            encoded_owner[name] = src.key
            names[src.key] = name
        elif src.ifname:
            literal.append(src)
    for src in literal:
        name = src.ifname
        if name in encoded_owner:
            name = encode_interface_name(src.ifname)
        names[src.key] = name
    return names
