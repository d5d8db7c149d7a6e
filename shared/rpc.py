"""Unix-socket gRPC helpers: servers with a private socket file, and clients.

A server's socket is created with mode 0600 unless asked otherwise, a stale
socket left by a dead process is removed first, a live one is never stolen, and
``stop`` removes the socket file.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1
CHANNEL_OPTIONS: Sequence[tuple[str, Any]] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect quickly when a peer service restarts.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class SocketInUseError(RuntimeError):
    """Another live process serves on the socket path."""


def socket_is_live(path: str | os.PathLike[str]) -> bool:
    """True when something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect(os.fspath(path))
        except OSError:
            return False
        return True


def prepare_socket_path(path: str | os.PathLike[str]) -> Path:
    """Create the parent directory and remove a stale socket file at ``path``.

    Raises SocketInUseError if a live server answers there, and ValueError if the
    path is too long for AF_UNIX or names something that is not a socket.
    """
    p = Path(path)
    if len(os.fsencode(p)) > SUN_PATH_MAX:
        raise ValueError(f"socket path {p} is longer than the {SUN_PATH_MAX} bytes AF_UNIX allows")
    # Missing directories are made 0755 at most (the umask can only narrow it), never
    # world-writable: whoever can write the directory can replace the socket.
    # (mkdir(parents=True) would give the parents the umask's default instead.)
    for d in reversed([p.parent, *p.parent.parents]):
        if not d.exists():
            d.mkdir(mode=0o755, exist_ok=True)
    try:
        st = p.lstat()
    except FileNotFoundError:
        return p
    if not stat.S_ISSOCK(st.st_mode):
        raise ValueError(f"{p} exists and is not a socket; refusing to replace it")
    if socket_is_live(p):
        raise SocketInUseError(f"another process is serving on {p}")
    log.info("removing stale socket", extra={"socket": str(p)})
    with contextlib.suppress(FileNotFoundError):
        p.unlink()
    return p


# How long a new instance waits for a previous one to release its socket (a rollout or a
# pod deleted and made again: the old pod's containers drain while the new pod's start).
# Services set it from --takeover-wait.
takeover_wait_s = 60.0


async def wait_socket_free(path: str | os.PathLike[str], within_s: float) -> None:
    """Until nothing serves on ``path`` (a stale file is fine: prepare_socket_path removes it);
    SocketInUseError naming the socket if the other process keeps it for ``within_s``."""
    deadline = time.monotonic() + within_s
    told = False
    while await asyncio.to_thread(socket_is_live, path):
        if time.monotonic() >= deadline:
            raise SocketInUseError(
                f"another process is serving on {path} (waited {within_s:g}s for it to stop)"
            )
        if not told:
            log.info("waiting for the previous instance to release its socket", extra={"socket": str(path)})
            told = True
        await asyncio.sleep(0.25)
    if told:
        log.info("previous instance gone; taking over", extra={"socket": str(path)})


class UdsServer:
    """A grpc.aio server bound to one Unix socket. ``start`` waits up to ``takeover_s``
    (default ``takeover_wait_s``) for another live server on the path to go away."""

    def __init__(
        self, path: str | os.PathLike[str], mode: int = 0o600, takeover_s: float | None = None
    ) -> None:
        self.path = Path(path)
        self.mode = mode
        self.takeover_s = takeover_s
        self.server = grpc.aio.server(options=CHANNEL_OPTIONS)

    def add(self, register: Callable[[grpc.aio.Server], None]) -> UdsServer:
        register(self.server)
        return self

    async def start(self) -> None:
        await wait_socket_free(self.path, takeover_wait_s if self.takeover_s is None else self.takeover_s)
        prepare_socket_path(self.path)
        # The socket is created with the process umask; keep others out from the
        # first moment, then set the exact mode.
        old = os.umask(0o777 & ~self.mode)
        try:
            port = self.server.add_insecure_port(f"unix:{self.path}")
        finally:
            os.umask(old)
        if port == 0:
            raise OSError(errno.EADDRINUSE, f"cannot bind {self.path}")
        await self.server.start()
        os.chmod(self.path, self.mode)
        log.info("serving", extra={"socket": str(self.path)})

    async def stop(self, grace: float | None = 1.0) -> None:
        await self.server.stop(grace)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def wait(self) -> None:
        await self.server.wait_for_termination()


def channel(path: str | os.PathLike[str]) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to the Unix socket ``path`` (connects lazily)."""
    return grpc.aio.insecure_channel(f"unix:{os.fspath(path)}", options=CHANNEL_OPTIONS)


def sync_channel(path: str | os.PathLike[str]) -> grpc.Channel:
    """A blocking channel, for tools and benchmarks outside an event loop."""
    return grpc.insecure_channel(f"unix:{os.fspath(path)}", options=CHANNEL_OPTIONS)
