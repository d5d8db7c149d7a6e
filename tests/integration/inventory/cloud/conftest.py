"""Fixtures for the cloud provider tests: local metadata servers, fake sysfs and
procfs trees built from real layouts, and network namespaces with veth links."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.integration.inventory.cloud.fakes import FakeServer
from tests.integration.inventory.cloud.support import FakeHost, Netns

S = TypeVar("S", bound=FakeServer)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[FakeServer]]]:
    """``server = await serve(FakeX(...))`` starts it; every server stops at teardown."""
    started: list[FakeServer] = []

    async def start(server: S, **kwargs: object) -> S:
        await server.start(**kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
def closed_url() -> str:
    """A URL nothing listens on (connection refused at once)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "host")


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns()
    try:
        yield ns
    finally:
        ns.delete()
