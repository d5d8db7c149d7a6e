"""grpc.health.v1 answered from a service's health check (shared/health.py), over a
real grpc.aio server on a Unix socket and on TCP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.dranet.admin.v1 import admin_pb2, admin_pb2_grpc
from shared.admin import AdminServicer
from shared.health import LIVENESS, NOT_SERVING, SERVING, HealthListener
from shared.rpc import UdsServer, channel


class State:
    """The service's readiness, as its own code would report it."""

    def __init__(self) -> None:
        self.ready = False
        self.detail = "not connected to NRI"

    def check(self) -> tuple[bool, str]:
        return self.ready, "" if self.ready else self.detail


@contextlib.asynccontextmanager
async def serve(path: Path, admin: AdminServicer) -> AsyncIterator[health_pb2_grpc.HealthStub]:
    server = UdsServer(path).add(admin.register)
    await server.start()
    ch = channel(path)
    try:
        yield health_pb2_grpc.HealthStub(ch)
    finally:
        await ch.close()
        await server.stop(grace=0)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[State, AdminServicer, health_pb2_grpc.HealthStub]]:
    state = State()
    admin = AdminServicer("attach", state.check)
    admin.grpc_health.watch_refresh_s = 0.05
    async with serve(tmp_path / "attach.sock", admin) as stub:
        yield state, admin, stub


async def status(stub: health_pb2_grpc.HealthStub, name: str) -> int:
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2)
    return int(resp.status)


async def test_readiness_follows_the_check_liveness_does_not(
    served: tuple[State, AdminServicer, health_pb2_grpc.HealthStub],
) -> None:
    state, admin, stub = served
    for want_ready in (False, True, False):
        state.ready = want_ready
        want = SERVING if want_ready else NOT_SERVING
        assert [await status(stub, n) for n in ("", "dranet.attach", LIVENESS)] == [want, want, SERVING]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await status(stub, "dranet.store")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # One source of truth: the admin Health RPC says the same, with the reason.
    assert admin.health_response().detail == "not connected to NRI"


async def test_stopping_turns_readiness_off_for_good_and_keeps_liveness(
    served: tuple[State, AdminServicer, health_pb2_grpc.HealthStub],
) -> None:
    state, admin, stub = served
    state.ready = True
    assert await status(stub, "") == SERVING
    await admin.grpc_health.stopping()
    assert [await status(stub, n) for n in ("", "dranet.attach", LIVENESS)] == [
        NOT_SERVING,
        NOT_SERVING,
        SERVING,
    ]


async def test_watch_streams_changes(served: tuple[State, AdminServicer, health_pb2_grpc.HealthStub]) -> None:
    state, _, stub = served
    call = stub.Watch(health_pb2.HealthCheckRequest(service="dranet.attach"))
    seen = [(await call.read()).status]
    state.ready = True
    seen.append((await asyncio.wait_for(call.read(), 2)).status)
    call.cancel()
    assert seen == [NOT_SERVING, SERVING]


async def test_a_failing_check_is_not_ready(tmp_path: Path) -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    check: Callable[[], tuple[bool, str]] = broken
    async with serve(tmp_path / "store.sock", AdminServicer("store", check)) as stub:
        assert [await status(stub, n) for n in ("dranet.store", LIVENESS)] == [NOT_SERVING, SERVING]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_tcp_listener_serves_only_health_and_waits_for_a_taken_port(
    served: tuple[State, AdminServicer, health_pb2_grpc.HealthStub], caplog: pytest.LogCaptureFixture
) -> None:
    state, admin, _ = served
    state.ready = True
    port = free_port()
    taken = socket.socket()
    taken.bind(("127.0.0.1", port))
    taken.listen()
    listener = HealthListener(admin.grpc_health, "127.0.0.1", port, retry_s=0.1)
    try:
        with caplog.at_level(logging.ERROR, logger="shared.health"):
            await listener.start()
        assert listener.server is None
        assert any(f"127.0.0.1:{port}" in r.getMessage() for r in caplog.records)
        taken.close()
        for _ in range(100):
            if listener.server is not None:
                break
            await asyncio.sleep(0.05)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            assert await status(stub, "dranet.attach") == SERVING
            assert await status(stub, LIVENESS) == SERVING
            # The admin API (log levels) is never on TCP.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin_pb2_grpc.AdminStub(ch).Health(admin_pb2.HealthRequest(), timeout=2)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # A second listener on the same port does not share it (no SO_REUSEPORT).
        second = HealthListener(admin.grpc_health, "127.0.0.1", port, retry_s=60)
        await second.start()
        assert second.server is None
        await second.stop()
    finally:
        taken.close()
        await listener.stop()
