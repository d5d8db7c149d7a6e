"""grpc.health.v1 for every dranet service, answered from its dranet.admin.v1 health check.

Each service serves the standard Health service on its Unix socket (next to
dranet.admin.v1) and, for the kubelet's native gRPC probes, on a TCP listener of
its own (``--health-address``/``--health-port``) that serves nothing else: the
admin API (log levels) never leaves the Unix socket.

Status names:

- ``""`` and ``dranet.<service>`` (``dranet.store``, ``dranet.inventory``,
  ``dranet.prepare``, ``dranet.attach``): readiness, SERVING exactly when the
  service's health check (the one dranet.admin.v1 Health reports) says ready;
  NOT_SERVING from the start of a graceful stop;
- ``liveness``: SERVING whenever the process's event loop answers, so a
  liveness probe restarts a wedged process but never one that is merely not
  ready (attach waiting for NRI, prepare not registered yet, attach draining);
- any other name: NOT_FOUND.

Check reads the health check at the time of the call, so it is never stale; for
Watch streams the check is re-read every ``watch_refresh_s`` while a stream is
open.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

log = logging.getLogger(__name__)

HealthCheck = Callable[[], tuple[bool, str]]

LIVENESS = "liveness"
OVERALL = ""
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Defaults of --health-port, one per container of the pod (hostNetwork: they share the node's ports).
DEFAULT_PORTS = {"store": 9181, "inventory": 9182, "prepare": 9183, "attach": 9184}
DEFAULT_ADDRESS = "127.0.0.1"


def readiness_name(service: str) -> str:
    """The service's own status name, e.g. "dranet.store"."""
    return f"dranet.{service}"


class Health(health_aio.HealthServicer):
    """grpc.health.v1 whose readiness names follow ``check``."""

    def __init__(self, service: str, check: HealthCheck, watch_refresh_s: float = 1.0) -> None:
        super().__init__()
        self.service = service
        self.check = check
        self.names = (OVERALL, readiness_name(service))
        self.watch_refresh_s = watch_refresh_s
        self._ready: bool | None = None
        self._stopping = False
        self._watchers = 0
        self._refresher: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Read the health check and publish it under the readiness names."""
        if self._stopping:
            return
        try:
            ready = bool(self.check()[0])
        except Exception:
            log.exception("health check failed", extra={"service": self.service})
            ready = False
        if ready == self._ready:
            return
        if self._ready is None:
            await self.set(LIVENESS, SERVING)
        self._ready = ready
        for name in self.names:
            await self.set(name, SERVING if ready else NOT_SERVING)

    async def stopping(self) -> None:
        """Graceful stop: readiness NOT_SERVING from now on; liveness stays SERVING
        while the process is still working (attach drains for minutes)."""
        await self.refresh()
        self._stopping = True
        self._ready = False
        for name in self.names:
            await self.set(name, NOT_SERVING)

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        await self.refresh()
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        await self.refresh()
        self._watchers += 1
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_loop(), name="health-refresh")
        try:
            await super().Watch(request, context)
        finally:
            self._watchers -= 1
            if not self._watchers and self._refresher is not None:
                self._refresher.cancel()
                self._refresher = None

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.watch_refresh_s)
            await self.refresh()

    def register(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self, server)


def parse_address(text: str) -> str:
    """An IP address for --health-address (the kubelet probes an IP, never a name)."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None


def host_port(address: str, port: int) -> str:
    """``address:port`` as gRPC and URLs write it (IPv6 in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def can_bind(address: str, port: int) -> OSError | None:
    """None if ``address:port`` can be bound now, else why not. Checked before gRPC binds,
    whose own failure is a bare RuntimeError and a line of C-core noise on stderr."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
        try:
            s.bind((address, port))
        except OSError as exc:
            return exc
    return None


class HealthListener:
    """grpc.health.v1 alone on a TCP ``address:port``, for the kubelet's gRPC probes.

    A port that is taken (a previous instance still draining during a rolling
    update, another process) does not stop the service: the failure is logged and
    the bind retried every ``retry_s`` until it succeeds, as the probe port is worth
    less than the service behind it.
    """

    def __init__(self, health: Health, address: str, port: int, retry_s: float = 10.0) -> None:
        self.health = health
        self.address = address
        self.port = port
        self.retry_s = retry_s
        self.server: grpc.aio.Server | None = None
        self._retry: asyncio.Task[None] | None = None

    @property
    def target(self) -> str:
        return host_port(self.address, self.port)

    async def start(self) -> None:
        """Bind and serve now, or keep trying in the background."""
        if not await self._try_start(first=True):
            self._retry = asyncio.create_task(self._retry_loop(), name="health-listener-bind")

    async def _try_start(self, first: bool) -> bool:
        err = can_bind(self.address, self.port)
        server: grpc.aio.Server | None = None
        if err is None:
            # No SO_REUSEPORT: a second process on the same port must fail, not share
            # the probes of the first.
            server = grpc.aio.server(options=(("grpc.so_reuseport", 0),))
            self.health.register(server)
            try:
                server.add_insecure_port(self.target)
            except RuntimeError as exc:
                err = OSError(errno.EADDRINUSE, str(exc))
                server = None
        if server is None:
            level = logging.ERROR if first else logging.DEBUG
            log.log(
                level,
                "cannot listen for gRPC health probes on %s: %s; the service runs on, retrying every %ss",
                self.target,
                err,
                self.retry_s,
                extra={"health_address": self.target},
            )
            return False
        await server.start()
        self.server = server
        log.info("serving grpc.health.v1", extra={"health_address": self.target})
        return True

    async def _retry_loop(self) -> None:
        while True:
            await asyncio.sleep(self.retry_s)
            if await self._try_start(first=False):
                return

    async def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
            self._retry = None
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
