"""The guest side of the VM tier: these tests run only inside the QEMU guest that
dev/vm/run.py boots (it sets DRANET_VM_GUEST=1), on a Debian kernel with dummy, ipvlan,
vrf, netdevsim and rdma_rxe.

Collected anywhere else (a plain ``pytest tests`` on the host) they are deselected, and
pytest says so ("N deselected"). They are never silently lost: tests/vm/test_vm_tier.py,
the host-side entry, boots the guest, runs this directory and fails unless the guest ran
more than zero tests and every one passed (none skipped).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.vm.guest.kit import Stack, running_stack

HERE = Path(__file__).resolve().parent
IN_GUEST = os.environ.get("DRANET_VM_GUEST") == "1"
# Loaded once per boot; a missing one fails the session (the kernel package changed).
MODULES = ("dummy", "ipvlan", "vrf", "rdma_rxe", "rdma_ucm", "netdevsim")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IN_GUEST:
        for item in items:
            if item.path.is_relative_to(HERE):
                item.add_marker(pytest.mark.vm)
        return
    mine = [i for i in items if i.path.is_relative_to(HERE)]
    if mine:
        config.hook.pytest_deselected(items=mine)
        items[:] = [i for i in items if not i.path.is_relative_to(HERE)]


@pytest.fixture(scope="session", autouse=True)
def kernel_modules() -> None:
    """modprobe from the guest kernel's own module tree (netdevsim built out of tree)."""
    if not IN_GUEST:
        return
    for m in MODULES:
        res = subprocess.run(["modprobe", m], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.fail(f"modprobe {m}: {res.stderr.strip()}", pytrace=False)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with running_stack() as s:
        yield s
