"""Pod churn under faults on the real cluster with the helm-installed driver (dev.cluster.install),
and the invariants that must hold throughout. Used by tests/e2e/test_churn.py (a bounded run in CI)
and tests/bench/soak.py (a longer one).

Workers, one per NIC, create a claim and a Pod for their NIC, wait until it runs, check the Pod's
``net1`` is there and configured as asked (name, MTU, address) and that the store holds its config,
then delete the Pod and its claim and start again. Meanwhile faults are injected at random moments,
round-robin over the kinds so each one happens: SIGKILL of each of the four containers (the kubelet
restarts them), the driver pod deleted (the DaemonSet makes a new one), a kubelet restart, a
containerd restart, kube-apiserver and etcd down for ``api_down_s``, and a node "reboot"
(``KubeCluster.reboot_node``).

Invariants (``Report.violations`` lists every breach):
- no Pod runs without its device; every Running Pod's device is configured as asked;
- the store holds the config of every Pod seen Running (acknowledged records are not lost);
- at the end: every NIC is back on the node (none leaked), no extra link is left on the node, no
  Pod is stuck Terminating, the store holds no record of a Pod that is gone;
- no ERROR line or traceback in any service's log (the kubelet's container log files, read all
  along) except one that names an injected fault: within ``fault_grace_s`` of it, and naming what
  it took away (``NAMES``: the component, or the connection to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dev.cluster.containerd import BRIDGE_PREFIX
from dev.cluster.install import NAMESPACE, Installed
from dev.cluster.kube import ClusterError, KubeCluster
from shared.storeclient import StoreClient
from tests.support.kube import Kube, addresses, ip_json, link

FAULTS = (
    "kill-store",
    "kill-inventory",
    "kill-prepare",
    "kill-attach",
    "delete-driver-pod",
    "restart-kubelet",
    "restart-containerd",
    "stop-apiserver-etcd",
    "reboot-node",
)
MTU = 1400
# An ERROR line is explained only by a fault that it names: within ``fault_grace_s`` of the
# fault, and mentioning what the fault took away (the component, or the connection to it).
_LOST = r"UNAVAILABLE|unavailable|connect|closed|reset|refused|broken pipe|timed? ?out|deadline"
NAMES = {
    "kill-store": rf"store|{_LOST}",
    "kill-inventory": rf"inventory|{_LOST}",
    "kill-prepare": rf"prepare|{_LOST}",
    "kill-attach": rf"attach|NRI|{_LOST}",
    "delete-driver-pod": rf"store|inventory|prepare|attach|NRI|drain|stop|{_LOST}",
    "restart-kubelet": rf"kubelet|regist|plugin|{_LOST}",
    "restart-containerd": rf"NRI|containerd|ttrpc|runtime|{_LOST}",
    "stop-apiserver-etcd": rf"API|api ?server|HTTP|watch|slice|claim|event|Server ?Disconnected|ClientConnector|{_LOST}",
}
NAMES["reboot-node"] = "|".join(
    NAMES[k] for k in ("kill-store", "kill-attach", "restart-kubelet", "restart-containerd")
)


@dataclass
class Report:
    pods_created: int = 0
    pods_ran: int = 0
    pods_started_without_devices: int = 0
    pods_misconfigured: int = 0
    # Running before attach gave them their device, which came within ``late_grace_s``: a
    # sandbox the runtime (re)built while attach was down (NRI does not wait for a plugin that
    # is not connected); attach's recovery adds the device ("attaching it now").
    pods_attached_late: int = 0
    late_after: Counter[str] = field(default_factory=Counter)
    lost_configs: int = 0
    leaked_devices: int = 0
    leftover_links: int = 0
    stuck_terminating: int = 0
    stale_store_records: int = 0
    # Running Pods whose netns attach did not pin; pins left at the end (a netns kept alive).
    unpinned: int = 0
    # Reported Running by the API with no ready sandbox for ``late_grace_s`` (a fault took it).
    running_without_sandbox: int = 0
    leftover_pins: int = 0
    error_log_lines: int = 0
    explained_error_lines: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    start_s: list[float] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    unexplained: list[str] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)

    def p99_ms(self) -> float:
        s = sorted(self.start_s)
        return round(s[min(len(s) - 1, int(0.99 * len(s)))] * 1000, 1) if s else -1.0

    def summary(self) -> dict[str, Any]:
        return {
            "pods": self.pods_ran,
            "pods_created": self.pods_created,
            "faults": sum(self.faults.values()),
            "faults_by_kind": dict(sorted(self.faults.items())),
            "leaked_devices": self.leaked_devices,
            "lost_configs": self.lost_configs,
            "pods_started_without_devices": self.pods_started_without_devices,
            "pods_misconfigured": self.pods_misconfigured,
            "pods_attached_late": self.pods_attached_late,
            "late_after_fault": dict(sorted(self.late_after.items())),
            "stuck_terminating": self.stuck_terminating,
            "stale_store_records": self.stale_store_records,
            "unpinned": self.unpinned,
            "running_without_sandbox": self.running_without_sandbox,
            "leftover_pins": self.leftover_pins,
            "leftover_links": self.leftover_links,
            "error_log_lines": self.error_log_lines,
            "explained_error_lines": self.explained_error_lines,
            "pod_start_p99_ms_under_faults": self.p99_ms(),
        }


class LogReader:
    """Reads the driver pod's container log files (CRI format) all along: a restarted container's
    old file is removed by the kubelet later, a deleted pod's at once."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.dir = cluster.state / "pod-logs"
        self.seen: dict[Path, bytes] = {}

    def poll(self) -> None:
        for f in self.dir.glob(f"{NAMESPACE}_*/*/*.log"):
            with contextlib.suppress(OSError):
                data = f.read_bytes()
                if len(data) >= len(self.seen.get(f, b"")):
                    self.seen[f] = data

    def all_lines(self) -> list[tuple[float, str]]:
        """(unix time, record) of every JSON record read so far."""
        out = []
        for data in self.seen.values():
            for raw in data.decode(errors="replace").splitlines():
                parts = raw.split(" ", 3)
                text = parts[3] if len(parts) == 4 else raw
                with contextlib.suppress(ValueError, AttributeError):
                    out.append((_ts(json.loads(text).get("ts", "")), text))
        return sorted(out)

    def dump(self, to: Path) -> None:
        """Every log file read, as the kubelet wrote it, below ``to`` (kept after the run)."""
        for f, data in self.seen.items():
            dest = to / f.relative_to(self.dir)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)

    def errors(self) -> list[tuple[float, str]]:
        """(unix time, line) of every ERROR line or traceback."""
        out = []
        for data in self.seen.values():
            for raw in data.decode(errors="replace").splitlines():
                parts = raw.split(" ", 3)
                text = parts[3] if len(parts) == 4 else raw
                try:
                    rec = json.loads(text)
                except ValueError:
                    if "Traceback" in text:
                        out.append((0.0, text))
                    continue
                if rec.get("level") in ("ERROR", "CRITICAL") or "Traceback" in json.dumps(rec):
                    out.append((_ts(rec.get("ts", "")), text))
        return out


def _ts(ts: str) -> float:
    import datetime

    with contextlib.suppress(ValueError):
        return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return 0.0


def _said(line: str) -> str:
    """What a log record says (its message, error and exception), without the fields every
    record of a service has (its name, logger, time): "store" in ``service`` explains nothing."""
    try:
        rec = json.loads(line)
    except ValueError:
        return line
    if not isinstance(rec, dict):
        return line
    return " ".join(str(v) for k, v in rec.items() if k not in ("ts", "level", "service", "logger"))


def classify(
    errors: list[tuple[float, str]], faults: list[tuple[float, float, str]], grace_s: float
) -> tuple[list[str], list[str]]:
    """(explained, unexplained) ERROR lines: a line is explained by a fault that it names, at
    most ``grace_s`` after that fault ended (``NAMES``)."""
    explained, unexplained = [], []
    for ts, line in errors:
        said = _said(line)
        by = [
            kind
            for start, end, kind in faults
            if start - 1 <= ts <= end + grace_s and re.search(NAMES[kind], said, re.IGNORECASE)
        ]
        if by:
            explained.append(f"{by[0]}: {line[:300]}")
        else:
            unexplained.append(line)
    return explained, unexplained


class Churn:
    def __init__(
        self,
        cluster: KubeCluster,
        installed: Installed,
        kube: Kube,
        pods: int,
        nics: int = 4,
        fault_gap_s: tuple[float, float] = (4.0, 10.0),
        api_down_s: float = 30.0,
        faults: tuple[str, ...] = FAULTS,
        seed: int | None = None,
        fault_grace_s: float = 45.0,
        minutes: float | None = None,
        late_grace_s: float = 90.0,
    ) -> None:
        self.c, self.inst, self.k = cluster, installed, kube
        self.pods, self.nics_n = pods, nics
        self.fault_gap_s, self.api_down_s = fault_gap_s, api_down_s
        self.fault_kinds = faults
        self.rng = random.Random(seed)
        self.fault_grace_s = fault_grace_s
        self.late_grace_s = late_grace_s
        # A time budget: no new Pod after it (once every fault kind happened), so a long run
        # ends on time with its report instead of being killed.
        self.until = time.monotonic() + minutes * 60 if minutes else None
        self.report = Report()
        self.logs = LogReader(cluster)
        self.fault_times: list[tuple[float, float, str]] = []  # (start, end) unix time, kind
        self.nics: list[str] = []
        self.links_before: set[str] = set()
        self._next = 0
        self._done = asyncio.Event()
        self.active_fault: str | None = None
        self.late: list[tuple[str, str, str]] = []  # (pod, what was seen first, last fault)
        self.nic_losses: list[str] = []
        pins = (installed.values.get("hostPaths") or {}).get("netnsPinDir")
        self.pin_dir = Path(pins) if pins else None

    # -- API calls that ride out the API server's outage ------------------------------------------

    async def _api(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> Any:
        deadline = time.monotonic() + self.api_down_s + 90
        while True:
            try:
                return await asyncio.to_thread(self.c.api.call, method, path, body, ok)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    async def _get_pod(self, name: str) -> dict[str, Any] | None:
        obj = await self._api("GET", f"/api/v1/namespaces/{self.k.ns}/pods/{name}", ok=(200, 404))
        return None if obj.get("kind") == "Status" else dict(obj)

    # -- workers ----------------------------------------------------------------------------------------

    def _links(self) -> set[str]:
        return {x["ifname"] for x in ip_json(self.c.netns, "link", "show")}

    async def setup(self) -> None:
        for i in range(self.nics_n):
            name = f"ch{os.getpid() % 1000}{i}"
            await asyncio.to_thread(self.c.net.add_nic, name)
            self.nics.append(name)
        self.links_before = await asyncio.to_thread(self._links)
        await self.k.wait_published(*self.nics, within=60)

    async def worker(self, slot: int) -> None:
        nic = self.nics[slot]
        sel = f'device.attributes["dra.net"].ifName == "{nic}"'
        dc = await asyncio.to_thread(self.k.device_class, f"churn{slot}", sel)
        # At least ``pods`` Pods, and on until every fault kind happened once.
        while self._next < self.pods or not set(self.fault_kinds) <= set(self.report.faults):
            if (
                self.until is not None
                and time.monotonic() > self.until
                and set(self.fault_kinds) <= set(self.report.faults)
            ):
                return
            i = self._next
            self._next += 1
            await self.one(i, nic, dc, slot)

    async def _nic_home(self, nic: str, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while await asyncio.to_thread(link, self.c.netns, nic) is None:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(1.0)
        return True

    async def one(self, i: int, nic: str, dc: str, slot: int) -> None:
        name = f"churn-{i}"
        # The last Pod of this lane is gone: its NIC is home, or on its way (attach gives back
        # what a Pod stopped while it was down held once it is back).
        if not await self._nic_home(nic, 180):
            self.report.leaked_devices += 1
            said = [line[:300] for _, line in self.logs.all_lines() if nic in line][-5:]
            self.report.violations.append(f"{nic}: not back on the node before {name}; logs: {said}")
            self.nic_losses.append(nic)
            # Put a new one in its place, so the lane goes on (and the run finds more).
            await asyncio.to_thread(self.c.net.add_nic, nic)
            await self.k.wait_published(nic, within=60)
        address = f"10.{200 + slot}.{i % 250}.2/24"
        spec = self.k.claim_spec(
            dc, configs=[{"parameters": {"interface": {"name": "net1", "mtu": MTU, "addresses": [address]}}}]
        )
        ns = self.k.ns
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": spec,
        }
        await self._api(
            "POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", claim, ok=(201, 409)
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {"name": "app", "image": "local/pause:1", "imagePullPolicy": "Never",
                     "resources": {"claims": [{"name": "c0"}]}}
                ],
                "resourceClaims": [{"name": "c0", "resourceClaimName": name}],
                "terminationGracePeriodSeconds": 5,
            },
        }  # fmt: skip
        t0 = time.monotonic()
        await self._api("POST", f"/api/v1/namespaces/{ns}/pods", pod, ok=(201, 409))
        self.report.pods_created += 1
        running = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            got = await self._get_pod(name)
            if got and (got.get("status") or {}).get("phase") == "Running":
                running = got
                break
            await asyncio.sleep(0.2)
        if running is None:
            self.report.violations.append(f"{name}: not Running within 300s")
        else:
            self.report.start_s.append(time.monotonic() - t0)
            self.report.pods_ran += 1
            await self.check_running(name, running, address)
        await self._api("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", ok=(200, 202, 404))
        deadline = time.monotonic() + 300
        while await self._get_pod(name) is not None:
            if time.monotonic() > deadline:
                self.report.violations.append(f"{name}: stuck Terminating")
                self.report.stuck_terminating += 1
                break
            await asyncio.sleep(0.3)
        await self._api(
            "DELETE", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", ok=(200, 404)
        )

    async def check_running(self, name: str, pod: dict[str, Any], address: str) -> None:
        # The API may still say Running while a fault has just taken the sandbox down (a reboot
        # kills it before the kubelet notices): nothing runs there then. Check the sandbox the
        # kubelet builds next; none within the grace: nothing to check (counted, not a breach).
        # The lookup itself meets the faults too: containerd refusing CRI while it restarts,
        # the API server away; both are retried within the same grace.
        deadline = time.monotonic() + self.late_grace_s
        while True:
            try:
                netns = await self.k.pod_netns(name)
                break
            except (AssertionError, grpc.aio.AioRpcError, ClusterError, OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    self.report.running_without_sandbox += 1
                    return
                await asyncio.sleep(1.0)
        dev, addrs = await self._net1(netns)
        if dev is None or not self._configured(dev, addrs, address):
            # Only a sandbox built while attach was away may run without its device, and only
            # until attach's recovery adds it: wait for that, then it must be as asked.
            seen = "no net1" if dev is None else f"net1 mtu {dev.get('mtu')} addresses {addrs}"
            deadline = time.monotonic() + self.late_grace_s
            while time.monotonic() < deadline and (dev is None or not self._configured(dev, addrs, address)):
                await asyncio.sleep(1.0)
                try:
                    dev, addrs = await self._net1(netns)
                except Exception:  # the sandbox went (a fault): nothing runs there any more
                    return
            fault = self._last_fault()
            if dev is None:
                self.report.pods_started_without_devices += 1
                self.report.violations.append(
                    f"{name}: Running without net1 for {self.late_grace_s:.0f}s (last fault: {fault})"
                )
                return
            if not self._configured(dev, addrs, address):
                self.report.pods_misconfigured += 1
                self.report.violations.append(
                    f"{name}: net1 mtu {dev.get('mtu')} addresses {addrs}, asked {MTU} {address}"
                )
            else:
                self.report.pods_attached_late += 1
                self.report.late_after[fault] += 1
                self.late.append((name, seen, fault))
        uid = pod["metadata"]["uid"]
        if self.pin_dir is not None and not await asyncio.to_thread(self._pinned, uid):
            self.report.unpinned += 1
            self.report.violations.append(f"{name}: its netns is not pinned in {self.pin_dir}")
        for _ in range(120):  # the store may be restarting right now (a fault)
            try:
                async with StoreClient(self.inst.node_dir / "run" / "store.sock") as store:
                    listing = await store.list(pod_uid=uid)
                if not listing.devices:
                    self.report.lost_configs += 1
                    self.report.violations.append(f"{name}: running, but the store has no config for it")
                return
            except Exception:
                await asyncio.sleep(0.5)
        self.report.violations.append(f"{name}: the store did not answer for 60s")

    def _pinned(self, uid: str) -> bool:
        """attach's pin of the Pod's netns is on the host (pins.py: it outlives attach)."""
        assert self.pin_dir is not None
        return any(
            f.name.startswith(uid + "_") and f.stat().st_dev != self.pin_dir.stat().st_dev
            for f in self.pin_dir.iterdir()
        )

    async def _net1(self, netns: str) -> tuple[dict[str, Any] | None, list[str]]:
        dev = await asyncio.to_thread(link, netns, "net1")
        return dev, (await asyncio.to_thread(addresses, netns, "net1") if dev is not None else [])

    @staticmethod
    def _configured(dev: dict[str, Any], addrs: list[str], address: str) -> bool:
        return dev.get("mtu") == MTU and address in addrs

    def _last_fault(self) -> str:
        now = time.time()
        if self.active_fault is not None:
            return self.active_fault
        recent = [kind for start, end, kind in self.fault_times if start <= now <= end + self.fault_grace_s]
        return recent[-1] if recent else "none"

    # -- faults ---------------------------------------------------------------------------------------

    def _container_pid(self, svc: str) -> int | None:
        pod = self.inst.pod()
        if pod is None:
            return None
        uid = pod["metadata"]["uid"]
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                if (
                    uid.replace("-", "_") in (proc / "cgroup").read_text()
                    or uid in (proc / "cgroup").read_text()
                ):
                    if f"services.{svc}".encode() in (proc / "cmdline").read_bytes():
                        return int(proc.name)
        return None

    def inject(self, kind: str) -> None:
        if kind.startswith("kill-"):
            pid = self._container_pid(kind.removeprefix("kill-"))
            if pid is None:
                return  # not running right now (a previous fault): try again later
            os.kill(pid, signal.SIGKILL)
        elif kind == "delete-driver-pod":
            pod = self.inst.pod()
            if pod is None:
                return
            self.c.api.call(
                "DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}", ok=(200, 202, 404)
            )
        elif kind == "restart-kubelet":
            self.c.restart_kubelet()
        elif kind == "restart-containerd":
            assert self.c.containerd is not None
            self.c.containerd.restart(timeout=60)
        elif kind == "stop-apiserver-etcd":
            self.c.stop_control_plane(self.api_down_s)
        elif kind == "reboot-node":
            self.c.reboot_node()
        else:
            raise ValueError(kind)
        self.report.faults[kind] += 1

    async def injector(self) -> None:
        order = list(self.fault_kinds)
        self.rng.shuffle(order)
        if not order:
            await self._done.wait()
            return
        n = 0
        while not self._done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), self.rng.uniform(*self.fault_gap_s))
            if self._done.is_set():
                return
            kind = order[n % len(order)]
            start = time.time()
            before = self.report.faults[kind]
            self.active_fault = kind
            try:
                await asyncio.to_thread(self.inject, kind)
                if self.report.faults[kind] > before:
                    n += 1
                    # The next fault once the node recovered from this one: faults closer together
                    # only measure the kubelet's restart back-off (CrashLoopBackOff grows to 5 min).
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self.inst.wait_ready, 300)
                    self.fault_times.append((start, time.time(), kind))
            finally:
                self.active_fault = None

    async def log_poller(self) -> None:
        while not self._done.is_set():
            await asyncio.to_thread(self.logs.poll)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), 1.0)
        await asyncio.to_thread(self.logs.poll)

    # -- the run ----------------------------------------------------------------------------------------

    async def run(self) -> Report:
        await self.setup()
        poller = asyncio.create_task(self.log_poller())
        injector = asyncio.create_task(self.injector())
        try:
            await asyncio.gather(*(self.worker(s) for s in range(self.nics_n)))
        finally:
            self._done.set()
            await injector
            await poller
        await asyncio.to_thread(self.inst.wait_ready, 180)
        await self.final_checks()
        return self.report

    async def final_checks(self) -> None:
        r = self.report
        await asyncio.sleep(2)
        for nic in self.nics:
            dev = None
            for _ in range(60):
                dev = await asyncio.to_thread(link, self.c.netns, nic)
                if dev is not None:
                    break
                await asyncio.sleep(1)
            if dev is None:
                r.leaked_devices += 1
                r.violations.append(f"{nic}: not back on the node")
        extra = (await asyncio.to_thread(self._links)) - self.links_before
        # Pods' eth0 host ends (going) and containerd's CNI bridge (made with the first Pod).
        extra = {x for x in extra if not x.startswith(("veth", BRIDGE_PREFIX))}
        r.leftover_links = len(extra)
        if extra:
            r.violations.append(f"links left on the node: {sorted(extra)}")
        stale: list[str] = []
        for _ in range(60):
            async with StoreClient(self.inst.node_dir / "run" / "store.sock") as store:
                listing = await store.list()
            stale = sorted({d.pod.uid for d in listing.devices})
            if not stale:
                break
            await asyncio.sleep(1)
        r.stale_store_records = len(stale)
        if self.pin_dir is not None:
            left: list[str] = []
            for _ in range(30):
                left = sorted(f.name for f in self.pin_dir.iterdir())
                if not left:
                    break
                await asyncio.sleep(1)
            r.leftover_pins = len(left)
            if left:
                r.violations.append(f"netns pins left on the node: {left[:5]}")
        if stale:
            r.violations.append(f"store records of pods that are gone: {stale[:5]}")
        r.explained, r.unexplained = classify(self.logs.errors(), self.fault_times, self.fault_grace_s)
        r.explained_error_lines, r.error_log_lines = len(r.explained), len(r.unexplained)

    async def cleanup(self) -> None:
        for nic in self.nics:
            await asyncio.to_thread(
                subprocess.run, ["ip", "-n", self.c.netns, "link", "del", nic], capture_output=True
            )
