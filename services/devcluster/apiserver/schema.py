"""The real Kubernetes OpenAPI schemas, as shipped (converted to JSON Schema) by kubernetes-validate.

We read the ``v<version>-local-strict`` definitions and walk them ourselves rather than
through a JSON Schema engine: the definitions use a small, fixed set of keywords
(checked at load time, so a new keyword cannot be skipped silently), and the walk has
to classify errors the way the apiserver does (an unknown field is a strict-decoding
error, a wrong type a 400 decode error, a missing field a 422 Invalid) and format
field paths the Go way (``spec.devices[3].attributes[dra.net/ifName]``). The same
walk gives the list and map semantics (``x-kubernetes-list-type``, patch strategies)
that strategic merge patch and server-side apply need.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from . import errors
from .errors import FieldError

JSON = dict[str, Any]

# 1.34 is the first release with resource.k8s.io/v1 (GA), the API our driver speaks.
DEFAULT_SCHEMA_VERSION = "1.34.0"

_KNOWN_KEYWORDS = {
    "description",
    "type",
    "$ref",
    "additionalProperties",
    "properties",
    "items",
    "required",
    "enum",
    "format",
    "oneOf",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-patch-strategy",
    "x-kubernetes-patch-merge-key",
    "x-kubernetes-map-type",
    "x-kubernetes-group-version-kind",
    "x-kubernetes-unions",
}
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# Definitions that hold arbitrary JSON; the apiserver keeps their content as is.
_RAW = {
    "io.k8s.apimachinery.pkg.runtime.RawExtension",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON",
}
_QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_TIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def schema_dir(version: str, strict: bool = True) -> str:
    # Locate the package without importing it: its __init__ pulls in jsonschema (a quarter second).
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or spec.origin is None:
        raise RuntimeError("the kubernetes-validate package is not installed")
    base = os.path.join(os.path.dirname(spec.origin), "kubernetes-json-schema")
    return os.path.join(base, f"v{version}-local" + ("-strict" if strict else ""))


@dataclass
class Node:
    """One resolved schema node; ``ref`` names the definition it came from, if any."""

    s: JSON
    ref: str = ""
    prop: JSON = field(default_factory=dict)  # the referring property (carries list/patch extensions)

    def ext(self, key: str) -> Any:
        return self.prop.get(key, self.s.get(key))

    @property
    def types(self) -> set[str]:
        t = self.s.get("type")
        if t is None:
            return set()
        return {t} if isinstance(t, str) else set(t)

    @property
    def raw(self) -> bool:
        """Arbitrary JSON: RawExtension and friends, or an object without a declared shape."""
        if self.ref in _RAW:
            return True
        return "object" in self.types and "properties" not in self.s and "additionalProperties" not in self.s

    @property
    def quantity(self) -> bool:
        return self.ref == _QUANTITY

    @property
    def scalar(self) -> bool:
        if self.ref in (_QUANTITY, _INT_OR_STRING) or "oneOf" in self.s:
            return True
        return bool(self.types & {"string", "integer", "number", "boolean"})

    @property
    def struct(self) -> bool:
        return "properties" in self.s

    @property
    def map(self) -> bool:
        return isinstance(self.s.get("additionalProperties"), dict) and "properties" not in self.s

    @property
    def array(self) -> bool:
        return "array" in self.types

    @property
    def atomic(self) -> bool:
        return self.ext("x-kubernetes-map-type") == "atomic"

    def list_semantics(self) -> tuple[str, tuple[str, ...]]:
        """(atomic|map|set, keys) as structured-merge-diff reads them; without a list type a
        ``merge`` patch strategy makes an associative list keyed by the merge key (schemaconv)."""
        lt = self.ext("x-kubernetes-list-type")
        if lt == "map":
            return "map", tuple(self.ext("x-kubernetes-list-map-keys") or ())
        if lt in ("set", "atomic"):
            return lt, ()
        strategy = self.ext("x-kubernetes-patch-strategy") or ""
        key = self.ext("x-kubernetes-patch-merge-key")
        if "merge" in strategy.split(","):
            return ("map", (key,)) if key else ("set", ())
        return "atomic", ()


@dataclass
class Check:
    """Outcome of walking an object against its schema."""

    unknown: list[tuple[str, JSON, str]] = field(default_factory=list)  # (path, parent dict, key)
    decode: list[str] = field(default_factory=list)  # 400: the Go decoder would refuse these
    invalid: list[FieldError] = field(default_factory=list)  # 422


class Schemas:
    """Definitions of one Kubernetes version, with lookups by GVK."""

    def __init__(self, version: str = DEFAULT_SCHEMA_VERSION) -> None:
        self.version = version
        path = os.path.join(schema_dir(version), "_definitions.json")
        with open(path, encoding="utf-8") as f:
            self.defs: dict[str, JSON] = json.load(f)["$defs"]
        self._by_gvk: dict[tuple[str, str, str], str] = {}
        for name, d in self.defs.items():
            for gvk in d.get("x-kubernetes-group-version-kind", ()):
                self._by_gvk[(gvk["group"], gvk["version"], gvk["kind"])] = name
        self._check_keywords()

    def _check_keywords(self) -> None:
        def walk(s: JSON, where: str) -> None:
            extra = set(s) - _KNOWN_KEYWORDS
            if extra:
                raise RuntimeError(
                    f"schema {where} uses keywords this walker does not implement: {sorted(extra)}"
                )
            for p, ps in s.get("properties", {}).items():
                walk(ps, f"{where}.{p}")
            for k in ("items", "additionalProperties"):
                if isinstance(s.get(k), dict):
                    walk(s[k], f"{where}.{k}")
            for i, alt in enumerate(s.get("oneOf", ())):
                walk(alt, f"{where}.oneOf[{i}]")

        for name, d in self.defs.items():
            walk(d, name)

    def definition_name(self, group: str, version: str, kind: str) -> str:
        return self._by_gvk[(group, version, kind)]

    def root(self, group: str, version: str, kind: str) -> Node:
        name = self.definition_name(group, version, kind)
        return Node(self.defs[name], name)

    def node(self, s: JSON, prop: JSON | None = None) -> Node:
        """Resolve ``$ref`` chains; the referring property keeps its list/patch extensions."""
        ref = ""
        outer = prop if prop is not None else s
        while "$ref" in s:
            ref = s["$ref"].rsplit("/", 1)[-1]
            s = self.defs[ref]
        return Node(s, ref, outer)

    def child(self, n: Node, key: str) -> Node | None:
        """Schema of ``key`` in a struct (property) or map (value), None if unknown."""
        props = n.s.get("properties")
        if props is not None:
            p = props.get(key)
            return self.node(p, p) if p is not None else None
        ap = n.s.get("additionalProperties")
        if isinstance(ap, dict):
            return self.node(ap)
        return None

    def items(self, n: Node) -> Node | None:
        it = n.s.get("items")
        return self.node(it) if isinstance(it, dict) else None

    # -- validation -------------------------------------------------------------------------

    def check(self, obj: JSON, root: Node) -> Check:
        """Walk ``obj``; drop JSON nulls from typed objects (Go decodes them as absent), turn
        numeric quantities into strings, and collect unknown fields, decode and field errors."""
        out = Check()
        self._walk(obj, root, "", out)
        return out

    def _walk(self, value: Any, n: Node, path: str, out: Check) -> Any:
        if n.raw:
            return value
        if n.quantity:
            return self._quantity(value, path, out)
        if "oneOf" in n.s:  # IntOrString
            if not isinstance(value, str | int) or isinstance(value, bool):
                out.decode.append(f"{path}: cannot unmarshal {_json_type(value)} into an int or string")
            return value
        types = n.types
        if value is None:
            return None
        if isinstance(value, dict):
            if "object" not in types:
                out.decode.append(_type_error(path, value, types))
                return value
            return self._object(value, n, path, out)
        if isinstance(value, list):
            if "array" not in types:
                out.decode.append(_type_error(path, value, types))
                return value
            item = self.items(n)
            if item is not None:
                for i, v in enumerate(value):
                    if v is None and item.struct:
                        continue
                    value[i] = self._walk(v, item, f"{path}[{i}]", out)
            return value
        if isinstance(value, bool):
            ok = "boolean" in types
        elif isinstance(value, int):
            ok = "integer" in types or "number" in types
        elif isinstance(value, float):
            ok = "number" in types or ("integer" in types and value.is_integer())
        else:
            ok = "string" in types
            if ok and n.s.get("format") == "date-time" and not _TIME_RE.match(value):
                out.decode.append(f'{path}: parsing time "{value}" as RFC 3339 failed')
        if not ok:
            out.decode.append(_type_error(path, value, types))
        return value

    def _object(self, value: JSON, n: Node, path: str, out: Check) -> JSON:
        props = n.s.get("properties")
        if props is not None:
            for key in list(value):
                sub = props.get(key)
                p = f"{path}.{key}" if path else key
                if sub is None:
                    out.unknown.append((p, value, key))
                    continue
                if value[key] is None:
                    del value[key]
                    continue
                child = self.node(sub, sub)
                value[key] = self._walk(value[key], child, p, out)
                # Optional lists and maps are omitempty in the Go types: an empty one is not stored.
                if (
                    value[key] in ([], {})
                    and (child.array or child.map)
                    and key not in n.s.get("required", ())
                    and key != "managedFields"
                ):
                    del value[key]
            for req in n.s.get("required", ()):
                if req in value:
                    continue
                sub = props.get(req, {})
                child = self.node(sub, sub)
                # A missing int or bool is Go's zero value, which the apiserver accepts unless its
                # own validation says otherwise; a missing struct is an empty one, validated inside.
                if child.types & {"integer", "boolean"} or child.quantity:
                    continue
                p = f"{path}.{req}" if path else req
                if child.struct:
                    self._object({}, child, p, out)
                    continue
                out.invalid.append(errors.required(p))
            return value
        ap = n.s.get("additionalProperties")
        if isinstance(ap, dict):
            sub_node = self.node(ap)
            for key in list(value):
                value[key] = self._walk(value[key], sub_node, f"{path}[{key}]", out)
        return value

    def _quantity(self, value: Any, path: str, out: Check) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            out.decode.append(f"{path}: quantities must be a string or a number")
            return value
        if isinstance(value, int | float):
            value = str(int(value)) if float(value).is_integer() else repr(value)
        if not _QUANTITY_RE.match(value):
            out.decode.append(
                f"{path}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            )
        return value


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_type(types: set[str]) -> str:
    for t, go in (
        ("string", "string"),
        ("integer", "int64"),
        ("number", "float64"),
        ("boolean", "bool"),
        ("array", "[]"),
        ("object", "struct"),
    ):
        if t in types:
            return go
    return "value"


def _type_error(path: str, value: Any, types: set[str]) -> str:
    return f"{path}: cannot unmarshal {_json_type(value)} into Go value of type {_go_type(types)}"


@cache
def load(version: str = DEFAULT_SCHEMA_VERSION) -> Schemas:
    """The definitions of ``version``, loaded once per process."""
    return Schemas(version)
