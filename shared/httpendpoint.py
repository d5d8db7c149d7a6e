"""The pod's one HTTP endpoint: /metrics of all four services, /healthz and /readyz.

One process serves it (the inventory service, ``--metrics-port``, 9177 as in
dranet); FastAPI and uvicorn are imported only when it starts (``make_app``,
``HttpEndpoint.start``), so nothing else pays for them (about 16 MiB). At each request it asks every service over its
Unix socket (dranet.admin.v1 ``Metrics`` and ``Health``, short deadline) and
answers for its own process without a call:

- ``GET /metrics``: every service's registry merged (shared/metrics.py ``merge``):
  a ``service`` label on every sample, ``dranet_scrape_up{service}`` 0 for a
  service that did not answer; the scrape itself never fails because one did not;
- ``GET /healthz``: 200 while the serving process's event loop answers;
- ``GET /readyz``: 200 when every service reports ready, else 503 with a JSON
  body naming the services that are not ready and why.

No OpenAPI or docs routes, no access log (the services' JSON logs carry what
matters); uvicorn runs as a task of the service's own event loop and leaves the
service's signal handlers alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from shared import metrics
from shared.admin import AdminServicer
from shared.health import host_port
from shared.rpc import channel

log = logging.getLogger(__name__)

DEFAULT_PORT = 9177  # dranet's --bind-address :9177
# Every IPv4 address, as dranet binds all: Prometheus scrapes the pod IP (the node's, with
# hostNetwork); "::" for dual-stack.
DEFAULT_ADDRESS = "0.0.0.0"
DEFAULT_DEADLINE_S = 2.0


@dataclass(frozen=True)
class Readiness:
    """One service's answer to /readyz's question."""

    service: str
    ready: bool
    detail: str


class Scraper:
    """Reads metrics and readiness from the services at ``sockets`` (service -> Unix
    socket path), and from ``local`` (this process's admin servicer) without a call."""

    def __init__(
        self,
        sockets: Mapping[str, str],
        local: AdminServicer | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> None:
        self.local = local
        self.deadline_s = deadline_s
        self.sockets = dict(sockets)
        self.services = [*sockets]
        if local is not None and local.service not in self.services:
            self.services.append(local.service)
        self._channels = {
            name: channel(path) for name, path in sockets.items() if local is None or name != local.service
        }
        self._stubs = {name: admin_pb2_grpc.AdminStub(ch) for name, ch in self._channels.items()}

    async def close(self) -> None:
        for ch in self._channels.values():
            await ch.close()

    async def _scrape(self, service: str) -> metrics.Scrape:
        started = time.perf_counter()
        if self.local is not None and service == self.local.service:
            text: bytes = self.local.metrics_response().exposition
        else:
            try:
                resp = await self._stubs[service].Metrics(admin_pb2.MetricsRequest(), timeout=self.deadline_s)
            except grpc.aio.AioRpcError as exc:
                return metrics.Scrape(
                    service, None, f"{exc.code().name}: {exc.details()}", time.perf_counter() - started
                )
            text = resp.exposition
        return metrics.Scrape(service, text.decode(errors="replace"), "", time.perf_counter() - started)

    async def metrics(self) -> bytes:
        """Every service's metrics, merged into one exposition."""
        scrapes = await asyncio.gather(*(self._scrape(s) for s in self.services))
        return metrics.merge(scrapes)

    async def _ready(self, service: str) -> Readiness:
        if self.local is not None and service == self.local.service:
            r = self.local.health_response()
        else:
            try:
                r = await self._stubs[service].Health(admin_pb2.HealthRequest(), timeout=self.deadline_s)
            except grpc.aio.AioRpcError as exc:
                return Readiness(service, False, f"no answer on {self.sockets[service]}: {exc.code().name}")
        return Readiness(service, r.ready, r.detail)

    async def readiness(self) -> list[Readiness]:
        """Each service's readiness, in ``services`` order."""
        return list(await asyncio.gather(*(self._ready(s) for s in self.services)))


def make_app(scraper: Scraper) -> Any:
    """The FastAPI application serving /metrics, /healthz and /readyz."""
    from fastapi import FastAPI, Response
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(await scraper.metrics(), media_type=metrics.CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz() -> Response:
        return PlainTextResponse("ok\n")

    @app.get("/readyz")
    async def readyz() -> Response:
        states = await scraper.readiness()
        not_ready = [s for s in states if not s.ready]
        body = {
            "ready": not not_ready,
            "not_ready": {s.service: s.detail for s in not_ready},
            "services": {s.service: {"ready": s.ready, "detail": s.detail} for s in states},
        }
        return JSONResponse(body, status_code=503 if not_ready else 200)

    return app


def bind_socket(address: str, port: int) -> socket.socket:
    """A listening TCP socket; bound here so a taken port is an OSError of ours
    (uvicorn's own bind calls sys.exit)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class HttpEndpoint:
    """uvicorn serving ``make_app(scraper)`` on ``address:port`` inside the running loop.

    A taken port is logged and retried every ``retry_s`` (as the health listener
    does): the endpoint is worth less than the service that hosts it.
    """

    def __init__(self, scraper: Scraper, address: str, port: int, retry_s: float = 10.0) -> None:
        self.scraper = scraper
        self.address = address
        self.port = port
        self.retry_s = retry_s
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None
        self._serving = False

    @property
    def url(self) -> str:
        return f"http://{host_port(self.address, self.port)}"

    async def start(self) -> None:
        import uvicorn

        class _Server(uvicorn.Server):
            # The service owns SIGTERM/SIGINT (shared/service.py); uvicorn would replace them.
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        config = uvicorn.Config(
            make_app(self.scraper),
            log_config=None,
            access_log=False,
            lifespan="off",
            ws="none",
            server_header=False,
            timeout_graceful_shutdown=1,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._run(), name="http-endpoint")

    async def _run(self) -> None:
        first = True
        while True:
            try:
                sock = bind_socket(self.address, self.port)
            except OSError as exc:
                log.log(
                    logging.ERROR if first else logging.DEBUG,
                    "cannot listen for /metrics, /healthz and /readyz on %s: %s; the service runs on, "
                    "retrying every %ss",
                    host_port(self.address, self.port),
                    exc,
                    self.retry_s,
                )
                first = False
                await asyncio.sleep(self.retry_s)
                continue
            log.info("serving /metrics, /healthz, /readyz", extra={"url": self.url})
            self._serving = True
            try:
                await self._server.serve(sockets=[sock])
            finally:
                sock.close()
            return

    async def stop(self) -> None:
        if self._task is not None:
            if self._serving:
                # uvicorn's own shutdown: stop accepting, let requests in flight finish (1 s).
                self._server.should_exit = True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._task), 5)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.scraper.close()
