"""Field ownership (``metadata.managedFields``) and server-side apply.

A faithful-enough model of structured-merge-diff as the apiserver uses it:

* Every write records which manager set which fields, in the real FieldsV1 trie format
  (``f:<field>``, ``k:{"key":"value"}`` for items of listType=map lists, ``v:<json>`` for
  items of sets, ``.`` for a node that is itself owned). Writes that are not apply
  (create, update, patch) are ``operation: Update`` entries that take over the fields they
  change; apply is ``operation: Apply``.
* Apply merges the applied configuration into the live object: structs and maps merge
  field by field, listType=map lists merge item by item on their keys, sets merge by
  value, atomic lists, atomic maps and raw JSON are replaced whole.
* A field the applier set before but leaves out now is removed, unless another manager
  owns it (or something beneath it); that is how a driver drops a device status entry.
* Applying a value different from the live one on a field another manager owns is a 409
  conflict naming the manager and the field, unless ``force=true``, which takes ownership.

Not modelled: converting managed fields between API versions, the "before-first-apply"
ownership transfer, and ``i:<index>`` paths (we have no positional lists we manage).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .schema import Node, Schemas

JSON = dict[str, Any]
Path = tuple[str, ...]

# Metadata fields that are tracked; the rest (name, uid, resourceVersion, ...) belong to the server.
_MANAGED_META = {"labels", "annotations", "finalizers", "ownerReferences"}


@dataclass
class Entry:
    manager: str
    operation: str
    api_version: str
    time: str
    subresource: str = ""
    fields: set[Path] = field(default_factory=set)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.manager, self.operation, self.subresource)


def _elem_key(item: JSON, keys: tuple[str, ...]) -> str:
    return "k:" + json.dumps({k: item[k] for k in sorted(keys) if k in item}, separators=(",", ":"))


def _elem_value(value: Any) -> str:
    return "v:" + json.dumps(value, separators=(",", ":"), sort_keys=True)


def to_trie(paths: set[Path]) -> JSON:
    """FieldsV1 from a set of owned paths."""
    root: JSON = {}
    for p in sorted(paths):
        node = root
        for elem in p:
            node = node.setdefault(elem, {})
    members = set(paths)

    def mark(node: JSON, prefix: Path) -> None:
        for elem, child in node.items():
            if elem == ".":
                continue
            path = (*prefix, elem)
            if child and path in members:
                child["."] = {}
            mark(child, path)

    mark(root, ())
    return _sorted(root)


def _sorted(node: JSON) -> JSON:
    # structured-merge-diff writes children in order, "." (the node itself) first.
    return {k: _sorted(node[k]) for k in sorted(node)}


def from_trie(trie: JSON, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for elem, child in trie.items():
        if elem == ".":
            out.add(prefix)
            continue
        path = (*prefix, elem)
        if not child:
            out.add(path)
        else:
            out |= from_trie(child, path)
    return out


def read_entries(obj: JSON) -> list[Entry]:
    entries = []
    for mf in (obj.get("metadata") or {}).get("managedFields") or []:
        entries.append(
            Entry(
                manager=mf.get("manager", ""),
                operation=mf.get("operation", "Update"),
                api_version=mf.get("apiVersion", ""),
                time=mf.get("time", ""),
                subresource=mf.get("subresource", ""),
                fields=from_trie(mf.get("fieldsV1") or {}),
            )
        )
    return entries


def write_entries(obj: JSON, entries: list[Entry]) -> None:
    kept = [e for e in entries if e.fields]
    # The apiserver sorts entries by operation, then time, then manager.
    kept.sort(key=lambda e: (e.operation, e.time, e.manager))
    out = []
    for e in kept:
        mf: JSON = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        if e.time:
            mf["time"] = e.time
        mf["fieldsType"] = "FieldsV1"
        mf["fieldsV1"] = to_trie(e.fields)
        if e.subresource:
            mf["subresource"] = e.subresource
        out.append(mf)
    meta = obj.setdefault("metadata", {})
    if out:
        meta["managedFields"] = out
    else:
        meta.pop("managedFields", None)


def path_string(p: Path) -> str:
    """structured-merge-diff's printed form: ``.status.devices[device="eth1",driver="dra.net",pool="n1"].data``."""
    out = []
    for elem in p:
        kind, rest = elem[:2], elem[2:]
        if kind == "f:":
            out.append("." + rest)
        elif kind == "k:":
            keys = json.loads(rest)
            out.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in keys.items()) + "]")
        elif kind == "v:":
            out.append("[=" + rest + "]")
        else:
            out.append("[" + rest + "]")
    return "".join(out)


class FieldManager:
    """Computes field sets against the real schema, records updates and performs applies."""

    def __init__(self, schemas: Schemas) -> None:
        self.schemas = schemas

    # -- field sets -------------------------------------------------------------------------

    def leaves(self, obj: JSON, root: Node, scope: str) -> tuple[dict[Path, Any], set[Path]]:
        """Owned-field candidates of ``obj``: leaf paths with their values, and container paths
        (list items and maps) that are members themselves. ``scope`` limits them to the part a
        request may change: ``status`` for the status subresource, ``main`` for everything else."""
        values: dict[Path, Any] = {}
        containers: set[Path] = set()
        for key, value in obj.items():
            if key in ("apiVersion", "kind", "status" if scope == "main" else ""):
                continue
            if scope == "status" and key != "status":
                continue
            child = self.schemas.child(root, key)
            if key == "metadata":
                if not isinstance(value, dict):
                    continue
                for mkey in _MANAGED_META & set(value):
                    mchild = self.schemas.child(child, mkey) if child is not None else None
                    self._walk(value[mkey], mchild, ("f:metadata", f"f:{mkey}"), values, containers)
                continue
            self._walk(value, child, (f"f:{key}",), values, containers)
        return values, containers

    def _walk(
        self, value: Any, n: Node | None, path: Path, values: dict[Path, Any], containers: set[Path]
    ) -> None:
        if n is None or n.raw or n.scalar or n.atomic or value is None:
            values[path] = value
            return
        if isinstance(value, dict) and (n.struct or n.map):
            if n.map:
                containers.add(path)
            if not value:
                values[path] = {}
            for k, v in value.items():
                self._walk(v, self.schemas.child(n, k), (*path, f"f:{k}"), values, containers)
            return
        if isinstance(value, list) and n.array:
            kind, keys = n.list_semantics()
            item = self.schemas.items(n)
            if kind == "map" and all(isinstance(v, dict) for v in value):
                for v in value:
                    ip = (*path, _elem_key(v, keys))
                    containers.add(ip)
                    for k, sub in v.items():
                        self._walk(
                            sub,
                            self.schemas.child(item, k) if item else None,
                            (*ip, f"f:{k}"),
                            values,
                            containers,
                        )
                if not value:
                    values[path] = []
                return
            if kind == "set":
                for v in value:
                    values[(*path, _elem_value(v))] = v
                if not value:
                    values[path] = []
                return
        values[path] = value

    # -- updates ----------------------------------------------------------------------------

    def record_update(
        self,
        old: JSON | None,
        new: JSON,
        root: Node,
        manager: str,
        subresource: str,
        api_version: str,
        now: str,
    ) -> None:
        """Give ``manager`` the fields this non-apply write changed; set ``new``'s managedFields."""
        scope = "status" if subresource == "status" else "main"
        entries = self._incoming_entries(old, new)
        old_vals, old_cont = self.leaves(old, root, scope) if old else ({}, set())
        new_vals, new_cont = self.leaves(new, root, scope)
        changed = {p for p, v in new_vals.items() if p not in old_vals or old_vals[p] != v}
        changed |= new_cont - old_cont
        removed = (set(old_vals) - set(new_vals)) | (old_cont - new_cont)
        key = (manager, "Update", subresource)
        mine = next((e for e in entries if e.key == key), None)
        for e in entries:
            if e is not mine:
                e.fields -= changed | removed
        if mine is None and changed:
            mine = Entry(manager, "Update", api_version, now, subresource)
            entries.append(mine)
        if mine is not None:
            before = set(mine.fields)
            mine.fields = (mine.fields - removed) | changed
            if mine.fields != before:
                mine.time = now
                mine.api_version = api_version
        write_entries(new, entries)

    def _incoming_entries(self, old: JSON | None, new: JSON) -> list[Entry]:
        """The client may reset managedFields by sending ``[]`` or replace them; omitting keeps them."""
        meta = new.get("metadata") or {}
        if "managedFields" in meta and old is not None:
            sent = meta.get("managedFields")
            if sent != (old.get("metadata") or {}).get("managedFields"):
                return read_entries(new)
        return read_entries(old) if old is not None else read_entries(new)

    # -- apply ------------------------------------------------------------------------------

    def apply(
        self,
        live: JSON,
        applied: JSON,
        root: Node,
        manager: str,
        force: bool,
        subresource: str,
        api_version: str,
        now: str,
    ) -> JSON:
        """The object after ``manager`` applies ``applied`` to ``live`` (managedFields set)."""
        scope = "status" if subresource == "status" else "main"
        entries = read_entries(live)
        key = (manager, "Apply", subresource)
        mine = next((e for e in entries if e.key == key), None)
        previous = set(mine.fields) if mine is not None else set()

        applied_vals, applied_cont = self.leaves(applied, root, scope)
        applied_set = set(applied_vals) | applied_cont
        live_vals, _ = self.leaves(live, root, scope)

        conflicts: list[tuple[Entry, Path]] = []
        for e in entries:
            if e is mine:
                continue
            for p in sorted(e.fields & set(applied_vals)):
                if p in live_vals and live_vals[p] != applied_vals[p]:
                    conflicts.append((e, p))
        if conflicts and not force:
            raise _conflict_error(conflicts)
        for e, p in conflicts:
            e.fields.discard(p)

        merged = copy.deepcopy(live)
        for k, v in applied.items():
            if k in ("apiVersion", "kind"):
                continue
            if scope == "status" and k != "status":
                continue
            if scope == "main" and k == "status":
                continue
            if k == "metadata":
                meta = merged.setdefault("metadata", {})
                child = self.schemas.child(root, "metadata")
                for mk in _MANAGED_META & set(v or {}):
                    mchild = self.schemas.child(child, mk) if child is not None else None
                    meta[mk] = self._merge(meta.get(mk), v[mk], mchild)
                continue
            merged[k] = self._merge(merged.get(k), v, self.schemas.child(root, k))

        others: set[Path] = set()
        for e in entries:
            if e is not mine:
                others |= e.fields
        # Parents first: once an item is gone, paths beneath it no longer resolve.
        for p in sorted(previous - applied_set, key=len):
            if p in others or any(q[: len(p)] == p for q in others):
                continue
            _remove_path(merged, p)

        if mine is None:
            mine = Entry(manager, "Apply", api_version, now, subresource)
            entries.append(mine)
        mine.fields = applied_set
        mine.time = now
        mine.api_version = api_version
        # Fields the applier now sets with the same value another Update manager had stay shared.
        write_entries(merged, entries)
        return merged

    def _merge(self, live: Any, applied: Any, n: Node | None) -> Any:
        if applied is None:
            return None
        if n is None or n.raw or n.scalar or n.atomic:
            return copy.deepcopy(applied)
        if isinstance(applied, dict) and (n.struct or n.map):
            out = dict(live) if isinstance(live, dict) else {}
            for k, v in applied.items():
                if v is None:
                    out.pop(k, None)
                else:
                    out[k] = self._merge(out.get(k), v, self.schemas.child(n, k))
            return out
        if isinstance(applied, list) and n.array:
            kind, keys = n.list_semantics()
            current = list(live) if isinstance(live, list) else []
            if kind == "map":
                item = self.schemas.items(n)
                for v in applied:
                    if not isinstance(v, dict):
                        return copy.deepcopy(applied)
                    ident = _elem_key(v, keys)
                    idx = next(
                        (
                            i
                            for i, c in enumerate(current)
                            if isinstance(c, dict) and _elem_key(c, keys) == ident
                        ),
                        None,
                    )
                    if idx is None:
                        current.append(copy.deepcopy(v))
                    else:
                        current[idx] = self._merge(current[idx], v, item)
                return current
            if kind == "set":
                for v in applied:
                    if v not in current:
                        current.append(copy.deepcopy(v))
                return current
        return copy.deepcopy(applied)


def _remove_path(obj: Any, p: Path) -> None:
    """Remove the field or list item at ``p``; empty lists and maps left behind go too,
    as omitempty fields of a typed object do."""
    trail: list[tuple[Any, Any]] = []
    cur = obj
    for elem in p:
        kind, rest = elem[:2], elem[2:]
        if kind == "f:" and isinstance(cur, dict) and rest in cur:
            trail.append((cur, rest))
            cur = cur[rest]
        elif kind == "k:" and isinstance(cur, list):
            keys = json.loads(rest)
            idx = next(
                (
                    i
                    for i, v in enumerate(cur)
                    if isinstance(v, dict) and all(v.get(k) == kv for k, kv in keys.items())
                ),
                None,
            )
            if idx is None:
                return
            trail.append((cur, idx))
            cur = cur[idx]
        elif kind == "v:" and isinstance(cur, list):
            value = json.loads(rest)
            if value not in cur:
                return
            trail.append((cur, cur.index(value)))
            cur = value
        else:
            return
    while trail:
        container, k = trail.pop()
        del container[k]
        # Top-level fields (spec, status) stay, as the typed object always has them.
        if container or len(trail) <= 1:
            break


def _conflict_error(conflicts: list[tuple[Entry, Path]]) -> ApiError:
    def who(e: Entry) -> str:
        return f'"{e.manager}" using {e.api_version}' if e.api_version else f'"{e.manager}"'

    if len(conflicts) == 1:
        e, p = conflicts[0]
        text = f"conflict with {who(e)}: {path_string(p)}"
    else:
        lines: list[str] = []
        by: dict[str, list[str]] = {}
        for e, p in conflicts:
            by.setdefault(who(e), []).append(path_string(p))
        for m, paths in by.items():
            lines.append(f"conflicts with {m}:")
            lines.extend(f"- {p}" for p in paths)
        text = "\n".join(lines)
    n = len(conflicts)
    return ApiError(
        409,
        "Conflict",
        f"Apply failed with {n} conflict{'s' if n != 1 else ''}: {text}",
        {
            "causes": [
                {
                    "reason": "FieldManagerConflict",
                    "message": f"conflict with {who(e)}",
                    "field": path_string(p),
                }
                for e, p in conflicts
            ]
        },
    )
