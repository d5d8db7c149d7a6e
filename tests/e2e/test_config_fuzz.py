"""Generated opaque configs through the real API server and kubelet to prepare (and attach).

Each case is a claim whose dra.net parameters are generated, near-valid ones (a known-valid or
known-invalid config, unchanged or with one to three mutations: a hostile value, an unknown key, a deleted or
wrapped field, a null) and free-form JSON values, from a seed printed with each failure. The claim
goes to the real API server (which may refuse it: then nothing reached us), the real scheduler
allocates a NIC, the real kubelet calls prepare and containerd calls attach. The oracle is the
project's own pure config pipeline (tests/fuzz/test_netconfig_fuzz.py ``prepare_pure``), run on
the parameters as the API server hands them back:

- a config the pipeline refuses: the kubelet's FailedPrepareDynamicResources event carries
  prepare's error, which names the claim and the field; the Pod never runs;
- a config the pipeline accepts: the Pod runs with ``net1`` configured, or, when the kernel refuses
  what it asks (a route without a reachable gateway, say), the Pod does not start and the event
  names the field;
- always: prepare and attach are the same processes at the end (nothing crashed), every NIC is back
  on the node once the Pods are gone, and the store holds nothing for them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest

from dev.cluster.kube import ClusterError, KubeCluster
from shared.netconfig import ConfigError
from tests.e2e.conftest import Node
from tests.e2e.test_cluster import Nics
from tests.fuzz.test_netconfig_fuzz import (
    FIELDS,
    HOSTILE_INTS,
    HOSTILE_TEXT,
    SEEDS,
    WHERE,
    paths,
    prepare_pure,
    put,
)
from tests.support.kube import Kube, eventually, link

pytestmark = [
    pytest.mark.root,
    pytest.mark.netns,
    pytest.mark.containerd,
    pytest.mark.cluster,
    pytest.mark.slow,
]

CASES = int(os.environ.get("DRANET_FUZZ_CASES", "48"))
SEED = int(os.environ.get("DRANET_FUZZ_SEED", "20261204"))
LANES = 4
OUTCOME_WITHIN = 90.0
FAILED = ("FailedPrepareDynamicResources", "FailedCreatePodSandBox")
# Values the API server carries in JSON (no NaN, no 10**4000: the claim would be refused as a
# whole, which tests the API server, not us).
TEXT = [t for t in HOSTILE_TEXT if len(t) < 2000]
SCALARS: list[Any] = [None, True, False, 0, -1, 1.5, 65536, 2**31, 2**63, "", "x", *TEXT, *HOSTILE_INTS[:7]]


@pytest.fixture
def nics(kube: Kube, kube_cluster: KubeCluster) -> Iterator[Nics]:
    n = Nics(kube_cluster)
    yield n
    kube.delete_namespace()  # its Pods stop while attach runs and give their NICs back
    n.cleanup()


def hostile(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 3 or roll < 0.6:
        return copy.deepcopy(rng.choice(SCALARS))
    if roll < 0.8:
        return [hostile(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    keys = [*sorted(FIELDS), "name", "mtu", "", "é", "a" * 70]
    return {rng.choice(keys): hostile(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def near_valid(rng: random.Random) -> Any:
    cfg = copy.deepcopy(rng.choice(SEEDS))
    # A quarter unchanged: valid (and known-invalid) configs meet the real kernel too.
    for _ in range(0 if rng.random() < 0.25 else rng.randint(1, 3)):
        where = rng.choice(paths(cfg))
        kind = rng.choice(["replace", "unknown-key", "delete", "wrap", "null"])
        target = cfg
        for step in where:
            target = target[step]
        if kind == "replace":
            cfg = put(cfg, where, hostile(rng))
        elif kind == "unknown-key" and isinstance(target, dict):
            target[rng.choice(["mtu ", "MTU", "Name", "__proto__", "routes_"])] = hostile(rng)
        elif kind == "delete" and where:
            parent = cfg
            for step in where[:-1]:
                parent = parent[step]
            del parent[where[-1]]
        elif kind == "wrap":
            cfg = put(cfg, where, [target] if rng.random() < 0.5 else {"value": target})
        elif kind == "null":
            cfg = put(cfg, where, None)
    return cfg


def cases(n: int, seed: int) -> list[Any]:
    rng = random.Random(seed)
    out: list[Any] = []
    while len(out) < n:
        params = near_valid(rng) if rng.random() < 0.75 else hostile(rng)
        if isinstance(params, dict):  # the API server takes only objects as parameters
            out.append(params)
    return out


def expected_error_paths(params: Any) -> list[str] | None:
    """The field paths the pure pipeline names for ``params``; None when it accepts them."""
    try:
        prepare_pure(params, None)
    except ConfigError as exc:
        return [WHERE.sub("", fe.path) for fe in exc.errors]
    return None


class Lane:
    """One NIC and the cases run on it, one after another."""

    def __init__(self, node: Node, nics: Nics, lane: int) -> None:
        self.node, self.nics, self.lane = node, nics, lane
        self.nic = nics.add(addresses=[f"10.{210 + lane}.0.2/24"])
        self.dc = node.kube.device_class(f"fz{lane}", f'device.attributes["dra.net"].ifName == "{self.nic}"')
        self.results: list[dict[str, Any]] = []

    async def run(self, i: int, params: Any) -> None:
        k = self.node.kube
        name = f"fz-{i}"
        spec = k.claim_spec(self.dc, configs=[{"parameters": params}])
        result: dict[str, Any] = {"case": i, "seed": SEED, "params": json.dumps(params)[:300]}
        self.results.append(result)
        try:
            await asyncio.to_thread(k.claim, name, spec)
        except ClusterError as exc:
            assert "HTTP 422" in str(exc) or "HTTP 400" in str(exc), exc
            result["outcome"] = "refused by the API server"
            return
        claim = await asyncio.to_thread(k.get_claim, name)
        stored = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
        want = expected_error_paths(stored)
        await asyncio.to_thread(k.pod, name, [name])
        try:
            result["outcome"] = await self.outcome(name, want)
        finally:
            await asyncio.to_thread(k.delete_pod, name)
            await k.wait_gone(name, within=120)
            await asyncio.to_thread(k.delete_claim, name)
            back = await eventually(lambda: link(k.c.netns, self.nic), 60, f"{self.nic} back after case {i}")
            assert back is not None

    async def outcome(self, name: str, want: list[str] | None) -> str:
        k = self.node.kube

        def seen() -> tuple[str, Any] | None:
            pod = k.get_pod(name)
            if pod and (pod.get("status") or {}).get("phase") == "Running":
                return ("running", pod)
            for e in k.events(name):
                if e.get("reason") in FAILED:
                    return ("failed", str(e.get("message", "")))
            return None

        try:
            kind, what = await eventually(
                seen, OUTCOME_WITHIN, f"{name}: neither Running nor a failure event"
            )
        except AssertionError as exc:
            events = [(e.get("reason"), e.get("message")) for e in k.events(name)]
            pod = k.get_pod(name) or {}
            raise AssertionError(f"{exc}; events {events[-6:]}; status {pod.get('status')}") from None
        if want is not None:
            assert kind == "failed", f"{name}: prepare accepted a config the pipeline refuses ({want})"
            assert name in what, f"{name}: the error does not name the claim: {what}"
            named = [p for p in want if p and p.split("[")[0].split(".")[0] in what]
            assert named or not any(want), f"{name}: the error names none of the fields {want}: {what}"
            pod = k.get_pod(name)
            assert pod is not None and pod["status"].get("phase") == "Pending", pod
            return "refused by prepare: " + what[-240:]
        if kind == "running":
            netns = await k.pod_netns(name)
            assert link(netns, "net1") is not None or link(netns, self.nic) is not None, (
                f"{name} runs without its NIC"
            )
            return "running"
        # Accepted by prepare, refused by the kernel when attach configured it: named field.
        assert re.search(r"\b(interface\.\w+|routes\[\d+\]|rules\[\d+\]|neighbors\[\d+\]|ethtool)", what), (
            f"{name}: attach's error names no config field: {what}"
        )
        pod = k.get_pod(name)
        assert pod is not None and pod["status"].get("phase") == "Pending", pod
        return "refused by attach: " + what[-160:]


@pytest.mark.timeout(1800)
async def test_generated_configs_through_the_real_kubelet(node: Node, nics: Nics) -> None:
    pids = {s: node.driver.procs[s].pid for s in ("prepare", "attach", "store")}
    all_cases = cases(CASES, SEED)
    lanes = [Lane(node, nics, i) for i in range(LANES)]
    await node.kube.wait_published(*(lane.nic for lane in lanes), within=60)

    async def drive(lane: Lane) -> None:
        for i in range(lane.lane, len(all_cases), LANES):
            await lane.run(i, all_cases[i])

    try:
        await asyncio.gather(*(drive(lane) for lane in lanes))
    finally:
        results = [r for lane in lanes for r in lane.results]
        for r in sorted(results, key=lambda r: r["case"]):
            print(json.dumps(r))
    outcomes = [r.get("outcome", "?").split(":")[0] for r in results]
    print("outcomes:", {o: outcomes.count(o) for o in set(outcomes)})
    assert len(results) == CASES
    assert "running" in outcomes and "refused by prepare" in outcomes, outcomes  # both sides exercised
    assert {s: node.driver.procs[s].pid for s in pids} == pids, "a service restarted: it crashed"
    for s in pids:
        assert node.driver.procs[s].proc.poll() is None, f"{s} exited"  # type: ignore[union-attr]
    async with node.store() as store:
        left = [d for d in (await store.list()).devices if d.pod.namespace == node.kube.ns]
    assert left == [], f"store records left for deleted Pods: {left[:3]}"
