"""ResourceSlice pooling: which writes make the published slices equal the devices."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from services.inventory.pooling import (
    MAX_DEVICES_PER_SLICE,
    Json,
    Plan,
    PublishedSlice,
    comparable,
    generate_name,
    plan,
    slice_spec,
)

POOL = NODE = "node-a"
_names = itertools.count()


def dev(name: str, mtu: int = 1500) -> Json:
    return {"name": name, "attributes": {"dra.net/mtu": {"int": mtu}}}


def devs(n: int, start: int = 0) -> list[Json]:
    return [dev(f"d{i:04d}") for i in range(start, start + n)]


def published(
    devices: Sequence[Json], generation: int = 1, count: int = 1, pool: str = POOL, node: str = NODE
) -> PublishedSlice:
    return PublishedSlice(
        name=f"node-a-dra.net-{next(_names):05d}",
        uid="uid",
        resource_version="1",
        pool_name=pool,
        generation=generation,
        slice_count=count,
        node_name=node,
        devices=tuple(devices),
    )


def apply(existing: Sequence[PublishedSlice], p: Plan) -> list[PublishedSlice]:
    """What the API server holds after the plan's writes."""
    store = {s.name: s for s in existing}
    for u in p.updates:
        store[u.slice.name] = PublishedSlice(
            u.slice.name, "uid", "2", POOL, p.generation, p.slice_count, NODE, u.devices
        )
    for chunk in p.creates:
        s = published(chunk, p.generation, p.slice_count)
        store[s.name] = s
    for d in p.deletes:
        del store[d.name]
    return list(store.values())


def check_consistent(slices: Sequence[PublishedSlice], desired: Sequence[Json]) -> None:
    ours = [s for s in slices if s.pool_name == POOL]
    names = [str(d["name"]) for s in ours for d in s.devices]
    assert sorted(names) == sorted(str(d["name"]) for d in desired)
    assert len(names) == len(set(names))
    assert len({s.generation for s in ours}) <= 1
    assert all(s.slice_count == len(ours) for s in ours)
    assert all(len(s.devices) <= MAX_DEVICES_PER_SLICE for s in ours)
    assert plan(POOL, NODE, desired, slices).empty


def test_nothing_published_nothing_to_publish() -> None:
    p = plan(POOL, NODE, [], [])
    assert p.empty


def test_first_publish_packs_sorted_devices() -> None:
    desired = list(reversed(devs(300)))
    p = plan(POOL, NODE, desired, [])
    assert (p.generation, p.slice_count, len(p.creates), p.updates, p.deletes) == (1, 3, 3, (), ())
    assert [len(c) for c in p.creates] == [128, 128, 44]
    assert p.creates[0][0]["name"] == "d0000" and p.creates[2][-1]["name"] == "d0299"
    check_consistent(apply([], p), desired)


def test_noop_makes_no_writes() -> None:
    desired = devs(300)
    state = apply([], plan(POOL, NODE, desired, []))
    assert plan(POOL, NODE, desired, state).empty


def test_one_changed_device_is_one_update_keeping_the_generation() -> None:
    desired = devs(300)
    state = apply([], plan(POOL, NODE, desired, []))
    desired[200] = dev("d0200", mtu=9000)
    p = plan(POOL, NODE, desired, state)
    assert (len(p.updates), p.creates, p.deletes, p.generation) == (1, (), (), 1)
    assert any(d["name"] == "d0200" for d in p.updates[0].devices)
    check_consistent(apply(state, p), desired)


def test_added_device_goes_where_there_is_room() -> None:
    desired = devs(300)
    state = apply([], plan(POOL, NODE, desired, []))
    desired.append(dev("zz-new"))
    p = plan(POOL, NODE, desired, state)
    assert (len(p.updates), p.creates, p.deletes, p.generation) == (1, (), (), 1)
    assert len(p.updates[0].devices) == 45
    check_consistent(apply(state, p), desired)


def test_removed_device_is_one_update() -> None:
    desired = devs(300)
    state = apply([], plan(POOL, NODE, desired, []))
    del desired[5]
    p = plan(POOL, NODE, desired, state)
    assert (len(p.updates), p.creates, p.deletes) == (1, (), ())
    check_consistent(apply(state, p), desired)


def test_renamed_device_in_one_slice_is_one_update() -> None:
    desired = devs(100)
    state = apply([], plan(POOL, NODE, desired, []))
    desired[10] = dev("renamed")
    p = plan(POOL, NODE, desired, state)
    assert (len(p.updates), p.creates, p.deletes, p.generation) == (1, (), (), 1)


def test_growing_past_a_full_slice_bumps_and_repacks() -> None:
    desired = devs(128)
    state = apply([], plan(POOL, NODE, desired, []))
    desired.append(dev("d9999"))
    p = plan(POOL, NODE, desired, state)
    assert (p.generation, p.slice_count, len(p.updates), len(p.creates), p.deletes) == (2, 2, 1, 1, ())
    check_consistent(apply(state, p), desired)


def test_changes_in_two_slices_bump_the_generation() -> None:
    desired = devs(300)
    state = apply([], plan(POOL, NODE, desired, []))
    desired[0] = dev("d0000", mtu=1)
    desired[299] = dev("d0299", mtu=1)
    p = plan(POOL, NODE, desired, state)
    assert (p.generation, len(p.updates), p.creates, p.deletes) == (2, 3, (), ())
    check_consistent(apply(state, p), desired)


def test_shrinking_deletes_slices_that_are_no_longer_needed() -> None:
    desired = devs(300)
    state = apply([], plan(POOL, NODE, desired, []))
    desired = desired[:100]
    p = plan(POOL, NODE, desired, state)
    assert (p.generation, p.slice_count, len(p.updates), len(p.deletes)) == (2, 1, 1, 2)
    check_consistent(apply(state, p), desired)


def test_everything_gone_keeps_one_empty_slice() -> None:
    state = apply([], plan(POOL, NODE, devs(300), []))
    p = plan(POOL, NODE, [], state)
    assert (p.slice_count, len(p.updates), len(p.deletes)) == (1, 1, 2)
    assert p.updates[0].devices == ()
    after = apply(state, p)
    check_consistent(after, [])
    # And back again: the device goes into the kept slice.
    p2 = plan(POOL, NODE, devs(1), after)
    assert (len(p2.updates), p2.creates, p2.deletes) == (1, (), ())


def test_old_generations_and_other_pools_are_deleted() -> None:
    current = published(devs(2), generation=3, count=1)
    stale = published(devs(2, 10), generation=2, count=1)
    foreign = published(devs(1, 20), generation=7, count=1, pool="old-pool-name")
    p = plan(POOL, NODE, devs(2), [current, stale, foreign])
    assert p.updates == () and p.creates == ()
    assert {s.name for s in p.deletes} == {stale.name, foreign.name}
    assert p.generation == 3


def test_a_device_listed_twice_ends_up_once() -> None:
    a = published([dev("x"), dev("y")], generation=1, count=2)
    b = published([dev("y"), dev("z")], generation=1, count=2)
    desired = [dev("x"), dev("y"), dev("z")]
    after = apply([a, b], plan(POOL, NODE, desired, [a, b]))
    check_consistent(after, desired)


def test_wrong_slice_count_is_repaired() -> None:
    a = published(devs(3), generation=1, count=2)
    p = plan(POOL, NODE, devs(3), [a])
    assert len(p.updates) == 1 and p.slice_count == 1
    check_consistent(apply([a], p), devs(3))


def test_server_added_fields_are_not_a_change() -> None:
    a = published([{**dev("x"), "allowMultipleAllocations": False, "capacity": {}}], generation=1, count=1)
    assert plan(POOL, NODE, [dev("x")], [a]).empty
    assert comparable({"name": "x", "attributes": {}, "taints": []}) == {"name": "x"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.integers(min_value=0, max_value=400), max_size=400), min_size=1, max_size=6))
def test_any_sequence_of_device_sets_converges(steps: list[set[int]]) -> None:
    state: list[PublishedSlice] = []
    seen_devices = False
    for step in steps:
        desired = [dev(f"d{i:04d}") for i in sorted(step)]
        p = plan(POOL, NODE, desired, state)
        state = apply(state, p)
        seen_devices = seen_devices or bool(desired)
        if seen_devices:
            check_consistent(state, desired)
        else:
            assert state == []


def test_spec_and_generate_name() -> None:
    spec = slice_spec("dra.net", POOL, NODE, 4, 2, [dev("x")])
    assert spec == {
        "driver": "dra.net",
        "nodeName": NODE,
        "pool": {"name": POOL, "generation": 4, "resourceSliceCount": 2},
        "devices": [dev("x")],
    }
    assert "devices" not in slice_spec("dra.net", POOL, NODE, 1, 1, [])
    assert generate_name("node-a", "dra.net") == "node-a-dra.net-"
    long = generate_name("n" * 100, "dra.net")
    assert len(long) <= 58 and long.endswith("-")
