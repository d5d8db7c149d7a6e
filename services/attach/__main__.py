"""dranet-attach: the NRI plugin that moves prepared devices into pods and back."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from services.attach.engine import DeviceEngine
from services.attach.hooks import HookConfig
from services.attach.nri.stub import DEFAULT_SOCKET_PATH, StubConfig
from services.attach.server import AttachService, DrainConfig
from shared import service
from shared.storeclient import StoreClient

log = logging.getLogger("services.attach")

# Store reads on the hook path must leave room for the netlink work inside the
# runtime's 2 s; writes retry on their own (writer.py).
STORE_DEADLINE_S = 1.0


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number of seconds")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = service.base_parser("attach", "NRI plugin for dra.net: moves prepared devices into pods and back")
    p.add_argument(
        "--nri-socket",
        default=os.environ.get("NRI_SOCKET", DEFAULT_SOCKET_PATH),
        help="the container runtime's NRI socket",
    )
    p.add_argument("--plugin-name", default="dra.net", help="NRI plugin name")
    p.add_argument("--plugin-index", default="00", help="NRI plugin index: two digits, lower runs first")
    p.add_argument("--store-socket", default="", help="default <run-dir>/store.sock")
    p.add_argument(
        "--hook-timeout",
        type=_positive,
        default=1.5,
        help="seconds one NRI hook may take (capped at 3/4 of the runtime's request timeout)",
    )
    p.add_argument(
        "--drain-quiet",
        type=_positive,
        default=10.0,
        help="graceful stop: seconds without NRI activity each prepared pod needs",
    )
    p.add_argument("--drain-poll", type=_positive, default=5.0, help="graceful stop: seconds between checks")
    p.add_argument(
        "--drain-timeout", type=_positive, default=300.0, help="graceful stop: give up waiting after this"
    )
    p.add_argument(
        "--netns-pin-dir",
        default="",
        help="pin each pod netns holding our devices here (bind mounts on a shared mount of the host), "
        "so a pod stopping while attach is down keeps them until attach gives them back; '': no pins",
    )
    p.add_argument(
        "--dev-root",
        default="/",
        help="where the host's /dev is seen (RDMA device files are checked under it)",
    )
    return p.parse_args(argv)


def make_engine(dev_root: str) -> DeviceEngine:
    # Imported here: the engine opens the host netns at construction.
    from services.attach.netdev import NetdevEngine

    return NetdevEngine(dev_root=dev_root)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    run_dir = args.run_dir
    store = StoreClient(
        args.store_socket or service.socket_path(run_dir, "store"), deadline_s=STORE_DEADLINE_S
    )
    stub_config = StubConfig(
        socket_path=args.nri_socket,
        plugin_name=args.plugin_name,
        plugin_idx=args.plugin_index,
        handler_timeout=args.hook_timeout,
    )
    attach = AttachService(
        store,
        make_engine(args.dev_root),
        stub_config,
        admin_socket=service.socket_path(run_dir, "attach"),
        hook_config=HookConfig(stop_budget_s=min(1.0, args.hook_timeout * 0.7), pin_dir=args.netns_pin_dir),
        drain=DrainConfig(quiet_s=args.drain_quiet, poll_s=args.drain_poll, timeout_s=args.drain_timeout),
    )
    log.info(
        "attach starting",
        extra={"nri_socket": args.nri_socket, "plugin": f"{args.plugin_index}-{args.plugin_name}"},
    )
    probes = await service.start_health_listener(args, attach.admin_servicer)
    try:
        await attach.run(stop)
    finally:
        await store.close()
        await service.stop_health_listener(probes)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    service.apply_common(args)
    try:
        StubConfig(plugin_name=args.plugin_name, plugin_idx=args.plugin_index)
    except ValueError as exc:
        raise SystemExit(f"dranet-attach: {exc}") from None
    service.run("attach", args.log_level, lambda stop: serve(args, stop))


if __name__ == "__main__":
    main()
