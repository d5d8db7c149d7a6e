"""One NRI socket: the mux trunk with a ttrpc server on one conn id and a ttrpc
client on the other.

A plugin serves the Plugin service on conn 1 and calls the Runtime service on
conn 2; a (test) runtime does the opposite. Opening a logical connection sends
nothing: each side just starts using its conn ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping

from services.attach.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN, MuxDecoder, frames_for_message
from services.attach.nri.rpc import ConnectionClosed, Handler, Send, TtrpcClient, TtrpcServer
from services.attach.nri.ttrpc import Frame, FrameDecoder, ProtocolError
from shared.logs import FieldsLogger

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16


class NriConnection:
    """Demultiplexes the trunk into per-conn ttrpc byte streams and routes
    their frames to ``server`` (on ``serve_conn``) and ``client`` (on
    ``call_conn``). Frames for other conn ids are dropped, as Go's mux does."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        services: Mapping[str, Mapping[str, Handler]],
        serve_conn: int = PLUGIN_SERVICE_CONN,
        call_conn: int = RUNTIME_SERVICE_CONN,
        name: str = "nri",
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._name = name
        self._log = FieldsLogger(log, conn=name)
        self._mux = MuxDecoder()
        self._streams = {serve_conn: FrameDecoder(), call_conn: FrameDecoder()}
        self.server = TtrpcServer(services, self._sender(serve_conn), name=f"{name}/conn{serve_conn}")
        self.client = TtrpcClient(self._sender(call_conn), name=f"{name}/conn{call_conn}")
        self._routes: dict[int, Callable[[Frame], None]] = {
            serve_conn: self.server.dispatch,
            call_conn: self.client.dispatch,
        }
        self._closed = asyncio.Event()
        self._close_reason: str = ""
        self._reader_task: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None

    @classmethod
    async def open_unix(
        cls, path: str, services: Mapping[str, Mapping[str, Handler]], name: str = "nri"
    ) -> NriConnection:
        """Connect to the runtime's NRI socket as a plugin and start reading."""
        reader, writer = await asyncio.open_unix_connection(path, limit=READ_CHUNK)
        conn = cls(reader, writer, services, name=name)
        conn.start()
        return conn

    @classmethod
    async def from_socket(
        cls,
        sock: socket.socket,
        services: Mapping[str, Mapping[str, Handler]],
        serve_conn: int = PLUGIN_SERVICE_CONN,
        call_conn: int = RUNTIME_SERVICE_CONN,
        name: str = "nri",
    ) -> NriConnection:
        """Wrap an already-connected stream socket (a socketpair end, or the fd a
        runtime hands a pre-launched plugin) and start reading."""
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=READ_CHUNK)
        conn = cls(reader, writer, services, serve_conn, call_conn, name)
        conn.start()
        return conn

    def start(self) -> None:
        if self._reader_task is None:
            self._reader_task = asyncio.create_task(self._read_loop(), name=f"{self._name}-reader")

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def close_reason(self) -> str:
        return self._close_reason

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self, reason: str = "closed locally") -> None:
        """Close the trunk, fail pending calls, cancel running handlers."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown(reason))
        await asyncio.shield(self._closing)

    def _sender(self, conn_id: int) -> Send:
        async def send(message: bytes) -> None:
            if self._closing is not None or self._writer.is_closing():
                raise ConnectionClosed(f"{self._name}: connection closed ({self._close_reason})")
            # Both frames in one write: nothing else can slip between them, and
            # each stays its own mux frame on the wire.
            self._writer.write(b"".join(frames_for_message(conn_id, message)))
            await self._writer.drain()

        return send

    async def _read_loop(self) -> None:
        reason = "runtime closed the connection"
        try:
            while True:
                data = await self._reader.read(READ_CHUNK)
                if not data:
                    break
                for conn_id, payload in self._mux.feed(data):
                    stream = self._streams.get(conn_id)
                    if stream is None:
                        self._log.debug("dropping mux frame for unknown conn %d", conn_id)
                        continue
                    route = self._routes[conn_id]
                    for frame in stream.feed(payload):
                        route(frame)
        except asyncio.CancelledError:
            return
        except ProtocolError as e:
            reason = f"protocol error: {e}"
            self._log.error("NRI connection broken: %s", e)
        except (ConnectionError, OSError) as e:
            reason = f"read failed: {e}"
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._shutdown(reason))

    async def _shutdown(self, reason: str) -> None:
        self._close_reason = reason
        self.client.close(ConnectionClosed(reason))
        with contextlib.suppress(Exception):
            self._writer.close()
        current = asyncio.current_task()
        if (
            self._reader_task is not None
            and self._reader_task is not current
            and not self._reader_task.done()
        ):
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        await self.server.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._closed.set()
        self._log.debug("NRI connection closed: %s", reason)
