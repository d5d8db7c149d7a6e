"""dranet-inventory: discovers the node's network and RDMA devices, publishes them
as ResourceSlices and answers device lookups on <run-dir>/inventory.sock. It also
serves the pod's HTTP endpoint (--metrics-port: /metrics of all four services,
/healthz, /readyz; shared/httpendpoint.py), so FastAPI and uvicorn are loaded in one
process only, and only when that port is set.

    python -m services.inventory --node-name node1 --kubeconfig kubeconfig.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import socket
import sys
from collections.abc import Sequence
from typing import Any

from services.inventory.cloud import discovery as cloud_discovery
from services.inventory.cloud.base import Providers
from services.inventory.cloud.host import HostProbe
from services.inventory.discovery import Device
from services.inventory.filter import DEFAULT_FILTER, DeviceFilter, FilterError
from services.inventory.inventory import (
    DEFAULT_MAX_POLL_INTERVAL,
    DEFAULT_MIN_POLL_INTERVAL,
    DEFAULT_POLL_BURST,
    Inventory,
    InventoryConfig,
)
from services.inventory.kept import KeptDevices
from services.inventory.metrics import InventoryCollector
from services.inventory.publisher import Publisher, SliceClient, make_api_client
from services.inventory.rdma import read_netns_mode
from services.inventory.server import InventoryServicer
from shared import features, service
from shared.admin import AdminServicer
from shared.health import HealthListener
from shared.httpendpoint import DEFAULT_ADDRESS as DEFAULT_METRICS_ADDRESS
from shared.httpendpoint import DEFAULT_PORT as DEFAULT_METRICS_PORT
from shared.httpendpoint import HttpEndpoint, Scraper
from shared.metrics import REGISTRY
from shared.rpc import UdsServer
from shared.storeclient import StoreClient

log = logging.getLogger("services.inventory")

SERVICE = "inventory"
# The services whose metrics and readiness the pod's endpoint gathers, on <run-dir>/<name>.sock.
POD_SERVICES = ("store", "inventory", "prepare", "attach")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a Go duration ("2s", "1m30s", "500ms") or a plain number of seconds."""
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pos, total = 0, 0.0
        for m in _DURATION_PART.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 2s, 1m, 500ms)") from None
        value = total
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration cannot be negative")
    return value


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "t", "true", "yes", "y", "on"):
        return True
    if value in ("0", "f", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true or false)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = service.base_parser(
        SERVICE, "Discovers network and RDMA devices, publishes ResourceSlices, answers device lookups."
    )
    p.add_argument(
        "--node-name",
        "--hostname-override",
        dest="node_name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="the Node this inventory publishes for (default: $NODE_NAME, else the hostname)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG", ""),
        help="kubeconfig of the API server (default: $KUBECONFIG, else the in-cluster config)",
    )
    p.add_argument(
        "--no-publish",
        action="store_true",
        help="do not talk to an API server: discover and answer lookups only",
    )
    p.add_argument("--sysfs-root", default="/sys", help="where sysfs is mounted")
    p.add_argument("--dev-root", default="/dev", help="where /dev is (for the RDMA device files)")
    p.add_argument(
        "--pci-ids",
        default="",
        help="the pci.ids database for vendor/device names (default: $PCIDB_PATH, then the system's)",
    )
    p.add_argument(
        "--filter",
        default=DEFAULT_FILTER,
        help="CEL expression over `attributes` a device must pass to be published; empty publishes all "
        "(default hides veth links)",
    )
    p.add_argument(
        "--min-poll-interval",
        "--inventory-min-poll-interval",
        dest="min_poll_interval",
        type=parse_duration,
        default=DEFAULT_MIN_POLL_INTERVAL,
        help="minimum time between two scans once the burst is used (default 2s)",
    )
    p.add_argument(
        "--max-poll-interval",
        "--inventory-max-poll-interval",
        dest="max_poll_interval",
        type=parse_duration,
        default=DEFAULT_MAX_POLL_INTERVAL,
        help="maximum time between two scans without any link event (default 1m)",
    )
    p.add_argument(
        "--poll-burst",
        "--inventory-poll-burst",
        dest="poll_burst",
        type=positive_int,
        default=DEFAULT_POLL_BURST,
        help="scans that may run back to back before --min-poll-interval applies (default 5)",
    )
    p.add_argument(
        "--move-ib-interfaces",
        type=parse_bool,
        default=True,
        nargs="?",
        const=True,
        help="hand out IPoIB netdevs with their PCI device (true); false publishes such devices RDMA-only",
    )
    p.add_argument(
        "--metrics-port",
        type=service.port_number,
        default=DEFAULT_METRICS_PORT,
        help="HTTP port of the pod's endpoint: /metrics (all four services, with a `service` label), "
        f"/healthz, /readyz; 0: off (default {DEFAULT_METRICS_PORT}, as dranet)",
    )
    p.add_argument(
        "--metrics-address",
        type=service.ip_address,
        default=os.environ.get("DRANET_METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
        help="IP address of the --metrics-port endpoint (default: $DRANET_METRICS_ADDRESS, else "
        f"{DEFAULT_METRICS_ADDRESS}, every IPv4 address; :: for dual-stack)",
    )
    p.add_argument(
        "--store-socket",
        default="",
        help="the store's socket, read for PersistentResourceSliceAttributes (default <run-dir>/store.sock)",
    )
    features.add_flag(p)
    cloud_discovery.add_flags(p)
    return p


def _health(inventory: Inventory, publisher: Publisher | None) -> tuple[bool, str]:
    if not inventory.ready:
        return False, "first scan not done"
    if inventory.kept is not None and not inventory.kept.synced.is_set():
        why = inventory.kept.last_error or "not answering yet"
        return False, f"waiting for the store's kept devices (PersistentResourceSliceAttributes): {why}"
    if publisher is not None and not publisher.healthy:
        return False, f"ResourceSlices not published yet: {publisher.last_error or 'in progress'}"
    return True, ""


async def run(args: argparse.Namespace, device_filter: DeviceFilter | None, stop: asyncio.Event) -> None:
    """Wire and run the service until ``stop`` is set."""
    node = args.node_name
    rdma_mode = await asyncio.to_thread(read_netns_mode)
    api_client: Any = None
    if not args.no_publish:
        api_client = await make_api_client(args.kubeconfig)
    providers: Providers | None = None
    publisher: Publisher | None = None
    server: UdsServer | None = None
    tasks: list[asyncio.Task[None]] = []
    admin: AdminServicer | None = None
    collector: InventoryCollector | None = None
    probes: HealthListener | None = None
    endpoint: HttpEndpoint | None = None
    gates: features.FeatureGates = args.feature_gates
    store: StoreClient | None = None
    try:
        node_labels = None
        if api_client is not None:
            from services.inventory.cloud.coreweave import kube_node_labels

            node_labels = kube_node_labels(api_client, node)
        providers = await cloud_discovery.setup_providers(
            cloud_discovery.CloudOptions.from_args(args),
            host=HostProbe(sysfs_root=args.sysfs_root),
            node_name=node,
            node_labels=node_labels,
        )
        if api_client is not None:
            publisher = Publisher(SliceClient(api_client), node, resync=max(args.max_poll_interval, 1.0))
        pub = publisher

        def on_publish(devices: Sequence[Device]) -> None:
            if pub is not None:
                pub.set_devices([d.slice_entry() for d in devices])

        inventory = Inventory(
            InventoryConfig(
                sysfs_root=args.sysfs_root,
                dev_root=args.dev_root,
                pci_ids=args.pci_ids,
                move_ib_interfaces=args.move_ib_interfaces,
                min_poll_interval=args.min_poll_interval,
                max_poll_interval=args.max_poll_interval,
                poll_burst=args.poll_burst,
                list_numa_attributes=gates.list_type_attributes,
            ),
            providers=providers,
            device_filter=device_filter,
            on_publish=on_publish,
        )
        if gates.persistent_slice_attributes and publisher is not None:
            # Only the publish path merges kept devices: --no-publish needs no store.
            store = StoreClient(args.store_socket or service.socket_path(args.run_dir, "store"))
            inventory.kept = KeptDevices(store, on_change=inventory.republish)
            tasks.append(asyncio.create_task(inventory.kept.run(stop), name="kept-watch"))
        await inventory.start()
        servicer = InventoryServicer(
            inventory, node_name=node, rdma_netns_mode=rdma_mode, providers=providers, publisher=publisher
        )
        admin = AdminServicer(SERVICE, health=lambda: _health(inventory, publisher))
        server = (
            UdsServer(service.socket_path(args.run_dir, SERVICE)).add(servicer.register).add(admin.register)
        )
        collector = InventoryCollector(inventory, publisher)
        REGISTRY.register(collector)
        if publisher is not None:
            tasks.append(asyncio.create_task(publisher.run(stop), name="publisher"))
            tasks.append(asyncio.create_task(publisher.watch(stop), name="slice-watch"))
        tasks.append(asyncio.create_task(inventory.run(stop), name="rescan"))
        await server.start()
        probes = await service.start_health_listener(args, admin)
        if args.metrics_port:
            endpoint = await start_endpoint(args, admin)
        log.info(
            "inventory started",
            extra={
                "node": node,
                "socket": str(server.path),
                "rdma_netns_mode": rdma_mode,
                "cloud_provider": providers.cloud_name,
                "publish": publisher is not None,
                "filter": device_filter.expression if device_filter else "",
                "feature_gates": str(gates),
            },
        )
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({stopper, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        for t in done:
            if t is not stopper and t.exception() is not None:
                raise RuntimeError(f"{t.get_name()} task failed") from t.exception()
        log.info("stopping; ResourceSlices are left for the kubelet to clean up, as dranet does")
    finally:
        stop.set()
        if admin is not None:
            await admin.grpc_health.stopping()
        if endpoint is not None:
            await endpoint.stop()
        if server is not None:
            await server.stop()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if store is not None:
            await store.close()
        if providers is not None:
            await providers.close()
        if api_client is not None:
            await api_client.close()
        if collector is not None:
            REGISTRY.unregister(collector)
        await service.stop_health_listener(probes)


async def start_endpoint(args: argparse.Namespace, admin: AdminServicer) -> HttpEndpoint:
    """The pod's HTTP endpoint, started (FastAPI and uvicorn are imported only now)."""
    sockets = {name: service.socket_path(args.run_dir, name) for name in POD_SERVICES}
    endpoint = HttpEndpoint(Scraper(sockets, local=admin), args.metrics_address, args.metrics_port)
    await endpoint.start()
    return endpoint


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    service.apply_common(args)
    # As Kubernetes' nodeutil.GetHostname: node names are lower case.
    args.node_name = args.node_name.strip().lower()
    if not args.node_name:
        print("dranet-inventory: --node-name is empty and there is no hostname", file=sys.stderr)
        raise SystemExit(2)
    try:
        cloud_discovery.CloudOptions.from_args(args)
    except ValueError as exc:
        print(f"dranet-inventory: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    device_filter = None
    if args.filter.strip():
        try:
            device_filter = DeviceFilter(args.filter)
        except FilterError as exc:
            print(f"dranet-inventory: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    service.run(SERVICE, args.log_level, lambda stop: run(args, device_filter, stop))


if __name__ == "__main__":
    main()
