"""Seed step 1: pick one opaque config for an allocated device.

From ``status.allocation.devices.config`` keep the entries whose opaque driver
is dra.net and whose requests include the device's request (an empty list means
every request). Entries from the DeviceClass come before entries from the claim.
The first entry with parameters is used and later entries are not read. An
invalid entry before it fails the claim, even if a later one would be valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.netconfig.errors import ConfigError, FieldError
from shared.netconfig.model import NetworkConfig
from shared.netconfig.validate import load

DRIVER_NAME = "dra.net"
_SOURCE_ORDER = {"FromClass": 0, "FromClaim": 1}


@dataclass(frozen=True)
class Pick:
    """The chosen config (an empty one when no entry applies) and where it came
    from; ``errors`` holds every invalid entry read before it."""

    config: NetworkConfig
    index: int | None
    source: str
    errors: tuple[FieldError, ...]

    def raise_for_errors(self, context: str) -> None:
        if self.errors:
            raise ConfigError(self.errors, context)


def request_matches(entry_requests: Sequence[str], request: str) -> bool:
    """An entry applies to a request when it names it, names its parent request
    (for a "parent/subrequest" result), or names no request at all."""
    if not entry_requests:
        return True
    parent = request.split("/", 1)[0]
    return request in entry_requests or parent in entry_requests


def pick_config(entries: Sequence[Mapping[str, Any]], request: str, driver: str = DRIVER_NAME) -> Pick:
    """Pick the opaque config for ``request`` from allocation config entries
    (dicts in the resource.k8s.io/v1 JSON shape)."""
    ordered = sorted(enumerate(entries), key=lambda ie: _SOURCE_ORDER.get(str(ie[1].get("source", "")), 2))
    errors: list[FieldError] = []
    for index, entry in ordered:
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        if not request_matches(entry.get("requests") or (), request):
            continue
        params = opaque.get("parameters")
        if params is None:
            continue
        where = f"config[{index}] ({entry.get('source', 'unknown source')})"
        try:
            cfg = load(params)
        except ConfigError as exc:
            errors.extend(FieldError(f"{where} {e.path}".rstrip(), e.message) for e in exc.errors)
            continue
        if cfg is not None:
            return Pick(cfg, index, str(entry.get("source", "")), tuple(errors))
    return Pick(NetworkConfig(), None, "", tuple(errors))
