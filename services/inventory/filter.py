"""dranet's publish-time device filter (--filter), over shared.cel.

The expression is compiled once at start-up (a bad one stops the service with
the compiler's message). It sees one variable, ``attributes``: the device's
attributes keyed by qualified name, each a DeviceAttribute with Go field names
(``attributes["dra.net/type"].StringValue``), exactly as in dranet. A device is
published when the result is true; an evaluation error publishes it too, a
non-bool result does not (dranet pkg/filter).

cel-python evaluates only about 1,000-2,000 devices a second, so results are
cached. When the expression reads ``attributes`` only as ``attributes["name"]``
and ``"name" in attributes`` with literal names (dranet's default does), a result
depends on those attributes alone: the cache is keyed on them and evaluation
sees only them, so 1,000 veths of one type cost one evaluation. Otherwise the
key is every attribute. A big evaluation yields to the event loop as it goes.

dranet's default expression, the one nearly every node runs, is decided without
CEL: ``default_keep`` gives the same answer for every device (a test compares it
with the CEL evaluation). cel-python and its parser cost the inventory about
9 MiB, so they are loaded only for another expression.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from services.inventory.discovery import Device
from shared.deviceattr import Attribute, AttrKind

if TYPE_CHECKING:
    from shared import cel

log = logging.getLogger(__name__)

# dranet's default: hide veth links (CNI plumbing).
DEFAULT_FILTER = '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "veth"'

_WS = re.compile(r"\s+")


def is_default(expression: str) -> bool:
    """Whether ``expression`` is DEFAULT_FILTER, spaces aside."""
    return _WS.sub("", expression) == _WS.sub("", DEFAULT_FILTER)


def default_keep(attributes: dict[str, Attribute]) -> bool:
    """DEFAULT_FILTER without CEL: hidden only when dra.net/type is the string "veth"
    (any other kind has no StringValue, which CEL compares unequal or fails on; an
    evaluation error publishes the device)."""
    kind = attributes.get("dra.net/type")
    return kind is None or kind.kind is not AttrKind.STRING or kind.value != "veth"


_CacheKey = tuple[tuple[str, str, object], ...]
_MAX_CACHE = 65536

_LITERAL = r"(?:\"(?P<{0}d>[^\"\\]*)\"|'(?P<{0}s>[^'\\]*)')"
_INDEXED = re.compile(r"\battributes\s*\[\s*" + _LITERAL.format("i") + r"\s*\]")
_MEMBER = re.compile(_LITERAL.format("m") + r"\s+in\s+attributes\b")
_ANY_USE = re.compile(r"\battributes\b")


def referenced_attributes(expression: str) -> frozenset[str] | None:
    """The attribute names ``expression`` can read, when it reads ``attributes``
    only through literal keys (``attributes["x"]``, ``"x" in attributes``); None
    when it may look at others (iteration, size(), escapes in a key, ...)."""
    names: set[str] = set()

    def take(m: re.Match[str]) -> str:
        names.add(next(g for g in m.groups() if g is not None))
        return " "

    rest = _MEMBER.sub(take, _INDEXED.sub(take, expression))
    if _ANY_USE.search(rest):
        return None
    return frozenset(names)


class FilterError(ValueError):
    """The --filter expression does not compile."""


class DeviceFilter:
    """A compiled --filter with a per-attributes result cache."""

    def __init__(self, expression: str, *, native_default: bool = True) -> None:
        self.expression = expression
        self.native = native_default and is_default(expression)
        self.program: cel.CompiledExpression | None = None
        if not self.native:
            from shared import cel  # cel-python: only for an expression of the user's

            try:
                self.program = cel.compile_filter(expression)
            except cel.CelCompileError as exc:
                raise FilterError(f"--filter: {exc}") from None
        self._cache: dict[_CacheKey, bool] = {}
        self.reads = referenced_attributes(expression)

    def _relevant(self, device: Device) -> dict[str, Attribute]:
        if self.reads is None:
            return dict(device.attributes)
        return {k: a for k, a in device.attributes.items() if k in self.reads}

    def keep(self, device: Device) -> bool:
        """Whether ``device`` is published."""
        attrs = self._relevant(device)
        key = tuple(sorted((k, a.kind.value, a.value) for k, a in attrs.items()))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        keep = default_keep(attrs) if self.program is None else self._evaluate(device, attrs)
        if len(self._cache) >= _MAX_CACHE:
            self._cache.clear()
        self._cache[key] = keep
        return keep

    def _evaluate(self, device: Device, attrs: dict[str, Attribute]) -> bool:
        from celpy import celtypes

        from shared import cel

        assert self.program is not None
        entry: dict[str, Any] = {
            "name": device.name,
            "attributes": {k: a.to_json() for k, a in attrs.items()},
        }
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
