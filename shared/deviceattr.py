"""resource.k8s.io/v1 device attribute values (the DeviceAttribute one-of) and the API
server's rules for them: the core type the inventory publishes, whoever supplies the value
(discovery, a cloud provider, a webhook). Pure: no I/O.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class AttrKind(enum.StrEnum):
    """The one member a resource.k8s.io DeviceAttribute sets. The names are also the
    field names of dranet.inventory.v1.Attribute's oneof. The plural ones are list
    values (resource.k8s.io/v1 with the DRAListTypeAttributes gate, Kubernetes 1.36+)."""

    STRING = "string"
    INT = "int"
    BOOL = "bool"
    VERSION = "version"
    INTS = "ints"
    BOOLS = "bools"
    STRINGS = "strings"
    VERSIONS = "versions"

    @property
    def is_list(self) -> bool:
        return self in _LIST_KINDS


_LIST_KINDS = frozenset({AttrKind.INTS, AttrKind.BOOLS, AttrKind.STRINGS, AttrKind.VERSIONS})


# resource.k8s.io/v1 limits (k8s.io/api/resource/v1 types.go).
ATTRIBUTE_MAX_VALUE_LENGTH = 64
ATTRIBUTE_MAX_ID_LENGTH = 32
# Values of all list attributes of one device together.
ATTRIBUTE_MAX_LIST_VALUES = 48
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-((0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(\.(0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?"
    r"(\+([0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True)
class Attribute:
    """One device attribute value. Build with ``Attribute.of_string("x")`` etc."""

    kind: AttrKind
    # A tuple for the list kinds (hashable: the filter caches on attribute values).
    value: str | int | bool | tuple[str | int | bool, ...]

    @classmethod
    def of_string(cls, value: str) -> Attribute:
        return cls(AttrKind.STRING, value)

    @classmethod
    def of_int(cls, value: int) -> Attribute:
        return cls(AttrKind.INT, value)

    @classmethod
    def of_bool(cls, value: bool) -> Attribute:
        return cls(AttrKind.BOOL, value)

    @classmethod
    def of_version(cls, value: str) -> Attribute:
        return cls(AttrKind.VERSION, value)

    @classmethod
    def of_ints(cls, values: Iterable[int]) -> Attribute:
        return cls(AttrKind.INTS, tuple(values))

    def to_json(self) -> dict[str, Any]:
        """The resource.k8s.io DeviceAttribute JSON, e.g. {"string": "x"}, {"ints": [0, 1]}."""
        if isinstance(self.value, tuple):
            return {self.kind.value: list(self.value)}
        return {self.kind.value: self.value}

    @classmethod
    def from_json(cls, obj: Any) -> Attribute:
        """Parse a DeviceAttribute JSON object; ValueError says what is wrong."""
        if not isinstance(obj, dict) or len(obj) != 1:
            raise ValueError(
                "expected an object with exactly one of string, int, bool, version, "
                f"strings, ints, bools, versions, got {obj!r}"
            )
        ((key, value),) = obj.items()
        try:
            kind = AttrKind(key)
        except ValueError:
            raise ValueError(
                f"unknown attribute type {key!r} (want string, int, bool, version or a list: "
                "strings, ints, bools, versions)"
            ) from None
        if kind.is_list:
            if not isinstance(value, list) or not value:
                raise ValueError(f"{key} attribute needs a non-empty list, got {value!r}")
            element = {
                AttrKind.STRINGS: AttrKind.STRING,
                AttrKind.VERSIONS: AttrKind.VERSION,
                AttrKind.BOOLS: AttrKind.BOOL,
                AttrKind.INTS: AttrKind.INT,
            }[kind]
            if not all(_scalar_ok(element, v) for v in value):
                raise ValueError(f"{key} attribute has a value of the wrong type: {value!r}")
            return cls(kind, tuple(value))
        if not _scalar_ok(kind, value):
            raise ValueError(f"{key} attribute has a value of the wrong type: {value!r}")
        return cls(kind, value)


def _scalar_ok(kind: AttrKind, value: Any) -> bool:
    if kind in (AttrKind.STRING, AttrKind.VERSION):
        return isinstance(value, str)
    if kind is AttrKind.BOOL:
        return isinstance(value, bool)
    return isinstance(value, int) and not isinstance(value, bool)


def attribute_problem(name: str, attr: Attribute) -> str | None:
    """Why the API server would reject ``name: attr`` in a ResourceSlice, or None.

    Providers' attributes are external input (a webhook, instance metadata): the
    inventory drops what the API server would refuse rather than fail the slice.
    """
    domain, sep, ident = name.rpartition("/")
    if not sep or not domain:
        return f"attribute name {name!r} needs a domain prefix (e.g. gce.dra.net/{name})"
    if len(domain) > 63 or not _DNS1123_SUBDOMAIN.match(domain):
        return f"attribute name {name!r}: {domain!r} is not a DNS subdomain of at most 63 characters"
    if len(ident) > ATTRIBUTE_MAX_ID_LENGTH or not _C_IDENTIFIER.match(ident):
        return f"attribute name {name!r}: {ident!r} is not a C identifier of at most {ATTRIBUTE_MAX_ID_LENGTH} characters"
    values = attr.value if isinstance(attr.value, tuple) else (attr.value,)
    if len(values) > ATTRIBUTE_MAX_LIST_VALUES:
        return f"attribute {name}: {len(values)} values, at most {ATTRIBUTE_MAX_LIST_VALUES} per device"
    textual = (AttrKind.STRING, AttrKind.VERSION, AttrKind.STRINGS, AttrKind.VERSIONS)
    for v in values:
        if attr.kind in textual and len(str(v)) > ATTRIBUTE_MAX_VALUE_LENGTH:
            return f"attribute {name}: value longer than {ATTRIBUTE_MAX_VALUE_LENGTH} characters"
        if attr.kind in (AttrKind.VERSION, AttrKind.VERSIONS) and not _SEMVER.match(str(v)):
            return f"attribute {name}: {v!r} is not a semantic version"
    return None
