"""Helpers the inventory integration tests and tests/bench/inventory.py share: links in a
namespace, one node's ResourceSlices on a real cluster (``dev.cluster.kube.KubeCluster``) read
and their writes counted through the real API server, restarting that server, polling."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from dev.cluster.kube import ClusterError, KubeCluster
from dev.cluster.procs import ServiceProcess
from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc

# start_inventory(ns, *flags, publish=False, node="node-a") -> the started process (conftest).
StartInventory = Callable[..., ServiceProcess]

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# Marker slices (see SliceWatch.settle) carry this driver: the inventory's own list and watch
# select spec.driver=dra.net, so it never sees them, and they are never counted as writes.
SETTLE_DRIVER = "settle.test.dra.net"


def ip(ns: str, *args: str) -> None:
    """``ip -n ns ARGS``, failing the test with ip's message."""
    res = subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"ip -n {ns} {' '.join(args)}: {res.stderr.strip()}")


class Http:
    """JSON to the API server as admin over one kept-alive HTTPS connection (blocking; one
    thread per instance). The harness's ``KubeCluster.api`` opens a TLS connection per call,
    too costly for tests that poll."""

    def __init__(self, kube: KubeCluster, timeout: float = 30.0) -> None:
        rest = kube.api
        self.host, self.port, self.ctx = rest.host, rest.port, rest.ctx
        self.timeout = timeout
        self.conn: http.client.HTTPSConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def call(self, method: str, path: str, body: Any = None, ok: Sequence[int] = (200, 201)) -> Any:
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        for attempt in (0, 1):
            reused = self.conn is not None
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(
                    self.host, self.port, context=self.ctx, timeout=self.timeout
                )
            try:
                self.conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                raw = resp.read()
                break
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt or not reused:  # only a stale kept-alive connection is retried
                    raise
        if resp.status not in ok:
            raise ClusterError(f"{method} {path}: HTTP {resp.status}: {raw[:500].decode(errors='replace')}")
        return json.loads(raw) if raw else {}

    def get(self, path: str) -> Any:
        return self.call("GET", path)


def slices_path(node: str, **params: str) -> str:
    return f"{SLICES}?" + urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}", **params})


class SliceWatch:
    """Counts the writes to one node's ResourceSlices with a real watch, in a thread: every
    ADDED, MODIFIED or DELETED event is one write (marker slices excepted).

    ``start()`` lists the node's slices and watches from that list's resourceVersion, so every
    write after ``start()`` returns is seen. When the watch breaks (the API server restarts) it
    resumes from the last version seen; if that version is gone (410, the normal case after a
    restart: the new server's watch cache begins at its start) it lists again and counts the
    difference to what it knew (a new slice: 1 + its generation - 1, a changed one: its
    generation delta, at least 1, a vanished one: 1) and ``relists`` goes up. Only a slice
    created and deleted while no watch ran would go uncounted.
    """

    def __init__(self, kube: KubeCluster, node: str) -> None:
        self.kube, self.node = kube, node
        self.writes = 0
        self.relists = 0
        self.events: list[tuple[str, str, str]] = []  # (type, name, resourceVersion), for messages
        self._cond = threading.Condition()
        self._known: dict[str, tuple[str, int]] = {}  # name -> (resourceVersion, generation)
        self._objects: dict[str, dict[str, Any]] = {}  # name -> the slice as last seen
        self._markers: set[str] = set()  # marker slices whose DELETED event was seen
        self._rv = ""
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._conn: http.client.HTTPSConnection | None = None
        self._http = Http(kube)
        self._thread = threading.Thread(target=self._run, name=f"slice-watch-{node}", daemon=True)
        self.last_error = ""

    # -- life cycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        page = self._http.get(slices_path(self.node))
        self._objects = {o["metadata"]["name"]: o for o in page.get("items") or [] if not _is_marker(o)}
        self._known = {name: _version(o) for name, o in self._objects.items()}
        self._rv = str(page["metadata"]["resourceVersion"])
        self._thread.start()
        if not self._connected.wait(timeout):
            self.stop()
            raise AssertionError(f"the slice watch of {self.node} did not connect: {self.last_error}")

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(15)
        self._http.close()

    # -- the thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                if self._watch_once():
                    delay = 0.2
                    continue
            except Exception as exc:  # the server went away mid-stream, or is not up yet
                self.last_error = repr(exc)
            finally:
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.close()
            self._stop.wait(delay)
            delay = min(delay * 2, 2.0)

    def _watch_once(self) -> bool:
        """One watch request until the server ends it; True when it ended cleanly."""
        conn = http.client.HTTPSConnection(
            self._http.host, self._http.port, context=self._http.ctx, timeout=180
        )
        self._conn = conn
        path = slices_path(
            self.node,
            watch="1",
            resourceVersion=self._rv,
            allowWatchBookmarks="true",
            timeoutSeconds="120",
        )
        conn.request("GET", path)
        resp = conn.getresponse()
        if resp.status == 410:
            resp.read()
            self._relist()
            return True
        if resp.status != 200:
            self.last_error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return False
        self._connected.set()
        while not self._stop.is_set():
            line = resp.readline()
            if not line:
                return True  # timeoutSeconds: resume from the last version
            ev = json.loads(line)
            kind, obj = ev["type"], ev["object"]
            if kind == "ERROR":
                if obj.get("code") == 410:  # "too old resource version"
                    self._relist()
                    return True
                self.last_error = f"watch error: {obj}"
                return False
            self._event(kind, obj)
        return True

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion") or self._rv)
        with self._cond:
            self._rv = rv
            if kind == "BOOKMARK":
                return
            name = str(meta.get("name", ""))
            if _is_marker(obj):
                if kind == "DELETED":
                    self._markers.add(name)
                    self._cond.notify_all()
                return
            self.writes += 1
            self.events.append((kind, name, rv))
            if kind == "DELETED":
                self._known.pop(name, None)
                self._objects.pop(name, None)
            else:
                self._known[name] = _version(obj)
                self._objects[name] = obj
            self._cond.notify_all()

    def _relist(self) -> None:
        page = self._http.get(slices_path(self.node))
        objects = {o["metadata"]["name"]: o for o in page.get("items") or [] if not _is_marker(o)}
        now = {name: _version(o) for name, o in objects.items()}
        with self._cond:
            missed = 0
            for name, (rv, gen) in now.items():
                old = self._known.get(name)
                if old is None:
                    missed += max(gen, 1)
                elif old[0] != rv:
                    missed += max(gen - old[1], 1)
            missed += sum(1 for name in self._known if name not in now)
            self.writes += missed
            self.events.append(("RELIST", f"{missed} missed", str(page["metadata"]["resourceVersion"])))
            self._known = now
            self._objects = objects
            self._rv = str(page["metadata"]["resourceVersion"])
            self.relists += 1
            self._cond.notify_all()

    def devices(self) -> dict[str, dict[str, Any]]:
        """Device name -> device dict over the slices as the watch last saw them (no API call:
        for waits that must not load the API server, as the benchmark's)."""
        with self._cond:
            return {d["name"]: d for o in self._objects.values() for d in o["spec"].get("devices", [])}

    # -- catching up ------------------------------------------------------------------------------

    def settle(self, timeout: float = 60.0) -> int:
        """The writes counted once the watch has caught up with the API server as of this call:
        a marker slice of the node is created and deleted, and its DELETED event awaited (events
        arrive in resourceVersion order, so every earlier write has been seen by then)."""
        deadline = time.monotonic() + timeout
        while True:
            marker = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"generateName": f"settle-{self.node}-"},
                "spec": {
                    "driver": SETTLE_DRIVER,
                    "nodeName": self.node,
                    "pool": {"name": "settle", "generation": 1, "resourceSliceCount": 1},
                },
            }
            name = self._http.call("POST", SLICES, marker)["metadata"]["name"]
            self._http.call("DELETE", f"{SLICES}/{name}", ok=(200, 202, 404))
            with self._cond:
                # A relist in between would swallow the marker's events: try a fresh one then.
                if self._cond.wait_for(
                    lambda n=name: n in self._markers, min(10.0, max(deadline - time.monotonic(), 0.1))
                ):
                    self._markers.discard(name)
                    return self.writes
            if time.monotonic() > deadline:
                raise AssertionError(f"the slice watch of {self.node} did not catch up: {self.last_error}")


def _is_marker(obj: dict[str, Any]) -> bool:
    return (obj.get("spec") or {}).get("driver") == SETTLE_DRIVER


def _version(obj: dict[str, Any]) -> tuple[str, int]:
    meta = obj.get("metadata") or {}
    return str(meta.get("resourceVersion", "")), int(meta.get("generation") or 0)


# ---------------------------------------------------------------------------------------------
# The API server's life cycle on a shared cluster


def stop_api_server(kube: KubeCluster) -> None:
    """SIGTERM the cluster's kube-apiserver and wait for it to exit (etcd keeps the state)."""
    kube.procs["kube-apiserver"].stop()


def start_api_server(kube: KubeCluster, timeout: float = 180.0) -> None:
    """Start the kube-apiserver again with the argv it had (same address, port, etcd) if it is
    not running, and wait until it is ready and the rest of the cluster is back: the other
    components alive and the cluster's own node Ready again."""
    proc = kube.procs["kube-apiserver"]
    if not proc.alive():
        proc.start()
        kube.started_at["kube-apiserver"] = time.monotonic()
    deadline = time.monotonic() + timeout
    kube.wait_apiserver_ready(timeout)
    for name in ("etcd", "kube-controller-manager", "kube-scheduler", "kubelet"):
        kube.procs[name].check()
    kube.wait_node_ready(max(deadline - time.monotonic(), 30.0))


# ---------------------------------------------------------------------------------------------
# One node of the cluster, as an inventory test sees it


class Cluster:
    """A Node ``node`` on a real cluster, its ResourceSlices read through the real API server
    and every write to them counted by a watch (``SliceWatch``).

    ``kubeconfig`` is the inventory's identity (a ServiceAccount bound to the chart's
    ClusterRole); ``client`` is a kubernetes-asyncio ApiClient as admin, for the tests' own
    writes ("someone else"); ``http`` reads as admin.
    """

    def __init__(self, kube: KubeCluster, node: str, kubeconfig: str | Path) -> None:
        self.kube = kube
        self.node = node
        self.kubeconfig = str(kubeconfig)
        self.http = Http(kube)
        self.watch = SliceWatch(kube, node)
        self.client: Any = None
        self.node_uid = ""

    async def start(self) -> None:
        """Create the Node, start the watch (before any inventory runs), open the client."""

        def setup() -> None:
            node = self.http.call(
                "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node}}
            )
            self.node_uid = node["metadata"]["uid"]
            self.watch.start()

        await asyncio.to_thread(setup)
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(self.kube.kubeconfig), client_configuration=cfg)
        self.client = client.ApiClient(configuration=cfg)

    async def close(self) -> None:
        """Leave the shared cluster as found: its API server running, the node's slices and the
        Node gone."""
        if self.client is not None:
            await self.client.close()
            self.client = None
        self.watch.stop()

        def cleanup() -> None:
            start_api_server(self.kube)
            self.http.call("DELETE", slices_path(self.node), ok=(200, 202))
            self.http.call("DELETE", f"/api/v1/nodes/{self.node}", ok=(200, 202, 404))
            deadline = time.monotonic() + 60
            while self.slices(include_markers=True):
                if time.monotonic() > deadline:
                    raise AssertionError(f"slices of {self.node} left behind")
                time.sleep(0.2)
            self.http.close()

        await asyncio.to_thread(cleanup)

    # -- the API server ----------------------------------------------------------------------------

    async def stop_api_server(self) -> None:
        await asyncio.to_thread(stop_api_server, self.kube)

    async def start_api_server(self) -> None:
        await asyncio.to_thread(start_api_server, self.kube)

    # -- what the API server holds ------------------------------------------------------------------

    def slices(self, include_markers: bool = False) -> list[dict[str, Any]]:
        """The node's ResourceSlices as the API server lists them (with apiVersion and kind,
        which a list's items leave out)."""
        page = self.http.get(slices_path(self.node))
        return [
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **o}
            for o in page.get("items") or []
            if include_markers or not _is_marker(o)
        ]

    def published(self) -> dict[str, dict[str, Any]]:
        """Device name -> device dict over every slice."""
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices", [])}

    @property
    def slice_writes(self) -> int:
        """Writes to the node's slices so far, including every one the API server has accepted
        before this read (the watch is caught up first: a blocking round trip)."""
        return self.watch.settle()


async def wait_devices(
    stub: inventory_pb2_grpc.InventoryStub,
    pred: Callable[[dict[str, pb.Device]], bool],
    within: float = 30.0,
) -> dict[str, pb.Device]:
    """Poll ListDevices until ``pred`` holds for the devices by name."""
    deadline = time.monotonic() + within
    devices: dict[str, pb.Device] = {}
    while time.monotonic() < deadline:
        resp = await stub.ListDevices(pb.ListDevicesRequest())
        devices = {d.name: d for d in resp.devices}
        if pred(devices):
            return devices
        await asyncio.sleep(0.1)
    raise AssertionError(f"devices never matched; last seen: {sorted(devices)}")


def values(device: pb.Device) -> dict[str, object]:
    """A device's attributes as plain values."""
    out: dict[str, object] = {}
    for k, a in device.attributes.items():
        out[k] = getattr(a, a.WhichOneof("value"))
    return out


async def wait_for(pred: Callable[[], bool], within: float = 30.0, what: str = "condition") -> float:
    """Poll ``pred`` until true; the seconds it took. AssertionError after ``within``."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        if pred():
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not reached within {within}s")
