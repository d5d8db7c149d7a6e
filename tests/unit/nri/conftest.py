from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.attach.nri.stub import NriHandlers, NriStub, StubConfig
from tests.unit.nri.fake_runtime import FakeRuntime


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    rt = FakeRuntime(str(tmp_path / "nri.sock"))
    await rt.start()
    yield rt
    await rt.stop()


@pytest.fixture
async def run_stub(runtime: FakeRuntime) -> AsyncIterator[Callable[..., NriStub]]:
    """Start stubs against the fake runtime; every one is stopped at the end."""
    running: list[tuple[NriStub, asyncio.Task[None]]] = []

    def start(
        handlers: NriHandlers,
        on_connected: Callable[..., Any] | None = None,
        on_disconnected: Callable[..., Any] | None = None,
        **config: Any,
    ) -> NriStub:
        config.setdefault("backoff_initial", 0.02)
        config.setdefault("backoff_max", 0.1)
        stub = NriStub(
            handlers,
            StubConfig(socket_path=runtime.path, **config),
            on_connected=on_connected,
            on_disconnected=on_disconnected,
        )
        running.append((stub, asyncio.create_task(stub.run())))
        return stub

    yield start
    for stub, task in running:
        await stub.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
