"""dranet-store: the PodConfigStore service (LMDB on disk, gRPC on a Unix socket)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from services.store.db import DEFAULT_MAP_SIZE, DEFAULT_MAX_MAP_SIZE, StoreDB
from services.store.server import StoreService
from shared import service
from shared.admin import AdminServicer
from shared.rpc import UdsServer

log = logging.getLogger("services.store")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = service.base_parser("store", "PodConfigStore: the durable handoff between prepare and attach")
    p.add_argument(
        "--db-dir",
        default=os.environ.get("DRANET_STORE_DIR", "/var/lib/dranet/store"),
        help="LMDB directory (data.mdb, lock.mdb); keep it on a host path so it survives restarts",
    )
    p.add_argument("--socket", default="", help="gRPC socket (default <run-dir>/store.sock)")
    p.add_argument("--map-size", type=int, default=DEFAULT_MAP_SIZE, help="initial LMDB map size in bytes")
    p.add_argument(
        "--max-map-size", type=int, default=DEFAULT_MAX_MAP_SIZE, help="the map doubles when full, up to this"
    )
    return p.parse_args(argv)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    db = StoreDB(args.db_dir, map_size=args.map_size, max_map_size=args.max_map_size)
    db.open()
    store = StoreService(db)
    sock = args.socket or service.socket_path(args.run_dir, "store")
    server = UdsServer(sock).add(store.register).add(AdminServicer("store").register)
    await server.start()
    log.info("store ready", extra={"socket": sock, "db_dir": args.db_dir, "revision": db.revision})
    await stop.wait()
    log.info("store stopping")
    await store.end_streams()
    await server.stop(grace=2.0)
    store.close()
    db.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    service.run("store", args.log_level, lambda stop: serve(args, stop))


if __name__ == "__main__":
    main()
