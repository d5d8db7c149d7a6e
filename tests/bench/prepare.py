"""NodePrepareResources latency as the real kubelet sees it, on the real cluster
(``dev.cluster.kube``: kube-apiserver, scheduler, controller-manager, kubelet v1.34, containerd
with NRI) with dranet's four services as real processes (``dev.cluster.driver``).

What is measured, from the kubelet's own metrics (``/metrics`` on its HTTPS port, scraped with the
admin client certificate before a Pod is created, once it runs, and once it is gone; one Pod at a
time, so the ``_sum``/``_count`` deltas of a histogram are that Pod's calls, exact to the ns; the
buckets start at 100 ms and say nothing at this scale):

- ``prepare_*``: ``dra_grpc_operations_duration_seconds{driver_name="dra.net",
  method_name="NodePrepareResources"}``, the kubelet's gRPC call to our plugin socket, over
  ``--iterations`` one-claim Pods (one veth NIC each, claim config: name net1, MTU 1400) created
  and deleted in sequence; ``unprepare_*`` likewise for NodeUnprepareResources.
- ``prepare32_*``: one Pod with 32 claims over 32 NICs (``--calls32`` such Pods). The kubelet
  batches every claim of a Pod for one driver into one NodePrepareResources call, so this is the
  real path: the scheduler allocates 32 claims, the kubelet makes one call with 32 claims.
- ``split*_p50_ms``: prepare's own split of its time (API read, pipeline, inventory lookup,
  durable store write; ``total``, the wall time of the whole call inside prepare, so the
  kubelet's figure minus it is the gRPC hop and the server around the call) from its DEBUG
  "prepare timings" log line of each call. prepare adds up the per-claim times of claims it handles concurrently, so in ``split32_p50_ms`` the API read
  and inventory figures are sums over 32 overlapping reads, not wall time.

Baselines, in the same run:

- ``baseline_kubelet_prepare_resources_p50_ms`` and ``baseline_kubelet_overhead_p50_ms``: the
  kubelet's whole DRA PrepareResources step for the Pod (``dra_operations_duration_seconds``: it
  GETs each claim from the API server, checks the reservation, writes its checkpoint, then calls
  us) and that minus our gRPC call: the kubelet's own cost around ours, i.e. what a driver that
  answered in 0 ms would still cost the Pod. Only Pods whose sync ran PrepareResources exactly once
  before Running count (later syncs run it again as a no-op and would blur the split);
  ``samples.kubelet_overhead`` says how many.
- ``baseline_empty_call_p50_ms``: an empty NodePrepareResources call from this process over the
  plugin socket (v1 DRAPlugin, the way the kubelet calls it): the gRPC hop and the server's floor.
- ``baseline_claim_get_p50_ms``: one ResourceClaim GET from this process over a kept-alive HTTPS
  connection: the floor of prepare's API read.

Run as root after set-up (the Kubernetes binaries built: make setup):
.venv/bin/python tests/bench/prepare.py [--iterations N] [--calls32 M]
Progress goes to stderr; the last line on stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc

from proto.kubelet.dra.v1 import dra_pb2, dra_pb2_grpc
from tests.bench._cluster import Bench, HistogramDelta, KubeletMetrics, PodWatch, bench_cluster, p50, pct, say

NICS = 32
DRIVER = "dra.net"
GRPC = "dra_grpc_operations_duration_seconds"
MANAGER = "dra_operations_duration_seconds"
PREPARE = HistogramDelta(GRPC, {"driver_name": DRIVER, "method_name": "NodePrepareResources"})
UNPREPARE = HistogramDelta(GRPC, {"driver_name": DRIVER, "method_name": "NodeUnprepareResources"})
# The kubelet labels a success is_error="true" (strconv.FormatBool(err == nil)): count both.
KUBELET_PREPARE = HistogramDelta(MANAGER, {"operation_name": "PrepareResources"})
SPLIT_KEYS = ("api_read", "pipeline", "inventory", "store_write", "gate_wait", "plan_wall", "total")


def config(ifname: str) -> dict[str, Any]:
    return {"interface": {"name": ifname, "mtu": 1400}}


class Runner:
    def __init__(self, b: Bench) -> None:
        self.b = b
        self.metrics = KubeletMetrics(b.cluster, (GRPC, MANAGER))
        self.watch = PodWatch(b.cluster, b.ns).start()
        self.log = b.driver.procs["prepare"].log_path
        self.seq = 0

    def close(self) -> None:
        self.watch.stop()
        self.metrics.close()

    def wait_metric(self, before: dict[Any, float], h: HistogramDelta, n: int = 1, within: float = 30) -> Any:
        deadline = time.monotonic() + within
        while True:
            now = self.metrics.scrape()
            if h.of(before, now)[0] >= n:
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {h.labels} observation in the kubelet's metrics within {within}s")
            time.sleep(0.05)

    def log_mark(self) -> int:
        return self.log.stat().st_size

    def timings(self, mark: int) -> list[dict[str, Any]]:
        with open(self.log, "rb") as f:
            f.seek(mark)
            lines = f.read().decode(errors="replace").splitlines()
        return [json.loads(line) for line in lines if '"prepare timings"' in line]

    def cycle(self, claims: int) -> dict[str, Any]:
        """One Pod with ``claims`` claims: create, Running, delete, gone; the kubelet's
        metric deltas and prepare's timings lines for it."""
        self.seq += 1
        pod = f"p{self.seq}"
        names = [f"{pod}-c{i}" for i in range(claims)]
        for i, name in enumerate(names):
            self.b.create_claim(name, config("net1" if claims == 1 else f"net{i}"))
        m0 = self.metrics.scrape()
        mark = self.log_mark()
        t0 = self.b.create_pod(pod, names)[0]
        t_run = self.watch.wait(pod, "running", within=120)
        m1 = self.wait_metric(m0, PREPARE)
        prep_n, prep_s = PREPARE.of(m0, m1)
        kube_n, kube_s = KUBELET_PREPARE.of(m0, m1)
        self.b.delete_pod(pod)
        self.watch.wait(pod, "deleted", within=120)
        m2 = self.wait_metric(m1, UNPREPARE)
        unprep_n, unprep_s = UNPREPARE.of(m1, m2)
        for name in names:
            self.b.delete_claim(name)
        self.b.wait_claims_gone(names)
        self.b.wait_nics_home()
        if prep_n != 1:
            say(f"  {pod}: {prep_n} NodePrepareResources calls (a retry?); their mean is used")
        return {
            "prepare": prep_s / max(prep_n, 1),
            "unprepare": unprep_s / max(unprep_n, 1),
            "kubelet": kube_s if kube_n == 1 and prep_n == 1 else None,
            "kubelet_calls": kube_n,
            "start": t_run - t0,
            "timings": [t for t in self.timings(mark) if t.get("claims") == claims],
        }


def empty_calls(b: Bench, n: int) -> list[float]:
    sock = b.cluster.kubelet_dir / "plugins" / DRIVER / "dra.sock"
    with grpc.insecure_channel(f"unix://{sock}") as ch:
        stub = dra_pb2_grpc.DRAPluginStub(ch)
        out = []
        for i in range(n + 5):
            t = time.perf_counter()
            stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(), timeout=10)
            if i >= 5:
                out.append(time.perf_counter() - t)
    return out


def claim_gets(b: Bench, n: int) -> list[float]:
    b.create_claim("get-baseline", config("net1"))
    path = f"/apis/resource.k8s.io/v1/namespaces/{b.ns}/resourceclaims/get-baseline"
    out = []
    for i in range(n + 5):
        t = time.perf_counter()
        b.api.raw("GET", path)
        if i >= 5:
            out.append(time.perf_counter() - t)
    b.delete_claim("get-baseline")
    return out


def split(entries: list[dict[str, Any]]) -> dict[str, float]:
    return {
        k: round(statistics.median(e[f"{k}_ms"] for e in entries), 3) if entries else -1.0 for k in SPLIT_KEYS
    }


def run(iterations: int, calls32: int, warmup: int) -> dict[str, Any]:
    with bench_cluster(NICS) as b:
        r = Runner(b)
        try:
            say(f"warm-up: {warmup} one-claim Pods")
            for _ in range(warmup):
                r.cycle(1)
            one: list[dict[str, Any]] = []
            for i in range(iterations):
                one.append(r.cycle(1))
                say(
                    f"one claim {i + 1}/{iterations}: NodePrepareResources {one[-1]['prepare'] * 1000:.1f} ms, "
                    f"unprepare {one[-1]['unprepare'] * 1000:.1f} ms, Pod start {one[-1]['start'] * 1000:.0f} ms"
                )
            many: list[dict[str, Any]] = []
            for j in range(calls32):
                many.append(r.cycle(NICS))
                say(
                    f"{NICS} claims {j + 1}/{calls32}: NodePrepareResources {many[-1]['prepare'] * 1000:.1f} ms, "
                    f"unprepare {many[-1]['unprepare'] * 1000:.1f} ms, Pod start {many[-1]['start'] * 1000:.0f} ms"
                )
            say("baselines: empty NodePrepareResources calls, claim GETs")
            empty = empty_calls(b, 200)
            get = claim_gets(b, 200)
        finally:
            r.close()

    def col(rows: list[dict[str, Any]], key: str) -> list[float]:
        return [row[key] for row in rows if row[key] is not None]

    kubelet_one = col(one, "kubelet")
    overhead_one = [row["kubelet"] - row["prepare"] for row in one if row["kubelet"] is not None]
    kubelet_many = col(many, "kubelet")
    overhead_many = [row["kubelet"] - row["prepare"] for row in many if row["kubelet"] is not None]
    return {
        "prepare_p50_ms": p50(col(one, "prepare")),
        "prepare_p99_ms": pct(col(one, "prepare"), 0.99),
        "prepare32_p50_ms": p50(col(many, "prepare")),
        "prepare32_p99_ms": pct(col(many, "prepare"), 0.99),
        "unprepare_p50_ms": p50(col(one, "unprepare")),
        "unprepare32_p50_ms": p50(col(many, "unprepare")),
        "split_p50_ms": split([t for row in one for t in row["timings"]]),
        "split32_p50_ms": split([t for row in many for t in row["timings"]]),
        # Of the one-claim calls: how many had their claim, and their device's inventory
        # answer, read ahead from the Pod watch (services/prepare/prefetch.py).
        "read_ahead": {
            "claims": sum(t.get("read_ahead", 0) for row in one for t in row["timings"]),
            "devices": sum(t.get("devices_read_ahead", 0) for row in one for t in row["timings"]),
            "calls": sum(len(row["timings"]) for row in one),
        },
        # Devices whose stored config was read before planning (0 on a first prepare:
        # the write checks the device is free, services/prepare/pipeline.py).
        "store_reads": sum(t.get("store_reads", 0) for row in one for t in row["timings"]),
        "baseline_kubelet_prepare_resources_p50_ms": p50(kubelet_one),
        "baseline_kubelet_overhead_p50_ms": p50(overhead_one),
        "baseline_kubelet_prepare_resources32_p50_ms": p50(kubelet_many),
        "baseline_kubelet_overhead32_p50_ms": p50(overhead_many),
        "baseline_empty_call_p50_ms": p50(empty),
        "baseline_claim_get_p50_ms": p50(get),
        "pod_start_p50_ms": p50(col(one, "start")),
        "pod_start32_p50_ms": p50(col(many, "start")),
        "target_prepare_p50_ms": 15,
        "source": "kubelet metrics dra_grpc_operations_duration_seconds (real kubelet v1.34)",
        "samples": {
            "one": len(one),
            "calls32": len(many),
            "kubelet_overhead": len(overhead_one),
            "kubelet_overhead32": len(overhead_many),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=25, help="one-claim Pods")
    ap.add_argument("--calls32", type=int, default=5, help="Pods with 32 claims")
    ap.add_argument("--warmup", type=int, default=3, help="one-claim Pods before measuring")
    args = ap.parse_args()
    t0 = time.monotonic()
    result = run(args.iterations, args.calls32, args.warmup)
    result["run_s"] = round(time.monotonic() - t0, 1)
    say(
        f"NodePrepareResources p50 {result['prepare_p50_ms']} ms (p99 {result['prepare_p99_ms']}), "
        f"32 claims p50 {result['prepare32_p50_ms']} ms; kubelet overhead p50 "
        f"{result['baseline_kubelet_overhead_p50_ms']} ms; split {result['split_p50_ms']}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
