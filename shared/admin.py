"""The dranet.admin.v1 service every dranet service serves: log level, health and
metrics; registered with grpc.health.v1 beside it, both answering from one check."""

from __future__ import annotations

import os
import time

import grpc

from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from shared import logs, metrics
from shared.health import Health, HealthCheck

__all__ = ["AdminServicer", "HealthCheck"]


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """Serves GetLogLevel/SetLogLevel for this process, Health from ``health`` and
    Metrics from this process's registry. ``grpc_health`` is grpc.health.v1 over the
    same ``health`` check; ``register`` adds both to a server."""

    def __init__(self, service: str, health: HealthCheck | None = None) -> None:
        self.service = service
        self.health: HealthCheck = health or (lambda: (True, ""))
        self.started = time.monotonic()
        self.grpc_health = Health(service, lambda: self.health())

    async def GetLogLevel(
        self, request: admin_pb2.GetLogLevelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.LogLevel:
        return admin_pb2.LogLevel(service=self.service, level=logs.get_level())

    async def SetLogLevel(
        self, request: admin_pb2.SetLogLevelRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.LogLevel:
        try:
            level = logs.set_level(request.level)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"level: {exc}")
        return admin_pb2.LogLevel(service=self.service, level=level)

    def health_response(self) -> admin_pb2.HealthResponse:
        """What Health answers; also read in-process by the pod's HTTP endpoint."""
        ready, detail = self.health()
        return admin_pb2.HealthResponse(
            service=self.service,
            ready=ready,
            detail=detail,
            pid=os.getpid(),
            uptime_seconds=time.monotonic() - self.started,
        )

    async def Health(
        self, request: admin_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.HealthResponse:
        return self.health_response()

    def metrics_response(self) -> admin_pb2.MetricsResponse:
        """This process's registry plus dranet_service_ready, rendered now."""
        ready, _ = self.health()
        return admin_pb2.MetricsResponse(
            service=self.service,
            exposition=metrics.exposition([metrics.ready_family(ready)]),
            content_type=metrics.CONTENT_TYPE,
        )

    async def Metrics(
        self, request: admin_pb2.MetricsRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.MetricsResponse:
        return self.metrics_response()

    def register(self, server: grpc.aio.Server) -> None:
        admin_pb2_grpc.add_AdminServicer_to_server(self, server)
        self.grpc_health.register(server)
