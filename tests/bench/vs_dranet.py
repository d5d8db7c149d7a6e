"""Our driver against dranet itself, on one real cluster in one run.

One ``KubeCluster`` (etcd, kube-apiserver, controller-manager, scheduler, kubelet v1.34,
containerd with NRI) with ``--nics`` veth NICs (``bnNN``, default 50) in the node's namespace,
served in turn by our four services (``dev.cluster.driver.Driver``, as host processes, at
``--log-level`` INFO, their default) and by dranet, the Go driver we re-implement
(``dev.cluster.dranet_ref.DranetRef``: the binary of dev/build-dranet.sh, ``-v=2``, the same
``--filter``), alternating: ours, dranet, ours, dranet ... for ``--rounds`` rounds. Both are
``dra.net``, so one serves the node at a time; at each switch every Pod and claim is deleted
first (their NICs come back while the driver still runs), the driver is stopped, the node's
ResourceSlices are deleted as admin, the other driver is started, and the bench waits until
the kubelet has it connected and its slices list every bench NIC.

Per round and driver, after ``--warmup`` unmeasured Pods, ``--pods`` one-claim Pods, one at a
time (each claim picks one NIC by a CEL selector, config ``interface.name: net1``; the same
NICs in the same order for both drivers):

- ``*_pod_start_p50_ms``: Pod POST to the Pod first seen Running by a watch on the namespace
  (``PodWatch``, perf_counter times of this process).
- ``*_prepare_p50_ms``: the kubelet's own ``dra_grpc_operations_duration_seconds{driver_name=
  "dra.net", method_name="NodePrepareResources"}``, _sum/_count deltas between a scrape before
  the Pod and one after it runs (one Pod at a time: the delta is that Pod's call).
- ``*_teardown_p50_ms``: the Pod's DELETE to its DELETED event on the watch (the kubelet has
  stopped the sandbox, so the NIC was given back, and the API server removed the Pod).

Once per driver, in its last round, after its Pods:

- ``*_rss_mib``: VmRSS from /proc/<pid>/status; ours is the sum over the four service
  processes (``ip netns exec`` exec()s into python: the pid is the service, checked by its
  cmdline), dranet's is ``DranetRef.pid`` (``ip netns exec`` / ``unshare`` / ``sh -c ... exec``
  all exec() into dranet, checked by /proc/<pid>/comm). ``*_hwm_mib``: VmHWM, the peak.
  ``*_pss_mib``: PSS summed (a page shared with any process, this bench too, split among them);
  ``*_footprint_mib``: private pages plus each mapped file's shared pages once: what the
  processes cost the node together (VmRSS counts libgrpc and libpython once per process).
- ``*_cpu_idle_s``: CPU seconds (utime+stime+cutime+cstime of /proc/<pid>/stat over
  SC_CLK_TCK; neither driver forks helpers, the children's part stays 0) over ``--idle-s``
  (20) seconds with the NICs published and no Pod.
- ``*_cpu_churn50_s``: the same over a churn of ``--churn`` (50) Pods at once, one claim and one
  NIC each: all created, all Running, all deleted, all gone, claims gone, NICs back.
  ``*_churn50_s`` is that churn's wall time.
- ``*_publish_1000_s``: 500 veth pairs with both ends in the node's namespace (1,000 netdevs
  ``paNNNN``/``pbNNNN``, which the filter passes), made by one ``ip -batch``; the time from the
  start of that batch until the node's ResourceSlices (watched, not polled) hold all 1,000 as
  devices; -1 if not within ``--publish-timeout`` (120 s). ``*_publish_1000_published`` is the
  most of them ever seen published, ``*_publish_1000_slices`` the slice sizes then, and
  ``*_publish_1000_error`` the first publish error of the driver's log after the batch.
  Then the pairs are deleted (and their devices must leave the slices).
- ``*_publish_128_s``: the same with as many new netdevs as bring the node to 128 devices
  (``*_publish_128_new_devices``; 128 is the most one slice holds), so that dranet can publish
  them too and ``publish_128_ratio`` compares the two publishers; measured before the 1,000.

Why dranet never gets to 1,000 (seen in every run): dranet publishes its whole inventory as ONE
ResourceSlice (pkg/driver/dra_hooks.go: ``Pools: {node: {Slices: [{Devices: filtered}]}}``),
and the API server refuses a slice of more than 128 devices (resource.k8s.io/v1
``ResourceSliceMaxDevices``: "spec.devices: Too many: 1050: must have at most 128 items"). Its
slice controller logs the refusal and retries with backoff; the node keeps the last slice that
was accepted (at most 128 devices, typically the NICs from before the batch plus whatever part
of the batch an inventory scan saw while ``ip -batch`` was still running), so no number of
netdevs above 128 is ever published. Ours splits a pool into slices of at most 128 devices
(services/inventory/pooling.py). This is a dranet limit, not a rate limit or a filter.

Why dranet's idle CPU is high once it has run Pods (``*_idle_netlink_events`` shows the node's
namespace is quiet meanwhile): its inventory (pkg/inventory/db.go) waits on
``netlink.LinkSubscribe(nlChannel, doneCh)`` with no error callback. A burst of link events
(Pods' veths, NICs moved) overflows the subscription socket, ``recvfrom`` fails with ENOBUFS
(seen with strace), vishvananda/netlink's reader goroutine returns and closes the channel
(``defer close(ch)``), and from then on ``case <-nlChannel`` is always ready: dranet rescans the
node at its rate limit (``--inventory-min-poll-interval``, 200 ms here as for ours; 2 s by
default) for the rest of its life. A fresh dranet idles at 0 CPU s; after 150 veth pairs made
and deleted it burns ~0.3 CPU s per second. This inflates ``dranet_cpu_idle_s`` and part of
``dranet_cpu_churn50_s``; it is dranet's behaviour, measured as is.

Ratios are ours / dranet (below 1: ours is faster or smaller). ``samples`` counts what each
p50 is over. The node's other netdevs (apilink, dncni*, veth*) are filtered out for both.

Run as root after set-up (the Kubernetes binaries and dranet built: make setup):
.venv/bin/python tests/bench/vs_dranet.py [--rounds 2] [--pods 10] [--churn 50]
Progress goes to stderr; the last line on stdout is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster import dranet_ref
from dev.cluster.dranet_ref import DranetRef
from dev.cluster.driver import ORDER, Driver
from dev.cluster.kube import KubeCluster
from tests.bench._cluster import (
    HistogramDelta,
    KeepAlive,
    KubeletMetrics,
    PodWatch,
    Watch,
    claim_body,
    p50,
    pod_body,
    say,
    wait_nics_home,
)
from tests.support.kube import Kube, on

DRIVER = "dra.net"
GRPC = "dra_grpc_operations_duration_seconds"
PREPARE = HistogramDelta(GRPC, {"driver_name": DRIVER, "method_name": "NodePrepareResources"})
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAIRS = 500  # veth pairs: 1,000 netdevs
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if a > 0 and b > 0 else -1.0


# ----------------------------------------------------------------------------------------------
# /proc


def status_kib(pid: int, key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def footprint_kib(pids: Sequence[int]) -> tuple[int, int]:
    """(PSS summed, group footprint) of ``pids`` in KiB, from /proc/<pid>/smaps. The group
    footprint counts every private page, and the shared pages of each mapped file once (the
    largest of the processes' shares of it): what the processes cost the node together, where
    VmRSS counts a library they all map (libgrpc, libpython) once per process."""
    pss = private = 0
    shared: dict[str, int] = {}
    for pid in pids:
        name = ""
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            head = line.split(None, 1)
            if head and not head[0].endswith(":"):  # a mapping: "addr perms off dev inode path"
                parts = line.split(None, 5)
                name = parts[5] if len(parts) == 6 else f"[anon:{pid}:{parts[0]}]"
                continue
            key, _, rest = line.partition(":")
            kib = int(rest.split()[0]) if rest.strip() and rest.split()[0].isdigit() else 0
            if key == "Pss":
                pss += kib
            elif key in ("Private_Clean", "Private_Dirty"):
                private += kib
            elif key in ("Shared_Clean", "Shared_Dirty"):
                shared[f"{name}|{key}"] = max(shared.get(f"{name}|{key}", 0), kib)
    return pss, private + sum(shared.values())


IDLE_GRPC_SERVER = """
import asyncio, sys
import grpc

async def main():
    server = grpc.aio.server()
    server.add_insecure_port("unix:" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def grpc_floor(n: int = 4) -> dict[str, float]:
    """The baseline for our RSS: ``n`` bare interpreters, each an idle grpc.aio server on a
    Unix socket and nothing else (no code of ours, no other import): what four services
    that speak gRPC cost before they do anything."""
    procs = []
    tmp = Path(f"/tmp/dnk-grpc-floor-{secrets.token_hex(3)}")
    tmp.mkdir(parents=True)
    try:
        for i in range(n):
            p = subprocess.Popen(
                [sys.executable, "-c", IDLE_GRPC_SERVER, str(tmp / f"s{i}.sock")],
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(p)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        pids = [p.pid for p in procs]
        _pss, group = footprint_kib(pids)
        return {
            "rss_mib": round(sum(status_kib(pid, "VmRSS") for pid in pids) / 1024, 1),
            "footprint_mib": round(group / 1024, 1),
        }
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def cpu_s(pid: int) -> float:
    """utime+stime (and the waited-for children's) of ``pid``, in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    rest = stat[stat.rindex(")") + 2 :].split()
    return sum(int(x) for x in rest[11:15]) / CLK_TCK


# ----------------------------------------------------------------------------------------------
# A watch on the node's ResourceSlices


class SliceWatch(Watch):
    """The node's ResourceSlices of dra.net, kept current by one watch in a thread; ``expect``
    a set of device names, then ``wait`` for the perf_counter time of the event after which the
    slices held all of them."""

    what = "ResourceSlice watch"

    def __init__(self, cluster: KubeCluster) -> None:
        super().__init__(cluster)
        self.slices: dict[str, list[str]] = {}
        self.target: set[str] = set()
        self.hit: float | None = None
        self.best = 0
        self.best_sizes: list[int] = []

    def start(self) -> SliceWatch:
        path = f"{SLICES}?fieldSelector=spec.nodeName={self.cluster.node_name}"
        listed = self.cluster.api.get(path)
        for s in listed["items"]:
            self._apply("ADDED", s)
        self.open(path, listed["metadata"]["resourceVersion"])
        return self

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name")
        spec = obj.get("spec") or {}
        if not name or spec.get("driver") != DRIVER:
            return
        if kind == "DELETED":
            self.slices.pop(name, None)
        else:
            self.slices[name] = [d["name"] for d in spec.get("devices") or []]

    def devices(self) -> set[str]:
        with self.cond:
            return {d for devs in self.slices.values() for d in devs}

    def on_event(self, ev: dict[str, Any], now: float) -> None:
        if ev.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return
        self._apply(ev["type"], ev.get("object") or {})
        if self.target:
            have = {d for devs in self.slices.values() for d in devs}
            n = len(self.target & have)
            if n > self.best:
                self.best = n
                self.best_sizes = sorted((len(v) for v in self.slices.values()), reverse=True)
            if self.hit is None and n == len(self.target):
                self.hit = now

    def expect(self, names: set[str]) -> None:
        with self.cond:
            self.target, self.hit, self.best, self.best_sizes = set(names), None, 0, []

    def wait(self, within: float) -> float | None:
        deadline = time.monotonic() + within
        with self.cond:
            while self.hit is None:
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(min(left, 1.0))
            return self.hit

    def wait_until(self, pred: Any, within: float, what: str) -> None:
        deadline = time.monotonic() + within
        with self.cond:
            while not pred({d for devs in self.slices.values() for d in devs}):
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what} not within {within:.0f}s")
                self.cond.wait(min(left, 1.0))


# ----------------------------------------------------------------------------------------------
# The two drivers, one at a time


class Ours:
    name = "ours"

    def __init__(self, cluster: KubeCluster, log_level: str, prepare_args: Sequence[str] = ()) -> None:
        self.cluster = cluster
        self.log_level = log_level
        self.prepare_args = list(prepare_args)
        self.d: Driver | None = None

    def start(self) -> None:
        self.d = Driver(
            self.cluster,
            prepare_args=self.prepare_args,
            log_level=self.log_level,
            workdir=self.cluster.state / f"driver-{secrets.token_hex(3)}",
        )
        try:
            self.d.start()
        except BaseException:
            say(self.d.logs(3000))
            self.d.stop()
            raise

    def stop(self) -> None:
        if self.d is not None:
            self.d.stop()

    def pids(self) -> dict[str, int]:
        assert self.d is not None
        out = {}
        for svc in ORDER:
            pid = self.d.procs[svc].pid
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if f"services.{svc}".encode() not in cmd:
                raise RuntimeError(f"pid {pid} is not services.{svc}: {cmd[:4]}")
            out[svc] = pid
        return out

    def log(self) -> str:
        assert self.d is not None
        return self.d.procs["inventory"].log()

    def log_size(self) -> int:
        assert self.d is not None
        return self.d.procs["inventory"].log_path.stat().st_size

    def log_since(self, mark: int) -> str:
        assert self.d is not None
        with open(self.d.procs["inventory"].log_path, "rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")


class Reference:
    name = "dranet"

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.ref: DranetRef | None = None

    def start(self) -> None:
        self.ref = DranetRef(self.cluster)
        self.ref.start()

    def stop(self) -> None:
        if self.ref is not None:
            self.ref.stop()

    def pids(self) -> dict[str, int]:
        assert self.ref is not None
        pid = self.ref.pid
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        if comm != "dranet":
            raise RuntimeError(f"DranetRef.pid {pid} is {comm!r}, not dranet")
        return {"dranet": pid}

    def log_size(self) -> int:
        assert self.ref is not None
        return self.ref.log_path.stat().st_size

    def log_since(self, mark: int) -> str:
        assert self.ref is not None
        with open(self.ref.log_path, "rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")


Side = Ours | Reference


# ----------------------------------------------------------------------------------------------
# The bench


@dataclass
class Result:
    start: list[float] = field(default_factory=list)
    prepare: list[float] = field(default_factory=list)
    teardown: list[float] = field(default_factory=list)
    retries: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Bench:
    def __init__(self, cluster: KubeCluster, nics: list[str]) -> None:
        self.c = cluster
        self.nics = nics
        self.kube = Kube(cluster, f"vsb-{secrets.token_hex(2)}")
        self.kube.create_namespace()
        self.dc = self.kube.device_class(
            "nic",
            'has(device.attributes["dra.net"].ifName) && device.attributes["dra.net"].ifName.startsWith("bn")',
        )
        self.api = KeepAlive(cluster)
        self.metrics = KubeletMetrics(cluster, (GRPC,))
        self.pods = PodWatch(cluster, self.ns).start()
        self.slices = SliceWatch(cluster).start()
        self.seq = 0

    @property
    def ns(self) -> str:
        return self.kube.ns

    def close(self) -> None:
        self.pods.stop()
        self.slices.stop()
        self.metrics.close()
        self.api.close()

    # -- objects --------------------------------------------------------------------------------

    def claim(self, name: str, nic: str) -> None:
        body = claim_body(name, self.dc, {"interface": {"name": "net1"}}, on(nic))
        self.api.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims", body)

    def pod(self, name: str, claim: str) -> float:
        body = pod_body(name, [claim])
        t = time.perf_counter()
        self.api.call("POST", f"/api/v1/namespaces/{self.ns}/pods", body)
        return t

    def delete_pod(self, name: str) -> float:
        t = time.perf_counter()
        self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}", ok=(200, 202, 404))
        return t

    def delete_claim(self, name: str) -> None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims/{name}"
        self.api.call("DELETE", path, ok=(200, 202, 404))

    def wait_claims_gone(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims"
        while self.api.call("GET", path)["items"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"claims in {self.ns} not gone within {within:.0f}s")
            time.sleep(0.1)

    def wait_nics_home(self, within: float = 60.0) -> None:
        wait_nics_home(self.c, self.nics, within)

    def cleanup(self) -> None:
        """Every Pod and claim of the namespace gone, the NICs back."""
        for p in self.api.call("GET", f"/api/v1/namespaces/{self.ns}/pods")["items"]:
            self.delete_pod(p["metadata"]["name"])
        deadline = time.monotonic() + 120
        while self.api.call("GET", f"/api/v1/namespaces/{self.ns}/pods")["items"]:
            if time.monotonic() > deadline:
                raise TimeoutError("Pods not gone within 120s")
            time.sleep(0.2)
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims"
        for cl in self.api.call("GET", path)["items"]:
            self.delete_claim(cl["metadata"]["name"])
        self.wait_claims_gone()
        self.wait_nics_home()

    # -- switching --------------------------------------------------------------------------------

    def wipe_slices(self) -> None:
        self.c.api.call("DELETE", f"{SLICES}?fieldSelector=spec.nodeName={self.c.node_name}", ok=(200,))
        self.slices.wait_until(lambda have: not have, 30, "the node's slices deleted")

    def serve(self, side: Side) -> None:
        """``side`` started on a node without slices, connected to the kubelet, all NICs published."""
        t0 = time.monotonic()
        kubelet_log = self.c.procs["kubelet"].log_path
        mark = kubelet_log.stat().st_size
        side.start()
        deadline = time.monotonic() + 60
        while True:
            with open(kubelet_log, "rb") as f:
                f.seek(mark)
                lines = [
                    ln
                    for ln in f.read().decode(errors="replace").splitlines()
                    if 'driverName="dra.net"' in ln and "Connection changed" in ln
                ]
            if lines and "connected=true" in lines[-1]:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the kubelet did not connect {side.name} within 60s")
            time.sleep(0.1)
        self.slices.wait_until(lambda have: set(self.nics) <= have, 60, f"{side.name}: NICs published")
        say(f"{side.name} serves the node, {len(self.nics)} NICs published ({time.monotonic() - t0:.1f}s)")

    def unserve(self, side: Side) -> None:
        t0 = time.monotonic()
        self.cleanup()
        side.stop()
        self.wipe_slices()
        say(f"{side.name} stopped, slices deleted ({time.monotonic() - t0:.1f}s)")

    # -- measurements ---------------------------------------------------------------------------

    def wait_prepare(self, before: dict[Any, float], within: float = 30.0) -> dict[Any, float]:
        deadline = time.monotonic() + within
        while True:
            now = self.metrics.scrape()
            if PREPARE.of(before, now)[0] >= 1:
                return now
            if time.monotonic() > deadline:
                raise TimeoutError(f"no NodePrepareResources in the kubelet's metrics within {within}s")
            time.sleep(0.05)

    def cycle(self, nic: str) -> tuple[float, float, float, int]:
        """One Pod with one claim on ``nic``: start, prepare, teardown (s), prepare calls."""
        self.seq += 1
        pod = f"p{self.seq}"
        self.claim(pod, nic)
        m0 = self.metrics.scrape()
        t0 = self.pod(pod, pod)
        t_run = self.pods.wait(pod, "running", within=120)
        m1 = self.wait_prepare(m0)
        n, total = PREPARE.of(m0, m1)
        t_del = self.delete_pod(pod)
        t_gone = self.pods.wait(pod, "deleted", within=120)
        self.delete_claim(pod)
        self.wait_claims_gone()
        self.wait_nics_home()
        return t_run - t0, total / max(n, 1), t_gone - t_del, n

    def pods_round(self, side: Side, res: Result, pods: int, warmup: int) -> None:
        for i in range(warmup + pods):
            nic = self.nics[i % len(self.nics)]
            start, prep, down, n = self.cycle(nic)
            if i < warmup:
                continue
            res.start.append(start)
            res.prepare.append(prep)
            res.teardown.append(down)
            res.retries += n != 1
            say(
                f"  {side.name} pod {i - warmup + 1}/{pods}: start {start * 1000:.0f} ms, "
                f"prepare {prep * 1000:.1f} ms, teardown {down * 1000:.0f} ms"
                + (f" ({n} prepare calls)" if n != 1 else "")
            )

    def rss(self, side: Side) -> dict[str, Any]:
        pids = side.pids()
        rss = {k: status_kib(p, "VmRSS") for k, p in pids.items()}
        hwm = {k: status_kib(p, "VmHWM") for k, p in pids.items()}
        pss, group = footprint_kib(list(pids.values()))
        return {
            "rss_mib": round(sum(rss.values()) / 1024, 1),
            "hwm_mib": round(sum(hwm.values()) / 1024, 1),
            "pss_mib": round(pss / 1024, 1),
            "footprint_mib": round(group / 1024, 1),
            "rss_by_process_mib": {k: round(v / 1024, 1) for k, v in rss.items()},
        }

    def cpu(self, side: Side) -> float:
        return sum(cpu_s(p) for p in side.pids().values())

    def idle(self, side: Side, window: float) -> tuple[float, int]:
        """CPU seconds over ``window`` with nothing to do, and the netlink messages (links,
        addresses, routes) the node's namespace saw meanwhile (what would wake an inventory)."""
        mon = subprocess.Popen(
            ["ip", "-n", self.c.netns, "monitor", "link", "address", "route"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            time.sleep(0.2)
            c0 = self.cpu(side)
            time.sleep(window)
            cpu = self.cpu(side) - c0
        finally:
            mon.terminate()
            out = mon.communicate(timeout=10)[0]
        return round(cpu, 3), sum(1 for ln in out.splitlines() if ln and not ln.startswith(" "))

    def churn(self, side: Side, n: int) -> tuple[float, float]:
        """CPU seconds and wall time of ``n`` Pods at once, each on its own NIC."""
        names = [f"churn{self.seq}-{i}" for i in range(n)]
        self.seq += 1
        c0, t0 = self.cpu(side), time.perf_counter()
        for name, nic in zip(names, self.nics, strict=False):
            self.claim(name, nic)
            self.pod(name, name)
        for name in names:
            self.pods.wait(name, "running", within=300)
        t_run = time.perf_counter()
        for name in names:
            self.delete_pod(name)
        for name in names:
            self.pods.wait(name, "deleted", within=300)
        for name in names:
            self.delete_claim(name)
        self.wait_claims_gone(120)
        self.wait_nics_home(120)
        wall, cpu = time.perf_counter() - t0, self.cpu(side) - c0
        say(
            f"  {side.name} churn of {n}: {cpu:.2f} CPU s over {wall:.1f} s (all Running after {t_run - t0:.1f} s)"
        )
        return cpu, wall

    def ip_batch(self, text: str) -> None:
        res = subprocess.run(
            ["ip", "-n", self.c.netns, "-batch", "-"], input=text, text=True, capture_output=True
        )
        if res.returncode != 0:
            raise RuntimeError(f"ip -batch: {res.stderr.strip()[:500]}")

    def publish_batch(self, side: Side, pairs: int, tag: str, within: float) -> dict[str, Any]:
        """``pairs`` veth pairs made by one ``ip -batch``: the time until the slices hold all
        of them (``{tag}_s``), then deleted again."""
        names = {f"p{e}{i:04d}" for i in range(pairs) for e in "ab"}
        self.slices.expect(names)
        mark = side.log_size()
        batch = "".join(f"link add pa{i:04d} type veth peer name pb{i:04d}\n" for i in range(pairs))
        t0 = time.perf_counter()
        try:
            self.ip_batch(batch)
            made = time.perf_counter() - t0
            hit = self.slices.wait(within)
            took = round(hit - t0, 3) if hit is not None else -1.0
            with self.slices.cond:
                best, sizes = self.slices.best, self.slices.best_sizes
            log = side.log_since(mark)
            errors = [
                ln.strip()
                for ln in log.splitlines()
                if re.search(r"Too many|at most|error|fail", ln, re.I)
                and not re.search(r"\blevel\W+(debug|info)\b", ln, re.I)
            ]
            say(
                f"  {side.name}: {2 * pairs} netdevs made in {made:.2f} s, "
                + (
                    f"all published after {took:.2f} s"
                    if took >= 0
                    else f"NOT all published in {within:.0f} s"
                )
                + f"; at most {best} of them published, slice sizes then {sizes}"
            )
            if errors:
                say(f"  {side.name}: first publish error in its log: {errors[0][:600]}")
            return {
                f"{tag}_s": took,
                f"{tag}_batch_s": round(made, 3),
                f"{tag}_published": best,
                f"{tag}_slices": sizes,
                f"{tag}_error": errors[0][:600] if errors else "",
            }
        finally:
            self.ip_batch("".join(f"link del pa{i:04d}\n" for i in range(pairs)))
            try:
                self.slices.wait_until(
                    lambda have: not (names & have), 120, f"{side.name}: {2 * pairs} devices unpublished"
                )
            except TimeoutError as exc:
                say(f"  {side.name}: {exc}")
            self.slices.expect(set())

    def publish_128(self, side: Side, within: float) -> dict[str, Any]:
        """New netdevs up to 128 devices on the node: the most one slice holds, so dranet can
        publish them too and the two publish times compare."""
        published = len(self.slices.devices())
        pairs = max(1, (128 - published) // 2)
        out = self.publish_batch(side, pairs, "publish_128", within)
        out["publish_128_new_devices"] = 2 * pairs
        return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if dranet_ref.binary() is None:
        raise SystemExit(f"no dranet binary under {dranet_ref.CACHE}: run dev/build-dranet.sh")
    t0 = time.monotonic()
    cluster = KubeCluster(node_name="vsbench-node")
    sides: dict[str, Side] = {
        "ours": Ours(cluster, args.log_level, args.prepare_arg),
        "dranet": Reference(cluster),
    }
    res = {k: Result() for k in sides}
    bench: Bench | None = None
    serving: Side | None = None
    ok = False
    try:
        say(f"starting Kubernetes {cluster.kube_version} in {cluster.state}")
        cluster.start()
        nics = [f"bn{i:02d}" for i in range(max(args.nics, args.churn, 1))]
        for name in nics:
            cluster.net.add_nic(name)
        say(f"node Ready, {len(nics)} NICs ({time.monotonic() - t0:.1f}s)")
        bench = Bench(cluster, nics)
        for r in range(args.rounds):
            last = r == args.rounds - 1
            for key, side in sides.items():
                say(f"round {r + 1}/{args.rounds}: {key}")
                bench.serve(side)
                serving = side
                bench.pods_round(side, res[key], args.pods, args.warmup)
                if last:
                    x = res[key].extra
                    x.update(bench.rss(side))
                    say(f"  {key}: RSS {x['rss_mib']} MiB {x['rss_by_process_mib']}, peak {x['hwm_mib']} MiB")
                    x["cpu_idle_s"], x["idle_netlink_events"] = bench.idle(side, args.idle_s)
                    say(
                        f"  {key}: {x['cpu_idle_s']} CPU s over {args.idle_s:.0f} s idle "
                        f"({x['idle_netlink_events']} netlink events in the node's namespace meanwhile)"
                    )
                    cpu, wall = bench.churn(side, args.churn)
                    x["cpu_churn50_s"], x["churn50_s"] = round(cpu, 3), round(wall, 2)
                    x.update(bench.publish_128(side, args.publish_timeout))
                    x.update(bench.publish_batch(side, PAIRS, "publish_1000", args.publish_timeout))
                bench.unserve(side)
                serving = None
        ok = True
    except BaseException:
        if serving is not None and isinstance(serving, Reference) and serving.ref is not None:
            print(serving.ref.log()[-4000:], file=sys.stderr)
        elif serving is not None and isinstance(serving, Ours) and serving.d is not None:
            print(serving.d.logs(3000), file=sys.stderr)
        raise
    finally:
        t1 = time.monotonic()
        if bench is not None:
            bench.close()
        with contextlib.suppress(Exception):
            cluster.delete_pods()
        for side in sides.values():
            with contextlib.suppress(Exception):
                side.stop()
        cluster.stop()
        mounted = [
            m for m in Path("/proc/self/mountinfo").read_text().split() if m.startswith(str(cluster.state))
        ]
        if ok and not mounted:
            shutil.rmtree(cluster.state, ignore_errors=True)
            say(f"cluster stopped and removed ({time.monotonic() - t1:.1f}s)")
        else:
            say(f"cluster stopped ({time.monotonic() - t1:.1f}s); its logs stay in {cluster.logs}")

    out: dict[str, Any] = {}
    for key, r_ in res.items():
        out[f"{key}_pod_start_p50_ms"] = p50(r_.start)
        out[f"{key}_prepare_p50_ms"] = p50(r_.prepare)
        out[f"{key}_teardown_p50_ms"] = p50(r_.teardown)
    for key, r_ in res.items():
        for k, v in r_.extra.items():
            out[f"{key}_{k}"] = v
    for what, key in (
        ("pod_start", "pod_start_p50_ms"),
        ("prepare", "prepare_p50_ms"),
        ("teardown", "teardown_p50_ms"),
        ("rss", "rss_mib"),
        ("footprint", "footprint_mib"),
        ("publish", "publish_1000_s"),
        ("publish_128", "publish_128_s"),
        ("cpu_idle", "cpu_idle_s"),
        ("cpu_churn50", "cpu_churn50_s"),
    ):
        out[f"{what}_ratio"] = ratio(out.get(f"ours_{key}", -1.0), out.get(f"dranet_{key}", -1.0))
    # Our floor: four idle gRPC servers and nothing else, against dranet's one process.
    floor = grpc_floor(len(ORDER))
    out["baseline_grpc_servers_rss_mib"] = floor["rss_mib"]
    out["baseline_grpc_servers_footprint_mib"] = floor["footprint_mib"]
    out["rss_floor_ratio"] = ratio(floor["rss_mib"], out.get("dranet_rss_mib", -1.0))
    out["samples"] = {
        **{f"{k}_pods": len(r_.start) for k, r_ in res.items()},
        **{f"{k}_prepare_retries": r_.retries for k, r_ in res.items()},
        "rounds": args.rounds,
        "churn_pods": args.churn,
        "idle_window_s": args.idle_s,
    }
    out["source"] = "kubelet v1.34 metrics (prepare), Pod watch (start, teardown), /proc (RSS, CPU)"
    out["run_s"] = round(time.monotonic() - t0, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="alternations ours, dranet")
    ap.add_argument("--pods", type=int, default=10, help="measured one-claim Pods per round and driver")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured Pods after each driver start")
    ap.add_argument("--nics", type=int, default=50, help="bench NICs (at least --churn)")
    ap.add_argument("--churn", type=int, default=50, help="Pods at once in the CPU churn")
    ap.add_argument("--idle-s", type=float, default=20.0, help="the idle CPU window")
    ap.add_argument("--publish-timeout", type=float, default=120.0, help="for the 1,000 netdevs")
    ap.add_argument("--log-level", default="INFO", help="our services' log level")
    ap.add_argument(
        "--prepare-arg",
        action="append",
        default=[],
        help="an extra flag for our prepare service (repeat), e.g. --prepare-arg=--no-claim-prefetch",
    )
    args = ap.parse_args()
    result = run(args)
    say(
        f"pod start p50 ours {result['ours_pod_start_p50_ms']} / dranet {result['dranet_pod_start_p50_ms']} ms; "
        f"prepare p50 {result['ours_prepare_p50_ms']} / {result['dranet_prepare_p50_ms']} ms; "
        f"RSS {result.get('ours_rss_mib')} / {result.get('dranet_rss_mib')} MiB; "
        f"1,000 netdevs published {result.get('ours_publish_1000_s')} / {result.get('dranet_publish_1000_s')} s"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
