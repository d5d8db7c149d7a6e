"""--feature-gates on the services whose behaviour a gate changes (inventory, prepare): an
unknown gate or a bad value stops the process at start, non-zero, naming the gate or value,
before it touches anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("service", ["inventory", "prepare"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("PersistentResourceSliceAttributes=true,NoSuchGate=true", "unrecognized feature gate: NoSuchGate"),
        (
            "persistentresourcesliceattributes=true",
            "unrecognized feature gate: persistentresourcesliceattributes",
        ),
        ("DRAListTypeAttributes=maybe", "invalid value of DRAListTypeAttributes=maybe"),
        ("PersistentResourceSliceAttributes", "missing bool value for PersistentResourceSliceAttributes"),
    ],
)
def test_a_bad_gate_stops_the_service_at_start(
    service: str, value: str, message: str, tmp_path: Path
) -> None:
    res = subprocess.run(
        [sys.executable, "-m", f"services.{service}", "--run-dir", str(tmp_path), f"--feature-gates={value}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res
    assert f"argument --feature-gates: {message}" in res.stderr
    assert list(tmp_path.iterdir()) == []  # no socket made: it stopped before starting
