"""ttrpc message framing (containerd/ttrpc), pure: no I/O.

A ttrpc message is a 10-byte big-endian header (payload length u32, stream id u32,
message type u8, flags u8) followed by the payload. NRI uses unary calls only: one
Request frame from the client, one Response frame with the same stream id back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag

from proto.google.rpc import status_pb2

HEADER_LEN = 10
# ttrpc's messageLengthMax: larger payloads are refused with RESOURCE_EXHAUSTED.
MAX_MESSAGE_LEN = 4 << 20
MAX_STREAM_ID = 0xFFFFFFFF

_HEADER = struct.Struct(">IIBB")


class MessageType(IntEnum):
    REQUEST = 0x01
    RESPONSE = 0x02
    DATA = 0x03


class Flag(IntFlag):
    NONE = 0
    REMOTE_CLOSED = 0x01
    REMOTE_OPEN = 0x02
    NO_DATA = 0x04


class Code(IntEnum):
    """gRPC status codes, as ttrpc carries them in google.rpc.Status.code."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def code_name(code: int) -> str:
    """``UNIMPLEMENTED`` for 12; the bare number for codes outside the table."""
    try:
        return Code(code).name
    except ValueError:
        return str(code)


class TtrpcError(Exception):
    """A call ended with a non-OK status (raised by clients, answered by servers)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code_name(code)}: {message}")
        self.code = code
        self.message = message

    def status(self) -> status_pb2.Status:
        return status_pb2.Status(code=int(self.code), message=self.message)


class ProtocolError(Exception):
    """The peer broke the framing; the connection cannot continue."""


@dataclass(frozen=True)
class Header:
    length: int
    stream_id: int
    type: int
    flags: int = 0

    def encode(self) -> bytes:
        return _HEADER.pack(self.length, self.stream_id, self.type, self.flags)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview, offset: int = 0) -> Header:
        if len(data) - offset < HEADER_LEN:
            raise ProtocolError(f"ttrpc header needs {HEADER_LEN} bytes, got {len(data) - offset}")
        length, stream_id, mtype, flags = _HEADER.unpack_from(data, offset)
        return cls(length, stream_id, mtype, flags)


@dataclass(frozen=True)
class Frame:
    """One received ttrpc message. ``oversized`` frames had a length above
    MAX_MESSAGE_LEN; their payload was skipped and is empty here."""

    stream_id: int
    type: int
    flags: int
    payload: bytes
    oversized: bool = False


def encode_message(stream_id: int, mtype: int, payload: bytes, flags: int = 0) -> bytes:
    """Header plus payload. ValueError if the payload is larger than ttrpc allows."""
    if len(payload) > MAX_MESSAGE_LEN:
        raise ValueError(f"ttrpc payload of {len(payload)} bytes exceeds the {MAX_MESSAGE_LEN}-byte limit")
    if not 0 < stream_id <= MAX_STREAM_ID:
        raise ValueError(f"ttrpc stream id {stream_id} out of range")
    return Header(len(payload), stream_id, mtype, flags).encode() + payload


class FrameDecoder:
    """Cuts a ttrpc byte stream, fed in chunks of any size, into Frames.

    An oversized message is reported as soon as its header is read and its
    payload is then discarded as it arrives, as Go's server does, so one bad
    message costs neither memory nor the connection.
    """

    def __init__(self, max_len: int = MAX_MESSAGE_LEN) -> None:
        self._buf = bytearray()
        self._skip = 0
        self._max = max_len

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        out: list[Frame] = []
        view = memoryview(data)
        if self._skip:
            n = min(self._skip, len(view))
            self._skip -= n
            view = view[n:]
        self._buf += view
        pos = 0
        buf = self._buf
        while len(buf) - pos >= HEADER_LEN:
            h = Header.decode(buf, pos)
            if h.length > self._max:
                out.append(Frame(h.stream_id, h.type, h.flags, b"", oversized=True))
                avail = len(buf) - pos - HEADER_LEN
                if avail >= h.length:
                    pos += HEADER_LEN + h.length
                    continue
                self._skip = h.length - avail
                pos = len(buf)
                break
            end = pos + HEADER_LEN + h.length
            if end > len(buf):
                break
            with memoryview(buf) as mv:
                payload = bytes(mv[pos + HEADER_LEN : end])
            out.append(Frame(h.stream_id, h.type, h.flags, payload))
            pos = end
        if pos:
            del buf[:pos]
        return out
