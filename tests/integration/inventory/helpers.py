"""Helpers the inventory integration tests and tests/bench/inventory.py share:
links in a namespace, the devcluster API server reachable from inside it, polling."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config

from dev.cluster.procs import ServiceProcess
from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc

# start_inventory(ns, *flags, publish=False) -> the started process (a fixture in conftest).
StartInventory = Callable[..., ServiceProcess]


def ip(ns: str, *args: str) -> None:
    """``ip -n ns ARGS``, failing the test with ip's message."""
    res = subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"ip -n {ns} {' '.join(args)}: {res.stderr.strip()}")


def api_link(ns: str) -> str:
    """A veth from this namespace into ``ns`` so the inventory inside reaches an API
    server listening here; returns the address to listen on. Deleting ``ns``
    deletes the pair."""
    a, b = secrets.randbelow(250) + 1, secrets.randbelow(63) * 4
    host, peer = f"169.254.{a}.{b + 1}", f"169.254.{a}.{b + 2}"
    name = f"api-{secrets.token_hex(3)}"
    res = subprocess.run(
        ["ip", "link", "add", name, "type", "veth", "peer", "name", "apilink", "netns", ns],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        raise AssertionError(f"ip link add {name}: {res.stderr.strip()}")
    subprocess.run(["ip", "addr", "add", f"{host}/30", "dev", name], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    ip(ns, "addr", "add", f"{peer}/30", "dev", "apilink")
    ip(ns, "link", "set", "apilink", "up")
    return host


class Cluster:
    """The devcluster API server, reachable from inside the test namespace, with
    every write to it counted by resource."""

    def __init__(self, state_dir: Path, host: str) -> None:
        from services.devcluster.apiserver import ApiServer

        self.state_dir = state_dir
        self.host = host
        self.writes: Counter[str] = Counter()
        self.api = ApiServer(str(state_dir), host=host, state_file=str(state_dir / "state.json"))
        self.client: Any = None

    def _count(self, plural: str, ev: Any) -> None:
        self.writes[plural] += 1

    async def start(self) -> None:
        await self.api.start()
        self.api.storage.listeners.append(self._count)
        if self.client is None:
            cfg = client.Configuration()
            await config.load_kube_config(config_file=self.api.kubeconfig_path, client_configuration=cfg)
            self.client = client.ApiClient(configuration=cfg)

    async def stop(self) -> None:
        await self.api.stop()

    async def restart(self) -> None:
        """A new server process-alike on the same address and saved state."""
        from services.devcluster.apiserver import ApiServer

        port = self.api.port
        self.api = ApiServer(
            str(self.state_dir), host=self.host, port=port, state_file=str(self.state_dir / "state.json")
        )
        await self.start()

    @property
    def kubeconfig(self) -> str:
        return self.api.kubeconfig_path

    def slices(self) -> list[dict[str, Any]]:
        return [obj for _key, obj in self.api.storage.items("resourceslices")]

    def published(self) -> dict[str, dict[str, Any]]:
        """Device name -> device dict over every slice."""
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices", [])}

    @property
    def slice_writes(self) -> int:
        return self.writes["resourceslices"]


async def wait_devices(
    stub: inventory_pb2_grpc.InventoryStub,
    pred: Callable[[dict[str, pb.Device]], bool],
    within: float = 10.0,
) -> dict[str, pb.Device]:
    """Poll ListDevices until ``pred`` holds for the devices by name."""
    deadline = time.monotonic() + within
    devices: dict[str, pb.Device] = {}
    while time.monotonic() < deadline:
        resp = await stub.ListDevices(pb.ListDevicesRequest())
        devices = {d.name: d for d in resp.devices}
        if pred(devices):
            return devices
        await asyncio.sleep(0.1)
    raise AssertionError(f"devices never matched; last seen: {sorted(devices)}")


def values(device: pb.Device) -> dict[str, object]:
    """A device's attributes as plain values."""
    out: dict[str, object] = {}
    for k, a in device.attributes.items():
        out[k] = getattr(a, a.WhichOneof("value"))
    return out


async def wait_for(pred: Callable[[], bool], within: float = 10.0, what: str = "condition") -> float:
    """Poll ``pred`` until true; the seconds it took. AssertionError after ``within``."""
    start = time.monotonic()
    while time.monotonic() - start < within:
        if pred():
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} not reached within {within}s")
