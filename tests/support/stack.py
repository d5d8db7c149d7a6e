"""One dev-cluster node for end-to-end tests.

A network namespace stands in for the node (its NICs are veth links the test
adds), the development control plane runs in the test process (API server
double reachable from inside the namespace, allocator, the kubelet's plugin
manager), and dranet's services run as real processes: the store, the inventory
inside the node namespace, prepare on the node's kubelet directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from proto.dranet.store.v1 import store_pb2 as st
from services.devcluster.allocator import AllocatorController
from services.devcluster.apiserver import ApiServer
from services.devcluster.kubelet_plugins import ClaimRef, DraPlugin, PluginManager
from shared.storeclient import StoreClient
from tests.support.procs import ServiceProcess

DRIVER = "dra.net"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(args), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {res.stderr.strip()}")
    return res


def api_link(ns: str) -> str:
    """A veth from the host into ``ns``; the host end's address, on which an API
    server here is reachable from inside ``ns``."""
    a, b = secrets.randbelow(250) + 1, secrets.randbelow(63) * 4
    host, peer = f"169.254.{a}.{b + 1}", f"169.254.{a}.{b + 2}"
    name = f"api-{secrets.token_hex(3)}"
    sh("ip", "link", "add", name, "type", "veth", "peer", "name", "apilink", "netns", ns)
    sh("ip", "addr", "add", f"{host}/30", "dev", name)
    sh("ip", "link", "set", name, "up")
    sh("ip", "-n", ns, "addr", "add", f"{peer}/30", "dev", "apilink")
    sh("ip", "-n", ns, "link", "set", "apilink", "up")
    return host


async def wait_for(
    pred: Callable[[], Awaitable[bool]], within: float = 15.0, what: str = "condition"
) -> None:
    deadline = time.monotonic() + within
    while True:
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within}s")
        await asyncio.sleep(0.05)


def claim_refs(claims: Sequence[dict[str, Any]]) -> list[ClaimRef]:
    return [
        ClaimRef(namespace=c["metadata"]["namespace"], name=c["metadata"]["name"], uid=c["metadata"]["uid"])
        for c in claims
    ]


async def bounded(what: str, step: Awaitable[Any], within: float = 20.0) -> None:
    """Await a teardown step for at most ``within`` seconds; say so if it hangs."""
    try:
        await asyncio.wait_for(step, within)
    except TimeoutError:
        print(f"teardown: {what} did not stop within {within}s; going on", flush=True)


class NodeStack:
    """See the module docstring. ``async with NodeStack(...) as node:``."""

    def __init__(
        self,
        node_name: str = "node-a",
        inventory_args: Sequence[str] = (),
        prepare_args: Sequence[str] = (),
        allocator: bool = True,
    ) -> None:
        self.node_name = node_name
        self.inventory_args = list(inventory_args)
        self.prepare_args = list(prepare_args)
        self.with_allocator = allocator
        # Short: Unix socket paths must stay under 108 bytes.
        self.workdir = Path(tempfile.mkdtemp(prefix="e2e-"))
        self.run_dir = self.workdir / "run"
        self.kubelet_dir = self.workdir / "kubelet"
        self.netns = f"node-{secrets.token_hex(3)}"
        self.api: ApiServer | None = None
        self.host_ip = ""
        self.kube: client.ApiClient | None = None
        self.core: Any = None
        self.resource: Any = None
        self.allocator: AllocatorController | None = None
        self.plugins: PluginManager | None = None
        self.store: StoreClient | None = None
        self.procs: dict[str, ServiceProcess] = {}
        self._liveness: asyncio.Task[None] | None = None

    # --- life cycle -----------------------------------------------------------------------

    async def __aenter__(self) -> NodeStack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def setup_namespace(self) -> str:
        """Create the node namespace and its link to the host; returns the host-side
        address (where servers the node must reach listen). Idempotent; ``start``
        calls it, tests that need the address earlier call it first."""
        if not self.host_ip:
            sh("ip", "netns", "add", self.netns)
            sh("ip", "-n", self.netns, "link", "set", "lo", "up")
            self.host_ip = api_link(self.netns)
        return self.host_ip

    async def start(self) -> None:
        self.setup_namespace()
        self.api = ApiServer(str(self.workdir / "api"), host=self.host_ip)
        await self.api.start()
        cfg = client.Configuration()
        await config.load_kube_config(config_file=self.api.kubeconfig_path, client_configuration=cfg)
        self.kube = client.ApiClient(configuration=cfg)
        self.core = client.CoreV1Api(self.kube)
        self.resource = client.ResourceV1Api(self.kube)
        await self.core.create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.node_name}}
        )
        # Started from a worker thread: a fake server the service must reach at
        # start-up (a webhook, a metadata server) runs on this event loop.
        self.procs["store"] = await asyncio.to_thread(
            self._proc(
                "store", ["--db-dir", str(self.workdir / "store"), "--run-dir", str(self.run_dir)]
            ).start
        )
        self.store = StoreClient(self.run_dir / "store.sock")
        self.procs["inventory"] = self._proc(
            "inventory",
            [
                "--run-dir",
                str(self.run_dir),
                "--node-name",
                self.node_name,
                "--kubeconfig",
                self.api.kubeconfig_path,
                "--min-poll-interval",
                "200ms",
                *self.inventory_args,
            ],
            netns=self.netns,
        )
        await asyncio.to_thread(self.procs["inventory"].start)
        self.procs["prepare"] = self._proc(
            "prepare",
            [
                "--run-dir",
                str(self.run_dir),
                "--node-name",
                self.node_name,
                "--kubeconfig",
                self.api.kubeconfig_path,
                "--kubelet-root-dir",
                str(self.kubelet_dir),
                *self.prepare_args,
            ],
        ).start()
        if self.with_allocator:
            self.allocator = await AllocatorController.from_kubeconfig(self.api.kubeconfig_path)
            await self.allocator.start()
        self.plugins = PluginManager(self.kubelet_dir / "plugins_registry", poll_interval=0.05)
        await self.plugins.start()

    def _proc(self, name: str, args: list[str], netns: str | None = None) -> ServiceProcess:
        return ServiceProcess(
            f"services.{name}",
            [*args, "--log-level", "DEBUG"],
            socket=self.run_dir / f"{name}.sock",
            log_path=self.workdir / f"{name}.log",
            netns=netns,
        )

    async def stop(self) -> None:
        # Every step is bounded: a teardown that hangs must not hang the run.
        await bounded("attach liveness", self.stop_attach_liveness())
        if self.plugins is not None:
            await bounded("plugin manager", self.plugins.stop())
        if self.allocator is not None:
            await bounded("allocator", self.allocator.stop())
        for proc in reversed(list(self.procs.values())):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(proc.stop)
        if self.store is not None:
            await bounded("store client", self.store.close())
        if self.kube is not None:
            await bounded("API client", self.kube.close())
        if self.api is not None:
            await bounded("API server", self.api.stop())
        sh("ip", "netns", "del", self.netns, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(f"--- {n} ---\n{p.log()[-6000:]}" for n, p in self.procs.items())

    # --- the node's NICs ----------------------------------------------------------------

    def add_nic(
        self,
        name: str,
        mac: str | None = None,
        addresses: Sequence[str] = (),
        mtu: int | None = None,
        up: bool = True,
    ) -> str:
        """A veth in the node namespace standing in for a NIC; its peer stays in the
        host namespace (named like the NIC with a ``p`` prefix) so the test can
        reach it. Returns the peer's name."""
        peer = f"p{secrets.token_hex(3)}"
        sh("ip", "link", "add", peer, "type", "veth", "peer", "name", name, "netns", self.netns)
        if mac:
            sh("ip", "-n", self.netns, "link", "set", name, "address", mac)
        if mtu:
            sh("ip", "-n", self.netns, "link", "set", name, "mtu", str(mtu))
        for a in addresses:
            sh("ip", "-n", self.netns, "addr", "add", a, "dev", name)
        if up:
            sh("ip", "-n", self.netns, "link", "set", name, "up")
            sh("ip", "link", "set", peer, "up")
        return peer

    def ip(self, *args: str) -> str:
        return sh("ip", "-n", self.netns, *args).stdout

    async def published(self) -> dict[str, dict[str, Any]]:
        resp = await self.resource.list_resource_slice(field_selector=f"spec.nodeName={self.node_name}")
        return {d.name: d.to_dict() for s in resp.items for d in (s.spec.devices or [])}

    async def wait_published(self, *devices: str, within: float = 15.0) -> None:
        async def ready() -> bool:
            return set(devices) <= set(await self.published())

        await wait_for(ready, within, f"devices {devices} published")

    # --- the attach service's liveness (prepare's safety gate) ---------------------------

    async def hold_attach_liveness(self, connected: bool = True, draining: bool = False) -> None:
        """Stand in for a connected attach service (prepare tests have no runtime)."""
        await self.stop_attach_liveness()
        assert self.store is not None
        report = st.LivenessReport(
            connected=connected,
            draining=draining,
            runtime_name="test",
            instance=f"test-{secrets.token_hex(2)}",
        )
        hold = asyncio.Event()

        async def reports() -> Any:
            yield report
            await hold.wait()

        self._liveness = asyncio.create_task(self.store.hold_liveness(reports()))
        store = self.store

        async def seen() -> bool:
            live = await store.get_liveness()
            return live.instance == report.instance

        await wait_for(seen, 5, "attach liveness reported")

    async def stop_attach_liveness(self) -> None:
        if self._liveness is not None:
            self._liveness.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._liveness
            self._liveness = None

    # --- the kubelet's side --------------------------------------------------------------

    async def plugin(self, within: float = 15.0) -> DraPlugin:
        assert self.plugins is not None
        return await self.plugins.wait_for_plugin(DRIVER, within)

    async def restart_prepare(self, kill: bool = True, within: float = 20.0) -> None:
        """SIGKILL (or stop) prepare, start it again, and wait until the kubelet's
        plugin manager registered the new instance (calls on the old one would be
        cut when it is replaced)."""
        old = await self.plugin()
        proc = self.procs["prepare"]
        if kill:
            proc.kill()
        else:
            proc.stop()
        await asyncio.to_thread(proc.start)
        assert self.plugins is not None
        plugins = self.plugins

        async def replaced() -> bool:
            current = plugins.get(DRIVER)
            return current is not None and current is not old

        await wait_for(replaced, within, "prepare registered again")

    async def prepare(self, *claims: dict[str, Any]) -> dict[str, Any]:
        """NodePrepareResources for these claim objects, as the kubelet calls it."""
        return await (await self.plugin()).node_prepare_resources(claim_refs(claims))

    async def unprepare(self, *claims: dict[str, Any]) -> dict[str, str]:
        return await (await self.plugin()).node_unprepare_resources(claim_refs(claims))

    # --- objects ----------------------------------------------------------------------

    async def device_class(self, name: str, selector: str, config: dict[str, Any] | None = None) -> None:
        spec: dict[str, Any] = {"selectors": [{"cel": {"expression": selector}}]}
        if config is not None:
            spec["config"] = [{"opaque": {"driver": DRIVER, "parameters": config}}]
        await self.resource.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": spec,
            }
        )

    async def claim_for_pod(
        self,
        name: str,
        device_class: str,
        selector: str | None = None,
        configs: Sequence[dict[str, Any]] = (),
        namespace: str = "default",
        request: str = "nic",
    ) -> dict[str, Any]:
        """A claim and a pod using it; returns the claim once allocated and reserved."""
        exactly: dict[str, Any] = {"deviceClassName": device_class}
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]
        spec: dict[str, Any] = {"devices": {"requests": [{"name": request, "exactly": exactly}]}}
        if configs:
            spec["devices"]["config"] = [
                {
                    "requests": c.get("requests", []),
                    "opaque": {"driver": DRIVER, "parameters": c["parameters"]},
                }
                for c in configs
            ]
        await self.resource.create_namespaced_resource_claim(
            namespace,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": spec,
            },
        )
        await self.core.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-pod"},
                "spec": {
                    "containers": [{"name": "c", "image": "local/pause:1"}],
                    "resourceClaims": [{"name": "net", "resourceClaimName": name}],
                },
            },
        )
        return await self.wait_reserved(name, namespace)

    async def wait_reserved(
        self, name: str, namespace: str = "default", within: float = 15.0
    ) -> dict[str, Any]:
        found: dict[str, Any] = {}

        async def reserved() -> bool:
            resp = await self.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
            import json

            obj = json.loads(await resp.read())
            found.update(obj)
            status = obj.get("status") or {}
            return bool(status.get("allocation") and status.get("reservedFor"))

        await wait_for(reserved, within, f"claim {namespace}/{name} allocated and reserved")
        return found
