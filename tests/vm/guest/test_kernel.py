"""The guest is what the tier claims: the pinned Debian kernel with every module the
other guest tests need."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from tests.vm.guest.conftest import MODULES


def test_pinned_kernel_with_the_modules() -> None:
    env = dict(
        line.split("=", 1)
        for line in (Path(__file__).parents[3] / "dev/vm/kernel.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert platform.release() == env["KERNEL_ABI"]
    assert os.environ.get("DRANET_VM_GUEST") == "1"
    loaded = {line.split()[0] for line in Path("/proc/modules").read_text().splitlines()}
    assert set(MODULES) <= loaded, set(MODULES) - loaded
    assert Path("/sys/bus/netdevsim/new_device").exists()
    assert Path("/dev/infiniband/rdma_cm").exists()
