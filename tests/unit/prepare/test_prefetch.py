"""The claim read-ahead (services/prepare/prefetch.py): which Pods start a read, and when a
copy read ahead may stand in for prepare's own GET. The Pod watch itself runs against the
real API server in tests/e2e/test_prepare.py (a prepared claim logged ``read_ahead``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.prepare.kube import KubeError
from services.prepare.prefetch import (
    DEVICE_PREFETCH,
    PREFETCH,
    ClaimPrefetch,
    node_devices,
    pod_claim_names,
    usable,
)


def claim(uid: str = "u1", allocated: bool = True, reserved: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [{"driver": "dra.net", "device": "eth1"}]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]
    return {"metadata": {"name": "c1", "namespace": "ns", "uid": uid}, "status": status}


def pod(*claims: str, templated: tuple[str, ...] = (), phase: str = "Pending", deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": "node-a",
            "resourceClaims": [{"name": f"r{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
            + [{"name": f"t{i}", "resourceClaimTemplateName": "tpl"} for i in range(len(templated))],
        },
        "status": {
            "phase": phase,
            "resourceClaimStatuses": [
                {"name": f"t{i}", "resourceClaimName": c} for i, c in enumerate(templated)
            ],
        },
    }


class FakeKube:
    def __init__(self, answers: dict[str, Any], delay: float = 0.0) -> None:
        self.answers = answers
        self.delay = delay
        self.gets: list[str] = []

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.gets.append(name)
        await asyncio.sleep(self.delay)
        answer = self.answers.get(name)
        if isinstance(answer, Exception):
            raise answer
        return answer


def hits() -> tuple[float, float]:
    return (
        PREFETCH.labels("hit")._value.get(),  # type: ignore[attr-defined]
        PREFETCH.labels("miss")._value.get(),  # type: ignore[attr-defined]
    )


def test_claim_names_of_a_pod_named_and_templated() -> None:
    assert pod_claim_names(pod("a", "b", templated=("p-t0-x1",))) == ["a", "b", "p-t0-x1"]
    assert pod_claim_names({"metadata": {}}) == []


@pytest.mark.parametrize(
    ("c", "ok"),
    [
        (claim(), True),
        (claim(uid="other"), False),
        (claim(allocated=False), False),
        (claim(reserved=False), False),
        (None, False),
    ],
)
def test_only_the_named_allocated_reserved_claim_is_usable(c: Any, ok: bool) -> None:
    assert usable(c, "u1") is ok


async def test_a_bound_pod_starts_one_read_per_claim_and_prepare_takes_it_once() -> None:
    kube = FakeKube({"c1": claim()})
    p = ClaimPrefetch(kube, "node-a")  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    p._on_pod(pod("c1"))  # the watch's MODIFIED events: still one read
    await asyncio.sleep(0)
    h0, m0 = hits()
    assert await p.take("ns", "c1", "u1") == claim()
    assert kube.gets == ["c1"]
    # Taken once: a retry of the kubelet reads the claim itself.
    assert await p.take("ns", "c1", "u1") is None
    assert hits() == (h0 + 1, m0 + 1)


async def test_a_read_still_on_its_way_is_awaited_not_repeated() -> None:
    kube = FakeKube({"c1": claim()}, delay=0.05)
    p = ClaimPrefetch(kube, "node-a")  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    assert await p.take("ns", "c1", "u1") == claim()
    assert kube.gets == ["c1"]


@pytest.mark.parametrize(
    "answer",
    [claim(uid="replaced"), claim(allocated=False), None, KubeError(500, "etcd unavailable")],
    ids=["other-uid", "unallocated", "gone", "api-error"],
)
async def test_a_copy_that_cannot_stand_in_is_a_miss(answer: Any) -> None:
    kube = FakeKube({"c1": answer})
    p = ClaimPrefetch(kube, "node-a")  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    await asyncio.sleep(0.01)
    assert await p.take("ns", "c1", "u1") is None


async def test_an_old_copy_is_not_used() -> None:
    kube = FakeKube({"c1": claim()})
    p = ClaimPrefetch(kube, "node-a", max_age_s=0.0)  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    await asyncio.sleep(0.01)
    assert await p.take("ns", "c1", "u1") is None


@pytest.mark.parametrize(
    "p_",
    [pod("c1", phase="Running"), pod("c1", phase="Succeeded"), pod("c1", deleting=True)],
    ids=["running", "done", "deleting"],
)
async def test_pods_past_their_start_read_nothing(p_: Any) -> None:
    kube = FakeKube({"c1": claim()})
    p = ClaimPrefetch(kube, "node-a")  # type: ignore[arg-type]
    p._on_pod(p_)
    await asyncio.sleep(0)
    assert kube.gets == []


# -- the devices, read ahead with their claim ----------------------------------------------


def claim_with(*results: tuple[str, str, str]) -> dict[str, Any]:
    """An allocated, reserved claim with (driver, pool, device) results."""
    c = claim()
    c["status"]["allocation"] = {
        "devices": {"results": [{"driver": d, "pool": pl, "device": dev} for d, pl, dev in results]}
    }
    return c


class FakeInventory:
    def __init__(self, known: set[str], delay: float = 0.0, fail: bool = False) -> None:
        self.known = known
        self.delay = delay
        self.fail = fail
        self.asked: list[str] = []

    async def get_device(self, name: str) -> dict[str, str] | None:
        self.asked.append(name)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise RuntimeError("inventory at /run/inventory.sock unavailable")
        return {"name": name} if name in self.known else None


def device_hits() -> tuple[float, float]:
    return (
        DEVICE_PREFETCH.labels("hit")._value.get(),  # type: ignore[attr-defined]
        DEVICE_PREFETCH.labels("miss")._value.get(),  # type: ignore[attr-defined]
    )


def test_only_this_drivers_devices_in_this_nodes_pool() -> None:
    c = claim_with(("dra.net", "node-a", "eth1"), ("dra.net", "node-b", "eth2"), ("gpu.x", "node-a", "g0"))
    assert node_devices(c, "dra.net", "node-a") == ["eth1"]


async def test_the_claims_devices_on_this_node_are_read_ahead_and_taken_once() -> None:
    c = claim_with(
        ("dra.net", "node-a", "eth1"), ("dra.net", "node-a", "eth2"), ("dra.net", "node-b", "eth3")
    )
    inventory = FakeInventory({"eth1", "eth2", "eth3"})
    p = ClaimPrefetch(FakeKube({"c1": c}), "node-a", read_device=inventory.get_device)  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    await asyncio.sleep(0.01)
    assert sorted(inventory.asked) == ["eth1", "eth2"]  # not the other node's device
    h0, m0 = device_hits()
    assert await p.take_device("u1", "eth1") == {"name": "eth1"}
    assert await p.take_device("u1", "eth1") is None  # once: a retry asks the inventory
    assert await p.take_device("other-claim", "eth2") is None  # keyed by the claim too
    assert device_hits() == (h0 + 1, m0 + 2)


async def test_a_device_read_on_its_way_is_awaited() -> None:
    inventory = FakeInventory({"eth1"}, delay=0.05)
    c = claim_with(("dra.net", "node-a", "eth1"))
    p = ClaimPrefetch(FakeKube({"c1": c}), "node-a", read_device=inventory.get_device)  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    assert await p.take("ns", "c1", "u1") == c
    assert await p.take_device("u1", "eth1") == {"name": "eth1"}
    assert inventory.asked == ["eth1"]


@pytest.mark.parametrize(
    ("inventory", "max_age"),
    [(FakeInventory(set()), 5.0), (FakeInventory({"eth1"}, fail=True), 5.0), (FakeInventory({"eth1"}), 0.0)],
    ids=["not-found", "inventory-error", "too-old"],
)
async def test_a_device_answer_that_cannot_stand_in_is_a_miss(
    inventory: FakeInventory, max_age: float
) -> None:
    """ "No such device" is never taken from a read-ahead: the device may have been on its
    way back from an earlier Pod; prepare asks the inventory itself then."""
    c = claim_with(("dra.net", "node-a", "eth1"))
    p = ClaimPrefetch(
        FakeKube({"c1": c}),  # type: ignore[arg-type]
        "node-a",
        read_device=inventory.get_device,
        device_max_age_s=max_age,
    )
    p._on_pod(pod("c1"))
    await asyncio.sleep(0.01)
    assert inventory.asked == ["eth1"]
    assert await p.take_device("u1", "eth1") is None


async def test_without_an_inventory_reader_nothing_is_read_ahead() -> None:
    p = ClaimPrefetch(FakeKube({"c1": claim_with(("dra.net", "node-a", "eth1"))}), "node-a")  # type: ignore[arg-type]
    p._on_pod(pod("c1"))
    await asyncio.sleep(0.01)
    assert await p.take_device("u1", "eth1") is None
