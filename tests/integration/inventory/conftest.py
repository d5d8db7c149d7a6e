"""Fixtures: a throw-away network namespace, the inventory running inside it, and a Node of
the session's real cluster (``kube_cluster``) reachable from inside it."""

from __future__ import annotations

import secrets
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dev.cluster.kube import KubeCluster
from dev.cluster.procs import ServiceProcess
from tests.integration.inventory.helpers import Cluster, StartInventory, ip


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

    def start(ns: str, *args: str, publish: bool = False, node: str = "node-a") -> ServiceProcess:
        run = workdir / "run"
        base = ["--run-dir", str(run), "--node-name", node, "--cloud-provider-hint", "NONE"]
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
        return proc.start(timeout=60)

    try:
        yield start
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="session")
def inventory_kubeconfig(kube_cluster: KubeCluster) -> Path:
    """The identity the inventory has in production: ServiceAccount dranet-inventory bound to
    the chart's ClusterRole (a missing permission shows as a failed publish)."""
    return kube_cluster.service_identity("inventory")


@pytest.fixture
async def cluster(
    netns: str, kube_cluster: KubeCluster, inventory_kubeconfig: Path
) -> AsyncIterator[Cluster]:
    """A Node of its own (``cluster.node``, unique per test) on the session's cluster, whose
    API server the namespace reaches; the node's slices watched from before the test starts.
    Afterwards its slices and the Node are deleted and the API server is running."""
    kube_cluster.net.link(netns)
    c = Cluster(kube_cluster, f"inv-{secrets.token_hex(4)}", inventory_kubeconfig)
    await c.start()
    try:
        yield c
    finally:
        await c.close()
