"""PCI vendor and device names from a pci.ids database.

dranet publishes dra.net/pciVendor and dra.net/pciDevice as the *names* the
pci.ids database gives (through ghw), "unknown" for IDs the database lacks. It
embeds a copy of the database; we read the system's (Debian package pci.ids) or
the file --pci-ids names. Without any database the hex IDs are published
instead, and a warning says so once.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
SEARCH_PATHS = (
    "/usr/share/misc/pci.ids",
    "/usr/share/hwdata/pci.ids",
    "/usr/share/pci.ids",
    "/usr/local/share/pci.ids",
)


def find_database(explicit: str = "") -> Path | None:
    """The database to use: ``explicit``, then $PCIDB_PATH, then the usual places."""
    for candidate in (explicit, os.environ.get("PCIDB_PATH", ""), *SEARCH_PATHS):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


class PciIds:
    """Vendor and device names by lower-case hex ID; loaded on first use."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._vendors: dict[str, str] | None = None
        self._devices: dict[str, str] = {}

    def _load(self) -> dict[str, str]:
        if self._vendors is not None:
            return self._vendors
        vendors: dict[str, str] = {}
        if self.path is None:
            self._vendors = vendors
            return vendors
        vendor = ""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip() or line.startswith("#"):
                        continue
                    if line.startswith("C "):
                        break  # the device class section follows the vendors
                    if line.startswith("\t\t"):
                        continue  # subsystems: dranet publishes the subsystem ID, not a name
                    if line.startswith("\t"):
                        ident, _, name = line.strip().partition(" ")
                        if vendor and len(ident) == 4:
                            self._devices[vendor + ident.lower()] = name.strip()
                        continue
                    ident, _, name = line.rstrip("\n").partition(" ")
                    if len(ident) == 4:
                        vendor = ident.lower()
                        vendors[vendor] = name.strip()
                    else:
                        vendor = ""
        except OSError as exc:
            log.warning("cannot read the PCI ID database: %s", exc, extra={"path": str(self.path)})
        self._vendors = vendors
        return vendors

    def vendor_name(self, vendor_id: str) -> str:
        if self.path is None:
            return vendor_id
        return self._load().get(vendor_id.lower(), UNKNOWN)

    def device_name(self, vendor_id: str, device_id: str) -> str:
        if self.path is None:
            return device_id
        self._load()
        return self._devices.get(vendor_id.lower() + device_id.lower(), UNKNOWN)
