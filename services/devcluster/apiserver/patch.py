"""The three non-apply patch types the apiserver accepts for built-in resources.

* JSON merge patch (RFC 7386): objects merge, ``null`` deletes, everything else replaces.
* JSON patch (RFC 6902): add, remove, replace, move, copy, test.
* Strategic merge patch, driven by the real schema's ``x-kubernetes-patch-strategy`` and
  ``x-kubernetes-patch-merge-key`` (the OpenAPI form of the Go struct tags the apiserver
  reads): lists with strategy ``merge`` merge by their key (or as a set of scalars), other
  lists are replaced; the directives ``$patch`` (replace/delete/merge),
  ``$deleteFromPrimitiveList/<field>``, ``$setElementOrder/<field>`` and ``$retainKeys`` are
  honoured. Lists without a merge strategy are replaced whole, exactly as the real server
  does -- e.g. ``status.devices`` of a ResourceClaim is a listType=map for server-side apply
  but has no patch strategy, so a strategic merge patch replaces it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import ApiError, bad_request
from .schema import Node, Schemas

JSON = dict[str, Any]

_DIRECTIVE_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_DIRECTIVE_ORDER = "$setElementOrder/"


def _unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message, {"causes": [{"message": message}]})


# -- JSON merge patch ------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# -- JSON patch --------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _unprocessable(f"invalid JSON pointer {path!r}: must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, path: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise _unprocessable(f"invalid array index {token!r} in {path}")
    i = int(token)
    if i > len(container) or (i == len(container) and not allow_end):
        raise _unprocessable(f"array index out of bounds in {path}: {i}")
    return i


def _parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for t in tokens[:-1]:
        if isinstance(cur, dict):
            if t not in cur:
                raise _unprocessable(f"doc is missing path: {path}: missing value")
            cur = cur[t]
        elif isinstance(cur, list):
            cur = cur[_index(cur, t, path, False)]
        else:
            raise _unprocessable(f"doc is missing path: {path}: missing value")
    return cur, tokens[-1]


def _get(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable(f"doc is missing key: {path}: missing value")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, path, False)]
    raise _unprocessable(f"doc is missing path: {path}: missing value")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, path, True), value)
    else:
        raise _unprocessable(f"add operation does not apply: doc is missing path: {path}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise _unprocessable("remove operation does not apply to the whole document")
    parent, last = _parent(doc, tokens, path)
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable(f"remove operation does not apply: doc is missing path: {path}")
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, path, False)]
    else:
        raise _unprocessable(f"remove operation does not apply: doc is missing path: {path}")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a copy of ``doc``."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {json.dumps(op)}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = (
                _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
                if _pointer(path)
                else op["value"]
            )
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _add(_remove(doc, op["from"]), path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise _unprocessable(f"testing value {path} failed: test failed")
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


# -- strategic merge patch -------------------------------------------------------------------


class StrategicMerge:
    """``strategicpatch.StrategicMergePatch`` against the real schema."""

    def __init__(self, schemas: Schemas) -> None:
        self.schemas = schemas

    def apply(self, original: JSON, patch: JSON, root: Node) -> JSON:
        if not isinstance(patch, dict):
            raise bad_request("strategic merge patch must be a JSON object")
        result = self._map(copy.deepcopy(original), patch, root)
        return result if result is not None else {}

    def _map(self, original: JSON, patch: JSON, n: Node | None) -> JSON | None:
        directive = patch.get("$patch")
        if directive == "delete":
            return None
        if directive == "replace":
            return self._strip({k: v for k, v in patch.items() if k != "$patch"}, n)
        if directive not in (None, "merge"):
            raise bad_request(f"Unknown patch type: {directive} in map: {json.dumps(patch)}")
        if n is not None and n.raw:
            merged = merge_patch(original, {k: v for k, v in patch.items() if k != "$patch"})
            return merged if isinstance(merged, dict) else {}
        retain = patch.get("$retainKeys")
        if retain is not None:
            if not isinstance(retain, list):
                raise bad_request("$retainKeys must be a list")
            for key in list(original):
                if key not in retain:
                    del original[key]
        orders: dict[str, list[Any]] = {}
        for key, value in patch.items():
            if key.startswith(_DIRECTIVE_DELETE_PRIMITIVE):
                name = key[len(_DIRECTIVE_DELETE_PRIMITIVE) :]
                if not isinstance(value, list):
                    raise bad_request(f"{key} must be a list")
                if isinstance(original.get(name), list):
                    original[name] = [v for v in original[name] if v not in value]
            elif key.startswith(_DIRECTIVE_ORDER):
                if not isinstance(value, list):
                    raise bad_request(f"{key} must be a list")
                orders[key[len(_DIRECTIVE_ORDER) :]] = value
        for key, value in patch.items():
            if key.startswith("$"):
                continue
            child = self.schemas.child(n, key) if n is not None and not n.raw else None
            if value is None:
                original.pop(key, None)
                continue
            current = original.get(key)
            if isinstance(value, dict):
                merged = self._map(current if isinstance(current, dict) else {}, value, child)
                if merged is None:
                    original.pop(key, None)
                else:
                    original[key] = merged
            elif isinstance(value, list):
                original[key] = self._list(current if isinstance(current, list) else [], value, child)
            else:
                original[key] = value
        for name, order in orders.items():
            if isinstance(original.get(name), list):
                child = self.schemas.child(n, name) if n is not None else None
                original[name] = self._order(original[name], order, child)
        return original

    def _list(self, original: list[Any], patch: list[Any], n: Node | None) -> list[Any]:
        strategy = (n.ext("x-kubernetes-patch-strategy") or "") if n is not None else ""
        if "merge" not in strategy.split(","):
            # Replace: drop directive items, as a patch list replacing a list carries no directives.
            return [self._strip(v, self.schemas.items(n) if n is not None else None) for v in patch]
        for item in patch:
            if isinstance(item, dict) and item.get("$patch") == "replace":
                rest = [v for v in patch if v is not item]
                return [self._strip(v, self.schemas.items(n) if n is not None else None) for v in rest]
        key = n.ext("x-kubernetes-patch-merge-key") if n is not None else None
        item_node = self.schemas.items(n) if n is not None else None
        if not key:
            out = list(original)
            for v in patch:
                if v not in out:
                    out.append(v)
            return out
        out = list(original)
        for item in patch:
            if not isinstance(item, dict):
                raise bad_request(
                    f"merging an object in json but data type is not struct, instead is: {item!r}"
                )
            if key not in item:
                raise bad_request(f"map: {json.dumps(item)} does not contain declared merge key: {key}")
            idx = next(
                (i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == item[key]),
                None,
            )
            if item.get("$patch") == "delete":
                if idx is not None:
                    del out[idx]
                continue
            if idx is None:
                stripped = self._strip(item, item_node)
                out.append(stripped)
            else:
                merged = self._map(out[idx], item, item_node)
                if merged is None:
                    del out[idx]
                else:
                    out[idx] = merged
        return out

    def _order(self, merged: list[Any], order: list[Any], n: Node | None) -> list[Any]:
        key = n.ext("x-kubernetes-patch-merge-key") if n is not None else None

        def ident(v: Any) -> Any:
            if key and isinstance(v, dict):
                return json.dumps(v.get(key), sort_keys=True)
            return json.dumps(v, sort_keys=True)

        rank = {ident(v): i for i, v in enumerate(order)}
        listed = sorted((v for v in merged if ident(v) in rank), key=lambda v: rank[ident(v)])
        others = [v for v in merged if ident(v) not in rank]
        return listed + others

    def _strip(self, value: Any, n: Node | None) -> Any:
        """A patch fragment used as a plain value: apply it to nothing so directives vanish."""
        if isinstance(value, dict):
            merged = self._map({}, value, n)
            return merged if merged is not None else {}
        if isinstance(value, list):
            item = self.schemas.items(n) if n is not None else None
            return [self._strip(v, item) for v in value]
        return value
