"""The common shape of a service process: flags -> logging -> run until a signal."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable

from shared import health, logs, rpc
from shared.admin import AdminServicer

DEFAULT_RUN_DIR = "/var/run/dranet"

log = logging.getLogger(__name__)


def ip_address(text: str) -> str:
    """argparse type: an IP address (listeners bind an address, never a name)."""
    try:
        return health.parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_number(text: str) -> int:
    """argparse type: a TCP port, 0 meaning off."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is not in 0..65535")
    return port


def base_parser(service: str, description: str) -> argparse.ArgumentParser:
    """Flags every service has: --run-dir (its sockets), --log-level and the gRPC
    health listener (--health-port, --health-address)."""
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
    p.add_argument(
        "--health-port",
        type=port_number,
        default=health.DEFAULT_PORTS.get(service, 0),
        help="TCP port serving only grpc.health.v1, for the kubelet's gRPC probes; 0: none "
        f"(default {health.DEFAULT_PORTS.get(service, 0)}). Status names: '' and "
        f"'{health.readiness_name(service)}' (ready), '{health.LIVENESS}' (the process answers)",
    )
    p.add_argument(
        "--health-address",
        type=ip_address,
        default=os.environ.get("DRANET_HEALTH_ADDRESS") or health.DEFAULT_ADDRESS,
        help="IP address of the --health-port listener (default: $DRANET_HEALTH_ADDRESS, else "
        f"{health.DEFAULT_ADDRESS}); the kubelet probes the pod IP, so pass it from the downward API",
    )
    p.add_argument(
        "--takeover-wait",
        type=float,
        default=float(os.environ.get("DRANET_TAKEOVER_WAIT", "60")),
        help="seconds to wait for a previous instance (an old pod still stopping) to release this "
        "service's sockets and files before giving up (default 60)",
    )
    return p


def apply_common(args: argparse.Namespace) -> None:
    """Settings of the base flags that live in shared modules (call right after parsing)."""
    rpc.takeover_wait_s = args.takeover_wait


def socket_path(run_dir: str, service: str) -> str:
    """Where ``service`` serves its API and dranet.admin.v1: <run-dir>/<service>.sock."""
    return os.path.join(run_dir, f"{service}.sock")


async def start_health_listener(
    args: argparse.Namespace, admin: AdminServicer
) -> health.HealthListener | None:
    """The --health-port listener for ``admin``'s grpc.health.v1, started; None when off."""
    if not args.health_port:
        return None
    listener = health.HealthListener(admin.grpc_health, args.health_address, args.health_port)
    await listener.start()
    return listener


async def stop_health_listener(listener: health.HealthListener | None) -> None:
    """Last step of a stop: liveness probes must keep answering while the service drains."""
    if listener is not None:
        await listener.stop()


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
