"""dranet-prepare: the kubelet DRA plugin (registration + DRAPlugin v1/v1beta1)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from pathlib import Path

from services.prepare.dhcp import DEFAULT_TIMEOUT_S, DhcpClient
from services.prepare.inventory_client import InventoryClient
from services.prepare.kube import Kube
from services.prepare.pipeline import Preparer
from services.prepare.plugin import DraService, DraV1, DraV1beta1, Registration
from services.prepare.prefetch import ClaimPrefetch
from services.prepare.status import ClaimStatusWriter
from shared import features, service
from shared.admin import AdminServicer
from shared.rpc import UdsServer
from shared.storeclient import StoreClient

log = logging.getLogger("services.prepare")

DRIVER = "dra.net"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = service.base_parser("prepare", "kubelet DRA plugin for dra.net: prepares and unprepares claims")
    p.add_argument("--driver-name", default=DRIVER)
    p.add_argument(
        "--node-name",
        "--hostname-override",
        dest="node_name",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="the Node whose claims this plugin prepares (default: $NODE_NAME, else the hostname)",
    )
    p.add_argument(
        "--kubelet-root-dir",
        default=os.environ.get("KUBELET_ROOT_DIR", "/var/lib/kubelet"),
        help="the kubelet's root dir; sockets go to <root>/plugins_registry and <root>/plugins/<driver>",
    )
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""), help="empty: in-cluster config")
    p.add_argument("--store-socket", default="", help="default <run-dir>/store.sock")
    p.add_argument("--inventory-socket", default="", help="default <run-dir>/inventory.sock")
    p.add_argument(
        "--no-attach-gate",
        action="store_true",
        help="prepare even when the attach service is not connected to the runtime (tests only)",
    )
    p.add_argument(
        "--device-netns",
        default=os.environ.get("DRANET_DEVICE_NETNS", ""),
        help="the network namespace (a path, e.g. /var/run/netns/node) holding the devices the "
        "inventory publishes, where interface.dhcp leases are taken; empty: prepare's own "
        "(the DaemonSet pod is hostNetwork)",
    )
    p.add_argument(
        "--dhcp-timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds one DHCP exchange (interface.dhcp) may take before the claim fails (dranet: 5)",
    )
    # PersistentResourceSliceAttributes: prepare saves the kept devices (the inventory
    # publishes them); DRAListTypeAttributes changes nothing here but is accepted, so one
    # value serves every container.
    p.add_argument(
        "--no-claim-prefetch",
        action="store_true",
        help="do not watch the node's Pods to read their claims (and the inventory's view of "
        "their devices) ahead of the kubelet's call (then every claim is read when prepared; "
        "the Pod waits for that GET and that lookup)",
    )
    features.add_flag(p)
    return p.parse_args(argv)


async def serve(args: argparse.Namespace, stop: asyncio.Event) -> None:
    run_dir = args.run_dir
    kube = Kube(args.kubeconfig or None, field_manager=args.driver_name, driver=args.driver_name)
    await kube.start()
    store = StoreClient(args.store_socket or service.socket_path(run_dir, "store"))
    inventory = InventoryClient(args.inventory_socket or service.socket_path(run_dir, "inventory"))
    prefetch = (
        None
        if args.no_claim_prefetch
        else ClaimPrefetch(kube, args.node_name, read_device=inventory.get_device, driver=args.driver_name)
    )
    status = ClaimStatusWriter(store, kube, args.driver_name)
    preparer = Preparer(
        args.driver_name,
        args.node_name,
        kube,
        inventory,
        store,
        require_attach=not args.no_attach_gate,
        dhcp=DhcpClient(args.device_netns or None, args.dhcp_timeout),
        keep_devices=args.feature_gates.persistent_slice_attributes,
        prefetch=prefetch,
        liveness=lambda: status.attach,
    )
    root = Path(args.kubelet_root_dir)
    dra_socket = root / "plugins" / args.driver_name / "dra.sock"
    reg_socket = root / "plugins_registry" / f"{args.driver_name}-reg.sock"

    registration = Registration(args.driver_name, str(dra_socket))
    dra = DraService(preparer)
    dra_server = UdsServer(dra_socket).add(DraV1(dra).register).add(DraV1beta1(dra).register)
    reg_server = UdsServer(reg_socket).add(registration.register)

    def health() -> tuple[bool, str]:
        if not registration.registered.is_set():
            return False, registration.last_error or "not registered with the kubelet yet"
        return True, ""

    admin_servicer = AdminServicer("prepare", health)
    admin = UdsServer(service.socket_path(run_dir, "prepare")).add(admin_servicer.register)
    status_task = asyncio.create_task(status.run(stop))
    prefetch_task = asyncio.create_task(prefetch.run(stop)) if prefetch is not None else None
    await admin.start()
    probes = await service.start_health_listener(args, admin_servicer)
    # The DRA socket first: the kubelet dials it as soon as it sees the registration.
    await dra_server.start()
    await reg_server.start()
    log.info(
        "prepare ready",
        extra={
            "node": args.node_name,
            "dra_socket": str(dra_socket),
            "registration_socket": str(reg_socket),
            "feature_gates": str(args.feature_gates),
        },
    )
    await stop.wait()
    # Graceful stop, step 1: no new Prepare calls. Removing the registration
    # socket makes the kubelet deregister the plugin.
    log.info("prepare stopping")
    await admin_servicer.grpc_health.stopping()
    await reg_server.stop(grace=0)
    await dra_server.stop(grace=10.0)
    for task in (status_task, prefetch_task):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    await admin.stop(grace=0)
    await store.close()
    await inventory.close()
    await kube.close()
    await service.stop_health_listener(probes)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    service.apply_common(args)
    # As the inventory (and Kubernetes' nodeutil.GetHostname): node names are lower case, so
    # the pool prepare checks claims against is the one the inventory publishes.
    args.node_name = args.node_name.strip().lower()
    service.run("prepare", args.log_level, lambda stop: serve(args, stop))


if __name__ == "__main__":
    main()
