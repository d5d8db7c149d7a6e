"""Malformed NRI traffic against the plugin's real connection stack, in process: the mux
trunk, the ttrpc server and client, and NriStub's own Plugin service (Configure,
Synchronize, StateChange and the event RPCs, parsing real NRI messages), over a real
socketpair, written in pieces so the reader sees partial frames.

Property for every hostile stream: each answer is a well-formed ttrpc Response; the
connection then either answers a well-formed request sent after the garbage, or closes,
or (when the garbage left a frame unfinished) closes once the runtime closes its side,
all within a few seconds; nothing raises out of a task or the reader; and a new
connection to the same stub is served normally."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.connection import NriConnection
from services.attach.nri.rpc import ConnectionClosed
from services.attach.nri.stub import NriHandlers, NriStub, _Session
from services.attach.nri.ttrpc import Code, TtrpcError
from tests.fuzz.nri_wire import (
    PLUGIN,
    REQUEST,
    RUNTIME,
    Item,
    RuntimeEnd,
    hostile_streams,
    mux,
    request,
    ttrpc,
)

CASE_TIMEOUT_S = 10.0
FUZZ = settings(
    max_examples=120,
    deadline=None,  # each case bounds itself (CASE_TIMEOUT_S); a stuck reader fails it
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Hooks(NriHandlers):
    """The hooks attach subscribes to, doing nothing."""

    async def run_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        return None

    async def stop_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        return None

    async def remove_pod_sandbox(self, pod: nri_pb2.PodSandbox) -> None:
        return None

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.ContainerAdjustment | None:
        return None


class Unhandled(logging.Handler):
    """Records every log record carrying a traceback: a handler or task that raised."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self.records.append(record)


def configure_probe(sid: int) -> bytes:
    body = request(PLUGIN, "Configure", nri_pb2.ConfigureRequest(runtime_name="probe").SerializeToString())
    return mux(1, ttrpc(sid, REQUEST, body))


async def serve_one(stub: NriStub, items: Sequence[Item], pending_call: bool) -> str:
    """One connection fed ``items``; returns how it ended ("probe", "closed", "closed-after-shutdown")."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = await NriConnection.from_socket(a, stub._services(_Session()), name="fuzz")
    runtime = RuntimeEnd(b)
    call: asyncio.Task[bytes] | None = None
    if pending_call:
        # A call of the plugin's in flight (RegisterPlugin) when garbage comes back on conn 2.
        call = asyncio.create_task(conn.client.call(RUNTIME, "RegisterPlugin", b"", timeout_s=0.3))
    try:
        sent: set[int] = set()
        cut = False
        try:
            for item in items:
                sent |= item.sids
                cut = cut or item.cuts
                for i in range(0, len(item.wire), 7):
                    await runtime.send(item.wire[i : i + 7])
                    if i % 21 == 0:
                        await asyncio.sleep(0)  # let the reader see a partial frame
            probe = max([s for s in sent if s % 2] or [-1]) + 2
            probe = probe if 0 < probe <= 0xFFFFFFFF else 0xFFFFFFFF
            await runtime.send(configure_probe(probe))
        except (BrokenPipeError, ConnectionResetError):
            probe = -1  # the plugin closed the connection while we wrote: fine
        # After an unfinished frame the probe is swallowed: no need to wait long for it.
        answers = await runtime.answers(probe, quiet_s=0.15 if cut else 3.0)
        if not cut:
            # Framing stayed aligned: every answer is for a stream we opened.
            for sid, _ in answers:
                assert sid in sent | {probe}, f"answered stream {sid}, which nobody opened"
        if probe in {sid for sid, _ in answers}:
            ending = "probe"
        elif runtime.eof:
            ending = "closed"
        else:
            # The garbage left a frame unfinished, so the probe went into it: the
            # connection must end as soon as the runtime closes its side.
            assert cut, "a complete, well-formed request went unanswered"
            b.shutdown(socket.SHUT_WR)
            await runtime.answers(None, quiet_s=3.0)
            assert runtime.eof, "the plugin's reader is stuck: no close after the runtime's EOF"
            ending = "closed-after-shutdown"
        if call is not None:
            try:
                await asyncio.wait_for(call, 3.0)
            except (TtrpcError, ConnectionClosed):
                pass
    finally:
        await conn.close("test over")
        b.close()
    reader = conn._reader_task
    assert reader is not None and reader.done()
    assert reader.cancelled() or reader.exception() is None, f"reader raised {reader.exception()!r}"
    return ending


async def still_serves(stub: NriStub) -> None:
    """A new connection to the same stub: Configure is answered with the subscription."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    conn = await NriConnection.from_socket(a, stub._services(_Session()), name="fuzz-after")
    runtime = RuntimeEnd(b)
    try:
        await runtime.send(configure_probe(1))
        answers = await runtime.answers(1, quiet_s=3.0)
        resp = dict(answers).get(1)
        assert resp is not None, "a new connection is not served"
        assert resp.status.code == Code.OK, resp.status
        assert nri_pb2.ConfigureResponse.FromString(resp.payload).events == stub.mask
    finally:
        await conn.close("test over")
        b.close()


def run_case(items: Sequence[Item], pending_call: bool) -> str:
    async def main() -> str:
        loop = asyncio.get_running_loop()
        loop_errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, ctx: loop_errors.append(ctx))
        stub = NriStub(Hooks())
        async with asyncio.timeout(CASE_TIMEOUT_S):
            ending = await serve_one(stub, items, pending_call)
            await still_serves(stub)
        gc.collect()  # "Task exception was never retrieved" is reported when the task is collected
        await asyncio.sleep(0)
        assert not loop_errors, (
            f"unhandled in the event loop: {loop_errors[0].get('message')} {loop_errors[0].get('exception')!r}"
        )
        return ending

    unhandled = Unhandled()
    root = logging.getLogger()
    root.addHandler(unhandled)
    try:
        ending = asyncio.run(main())
    finally:
        root.removeHandler(unhandled)
    assert not unhandled.records, f"logged with a traceback: {unhandled.records[0].getMessage()}"
    return ending


@FUZZ
@given(hostile_streams, st.booleans())
def test_hostile_streams_get_errors_or_a_close_and_never_a_stuck_reader(
    items: list[Item], pending_call: bool
) -> None:
    run_case(items, pending_call)


@pytest.mark.parametrize(
    ("wire", "ending"),
    [
        # Stream 0 is not a client stream: answered INVALID_ARGUMENT on stream 0, as Go does.
        (mux(1, ttrpc(0, REQUEST, request(PLUGIN, "Configure"))), "probe"),
        (mux(1, ttrpc(2, REQUEST, request(PLUGIN, "Configure"))), "probe"),
        (mux(1, ttrpc(1, 9, b"")), "probe"),  # unknown message type: ignored
        (mux(1, ttrpc(1, REQUEST, b"\xff\xff\xff")), "probe"),  # not a Request
        (mux(1, ttrpc(1, REQUEST, request(PLUGIN, "Configure", b"\x0a\xff"))), "probe"),  # bad payload
        (mux(1, b"x" * 16, length=(1 << 24) + 1), "closed"),  # a mux frame no NRI peer writes
        (mux(1, ttrpc(5, REQUEST, b"", length=(4 << 20) + 1)), "closed-after-shutdown"),
    ],
    ids=[
        "stream-0",
        "even-stream",
        "unknown-type",
        "not-a-request",
        "bad-payload",
        "mux-too-big",
        "oversized",
    ],
)
def test_known_malformed_frames(wire: bytes, ending: str) -> None:
    sid = int.from_bytes(wire[12:16]) if len(wire) >= 18 else 0
    assert run_case([Item(wire, {sid}, cuts=ending != "probe")], pending_call=False) == ending
