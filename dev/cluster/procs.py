"""Run dranet services as real processes in tests: start, wait, SIGKILL, restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def wait_for_socket(
    path: str | os.PathLike[str], timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Until something accepts connections on the Unix socket ``path``."""
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {path} was ready")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(os.fspath(path))
                return
            except OSError:
                pass
        time.sleep(0.02)
    raise TimeoutError(f"{path} not ready after {timeout}s")


class ServiceProcess:
    """``python -m <module> <args>`` with its log in ``log_path``; ready when ``socket`` accepts."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        socket: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        env: dict[str, str] | None = None,
        netns: str | None = None,
    ) -> None:
        self.module = module
        self.args = list(args)
        self.socket = os.fspath(socket)
        self.log_path = Path(log_path)
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> ServiceProcess:
        cmd = [sys.executable, "-m", self.module, *self.args]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        try:
            wait_for_socket(self.socket, timeout, self.proc)
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"{self.module} did not start: {exc}\n--- log ---\n{self.log()}") from exc
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: no clean-up code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait; SIGKILL if it does not stop in time."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def restart(self, timeout: float = 20.0) -> ServiceProcess:
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
