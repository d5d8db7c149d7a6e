"""Unary ttrpc over one logical connection: an asyncio server and client.

Both are transport-agnostic: the connection feeds them received Frames with
``dispatch`` (from its reader, which must never wait on a handler) and gives
them ``send``, which writes one whole ttrpc message. Requests are served
concurrently, each in its own task, so responses may leave out of order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from proto.ttrpc import ttrpc_pb2
from services.attach.nri.ttrpc import (
    MAX_MESSAGE_LEN,
    MAX_STREAM_ID,
    Code,
    Frame,
    Header,
    MessageType,
    TtrpcError,
    code_name,
    encode_message,
)
from shared.logs import FieldsLogger, log_fields
from shared.tasks import TaskSet

log = logging.getLogger(__name__)

# A method handler gets the serialized request and the absolute deadline
# (event-loop time) the caller asked for, if any, and returns the serialized
# response or raises TtrpcError.
Handler = Callable[[bytes, float | None], Awaitable[bytes]]
Send = Callable[[bytes], Awaitable[None]]


class ProtoMessage(Protocol):
    """The part of a generated protobuf message class the transport uses."""

    def SerializeToString(self) -> bytes: ...
    def ParseFromString(self, serialized: bytes) -> int: ...


M = TypeVar("M", bound=ProtoMessage)


def parse(message_type: type[M], data: bytes, what: str) -> M:
    """Decode ``data`` as ``message_type``; TtrpcError(code) naming ``what`` if it is not one."""
    out = message_type()
    try:
        out.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError; its module ships no type stubs
        raise TtrpcError(Code.INVALID_ARGUMENT, f"{what}: bad {message_type.__name__}: {e}") from None
    return out


class ConnectionClosed(ConnectionError):
    """The logical connection is gone; the call's outcome is unknown."""


class TtrpcServer:
    """Serves the given services' methods, by full name, on one connection."""

    def __init__(
        self, services: Mapping[str, Mapping[str, Handler]], send: Send, name: str = "ttrpc"
    ) -> None:
        self._services = services
        self._send = send
        self._name = name
        self._log = FieldsLogger(log, conn=name)
        self._last_stream_id = 0
        self._tasks = TaskSet()
        self._closed = False

    @property
    def active(self) -> int:
        """Requests being handled right now."""
        return len(self._tasks)

    def dispatch(self, frame: Frame) -> None:
        """Accept one received frame; never waits."""
        if self._closed:
            return
        sid = frame.stream_id
        if frame.oversized:
            self._spawn(
                self._reply_status(
                    sid,
                    Code.RESOURCE_EXHAUSTED,
                    f"message length exceeds maximum message size of {MAX_MESSAGE_LEN}",
                )
            )
            return
        if sid % 2 != 1:
            self._spawn(
                self._reply_status(
                    sid, Code.INVALID_ARGUMENT, "StreamID must be odd for client initiated streams"
                )
            )
            return
        if frame.type == MessageType.DATA:
            # NRI has no streaming methods, so no stream is ever open for data.
            self._spawn(self._reply_status(sid, Code.INVALID_ARGUMENT, "StreamID is no longer active"))
            return
        if frame.type != MessageType.REQUEST:
            self._log.debug("ignoring ttrpc message of type %d on stream %d", frame.type, sid)
            return
        if sid <= self._last_stream_id:
            self._spawn(
                self._reply_status(
                    sid, Code.INVALID_ARGUMENT, "StreamID cannot be re-used and must increment"
                )
            )
            return
        self._last_stream_id = sid
        try:
            req = parse(ttrpc_pb2.Request, frame.payload, "ttrpc request")
        except TtrpcError as e:
            self._spawn(
                self._reply_status(sid, Code.INVALID_ARGUMENT, f"unmarshal request error: {e.message}")
            )
            return
        methods = self._services.get(req.service)
        if methods is None:
            self._spawn(self._reply_status(sid, Code.UNIMPLEMENTED, f"service {req.service}"))
            return
        handler = methods.get(req.method)
        if handler is None:
            self._spawn(self._reply_status(sid, Code.UNIMPLEMENTED, f"method {req.method}"))
            return
        self._spawn(self._serve(sid, req, handler))

    async def close(self) -> None:
        """Cancel every running handler; nothing more is answered."""
        self._closed = True
        await self._tasks.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    async def _serve(self, sid: int, req: ttrpc_pb2.Request, handler: Handler) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.timeout_nano / 1e9 if req.timeout_nano > 0 else None
        resp = ttrpc_pb2.Response()
        try:
            async with asyncio.timeout_at(deadline) as cm:
                resp.payload = await handler(req.payload, deadline)
        except TtrpcError as e:
            resp.status.CopyFrom(e.status())
        except TimeoutError as e:
            if cm.expired():
                resp.status.code = Code.DEADLINE_EXCEEDED
                resp.status.message = f"{req.service}/{req.method}: caller's deadline passed"
            else:
                resp.status.code = Code.UNKNOWN
                resp.status.message = str(e) or repr(e)
        except Exception as e:
            # Go's server turns a plain error into UNKNOWN with its text; do the same.
            self._log.exception(
                "ttrpc handler failed", extra=log_fields(method=f"{req.service}/{req.method}")
            )
            resp.status.code = Code.UNKNOWN
            resp.status.message = str(e) or repr(e)
        data = resp.SerializeToString()
        if len(data) > MAX_MESSAGE_LEN:
            log.error(
                "ttrpc response of %d bytes exceeds the limit; answering RESOURCE_EXHAUSTED",
                len(data),
                extra=log_fields(method=f"{req.service}/{req.method}"),
            )
            await self._reply_status(
                sid, Code.RESOURCE_EXHAUSTED, f"response of {len(data)} bytes exceeds {MAX_MESSAGE_LEN}"
            )
            return
        await self._write(sid, data)

    async def _reply_status(self, sid: int, code: Code, message: str) -> None:
        self._log.debug("ttrpc answering %s: %s", code.name, message, extra=log_fields(stream=sid))
        resp = ttrpc_pb2.Response()
        resp.status.code = code
        resp.status.message = message
        await self._write(sid, resp.SerializeToString())

    async def _write(self, sid: int, data: bytes) -> None:
        # Framed here, not by encode_message (which refuses stream 0 for the client's
        # calls): a bad stream id is answered on that same id, stream 0 too, as Go's
        # server does. Callers keep ``data`` within MAX_MESSAGE_LEN.
        try:
            await self._send(Header(len(data), sid, MessageType.RESPONSE).encode() + data)
        except (ConnectionError, OSError) as e:
            self._log.debug("ttrpc response on stream %d not sent: %s", sid, e)


class TtrpcClient:
    """Unary calls with odd, strictly increasing stream ids."""

    def __init__(self, send: Send, name: str = "ttrpc") -> None:
        self._send = send
        self._name = name
        self._log = FieldsLogger(log, conn=name)
        self._next_id = 1
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._closed: BaseException | None = None

    def dispatch(self, frame: Frame) -> None:
        """Accept one received frame; never waits."""
        fut = self._pending.get(frame.stream_id)
        if fut is None or fut.done():
            self._log.debug("ttrpc response for unknown stream %d dropped", frame.stream_id)
            return
        fut.set_result(frame)

    def close(self, reason: BaseException | None = None) -> None:
        """Fail every pending and future call with ConnectionClosed."""
        if self._closed is None:
            self._closed = reason or ConnectionClosed(f"{self._name}: connection closed")
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionClosed(f"{self._name}: connection closed ({self._closed})"))

    async def call(
        self,
        service: str,
        method: str,
        payload: bytes,
        timeout_s: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> bytes:
        """Send one request and wait for its response payload. TtrpcError with
        the peer's status, DEADLINE_EXCEEDED when ``timeout_s`` passes first,
        ConnectionClosed if the connection goes away."""
        if self._closed is not None:
            raise ConnectionClosed(f"{self._name}: connection closed ({self._closed})")
        sid = self._next_id
        if sid > MAX_STREAM_ID:
            raise ConnectionClosed(f"{self._name}: ttrpc stream ids exhausted")
        self._next_id += 2
        req = ttrpc_pb2.Request(service=service, method=method, payload=payload)
        if timeout_s is not None:
            req.timeout_nano = max(1, int(timeout_s * 1e9))
        for k, v in (metadata or {}).items():
            req.metadata.add(key=k, value=v)
        data = req.SerializeToString()
        if len(data) > MAX_MESSAGE_LEN:
            raise TtrpcError(
                Code.RESOURCE_EXHAUSTED, f"request of {len(data)} bytes exceeds {MAX_MESSAGE_LEN}"
            )
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[sid] = fut
        try:
            async with asyncio.timeout(timeout_s) as cm:
                await self._send(encode_message(sid, MessageType.REQUEST, data))
                frame = await fut
        except TimeoutError:
            if cm.expired():
                raise TtrpcError(
                    Code.DEADLINE_EXCEEDED, f"{service}/{method}: no answer within {timeout_s}s"
                ) from None
            raise
        finally:
            del self._pending[sid]
        if frame.oversized:
            raise TtrpcError(
                Code.RESOURCE_EXHAUSTED, f"{service}/{method}: response exceeds {MAX_MESSAGE_LEN} bytes"
            )
        if frame.type != MessageType.RESPONSE:
            raise TtrpcError(Code.INTERNAL, f"{service}/{method}: unexpected message type {frame.type}")
        resp = parse(ttrpc_pb2.Response, frame.payload, f"{service}/{method} response")
        if resp.HasField("status") and resp.status.code != Code.OK:
            raise TtrpcError(resp.status.code, resp.status.message)
        return resp.payload

    async def call_message(
        self,
        service: str,
        method: str,
        request: ProtoMessage,
        response_type: type[M],
        timeout_s: float | None = None,
    ) -> M:
        """``call`` with protobuf messages in and out."""
        payload = await self.call(service, method, request.SerializeToString(), timeout_s)
        return parse(response_type, payload, f"{service}/{method}")


__all__ = [
    "ConnectionClosed",
    "Handler",
    "ProtoMessage",
    "Send",
    "TtrpcClient",
    "TtrpcError",
    "TtrpcServer",
    "code_name",
    "parse",
]
