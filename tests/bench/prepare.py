"""NodePrepareResources latency, as the kubelet sees it over the DRA socket:
1 claim with 1 device, and 32 claims in one call, with prepare's own split of
the time (API read, pipeline, inventory lookup, durable store write, from its
debug log), against baselines in the same run: an empty NodePrepareResources
call (the gRPC hop) and a plain claim GET from this process (the API read).

Run after set-up, as root: .venv/bin/python tests/bench/prepare.py [--iterations N]
Needs root (a network namespace stands in for the node). The last line is one
JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from services.devcluster.kubelet_plugins import ClaimRef
from tests.support.stack import NodeStack

NICS = 32


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)


async def allocated_claim(node: NodeStack, name: str, device: str) -> ClaimRef:
    """A claim allocated and reserved by hand (the scheduler's part is not measured)."""
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "nic", "exactly": {"deviceClassName": "nic"}}],
                "config": [
                    {
                        "opaque": {
                            "driver": "dra.net",
                            "parameters": {"interface": {"name": "net1", "mtu": 1400}},
                        }
                    }
                ],
            }
        },
    }
    resp = await node.resource.create_namespaced_resource_claim("default", body, _preload_content=False)
    obj: dict[str, Any] = json.loads(await resp.read())
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "nic", "driver": "dra.net", "pool": node.node_name, "device": device}
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "opaque": {
                            "driver": "dra.net",
                            "parameters": {"interface": {"name": "net1", "mtu": 1400}},
                        },
                    }
                ],
            }
        },
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": f"pod-{name}"}],
    }
    await node.resource.replace_namespaced_resource_claim_status(name, "default", obj, _preload_content=False)
    return ClaimRef(namespace="default", name=name, uid=obj["metadata"]["uid"])


def timings(node: NodeStack, since: int) -> list[dict[str, Any]]:
    lines = node.procs["prepare"].log_path.read_text().splitlines()[since:]
    return [json.loads(line) for line in lines if '"prepare timings"' in line]


async def run(iterations: int, calls32: int) -> dict[str, Any]:
    async with NodeStack(inventory_args=["--filter", ""], allocator=False) as node:
        for i in range(NICS):
            node.add_nic(f"eth{i}", addresses=[f"10.{i}.0.5/24"])
        await node.wait_published(*(f"eth{i}" for i in range(NICS)), within=30)
        await node.device_class("nic", 'device.driver == "dra.net"')
        await node.hold_attach_liveness()
        plugin = await node.plugin()
        # Warm-up: channels, the inventory's caches, the store's session.
        for i in range(5):
            ref = await allocated_claim(node, f"warm{i}", "eth0")
            res = await plugin.node_prepare_resources([ref])
            assert res[ref.uid].error == "", res[ref.uid].error

        one: list[float] = []
        log_mark = len(node.procs["prepare"].log_path.read_text().splitlines())
        for i in range(iterations):
            ref = await allocated_claim(node, f"one{i}", f"eth{i % NICS}")
            t = time.perf_counter()
            res = await plugin.node_prepare_resources([ref])
            one.append(time.perf_counter() - t)
            assert res[ref.uid].error == "", res[ref.uid].error
        split_one = timings(node, log_mark)

        many: list[float] = []
        log_mark = len(node.procs["prepare"].log_path.read_text().splitlines())
        for j in range(calls32):
            refs = [await allocated_claim(node, f"m{j}-{i}", f"eth{i}") for i in range(NICS)]
            t = time.perf_counter()
            res = await plugin.node_prepare_resources(refs)
            many.append(time.perf_counter() - t)
            bad = [r.error for r in res.values() if r.error]
            assert not bad, bad[:3]
        split_many = timings(node, log_mark)

        # Baselines: the bare gRPC hop, and one claim GET from here.
        empty: list[float] = []
        for _ in range(200):
            t = time.perf_counter()
            await plugin.node_prepare_resources([])
            empty.append(time.perf_counter() - t)
        get: list[float] = []
        for i in range(200):
            t = time.perf_counter()
            resp = await node.resource.read_namespaced_resource_claim(
                f"one{i % iterations}", "default", _preload_content=False
            )
            await resp.read()
            get.append(time.perf_counter() - t)

    def split(entries: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(e[key] for e in entries), 3) if entries else -1.0

    return {
        "prepare_p50_ms": pct(one, 0.5),
        "prepare_p99_ms": pct(one, 0.99),
        "prepare32_p50_ms": pct(many, 0.5),
        "prepare32_p99_ms": pct(many, 0.99),
        "split_p50_ms": {
            k: split(split_one, f"{k}_ms") for k in ("api_read", "pipeline", "inventory", "store_write")
        },
        "split32_p50_ms": {
            k: split(split_many, f"{k}_ms") for k in ("api_read", "pipeline", "inventory", "store_write")
        },
        "baseline_empty_call_p50_ms": pct(empty, 0.5),
        "baseline_claim_get_p50_ms": pct(get, 0.5),
        "target_prepare_p50_ms": 15,
        "samples": {"one": iterations, "calls32": calls32},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--calls32", type=int, default=20)
    args = ap.parse_args()
    result = asyncio.run(run(args.iterations, args.calls32))
    print(
        f"prepare p50 {result['prepare_p50_ms']} ms, 32 claims p50 {result['prepare32_p50_ms']} ms; "
        f"split {result['split_p50_ms']}",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
