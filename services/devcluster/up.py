"""The local run: every dranet service as its own process, plus the development
control plane, on this host, until Ctrl-C (or SIGTERM).

State lives under --state-dir (default /var/lib/dranet-dev): the store's LMDB
directory, the services' sockets and logs. Each child's log is prefixed with its
name on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=os.environ.get("DRANET_DEV_STATE", "/var/lib/dranet-dev"))
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--exit-after",
        type=float,
        default=0.0,
        help="stop after this many seconds once everything is ready (0: run until Ctrl-C); for smoke tests",
    )


@dataclass
class Child:
    name: str
    argv: list[str]
    socket: Path | None
    proc: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = None
    env: dict[str, str] = field(default_factory=dict)


def _wait_socket(child: Child, timeout: float) -> None:
    assert child.proc is not None and child.socket is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited with code {child.proc.returncode} during start-up")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(child.socket))
                return
            except OSError:
                time.sleep(0.05)
    raise TimeoutError(f"{child.name} not ready on {child.socket} after {timeout:.0f}s")


def _pump(child: Child) -> None:
    assert child.proc is not None and child.proc.stdout is not None
    for line in child.proc.stdout:
        sys.stdout.write(f"{child.name:>10} | {line.decode(errors='replace')}")
        sys.stdout.flush()


def start(child: Child, timeout: float = 30.0) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **child.env}
    child.proc = subprocess.Popen(
        child.argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    child.pump = threading.Thread(target=_pump, args=(child,), daemon=True)
    child.pump.start()
    if child.socket is not None:
        _wait_socket(child, timeout)


def stop(child: Child) -> None:
    if child.proc is None or child.proc.poll() is not None:
        return
    child.proc.send_signal(signal.SIGTERM)
    try:
        child.proc.wait(30)
    except subprocess.TimeoutExpired:
        child.proc.kill()
        child.proc.wait()


def run(args: argparse.Namespace) -> int:
    state = Path(args.state_dir)
    run_dir = state / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    children = [
        Child(
            "store",
            [
                py,
                "-m",
                "services.store",
                "--db-dir",
                str(state / "store"),
                "--run-dir",
                str(run_dir),
                "--log-level",
                args.log_level,
            ],
            run_dir / "store.sock",
        ),
    ]
    started: list[Child] = []
    stop_event = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())
    try:
        for child in children:
            t0 = time.monotonic()
            start(child)
            started.append(child)
            print(f"[up] {child.name} ready in {time.monotonic() - t0:.2f}s", flush=True)
        print(
            json.dumps(
                {
                    "ready": True,
                    "state_dir": str(state),
                    "run_dir": str(run_dir),
                    "services": [c.name for c in started],
                }
            ),
            flush=True,
        )
        deadline = time.monotonic() + args.exit_after if args.exit_after else None
        while not stop_event.is_set():
            for child in started:
                assert child.proc is not None
                if child.proc.poll() is not None:
                    print(f"[up] {child.name} exited with code {child.proc.returncode}", flush=True)
                    return 1
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop_event.wait(0.5)
        return 0
    except Exception as exc:
        print(f"[up] start-up failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for child in reversed(started):
            with contextlib.suppress(Exception):
                stop(child)
        print("[up] stopped", flush=True)
