"""The async NRI connection against a raw fake peer on a socketpair.

The peer writes and parses bytes with its own few lines of struct code, so the
connection is checked against the wire layout, not against itself."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Mapping

import pytest

from proto.ttrpc import ttrpc_pb2
from services.attach.nri.connection import NriConnection
from services.attach.nri.rpc import ConnectionClosed, Handler
from services.attach.nri.ttrpc import Code, TtrpcError

SVC = "nri.pkg.api.v1alpha1.Plugin"


class RawPeer:
    """The runtime's end of the socket, speaking raw mux and ttrpc bytes."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.buf = bytearray()
        self.streams: dict[int, bytearray] = {}
        self.frame_sizes: dict[int, list[int]] = {}

    async def send(self, data: bytes) -> None:
        await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def send_mux(self, conn: int, payload: bytes) -> None:
        await self.send(struct.pack(">II", conn, len(payload)) + payload)

    async def request(
        self,
        sid: int,
        method: str,
        payload: bytes = b"",
        service: str = SVC,
        timeout_nano: int = 0,
        conn: int = 1,
        msg_type: int = 1,
    ) -> None:
        body = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=timeout_nano
        ).SerializeToString()
        await self.send_mux(conn, struct.pack(">IIBB", len(body), sid, msg_type, 0) + body)

    async def _fill(self, n: int) -> None:
        loop = asyncio.get_running_loop()
        while len(self.buf) < n:
            data = await asyncio.wait_for(loop.sock_recv(self.sock, 1 << 16), 5)
            if not data:
                raise EOFError
            self.buf += data

    async def read_frame(self) -> tuple[int, bytes]:
        await self._fill(8)
        cid, n = struct.unpack_from(">II", self.buf)
        await self._fill(8 + n)
        payload = bytes(self.buf[8 : 8 + n])
        del self.buf[: 8 + n]
        return cid, payload

    async def response(self, conn: int = 1) -> tuple[int, ttrpc_pb2.Response, list[int]]:
        """The next whole ttrpc message on ``conn``: (stream id, Response, mux frame sizes)."""
        stream = self.streams.setdefault(conn, bytearray())
        sizes: list[int] = []
        while True:
            if len(stream) >= 10:
                n, sid, mtype, _ = struct.unpack_from(">IIBB", stream)
                if len(stream) >= 10 + n:
                    assert mtype == 2, f"expected a Response, got type {mtype}"
                    resp = ttrpc_pb2.Response.FromString(bytes(stream[10 : 10 + n]))
                    del stream[: 10 + n]
                    assert not stream, "two ttrpc messages shared a mux frame"
                    return sid, resp, sizes
            cid, payload = await self.read_frame()
            assert payload, "empty mux frame"
            self.streams.setdefault(cid, bytearray()).extend(payload)
            if cid == conn:
                sizes.append(len(payload))


def echo_services(**extra: Handler) -> Mapping[str, Mapping[str, Handler]]:
    async def echo(payload: bytes, deadline: float | None) -> bytes:
        return payload

    return {SVC: {"Echo": echo, **extra}}


@contextlib.asynccontextmanager
async def connected(
    services: Mapping[str, Mapping[str, Handler]],
) -> AsyncIterator[tuple[NriConnection, RawPeer]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = await NriConnection.from_socket(a, services, name="test")
    peer = RawPeer(b)
    try:
        yield conn, peer
    finally:
        await conn.close()
        b.close()


async def test_request_cut_into_tiny_mux_frames_among_foreign_conns() -> None:
    async with connected(echo_services()) as (_, peer):
        body = ttrpc_pb2.Request(service=SVC, method="Echo", payload=b"hello nri").SerializeToString()
        msg = struct.pack(">IIBB", len(body), 1, 1, 0) + body
        for i in range(len(msg)):
            await peer.send_mux(1, msg[i : i + 1])
            await peer.send_mux(9, b"dropped")  # unknown conn id
        sid, resp, sizes = await peer.response()
        assert sid == 1
        assert not resp.HasField("status")
        assert resp.payload == b"hello nri"
        assert sizes == [10 + len(resp.SerializeToString())]


@pytest.mark.parametrize(
    ("size", "frame_count"),
    [(4000, 1), (4076, 1), (4090, 2), (100_000, 2), ((4 << 20) - 16, 2)],
)
async def test_large_response_follows_the_safe_write_rule(size: int, frame_count: int) -> None:
    async def big(payload: bytes, deadline: float | None) -> bytes:
        return b"\x5a" * size

    async with connected(echo_services(Big=big)) as (_, peer):
        await peer.request(1, "Big")
        _, resp, sizes = await peer.response()
        assert resp.payload == b"\x5a" * size
        encoded = 10 + len(resp.SerializeToString())
        assert sizes == ([encoded] if frame_count == 1 else [4096, encoded - 4096])


async def test_response_above_the_limit_is_replaced_by_resource_exhausted() -> None:
    async def huge(payload: bytes, deadline: float | None) -> bytes:
        return b"\x5a" * (4 << 20)

    async with connected(echo_services(Huge=huge)) as (_, peer):
        await peer.request(1, "Huge")
        sid, resp, _ = await peer.response()
        assert (sid, resp.status.code, resp.payload) == (1, Code.RESOURCE_EXHAUSTED, b"")


async def test_responses_go_out_of_order_and_the_reader_never_waits_on_a_handler() -> None:
    release = asyncio.Event()

    async def slow(payload: bytes, deadline: float | None) -> bytes:
        await release.wait()
        return b"slow"

    async def fast(payload: bytes, deadline: float | None) -> bytes:
        release.set()
        return b"fast"

    async with connected(echo_services(Slow=slow, Fast=fast)) as (conn, peer):
        await peer.request(1, "Slow")
        await peer.request(3, "Fast")
        first = await peer.response()
        second = await peer.response()
        assert [(first[0], first[1].payload), (second[0], second[1].payload)] == [(3, b"fast"), (1, b"slow")]
        assert conn.server.active == 0


@pytest.mark.parametrize(
    ("service", "method", "message"),
    [
        ("nri.pkg.api.v1alpha1.Nope", "Configure", "service nri.pkg.api.v1alpha1.Nope"),
        (SVC, "RunPodSandbox", "method RunPodSandbox"),
    ],
)
async def test_unknown_service_or_method_is_unimplemented(service: str, method: str, message: str) -> None:
    async with connected(echo_services()) as (_, peer):
        await peer.request(1, method, service=service)
        sid, resp, _ = await peer.response()
        assert (sid, resp.status.code, resp.status.message) == (1, Code.UNIMPLEMENTED, message)


async def test_oversized_request_gets_resource_exhausted_and_the_connection_lives_on() -> None:
    async with connected(echo_services()) as (_, peer):
        n = (4 << 20) + 1
        await peer.send_mux(1, struct.pack(">IIBB", n, 5, 1, 0) + b"\x00" * 4086)
        await peer.send_mux(1, b"\x00" * (n - 4086))
        sid, resp, _ = await peer.response()
        assert (sid, resp.status.code) == (5, Code.RESOURCE_EXHAUSTED)
        await peer.request(7, "Echo", b"still here")
        sid, resp, _ = await peer.response()
        assert (sid, resp.payload) == (7, b"still here")


@pytest.mark.parametrize(
    ("sids", "message"),
    [
        ([2], "StreamID must be odd for client initiated streams"),
        ([5, 3], "StreamID cannot be re-used and must increment"),
        ([5, 5], "StreamID cannot be re-used and must increment"),
    ],
)
async def test_bad_stream_ids_are_invalid_argument(sids: list[int], message: str) -> None:
    async with connected(echo_services()) as (_, peer):
        for sid in sids:
            await peer.request(sid, "Echo", b"x")
        answers = [await peer.response() for _ in sids]
        last = answers[-1]
        assert (last[0], last[1].status.code, last[1].status.message) == (
            sids[-1],
            Code.INVALID_ARGUMENT,
            message,
        )


async def test_handler_errors_become_statuses() -> None:
    async def boom(payload: bytes, deadline: float | None) -> bytes:
        raise RuntimeError("pod default/a: device eth9 not found")

    async def denied(payload: bytes, deadline: float | None) -> bytes:
        raise TtrpcError(Code.FAILED_PRECONDITION, "not ready")

    async with connected(echo_services(Boom=boom, Denied=denied)) as (_, peer):
        await peer.request(1, "Boom")
        await peer.request(3, "Denied")
        got = {
            sid: (r.status.code, r.status.message)
            for sid, r, _ in [await peer.response(), await peer.response()]
        }
        assert got == {
            1: (Code.UNKNOWN, "pod default/a: device eth9 not found"),
            3: (Code.FAILED_PRECONDITION, "not ready"),
        }


async def test_callers_deadline_cancels_the_handler() -> None:
    cancelled = asyncio.Event()

    async def hang(payload: bytes, deadline: float | None) -> bytes:
        assert deadline is not None
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    async with connected(echo_services(Hang=hang)) as (_, peer):
        await peer.request(1, "Hang", timeout_nano=50_000_000)
        sid, resp, _ = await peer.response()
        assert (sid, resp.status.code) == (1, Code.DEADLINE_EXCEEDED)
        assert cancelled.is_set()


# -- client side (conn 2) ------------------------------------------------------------------------


async def test_client_stream_ids_are_odd_and_increasing_and_statuses_are_raised() -> None:
    async with connected(echo_services()) as (conn, peer):
        calls = [
            asyncio.create_task(conn.client.call("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"r", 1.0))
            for _ in range(3)
        ]
        seen = []
        for _ in calls:
            cid, payload = await peer.read_frame()
            assert cid == 2
            n, sid, mtype, flags = struct.unpack_from(">IIBB", payload)
            req = ttrpc_pb2.Request.FromString(payload[10 : 10 + n])
            assert (mtype, flags, req.service, req.method, req.payload) == (
                1,
                0,
                "nri.pkg.api.v1alpha1.Runtime",
                "RegisterPlugin",
                b"r",
            )
            assert 0 < req.timeout_nano <= 1_000_000_000
            seen.append(sid)
        assert seen == [1, 3, 5]
        # Answer out of order: OK without status, OK with an explicit code 0, and an error.
        answers = {
            5: ttrpc_pb2.Response(payload=b"five"),
            1: ttrpc_pb2.Response(payload=b"one", status={"code": 0}),
            3: ttrpc_pb2.Response(status={"code": 3, "message": "invalid plugin index"}),
        }
        for sid, resp in answers.items():
            body = resp.SerializeToString()
            await peer.send_mux(2, struct.pack(">IIBB", len(body), sid, 2, 0) + body)
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results[0] == b"one"
        assert isinstance(results[1], TtrpcError) and results[1].code == Code.INVALID_ARGUMENT
        assert results[1].message == "invalid plugin index"
        assert results[2] == b"five"


async def test_client_deadline_and_close() -> None:
    async with connected(echo_services()) as (conn, peer):
        with pytest.raises(TtrpcError) as e:
            await conn.client.call("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"", 0.05)
        assert e.value.code == Code.DEADLINE_EXCEEDED
        pending = asyncio.create_task(
            conn.client.call("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"", 5)
        )
        await peer.read_frame()
        peer.sock.close()  # the runtime goes away
        with pytest.raises(ConnectionClosed):
            await pending
        await asyncio.wait_for(conn.wait_closed(), 5)
        assert "closed" in conn.close_reason
        with pytest.raises(ConnectionClosed):
            await conn.client.call("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin", b"", 1)


async def test_close_cancels_running_handlers() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def hang(payload: bytes, deadline: float | None) -> bytes:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return b""

    async with connected(echo_services(Hang=hang)) as (conn, peer):
        await peer.request(1, "Hang")
        await asyncio.wait_for(started.wait(), 5)
        await conn.close()
        assert cancelled.is_set()
        assert conn.closed
