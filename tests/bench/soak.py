"""The soak: a long Pod churn under faults on the real cluster with the helm-installed driver
(tests/support/churn.py; tests/e2e/test_churn.py is its bounded CI run). Every fault kind is
injected, round-robin in a random order, at random moments; the invariants are checked throughout
and at the end.

    .venv/bin/python tests/bench/soak.py [--pods 220] [--nics 4] [--minutes 60] [--seed N]

``--minutes`` is a time budget: no new Pod after it (once every fault kind happened), so the
run ends with its report; ``pods`` then says how many ran. The services' logs are kept in a
directory named on stderr.

The baseline in the same run is the same churn's first 20 Pods with no faults at all
(``pod_start_p99_ms_no_faults``). Last line: one JSON object with ``pods``, ``faults``,
``faults_by_kind``, ``leaked_devices``, ``lost_configs``, ``pods_started_without_devices``,
``error_log_lines`` (unexplained ERROR lines or tracebacks in the services' logs),
``pod_start_p99_ms_under_faults`` and more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dev.cluster.install import NAMESPACE, Installed
from dev.cluster.kube import KubeCluster
from tests.support.churn import Churn
from tests.support.kube import Kube


def say(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


async def main(args: argparse.Namespace) -> dict[str, object]:
    c = KubeCluster(node_name="soak")
    await asyncio.to_thread(c.start)
    inst = Installed(c)
    out: dict[str, object] = {}
    try:
        await asyncio.to_thread(inst.install)
        say("driver installed")
        k = Kube(c, "soak-base")
        await asyncio.to_thread(k.create_namespace)
        base = Churn(c, inst, k, pods=20, nics=args.nics, faults=())
        base_report = await base.run()
        await asyncio.to_thread(k.delete_namespace)
        await base.cleanup()
        say(f"baseline: {base_report.summary()}")
        k = Kube(c, "soak")
        await asyncio.to_thread(k.create_namespace)
        t0 = time.monotonic()
        churn = Churn(
            c, inst, k, pods=args.pods, nics=args.nics, fault_gap_s=(3.0, 8.0), seed=args.seed,
            minutes=args.minutes,
        )  # fmt: skip
        try:
            report = await churn.run()
        finally:
            logs = Path(tempfile.mkdtemp(prefix="dranet-soak-logs-"))
            churn.logs.dump(logs)
            say(f"the services' logs: {logs}")
        await asyncio.to_thread(k.delete_namespace)
        await churn.cleanup()
        out = report.summary()
        out["seconds"] = round(time.monotonic() - t0, 1)
        out["pod_start_p99_ms_no_faults"] = base_report.p99_ms()
        out["violations"] = report.violations[:20] + base_report.violations[:5]
        out["unexplained_error_lines"] = report.unexplained[:10]
        out["attached_late"] = churn.late[:20]
        out["seed"] = args.seed
    finally:
        await asyncio.to_thread(c.delete_pods, 90.0, (NAMESPACE,))
        await asyncio.to_thread(inst.uninstall)
        await asyncio.to_thread(c.stop)
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=220)
    p.add_argument("--nics", type=int, default=4)
    p.add_argument("--minutes", type=float, default=None, help="time budget for the faulted churn")
    p.add_argument("--seed", type=int, default=int(time.time()))
    print(json.dumps(asyncio.run(main(p.parse_args()))))
