"""A scripted NRI runtime for the stub's tests: it listens on a unix socket,
serves Runtime.RegisterPlugin on conn 2 and calls the Plugin service on conn 1,
as containerd does. The tests drive each accepted plugin connection step by step."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.connection import NriConnection
from services.attach.nri.mux import PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN
from services.attach.nri.rpc import ProtoMessage

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"
M = TypeVar("M", bound=ProtoMessage)


class PluginPeer:
    """The runtime's side of one plugin connection."""

    def __init__(self, runtime: FakeRuntime) -> None:
        self.runtime = runtime
        self.registered: asyncio.Future[nri_pb2.RegisterPluginRequest] = (
            asyncio.get_running_loop().create_future()
        )
        self.conn: NriConnection | None = None

    async def _register(self, payload: bytes, deadline: float | None) -> bytes:
        req = nri_pb2.RegisterPluginRequest.FromString(payload)
        if not self.registered.done():
            self.registered.set_result(req)
        # Lets a test answer RegisterPlugin only after Configure, as a runtime may.
        await self.runtime.register_gate.wait()
        return nri_pb2.Empty().SerializeToString()

    async def call(self, method: str, req: ProtoMessage, resp_type: type[M], timeout_s: float = 2.0) -> M:
        assert self.conn is not None
        return await self.conn.client.call_message(PLUGIN, method, req, resp_type, timeout_s)

    async def configure(self, name: str = "fake", version: str = "0.0", **extra: object) -> int:
        req = nri_pb2.ConfigureRequest(runtime_name=name, runtime_version=version, **extra)  # type: ignore[arg-type]
        return (await self.call("Configure", req, nri_pb2.ConfigureResponse)).events

    async def synchronize(
        self, pods: list[nri_pb2.PodSandbox] | None = None, more: bool = False
    ) -> nri_pb2.SynchronizeResponse:
        req = nri_pb2.SynchronizeRequest(pods=pods or [], more=more)
        return await self.call("Synchronize", req, nri_pb2.SynchronizeResponse)

    async def handshake(self) -> nri_pb2.RegisterPluginRequest:
        """Registration, Configure and an empty Synchronize, as a runtime does."""
        reg = await asyncio.wait_for(asyncio.shield(self.registered), 5)
        await self.configure()
        await self.synchronize()
        return reg

    async def event(self, event: int, pod: nri_pb2.PodSandbox) -> None:
        await self.call("StateChange", nri_pb2.StateChangeEvent(event=event, pod=pod), nri_pb2.Empty)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close("runtime closed the plugin")


class FakeRuntime:
    def __init__(self, path: str) -> None:
        self.path = path
        self.peers: asyncio.Queue[PluginPeer] = asyncio.Queue()
        self.register_gate = asyncio.Event()
        self.register_gate.set()
        self._server: asyncio.AbstractServer | None = None
        self._all: list[PluginPeer] = []

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._accept, self.path)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = PluginPeer(self)
        peer.conn = NriConnection(
            reader,
            writer,
            {RUNTIME: {"RegisterPlugin": peer._register}},
            serve_conn=RUNTIME_SERVICE_CONN,
            call_conn=PLUGIN_SERVICE_CONN,
            name="fake-runtime",
        )
        peer.conn.start()
        self._all.append(peer)
        await self.peers.put(peer)

    async def next_peer(self, timeout_s: float = 5.0) -> PluginPeer:
        return await asyncio.wait_for(self.peers.get(), timeout_s)

    async def stop(self) -> None:
        """Stop listening and drop every plugin connection."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for p in self._all:
            await p.close()
