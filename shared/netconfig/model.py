"""NetworkConfig: the opaque parameters of a dra.net claim, as frozen dataclasses.

The JSON shape is dranet's ``apis.NetworkConfig`` (camelCase keys, omitted when
unset). Parsing is strict, like Go's ``json.UnmarshalStrict``: an unknown key or
a value of the wrong JSON type is an error that names the field. Every problem
found is reported, not only the first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from shared.netconfig.errors import MAX_SHOWN, ConfigError, FieldError, key_text


class InterfaceType(StrEnum):
    """How the device reaches the pod (seed: "Passthrough or IPvlan child")."""

    PASSTHROUGH = "PASSTHROUGH"
    IPVLAN = "IPVLAN"


class Addressing(StrEnum):
    """Addressing modes besides explicit addresses and DHCP."""

    # The interface gets no address of its own (routes point at the device).
    UNNUMBERED = "Unnumbered"


@dataclass(frozen=True)
class VRFConfig:
    name: str = field(default="", metadata={"json": "name", "kind": "str"})
    table: int | None = field(default=None, metadata={"json": "table", "kind": "int"})


@dataclass(frozen=True)
class InterfaceConfig:
    name: str = field(default="", metadata={"json": "name", "kind": "str"})
    type: InterfaceType | None = field(default=None, metadata={"json": "type", "kind": InterfaceType})
    addresses: tuple[str, ...] = field(default=(), metadata={"json": "addresses", "kind": "strs"})
    addressing: Addressing | None = field(default=None, metadata={"json": "addressing", "kind": Addressing})
    dhcp: bool | None = field(default=None, metadata={"json": "dhcp", "kind": "bool"})
    mtu: int | None = field(default=None, metadata={"json": "mtu", "kind": "int32"})
    hardware_addr: str | None = field(default=None, metadata={"json": "hardwareAddr", "kind": "str"})
    gso_max_size: int | None = field(default=None, metadata={"json": "gsoMaxSize", "kind": "int32"})
    gro_max_size: int | None = field(default=None, metadata={"json": "groMaxSize", "kind": "int32"})
    gso_ipv4_max_size: int | None = field(default=None, metadata={"json": "gsoIPv4MaxSize", "kind": "int32"})
    gro_ipv4_max_size: int | None = field(default=None, metadata={"json": "groIPv4MaxSize", "kind": "int32"})
    disable_ebpf_programs: bool | None = field(
        default=None, metadata={"json": "disableEbpfPrograms", "kind": "bool"}
    )
    forwarding: bool | None = field(default=None, metadata={"json": "forwarding", "kind": "bool"})
    arp_ignore: int | None = field(default=None, metadata={"json": "arpIgnore", "kind": "int32"})
    arp_announce: int | None = field(default=None, metadata={"json": "arpAnnounce", "kind": "int32"})
    vrf: VRFConfig | None = field(default=None, metadata={"json": "vrf", "kind": VRFConfig})

    @property
    def effective_type(self) -> InterfaceType:
        """PASSTHROUGH unless IPVLAN was asked for."""
        return self.type or InterfaceType.PASSTHROUGH


@dataclass(frozen=True)
class RouteConfig:
    destination: str = field(default="", metadata={"json": "destination", "kind": "str"})
    gateway: str = field(default="", metadata={"json": "gateway", "kind": "str"})
    source: str = field(default="", metadata={"json": "source", "kind": "str"})
    scope: int = field(default=0, metadata={"json": "scope", "kind": "uint8"})
    table: int = field(default=0, metadata={"json": "table", "kind": "int"})


@dataclass(frozen=True)
class RuleConfig:
    priority: int = field(default=0, metadata={"json": "priority", "kind": "int"})
    source: str = field(default="", metadata={"json": "source", "kind": "str"})
    destination: str = field(default="", metadata={"json": "destination", "kind": "str"})
    table: int = field(default=0, metadata={"json": "table", "kind": "int"})


@dataclass(frozen=True)
class NeighborConfig:
    destination: str = field(default="", metadata={"json": "destination", "kind": "str"})
    hardware_addr: str = field(default="", metadata={"json": "hardwareAddr", "kind": "str"})


@dataclass(frozen=True)
class EthtoolConfig:
    features: Mapping[str, bool] = field(
        default_factory=dict, metadata={"json": "features", "kind": "boolmap"}
    )
    private_flags: Mapping[str, bool] = field(
        default_factory=dict, metadata={"json": "privateFlags", "kind": "boolmap"}
    )


@dataclass(frozen=True)
class NetworkConfig:
    profile: str = field(default="", metadata={"json": "profile", "kind": "str"})
    interface: InterfaceConfig = field(
        default_factory=InterfaceConfig, metadata={"json": "interface", "kind": InterfaceConfig}
    )
    routes: tuple[RouteConfig, ...] = field(default=(), metadata={"json": "routes", "kind": (RouteConfig,)})
    rules: tuple[RuleConfig, ...] = field(default=(), metadata={"json": "rules", "kind": (RuleConfig,)})
    neighbors: tuple[NeighborConfig, ...] = field(
        default=(), metadata={"json": "neighbors", "kind": (NeighborConfig,)}
    )
    ethtool: EthtoolConfig | None = field(default=None, metadata={"json": "ethtool", "kind": EthtoolConfig})

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, with unset fields omitted (Go's omitempty)."""
        return _encode(self)

    def to_json(self) -> str:
        """Canonical JSON: keys in declaration order, unset fields omitted."""
        return json.dumps(self.to_dict(), separators=(",", ":"))

    def is_empty(self) -> bool:
        return self == NetworkConfig()


_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint8": (0, 255),
    "int": (-(2**63), 2**63 - 1),
}

T = TypeVar("T")


def parse_network_config(raw: bytes | str | Mapping[str, Any] | None) -> NetworkConfig | None:
    """Parse opaque parameters strictly. None for absent/empty input (no config).

    Raises ConfigError listing every unknown field and wrong type, each with its
    path ("interface.mtu", "routes[1].gateway").
    """
    if raw is None:
        return None
    if isinstance(raw, bytes | str):
        try:
            text = raw.decode() if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            raise ConfigError([FieldError("", f"not valid UTF-8: {exc}")]) from None
        if not text.strip():
            return None
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError) as exc:
            # ValueError: JSONDecodeError, and an integer literal too long to convert;
            # RecursionError: nesting deeper than the parser's stack.
            raise ConfigError([FieldError("", f"invalid JSON: {str(exc)[:200]}")]) from None
    else:
        obj = raw
    if obj is None:
        # `null` decodes into an empty config in Go, as does `{}`.
        return NetworkConfig()
    errors: list[FieldError] = []
    cfg = _decode(NetworkConfig, obj, "", errors)
    if errors:
        raise ConfigError(errors)
    return cfg


def _join(path: str, name: str) -> str:
    name = key_text(str(name))
    return f"{path}.{name}" if path else name


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _show(value: Any) -> str:
    """``value`` as bounded JSON text for a message. Never raises: a number too long
    to print or nesting too deep for the encoder is described instead of shown."""
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError, TypeError):
        return f"({_describe(value)} not shown)"
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _utf8_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as UTF-8 (a lone surrogate, which JSON's \\ud800
    escape gives), or None."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode: unpaired surrogate at position {exc.start}"
    return None


def _decode(cls: type[T], obj: Any, path: str, errors: list[FieldError]) -> T:
    if not isinstance(obj, dict):
        errors.append(FieldError(path, f"expected an object, got {_describe(obj)} {_show(obj)}"))
        return cls()
    by_json = {f.metadata["json"]: f for f in fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in obj.items():
        f = by_json.get(key)
        if f is None:
            errors.append(FieldError(_join(path, key), f"unknown field (known: {', '.join(by_json)})"))
            continue
        if value is None:
            continue  # null leaves the field unset, as in Go
        sub = _join(path, key)
        decoded = _decode_value(f.metadata["kind"], value, sub, errors)
        if decoded is not _INVALID:
            kwargs[f.name] = decoded
    return cls(**kwargs)


_INVALID = object()


def _decode_value(kind: Any, value: Any, path: str, errors: list[FieldError]) -> Any:
    def bad(expected: str) -> object:
        errors.append(FieldError(path, f"expected {expected}, got {_describe(value)} {_show(value)}"))
        return _INVALID

    def text(s: str, where: str) -> str | object:
        problem = _utf8_problem(s)
        if problem:
            errors.append(FieldError(where, problem))
            return _INVALID
        return s

    if kind == "str":
        return text(value, path) if isinstance(value, str) else bad("a string")
    if kind == "bool":
        return value if isinstance(value, bool) else bad("a boolean")
    if kind in _INT_RANGES:
        # bool is an int in Python; JSON true is not a number.
        if isinstance(value, bool) or not isinstance(value, int | float):
            return bad("an integer")
        if isinstance(value, float):
            if not value.is_integer():
                return bad("an integer")
            value = int(value)
        lo, hi = _INT_RANGES[kind]
        if not lo <= value <= hi:
            errors.append(FieldError(path, f"{_show(value)} does not fit in {kind} [{lo}, {hi}]"))
            return _INVALID
        return value
    if kind == "strs":
        if not isinstance(value, list):
            return bad("an array of strings")
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                errors.append(
                    FieldError(f"{path}[{i}]", f"expected a string, got {_describe(item)} {_show(item)}")
                )
            elif text(item, f"{path}[{i}]") is not _INVALID:
                out.append(item)
        return tuple(out)
    if kind == "boolmap":
        if not isinstance(value, dict):
            return bad("an object of booleans")
        flags: dict[str, bool] = {}
        for k, v in value.items():
            where = _join(path, k)
            if not isinstance(v, bool):
                errors.append(FieldError(where, f"expected a boolean, got {_describe(v)} {_show(v)}"))
            elif text(k, where) is not _INVALID:
                flags[k] = v
        return flags
    if isinstance(kind, tuple):
        (item_cls,) = kind
        if not isinstance(value, list):
            return bad("an array of objects")
        return tuple(_decode(item_cls, item, f"{path}[{i}]", errors) for i, item in enumerate(value))
    if isinstance(kind, type) and issubclass(kind, StrEnum):
        allowed = [m.value for m in kind]
        if not isinstance(value, str):
            return bad(f"one of {allowed}")
        try:
            return kind(value)
        except ValueError:
            errors.append(FieldError(path, f"unsupported value {_show(value)}, must be one of {allowed}"))
            return _INVALID
    if isinstance(kind, type):
        return _decode(kind, value, path, errors)
    raise AssertionError(f"unknown field kind {kind!r}")


def _encode(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        name = f.metadata["json"]
        if f.name == "interface":
            out[name] = _encode(value)  # never omitted, as in dranet (no omitempty)
            continue
        if value is None or value == "" or value == () or (isinstance(value, Mapping) and not value):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value == 0 and f.default == 0:
            continue
        out[name] = _encode_value(value)
    return out


def _encode_value(value: Any) -> Any:
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return dict(value)
    if hasattr(value, "__dataclass_fields__"):
        return _encode(value)
    return value
