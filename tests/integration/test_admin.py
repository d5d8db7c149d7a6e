"""Per-service log levels change at run time, one service at a time, over
dranet.admin.v1 (here through the adminctl tool), and health answers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dev.cluster.procs import ServiceProcess

REPO = Path(__file__).resolve().parents[2]


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shared.adminctl", *args], cwd=REPO, capture_output=True, text=True
    )


def test_log_level_changes_at_run_time_for_one_service(tmp_path: Path) -> None:
    run = tmp_path / "run"
    store = ServiceProcess(
        "services.store",
        ["--db-dir", str(tmp_path / "db"), "--run-dir", str(run)],
        run / "store.sock",
        tmp_path / "s.log",
    )
    with store:
        assert json.loads(ctl("--run-dir", str(run), "level", "store").stdout) == {
            "service": "store",
            "level": "INFO",
        }
        health = json.loads(ctl("--run-dir", str(run), "health", "store").stdout)
        assert health["ready"] is True and health["pid"] == store.pid
        assert '"level": "DEBUG"' not in store.log()
        out = ctl("--run-dir", str(run), "level", "store", "debug")
        assert json.loads(out.stdout) == {"service": "store", "level": "DEBUG"}
        # The next request is logged at DEBUG now (gRPC server internals stay quiet).
        ctl("--run-dir", str(run), "level", "store")
        deadline = time.monotonic() + 5
        while '"level": "DEBUG"' not in store.log() and time.monotonic() < deadline:
            ctl("--run-dir", str(run), "health", "store")
            time.sleep(0.1)
        bad = ctl("--run-dir", str(run), "level", "store", "LOUD")
        assert bad.returncode == 2 and "INVALID_ARGUMENT" in bad.stderr and "LOUD" in bad.stderr
        assert json.loads(ctl("--run-dir", str(run), "level", "store", "INFO").stdout)["level"] == "INFO"
