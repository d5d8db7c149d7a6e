"""The PodConfigStore's records on LMDB, with an in-memory view for reads.

Rules (seed, "Restart and shutdown"): a write is committed and fsynced to LMDB
before the in-memory view changes; if the disk write fails the call fails and
nothing changes; every record reloads on open. The map grows when it is full.

Writes are serialised: ``StoreDB`` is used from one writer at a time (the server
holds a lock) and each write is one LMDB transaction. Reads come from memory.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import lmdb

from proto.dranet.store.v1 import store_pb2 as pb

log = logging.getLogger(__name__)

DEVICES = b"devices"
RESULTS = b"results"
ACTIVITY = b"activity"
# PersistentResourceSliceAttributes: devices the inventory keeps in the ResourceSlice
# while they are in a Pod, keyed <claim uid>/<device>. An older store without the table
# opens this database unchanged; the table is created on first open.
KEPT = b"kept"
META = b"meta"
REVISION_KEY = b"revision"
SCHEMA_KEY = b"schema"
SCHEMA_VERSION = b"1"

DEFAULT_MAP_SIZE = 64 << 20
DEFAULT_MAX_MAP_SIZE = 64 << 30
MAX_KEY_PART = 253

Table = Literal["devices", "results", "activity", "kept"]


class StoreError(Exception):
    """A store call that cannot be done; ``code`` is the gRPC status name."""

    code = "INTERNAL"


class InvalidArgument(StoreError):
    code = "INVALID_ARGUMENT"


class NotFound(StoreError):
    code = "NOT_FOUND"


class Conflict(StoreError):
    """The write expected a free key and found a record there; nothing was written."""

    code = "FAILED_PRECONDITION"


class WriteFailed(StoreError):
    """The disk write failed; nothing was changed."""

    code = "UNAVAILABLE"


class StoreFull(StoreError):
    code = "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class Change:
    """One committed record change, for watchers."""

    kind: Literal["put", "delete"]
    table: Table
    record: pb.DeviceConfig | pb.AttachResult | pb.PodActivity | pb.KeptDevice


@dataclass
class _Memory:
    devices: dict[tuple[str, str], pb.DeviceConfig] = field(default_factory=dict)
    results: dict[tuple[str, str], pb.AttachResult] = field(default_factory=dict)
    activity: dict[str, pb.PodActivity] = field(default_factory=dict)
    kept: dict[tuple[str, str], pb.KeptDevice] = field(default_factory=dict)  # (claim uid, device)
    # pod uid -> device names with a config or a result, for per-pod calls
    by_pod: dict[str, set[str]] = field(default_factory=dict)


def _check_part(name: str, value: str) -> None:
    if not value:
        raise InvalidArgument(f"{name}: must not be empty")
    if len(value.encode()) > MAX_KEY_PART:
        raise InvalidArgument(f"{name}: {len(value.encode())} bytes, at most {MAX_KEY_PART} allowed")
    if "/" in value or "\x00" in value:
        raise InvalidArgument(f"{name}: {value!r} must not contain '/' or NUL")


def device_key(pod_uid: str, device: str) -> bytes:
    _check_part("pod_uid", pod_uid)
    _check_part("device", device)
    return f"{pod_uid}/{device}".encode()


def kept_key(claim_uid: str, device: str) -> bytes:
    _check_part("claim.uid", claim_uid)
    _check_part("device", device)
    return f"{claim_uid}/{device}".encode()


def _split_key(key: bytes) -> tuple[str, str]:
    pod, _, dev = key.decode().partition("/")
    return pod, dev


class StoreDB:
    """LMDB environment plus the in-memory view. Not thread-safe for writes:
    callers serialise writes; reads may run concurrently with nothing else."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = DEFAULT_MAX_MAP_SIZE,
    ) -> None:
        self.path = Path(path)
        self.map_size = map_size
        self.max_map_size = max_map_size
        self.revision = 0
        self._mem = _Memory()
        self._env: lmdb.Environment | None = None
        self._dbs: dict[bytes, lmdb._Database] = {}
        self._broken = False
        # Guards the memory view: writes run on a worker thread, reads on the
        # event loop. Held only while dicts change or are read, never across I/O.
        self._mu = threading.Lock()

    # --- lifecycle --------------------------------------------------------------------

    def open(self) -> None:
        """Open (creating if needed) and load every record into memory."""
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._open_env()
        self._load()

    def _open_env(self) -> None:
        data = self.path / "data.mdb"
        # An existing file may already be larger than the configured map.
        size = max(self.map_size, data.stat().st_size if data.exists() else 0)
        self._env = lmdb.open(
            str(self.path),
            map_size=size,
            max_dbs=8,
            subdir=True,
            sync=True,
            metasync=True,
            writemap=False,
            map_async=False,
            mode=0o600,
            max_readers=64,
        )
        self.map_size = self._env.info()["map_size"]
        # Readers left by a killed process pin old pages; clear them.
        stale = self._env.reader_check()
        if stale:
            log.info("cleared stale LMDB readers", extra={"count": stale})
        self._dbs = {name: self._env.open_db(name) for name in (DEVICES, RESULTS, ACTIVITY, KEPT, META)}
        with self._env.begin(write=True) as txn:
            schema = txn.get(SCHEMA_KEY, db=self._dbs[META])
            if schema is None:
                txn.put(SCHEMA_KEY, SCHEMA_VERSION, db=self._dbs[META])
            elif schema != SCHEMA_VERSION:
                raise StoreError(
                    f"store at {self.path} has schema {schema!r}, this build reads {SCHEMA_VERSION!r}"
                )
        self._broken = False

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def counts(self) -> dict[Table, int]:
        """How many records each table holds (from memory; for metrics)."""
        mem = self._mem
        return {
            "devices": len(mem.devices),
            "results": len(mem.results),
            "activity": len(mem.activity),
            "kept": len(mem.kept),
        }

    def health(self) -> tuple[bool, str]:
        """Ready while the LMDB environment is open and the last write did not break it."""
        if self._env is None:
            return False, f"store at {self.path} is not open"
        if self._broken:
            return False, f"store at {self.path}: the last disk write failed; reopening on the next write"
        return True, ""

    def _load(self) -> None:
        assert self._env is not None
        mem = _Memory()
        with self._env.begin() as txn:
            raw = txn.get(REVISION_KEY, db=self._dbs[META])
            revision = struct.unpack(">Q", raw)[0] if raw else 0
            for key, value in txn.cursor(db=self._dbs[DEVICES]):
                dc = pb.DeviceConfig.FromString(value)
                k = _split_key(key)
                mem.devices[k] = dc
                mem.by_pod.setdefault(k[0], set()).add(k[1])
            for key, value in txn.cursor(db=self._dbs[RESULTS]):
                ar = pb.AttachResult.FromString(value)
                k = _split_key(key)
                mem.results[k] = ar
                mem.by_pod.setdefault(k[0], set()).add(k[1])
            for key, value in txn.cursor(db=self._dbs[ACTIVITY]):
                mem.activity[key.decode()] = pb.PodActivity.FromString(value)
            for key, value in txn.cursor(db=self._dbs[KEPT]):
                mem.kept[_split_key(key)] = pb.KeptDevice.FromString(value)
        with self._mu:
            self._mem = mem
            self.revision = revision
        log.info(
            "store loaded",
            extra={
                "path": str(self.path),
                "devices": len(mem.devices),
                "results": len(mem.results),
                "pods": len(mem.activity),
                "kept": len(mem.kept),
                "revision": revision,
            },
        )

    # --- the one write path -----------------------------------------------------------

    def _commit(self, ops: list[tuple[bytes, bytes, bytes | None]]) -> int:
        """Apply (db, key, value-or-None) in one durable transaction; returns the new
        revision. On failure nothing is written and memory is untouched."""
        assert self._env is not None and not self._broken
        revision = self.revision + 1
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for db, key, value in ops:
                        if value is None:
                            txn.delete(key, db=self._dbs[db])
                        else:
                            txn.put(key, value, db=self._dbs[db])
                    txn.put(REVISION_KEY, struct.pack(">Q", revision), db=self._dbs[META])
                return revision
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                # LMDB may flag the environment unusable after an I/O error while
                # writing its meta page; reopen before the next write.
                self._broken = True
                raise WriteFailed(f"disk write to {self.path} failed, nothing changed: {exc}") from exc

    def _ready(self) -> None:
        """Called first by every write: reopen after an earlier failed write."""
        if self._broken or self._env is None:
            self._reopen()

    def _grow(self) -> None:
        assert self._env is not None
        new_size = min(self.map_size * 2, self.max_map_size)
        if new_size <= self.map_size:
            raise StoreFull(
                f"store map at {self.path} is full at {self.map_size} bytes (limit --max-map-size {self.max_map_size})"
            )
        self._env.set_mapsize(new_size)
        log.info("store map grown", extra={"from_bytes": self.map_size, "to_bytes": new_size})
        self.map_size = new_size

    def _reopen(self) -> None:
        """Reopen after a failed write and reload, so memory matches the disk."""
        log.warning("reopening the store after a failed write", extra={"path": str(self.path)})
        self.close()
        try:
            self._open_env()
        except lmdb.Error as exc:
            self._broken = True
            raise WriteFailed(f"store at {self.path} cannot be reopened: {exc}") from exc
        self._load()

    # --- writes -----------------------------------------------------------------------

    def put_devices(
        self,
        configs: Iterable[pb.DeviceConfig],
        kept: Iterable[pb.KeptDevice] = (),
        *,
        expect_new: bool = False,
    ) -> tuple[list[int], list[Change]]:
        """DeviceConfigs and KeptDevices in one durable transaction; the revision of
        each config, in order. With ``expect_new`` every config's key must be free or
        hold a provisional config of the same claim (Conflict otherwise, nothing
        written); writes are serialized, so nothing comes between the check and the
        commit."""
        self._ready()
        items: list[tuple[tuple[str, str], pb.DeviceConfig]] = []
        for i, cfg in enumerate(configs):
            try:
                key = device_key(cfg.pod.uid, cfg.device)
            except InvalidArgument as exc:
                raise InvalidArgument(f"configs[{i}].{exc}") from None
            if not cfg.claim.uid:
                raise InvalidArgument(f"configs[{i}].claim.uid: must not be empty (device {cfg.device})")
            items.append((_split_key(key), cfg))
        kept_items: list[tuple[tuple[str, str], pb.KeptDevice]] = []
        for i, kd in enumerate(kept):
            try:
                key = kept_key(kd.claim.uid, kd.device)
            except InvalidArgument as exc:
                raise InvalidArgument(f"kept[{i}].{exc}") from None
            if not kd.device_json:
                raise InvalidArgument(f"kept[{i}].device_json: must not be empty (device {kd.device})")
            kept_items.append((_split_key(key), kd))
        if not items and not kept_items:
            return [], []
        if expect_new:
            with self._mu:
                for k, cfg in items:
                    cur = self._mem.devices.get(k)
                    if cur is not None and (cur.claim.uid != cfg.claim.uid or not cur.provisional):
                        raise Conflict(
                            f"device {cfg.device} of pod {cfg.pod.namespace}/{cfg.pod.name} is already "
                            f"prepared by claim {cur.claim.namespace}/{cur.claim.name} ({cur.claim.uid})"
                        )
        revision = self.revision + 1
        stored: list[tuple[tuple[str, str], pb.DeviceConfig]] = []
        stored_kept: list[tuple[tuple[str, str], pb.KeptDevice]] = []
        ops: list[tuple[bytes, bytes, bytes | None]] = []
        for k, cfg in items:
            rec = pb.DeviceConfig()
            rec.CopyFrom(cfg)
            rec.revision = revision
            stored.append((k, rec))
            ops.append((DEVICES, f"{k[0]}/{k[1]}".encode(), rec.SerializeToString()))
        for k, kd in kept_items:
            krec = pb.KeptDevice()
            krec.CopyFrom(kd)
            krec.revision = revision
            stored_kept.append((k, krec))
            ops.append((KEPT, f"{k[0]}/{k[1]}".encode(), krec.SerializeToString()))
        self._commit(ops)
        changes = []
        with self._mu:
            for k, rec in stored:
                self._mem.devices[k] = rec
                self._mem.by_pod.setdefault(k[0], set()).add(k[1])
                changes.append(Change("put", "devices", rec))
            for k, krec in stored_kept:
                self._mem.kept[k] = krec
                changes.append(Change("put", "kept", krec))
            self.revision = revision
        return [revision] * len(stored), changes

    def put_result(self, result: pb.AttachResult) -> tuple[int, list[Change]]:
        self._ready()
        key = device_key(result.pod_uid, result.device)
        revision = self.revision + 1
        rec = pb.AttachResult()
        rec.CopyFrom(result)
        rec.revision = revision
        self._commit([(RESULTS, key, rec.SerializeToString())])
        k = _split_key(key)
        with self._mu:
            self._mem.results[k] = rec
            self._mem.by_pod.setdefault(k[0], set()).add(k[1])
            self.revision = revision
        return revision, [Change("put", "results", rec)]

    def touch_pod(self, activity: pb.PodActivity) -> tuple[int, list[Change]]:
        self._ready()
        _check_part("pod_uid", activity.pod_uid)
        revision = self.revision + 1
        rec = pb.PodActivity()
        rec.CopyFrom(activity)
        if not rec.last_nri_activity_unix_nano:
            rec.last_nri_activity_unix_nano = time.time_ns()
        rec.revision = revision
        self._commit([(ACTIVITY, rec.pod_uid.encode(), rec.SerializeToString())])
        with self._mu:
            self._mem.activity[rec.pod_uid] = rec
            self.revision = revision
        return revision, [Change("put", "activity", rec)]

    def _delete(
        self,
        devices: Iterable[tuple[str, str]] = (),
        results: Iterable[tuple[str, str]] = (),
        activity: Iterable[str] = (),
        kept: Iterable[tuple[str, str]] = (),
    ) -> tuple[int, list[Change]]:
        devices = [k for k in devices if k in self._mem.devices]
        results = [k for k in results if k in self._mem.results]
        activity = [p for p in activity if p in self._mem.activity]
        kept = [k for k in kept if k in self._mem.kept]
        if not (devices or results or activity or kept):
            return 0, []
        ops: list[tuple[bytes, bytes, bytes | None]] = []
        ops += [(DEVICES, f"{p}/{d}".encode(), None) for p, d in devices]
        ops += [(RESULTS, f"{p}/{d}".encode(), None) for p, d in results]
        ops += [(ACTIVITY, p.encode(), None) for p in activity]
        ops += [(KEPT, f"{c}/{d}".encode(), None) for c, d in kept]
        revision = self._commit(ops)
        changes: list[Change] = []
        with self._mu:
            for k in devices:
                changes.append(Change("delete", "devices", self._mem.devices.pop(k)))
            for k in results:
                changes.append(Change("delete", "results", self._mem.results.pop(k)))
            for p in activity:
                changes.append(Change("delete", "activity", self._mem.activity.pop(p)))
            for k in kept:
                changes.append(Change("delete", "kept", self._mem.kept.pop(k)))
            for p, d in {*devices, *results}:
                if (p, d) not in self._mem.devices and (p, d) not in self._mem.results:
                    left = self._mem.by_pod.get(p)
                    if left is not None:
                        left.discard(d)
                        if not left:
                            del self._mem.by_pod[p]
            self.revision = revision
        return len(devices) + len(results) + len(activity) + len(kept), changes

    def _kept_where(self, pod_uid: str = "", device: str = "", claim_uid: str = "") -> list[tuple[str, str]]:
        """Keys of the kept devices matching every non-empty filter (call under _mu)."""
        return sorted(
            k
            for k, v in self._mem.kept.items()
            if (not pod_uid or v.pod_uid == pod_uid)
            and (not device or v.device == device)
            and (not claim_uid or v.claim.uid == claim_uid)
        )

    def delete_device(self, pod_uid: str, device: str) -> tuple[int, list[Change]]:
        self._ready()
        k = _split_key(device_key(pod_uid, device))
        with self._mu:
            kept = self._kept_where(pod_uid=pod_uid, device=device)
        return self._delete(devices=[k], results=[k], kept=kept)

    def delete_pod(self, pod_uid: str) -> tuple[int, list[Change]]:
        self._ready()
        _check_part("pod_uid", pod_uid)
        with self._mu:
            keys = [(pod_uid, d) for d in sorted(self._mem.by_pod.get(pod_uid, ()))]
            kept = self._kept_where(pod_uid=pod_uid)
        return self._delete(devices=keys, results=keys, activity=[pod_uid], kept=kept)

    def clear_attach_state(self, pod_uid: str) -> tuple[int, list[Change]]:
        self._ready()
        _check_part("pod_uid", pod_uid)
        with self._mu:
            keys = [(pod_uid, d) for d in sorted(self._mem.by_pod.get(pod_uid, ()))]
        return self._delete(results=keys, activity=[pod_uid])

    def delete_claim(self, claim_uid: str) -> tuple[list[pb.DeviceConfig], list[Change]]:
        self._ready()
        if not claim_uid:
            raise InvalidArgument("claim_uid: must not be empty")
        with self._mu:
            keys = sorted(k for k, v in self._mem.devices.items() if v.claim.uid == claim_uid)
            removed = [self._mem.devices[k] for k in keys]
            kept = self._kept_where(claim_uid=claim_uid)
        _, changes = self._delete(devices=keys, kept=kept)
        return removed, changes

    # --- reads (memory) ---------------------------------------------------------------

    def get_device(self, pod_uid: str, device: str) -> pb.DeviceConfig:
        k = _split_key(device_key(pod_uid, device))
        try:
            with self._mu:
                return self._mem.devices[k]
        except KeyError:
            raise NotFound(f"no device config for pod {pod_uid} device {device}") from None

    def pod_state(self, pod_uid: str) -> pb.PodState:
        _check_part("pod_uid", pod_uid)
        state = pb.PodState(pod_uid=pod_uid)
        with self._mu:
            return self._pod_state_locked(state, pod_uid)

    def _pod_state_locked(self, state: pb.PodState, pod_uid: str) -> pb.PodState:
        for d in sorted(self._mem.by_pod.get(pod_uid, ())):
            if (pod_uid, d) in self._mem.devices:
                state.devices.append(self._mem.devices[(pod_uid, d)])
            if (pod_uid, d) in self._mem.results:
                state.results.append(self._mem.results[(pod_uid, d)])
        if pod_uid in self._mem.activity:
            state.activity.CopyFrom(self._mem.activity[pod_uid])
        return state

    def list(self, pod_uid: str = "", claim_uid: str = "") -> pb.ListResponse:
        with self._mu:
            return self._list_locked(pod_uid, claim_uid)

    def _list_locked(self, pod_uid: str, claim_uid: str) -> pb.ListResponse:
        resp = pb.ListResponse(revision=self.revision)
        for (p, _), dc in sorted(self._mem.devices.items()):
            if (not pod_uid or p == pod_uid) and (not claim_uid or dc.claim.uid == claim_uid):
                resp.devices.append(dc)
        for (p, _), ar in sorted(self._mem.results.items()):
            if (not pod_uid or p == pod_uid) and (not claim_uid or ar.claim.uid == claim_uid):
                resp.results.append(ar)
        if not claim_uid:
            for p, act in sorted(self._mem.activity.items()):
                if not pod_uid or p == pod_uid:
                    resp.activities.append(act)
        return resp

    def list_kept(self) -> pb.ListKeptResponse:
        with self._mu:
            return pb.ListKeptResponse(
                kept=[v for _, v in sorted(self._mem.kept.items())], revision=self.revision
            )

    def snapshot(self, kept_only: bool = False) -> Iterator[Change]:
        """Every record (only the kept devices with ``kept_only``) as a put, for a
        watch's initial listing."""
        with self._mu:
            records: list[Change] = []
            if not kept_only:
                records += [Change("put", "devices", dc) for dc in self._mem.devices.values()]
                records += [Change("put", "results", ar) for ar in self._mem.results.values()]
                records += [Change("put", "activity", act) for act in self._mem.activity.values()]
            records += [Change("put", "kept", kd) for _, kd in sorted(self._mem.kept.items())]
        yield from records
