"""Store latency: put (durable) and get over the Unix-socket gRPC hop, against the
same operations as direct in-process LMDB calls in the same run.

Run after set-up: .venv/bin/python tests/bench/store.py [--puts N] [--gets N]
The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import grpc
import lmdb

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.procs import ServiceProcess
from proto.dranet.store.v1 import store_pb2 as pb
from proto.dranet.store.v1 import store_pb2_grpc
from shared.storeclient import StoreClient


def config(i: int) -> pb.DeviceConfig:
    body = json.dumps(
        {
            "interface": {"name": f"net{i % 8}", "addresses": [f"10.{i % 250}.0.2/24"], "mtu": 9000},
            "routes": [{"destination": "10.0.0.0/8", "gateway": f"10.{i % 250}.0.1"}],
        }
    )
    return pb.DeviceConfig(
        pod=pb.PodRef(uid=f"pod-{i:06d}", namespace="bench", name=f"pod{i}"),
        device=f"eth{i % 8}",
        claim=pb.ClaimRef(uid=f"claim-{i:06d}", namespace="bench", name=f"c{i}"),
        request="nic",
        driver="dra.net",
        pool="node",
        host_ifname=f"eth{i % 8}",
        pod_config_json=body,
    )


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


async def bench_hop(sock: str, puts: int, gets: int) -> dict[str, float]:
    out: dict[str, float] = {}
    async with StoreClient(sock) as c:
        for i in range(200):  # warm-up
            await c.put_devices([config(i)])
            await c.get_device(f"pod-{i:06d}", f"eth{i % 8}")
        t_put = []
        for i in range(puts):
            t = time.perf_counter()
            await c.put_devices([config(i)])
            t_put.append(time.perf_counter() - t)
        t_get = []
        for j in range(gets):
            i = j % puts
            t = time.perf_counter()
            got = await c.get_device(f"pod-{i:06d}", f"eth{i % 8}")
            t_get.append(time.perf_counter() - t)
            assert got is not None
        out.update(
            put_p50_ms=pct(t_put, 0.5),
            put_p99_ms=pct(t_put, 0.99),
            get_p50_ms=pct(t_get, 0.5),
            get_p99_ms=pct(t_get, 0.99),
        )
    # Unary calls, for comparison with the session stream the client uses.
    ch = grpc.aio.insecure_channel(f"unix:{sock}")
    stub = store_pb2_grpc.PodConfigStoreStub(ch)
    t_unary = []
    for j in range(min(gets, 2000)):
        i = j % puts
        t = time.perf_counter()
        await stub.GetDevice(pb.DeviceKey(pod_uid=f"pod-{i:06d}", device=f"eth{i % 8}"))
        t_unary.append(time.perf_counter() - t)
    await ch.close()
    out["unary_get_p50_ms"] = pct(t_unary, 0.5)
    return out


def bench_direct(path: Path, puts: int, gets: int) -> dict[str, float]:
    """The same put and get as plain LMDB calls in this process, same settings."""
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=8, sync=True, metasync=True, subdir=True)
    db = env.open_db(b"devices")
    payloads = [(f"pod-{i:06d}/eth{i % 8}".encode(), config(i).SerializeToString()) for i in range(puts)]
    for key, value in payloads[:200]:
        with env.begin(write=True, db=db) as txn:
            txn.put(key, value)
    t_put = []
    for key, value in payloads:
        t = time.perf_counter()
        with env.begin(write=True, db=db) as txn:
            txn.put(key, value)
        t_put.append(time.perf_counter() - t)
    t_get = []
    for j in range(gets):
        key = payloads[j % puts][0]
        t = time.perf_counter()
        with env.begin(db=db) as txn:
            value = txn.get(key)
            msg = pb.DeviceConfig.FromString(value)
        t_get.append(time.perf_counter() - t)
        assert msg.device
    env.close()
    return {
        "direct_put_p50_ms": pct(t_put, 0.5),
        "direct_get_p50_ms": pct(t_get, 0.5),
        "direct_put_p99_ms": pct(t_put, 0.99),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--gets", type=int, default=5000)
    args = ap.parse_args()
    # The disk the store would use, not a tmpfs: durability costs an fsync.
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        tmp_path = Path(tmp)
        run = tmp_path / "run"
        proc = ServiceProcess(
            "services.store",
            ["--db-dir", str(tmp_path / "db"), "--run-dir", str(run), "--log-level", "WARNING"],
            socket=run / "store.sock",
            log_path=tmp_path / "store.log",
        ).start()
        try:
            hop = asyncio.run(bench_hop(proc.socket, args.puts, args.gets))
        finally:
            proc.stop()
        direct = bench_direct(tmp_path / "direct", args.puts, args.gets)
    result = {**hop, **direct}
    result["hop_overhead_p50_ms"] = result["get_p50_ms"] - result["direct_get_p50_ms"]
    result["put_overhead_p50_ms"] = result["put_p50_ms"] - result["direct_put_p50_ms"]
    result = {k: round(v, 4) for k, v in result.items()}
    result["target_hop_overhead_p50_ms"] = 0.5
    result["samples"] = {"puts": args.puts, "gets": args.gets}  # type: ignore[assignment]
    print(
        f"store put p50 {result['put_p50_ms']} ms (direct {result['direct_put_p50_ms']}), "
        f"get p50 {result['get_p50_ms']} ms (direct {result['direct_get_p50_ms']}, unary {result['unary_get_p50_ms']})",
        file=sys.stderr,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
