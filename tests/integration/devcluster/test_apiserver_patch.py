"""Patch semantics against the real 1.34 schema, table-driven: JSON merge patch, JSON patch, strategic
merge patch (merge keys, directives, lists without a strategy) and server-side apply (listType=map,
sets, atomic lists, ownership and removal)."""

from __future__ import annotations

from typing import Any

import pytest

from services.devcluster.apiserver.errors import ApiError
from services.devcluster.apiserver.fieldmanager import FieldManager, from_trie, read_entries, to_trie
from services.devcluster.apiserver.patch import StrategicMerge, json_patch, merge_patch
from services.devcluster.apiserver.schema import load

JSON = dict[str, Any]
S = load()
POD = S.root("", "v1", "Pod")
CLAIM = S.root("resource.k8s.io", "v1", "ResourceClaim")
SLICE = S.root("resource.k8s.io", "v1", "ResourceSlice")
T = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("target", "patch", "want"),
    [
        ({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}, {"a": 1, "b": {"d": 3}}),
        ({"l": [1, 2]}, {"l": [3]}, {"l": [3]}),
        ({"a": 1}, {"a": {"x": 1}}, {"a": {"x": 1}}),
    ],
)
def test_json_merge_patch(target: JSON, patch: JSON, want: JSON) -> None:
    assert merge_patch(target, patch) == want


@pytest.mark.parametrize(
    ("ops", "want"),
    [
        ([{"op": "add", "path": "/l/1", "value": 9}], {"a": {"b": 1}, "l": [1, 9, 2]}),
        ([{"op": "add", "path": "/l/-", "value": 9}], {"a": {"b": 1}, "l": [1, 2, 9]}),
        ([{"op": "remove", "path": "/a/b"}], {"a": {}, "l": [1, 2]}),
        ([{"op": "replace", "path": "/l/0", "value": 7}], {"a": {"b": 1}, "l": [7, 2]}),
        ([{"op": "move", "from": "/a/b", "path": "/c"}], {"a": {}, "l": [1, 2], "c": 1}),
        ([{"op": "copy", "from": "/a", "path": "/d"}], {"a": {"b": 1}, "l": [1, 2], "d": {"b": 1}}),
        ([{"op": "test", "path": "/a/b", "value": 1}], {"a": {"b": 1}, "l": [1, 2]}),
        ([{"op": "add", "path": "/x~1y", "value": 1}], {"a": {"b": 1}, "l": [1, 2], "x/y": 1}),
    ],
)
def test_json_patch(ops: list[JSON], want: JSON) -> None:
    assert json_patch({"a": {"b": 1}, "l": [1, 2]}, ops) == want


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "test", "path": "/a/b", "value": 2}],
        [{"op": "remove", "path": "/missing"}],
        [{"op": "replace", "path": "/l/5", "value": 1}],
    ],
)
def test_json_patch_failures_are_422(ops: list[JSON]) -> None:
    with pytest.raises(ApiError) as err:
        json_patch({"a": {"b": 1}, "l": [1, 2]}, ops)
    assert err.value.code == 422


def pod(containers: list[JSON], **status: Any) -> JSON:
    return {
        "metadata": {"name": "p", "finalizers": ["a.io/x"]},
        "spec": {"containers": containers},
        "status": status,
    }


SMP_CASES = [
    # containers merge by name; an unnamed list (ports of a new container) is taken as is
    (
        pod([{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]),
        {"spec": {"containers": [{"name": "b", "image": "y:2"}, {"name": "c", "image": "z"}]}},
        pod([{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:2"}, {"name": "c", "image": "z"}]),
    ),
    # $patch: delete removes one item by key
    (
        pod([{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]),
        {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}},
        pod([{"name": "b", "image": "y"}]),
    ),
    # $patch: replace on a list replaces it
    (
        pod([{"name": "a", "image": "x"}]),
        {"spec": {"containers": [{"name": "z", "image": "q"}, {"$patch": "replace"}]}},
        pod([{"name": "z", "image": "q"}]),
    ),
    # $setElementOrder reorders
    (
        pod([{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]),
        {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}},
        pod([{"name": "b", "image": "y"}, {"name": "a", "image": "x"}]),
    ),
    # status.conditions merge by type
    (
        pod(
            [], conditions=[{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]
        ),
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        pod([], conditions=[{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]),
    ),
    # finalizers are a merged set of strings; $deleteFromPrimitiveList removes
    (
        pod([]),
        {"metadata": {"finalizers": ["b.io/y"], "$deleteFromPrimitiveList/finalizers": ["a.io/x"]}},
        {**pod([]), "metadata": {"name": "p", "finalizers": ["b.io/y"]}},
    ),
    # containerStatuses has no patch strategy: replaced
    (
        pod([], containerStatuses=[{"name": "a", "ready": True}, {"name": "b", "ready": True}]),
        {"status": {"containerStatuses": [{"name": "a", "ready": False}]}},
        pod([], containerStatuses=[{"name": "a", "ready": False}]),
    ),
]


@pytest.mark.parametrize(("original", "patch", "want"), SMP_CASES)
def test_strategic_merge_patch_on_pods(original: JSON, patch: JSON, want: JSON) -> None:
    assert StrategicMerge(S).apply(original, patch, POD) == want


def test_strategic_merge_replaces_claim_status_devices() -> None:
    # listType=map for server-side apply, but no patch strategy: a strategic merge patch replaces it.
    original = {
        "status": {"devices": [{"driver": "d", "pool": "p", "device": "a"}], "reservedFor": [{"uid": "1"}]}
    }
    patch = {
        "status": {"devices": [{"driver": "d", "pool": "p", "device": "b"}], "reservedFor": [{"uid": "2"}]}
    }
    out = StrategicMerge(S).apply(original, patch, CLAIM)
    assert out["status"]["devices"] == [{"driver": "d", "pool": "p", "device": "b"}]
    assert out["status"]["reservedFor"] == [{"uid": "1"}, {"uid": "2"}]  # merge key uid


def test_fields_v1_round_trip() -> None:
    paths = {
        ("f:metadata", "f:labels", "f:app"),
        ("f:metadata", "f:labels"),
        ("f:status", "f:devices", 'k:{"device":"a","driver":"d","pool":"p"}'),
        ("f:status", "f:devices", 'k:{"device":"a","driver":"d","pool":"p"}', "f:data"),
    }
    trie = to_trie(paths)
    assert trie == {
        "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
        "f:status": {"f:devices": {'k:{"device":"a","driver":"d","pool":"p"}': {".": {}, "f:data": {}}}},
    }
    assert from_trie(trie) == paths


def claim_with(devices: list[JSON]) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "status": {"devices": devices},
    }


def dev(name: str, driver: str = "dra.net", **extra: Any) -> JSON:
    return {"driver": driver, "pool": "n1", "device": name, **extra}


def test_apply_merges_map_lists_and_drops_what_the_manager_no_longer_applies() -> None:
    fm = FieldManager(S)
    live = claim_with([])
    live = fm.apply(
        live, claim_with([dev("a", data={"x": 1}), dev("b")]), CLAIM, "dra.net", True, "status", "v1", T
    )
    live = fm.apply(live, claim_with([dev("c", driver="other.io")]), CLAIM, "other", True, "status", "v1", T)
    assert [d["device"] for d in live["status"]["devices"]] == ["a", "b", "c"]
    live = fm.apply(live, claim_with([dev("a", data={"x": 2})]), CLAIM, "dra.net", True, "status", "v1", T)
    assert live["status"]["devices"] == [dev("a", data={"x": 2}), dev("c", driver="other.io")]
    owners = {e.manager: e.fields for e in read_entries(live)}
    assert ("f:status", "f:devices", 'k:{"device":"a","driver":"dra.net","pool":"n1"}', "f:data") in owners[
        "dra.net"
    ]
    # The last entry goes: the list goes with it (an empty omitempty list is not kept).
    live = fm.apply(live, claim_with([]), CLAIM, "other", True, "status", "v1", T)
    live = fm.apply(live, claim_with([]), CLAIM, "dra.net", True, "status", "v1", T)
    assert "devices" not in live["status"]


def test_apply_keeps_a_field_another_manager_also_owns() -> None:
    fm = FieldManager(S)
    base = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}
    mine = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}}}
    live = fm.apply(base, mine, POD, "me", False, "", "v1", T)
    # Someone else sets label b to the same value through an update: shared ownership.
    updated = {**live, "metadata": {**live["metadata"], "labels": {"a": "1", "b": "2", "c": "3"}}}
    fm.record_update(live, updated, POD, "kubectl-label", "", "v1", T)
    live = updated
    live = fm.apply(
        live,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"b": "2"}}},
        POD,
        "me",
        False,
        "",
        "v1",
        T,
    )
    assert live["metadata"]["labels"] == {"b": "2", "c": "3"}


def test_apply_conflict_names_the_owner_and_force_takes_over() -> None:
    fm = FieldManager(S)
    base = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
    spec = {
        "driver": "dra.net",
        "nodeName": "n1",
        "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 1},
    }
    live = fm.apply(base, {**base, "spec": spec}, SLICE, "inventory", False, "", "resource.k8s.io/v1", T)
    bumped = {**base, "spec": {**spec, "pool": {**spec["pool"], "generation": 2}}}
    with pytest.raises(ApiError) as err:
        fm.apply(live, bumped, SLICE, "someone", False, "", "resource.k8s.io/v1", T)
    assert err.value.code == 409
    assert err.value.message == (
        'Apply failed with 1 conflict: conflict with "inventory" using resource.k8s.io/v1: .spec.pool.generation'
    )
    forced = fm.apply(live, bumped, SLICE, "someone", True, "", "resource.k8s.io/v1", T)
    owners = {e.manager: e.fields for e in read_entries(forced)}
    assert ("f:spec", "f:pool", "f:generation") in owners["someone"]
    assert ("f:spec", "f:pool", "f:generation") not in owners["inventory"]


def test_atomic_lists_are_replaced_whole_by_apply() -> None:
    fm = FieldManager(S)
    base = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
    first = {**base, "spec": {"devices": [{"name": "a"}, {"name": "b"}]}}
    live = fm.apply(base, first, SLICE, "inventory", False, "", "v1", T)
    live = fm.apply(
        live, {**base, "spec": {"devices": [{"name": "c"}]}}, SLICE, "inventory", False, "", "v1", T
    )
    assert live["spec"]["devices"] == [{"name": "c"}]
    assert {("f:spec", "f:devices")} <= read_entries(live)[0].fields
