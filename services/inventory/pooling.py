"""ResourceSlice pooling: from the devices to publish and the slices that exist,
the writes that make them agree. Pure: no I/O.

The rules are the Kubernetes resourceslice controller's (what dranet publishes
through), with one refinement so that small changes stay small:

* one pool per node named after the node; slices hold at most 128 devices;
* consumers use only the slices of the highest ``pool.generation``, and every
  slice of that generation carries the pool's ``resourceSliceCount``;
* a change that touches a single existing slice (a device changed, added where
  there is room, or removed) is one update and keeps the generation;
* any bigger change bumps the generation, re-packs the devices (sorted by name)
  into as few slices as needed, reusing existing slices in name order, and
  deletes the rest; slices of an older generation or another pool are deleted;
* nothing to publish and nothing published: no slice (dranet publishes nothing
  until it has seen a device); once published, an empty pool keeps one empty
  slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_DEVICES_PER_SLICE = 128
Json = dict[str, Any]


@dataclass(frozen=True)
class PublishedSlice:
    """A ResourceSlice as listed from the API server (only what planning needs)."""

    name: str
    uid: str
    resource_version: str
    pool_name: str
    generation: int
    slice_count: int
    node_name: str
    devices: tuple[Json, ...]
    raw: Json = field(compare=False, repr=False, default_factory=dict)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PublishedSlice:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        pool = spec.get("pool") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            pool_name=str(pool.get("name", "")),
            generation=int(pool.get("generation", 0) or 0),
            slice_count=int(pool.get("resourceSliceCount", 0) or 0),
            node_name=str(spec.get("nodeName", "") or ""),
            devices=tuple(spec.get("devices") or ()),
            raw=dict(obj),
        )


@dataclass(frozen=True)
class Update:
    slice: PublishedSlice
    devices: tuple[Json, ...]


@dataclass(frozen=True)
class Plan:
    """Writes, in the order to make them: updates, creates, deletes."""

    generation: int
    slice_count: int
    updates: tuple[Update, ...] = ()
    creates: tuple[tuple[Json, ...], ...] = ()
    deletes: tuple[PublishedSlice, ...] = ()

    @property
    def writes(self) -> int:
        return len(self.updates) + len(self.creates) + len(self.deletes)

    @property
    def empty(self) -> bool:
        return self.writes == 0


# The Device fields we set; anything else a server adds does not count as a change.
_DEVICE_FIELDS = ("name", "attributes", "capacity")


def comparable(device: Mapping[str, Any]) -> Json:
    """``device`` reduced to the fields the inventory publishes, empty ones dropped."""
    return {k: device[k] for k in _DEVICE_FIELDS if device.get(k)}


def _chunks(devices: Sequence[Json], size: int) -> list[tuple[Json, ...]]:
    return [tuple(devices[i : i + size]) for i in range(0, len(devices), size)]


def _by_name(devices: Sequence[Json]) -> tuple[Json, ...]:
    return tuple(sorted(devices, key=lambda d: str(d.get("name", ""))))


def plan(
    pool_name: str,
    node_name: str,
    desired: Sequence[Json],
    existing: Sequence[PublishedSlice],
    max_per_slice: int = MAX_DEVICES_PER_SLICE,
) -> Plan:
    """The writes that make ``existing`` publish exactly ``desired`` (device dicts
    with unique names) in pool ``pool_name`` of node ``node_name``."""
    desired_sorted = _by_name([comparable(d) for d in desired])
    wanted = {str(d["name"]): d for d in desired_sorted}

    ours = [s for s in existing if s.pool_name == pool_name and s.node_name == node_name]
    foreign = [s for s in existing if s.pool_name != pool_name or s.node_name != node_name]
    generation = max((s.generation for s in ours), default=0)
    current = sorted((s for s in ours if s.generation == generation), key=lambda s: s.name)
    obsolete = foreign + [s for s in ours if s.generation < generation]

    if not current and not wanted:
        return Plan(generation=generation, slice_count=0, deletes=tuple(obsolete))

    # Stable assignment: each device stays in the slice that has it; new ones go
    # where there is room, then into new slices.
    assigned: set[str] = set()
    kept: list[list[Json]] = []
    for s in current:
        names = []
        for d in s.devices:
            name = str(d.get("name", ""))
            if name in wanted and name not in assigned:
                assigned.add(name)
                names.append(wanted[name])
        kept.append(names)
    remaining = [d for n, d in wanted.items() if n not in assigned]
    for devices in kept:
        while remaining and len(devices) < max_per_slice:
            devices.append(remaining.pop(0))
    new_chunks = _chunks(remaining, max_per_slice)

    survivors = [(s, _by_name(devs)) for s, devs in zip(current, kept, strict=True) if devs]
    emptied = [s for s, devs in zip(current, kept, strict=True) if not devs]
    if not survivors and not new_chunks:
        # Everything went away: keep one empty slice so the pool stays published.
        survivors = [(current[0], ())]
        emptied = emptied[1:]
    count = len(survivors) + len(new_chunks)

    def differs(s: PublishedSlice, devices: tuple[Json, ...], gen: int, cnt: int) -> bool:
        return (
            tuple(comparable(d) for d in s.devices) != devices or s.generation != gen or s.slice_count != cnt
        )

    changed = [(s, devs) for s, devs in survivors if differs(s, devs, generation, count)]
    if generation > 0 and not new_chunks and not emptied and len(changed) <= 1:
        return Plan(
            generation=generation,
            slice_count=count,
            updates=tuple(Update(s, devs) for s, devs in changed),
            deletes=tuple(obsolete),
        )

    # A bigger change: next generation, devices re-packed into as few slices as needed.
    generation += 1
    chunks = _chunks(desired_sorted, max_per_slice) or [()]
    updates = [Update(s, chunk) for s, chunk in zip(current, chunks, strict=False)]
    creates = chunks[len(current) :]
    deletes = obsolete + current[len(chunks) :]
    return Plan(
        generation=generation,
        slice_count=len(chunks),
        updates=tuple(updates),
        creates=tuple(creates),
        deletes=tuple(deletes),
    )


def slice_spec(
    driver: str, pool_name: str, node_name: str, generation: int, count: int, devices: Sequence[Json]
) -> Json:
    """The ``spec`` of one of our slices."""
    spec: Json = {
        "driver": driver,
        "nodeName": node_name,
        "pool": {"name": pool_name, "generation": generation, "resourceSliceCount": count},
    }
    if devices:
        spec["devices"] = list(devices)
    return spec


def generate_name(node_name: str, driver: str) -> str:
    """metadata.generateName: "<node>-<driver>-" as the resourceslice controller
    builds it, shortened so the API server's 5-character suffix keeps the name a
    valid 63-character label-sized base."""
    base = f"{node_name}-{driver}-"
    return base if len(base) <= 58 else base[:57].rstrip("-.") + "-"
