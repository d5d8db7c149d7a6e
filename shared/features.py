"""dranet's feature gates and the ``--feature-gates`` flag, parsed as Kubernetes parses it
(k8s.io/component-base/featuregate: ``Set`` then ``SetFromMap``). Pure: no I/O.

Syntax: ``Name=value`` pairs separated by commas; whitespace around names, values and
pairs is ignored; names are case-sensitive; a value is anything Go's strconv.ParseBool
takes (``true``/``false``, ``1``/``0``, ``t``/``f``, ``TRUE``, ``True``, ...); a later pair
for the same gate wins. ``AllAlpha`` and ``AllBeta`` set every alpha (beta) gate that is
not named explicitly, as in every Kubernetes component. An unknown gate or a bad value is
a ``FeatureGateError`` naming it.

The gates and their defaults are dranet's (pkg/features): both alpha, both off.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

FLAG = "--feature-gates"


class Stage(enum.StrEnum):
    ALPHA = "Alpha"
    BETA = "Beta"


class Gate(enum.StrEnum):
    """dranet's gates, spelled as on the command line."""

    # Publish resource.kubernetes.io/numaNode as an int list: the device's NUMA node, then
    # the same-socket nodes at the smallest SLIT distance. The API server and scheduler
    # need their DRAListTypeAttributes gate too (Kubernetes 1.36+), or the slice is refused.
    DRA_LIST_TYPE_ATTRIBUTES = "DRAListTypeAttributes"
    # Keep the attributes of a device allocated and moved into a Pod, so it stays in the
    # ResourceSlice unchanged until its claim is released (and across restarts).
    PERSISTENT_RESOURCE_SLICE_ATTRIBUTES = "PersistentResourceSliceAttributes"


@dataclass(frozen=True)
class GateSpec:
    default: bool
    stage: Stage


KNOWN: Mapping[Gate, GateSpec] = {
    Gate.DRA_LIST_TYPE_ATTRIBUTES: GateSpec(default=False, stage=Stage.ALPHA),
    Gate.PERSISTENT_RESOURCE_SLICE_ATTRIBUTES: GateSpec(default=False, stage=Stage.ALPHA),
}
ALL_ALPHA = "AllAlpha"
ALL_BETA = "AllBeta"
_SPECIAL = {ALL_ALPHA: Stage.ALPHA, ALL_BETA: Stage.BETA}

# strconv.ParseBool
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class FeatureGateError(ValueError):
    """``--feature-gates`` names a gate this build does not know or gives a bad value."""


@dataclass(frozen=True)
class FeatureGates:
    """The resolved state of every known gate (defaults for the ones not set)."""

    enabled: Mapping[Gate, bool] = field(default_factory=lambda: {g: s.default for g, s in KNOWN.items()})

    def __getitem__(self, gate: Gate) -> bool:
        return self.enabled[gate]

    @property
    def persistent_slice_attributes(self) -> bool:
        return self.enabled[Gate.PERSISTENT_RESOURCE_SLICE_ATTRIBUTES]

    @property
    def list_type_attributes(self) -> bool:
        return self.enabled[Gate.DRA_LIST_TYPE_ATTRIBUTES]

    def __str__(self) -> str:
        """Every gate as ``Name=true|false``, sorted by name (what Kubernetes logs)."""
        return ",".join(f"{g.value}={str(on).lower()}" for g, on in sorted(self.enabled.items()))


def _parse_bool(name: str, text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise FeatureGateError(f"invalid value of {name}={text}: want true or false")


def parse_pairs(text: str) -> dict[str, bool]:
    """``A=true, B=false`` -> {"A": True, "B": False}, without checking the names."""
    out: dict[str, bool] = {}
    for part in text.split(","):
        if not part.strip():
            # Kubernetes skips only empty pairs; a blank one ("A=true, ") is tolerated too.
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise FeatureGateError(f"missing bool value for {name}")
        if not name:
            raise FeatureGateError(f"missing feature gate name before ={value.strip()}")
        out[name] = _parse_bool(name, value.strip())
    return out


def parse(text: str) -> FeatureGates:
    """The gates ``text`` (the flag's value) sets, over the defaults; FeatureGateError
    names the first unknown gate or bad value."""
    pairs = parse_pairs(text)
    by_name = {g.value: g for g in KNOWN}
    explicit: dict[Gate, bool] = {}
    special: dict[Stage, bool] = {}
    for name, on in pairs.items():
        if name in _SPECIAL:
            special[_SPECIAL[name]] = on
            continue
        gate = by_name.get(name)
        if gate is None:
            known = ", ".join(sorted([*by_name, *_SPECIAL]))
            raise FeatureGateError(f"unrecognized feature gate: {name} (known: {known})")
        explicit[gate] = on
    enabled = {g: s.default for g, s in KNOWN.items()}
    for gate, spec in KNOWN.items():
        if spec.stage in special:
            enabled[gate] = special[spec.stage]
    enabled.update(explicit)
    return FeatureGates(enabled)


def argument(text: str) -> FeatureGates:
    """argparse ``type=``: a bad value stops the service at start with the message."""
    try:
        return parse(text)
    except FeatureGateError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_flag(parser: argparse.ArgumentParser) -> None:
    """``--feature-gates`` on a service whose behaviour a gate changes."""
    parser.add_argument(
        FLAG,
        dest="feature_gates",
        type=argument,
        default=FeatureGates(),
        metavar="NAME=BOOL,...",
        help="alpha features, Kubernetes syntax (e.g. PersistentResourceSliceAttributes=true,"
        "DRAListTypeAttributes=false); known: "
        + ", ".join(f"{g.value} (default {str(s.default).lower()})" for g, s in sorted(KNOWN.items())),
    )
