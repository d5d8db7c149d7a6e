"""Fixtures: a throw-away network namespace and the inventory running inside it."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from proto.dranet.inventory.v1 import inventory_pb2 as pb
from proto.dranet.inventory.v1 import inventory_pb2_grpc
from tests.support.procs import ServiceProcess


def ip(ns: str, *args: str) -> None:
    """``ip -n ns ARGS``, failing the test with ip's message."""
    res = subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise AssertionError(f"ip -n {ns} {' '.join(args)}: {res.stderr.strip()}")


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"inv-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ip(name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory (Unix socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="inv-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


StartInventory = Callable[..., ServiceProcess]


@pytest.fixture
def start_inventory(workdir: Path) -> Iterator[StartInventory]:
    """Start ``python -m services.inventory`` in a netns; stopped (SIGTERM) after the test."""
    procs: list[ServiceProcess] = []

    def start(ns: str, *args: str, publish: bool = False) -> ServiceProcess:
        run = workdir / "run"
        base = ["--run-dir", str(run), "--node-name", "node-a", "--cloud-provider-hint", "NONE"]
        base += ["--min-poll-interval", "200ms", "--log-level", "DEBUG"]
        if not publish:
            base.append("--no-publish")
        proc = ServiceProcess(
            "services.inventory",
            [*base, *args],
            socket=run / "inventory.sock",
            log_path=workdir / f"inventory-{len(procs)}.log",
            netns=ns,
        )
        procs.append(proc)
        return proc.start()

    try:
        yield start
    finally:
        for p in procs:
            p.stop()


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


def grpc_code(exc: BaseException) -> grpc.StatusCode | None:
    return exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
