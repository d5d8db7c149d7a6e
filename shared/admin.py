"""The dranet.admin.v1 service every dranet service serves: log level and health."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import grpc

from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from shared import logs

HealthCheck = Callable[[], tuple[bool, str]]


class AdminServicer(admin_pb2_grpc.AdminServicer):
    """Serves GetLogLevel/SetLogLevel for this process and Health from ``health``."""

    def __init__(self, service: str, health: HealthCheck | None = None) -> None:
        self.service = service
        self.health = health or (lambda: (True, ""))
        self.started = time.monotonic()

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

    async def Health(
        self, request: admin_pb2.HealthRequest, context: grpc.aio.ServicerContext
    ) -> admin_pb2.HealthResponse:
        ready, detail = self.health()
        return admin_pb2.HealthResponse(
            service=self.service,
            ready=ready,
            detail=detail,
            pid=os.getpid(),
            uptime_seconds=time.monotonic() - self.started,
        )

    def register(self, server: grpc.aio.Server) -> None:
        admin_pb2_grpc.add_AdminServicer_to_server(self, server)
