"""CEL throughput over 1,000 dranet-like devices: DRA selectors (as the allocator runs them) and
dranet's publish-time --filter (as the inventory runs it).

Run after set-up: .venv/bin/python tests/bench/cel_selectors.py [--devices N] [--rounds R]
The last line is one JSON object with the figures (evaluations per second, best of R rounds).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared import cel

SELECTORS = {
    "class": 'device.driver == "dra.net"',
    "typical": 'device.driver == "dra.net" && device.attributes["dra.net"].rdma == true',
    "ifname": 'device.attributes["dra.net"].ifName == "eth1"',
    "bind": 'cel.bind(n, device.attributes["dra.net"], n.rdma && n.mtu >= 9000 && n.ifName.startsWith("eth"))',
}
FILTER = '!("dra.net/type" in attributes) || attributes["dra.net/type"].StringValue != "veth"'


def devices(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append(
            {
                "name": f"eth{i}",
                "attributes": {
                    "dra.net/ifName": {"string": f"eth{i}"},
                    "dra.net/pciAddress": {"string": f"0000:{i // 256:02x}:{i % 32:02x}.{i % 8}"},
                    "dra.net/mac": {"string": f"02:00:00:00:{i // 256:02x}:{i % 256:02x}"},
                    "dra.net/mtu": {"int": 9000 if i % 2 else 1500},
                    "dra.net/numaNode": {"int": i % 2},
                    "dra.net/rdma": {"bool": i % 3 == 0},
                    "dra.net/virtual": {"bool": False},
                    "dra.net/type": {"string": "veth" if i % 10 == 0 else "device"},
                    "dra.net/state": {"string": "up"},
                    "dra.net/sriov": {"bool": False},
                },
            }
        )
    return out


def best_rate(rounds: int, count: int, fn: Any) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return count / best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    devs = devices(args.devices)
    n = len(devs)

    results: dict[str, Any] = {"devices": n}
    results["variables_per_s"] = round(
        best_rate(args.rounds, n, lambda: [cel.dra_device_variables(d, "dra.net") for d in devs])
    )
    variables = [cel.dra_device_variables(d, "dra.net") for d in devs]
    for name, expression in SELECTORS.items():
        program = cel.compile_expression(expression)
        rate = best_rate(args.rounds, n, lambda p=program: [p.matches(v) for v in variables])
        results[f"selector_{name}_evals_per_s"] = round(rate)
        print(f"selector {name:8s} {rate:8.0f} evals/s   {expression}")
    program = cel.compile_filter(FILTER)
    rate = best_rate(args.rounds, n, lambda: cel.filter_devices(program, devs))
    results["filter_devices_per_s"] = round(rate)
    print(f"filter (incl. variables) {rate:8.0f} devices/s   {FILTER}")
    start = time.perf_counter()
    for expression in SELECTORS.values():
        cel.compile_expression(expression)
    results["compile_ms"] = round((time.perf_counter() - start) * 1000 / len(SELECTORS), 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
