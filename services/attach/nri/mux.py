"""NRI's connection multiplexer framing (nri pkg/net/multiplex), pure: no I/O.

One unix stream carries several logical byte streams. Each mux frame is
[conn id u32 BE][payload length u32 BE][payload]; conn id 1 carries the Plugin
service (runtime calls the plugin), conn id 2 the Runtime service (plugin calls
the runtime). A frame's payload is an arbitrary slice of that conn's stream.
"""

from __future__ import annotations

import struct

from services.attach.nri.ttrpc import HEADER_LEN, ProtocolError

MUX_HEADER_LEN = 8
PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2
# Go's reader hands one whole mux frame to each Read() of its 4096-byte bufio
# buffer and fails with ENOMEM when the frame does not fit; a larger frame is
# only safe where a >= 4096-byte remainder of a ttrpc payload starts. Writing
# what Go's own bufio.Writer writes is safe: the first 4096 bytes of a ttrpc
# message (10-byte header + 4086 payload bytes), then all the rest in one frame.
GO_BUFIO_SIZE = 4096
FIRST_FRAME_PAYLOAD = GO_BUFIO_SIZE - HEADER_LEN
# The largest frame NRI v0.6's writer allows; anything larger is a broken peer.
MAX_FRAME_LEN = 1 << 24

_MUX_HEADER = struct.Struct(">II")


def frame(conn_id: int, payload: bytes | memoryview) -> bytes:
    """One mux frame. Empty payloads are refused: Go would hand them up as a
    zero-length read, which readers take as end of stream."""
    if not payload:
        raise ValueError("refusing to write an empty mux frame")
    if len(payload) > MAX_FRAME_LEN:
        raise ValueError(f"mux frame payload of {len(payload)} bytes exceeds {MAX_FRAME_LEN}")
    return _MUX_HEADER.pack(conn_id, len(payload)) + bytes(payload)


def frames_for_message(conn_id: int, message: bytes) -> list[bytes]:
    """The mux frames carrying one whole ttrpc message (header + payload):
    one frame when it fits Go's 4096-byte buffer, otherwise two, split after
    FIRST_FRAME_PAYLOAD payload bytes."""
    if len(message) < HEADER_LEN:
        raise ValueError(f"not a ttrpc message: {len(message)} bytes")
    view = memoryview(message)
    if len(message) <= GO_BUFIO_SIZE:
        return [frame(conn_id, view)]
    return [frame(conn_id, view[:GO_BUFIO_SIZE]), frame(conn_id, view[GO_BUFIO_SIZE:])]


class MuxDecoder:
    """Cuts the trunk byte stream, fed in chunks of any size, into
    (conn id, payload) pairs."""

    def __init__(self, max_frame: int = MAX_FRAME_LEN) -> None:
        self._buf = bytearray()
        self._max = max_frame

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        """Every complete frame now buffered. ProtocolError on a frame
        length no NRI peer writes."""
        self._buf += data
        buf = self._buf
        pos = 0
        out: list[tuple[int, bytes]] = []
        while len(buf) - pos >= MUX_HEADER_LEN:
            conn_id, length = _MUX_HEADER.unpack_from(buf, pos)
            if length > self._max:
                raise ProtocolError(f"mux frame for conn {conn_id} of {length} bytes exceeds {self._max}")
            end = pos + MUX_HEADER_LEN + length
            if end > len(buf):
                break
            with memoryview(buf) as mv:
                out.append((conn_id, bytes(mv[pos + MUX_HEADER_LEN : end])))
            pos = end
        if pos:
            del buf[:pos]
        return out
