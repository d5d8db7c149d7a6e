"""Fixtures: a throw-away network namespace and the inventory running inside it."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client

from dev.cluster.procs import ServiceProcess
from tests.integration.inventory.helpers import Cluster, StartInventory, api_link, ip


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


@pytest.fixture
async def cluster(netns: str, workdir: Path) -> AsyncIterator[Cluster]:
    """The API server with Node node-a in it."""
    c = Cluster(workdir / "api", api_link(netns))
    await c.start()
    try:
        await client.CoreV1Api(c.client).create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}
        )
        yield c
    finally:
        await c.client.close()
        await c.stop()
