"""Netlink cost of one attach + return: the attach engine against the same netlink
operations done directly with plain pyroute2 calls in one thread.

One veth "NIC" with two addresses and two routes goes into a pod netns and back,
``iterations`` times each way. The engine runs through its async API (a fresh
thread per call, sockets opened per call, altname tag, the checks it makes). The
direct path keeps one host IPRoute open for the whole run (its best case), opens the
pod socket once per cycle the fast way (a thread that setns()s, handed to
IPRoute(use_socket=)), and does: get link, move+rename, get link in the pod, two
addresses, up, two routes; then get link, move back+rename, up.

Also measured: opening a netlink socket in a netns with pyroute2's own netns= (it
forks), with the thread+setns way for pyroute2, and the engine's raw socket.

Importable (``run(...)`` returns the figures; the attach benchmark calls it) and
runnable as root: .venv/bin/python tests/bench/attach_netlink.py [--iterations N]
The last line is one JSON object: engine_p50_ms, direct_p50_ms, ratio, and more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proto.dranet.store.v1 import store_pb2
from services.attach.netdev import NetdevEngine
from services.attach.netdev_nl import NlSocket
from shared.netns import open_netns, setns

T = TypeVar("T")


@dataclass(frozen=True)
class BenchNic:
    host: str
    pod_ns: str
    peer_ns: str
    net: int

    @property
    def pod_path(self) -> str:
        return f"/var/run/netns/{self.pod_ns}"

    def addresses(self) -> list[str]:
        return [f"198.18.{self.net}.5/24", f"fd00:db:{self.net:x}::5/64"]

    def routes(self) -> list[dict[str, Any]]:
        gw = f"198.18.{self.net}.1"
        return [
            {"destination": f"198.19.{self.net}.0/24", "gateway": gw},
            {"destination": "203.0.113.0/24", "gateway": gw, "table": 100},
        ]

    def config(self) -> store_pb2.DeviceConfig:
        pod = {"interface": {"name": "net1", "addresses": self.addresses()}, "routes": self.routes()}
        return store_pb2.DeviceConfig(
            device=f"nic-{self.host}",
            pod=store_pb2.PodRef(uid="bench", namespace="bench", name="bench"),
            host_ifname=self.host,
            pod_config_json=json.dumps(pod),
        )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def bench_nic() -> Iterator[BenchNic]:
    """A veth "NIC" on the host (its peer, the gateway, in a peer netns) and a pod netns."""
    sfx = uuid.uuid4().hex[:5]
    nic = BenchNic(
        host=f"db{sfx}h", pod_ns=f"db{sfx}pod", peer_ns=f"db{sfx}peer", net=200 + int(sfx, 16) % 50
    )
    try:
        _ip("netns", "add", nic.pod_ns)
        _ip("netns", "add", nic.peer_ns)
        _ip("link", "add", nic.host, "type", "veth", "peer", "name", f"db{sfx}p")
        _ip("link", "set", f"db{sfx}p", "netns", nic.peer_ns, "name", "gw0")
        _ip("-n", nic.peer_ns, "addr", "add", f"198.18.{nic.net}.1/24", "dev", "gw0")
        _ip("-n", nic.peer_ns, "link", "set", "gw0", "up")
        _ip("link", "set", nic.host, "up")
        yield nic
    finally:
        for ns in (nic.pod_ns, nic.peer_ns):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", nic.host], capture_output=True)


def _in_thread(fn: Callable[[], T]) -> T:
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["v"] = fn()
        except BaseException as exc:
            box["e"] = exc

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]  # type: ignore[no-any-return]


def setns_socket(fd: int) -> socket.socket:
    """A NETLINK_ROUTE socket made in the netns ``fd`` by a short-lived thread."""

    def make() -> socket.socket:
        setns(fd)
        return socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 0)

    return _in_thread(make)


# --- the direct path ---------------------------------------------------------------------


def configure_net1(ns: Any, nic: BenchNic) -> int:
    """Give the pod's net1 (``ns`` is an IPRoute in the pod) the NIC's addresses and
    routes and bring it up; its ifindex."""
    (pod_link,) = ns.link("get", ifname="net1")
    idx: int = pod_link["index"]
    for cidr in nic.addresses():
        addr, plen = cidr.split("/")
        ns.addr("add", index=idx, address=addr, prefixlen=int(plen))
    ns.link("set", index=idx, state="up")
    for r in nic.routes():
        ns.route("add", dst=r["destination"], gateway=r["gateway"], oif=idx, table=r.get("table", 254))
    return idx


def direct_cycle(ipr: Any, nic: BenchNic, pod_fd: int, host_fd: int) -> None:
    """Attach and return with plain pyroute2 calls (sync IPRoute), in this thread."""
    from pyroute2 import IPRoute

    (host_link,) = ipr.link("get", ifname=nic.host)
    ipr.link("set", index=host_link["index"], net_ns_fd=pod_fd, ifname="net1")
    with IPRoute(use_socket=setns_socket(pod_fd)) as ns:
        configure_net1(ns, nic)
        # Return (StopPodSandbox).
        (pod_link,) = ns.link("get", ifname="net1")
        ns.link("set", index=pod_link["index"], net_ns_fd=host_fd, ifname=nic.host)
    ipr.link("set", ifname=nic.host, state="up")


# --- the engine path -----------------------------------------------------------------------


async def engine_cycle(engine: NetdevEngine, cfg: store_pb2.DeviceConfig, netns: str) -> tuple[float, float]:
    """Attach then return through the engine's async API; (attach, return) seconds."""
    t = time.perf_counter()
    out = await engine.attach_outcome(cfg, netns)
    if not out.ok:
        raise RuntimeError(out.error)
    attached = time.perf_counter()
    back = await engine.detach_outcome(cfg, netns)
    if not back.ok:
        raise RuntimeError(back.error)
    return attached - t, time.perf_counter() - attached


# --- opening a socket in a netns -------------------------------------------------------------


def measure_opens(netns: str, n: int = 20) -> dict[str, float]:
    """p50 ms to open (and close) a netlink socket in ``netns`` three ways."""
    from pyroute2 import IPRoute

    fd = open_netns(netns)
    try:

        def fork() -> None:
            IPRoute(netns=netns, flags=0).close()  # flags=0: never create the netns

        def setns_pyroute2() -> None:
            IPRoute(use_socket=setns_socket(fd)).close()

        def setns_raw() -> None:
            def make() -> NlSocket:
                setns(fd)
                return NlSocket()

            _in_thread(make).close()

        out = {}
        for name, fn in (("fork", fork), ("setns_pyroute2", setns_pyroute2), ("setns_raw", setns_raw)):
            samples = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t)
            out[f"open_{name}_ms"] = round(statistics.median(samples) * 1000, 3)
        return out
    finally:
        os.close(fd)


# --- run ---------------------------------------------------------------------------------------


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)


async def run(iterations: int = 30, warmup: int = 3, opens: bool = True) -> dict[str, Any]:
    """Time ``iterations`` attach+return cycles each way, interleaved; the figures."""
    from pyroute2 import IPRoute

    loop = asyncio.get_running_loop()
    # All direct (sync pyroute2) work in one thread: a sync IPRoute runs its own event
    # loop and cannot be made or used on a running one.
    direct = ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct")
    engine_s: list[float] = []
    attach_s: list[float] = []
    return_s: list[float] = []
    direct_s: list[float] = []
    with bench_nic() as nic:
        cfg = nic.config()
        engine = NetdevEngine()
        pod_fd = open_netns(nic.pod_path)
        host_fd = open_netns("/proc/self/ns/net")
        ipr = await loop.run_in_executor(direct, IPRoute)
        try:
            for i in range(warmup + iterations):
                a, r = await engine_cycle(engine, cfg, nic.pod_path)
                # Timed inside its thread: the hop into it is not counted.
                d = await loop.run_in_executor(direct, _timed, direct_cycle, ipr, nic, pod_fd, host_fd)
                if i >= warmup:
                    engine_s.append(a + r)
                    attach_s.append(a)
                    return_s.append(r)
                    direct_s.append(d)
            figures = await loop.run_in_executor(direct, measure_opens, nic.pod_path) if opens else {}
        finally:
            await loop.run_in_executor(direct, ipr.close)
            direct.shutdown()
            os.close(pod_fd)
            os.close(host_fd)
            engine.close()
    engine_p50 = _pct(engine_s, 0.5)
    direct_p50 = _pct(direct_s, 0.5)
    return {
        "engine_p50_ms": engine_p50,
        "direct_p50_ms": direct_p50,
        "ratio": round(engine_p50 / direct_p50, 3),
        "engine_p90_ms": _pct(engine_s, 0.9),
        "direct_p90_ms": _pct(direct_s, 0.9),
        "engine_attach_p50_ms": _pct(attach_s, 0.5),
        "engine_return_p50_ms": _pct(return_s, 0.5),
        "iterations": iterations,
        **figures,
    }


def _timed(fn: Callable[..., None], *args: Any) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    res = asyncio.run(run(args.iterations, args.warmup))
    print(f"attach+return, one veth NIC with 2 addresses and 2 routes, {res['iterations']} cycles each:")
    print(f"  engine p50 {res['engine_p50_ms']} ms (p90 {res['engine_p90_ms']})")
    print(f"  direct pyroute2 p50 {res['direct_p50_ms']} ms (p90 {res['direct_p90_ms']})")
    print(f"  ratio {res['ratio']}")
    print(
        f"  engine attach alone p50 {res['engine_attach_p50_ms']} ms, return alone {res['engine_return_p50_ms']} ms"
    )
    print(
        "  open a netns socket: pyroute2 netns= (fork) "
        f"{res['open_fork_ms']} ms, thread+setns for pyroute2 {res['open_setns_pyroute2_ms']} ms, "
        f"thread+setns raw (engine) {res['open_setns_raw_ms']} ms"
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
