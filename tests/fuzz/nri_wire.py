"""Raw NRI wire bytes for the fuzz tests: mux frames, ttrpc messages and protobuf-shaped
garbage, written with their own few lines of struct code (not the code under test), and
a runtime-side reader that checks every answer is a well-formed ttrpc Response."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
from dataclasses import dataclass, field

from hypothesis import strategies as st

from proto.nri.v1alpha1 import nri_pb2
from proto.ttrpc import ttrpc_pb2

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
REQUEST, RESPONSE, DATA = 1, 2, 3
MAX_TTRPC = 4 << 20
MAX_MUX = 1 << 24


def mux(conn: int, payload: bytes, length: int | None = None) -> bytes:
    return struct.pack(">II", conn, len(payload) if length is None else length) + payload


def ttrpc(sid: int, mtype: int, payload: bytes, flags: int = 0, length: int | None = None) -> bytes:
    return struct.pack(">IIBB", len(payload) if length is None else length, sid, mtype, flags) + payload


def request(service: str, method: str, payload: bytes = b"", timeout_nano: int = 0) -> bytes:
    return ttrpc_pb2.Request(
        service=service, method=method, payload=payload, timeout_nano=timeout_nano
    ).SerializeToString()


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


# -- protobuf-shaped garbage --------------------------------------------------------------------

VALID_PAYLOADS = [
    nri_pb2.ConfigureRequest(
        runtime_name="fuzz", runtime_version="0", request_timeout=2000
    ).SerializeToString(),
    nri_pb2.SynchronizeRequest(pods=[nri_pb2.PodSandbox(id="p", uid="u")]).SerializeToString(),
    nri_pb2.StateChangeEvent(
        event=nri_pb2.RUN_POD_SANDBOX, pod=nri_pb2.PodSandbox(uid="u")
    ).SerializeToString(),
    nri_pb2.RunPodSandboxRequest(pod=nri_pb2.PodSandbox(uid="../../etc", name="\x00")).SerializeToString(),
    nri_pb2.CreateContainerRequest(
        pod=nri_pb2.PodSandbox(uid="u"), container=nri_pb2.Container(id="c")
    ).SerializeToString(),
]


@st.composite
def protobuf_garbage(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Tag/value sequences of every wire type, valid or not: unknown and zero field
    numbers, group and reserved wire types, truncated and over-long varints, lengths
    that lie, nested messages."""
    parts: list[bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        num = draw(st.one_of(st.integers(1, 20), st.sampled_from([0, 2**29 - 1, 19000, 2**29])))
        wt = draw(st.integers(0, 7))
        parts.append(varint((num << 3) | wt))
        if wt == 0:
            parts.append(
                draw(
                    st.one_of(
                        st.integers(0, 2**64 - 1).map(varint),
                        st.just(b"\xff" * 11),  # an 11-byte varint: too long
                        st.just(b"\x80"),  # truncated
                    )
                )
            )
        elif wt == 1:
            parts.append(draw(st.binary(min_size=0, max_size=8)))
        elif wt == 2:
            inner = (
                draw(protobuf_garbage(depth + 1))
                if depth < 3 and draw(st.booleans())
                else draw(st.binary(max_size=40))
            )
            lie = draw(st.sampled_from([0, 0, 0, 1, -1, 1000, 2**31]))
            parts.append(varint(max(0, len(inner) + lie)) + inner)
        elif wt == 5:
            parts.append(draw(st.binary(min_size=0, max_size=4)))
        else:
            parts.append(draw(st.binary(max_size=8)))
    return b"".join(parts)


def nested(depth: int) -> bytes:
    """Field 1, length-delimited, nested ``depth`` times (past any decoder's limit)."""
    body = b""
    for _ in range(depth):
        body = b"\x0a" + varint(len(body)) + body
    return body


payloads = st.one_of(
    st.sampled_from(VALID_PAYLOADS),
    st.sampled_from(VALID_PAYLOADS).flatmap(
        lambda p: st.integers(0, max(0, len(p) - 1)).map(lambda n: p[:n])  # truncated
    ),
    st.sampled_from(VALID_PAYLOADS).flatmap(
        lambda p: st.tuples(st.integers(0, max(0, len(p) - 1)), st.integers(0, 255)).map(
            lambda t: p[: t[0]] + bytes([t[1]]) + p[t[0] + 1 :] if p else p  # one byte changed
        )
    ),
    protobuf_garbage(),
    st.binary(max_size=200),
    st.sampled_from([nested(200), nested(2000)]),
)
methods = st.sampled_from(
    [
        "Configure",
        "Synchronize",
        "StateChange",
        "RunPodSandbox",
        "StopPodSandbox",
        "RemovePodSandbox",
        "CreateContainer",
        "UpdateContainer",
        "Shutdown",
        "NoSuchMethod",
        "",
        "../Configure",
        "Configure\x00",
    ]
)
services = st.sampled_from([PLUGIN, PLUGIN, PLUGIN, RUNTIME, "", "nri.pkg.api.v1alpha1.Plugin2", "x"])
stream_ids = st.one_of(
    st.integers(1, 200).map(lambda n: 2 * n + 1),
    st.sampled_from([0, 1, 2, 3, 4, 0x7FFFFFFF, 0xFFFFFFFE, 0xFFFFFFFF]),
)


@dataclass
class Item:
    """One piece of a hostile stream, as bytes on the trunk."""

    wire: bytes
    sids: set[int] = field(default_factory=set)
    # True when the bytes leave the ttrpc or mux stream mid-frame (the probe after
    # them is swallowed, and only closing our side may end the connection).
    cuts: bool = False


@st.composite
def ttrpc_items(draw: st.DrawFn) -> Item:
    sid = draw(stream_ids)
    mtype = draw(st.one_of(st.sampled_from([REQUEST, REQUEST, REQUEST, RESPONSE, DATA]), st.integers(0, 255)))
    flags = draw(st.one_of(st.just(0), st.integers(0, 255)))
    kind = draw(st.sampled_from(["request", "request", "raw", "zero", "short", "huge", "oversized"]))
    conn = draw(st.sampled_from([1, 1, 1, 1, 2, 0, 7]))
    if kind == "request":
        body = request(
            draw(services), draw(methods), draw(payloads), draw(st.sampled_from([0, 0, 1, 10**9, 2**63 - 1]))
        )
        msg = ttrpc(sid, mtype, body, flags)
    elif kind == "raw":
        msg = ttrpc(sid, mtype, draw(payloads), flags)
    elif kind == "zero":
        msg = ttrpc(sid, mtype, b"", flags)
    elif kind == "short":  # the header promises more than follows
        body = request(PLUGIN, "Configure", VALID_PAYLOADS[0])
        msg = ttrpc(sid, mtype, body[: draw(st.integers(0, len(body) - 1))], flags, length=len(body))
    elif kind == "huge":  # within ttrpc's limit, payload never sent
        msg = ttrpc(sid, mtype, b"", flags, length=draw(st.integers(1000, MAX_TTRPC)))
    else:  # above ttrpc's limit: answered RESOURCE_EXHAUSTED, payload skipped
        msg = ttrpc(sid, mtype, b"\x00" * 64, flags, length=draw(st.sampled_from([MAX_TTRPC + 1, 2**32 - 1])))
    cuts = kind in ("short", "huge", "oversized")
    # Cut the message across several mux frames, among frames for other conns.
    pieces = draw(st.lists(st.integers(1, max(1, len(msg))), max_size=3))
    points = sorted({0, len(msg), *(p % len(msg) for p in pieces)})
    wire = b""
    for a, b in itertools.pairwise(points):
        if b > a:
            wire += mux(conn, msg[a:b])
        if draw(st.booleans()):
            wire += mux(draw(st.sampled_from([0, 3, 9, 0xFFFFFFFF])), draw(st.binary(max_size=20)))
    return Item(wire, {sid} if conn == 1 else set(), cuts and conn in (1, 2))


@st.composite
def mux_items(draw: st.DrawFn) -> Item:
    """Mux frames whose length lies, and bytes that are no frame at all."""
    kind = draw(st.sampled_from(["lie-short", "lie-long", "too-big", "zero", "garbage"]))
    conn = draw(st.sampled_from([1, 2, 5]))
    if kind == "lie-short":
        payload = draw(st.binary(min_size=1, max_size=30))
        return Item(mux(conn, payload, length=draw(st.integers(0, len(payload) - 1))), cuts=True)
    if kind == "lie-long":
        payload = draw(st.binary(max_size=30))
        return Item(mux(conn, payload, length=len(payload) + draw(st.integers(1, 5000))), cuts=True)
    if kind == "too-big":  # no NRI peer writes this: the connection must close
        return Item(mux(conn, b"x" * 16, length=draw(st.sampled_from([MAX_MUX + 1, 2**32 - 1]))), cuts=True)
    if kind == "zero":
        return Item(mux(conn, b""))
    return Item(draw(st.binary(min_size=1, max_size=64)), cuts=True)


hostile_streams = st.lists(st.one_of(ttrpc_items(), ttrpc_items(), mux_items()), min_size=1, max_size=6)


# -- the runtime's side of the socket --------------------------------------------------------


class BadAnswer(AssertionError):
    """The plugin wrote something that is not a well-formed ttrpc Response."""


class RuntimeEnd:
    """Reads the plugin's mux frames and ttrpc messages off a raw socket."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.buf = bytearray()
        self.streams: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        self.eof = False

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def _recv(self, quiet_s: float) -> bool:
        """Read more; False on EOF or after ``quiet_s`` without data."""
        try:
            data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, 1 << 16), quiet_s)
        except TimeoutError:
            return False
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _messages(self) -> list[tuple[int, int, int, bytes]]:
        """Complete (conn, stream id, type, payload) messages now buffered."""
        while len(self.buf) >= 8:
            conn, n = struct.unpack_from(">II", self.buf)
            if n == 0 or n > MAX_MUX:
                raise BadAnswer(f"the plugin wrote a mux frame of {n} bytes")
            if len(self.buf) < 8 + n:
                break
            if conn not in self.streams:
                raise BadAnswer(f"the plugin wrote on conn {conn}")
            self.streams[conn] += self.buf[8 : 8 + n]
            del self.buf[: 8 + n]
        out = []
        for conn, stream in self.streams.items():
            while len(stream) >= 10:
                n, sid, mtype, _ = struct.unpack_from(">IIBB", stream)
                if n > MAX_TTRPC:
                    raise BadAnswer(f"the plugin wrote a ttrpc message of {n} bytes")
                if len(stream) < 10 + n:
                    break
                out.append((conn, sid, mtype, bytes(stream[10 : 10 + n])))
                del stream[: 10 + n]
        return out

    async def answers(
        self, until_sid: int | None, quiet_s: float, stop_at: set[int] | None = None
    ) -> list[tuple[int, ttrpc_pb2.Response]]:
        """Responses on conn 1 until the one for ``until_sid`` (or any in ``stop_at``),
        EOF or ``quiet_s`` without data. Each must be a ttrpc Response that parses."""
        got: list[tuple[int, ttrpc_pb2.Response]] = []
        while True:
            for conn, sid, mtype, payload in self._messages():
                if conn != 1:
                    continue  # the plugin's own calls (RegisterPlugin) go out on conn 2
                if mtype != RESPONSE:
                    raise BadAnswer(f"the plugin answered stream {sid} with message type {mtype}")
                try:
                    resp = ttrpc_pb2.Response.FromString(payload)
                except Exception as exc:
                    raise BadAnswer(f"stream {sid}: not a ttrpc Response: {exc}") from None
                got.append((sid, resp))
            # Only after the whole batch: what _messages() returned is not buffered again.
            if any(sid == until_sid or sid in (stop_at or ()) for sid, _ in got):
                return got
            if self.eof or not await self._recv(quiet_s):
                return got
