"""Test-wide fixtures and marker checks.

Tests that need root, network namespaces or containerd carry the ``root``,
``netns`` or ``containerd`` marker. CI runs as root and runs them all; they are
never skipped there. On a machine without root they fail loudly rather than pass
silently, unless DRANET_ALLOW_SKIP=1 is set for a local partial run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Properties are about results, never about time: hypothesis' default 200 ms deadline per
# example fails on a loaded 2-core CI machine (the suite runs beside a whole cluster).
settings.register_profile("dranet", deadline=None)
settings.load_profile("dranet")

# Reusable fixtures for the real container runtime (containerd, CRI, kubelet emulator).
pytest_plugins = ["tests.fixtures_runtime", "tests.fixtures_cluster"]


def pytest_runtest_setup(item: pytest.Item) -> None:
    needs_root = any(item.iter_markers(name=m) for m in ("root", "netns", "containerd", "cluster", "vm"))
    if needs_root and os.geteuid() != 0:
        if os.environ.get("DRANET_ALLOW_SKIP") == "1":
            pytest.skip("needs root (DRANET_ALLOW_SKIP=1)")
        pytest.fail("this test needs root; CI runs as root")
