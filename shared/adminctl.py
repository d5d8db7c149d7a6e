"""``python -m shared.adminctl``: talk to a dranet service's dranet.admin.v1.

    python -m shared.adminctl health  [--run-dir DIR] SERVICE...
    python -m shared.adminctl level   [--run-dir DIR] SERVICE [LEVEL]

SERVICE is store, inventory, prepare or attach (its socket is
<run-dir>/<service>.sock) or a socket path. Without LEVEL, prints the level.
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


def _socket(run_dir: str, name: str) -> str:
    return name if "/" in name else socket_path(run_dir, name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shared.adminctl", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", default=os.environ.get("DRANET_RUN_DIR", DEFAULT_RUN_DIR))
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("health", help="is each service ready")
    h.add_argument("services", nargs="+")
    lv = sub.add_parser("level", help="get or set a service's log level")
    lv.add_argument("service")
    lv.add_argument("level", nargs="?")
    args = p.parse_args(argv)
    try:
        if args.cmd == "health":
            bad = 0
            for name in args.services:
                with sync_channel(_socket(args.run_dir, name)) as ch:
                    r = admin_pb2_grpc.AdminStub(ch).Health(admin_pb2.HealthRequest(), timeout=5)
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
        with sync_channel(_socket(args.run_dir, args.service)) as ch:
            stub = admin_pb2_grpc.AdminStub(ch)
            if args.level:
                r = stub.SetLogLevel(admin_pb2.SetLogLevelRequest(level=args.level), timeout=5)
            else:
                r = stub.GetLogLevel(admin_pb2.GetLogLevelRequest(), timeout=5)
        print(json.dumps({"service": r.service, "level": r.level}))
        return 0
    except grpc.RpcError as exc:
        print(f"adminctl: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
