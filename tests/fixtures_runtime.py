"""Pytest plugin: a real containerd with NRI and a CRI client.

Registered in tests/conftest.py (``pytest_plugins = ["tests.fixtures_runtime"]``). Tests that use
the runtime fixtures need root and carry the ``containerd`` marker (and ``root``).

Fixtures
- ``containerd_session``: one private containerd for the whole run (started on first use).
- ``containerd``: that instance, running at the start of the test; every pod left behind is removed
  afterwards (a stopped daemon is started again first).
- ``containerd_private``: a fresh instance of its own, for tests that restart or kill the runtime.
- ``cri_client``: an async CRI client on ``containerd``.
Helpers: ``is_netns_mount(path)``, ``exists(path)``, ``mounted_under(dir)``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from dev.cluster.containerd import Containerd, running
from dev.cluster.cri import CriClient

# ----------------------------------------------------------------------------------------------
# Host checks tests use around pods


def is_netns_mount(path: str) -> bool:
    """True when ``path`` is a bind mount of a network namespace (what `ip netns` lists)."""
    real = os.path.realpath(path)  # /var/run is a symlink to /run
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fields[4] == real and fstype == "nsfs":
                return True
    return False


def exists(path: str | Path) -> bool:
    return os.path.lexists(path)


def mounted_under(prefix: Path) -> bool:
    return any(str(prefix) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture(scope="session")
def containerd_session() -> Iterator[Containerd]:
    with running() as c:
        yield c


@pytest.fixture
def containerd(containerd_session: Containerd) -> Iterator[Containerd]:
    c = containerd_session
    c.start()
    yield c
    c.start()
    c.remove_all_pods()


@pytest.fixture
def containerd_private() -> Iterator[Containerd]:
    with running() as c:
        yield c


@pytest.fixture
async def cri_client(containerd: Containerd) -> AsyncIterator[CriClient]:
    client = CriClient(containerd.grpc_socket)
    try:
        yield client
    finally:
        await client.close()
