"""``dranet-admin`` (or ``python -m shared.adminctl``): talk to the dranet services
of this pod over their Unix sockets (dranet.admin.v1).

    dranet-admin health  [SERVICE...]      is each service ready (all four by default)
    dranet-admin level   SERVICE [LEVEL]   print, or set, a service's log level
    dranet-admin metrics SERVICE           print a service's Prometheus metrics

SERVICE is store, inventory, prepare or attach, whose socket is
<run-dir>/<service>.sock, or the path of a socket. --run-dir defaults to
$DRANET_RUN_DIR, else /var/run/dranet. Run it in any of the pod's containers,
e.g. ``kubectl exec -n dranet ds/dranet -c store -- dranet-admin health``.

Exit status: 0 on success, 1 when ``health`` finds a service not ready (or not
answering), 2 when a call fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import grpc

from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from shared.rpc import sync_channel
from shared.service import DEFAULT_RUN_DIR, socket_path

SERVICES = ("store", "inventory", "prepare", "attach")
TIMEOUT_S = 5.0


def _socket(run_dir: str, name: str) -> str:
    return name if "/" in name else socket_path(run_dir, name)


def _parser() -> argparse.ArgumentParser:
    intro, _, _ = (__doc__ or "").partition("\n\n")
    p = argparse.ArgumentParser(
        prog="dranet-admin",
        description=intro.replace("``", ""),
        epilog="SERVICE is store, inventory, prepare, attach or a socket path; "
        "exit status 1 means a service is not ready, 2 that a call failed.",
    )
    p.add_argument(
        "--run-dir",
        default=os.environ.get("DRANET_RUN_DIR", DEFAULT_RUN_DIR),
        help=f"directory of the services' sockets (default: $DRANET_RUN_DIR, else {DEFAULT_RUN_DIR})",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{health,level,metrics}")
    h = sub.add_parser(
        "health",
        help="is each service ready: one JSON line per service; exit 1 if any is not",
        description="Ask each service's dranet.admin.v1 Health; one JSON line per service "
        "(service, ready, detail, pid, uptime_s). Exit status 1 if any is not ready or does not answer.",
    )
    h.add_argument("services", nargs="*", metavar="SERVICE", help=f"default: {' '.join(SERVICES)}")
    lv = sub.add_parser(
        "level",
        help="print or set a service's log level",
        description="Print a service's log level, or set it (DEBUG, INFO, WARNING, ERROR) "
        "until the process restarts.",
    )
    lv.add_argument("service", metavar="SERVICE")
    lv.add_argument("level", nargs="?", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR")
    m = sub.add_parser(
        "metrics",
        help="print a service's Prometheus metrics",
        description="Print the Prometheus text exposition of one service's own process "
        "(the pod's /metrics merges all four with a service label).",
    )
    m.add_argument("service", metavar="SERVICE")
    return p


def _health(run_dir: str, names: list[str]) -> int:
    bad = 0
    for name in names or SERVICES:
        try:
            with sync_channel(_socket(run_dir, name)) as ch:
                r = admin_pb2_grpc.AdminStub(ch).Health(admin_pb2.HealthRequest(), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            print(
                json.dumps({"service": name, "ready": False, "detail": f"{exc.code().name}: {exc.details()}"})
            )
            bad += 1
            continue
        print(
            json.dumps(
                {
                    "service": r.service,
                    "ready": r.ready,
                    "detail": r.detail,
                    "pid": r.pid,
                    "uptime_s": round(r.uptime_seconds, 1),
                }
            )
        )
        bad += 0 if r.ready else 1
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "health":
        return _health(args.run_dir, args.services)
    try:
        with sync_channel(_socket(args.run_dir, args.service)) as ch:
            stub = admin_pb2_grpc.AdminStub(ch)
            if args.cmd == "metrics":
                resp = stub.Metrics(admin_pb2.MetricsRequest(), timeout=TIMEOUT_S)
                sys.stdout.write(resp.exposition.decode(errors="replace"))
                return 0
            if args.level:
                r = stub.SetLogLevel(admin_pb2.SetLogLevelRequest(level=args.level), timeout=TIMEOUT_S)
            else:
                r = stub.GetLogLevel(admin_pb2.GetLogLevelRequest(), timeout=TIMEOUT_S)
        print(json.dumps({"service": r.service, "level": r.level}))
        return 0
    except grpc.RpcError as exc:
        print(f"dranet-admin: {args.service}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
