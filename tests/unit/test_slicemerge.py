"""PersistentResourceSliceAttributes' merge of live and kept devices (dranet's
mergeDevices and mergeDeviceStructs), table by table."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.slicemerge import merge_device, merge_devices


def dev(
    name: str, attrs: dict[str, Any] | None = None, capacity: dict[str, Any] | None = None
) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "attributes": dict(attrs or {})}
    if capacity is not None:
        d["capacity"] = capacity
    return d


IFNAME, MTU, IPV4, MAC = "dra.net/ifName", "dra.net/mtu", "dra.net/ipv4", "dra.net/mac"
PCI, RDMA, NUMA = "dra.net/pciAddress", "dra.net/rdma", "resource.kubernetes.io/numaNode"
VETH_KEPT = dev("n1", {IFNAME: {"string": "n1"}, MTU: {"int": 1400}, IPV4: {"string": "10.0.0.2/24"}})
PCI_LIVE = dev("pci-0000-3b-00-0", {PCI: {"string": "0000:3b:00.0"}, RDMA: {"bool": False}})
PCI_KEPT = dev(
    "pci-0000-3b-00-0",
    {
        PCI: {"string": "0000:3b:00.0"},
        RDMA: {"bool": True},
        IFNAME: {"string": "ens1f0np0"},
        MAC: {"string": "0c:42:a1:00:00:01"},
    },
)
PCI_MERGED = dev(
    "pci-0000-3b-00-0",
    {
        PCI: {"string": "0000:3b:00.0"},
        RDMA: {"bool": False},
        IFNAME: {"string": "ens1f0np0"},
        MAC: {"string": "0c:42:a1:00:00:01"},
    },
)
TAINT = [{"key": "k", "effect": "NoSchedule"}]

CASES = {
    # nothing kept: the live devices, sorted by name
    "none-kept": ([dev("b"), dev("a")], [], [dev("a"), dev("b")]),
    # a device gone from the host (a veth in a Pod): published as kept
    "gone-from-host": ([dev("a")], [VETH_KEPT], [dev("a"), VETH_KEPT]),
    # a PCI function whose netdev went into a Pod: the live device plus what only the kept
    # one has; a value both have is the live one (rdma false stays false)
    "pci-netdev-in-pod": ([PCI_LIVE], [PCI_KEPT], [PCI_MERGED]),
    # the device came back: the host's values win, the kept copy fills what the host lacks
    # (dranet does not restore host addresses: ipv4 comes from the kept copy)
    "came-back": (
        [dev("n1", {IFNAME: {"string": "n1"}, MTU: {"int": 1500}})],
        [VETH_KEPT],
        [dev("n1", {IFNAME: {"string": "n1"}, MTU: {"int": 1500}, IPV4: {"string": "10.0.0.2/24"}})],
    ),
    # capacities merge the same way
    "capacity": (
        [dev("a", capacity={"dra.net/bw": {"value": "10G"}})],
        [dev("a", capacity={"dra.net/bw": {"value": "1G"}, "dra.net/q": {"value": "8"}})],
        [dev("a", capacity={"dra.net/bw": {"value": "10G"}, "dra.net/q": {"value": "8"}})],
    ),
    # a live device without attributes gets the kept ones
    "live-without-attributes": (
        [{"name": "a"}],
        [dev("a", {"x": {"int": 1}})],
        [dev("a", {"x": {"int": 1}})],
    ),
    # every other field is the live device's
    "other-fields-live": (
        [{"name": "a", "taints": TAINT}],
        [{"name": "a", "allowMultipleAllocations": True}],
        [{"name": "a", "taints": TAINT}],
    ),
    # two kept copies of one device: the second adds only what the first did not
    "two-kept-copies": (
        [],
        [dev("a", {"x": {"int": 1}}), dev("a", {"x": {"int": 2}, "y": {"int": 3}})],
        [dev("a", {"x": {"int": 1}, "y": {"int": 3}})],
    ),
    # list-type values (DRAListTypeAttributes) are copied like any other
    "list-values": ([dev("a")], [dev("a", {NUMA: {"ints": [0, 1]}})], [dev("a", {NUMA: {"ints": [0, 1]}})]),
}


@pytest.mark.parametrize(("live", "kept", "want"), list(CASES.values()), ids=list(CASES))
def test_merge_devices(
    live: list[dict[str, Any]], kept: list[dict[str, Any]], want: list[dict[str, Any]]
) -> None:
    assert merge_devices(live, kept) == want


def test_inputs_are_not_changed_and_results_do_not_alias_them() -> None:
    live, kept = [copy.deepcopy(PCI_LIVE)], [copy.deepcopy(PCI_KEPT)]
    (merged,) = merge_devices(live, kept)
    assert live == [PCI_LIVE] and kept == [PCI_KEPT]
    merged["attributes"]["dra.net/ifName"]["string"] = "changed"
    assert kept[0]["attributes"]["dra.net/ifName"] == {"string": "ens1f0np0"}
    merged = merge_device(PCI_LIVE, PCI_KEPT)
    merged["attributes"]["dra.net/pciAddress"]["string"] = "changed"
    assert PCI_LIVE["attributes"]["dra.net/pciAddress"] == {"string": "0000:3b:00.0"}


_values = st.one_of(
    st.builds(lambda v: {"int": v}, st.integers()), st.builds(lambda v: {"string": v}, st.text(max_size=5))
)
_attrs = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), _values, max_size=4)
_devices = st.lists(st.builds(lambda n, a: {"name": n, "attributes": a}, st.sampled_from("wxyz"), _attrs))


@given(_devices, _devices)
def test_properties(live: list[dict[str, Any]], kept: list[dict[str, Any]]) -> None:
    live = list({d["name"]: d for d in live}.values())  # live names are unique (one scan)
    merged = {d["name"]: d for d in merge_devices(live, kept)}
    assert list(merged) == sorted({d["name"] for d in live} | {d["name"] for d in kept})
    for d in live:
        # every live attribute is published with its live value
        assert d["attributes"].items() <= merged[d["name"]].get("attributes", {}).items()
    for k in kept:
        # every kept attribute name is published (with the live value when the host has one)
        assert set(k["attributes"]) <= set(merged[k["name"]].get("attributes", {}))
    assert merge_devices(live, []) == sorted(live, key=lambda d: d["name"])
