"""``ApiServer``: the development control plane's Kubernetes API server, run in-process.

    async with ApiServer(state_dir) as api:
        api.url, api.kubeconfig_path

Plain HTTP on 127.0.0.1 (kubectl and kubernetes-asyncio both accept an ``http://`` server in
a kubeconfig, so no certificates are needed). The state lives in memory; with
``state_file`` it is loaded at start and written back (atomically) shortly after every
change and at stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import uvicorn
import yaml  # type: ignore[import-untyped, unused-ignore]

from .app import ApiApp, ServerConfig
from .registry import Registry
from .schema import DEFAULT_SCHEMA_VERSION, load
from .store import Storage

log = logging.getLogger(__name__)

KUBE_VERSION = "v1.34.0+devcluster"
SAVE_DELAY = 0.2


class _Server(uvicorn.Server):
    # The embedding process owns signal handling (pytest, the devcluster runner).
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _read_state(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        state: dict[str, Any] = json.load(f)
    return state


class ApiServer:
    """A Kubernetes API server test double serving on 127.0.0.1."""

    def __init__(
        self,
        state_dir: str,
        *,
        port: int = 0,
        state_file: str | None = None,
        history_size: int = 1000,
        bookmark_interval: float = 60.0,
        default_field_validation: str = "Strict",
        schema_version: str = DEFAULT_SCHEMA_VERSION,
        host: str = "127.0.0.1",
    ) -> None:
        self.state_dir = state_dir
        self.port = port
        self.host = host
        self.state_file = state_file
        self.schema_version = schema_version
        self.storage = Storage(history_size=history_size, on_change=self._changed)
        self.registry: Registry | None = None
        self._bookmark_interval = bookmark_interval
        self._default_field_validation = default_field_validation
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._save_handle: asyncio.TimerHandle | None = None
        self._sock: socket.socket | None = None
        self.url = ""
        self.kubeconfig_path = os.path.join(state_dir, "kubeconfig")

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        os.makedirs(self.state_dir, exist_ok=True)
        schemas = await asyncio.to_thread(load, self.schema_version)
        self.registry = Registry(self.storage, schemas)
        state = await asyncio.to_thread(_read_state, self.state_file) if self.state_file else None
        if state is not None:
            self.storage.load(state)
            log.info("state loaded", extra={"path": self.state_file, "resourceVersion": self.storage.rv})
        self.registry.ensure_system_namespaces()

        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only
        # when the listening socket's proto says TCP. With proto 0, Nagle and the
        # client's delayed ACK held every keep-alive response back by 40 ms.
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((self.host, self.port))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        config = ServerConfig(
            kube_version=KUBE_VERSION,
            schema_version=self.schema_version,
            bookmark_interval=self._bookmark_interval,
            default_field_validation=self._default_field_validation,
            address=f"{self.host}:{self.port}",
        )
        app = ApiApp(self.registry, self.storage, config).app
        uv_config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            loop="none",
        )
        self._server = _Server(uv_config)
        self._task = asyncio.create_task(
            self._server.serve(sockets=[self._sock]), name="devcluster-apiserver"
        )
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("API server stopped during start-up")
            await asyncio.sleep(0.005)
        self._write_kubeconfig()
        log.info("API server ready", extra={"url": self.url, "kubeconfig": self.kubeconfig_path})

    async def stop(self) -> None:
        self.storage.close_watchers()
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 10)
            except TimeoutError:
                self._task.cancel()
            self._task = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._save_handle is not None:
            self._save_handle.cancel()
            self._save_handle = None
        self.save()

    # -- state ------------------------------------------------------------------------------

    def _changed(self) -> None:
        if not self.state_file or self._save_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._save_handle = loop.call_later(SAVE_DELAY, self._save_soon)

    def _save_soon(self) -> None:
        self._save_handle = None
        try:
            self.save()
        except OSError:
            log.exception("saving the API server state failed", extra={"path": self.state_file})

    def save(self) -> None:
        """Write the state file now (no-op without one)."""
        if self.state_file:
            self.storage.save_file(self.state_file)

    # -- kubeconfig -------------------------------------------------------------------------

    def kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "devcluster", "cluster": {"server": self.url}}],
            "users": [{"name": "devcluster-admin", "user": {}}],
            "contexts": [
                {
                    "name": "devcluster",
                    "context": {"cluster": "devcluster", "user": "devcluster-admin", "namespace": "default"},
                }
            ],
            "current-context": "devcluster",
            "preferences": {},
        }

    def _write_kubeconfig(self) -> None:
        tmp = self.kubeconfig_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.kubeconfig(), f, sort_keys=False)
        os.replace(tmp, self.kubeconfig_path)
