"""The real attach process (``python -m services.attach``, with a real store) against a
hostile NRI runtime: the test listens on the NRI socket, answers RegisterPlugin, then
sends malformed mux/ttrpc frames and odd but parseable NRI events on the plugin's
connection and closes it.

Property per hostile connection: what the plugin writes back is well-formed ttrpc;
the process stays up; and it reconnects and completes a proper registration,
Configure and Synchronize on the next connection."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dev.cluster.procs import ServiceProcess
from proto.nri.v1alpha1 import nri_pb2
from proto.ttrpc import ttrpc_pb2
from tests.fuzz.nri_wire import (
    PLUGIN,
    REQUEST,
    RESPONSE,
    Item,
    RuntimeEnd,
    hostile_streams,
    mux,
    request,
    ttrpc,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

CONNECT_TIMEOUT_S = 30.0  # generous: CI runs this beside Go builds on two cores


class HostileRuntime:
    """Accepts the plugin's connections on a Unix socket, one at a time."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.sock.setblocking(False)

    async def accept(self) -> RuntimeEnd:
        loop = asyncio.get_running_loop()
        conn, _ = await asyncio.wait_for(loop.sock_accept(self.sock), CONNECT_TIMEOUT_S)
        end = RuntimeEnd(conn)
        await register(end)
        return end

    def close(self) -> None:
        self.sock.close()


async def register(end: RuntimeEnd) -> None:
    """Read the plugin's RegisterPlugin on conn 2 and answer it."""
    async with asyncio.timeout(CONNECT_TIMEOUT_S):
        while True:
            for conn, sid, mtype, payload in end._messages():
                if conn == 2 and mtype == REQUEST:
                    req = ttrpc_pb2.Request.FromString(payload)
                    assert (req.service, req.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
                    nri_pb2.RegisterPluginRequest.FromString(req.payload)
                    body = ttrpc_pb2.Response(payload=nri_pb2.Empty().SerializeToString()).SerializeToString()
                    await end.send(mux(2, ttrpc(sid, RESPONSE, body)))
                    return
            assert await end._recv(CONNECT_TIMEOUT_S), "the plugin closed before registering"


async def call(end: RuntimeEnd, sid: int, method: str, payload: bytes) -> ttrpc_pb2.Response:
    await end.send(mux(1, ttrpc(sid, REQUEST, request(PLUGIN, method, payload, timeout_nano=2 * 10**9))))
    answers = await end.answers(sid, quiet_s=5.0)
    resp = dict(answers).get(sid)
    assert resp is not None, f"{method} on a fresh connection went unanswered"
    return resp


async def handshake(end: RuntimeEnd) -> None:
    """Configure and Synchronize, as containerd does after registration."""
    cfg = nri_pb2.ConfigureRequest(runtime_name="hostile", runtime_version="0", request_timeout=2000)
    resp = await call(end, 1, "Configure", cfg.SerializeToString())
    assert resp.status.code == 0, resp.status
    assert nri_pb2.ConfigureResponse.FromString(resp.payload).events != 0
    resp = await call(end, 3, "Synchronize", nri_pb2.SynchronizeRequest().SerializeToString())
    assert resp.status.code == 0, resp.status


def close(end: RuntimeEnd) -> None:
    with contextlib.suppress(OSError):
        end.sock.close()


odd_text = st.one_of(
    st.sampled_from(["", "../../etc/passwd", "/etc/passwd", "a/b", "\x00", "x\n", "a" * 300, "é👍"]),
    st.text(max_size=20),
)
odd_pods = st.builds(
    nri_pb2.PodSandbox,
    id=odd_text,
    name=odd_text,
    uid=odd_text,
    namespace=odd_text,
    linux=st.builds(
        nri_pb2.LinuxPodSandbox,
        namespaces=st.lists(
            st.builds(
                nri_pb2.LinuxNamespace,
                type=st.sampled_from(["network", "ipc", ""]),
                path=st.sampled_from(
                    ["", "/proc/self/ns/net", "/etc/passwd", "/dev/null", "../../x", "/nonexistent"]
                ),
            ),
            max_size=2,
        ),
    ),
)


@st.composite
def odd_events(draw: st.DrawFn) -> bytes:
    """A ttrpc Request carrying a parseable NRI event about an odd pod (the test gives
    it the next stream id, so that it reaches the hooks)."""
    pod = draw(odd_pods)
    method, payload = draw(
        st.sampled_from(
            [
                ("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=pod)),
                ("StopPodSandbox", nri_pb2.StopPodSandboxRequest(pod=pod)),
                ("RemovePodSandbox", nri_pb2.RemovePodSandboxRequest(pod=pod)),
                (
                    "CreateContainer",
                    nri_pb2.CreateContainerRequest(pod=pod, container=nri_pb2.Container(id="c")),
                ),
                ("StateChange", nri_pb2.StateChangeEvent(event=nri_pb2.RUN_POD_SANDBOX, pod=pod)),
            ]
        )
    )
    return request(PLUGIN, method, payload.SerializeToString(), timeout_nano=2 * 10**9)


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[ServiceProcess, HostileRuntime]]:
    d = Path(tempfile.mkdtemp(prefix="nrif-"))  # short: socket paths stay under 108 bytes
    run = d / "run"
    store = ServiceProcess(
        "services.store",
        ["--db-dir", str(d / "db"), "--run-dir", str(run)],
        run / "store.sock",
        d / "store.log",
    )
    runtime = HostileRuntime(str(d / "nri.sock"))
    attach = ServiceProcess(
        "services.attach",
        ["--run-dir", str(run), "--nri-socket", runtime.path, "--drain-timeout", "1", "--health-port", "0"],
        socket=run / "attach.sock",
        log_path=d / "attach.log",
    )
    try:
        store.start()
        attach.start(timeout=30)
        yield attach, runtime
    finally:
        attach.stop()
        store.stop()
        runtime.close()
        shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def connection(runtime: HostileRuntime) -> AsyncIterator[RuntimeEnd]:
    end = await runtime.accept()
    try:
        yield end
    finally:
        close(end)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(st.lists(odd_events(), max_size=4), hostile_streams)
def test_attach_survives_a_hostile_runtime(
    world: tuple[ServiceProcess, HostileRuntime], events: list[bytes], hostile: list[Item]
) -> None:
    attach, runtime = world

    async def main() -> None:
        async with asyncio.timeout(240):
            async with connection(runtime) as end:
                # Synchronized first, so events reach the hooks (and the store) for real.
                await handshake(end)
                sent: set[int] = {1, 3}
                cut = False
                probe = -1
                try:
                    for i, body in enumerate(events):
                        sid = 5 + 2 * i
                        sent.add(sid)
                        await end.send(mux(1, ttrpc(sid, REQUEST, body)))
                    # The hooks answer in their own time and in any order (they read the store).
                    waiting = set(range(5, 5 + 2 * len(events), 2))
                    while waiting:
                        got = await end.answers(None, quiet_s=5.0, stop_at=waiting)
                        assert got, f"no answer for events on streams {sorted(waiting)}"
                        waiting -= {sid for sid, _ in got}
                    for item in hostile:
                        sent |= item.sids
                        cut = cut or item.cuts
                        await end.send(item.wire)
                    probe = max(s for s in sent if s % 2) + 2
                    probe = min(probe, 0xFFFFFFFF)
                    cfg = nri_pb2.ConfigureRequest(runtime_name="probe").SerializeToString()
                    await end.send(mux(1, ttrpc(probe, REQUEST, request(PLUGIN, "Configure", cfg))))
                except (BrokenPipeError, ConnectionResetError):
                    pass
                # Every answer must be well-formed; an aligned stream answers the probe.
                answers = await end.answers(probe, quiet_s=0.3 if cut else 5.0)
                if not cut and not end.eof:
                    assert probe in dict(answers), "a well-formed request went unanswered"
            # The plugin reconnects and is served properly on its next connection.
            async with connection(runtime) as end:
                await handshake(end)
        assert attach.proc is not None and attach.proc.poll() is None, f"attach died:\n{attach.log()}"

    asyncio.run(main())


def test_attach_log_has_no_traceback(world: tuple[ServiceProcess, HostileRuntime]) -> None:
    """Runs after the fuzz test (same module): nothing raised unhandled in the process."""
    attach, _ = world
    log = attach.log()
    assert "Traceback" not in log, log[-5000:]
