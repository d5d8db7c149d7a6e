"""Pytest plugin: a real containerd with NRI, a CRI client, a kubelet emulator and a fake DRA plugin.

Registered in tests/conftest.py (``pytest_plugins = ["tests.fixtures_runtime"]``). Tests that use
the runtime fixtures need root and carry the ``containerd`` marker (and ``root``).

Fixtures
- ``containerd_session``: one private containerd for the whole run (started on first use).
- ``containerd``: that instance, running at the start of the test; every pod left behind is removed
  afterwards (a stopped daemon is started again first).
- ``containerd_private``: a fresh instance of its own, for tests that restart or kill the runtime.
- ``cri_client``: an async CRI client on ``containerd``.
- ``kubelet_root``: a short, private kubelet root directory (AF_UNIX paths must stay < 108 bytes).
- ``make_kubelet``: ``await make_kubelet(runtime, api=None, **kw)`` -> a started ``Kubelet`` on
  ``kubelet_root``, stopped afterwards; its pods' netns are reported to the containerd fixture so
  teardown removes them even after a crash.
- ``fake_dra_plugin``: ``await fake_dra_plugin(**kw)`` -> a started ``FakeDraPlugin``.

Helpers: ``is_netns_mount(path)``, ``exists(path)``, ``mounted_under(dir)``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto.kubelet.dra.v1 import dra_pb2 as dra_v1_pb2
from proto.kubelet.dra.v1 import dra_pb2_grpc as dra_v1_pb2_grpc
from proto.kubelet.dra.v1beta1 import dra_pb2 as dra_v1beta1_pb2
from proto.kubelet.dra.v1beta1 import dra_pb2_grpc as dra_v1beta1_pb2_grpc
from proto.kubelet.pluginregistration.v1 import registration_pb2, registration_pb2_grpc
from services.devcluster.containerd import Containerd, running
from services.devcluster.cri import CriClient
from services.devcluster.kubelet import Api, Kubelet
from shared.rpc import UdsServer

# ----------------------------------------------------------------------------------------------
# Host checks tests use around pods


def is_netns_mount(path: str) -> bool:
    """True when ``path`` is a bind mount of a network namespace (what `ip netns` lists)."""
    real = os.path.realpath(path)  # /var/run is a symlink to /run
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fields[4] == real and fstype == "nsfs":
                return True
    return False


def exists(path: str | Path) -> bool:
    return os.path.lexists(path)


def mounted_under(prefix: Path) -> bool:
    return any(str(prefix) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.fixture(scope="session")
def containerd_session() -> Iterator[Containerd]:
    with running() as c:
        yield c


@pytest.fixture
def containerd(containerd_session: Containerd) -> Iterator[Containerd]:
    c = containerd_session
    c.start()
    yield c
    c.start()
    c.remove_all_pods()


@pytest.fixture
def containerd_private() -> Iterator[Containerd]:
    with running() as c:
        yield c


@pytest.fixture
async def cri_client(containerd: Containerd) -> AsyncIterator[CriClient]:
    client = CriClient(containerd.grpc_socket)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="dnkl-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def make_kubelet(
    kubelet_root: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[..., Awaitable[Kubelet]]]:
    started: list[Kubelet] = []

    async def make(
        runtime: CriClient, api: Api | None = None, node_name: str = "node-1", **kw: Any
    ) -> Kubelet:
        if "on_netns" not in kw and "containerd" in request.fixturenames:
            kw["on_netns"] = request.getfixturevalue("containerd").note_netns
        k = Kubelet(node_name, kubelet_root, runtime, api=api, **kw)
        await k.start()
        started.append(k)
        return k

    try:
        yield make
    finally:
        for k in started:
            await k.stop()


# ----------------------------------------------------------------------------------------------
# A fake DRA plugin: the registration and DRAPlugin services of a kubelet plugin, over the real
# protos, with switches for the failures the kubelet must handle.


@dataclass(frozen=True)
class DraCall:
    version: str  # "v1" or "v1beta1": the service package that was called
    method: str  # NodePrepareResources | NodeUnprepareResources
    claims: tuple[tuple[str, str, str], ...]  # (namespace, name, uid)
    at_ns: int = field(default_factory=time.time_ns)


class FakeDraPlugin:
    """Serves ``pluginregistration.Registration`` on ``<root>/plugins_registry/<driver>-reg.sock``
    and DRAPlugin (the ``serve`` versions) on ``<root>/plugins/<driver>/dra.sock``.

    Prepare is idempotent and answers one device per claim (pool = node, device = ``dev-<name>``).
    Switches: ``get_info_error`` (GetInfo fails), ``prepare_errors``/``unprepare_errors`` (claim UID ->
    per-claim error), ``prepare_error_all`` (every claim fails), ``prepare_abort``/``unprepare_abort``
    (a gRPC status code for the whole call).
    """

    def __init__(
        self,
        kubelet_root: Path,
        driver: str = "dra.net",
        versions: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
        serve: Sequence[str] = ("v1", "v1beta1"),
        plugin_type: str = "DRAPlugin",
        endpoint_name: str = "dra.sock",
        registration_name: str | None = None,
        pool: str = "node-1",
    ) -> None:
        self.driver = driver
        self.versions = list(versions)
        self.plugin_type = plugin_type
        self.pool = pool
        self.reg_socket = kubelet_root / "plugins_registry" / (registration_name or f"{driver}-reg.sock")
        self.endpoint = kubelet_root / "plugins" / driver / endpoint_name
        self.calls: list[DraCall] = []
        self.statuses: list[tuple[bool, str]] = []
        self.get_info_calls = 0
        self.get_info_error = False
        self.prepare_errors: dict[str, str] = {}
        self.prepare_error_all = ""  # when set, every claim fails with it
        self.unprepare_errors: dict[str, str] = {}
        self.prepare_abort: grpc.StatusCode | None = None
        self.unprepare_abort: grpc.StatusCode | None = None
        self.prepared: set[str] = set()
        # Called on every DRA call before it is answered, e.g. to look at the host at that moment.
        self.on_call: Callable[[DraCall], None] | None = None
        self._reg: UdsServer | None = None
        self._retired: list[UdsServer] = []
        self._dra = UdsServer(self.endpoint, mode=0o600)
        stubs = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
        for v in serve:
            pb, pb_grpc = stubs[v]
            self._dra.add(
                lambda s, pb=pb, pb_grpc=pb_grpc, v=v: pb_grpc.add_DRAPluginServicer_to_server(
                    _Dra(self, v, pb), s
                )
            )
        self.registration_up = False

    async def start(self) -> FakeDraPlugin:
        """DRA service first, registration socket last (what the kubelet sees appear)."""
        await self._dra.start()
        await self.start_registration()
        return self

    async def start_registration(self) -> None:
        self._reg = UdsServer(self.reg_socket, mode=0o600)
        self._reg.add(
            lambda s: registration_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), s)
        )
        await self._reg.start()
        self.registration_up = True

    async def stop_registration(self) -> None:
        """Stop the registration server; its socket file is removed."""
        if self.registration_up and self._reg is not None:
            await self._reg.stop(grace=0)
            self.registration_up = False

    async def replace_registration(self) -> None:
        """Atomically put a new registration socket (new inode) where the old one was, as a
        restarted plugin does; the old server keeps running on the unlinked socket."""
        old = self._reg
        tmp = self.reg_socket.with_name(f".{self.reg_socket.name}.new")  # hidden: the kubelet ignores it
        new = UdsServer(tmp, mode=0o600)
        new.add(lambda s: registration_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), s))
        await new.start()
        tmp.rename(self.reg_socket)
        new.path = self.reg_socket
        self._reg = new
        if old is not None:
            self._retired.append(old)

    async def stop(self) -> None:
        # Retired servers first: stopping one unlinks the path the current server now owns.
        for old in self._retired:
            await old.server.stop(0)
        await self.stop_registration()
        await self._dra.stop(grace=0)

    def calls_of(self, method: str) -> list[DraCall]:
        return [c for c in self.calls if c.method == method]


class _Registration(registration_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugin: FakeDraPlugin) -> None:
        self.p = plugin

    async def GetInfo(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.p.get_info_calls += 1
        if self.p.get_info_error:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "fake plugin: GetInfo switched off")
        return registration_pb2.PluginInfo(
            type=self.p.plugin_type,
            name=self.p.driver,
            endpoint=str(self.p.endpoint),
            supported_versions=self.p.versions,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.p.statuses.append((request.plugin_registered, request.error))
        return registration_pb2.RegistrationStatusResponse()


class _Dra:
    def __init__(self, plugin: FakeDraPlugin, version: str, pb: Any) -> None:
        self.p = plugin
        self.version = version
        self.pb = pb

    def _record(self, method: str, request: Any) -> None:
        call = DraCall(self.version, method, tuple((c.namespace, c.name, c.uid) for c in request.claims))
        self.p.calls.append(call)
        if self.p.on_call is not None:
            self.p.on_call(call)

    async def NodePrepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._record("NodePrepareResources", request)
        if self.p.prepare_abort is not None:
            await context.abort(self.p.prepare_abort, "fake plugin: NodePrepareResources switched off")
        resp = self.pb.NodePrepareResourcesResponse()
        for c in request.claims:
            err = self.p.prepare_errors.get(c.uid, "") or self.p.prepare_error_all
            if err:
                resp.claims[c.uid].error = err
                continue
            self.p.prepared.add(c.uid)
            resp.claims[c.uid].devices.append(
                self.pb.Device(
                    request_names=["nic"],
                    pool_name=self.p.pool,
                    device_name=f"dev-{c.name}",
                    cdi_device_ids=[f"{self.p.driver}/net={c.name}"],
                )
            )
        return resp

    async def NodeUnprepareResources(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self._record("NodeUnprepareResources", request)
        if self.p.unprepare_abort is not None:
            await context.abort(self.p.unprepare_abort, "fake plugin: NodeUnprepareResources switched off")
        resp = self.pb.NodeUnprepareResourcesResponse()
        for c in request.claims:
            err = self.p.unprepare_errors.get(c.uid, "")
            resp.claims[c.uid].error = err
            if not err:
                self.p.prepared.discard(c.uid)
        return resp


@pytest.fixture
async def fake_dra_plugin(kubelet_root: Path) -> AsyncIterator[Callable[..., Awaitable[FakeDraPlugin]]]:
    plugins: list[FakeDraPlugin] = []

    async def make(**kw: Any) -> FakeDraPlugin:
        p = FakeDraPlugin(kubelet_root, **kw)
        await p.start()
        plugins.append(p)
        return p

    try:
        yield make
    finally:
        for p in plugins:
            with contextlib.suppress(Exception):
                await p.stop()
