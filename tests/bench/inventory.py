"""Inventory at 1,000 netdevs: scan time, publish time and API writes.

Starts a real single-node cluster of its own (``dev.cluster.kube.KubeCluster``: etcd,
kube-apiserver, controller-manager, scheduler, containerd, kubelet), creates a network
namespace with 1,000 netdevs (500 veth pairs, a third of them with an address) linked to
the cluster's API server, a Node ``bench-node``, and starts the inventory service in the
namespace (``ip netns exec``, as the chart's ServiceAccount, with a --filter of dranet's
default shape that every netdev passes, so all are evaluated and published). Writes are
the ADDED/MODIFIED/DELETED events of a watch on the node's ResourceSlices, started before
the inventory. Then it measures:

* the scan itself (discovery + attributes, best and median of 5 in the namespace),
  against two baselines in the same run: ``ip -j link show`` (run + JSON parse) and
  the raw netlink link dump, plus pyroute2's link dump for comparison;
* the first publish: service start -> every device in a ResourceSlice, and its writes;
* a no-op rescan (Rescan(wait=True), three times): writes must stay 0;
* one link change (MTU of one veth): time until the API server lists it, and writes;
* GetDevice(with_snapshot) latency, the lookup prepare makes per claim.

Run as root after set-up: .venv/bin/python tests/bench/inventory.py [--netdevs N]
The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.kube import KubeCluster
from dev.cluster.procs import REPO, ServiceProcess
from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from shared.rpc import channel
from tests.integration.inventory.helpers import Cluster, wait_for

NODE = "bench-node"
# dranet's default filter shape, for a link type the namespace does not have: every
# device is evaluated (cel-python) and every netdev is published.
FILTER = '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "dummy"'

# Runs inside the namespace: the scan as the service runs it, and the baselines.
SCAN_PROBE = textwrap.dedent(
    """
    import json, statistics, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    from services.inventory import discovery, rtnl
    from services.inventory.bpf import TcxQuery
    from services.inventory.pciids import PciIds, find_database
    from services.inventory.sysfs import Sysfs

    def timed(fn, rounds=5):
        out = []
        for _ in range(rounds):
            t = time.perf_counter(); r = fn(); out.append(time.perf_counter() - t)
        return r, min(out), statistics.median(out)

    sysfs, tcx, ids = Sysfs(), TcxQuery(), PciIds(find_database())
    opts = discovery.ScanOptions(excluded_interfaces=discovery.excluded_uplinks())
    devs, scan_best, scan_median = timed(lambda: discovery.build_devices(discovery.gather(sysfs, tcx), opts, ids))
    def raw():
        with rtnl.Netlink() as nl:
            return nl.links()
    links, raw_best, _ = timed(raw)
    def ipj():
        return json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True, check=True).stdout)
    _, ipj_best, _ = timed(ipj)
    def pyroute2_dump():
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            return list(ipr.get_links())
    _, pyr_best, _ = timed(pyroute2_dump, rounds=3)
    print(json.dumps({"devices": len(devs), "links": len(links), "scan_best": scan_best,
                      "scan_median": scan_median, "raw_dump": raw_best, "ip_json": ipj_best,
                      "pyroute2_dump": pyr_best}))
    """
)


def sh(*cmd: str, stdin: str | None = None) -> str:
    res = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def make_netdevs(ns: str, count: int) -> None:
    pairs = count // 2
    links = "".join(f"link add va{i:04d} type veth peer name vb{i:04d}\n" for i in range(pairs))
    sh("ip", "-n", ns, "-batch", "-", stdin=links)
    addrs = "".join(
        f"addr add 10.{i // 250}.{i % 250}.1/24 dev va{i:04d}\nlink set va{i:04d} up\n"
        for i in range(0, pairs, 3)
    )
    sh("ip", "-n", ns, "-batch", "-", stdin=addrs)


def progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def bench(netdevs: int, workdir: Path) -> dict[str, Any]:
    ns = f"invbench-{secrets.token_hex(3)}"
    proc: ServiceProcess | None = None
    cluster: Cluster | None = None
    kube = KubeCluster()
    try:
        t = time.perf_counter()
        await asyncio.to_thread(kube.start)
        progress(
            f"cluster (Kubernetes {kube.kube_version}) up in {time.perf_counter() - t:.1f}s: {kube.state}"
        )
        kubeconfig = await asyncio.to_thread(kube.service_identity, "inventory")

        sh("ip", "netns", "add", ns)
        t = time.perf_counter()
        make_netdevs(ns, netdevs)
        progress(f"{netdevs} netdevs created in {time.perf_counter() - t:.2f}s")

        kube.net.link(ns)  # the link to the API server is a netdev of the namespace too
        probe = json.loads(
            sh("ip", "netns", "exec", ns, sys.executable, "-c", SCAN_PROBE, str(REPO))
            .strip()
            .splitlines()[-1]
        )
        progress(f"scan probe: {probe}")

        cluster = Cluster(kube, NODE, kubeconfig)  # creates the Node, starts the watch
        await cluster.start()
        run = workdir / "run"
        proc = ServiceProcess(
            "services.inventory",
            [
                *("--run-dir", str(run), "--node-name", NODE, "--kubeconfig", cluster.kubeconfig),
                *("--cloud-provider-hint", "NONE", "--filter", FILTER, "--max-poll-interval", "1h"),
                *("--log-level", "DEBUG"),
            ],
            socket=run / "inventory.sock",
            log_path=workdir / "inventory.log",
            netns=ns,
        )
        expected = probe["devices"]
        started = time.perf_counter()
        proc.start(timeout=60)
        ready_s = time.perf_counter() - started
        # Waits follow the watch (a list of 1,000 devices per poll would load the API server);
        # what it saw is checked against a list afterwards.
        await wait_for(lambda: len(cluster.watch.devices()) == expected, within=180, what="first publish")
        first_publish_s = time.perf_counter() - started
        assert len(cluster.published()) == expected, "the watch and a list disagree"
        first_writes = cluster.slice_writes
        slices = len(cluster.slices())
        progress(
            f"first publish: {expected} devices in {slices} slices, {first_writes} writes, {first_publish_s:.2f}s"
        )

        async with channel(proc.socket) as ch:
            stub = inventory_pb2_grpc.InventoryStub(ch)
            before = cluster.slice_writes
            noop = []
            for _ in range(3):
                t = time.perf_counter()
                await stub.Rescan(pb.RescanRequest(wait=True))
                noop.append(time.perf_counter() - t)
            noop_writes = cluster.slice_writes - before
            progress(f"no-op rescans: {noop_writes} writes, {[round(x, 3) for x in noop]}s")

            before = cluster.slice_writes
            t = time.perf_counter()
            sh("ip", "-n", ns, "link", "set", "va0007", "mtu", "1400")
            change_s = await wait_for(
                lambda: (
                    cluster.watch.devices().get("va0007", {}).get("attributes", {}).get("dra.net/mtu")
                    == {"int": 1400}
                ),
                within=60,
                what="link change",
            )
            assert cluster.published()["va0007"]["attributes"]["dra.net/mtu"] == {"int": 1400}
            await asyncio.sleep(0.5)
            change_writes = cluster.slice_writes - before
            progress(f"link change reflected in {change_s:.3f}s with {change_writes} writes")

            lat = []
            for i in range(200):
                t = time.perf_counter()
                await stub.GetDevice(
                    pb.GetDeviceRequest(name=f"va{(i * 7) % (netdevs // 2):04d}", with_snapshot=True)
                )
                lat.append((time.perf_counter() - t) * 1000)
            lat.sort()
        # The service's own scans: discovery + attributes + the CEL filter (first one uncached).
        service_scans = [
            json.loads(line)["seconds"]
            for line in proc.log_path.read_text().splitlines()
            if '"scan done"' in line
        ]
        return {
            "netdevs": netdevs,
            "devices": expected,
            "full_scan_s": round(probe["scan_median"], 4),
            "full_scan_best_s": round(probe["scan_best"], 4),
            "service_first_scan_s": round(service_scans[0], 4),
            "service_rescan_median_s": round(statistics.median(service_scans[1:]), 4),
            "baseline_raw_netlink_dump_s": round(probe["raw_dump"], 4),
            "baseline_ip_json_link_show_s": round(probe["ip_json"], 4),
            "pyroute2_link_dump_s": round(probe["pyroute2_dump"], 4),
            "service_ready_s": round(ready_s, 3),
            "first_publish_s": round(first_publish_s, 3),
            "first_publish_writes": first_writes,
            "slices": slices,
            "noop_rescan_writes": noop_writes,
            "noop_rescan_s": round(statistics.median(noop), 3),
            "change_reflected_s": round(change_s, 3),
            "change_writes": change_writes,
            "lookup_snapshot_p50_ms": round(lat[len(lat) // 2], 2),
            "lookup_snapshot_p99_ms": round(lat[int(len(lat) * 0.99) - 1], 2),
        }
    finally:
        if proc is not None:
            proc.stop()
        if cluster is not None:
            with contextlib.suppress(Exception):
                await cluster.close()
        subprocess.run(["ip", "netns", "del", ns], check=False)
        await asyncio.to_thread(kube.stop)
        remove_state(kube)


def remove_state(kube: KubeCluster) -> None:
    """The cluster's state directory, unless something is still mounted under it."""
    prefix = str(kube.state) + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    if not any(m == str(kube.state) or m.startswith(prefix) for m in mounts):
        shutil.rmtree(kube.state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--netdevs", type=int, default=1000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("tests/bench/inventory.py needs root (network namespaces)")
    workdir = Path(tempfile.mkdtemp(prefix="invb-"))
    try:
        result = asyncio.run(bench(args.netdevs, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
