"""The common shape of a service process: flags -> logging -> run until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable

from shared import logs

DEFAULT_RUN_DIR = "/var/run/dranet"

log = logging.getLogger(__name__)


def base_parser(service: str, description: str) -> argparse.ArgumentParser:
    """Flags every service has: --run-dir (its sockets) and --log-level."""
    p = argparse.ArgumentParser(prog=f"dranet-{service}", description=description)
    p.add_argument(
        "--run-dir",
        default=os.environ.get("DRANET_RUN_DIR", DEFAULT_RUN_DIR),
        help="directory holding the services' Unix sockets (shared by the pod's containers)",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("DRANET_LOG_LEVEL", "INFO"),
        type=logs.normalize_level,
        help="initial log level (DEBUG, INFO, WARNING, ERROR); change it later over dranet.admin.v1",
    )
    return p


def socket_path(run_dir: str, service: str) -> str:
    """Where ``service`` serves its API and dranet.admin.v1: <run-dir>/<service>.sock."""
    return os.path.join(run_dir, f"{service}.sock")


def run(service: str, level: str, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Set up JSON logging and run ``main(stop)``; SIGTERM/SIGINT set ``stop``."""
    logs.setup(service, level)

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    try:
        asyncio.run(runner())
    except Exception:
        log.exception("service failed")
        raise SystemExit(1) from None
    log.info("stopped")
