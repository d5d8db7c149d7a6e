"""The driver pod's memory on the real cluster, with and without its metrics endpoint.

charts/dranet is helm-installed (dev.cluster.install) twice on one cluster: first with
``metrics.enabled=false`` (the baseline: the four services with their own prometheus_client
registries and gRPC health, no HTTP server), then with the endpoint on (FastAPI and uvicorn in the
inventory container). Each time, after the pod is Ready, one Pod with a NIC runs and ends (so every
service has done real work) and the endpoint, when on, is scraped 20 times; then it measures:

- ``pss_mib``: the sum of each container process's PSS (/proc/<pid>/smaps_rollup), and per service;
- ``cgroup_mib``: the pod cgroup's memory.usage_in_bytes, and ``cgroup_rss_mib`` (memory.stat
  total_rss: without the page cache the image files leave there).

Last line: one JSON object with ``pss_before_mib``, ``pss_after_mib``, ``endpoint_pss_mib`` (the
difference, target <= 25), the cgroup figures and the per-service numbers.

    .venv/bin/python tests/bench/pod_memory.py
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.install import CONTAINERS, Installed
from dev.cluster.kube import KubeCluster
from tests.support.kube import Kube, link

MIB = 1024 * 1024


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def pod_pids(uid: str) -> dict[str, int]:
    """service -> pid of the container processes of the pod ``uid`` (by cgroup and cmdline)."""
    out: dict[str, int] = {}
    want = uid.replace("-", "_"), uid
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cgroup = (proc / "cgroup").read_text()
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(w in cgroup for w in want):
            continue
        for svc in CONTAINERS:
            if f"services.{svc}".encode() in cmd:
                out[svc] = int(proc.name)
    return out


def pss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    m = re.search(r"^Pss:\s+(\d+) kB", text, re.M)
    assert m, text
    return int(m.group(1))


def pod_cgroup(uid: str) -> Path:
    for d in Path("/sys/fs/cgroup/memory").rglob(f"pod{uid}"):
        return d
    raise RuntimeError(f"no memory cgroup for pod {uid}")


def measure(inst: Installed) -> dict[str, Any]:
    pod = inst.wait_ready()
    uid = pod["metadata"]["uid"]
    pids = pod_pids(uid)
    assert set(pids) == set(CONTAINERS), pids
    per = {svc: round(pss_kib(pid) / 1024, 1) for svc, pid in pids.items()}
    cg = pod_cgroup(uid)
    stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
    return {
        "pss_mib": round(sum(per.values()), 1),
        "per_service_pss_mib": per,
        "cgroup_mib": round(int((cg / "memory.usage_in_bytes").read_text()) / MIB, 1),
        "cgroup_rss_mib": round(int(stat.get("total_rss", 0)) / MIB, 1),
    }


async def one_pod(k: Kube, nic: str) -> None:
    dc = k.device_class("nic", f'device.attributes["dra.net"].ifName == "{nic}"')
    k.claim_and_pod("p", dc, configs=[{"parameters": {"interface": {"name": "net1"}}}])
    await k.wait_phase("p", within=120)
    assert link(await k.pod_netns("p"), "net1") is not None
    k.delete_pod("p")
    await k.wait_gone("p", within=60)
    k.delete_claim("p")
    k.delete_device_classes()


def scrape(host: str, n: int) -> None:
    for _ in range(n):
        conn = http.client.HTTPConnection(host, 9177, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().read()
        conn.close()


async def main() -> dict[str, Any]:
    c = KubeCluster(node_name="bench-mem")
    await asyncio.to_thread(c.start)
    inst = Installed(c)
    try:
        await asyncio.to_thread(c.net.add_nic, "eth1", ["192.168.101.2/24"])
        k = Kube(c, "bench")
        k.create_namespace()
        results = {}
        for label, enabled in (("before", False), ("after", True)):
            if label == "before":
                await asyncio.to_thread(inst.install, {"metrics": {"enabled": False}})
            else:
                old = inst.wait_ready()["metadata"]["uid"]
                await asyncio.to_thread(inst.upgrade, {"metrics": {"enabled": True}})
                await asyncio.to_thread(inst.wait_ready, 120, old)
            await one_pod(k, "eth1")
            if enabled:
                scrape(c.net.node_ip, 20)
            time.sleep(3)
            results[label] = await asyncio.to_thread(measure, inst)
            say(f"{label}: {results[label]}")
        k.delete_namespace()
    finally:
        await asyncio.to_thread(c.delete_pods, 90.0, ("kube-system",))
        await asyncio.to_thread(inst.uninstall)
        await asyncio.to_thread(c.stop)
    b, a = results["before"], results["after"]
    return {
        "pss_before_mib": b["pss_mib"],
        "pss_after_mib": a["pss_mib"],
        "endpoint_pss_mib": round(a["pss_mib"] - b["pss_mib"], 1),
        "cgroup_before_mib": b["cgroup_mib"],
        "cgroup_after_mib": a["cgroup_mib"],
        "cgroup_rss_before_mib": b["cgroup_rss_mib"],
        "cgroup_rss_after_mib": a["cgroup_rss_mib"],
        "endpoint_cgroup_rss_mib": round(a["cgroup_rss_mib"] - b["cgroup_rss_mib"], 1),
        "per_service_before": b["per_service_pss_mib"],
        "per_service_after": a["per_service_pss_mib"],
        "target_endpoint_mib": 25,
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
