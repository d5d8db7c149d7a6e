"""dranet-store: the PodConfigStore service (LMDB on disk, gRPC on a Unix socket)."""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import logging
import os
import time

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


async def hold_owner_lock(db_dir: str, within_s: float) -> int:
    """An exclusive flock on <db-dir>/owner.lock, held until the process exits: one store per
    database. A previous store still stopping (an old pod during a rollout) holds it; wait for
    it up to ``within_s``, then fail naming the file."""
    os.makedirs(db_dir, mode=0o700, exist_ok=True)
    path = os.path.join(db_dir, "owner.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    deadline = time.monotonic() + within_s
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RuntimeError(
                    f"{path}: another store holds this database (waited {within_s:g}s for it to stop)"
                ) from None
            if not told:
                log.info("waiting for the previous store to release the database", extra={"lock": path})
                told = True
            await asyncio.sleep(0.25)
    if told:
        log.info("previous store gone; opening the database", extra={"lock": path})
    return fd


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    lock_fd = await hold_owner_lock(args.db_dir, args.takeover_wait)
    db = StoreDB(args.db_dir, map_size=args.map_size, max_map_size=args.max_map_size)
    db.open()
    store = StoreService(db)
    sock = args.socket or service.socket_path(args.run_dir, "store")
    admin = AdminServicer("store", health=db.health)
    server = UdsServer(sock).add(store.register).add(admin.register)
    await server.start()
    probes = await service.start_health_listener(args, admin)
    log.info("store ready", extra={"socket": sock, "db_dir": args.db_dir, "revision": db.revision})
    await stop.wait()
    log.info("store stopping")
    await admin.grpc_health.stopping()
    await store.end_streams()
    await server.stop(grace=2.0)
    store.close()
    db.close()
    await service.stop_health_listener(probes)
    os.close(lock_fd)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    service.apply_common(args)
    service.run("store", args.log_level, lambda stop: serve(args, stop))


if __name__ == "__main__":
    main()
