"""In-memory object storage with one global resourceVersion counter, a bounded event history
per resource (the watch cache) and watchers.

Stored objects are never mutated in place: every write stores a fresh dict, so readers and
history entries can share them. All methods run on the event loop thread; a write is one
synchronous step (version, store, history, fan-out), so watchers never miss or reorder
events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import expired
from .selectors import FieldSelector, LabelSelector

JSON = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects

log = logging.getLogger(__name__)

STATE_FORMAT = 1


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED
    rv: int
    obj: JSON  # the object after the change; for DELETED its last state with the deletion version
    prev: JSON | None  # the object before the change (None for ADDED)
    _encoded: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def encoded(self, type_: str) -> bytes:
        """The watch line for this event, encoded once per event type and shared by watchers."""
        line = self._encoded.get(type_)
        if line is None:
            line = json.dumps({"type": type_, "object": self.obj}, separators=(",", ":")).encode() + b"\n"
            self._encoded[type_] = line
        return line


class Watcher:
    """One watch: a namespace, selectors and a bounded queue of (type, event)."""

    QUEUE_SIZE = 10000

    def __init__(
        self,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        fields_of: Callable[[JSON], dict[str, str]],
    ) -> None:
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.fields_of = fields_of
        self.queue: asyncio.Queue[tuple[str, Event] | None] = asyncio.Queue(self.QUEUE_SIZE)
        self.closed = False

    def matches(self, obj: JSON | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace", "") != self.namespace:
            return False
        if not self.labels.empty and not self.labels.matches(meta.get("labels")):
            return False
        return self.fields.empty or self.fields.matches(self.fields_of(obj))

    def translate(self, ev: Event) -> str | None:
        """The event type this watcher sees: an update that moves an object into or out of the
        selection is an ADDED or DELETED for it, as the watch cache reports it."""
        if ev.type == "ADDED":
            return "ADDED" if self.matches(ev.obj) else None
        if ev.type == "DELETED":
            return "DELETED" if self.matches(ev.obj) else None
        now, before = self.matches(ev.obj), self.matches(ev.prev)
        if now and before:
            return "MODIFIED"
        if now:
            return "ADDED"
        if before:
            return "DELETED"
        return None

    def offer(self, ev: Event) -> None:
        if self.closed:
            return
        kind = self.translate(ev)
        if kind is None:
            return
        try:
            self.queue.put_nowait((kind, ev))
        except asyncio.QueueFull:
            # The real watch cache drops watchers that cannot keep up; the client re-lists.
            log.warning("closing a watcher that fell %d events behind", self.QUEUE_SIZE)
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.queue.put_nowait(None)
            except asyncio.QueueFull:
                self.queue.get_nowait()
                self.queue.put_nowait(None)


class Storage:
    """Objects by resource plural, a global resourceVersion and per-resource history."""

    def __init__(self, history_size: int = 1000, on_change: Callable[[], None] | None = None) -> None:
        self.rv = 0
        # The version the history starts from (server start or state load).
        self.start_rv = 0
        self.objects: dict[str, dict[Key, JSON]] = {}
        self.history_size = history_size
        self.history: dict[str, deque[Event]] = {}
        # Every event with rv > history_start[plural] is still in history[plural].
        self.history_start: dict[str, int] = {}
        self.watchers: dict[str, set[Watcher]] = {}
        self.uids: dict[str, tuple[str, Key]] = {}
        self.on_change = on_change
        self.listeners: list[Callable[[str, Event], None]] = []

    # -- reads ------------------------------------------------------------------------------

    def get(self, plural: str, key: Key) -> JSON | None:
        return self.objects.get(plural, {}).get(key)

    def items(self, plural: str, namespace: str | None = None) -> list[tuple[Key, JSON]]:
        """Objects in key order (namespace, then name), as etcd returns them."""
        objs = self.objects.get(plural, {})
        keys = sorted(k for k in objs if namespace is None or k[0] == namespace)
        return [(k, objs[k]) for k in keys]

    def by_uid(self, uid: str) -> tuple[str, JSON] | None:
        where = self.uids.get(uid)
        if where is None:
            return None
        obj = self.get(where[0], where[1])
        return (where[0], obj) if obj is not None else None

    def all_objects(self) -> Iterable[tuple[str, Key, JSON]]:
        for plural, objs in self.objects.items():
            for key, obj in list(objs.items()):
                yield plural, key, obj

    # -- writes -----------------------------------------------------------------------------

    def _next(self, obj: JSON) -> int:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return self.rv

    def _record(self, plural: str, ev: Event) -> None:
        hist = self.history.setdefault(plural, deque())
        self.history_start.setdefault(plural, self.start_rv)
        hist.append(ev)
        while len(hist) > self.history_size:
            dropped = hist.popleft()
            self.history_start[plural] = dropped.rv
        for w in list(self.watchers.get(plural, ())):
            w.offer(ev)
        for listener in self.listeners:
            listener(plural, ev)
        if self.on_change is not None:
            self.on_change()

    def create(self, plural: str, key: Key, obj: JSON) -> JSON:
        rv = self._next(obj)
        self.objects.setdefault(plural, {})[key] = obj
        uid = obj["metadata"].get("uid")
        if uid:
            self.uids[uid] = (plural, key)
        self._record(plural, Event("ADDED", rv, obj, None))
        return obj

    def update(self, plural: str, key: Key, obj: JSON, old: JSON) -> JSON:
        rv = self._next(obj)
        self.objects[plural][key] = obj
        self._record(plural, Event("MODIFIED", rv, obj, old))
        return obj

    def delete(self, plural: str, key: Key, old: JSON) -> JSON:
        """Remove the object; the DELETED event carries its last state with the deletion version."""
        del self.objects[plural][key]
        self.uids.pop(old["metadata"].get("uid", ""), None)
        final = dict(old)
        final["metadata"] = dict(old["metadata"])
        rv = self._next(final)
        self._record(plural, Event("DELETED", rv, final, old))
        return final

    # -- history ----------------------------------------------------------------------------

    def oldest_available(self, plural: str) -> int:
        return self.history_start.get(plural, self.start_rv)

    def events_since(self, plural: str, rv: int) -> list[Event]:
        """Events after ``rv``; 410 Expired when some of them are no longer kept."""
        start = self.oldest_available(plural)
        if rv < start:
            raise expired(f"too old resource version: {rv} ({start})")
        return [ev for ev in self.history.get(plural, ()) if ev.rv > rv]

    def snapshot(self, plural: str, rv: int) -> dict[Key, JSON]:
        """The objects of ``plural`` as they were at ``rv`` (for continue tokens and exact reads)."""
        start = self.oldest_available(plural)
        if rv < start:
            raise expired(f"too old resource version: {rv} ({start})")
        snap = dict(self.objects.get(plural, {}))
        for ev in reversed(self.history.get(plural, ())):
            if ev.rv <= rv:
                break
            meta = ev.obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            if ev.prev is None:
                snap.pop(key, None)
            else:
                snap[key] = ev.prev
        return snap

    # -- watchers ---------------------------------------------------------------------------

    def add_watcher(self, plural: str, w: Watcher) -> None:
        self.watchers.setdefault(plural, set()).add(w)

    def remove_watcher(self, plural: str, w: Watcher) -> None:
        self.watchers.get(plural, set()).discard(w)

    def close_watchers(self) -> None:
        for ws in self.watchers.values():
            for w in list(ws):
                w.close()

    # -- persistence ------------------------------------------------------------------------

    def dump(self) -> JSON:
        return {
            "format": STATE_FORMAT,
            "resourceVersion": self.rv,
            "objects": {plural: [obj for _, obj in self.items(plural)] for plural in self.objects},
        }

    def load(self, state: JSON) -> None:
        """Replace everything with a saved state; history restarts at the saved version, so a
        watch from an older version gets 410, as after a real apiserver restart."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"state format {state.get('format')!r} is not {STATE_FORMAT}")
        self.rv = int(state["resourceVersion"])
        self.objects = {}
        self.uids = {}
        for plural, objs in state["objects"].items():
            bucket = self.objects.setdefault(plural, {})
            for obj in objs:
                meta = obj["metadata"]
                key = (meta.get("namespace", ""), meta["name"])
                bucket[key] = obj
                if meta.get("uid"):
                    self.uids[meta["uid"]] = (plural, key)
        self.history = {}
        self.history_start = {}
        self.start_rv = self.rv

    def save_file(self, path: str) -> None:
        """Write the state atomically (temp file, fsync, rename)."""
        data = json.dumps(self.dump(), separators=(",", ":")).encode()
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
