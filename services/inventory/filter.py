"""dranet's publish-time device filter (--filter), over shared.cel.

The expression is compiled once at start-up (a bad one stops the service with
the compiler's message). It sees one variable, ``attributes``: the device's
attributes keyed by qualified name, each a DeviceAttribute with Go field names
(``attributes["dra.net/type"].StringValue``), exactly as in dranet. A device is
published when the result is true; an evaluation error publishes it too, a
non-bool result does not (dranet pkg/filter).

cel-python evaluates about 1,500 devices a second, so results are cached by
the device's attributes: a rescan that changed nothing evaluates nothing, and
a big first evaluation yields to the event loop between devices.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from celpy import celtypes

from services.inventory.discovery import Device
from shared import cel

log = logging.getLogger(__name__)

# dranet's default: hide veth links (CNI plumbing).
DEFAULT_FILTER = '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "veth"'

_CacheKey = tuple[tuple[str, str, object], ...]
_MAX_CACHE = 65536


class FilterError(ValueError):
    """The --filter expression does not compile."""


class DeviceFilter:
    """A compiled --filter with a per-attributes result cache."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self.program = cel.compile_filter(expression)
        except cel.CelCompileError as exc:
            raise FilterError(f"--filter: {exc}") from None
        self._cache: dict[_CacheKey, bool] = {}

    @staticmethod
    def _key(device: Device) -> _CacheKey:
        return tuple(sorted((k, a.kind.value, a.value) for k, a in device.attributes.items()))

    def keep(self, device: Device) -> bool:
        """Whether ``device`` is published."""
        key = self._key(device)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        entry = device.slice_entry()
        try:
            result = self.program.evaluate(cel.filter_variables(entry))
        except cel.CelEvalError as exc:
            log.info(
                "filter evaluation failed; publishing the device: %s", exc, extra={"device": device.name}
            )
            keep = True
        else:
            if isinstance(result, celtypes.BoolType):
                keep = bool(result)
            else:
                keep = False
                log.info(
                    "filter result is not a bool; not publishing the device",
                    extra={"device": device.name, "result": repr(result)},
                )
        if len(self._cache) >= _MAX_CACHE:
            self._cache.clear()
        self._cache[key] = keep
        return keep

    async def apply(self, devices: Iterable[Device]) -> list[Device]:
        """The devices that pass, in order; yields to the loop between uncached ones
        (cel-python is not thread-safe, so this stays on the loop thread)."""
        out: list[Device] = []
        for i, device in enumerate(devices):
            if self.keep(device):
                out.append(device)
            if i % 32 == 31:
                await asyncio.sleep(0)
        return out


async def apply_filter(flt: DeviceFilter | None, devices: Sequence[Device]) -> list[Device]:
    """``devices`` through ``flt``; all of them when there is no filter."""
    if flt is None:
        return list(devices)
    return await flt.apply(devices)
