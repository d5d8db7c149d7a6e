"""Fixtures for the development control plane.

``api_server``    an in-process ``ApiServer`` on a free 127.0.0.1 port (its kubeconfig at
                  ``api_server.kubeconfig_path``); parametrize it indirectly with a dict of
                  ``ApiServer`` keyword arguments, e.g. ``{"history_size": 3}``.
``kube``          a kubernetes-asyncio ``ApiClient`` loaded from that kubeconfig, as our
                  services build theirs.
``kubectl``       runs the machine's kubectl against the server without blocking the loop.
``allocator``     a started ``AllocatorController`` on ``api_server`` whose caches have synced.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from services.devcluster.allocator import AllocatorController
from services.devcluster.apiserver import ApiServer


@pytest.fixture
async def api_server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ApiServer]:
    kwargs: dict[str, Any] = getattr(request, "param", {}) or {}
    async with ApiServer(str(tmp_path / "apiserver"), **kwargs) as api:
        yield api


@pytest.fixture
async def kube(api_server: ApiServer) -> AsyncIterator[client.ApiClient]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=api_server.kubeconfig_path, client_configuration=cfg)
    async with client.ApiClient(cfg) as api:
        yield api


@pytest.fixture
async def allocator(api_server: ApiServer) -> AsyncIterator[AllocatorController]:
    controller = await AllocatorController.from_kubeconfig(api_server.kubeconfig_path, resync_seconds=5.0)
    async with controller:
        async with asyncio.timeout(10):
            await controller.wait_synced()
        yield controller


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


KubectlFn = Callable[..., Awaitable[Run]]


@pytest.fixture
def kubectl(api_server: ApiServer, tmp_path: Path) -> KubectlFn:
    """``await kubectl("get", "pods", stdin=None)``; skips when no kubectl is installed."""
    binary = os.environ.get("KUBECTL") or shutil.which("kubectl")
    if binary is None:
        pytest.skip("kubectl is not installed")
    cache = tmp_path / "kubectl-cache"
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)

    async def run(*args: str, stdin: str | None = None, limit: float = 60) -> Run:
        proc = await asyncio.create_subprocess_exec(
            binary,
            "--kubeconfig",
            api_server.kubeconfig_path,
            "--cache-dir",
            str(cache),
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "HOME": str(home)},
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), limit
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        return Run(proc.returncode or 0, out.decode(), err.decode())

    return run
