"""One HTTP/1.1 connection: an h11 state machine (h11 does the protocol: framing, chunked
bodies, keep-alive) over an asyncio stream, TCP, TLS or a Unix socket. Used by the API
client (shared/kubeapi.py) and the cloud metadata client; no deadline is set here, the
callers wrap each exchange in theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import Any

import h11

READ_CHUNK = 65536
# What a broken connection or a peer that does not speak HTTP raises here.
CONNECTION_ERRORS = (OSError, ConnectionError, h11.ProtocolError, ssl.SSLError)


class BodyTooLarge(Exception):
    pass


class Conn:
    """One connection; ``exchange`` sends a request and reads its whole response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(our_role=h11.CLIENT)
        self.used = time.monotonic()

    @classmethod
    async def open(
        cls,
        host: str = "",
        port: int = 0,
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        unix_path: str = "",
    ) -> Conn:
        if unix_path:
            reader, writer = await asyncio.open_unix_connection(unix_path, limit=READ_CHUNK)
        else:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls, server_hostname=server_hostname if tls else None, limit=READ_CHUNK
            )
        return cls(reader, writer)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    def stale(self, idle_max_s: float) -> bool:
        return time.monotonic() - self.used > idle_max_s or self.reader.at_eof()

    async def send(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> None:
        out = self.h11.send(h11.Request(method=method, target=target, headers=headers)) or b""
        if body:
            out += self.h11.send(h11.Data(data=body)) or b""
        out += self.h11.send(h11.EndOfMessage()) or b""
        self.writer.write(out)
        await self.writer.drain()

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await self.reader.read(READ_CHUNK))

    async def response(self) -> tuple[int, dict[str, str]]:
        """The status and headers of the response (1xx skipped)."""
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Response):
                headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}
                return int(event.status_code), headers
            if isinstance(event, h11.InformationalResponse):
                continue
            raise ConnectionError(f"no HTTP response ({type(event).__name__})")

    async def body(self, max_bytes: int = 0) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Data):
                parts.append(bytes(event.data))
                size += len(event.data)
                if max_bytes and size > max_bytes:
                    raise BodyTooLarge(f"response larger than {max_bytes} bytes")
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:
                raise ConnectionError("the server closed the connection mid-response")

    async def chunk(self) -> bytes | None:
        """The next piece of a streamed body (a watch); None at its end."""
        event = await self.next_event()
        return bytes(event.data) if isinstance(event, h11.Data) else None

    async def exchange(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes = b"", max_bytes: int = 0
    ) -> tuple[int, dict[str, str], bytes]:
        await self.send(method, target, headers, body)
        status, answer_headers = await self.response()
        return status, answer_headers, await self.body(max_bytes)

    def reusable(self) -> bool:
        """Ready for the next request on the same connection (both sides done, keep-alive)."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self.used = time.monotonic()
            return True
        return False
