"""Attach latency for one passthrough veth "NIC" with two addresses and two routes:

1. the hook's own time: the RunPodSandbox handler (store read, the engine's netlink
   work, queueing the store writes), called in-process with a real store process;
   also the StopPodSandbox handler, and the time until the queued writes landed;
2. in the same run, the same netlink operations done directly with plain pyroute2
   (get link, move+rename into the pod netns, two addresses, up, two routes), and
   the full attach+return cycle of tests/bench/attach_netlink.py's direct path;
3. the Pod-start time the driver adds on the real cluster (``dev.cluster.kube``: kube-apiserver,
   scheduler, controller-manager, kubelet v1.34, containerd 1.7 with NRI, and dranet's four
   services as real processes): create-to-Running of Pods with one dra.net device (a
   ResourceClaim made beforehand, untimed; its config: net1 with two addresses and two routes)
   against the same Pods without a claim, alternating (ABBA), while attach is registered over NRI;
   plus blocks of Pods without a claim while attach is stopped (not registered with containerd).
   The added time covers everything a claim brings: the scheduler's allocation, the kubelet's
   DRA step (claim GET, checkpoint, NodePrepareResources), attach's RunPodSandbox hook.

   Timing is from this process: just before the Pod's POST (over a kept-alive HTTPS connection)
   to the first watch event showing it ``Running`` (a watch opened beforehand, read in a thread;
   perf_counter, sub-millisecond): ``pod_start_*``. The kubelet's
   ``kubelet_pod_start_sli_duration_seconds`` is not used: it counts from the Pod's
   creationTimestamp, which has 1 s resolution. Running itself is only reported after the
   kubelet's generic PLEG relists the runtime (every 1 s): create-to-Running carries up to 1 s of
   wait that has nothing to do with the Pod (each Pod is created at a random phase against that
   relist, so the wait is uniform; sd ~290 ms a sample): with 20 Pods a kind, the difference of
   its p50s is good to about +-100 ms only. ``container_started_*`` is the precise figure: POST
   (wall clock) to the app container's StartedAt in containerd (CRI, ns): all the work up to the
   container running, without the relist wait. ``*_added_paired_p50_ms``: the p50 of the
   differences within each ABBA pair (robust to drift and to a lone slow Pod).
   ``sandbox_created_*`` (containerd's CreatedAt of the sandbox), ``scheduled_*`` (the first
   watch event with spec.nodeName) and ``kubelet_prepare_p50_ms`` (the kubelet's
   NodePrepareResources call, from ``dra_grpc_operations_duration_seconds`` deltas on its
   /metrics) break the added time down.

Run as root after set-up (the Kubernetes binaries built: make setup):
.venv/bin/python tests/bench/attach.py [--iterations N] [--pod-iterations M]
Progress goes to stderr; the last line on stdout is one JSON object: hook_p50_ms, direct_p50_ms,
hook_vs_direct_ratio, pod_start_added_ms and more. Targets: ratio at most 1.5, added Pod-start
time under 50 ms per device.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.cri import CriClient
from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.hooks import AttachHooks
from services.attach.netdev import NetdevEngine
from services.attach.writer import StoreWriter
from shared.netns import open_netns
from shared.storeclient import StoreClient
from tests.bench._cluster import Bench, HistogramDelta, KubeletMetrics, PodWatch, bench_cluster, p50, pct, say
from tests.bench.attach_netlink import BenchNic, bench_nic, configure_net1, direct_cycle, setns_socket
from tests.integration.attach import attach_env as env
from tests.support.kube import on

POD_NICS = 4
PREPARE = HistogramDelta(
    "dra_grpc_operations_duration_seconds", {"driver_name": "dra.net", "method_name": "NodePrepareResources"}
)


def bench_config(nic: BenchNic, pod_uid: str) -> st.DeviceConfig:
    cfg = nic.config()
    cfg.pod.CopyFrom(st.PodRef(uid=pod_uid, namespace="bench", name="bench"))
    cfg.claim.CopyFrom(st.ClaimRef(uid=f"claim-{pod_uid}", namespace="bench", name="bench"))
    cfg.driver, cfg.pool = "dra.net", "node-1"
    return cfg


# --- 1 + 2: the handler against direct netlink -------------------------------------------------


def direct_attach(ipr: Any, nic: BenchNic, pod_fd: int) -> float:
    """The attach half of the direct path (plain sync pyroute2 in this thread),
    timed; the device is then given back untimed."""
    from pyroute2 import IPRoute

    t = time.perf_counter()
    (host_link,) = ipr.link("get", ifname=nic.host)
    ipr.link("set", index=host_link["index"], net_ns_fd=pod_fd, ifname="net1")
    ns = IPRoute(use_socket=setns_socket(pod_fd))
    idx = configure_net1(ns, nic)
    took = time.perf_counter() - t
    host_fd = open_netns("/proc/self/ns/net")
    try:
        ns.link("set", index=idx, net_ns_fd=host_fd, ifname=nic.host)
    finally:
        os.close(host_fd)
        ns.close()
    ipr.link("set", ifname=nic.host, state="up")
    return took


def timed_cycle(ipr: Any, nic: BenchNic, pod_fd: int, host_fd: int) -> float:
    t = time.perf_counter()
    direct_cycle(ipr, nic, pod_fd, host_fd)
    return time.perf_counter() - t


async def bench_hook(iterations: int, warmup: int, workdir: Path) -> dict[str, Any]:
    from pyroute2 import IPRoute

    loop = asyncio.get_running_loop()
    direct = ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct")
    store_proc = env.store_process(workdir).start()
    run_s: list[float] = []
    stop_s: list[float] = []
    writes_s: list[float] = []
    direct_s: list[float] = []
    cycle_s: list[float] = []
    direct_cycle_s: list[float] = []
    try:
        with bench_nic() as nic:
            async with StoreClient(store_proc.socket, deadline_s=1.0) as store:
                pod_uid = str(uuid.uuid4())
                await store.put_devices([bench_config(nic, pod_uid)])
                writer = StoreWriter(store)
                writer.start()
                engine = NetdevEngine()
                hooks = AttachHooks(store, engine, writer)
                pod_fd = open_netns(nic.pod_path)
                host_fd = open_netns("/proc/self/ns/net")
                ipr = await loop.run_in_executor(direct, IPRoute)
                try:
                    for i in range(warmup + iterations):
                        pod = nri_pb2.PodSandbox(
                            id=f"sandbox-{i}", uid=pod_uid, name="bench", namespace="bench"
                        )
                        pod.linux.namespaces.add(type="network", path=nic.pod_path)
                        t0 = time.perf_counter()
                        await hooks.run_pod_sandbox(pod)
                        t1 = time.perf_counter()
                        await writer.flush(5)
                        t2 = time.perf_counter()
                        await hooks.stop_pod_sandbox(pod)
                        t3 = time.perf_counter()
                        await writer.flush(5)
                        d = await loop.run_in_executor(direct, direct_attach, ipr, nic, pod_fd)
                        c = await loop.run_in_executor(direct, timed_cycle, ipr, nic, pod_fd, host_fd)
                        if i >= warmup:
                            run_s.append(t1 - t0)
                            writes_s.append(t2 - t0)
                            stop_s.append(t3 - t2)
                            cycle_s.append((t1 - t0) + (t3 - t2))
                            direct_s.append(d)
                            direct_cycle_s.append(c)
                finally:
                    await loop.run_in_executor(direct, ipr.close)
                    direct.shutdown()
                    await hooks.close()
                    await writer.close()
                    engine.close()
                    os.close(pod_fd)
                    os.close(host_fd)
    finally:
        store_proc.stop()
    return {
        "hook_p50_ms": p50(run_s),
        "hook_p90_ms": pct(run_s, 0.9),
        "hook_p99_ms": pct(run_s, 0.99),
        "direct_p50_ms": p50(direct_s),
        "direct_p90_ms": pct(direct_s, 0.9),
        "hook_vs_direct_ratio": round(statistics.median(run_s) / statistics.median(direct_s), 3),
        "hook_with_store_writes_p50_ms": p50(writes_s),
        "stop_hook_p50_ms": p50(stop_s),
        "hook_cycle_p50_ms": p50(cycle_s),
        "direct_cycle_p50_ms": p50(direct_cycle_s),
        "hook_cycle_vs_direct_cycle_ratio": round(
            statistics.median(cycle_s) / statistics.median(direct_cycle_s), 3
        ),
        "hook_iterations": iterations,
    }


# --- 3: Pod start on the real cluster, with and without a device ------------------------------


def device_config(k: int) -> dict[str, Any]:
    """net1 with two addresses and two routes, in NIC k's subnet (10.200.k.0/24: bench_cluster
    gives NIC k the address .5 there); the gateway need not answer for routes to be added."""
    return {
        "interface": {"name": "net1", "addresses": [f"10.200.{k}.2/24", f"10.200.{k}.3/24"]},
        "routes": [
            {"destination": "10.250.0.0/24", "gateway": f"10.200.{k}.1"},
            {"destination": "10.251.0.0/24", "gateway": f"10.200.{k}.1", "table": 100},
        ],
    }


@dataclass
class Start:
    running: float  # POST to the first watch event with phase Running (s)
    scheduled: float  # POST to the first watch event with spec.nodeName set (s)
    sandbox: float  # POST to containerd's CreatedAt of the Pod's sandbox (s)
    container: float  # POST to the app container's StartedAt in containerd (s)
    prepare: float | None  # the kubelet's NodePrepareResources call (s), device Pods only


class PodStarts:
    def __init__(self, b: Bench, loop: asyncio.AbstractEventLoop) -> None:
        self.b = b
        self.watch = PodWatch(b.cluster, b.ns).start()
        self.metrics = KubeletMetrics(b.cluster, ("dra_grpc_operations_duration_seconds",))
        self.loop = loop
        assert b.cluster.containerd is not None
        socket = b.cluster.containerd.grpc_socket

        async def open_cri() -> CriClient:  # grpc.aio binds the channel to the running loop
            return CriClient(socket)

        self.cri = self.loop.run_until_complete(open_cri())
        self.seq = 0
        self.rng = random.Random(20251203)

    def close(self) -> None:
        self.watch.stop()
        self.metrics.close()
        self.loop.run_until_complete(self.cri.close())

    async def _cri_times(self, uid: str) -> tuple[int, int]:
        """containerd's CreatedAt of the Pod's sandbox and StartedAt of its app container (ns)."""
        boxes = await self.cri.list_pod_sandboxes({"io.kubernetes.pod.uid": uid}, ready_only=True)
        if len(boxes) != 1:
            raise RuntimeError(f"pod {uid}: {len(boxes)} ready sandboxes")
        status = await self.cri.pod_sandbox_status(boxes[0].id)
        (app,) = [c for c in await self.cri.list_containers(boxes[0].id) if c.name == "app"]
        started = (await self.cri.container_status(app.id)).started_at_ns
        return status.created_at_ns, started

    def one(self, with_device: bool) -> Start:
        """One Pod created, Running, deleted and gone (its NIC back on the node)."""
        self.seq += 1
        pod = f"p{self.seq}"
        k = self.seq % POD_NICS
        claims: list[str] = []
        if with_device:
            self.b.create_claim(pod, device_config(k), on(self.b.nics[k]))
            claims = [pod]
        m0 = self.metrics.scrape()
        # Let the previous Pod's teardown settle, then a random phase: that teardown ended on one
        # of the kubelet's 1 s PLEG relists, and Pods created a fixed time after it would see
        # their Running reported on the relist 1 or 2 s later, depending only on whether the
        # container beat a fixed deadline (bimodal create-to-Running, phase-locked).
        time.sleep(0.2 + self.rng.random())
        t0, wall0, uid = self.b.create_pod(pod, claims)
        t_run = self.watch.wait(pod, "running", within=120)
        t_sched = self.watch.wait(pod, "scheduled", within=1)
        created_ns, started_ns = self.loop.run_until_complete(self._cri_times(uid))
        if t_run - t0 > 5:
            events = [f"{e.get('reason')}: {e.get('message', '')[:200]}" for e in self.b.kube.events(pod)]
            say(
                f"  {pod} took {t_run - t0:.1f}s to run (scheduled after {t_sched - t0:.2f}s); events: {events}"
            )
            log = self.b.cluster.procs["kubelet"].log_path.read_text(errors="replace").splitlines()
            for entry in [x for x in log if f"/{pod}" in x and x[:1] in "EW"][-5:]:
                say(f"  kubelet: {entry[:400]}")
        prep: float | None = None
        if with_device:
            n, total = PREPARE.of(m0, self.metrics.scrape())
            prep = total / n if n == 1 else None
            if self.b.cluster.net.has_link(self.b.nics[k]):
                raise RuntimeError(f"pod {pod} runs but its NIC {self.b.nics[k]} is still on the node")
        self.b.delete_pod(pod)
        self.watch.wait(pod, "deleted", within=120)
        if with_device:
            self.b.delete_claim(pod)
            self.b.wait_claims_gone(claims)
            self.b.wait_nics_home()
        return Start(
            running=t_run - t0,
            scheduled=t_sched - t0,
            sandbox=(created_ns - wall0) / 1e9,
            container=(started_ns - wall0) / 1e9,
            prepare=prep,
        )


def set_attach(b: Bench, running: bool, loop: asyncio.AbstractEventLoop) -> None:
    """Stop attach (it leaves containerd's NRI plugins) or start it again (registered)."""
    if running:
        b.driver.start_one("attach")
    else:
        b.driver.procs["attach"].stop(timeout=30)

    async def wait() -> None:
        async with StoreClient(b.driver.run_dir / "store.sock") as store:
            await env.wait_liveness(store, connected=running, timeout_s=30)

    loop.run_until_complete(wait())


def bench_pod_start(
    loop: asyncio.AbstractEventLoop, iterations: int, without_blocks: int, block: int
) -> dict[str, Any]:
    with_device: list[Start] = []
    no_claim: list[Start] = []
    without: list[Start] = []
    # Short graceful-stop timings: attach is stopped between blocks with no device attached.
    with bench_cluster(
        POD_NICS, log_level="INFO", attach_args=["--drain-quiet", "1", "--drain-poll", "0.2"]
    ) as b:
        r = PodStarts(b, loop)
        try:
            say("warm-up: 2 Pods with a device, 2 without")
            for dev in (False, True, False, True):
                r.one(dev)
            rounds = max(1, without_blocks)
            done = 0
            for rnd in range(rounds):
                set_attach(b, False, loop)
                for _ in range(block):
                    without.append(r.one(False))
                set_attach(b, True, loop)
                r.one(True)  # the new attach process's first hook, not counted
                say(
                    f"round {rnd + 1}: without attach registered, Running p50 "
                    f"{p50([s.running for s in without[-block:]])} ms over {block} Pods"
                )
                n = iterations // rounds if rnd < rounds - 1 else iterations - done
                for i in range(n):
                    # ABBA: with, without, without, with, ... so drift hits both kinds alike.
                    for dev in (True, False) if i % 2 == 0 else (False, True):
                        (with_device if dev else no_claim).append(r.one(dev))
                    done += 1
                    w, o = with_device[-1], no_claim[-1]
                    say(
                        f"pair {done}/{iterations}: with a device Running {w.running * 1000:.0f} ms "
                        f"(container started {w.container * 1000:.0f}), without a claim "
                        f"{o.running * 1000:.0f} ms ({o.container * 1000:.0f})"
                    )
        finally:
            r.close()

    def med(rows: list[Start], key: str) -> float:
        return p50([getattr(s, key) for s in rows if getattr(s, key) is not None])

    def diff(a: list[Start], b: list[Start], key: str) -> float:
        return round(med(a, key) - med(b, key), 3)

    def paired(key: str) -> float:
        """p50 over the pairs (ABBA neighbours) of with-device minus without-a-claim."""
        return p50([getattr(w, key) - getattr(o, key) for w, o in zip(with_device, no_claim, strict=True)])

    return {
        "pod_start_without_plugin_p50_ms": med(without, "running"),
        "pod_start_no_claim_p50_ms": med(no_claim, "running"),
        "pod_start_with_plugin_p50_ms": med(with_device, "running"),
        "pod_start_with_plugin_p90_ms": pct([s.running for s in with_device], 0.9),
        "pod_start_no_claim_p90_ms": pct([s.running for s in no_claim], 0.9),
        "pod_start_added_ms": diff(with_device, no_claim, "running"),
        "pod_start_added_no_device_ms": diff(no_claim, without, "running"),
        "pod_start_added_paired_p50_ms": paired("running"),
        "container_started_with_plugin_p50_ms": med(with_device, "container"),
        "container_started_no_claim_p50_ms": med(no_claim, "container"),
        "container_started_without_plugin_p50_ms": med(without, "container"),
        "container_started_added_ms": diff(with_device, no_claim, "container"),
        "container_started_added_no_device_ms": diff(no_claim, without, "container"),
        "container_started_added_paired_p50_ms": paired("container"),
        "sandbox_created_with_plugin_p50_ms": med(with_device, "sandbox"),
        "sandbox_created_no_claim_p50_ms": med(no_claim, "sandbox"),
        "scheduled_with_plugin_p50_ms": med(with_device, "scheduled"),
        "scheduled_no_claim_p50_ms": med(no_claim, "scheduled"),
        "kubelet_prepare_p50_ms": med(with_device, "prepare"),
        "pod_start_iterations": len(with_device),
        "pod_start_without_plugin_iterations": len(without),
    }


def run_hook(loop: asyncio.AbstractEventLoop, iterations: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dnbench-") as tmp:
        hook_dir = Path(tmp) / "hook"
        hook_dir.mkdir()
        return loop.run_until_complete(bench_hook(iterations, 5, hook_dir))


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=100, help="hook and direct attach samples")
    ap.add_argument("--pod-iterations", type=int, default=20, help="Pods with a device (as many without)")
    ap.add_argument("--without-blocks", type=int, default=2, help="blocks of Pods with attach stopped")
    ap.add_argument("--block", type=int, default=5, help="Pods per block with attach stopped")
    args = ap.parse_args()
    t0 = time.monotonic()
    # One event loop for the whole run: grpc.aio channels stay bound to the loop they began on.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        say(f"hook vs direct netlink: {args.iterations} iterations")
        hook = run_hook(loop, args.iterations)
        say(f"Pod start on the real cluster: {args.pod_iterations} Pods with a device, as many without")
        pods = bench_pod_start(loop, args.pod_iterations, args.without_blocks, args.block)
    finally:
        loop.close()
    res = {**hook, **pods, "target_ratio": 1.5, "target_pod_start_added_ms": 50}
    res["run_s"] = round(time.monotonic() - t0, 1)
    say(
        f"RunPodSandbox hook p50 {res['hook_p50_ms']} ms (p90 {res['hook_p90_ms']}, "
        f"with its store writes landed {res['hook_with_store_writes_p50_ms']}), "
        f"direct pyroute2 attach p50 {res['direct_p50_ms']} ms: ratio {res['hook_vs_direct_ratio']}"
    )
    say(
        f"Run+Stop hooks p50 {res['hook_cycle_p50_ms']} ms, direct attach+return p50 "
        f"{res['direct_cycle_p50_ms']} ms: ratio {res['hook_cycle_vs_direct_cycle_ratio']}"
    )
    say(
        f"Pod create-to-Running p50 {res['pod_start_no_claim_p50_ms']} ms without a claim, "
        f"{res['pod_start_with_plugin_p50_ms']} ms with one device: +{res['pod_start_added_ms']} ms "
        f"(kubelet NodePrepareResources p50 {res['kubelet_prepare_p50_ms']} ms); without "
        f"attach registered {res['pod_start_without_plugin_p50_ms']} ms "
        f"(+{res['pod_start_added_no_device_ms']} ms for a Pod without devices)"
    )
    say(
        f"Pod create-to-container-started p50 {res['container_started_no_claim_p50_ms']} ms without "
        f"a claim, {res['container_started_with_plugin_p50_ms']} ms with one device: "
        f"+{res['container_started_added_ms']} ms; without attach registered "
        f"{res['container_started_without_plugin_p50_ms']} ms "
        f"(+{res['container_started_added_no_device_ms']} ms for a Pod without devices)"
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
