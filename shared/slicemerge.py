"""PersistentResourceSliceAttributes: the devices seen on the host merged with the
devices kept for Pods, as dranet merges them before it filters and publishes
(pkg/driver/dra_hooks.go mergeDevices, mergeDeviceStructs). Pure: no I/O.

Devices are resource.k8s.io/v1 Device dicts (ResourceSlice ``spec.devices[]`` items):

* a kept device the host no longer shows (a veth, or any netdev moved whole into a
  Pod) is published as it was kept;
* a device in both (a PCI function whose netdev went into a Pod is still on the host
  with its PCI attributes) is the live device, plus each attribute and capacity of the
  kept one that the live device lacks: the live values win, nothing of the live device
  is removed, every other field is the live device's;
* the result is sorted by name. Kept devices are merged in order, so a second kept
  copy of one device only adds what the first did not.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

Json = dict[str, Any]


def merge_device(live: Mapping[str, Any], kept: Mapping[str, Any]) -> Json:
    """``live`` with the attributes and capacities only ``kept`` has (mergeDeviceStructs)."""
    merged = copy.deepcopy(dict(live))
    for key in ("attributes", "capacity"):
        extra = kept.get(key) or {}
        if not extra:
            continue
        into = dict(merged.get(key) or {})
        for name, value in extra.items():
            if name not in into:
                into[name] = copy.deepcopy(value)
        merged[key] = into
    return merged


def merge_devices(live: Iterable[Mapping[str, Any]], kept: Iterable[Mapping[str, Any]]) -> list[Json]:
    """The devices to publish: ``live`` merged with ``kept`` (mergeDevices), sorted by name."""
    merged: dict[str, Json] = {str(d.get("name", "")): dict(d) for d in live}
    for k in kept:
        name = str(k.get("name", ""))
        have = merged.get(name)
        merged[name] = copy.deepcopy(dict(k)) if have is None else merge_device(have, k)
    return [merged[n] for n in sorted(merged)]
