"""Shared pieces of the benchmarks that run on the real cluster (``dev.cluster.kube``):

- ``bench_cluster(...)``: a KubeCluster with veth NICs in the node namespace, dranet's four
  services beside it (``dev.cluster.driver.Driver``), a namespace and a DeviceClass; everything
  stopped again (Pods first, while attach still runs) however the body ends.
- ``KeepAlive``: JSON over one persistent HTTPS connection (the harness's ``Rest`` opens one per
  call, so a TLS handshake would land in every timed request).
- ``PodWatch``: one watch on the namespace's Pods in a thread; the first time each Pod was seen
  scheduled, Running and deleted, as ``time.perf_counter()`` of this process (sub-millisecond,
  unlike the Pod's conditions, which have 1 s resolution).
- ``KubeletMetrics``: the kubelet's ``/metrics`` (HTTPS, the admin client certificate), parsed
  into histogram sums and counts, so deltas between two scrapes isolate one operation.
"""

from __future__ import annotations

import abc
import contextlib
import http.client
import json
import re
import secrets
import shutil
import ssl
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.driver import Driver
from dev.cluster.kube import KubeCluster
from tests.support.kube import Kube


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pct(samples: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of samples in seconds, in ms."""
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3) if s else -1.0


def p50(samples: Sequence[float]) -> float:
    return round(statistics.median(samples) * 1000, 3) if samples else -1.0


# ----------------------------------------------------------------------------------------------
# HTTPS to the API server and the kubelet


def _context(cluster: KubeCluster, kubelet: bool = False) -> ssl.SSLContext:
    """The admin client certificate; the server verified against the cluster CA, or for the
    kubelet against its own self-signed serving certificate (no tlsCertFile is configured)."""
    if kubelet:
        # The kubelet serves a certificate chain it made itself at start (no tlsCertFile is
        # configured), under its --cert-dir, which the harness leaves at the shared default:
        # nothing to verify it against. The link is host-local; only the client side matters.
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_crt))
    ctx.load_cert_chain(str(cluster.pki.dir / "admin.crt"), str(cluster.pki.dir / "admin.key"))
    return ctx


class KeepAlive:
    """Blocking JSON calls over one kept-alive HTTPS connection, as admin."""

    def __init__(self, cluster: KubeCluster, kubelet: bool = False) -> None:
        self.host = cluster.net.node_ip if kubelet else cluster.net.host_ip
        self.port = cluster.kubelet_port if kubelet else cluster.api_port
        self.ctx = _context(cluster, kubelet)
        self.conn: http.client.HTTPSConnection | None = None
        self.lock = threading.Lock()

    def raw(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201)) -> bytes:
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        with self.lock:
            for attempt in (0, 1):
                if self.conn is None:
                    self.conn = http.client.HTTPSConnection(
                        self.host, self.port, context=self.ctx, timeout=30
                    )
                try:
                    self.conn.request(method, path, body=data, headers={"Content-Type": ctype})
                    resp = self.conn.getresponse()
                    raw = resp.read()
                    break
                except (OSError, http.client.HTTPException):
                    self.conn.close()
                    self.conn = None
                    if attempt:
                        raise
        if resp.status not in ok:
            raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {raw[:500].decode(errors='replace')}")
        return raw

    def call(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201)) -> Any:
        return json.loads(self.raw(method, path, body, ok))

    def close(self) -> None:
        with self.lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


# ----------------------------------------------------------------------------------------------
# The kubelet's metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class KubeletMetrics:
    """Scrapes ``https://<host_ip>:<kubelet_port>/metrics``; ``scrape()`` returns
    {(name, frozenset(labels)): value} for the metric families asked for."""

    def __init__(self, cluster: KubeCluster, families: Sequence[str]) -> None:
        self.client = KeepAlive(cluster, kubelet=True)
        self.families = tuple(families)

    def scrape(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = self.client.raw("GET", "/metrics").decode()
        out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for line in text.splitlines():
            if not line.startswith(self.families):
                continue
            m = _SAMPLE.match(line)
            if m:
                labels = frozenset(_LABEL.findall(m.group(2) or ""))
                out[(m.group(1), labels)] = float(m.group(3))
        return out

    @staticmethod
    def total(scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **want: str) -> float:
        """The sum over every series of ``name`` whose labels include ``want``; a wanted value
        also matches as the last path element (the kubelet labels gRPC methods by their full
        name, ``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources``)."""

        def matches(labels: frozenset[tuple[str, str]]) -> bool:
            have = dict(labels)
            return all(k in have and (have[k] == v or have[k].endswith("/" + v)) for k, v in want.items())

        return sum(v for (n, labels), v in scrape.items() if n == name and matches(labels))

    def close(self) -> None:
        self.client.close()


@dataclass
class HistogramDelta:
    """One histogram's _sum and _count between two scrapes (one series filter)."""

    name: str
    labels: dict[str, str]

    def of(self, before: dict[Any, float], after: dict[Any, float]) -> tuple[int, float]:
        count = KubeletMetrics.total(after, f"{self.name}_count", **self.labels) - KubeletMetrics.total(
            before, f"{self.name}_count", **self.labels
        )
        total = KubeletMetrics.total(after, f"{self.name}_sum", **self.labels) - KubeletMetrics.total(
            before, f"{self.name}_sum", **self.labels
        )
        return round(count), total


# ----------------------------------------------------------------------------------------------
# Watching Pods


@dataclass
class PodTimes:
    scheduled: float | None = None
    running: float | None = None
    deleted: float | None = None
    events: threading.Event = field(default_factory=threading.Event)


class Watch(abc.ABC):
    """One watch on the API server, read in a thread of its own: each event goes to
    ``on_event(event, perf_counter time)`` under ``cond``, which is then notified; a watch
    that ends or fails surfaces as ``error`` in the waits of the subclass."""

    what = "watch"

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster
        self.cond = threading.Condition()
        self.stopping = False
        self.error: BaseException | None = None
        self.conn: http.client.HTTPSConnection | None = None
        self.thread = threading.Thread(target=self._run, name=self.what.replace(" ", "-"), daemon=True)

    def open(self, path: str, rv: str) -> None:
        """Watch ``path`` (a collection, maybe with a selector) from resourceVersion ``rv``."""
        self.conn = http.client.HTTPSConnection(
            self.cluster.net.host_ip, self.cluster.api_port, context=_context(self.cluster), timeout=None
        )
        sep = "&" if "?" in path else "?"
        self.conn.request("GET", f"{path}{sep}watch=1&resourceVersion={rv}&timeoutSeconds=7200")
        self.resp = self.conn.getresponse()
        if self.resp.status != 200:
            raise RuntimeError(f"{self.what}: HTTP {self.resp.status}: {self.resp.read()[:300]!r}")
        self.thread.start()

    @abc.abstractmethod
    def on_event(self, ev: dict[str, Any], now: float) -> None:
        """What one event (a decoded watch line, not ERROR) means to this kind of watch."""

    def _run(self) -> None:
        try:
            while not self.stopping:
                line = self.resp.readline()
                if not line:
                    if not self.stopping:
                        raise RuntimeError(f"the {self.what} ended")
                    return
                now = time.perf_counter()
                ev = json.loads(line)
                if ev.get("type") == "ERROR":
                    raise RuntimeError(f"the {self.what} failed: {ev.get('object')}")
                with self.cond:
                    self.on_event(ev, now)
                    self.cond.notify_all()
        except BaseException as exc:  # surfaced by the waits
            if not self.stopping:
                with self.cond:
                    self.error = exc
                    self.cond.notify_all()

    def check(self) -> None:
        """Under ``cond``: raise the watch's failure, if any."""
        if self.error is not None:
            raise RuntimeError(f"{self.what}: {self.error}")

    def stop(self) -> None:
        self.stopping = True
        if self.conn is not None:
            with contextlib.suppress(Exception):
                if self.conn.sock is not None:
                    self.conn.sock.shutdown(2)
            with contextlib.suppress(Exception):
                self.conn.close()
        self.thread.join(5)


class PodWatch(Watch):
    """A watch on the Pods of one namespace: the first time each was seen scheduled, Running
    and deleted."""

    what = "Pod watch"

    def __init__(self, cluster: KubeCluster, ns: str) -> None:
        super().__init__(cluster)
        self.ns = ns
        self.pods: dict[str, PodTimes] = {}

    def start(self) -> PodWatch:
        path = f"/api/v1/namespaces/{self.ns}/pods"
        self.open(path, self.cluster.api.get(path)["metadata"]["resourceVersion"])
        return self

    def on_event(self, ev: dict[str, Any], now: float) -> None:
        obj = ev.get("object") or {}
        name = obj.get("metadata", {}).get("name")
        if not name:
            return
        t = self.pods.setdefault(name, PodTimes())
        if t.scheduled is None and obj.get("spec", {}).get("nodeName"):
            t.scheduled = now
        if t.running is None and (obj.get("status") or {}).get("phase") == "Running":
            t.running = now
        if t.deleted is None and ev.get("type") == "DELETED":
            t.deleted = now

    def wait(self, name: str, what: str, within: float = 90.0) -> float:
        """The perf_counter time at which Pod ``name`` was first seen ``what`` (scheduled,
        running, deleted)."""
        deadline = time.monotonic() + within
        with self.cond:
            while True:
                self.check()
                got = getattr(self.pods.get(name, PodTimes()), what)
                if got is not None:
                    return float(got)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"pod {self.ns}/{name} not {what} within {within:.0f}s")
                self.cond.wait(min(left, 1.0))


# ----------------------------------------------------------------------------------------------
# One cluster with the driver


def claim_body(
    name: str, device_class: str, config: dict[str, Any] | None, selector: str | None = None
) -> dict[str, Any]:
    """A ResourceClaim for one device of ``device_class``, with ``config`` as its opaque parameters."""
    configs = [{"parameters": config}] if config is not None else []
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": Kube.claim_spec(device_class, selector, configs),
    }


def pod_body(name: str, claims: Sequence[str] = ()) -> dict[str, Any]:
    """A pause Pod using the named claims, quick to stop (2 s grace, no token, no links)."""
    refs = [{"name": f"c{i}", "resourceClaimName": c} for i, c in enumerate(claims)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "local/pause:1",
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": r["name"]} for r in refs]} if refs else {},
                }
            ],
            "resourceClaims": refs,
            "terminationGracePeriodSeconds": 2,
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
        },
    }


def wait_nics_home(cluster: KubeCluster, nics: Sequence[str], within: float = 60.0) -> None:
    """Until every NIC of ``nics`` is back in the node's namespace (the driver gave it back)."""
    deadline = time.monotonic() + within
    while missing := [n for n in nics if not cluster.net.has_link(n)]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"NICs {missing[:3]} not back in the node namespace")
        time.sleep(0.05)


@dataclass
class Bench:
    cluster: KubeCluster
    driver: Driver
    kube: Kube
    device_class: str
    nics: list[str]
    api: KeepAlive

    @property
    def ns(self) -> str:
        return self.kube.ns

    def claim_body(
        self, name: str, config: dict[str, Any] | None, selector: str | None = None
    ) -> dict[str, Any]:
        return claim_body(name, self.device_class, config, selector)

    def create_claim(self, name: str, config: dict[str, Any] | None, selector: str | None = None) -> None:
        self.api.call(
            "POST",
            f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims",
            self.claim_body(name, config, selector),
        )

    def pod_body(self, name: str, claims: Sequence[str] = ()) -> dict[str, Any]:
        return pod_body(name, claims)

    def create_pod(self, name: str, claims: Sequence[str] = ()) -> tuple[float, int, str]:
        """POST the Pod; the perf_counter time and the wall clock (ns, to compare with CRI's
        timestamps) just before the request went out, and the Pod's UID."""
        body = self.pod_body(name, claims)
        wall, t = time.time_ns(), time.perf_counter()
        obj = self.api.call("POST", f"/api/v1/namespaces/{self.ns}/pods", body)
        return t, wall, str(obj["metadata"]["uid"])

    def delete_pod(self, name: str) -> None:
        self.api.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}", ok=(200, 202, 404))

    def delete_claim(self, name: str) -> None:
        self.api.call(
            "DELETE",
            f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims/{name}",
            ok=(200, 202, 404),
        )

    def claim_gone(self, name: str) -> bool:
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.ns}/resourceclaims/{name}"
        return json.loads(self.api.raw("GET", path, ok=(200, 404))).get("kind") == "Status"

    def wait_claims_gone(self, names: Sequence[str], within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        pending = list(names)
        while pending:
            pending = [n for n in pending if not self.claim_gone(n)]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"claims {pending[:3]} not gone within {within:.0f}s")
            time.sleep(0.05)

    def wait_nics_home(self, within: float = 60.0) -> None:
        wait_nics_home(self.cluster, self.nics, within)


@contextlib.contextmanager
def bench_cluster(
    nics: int,
    node_name: str = "bench-node",
    nic_addresses: bool = True,
    prepare_args: Sequence[str] = (),
    attach_args: Sequence[str] = (),
    log_level: str = "DEBUG",
) -> Iterator[Bench]:
    """A started cluster with ``nics`` veth NICs (``bnNN``) published, the driver and a
    namespace; stopped (Pods first) however the body ends."""
    t0 = time.monotonic()
    cluster = KubeCluster(node_name=node_name)
    driver: Driver | None = None
    api: KeepAlive | None = None
    ok = False
    try:
        say(f"starting Kubernetes {cluster.kube_version} in {cluster.state}")
        cluster.start()
        say(f"node Ready ({time.monotonic() - t0:.1f}s)")
        names = [f"bn{i:02d}" for i in range(nics)]
        for i, name in enumerate(names):
            cluster.net.add_nic(
                name, addresses=[f"10.{200 + i // 250}.{i % 250}.5/24"] if nic_addresses else []
            )
        driver = Driver(
            cluster,
            prepare_args=prepare_args,
            attach_args=attach_args,
            log_level=log_level,
            workdir=cluster.state / "driver",
        ).start()
        kube = Kube(cluster, f"bench-{secrets.token_hex(2)}")
        kube.create_namespace()
        selector = (
            'has(device.attributes["dra.net"].ifName) && device.attributes["dra.net"].ifName.startsWith("bn")'
        )
        dc = kube.device_class("nic", selector)

        def published() -> bool:
            return set(names) <= set(kube.published())

        deadline = time.monotonic() + 60
        while not published():
            if time.monotonic() > deadline:
                raise TimeoutError(f"NICs not published within 60s:\n{driver.logs()}")
            time.sleep(0.2)
        # The kubelet registers the plugin a moment after its socket is up; a Pod sooner fails
        # its prepare ("driver dra.net is not registered") and is retried only after a backoff.
        kubelet_log = cluster.procs["kubelet"].log_path
        registered = 'driverName="dra.net"'
        while not any(
            registered in line and "connected=true" in line
            for line in kubelet_log.read_text(errors="replace").splitlines()
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("the kubelet did not register the dra.net plugin within 60s")
            time.sleep(0.1)
        say(f"driver running and registered, {nics} NICs published ({time.monotonic() - t0:.1f}s)")
        api = KeepAlive(cluster)
        yield Bench(cluster, driver, kube, dc, names, api)
        ok = True
    except BaseException:
        if driver is not None:
            print(driver.logs(3000), file=sys.stderr)
        raise
    finally:
        t1 = time.monotonic()
        if api is not None:
            api.close()
        with contextlib.suppress(Exception):
            cluster.delete_pods()
        if driver is not None:
            driver.stop()
        cluster.stop()
        mounted = [
            m for m in Path("/proc/self/mountinfo").read_text().split() if m.startswith(str(cluster.state))
        ]
        if ok and not mounted:
            shutil.rmtree(cluster.state, ignore_errors=True)
            say(f"cluster stopped and removed ({time.monotonic() - t1:.1f}s)")
        else:
            say(f"cluster stopped ({time.monotonic() - t1:.1f}s); its logs stay in {cluster.logs}")
