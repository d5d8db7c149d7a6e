"""Attach latency for one passthrough veth "NIC" with two addresses and two routes:

1. the hook's own time: the RunPodSandbox handler (store read, the engine's netlink
   work, queueing the store writes), called in-process with a real store process;
   also the StopPodSandbox handler, and the time until the queued writes landed;
2. in the same run, the same netlink operations done directly with plain pyroute2
   (get link, move+rename into the pod netns, two addresses, up, two routes), and
   the full attach+return cycle of tests/bench/attach_netlink.py's direct path;
3. the Pod-start time the plugin adds in a real containerd 1.7: CRI RunPodSandbox
   with the attach service registered over NRI (the pod has one device) against
   without it, in alternating blocks; also registered but for a pod without devices.

Run after set-up, as root: .venv/bin/python tests/bench/attach.py [--iterations N]
The last line is one JSON object: hook_p50_ms, direct_p50_ms, hook_vs_direct_ratio,
pod_start_added_ms and more. Targets: ratio at most 1.5, added Pod-start time under
50 ms per device.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.containerd import Containerd
from dev.cluster.cri import CriClient
from proto.dranet.store.v1 import store_pb2 as st
from proto.nri.v1alpha1 import nri_pb2
from services.attach.enginebridge import NetdevBridge
from services.attach.hooks import AttachHooks
from services.attach.netns import open_netns
from services.attach.writer import StoreWriter
from shared.netconfig import parse_network_config
from shared.storeclient import StoreClient
from tests.bench.attach_netlink import BenchNic, bench_nic, configure_net1, direct_cycle, setns_socket
from tests.integration.attach import attach_env as env


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)


def p50(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 3)


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
                bridge = NetdevBridge()
                hooks = AttachHooks(store, bridge, writer)
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
                    bridge.close()
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


# --- 3: Pod start in containerd with and without the plugin -----------------------------------


async def bench_pod_start(iterations: int, workdir: Path) -> dict[str, Any]:
    ctrd = await asyncio.to_thread(Containerd)
    await ctrd.astart()
    store_proc = env.store_process(workdir).start()
    attach = env.attach_process(workdir, ctrd.nri_socket, "--log-level", "INFO")
    nics = env.NicFactory()
    without: list[float] = []
    with_device: list[float] = []
    plain: list[float] = []
    try:
        nic = nics.make(0)
        cfg = parse_network_config(
            {
                "interface": {"name": "net1", "addresses": [nic.address(2), nic.address(3)]},
                "routes": [
                    {"destination": "10.250.0.0/24", "gateway": nic.peer_ip},
                    {"destination": "10.251.0.0/24", "gateway": nic.peer_ip, "table": 100},
                ],
            }
        )
        assert cfg is not None
        async with StoreClient(store_proc.socket) as store, CriClient(ctrd.grpc_socket) as cri:

            async def start_stop(with_config: bool) -> float:
                pod = env.PodId.new("bench")
                if with_config:
                    await store.put_devices([env.device_config(pod, nic, cfg)])
                t = time.perf_counter()
                sid = await cri.run_pod_sandbox(pod.sandbox())
                took = time.perf_counter() - t
                netns = (await cri.pod_sandbox_status(sid)).netns_path
                ctrd.note_netns(netns)
                if with_config and env.link(netns, "net1") is None:
                    raise RuntimeError("the pod started without its device")
                await cri.stop_pod_sandbox(sid)
                await cri.remove_pod_sandbox(sid)
                if with_config:
                    await store.delete_pod(pod.uid)
                return took

            for _ in range(3):  # warm-up: image, CNI, caches
                await start_stop(False)
            # Alternating blocks (without, with, without, with), so drift hits both.
            block = max(1, iterations // 2)
            for _ in range(2):
                for _ in range(block):
                    without.append(await start_stop(False))
                attach.start()
                await env.wait_liveness(store, connected=True)
                await start_stop(True)  # warm-up of this process
                for _ in range(block):
                    with_device.append(await start_stop(True))
                    plain.append(await start_stop(False))
                attach.stop()
                await env.wait_liveness(store, connected=False)
    finally:
        attach.stop()
        store_proc.stop()
        await ctrd.aclose()
        nics.cleanup()
    added = statistics.median(with_device) - statistics.median(without)
    return {
        "pod_start_without_plugin_p50_ms": p50(without),
        "pod_start_with_plugin_p50_ms": p50(with_device),
        "pod_start_added_ms": round(added * 1000, 3),
        "pod_start_added_no_device_ms": round(
            (statistics.median(plain) - statistics.median(without)) * 1000, 3
        ),
        "pod_start_iterations": len(with_device),
    }


async def main_async(iterations: int, pod_iterations: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dnbench-") as tmp:
        hook_dir, pod_dir = Path(tmp) / "hook", Path(tmp) / "pods"
        hook_dir.mkdir()
        pod_dir.mkdir()
        hook = await bench_hook(iterations, 5, hook_dir)
        pods = await bench_pod_start(pod_iterations, pod_dir)
    return {**hook, **pods, "target_ratio": 1.5, "target_pod_start_added_ms": 50}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=100, help="hook and direct attach samples")
    ap.add_argument("--pod-iterations", type=int, default=40, help="pod starts with the plugin")
    args = ap.parse_args()
    res = asyncio.run(main_async(args.iterations, args.pod_iterations))
    print(
        f"RunPodSandbox hook p50 {res['hook_p50_ms']} ms (p90 {res['hook_p90_ms']}, "
        f"with its store writes landed {res['hook_with_store_writes_p50_ms']}), "
        f"direct pyroute2 attach p50 {res['direct_p50_ms']} ms: ratio {res['hook_vs_direct_ratio']}"
    )
    print(
        f"Run+Stop hooks p50 {res['hook_cycle_p50_ms']} ms, direct attach+return p50 "
        f"{res['direct_cycle_p50_ms']} ms: ratio {res['hook_cycle_vs_direct_cycle_ratio']}"
    )
    print(
        f"containerd RunPodSandbox p50 {res['pod_start_without_plugin_p50_ms']} ms without the plugin, "
        f"{res['pod_start_with_plugin_p50_ms']} ms with it and one device: +{res['pod_start_added_ms']} ms "
        f"(+{res['pod_start_added_no_device_ms']} ms for a pod without devices)"
    )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
