"""The kubelet's plugin manager for DRA drivers: registration, health probing, DRAPlugin clients.

Behaves like the kubelet's plugin watcher, operation generator and DRA plugin manager
(see ../shared/reference/protocols.md sections 1 and 2):

- watches ``<kubelet root>/plugins_registry`` and its subdirectories for Unix sockets whose name
  does not start with '.' (polling every 100 ms instead of inotify; a socket that is replaced by a
  new one under the same name counts as a new plugin, as fsnotify's Create event does);
- dials a new socket (10 s), calls ``GetInfo`` (1 s deadline), accepts type ``DRAPlugin`` only,
  picks the first entry of the plugin's ``supported_versions`` that it knows (``v1.DRAPlugin``,
  ``v1beta1.DRAPlugin``), rejects a second registration of the same driver endpoint, and sends
  ``NotifyRegistrationStatus`` (5 s deadline) with the outcome; failed registrations are retried
  with exponential backoff (0.5 s doubling up to about 2 minutes);
- deregisters a plugin when its socket file disappears;
- like newer kubelets, probes ``GetInfo`` on every registered socket every 10 s and deregisters
  after 2 consecutive failures; a socket that answers again is registered again;
- DRAPlugin calls go to the advertised endpoint with a 45 s deadline, using the package of the
  chosen version (``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`` or ``...v1beta1...``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from proto.kubelet.dra.v1 import dra_pb2 as dra_v1_pb2
from proto.kubelet.dra.v1 import dra_pb2_grpc as dra_v1_pb2_grpc
from proto.kubelet.dra.v1beta1 import dra_pb2 as dra_v1beta1_pb2
from proto.kubelet.dra.v1beta1 import dra_pb2_grpc as dra_v1beta1_pb2_grpc
from proto.kubelet.pluginregistration.v1 import registration_pb2, registration_pb2_grpc
from shared.logs import log_fields

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
# Kubelet >= 1.34 knows both; the plugin's own order decides which one is used.
KNOWN_SERVICES: tuple[str, ...] = (V1, V1BETA1)
_SERVICE_STUBS: Mapping[str, tuple[Any, Any]] = {
    V1: (dra_v1_pb2, dra_v1_pb2_grpc),
    V1BETA1: (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc),
}

DIAL_TIMEOUT = 10.0
GET_INFO_TIMEOUT = 1.0
NOTIFY_TIMEOUT = 5.0
CALL_TIMEOUT = 45.0
HEALTH_INTERVAL = 10.0
HEALTH_FAILURES = 2
HEALTH_DIAL_TIMEOUT = 20.0
HEALTH_GET_INFO_TIMEOUT = 10.0
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 122.0


class RegistrationError(Exception):
    """A plugin socket could not be registered; the message says why.

    ``rejected``: the plugin answered but the kubelet refused it (and told it so).
    """

    def __init__(self, message: str, rejected: bool = False) -> None:
        super().__init__(message)
        self.rejected = rejected


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the DRA API names it."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class ClaimResult:
    """One entry of a NodePrepareResources response."""

    devices: tuple[PreparedDevice, ...]
    error: str


@dataclass(frozen=True)
class PluginEvent:
    kind: str  # registered | rejected | failed | deregistered
    socket: str
    driver: str
    detail: str
    at: float = field(default_factory=time.monotonic)


def choose_service(offered: Sequence[str], known: Sequence[str] = KNOWN_SERVICES) -> str | None:
    """The first entry of the plugin's list the kubelet supports, in the plugin's order."""
    for s in offered:
        if s in known:
            return s
    return None


def check_prepare_response(
    driver: str, requested: Sequence[ClaimRef], results: Mapping[str, ClaimResult]
) -> tuple[dict[str, ClaimResult], list[str]]:
    """Apply the kubelet's rules to a NodePrepareResources response.

    Returns (results of the requested claims that succeeded, errors). Any error means the pod's
    start is retried and no claim of this call counts as prepared.
    """
    by_uid = {c.uid: c for c in requested}
    errors: list[str] = []
    ok: dict[str, ClaimResult] = {}
    for uid, res in results.items():
        claim = by_uid.get(uid)
        if claim is None:
            errors.append(
                f"NodePrepareResources of driver {driver} returned result for unknown claim UID {uid}"
            )
        elif res.error:
            errors.append(
                f"NodePrepareResources failed for ResourceClaim {claim.namespace}/{claim.name}: {res.error}"
            )
        else:
            ok[uid] = res
    missing = [c for c in requested if c.uid not in results]
    if missing:
        errors.append(f"NodePrepareResources of driver {driver} skipped {len(missing)} ResourceClaims")
    return ok, errors


def check_unprepare_response(
    driver: str, requested: Sequence[ClaimRef], results: Mapping[str, str]
) -> tuple[set[str], list[str]]:
    """Like ``check_prepare_response`` for NodeUnprepareResources: (unprepared claim UIDs, errors)."""
    by_uid = {c.uid: c for c in requested}
    errors: list[str] = []
    ok: set[str] = set()
    for uid, err in results.items():
        claim = by_uid.get(uid)
        if claim is None:
            errors.append(
                f"NodeUnprepareResources of driver {driver} returned result for unknown claim UID {uid}"
            )
        elif err:
            errors.append(
                f"NodeUnprepareResources failed for ResourceClaim {claim.namespace}/{claim.name}: {err}"
            )
        else:
            ok.add(uid)
    missing = [c for c in requested if c.uid not in results]
    if missing:
        errors.append(f"NodeUnprepareResources of driver {driver} skipped {len(missing)} ResourceClaims")
    return ok, errors


class DraPlugin:
    """A registered DRA plugin instance and its DRAPlugin client (the kubelet side)."""

    def __init__(self, driver: str, endpoint: str, service: str, registration_socket: str) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.service = service
        self.registration_socket = registration_socket
        self.registered_at = time.monotonic()
        self.call_timeout = CALL_TIMEOUT
        self._pb, pb_grpc = _SERVICE_STUBS[service]
        self._channel = grpc.aio.insecure_channel(f"unix:{endpoint}")
        self._stub = pb_grpc.DRAPluginStub(self._channel)
        # Connect now, as the kubelet does, so the connection state is known before the first call.
        self._channel.get_state(try_to_connect=True)

    @property
    def version(self) -> str:
        """'v1' or 'v1beta1'."""
        return self.service.split(".", 1)[0]

    def connected(self) -> bool:
        return self._channel.get_state() == grpc.ChannelConnectivity.READY

    async def close(self) -> None:
        await self._channel.close()

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self._pb.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    async def node_prepare_resources(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """NodePrepareResources; raises grpc.RpcError on a call-level failure."""
        resp = await self._stub.NodePrepareResources(
            self._pb.NodePrepareResourcesRequest(claims=self._claims(claims)), timeout=self.call_timeout
        )
        out: dict[str, ClaimResult] = {}
        for uid, r in resp.claims.items():
            devices = tuple(
                PreparedDevice(
                    request_names=tuple(d.request_names),
                    pool_name=d.pool_name,
                    device_name=d.device_name,
                    cdi_device_ids=tuple(d.cdi_device_ids),
                    share_id=d.share_id if self.service == V1 and d.HasField("share_id") else None,
                )
                for d in r.devices
            )
            out[uid] = ClaimResult(devices=devices, error=r.error)
        return out

    async def node_unprepare_resources(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: claim UID -> error ('' on success); grpc.RpcError on call failure."""
        resp = await self._stub.NodeUnprepareResources(
            self._pb.NodeUnprepareResourcesRequest(claims=self._claims(claims)), timeout=self.call_timeout
        )
        return {uid: r.error for uid, r in resp.claims.items()}


@dataclass
class _SocketState:
    identity: tuple[int, int]
    plugin: DraPlugin | None = None
    busy: bool = False
    failures: int = 0
    backoff: float = BACKOFF_INITIAL
    next_attempt: float = 0.0
    next_probe: float = 0.0


def _scan(registry: Path) -> dict[str, tuple[int, int]]:
    """Unix sockets under ``registry`` (recursively) not starting with '.': path -> (inode, mtime).

    A new socket under an old name has a new inode or mtime; a chmod (which the kubelet's
    fsnotify watcher ignores) changes neither, whereas it would change the ctime.
    """
    found: dict[str, tuple[int, int]] = {}
    stack = [registry]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
            elif stat.S_ISSOCK(st.st_mode):
                found[e.path] = (st.st_ino, st.st_mtime_ns)
    return found


class PluginManager:
    """Registers DRA plugins found in ``registry_dir``; ``get(driver)`` returns the client to use."""

    def __init__(
        self,
        registry_dir: str | os.PathLike[str],
        known_services: Sequence[str] = KNOWN_SERVICES,
        poll_interval: float = 0.1,
        health_interval: float = HEALTH_INTERVAL,
        health_failures: int = HEALTH_FAILURES,
        health_dial_timeout: float = HEALTH_DIAL_TIMEOUT,
        on_event: Callable[[PluginEvent], None] | None = None,
    ) -> None:
        self.registry_dir = Path(registry_dir)
        self.known_services = tuple(known_services)
        self.poll_interval = poll_interval
        self.health_interval = health_interval
        self.health_failures = health_failures
        self.health_dial_timeout = health_dial_timeout
        self.on_event = on_event
        self.events: list[PluginEvent] = []
        self._sockets: dict[str, _SocketState] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()

    # -- queries ------------------------------------------------------------------------------

    def plugins(self) -> list[DraPlugin]:
        return [s.plugin for s in self._sockets.values() if s.plugin is not None]

    def get(self, driver: str) -> DraPlugin | None:
        """The plugin instance to call for ``driver``: the most recently registered connected one,
        else the most recently registered one."""
        mine = sorted((p for p in self.plugins() if p.driver == driver), key=lambda p: p.registered_at)
        if not mine:
            return None
        connected = [p for p in mine if p.connected()]
        return (connected or mine)[-1]

    async def wait_for_event(
        self, match: Callable[[PluginEvent], bool], within: float, since: int = 0
    ) -> PluginEvent:
        """The first event (from index ``since``) that ``match``es; TimeoutError otherwise."""
        async with asyncio.timeout(within):
            async with self._changed:
                while True:
                    for ev in self.events[since:]:
                        if match(ev):
                            return ev
                    await self._changed.wait()

    async def wait_for_plugin(self, driver: str, within: float = 10.0) -> DraPlugin:
        async with asyncio.timeout(within):
            async with self._changed:
                while (p := self.get(driver)) is None:
                    await self._changed.wait()
                return p

    # -- life cycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._loop_task = asyncio.create_task(self._run(), name="kubelet-plugin-watcher")

    async def stop(self) -> None:
        if self._loop_task:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
            self._loop_task = None
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for path in list(self._sockets):
            await self._deregister(path, "kubelet stopped", forget=True)

    async def _emit(self, ev: PluginEvent) -> None:
        self.events.append(ev)
        log.info(
            f"plugin {ev.kind}",
            extra=log_fields(socket=ev.socket, driver=ev.driver, detail=ev.detail),
        )
        if self.on_event:
            try:
                self.on_event(ev)
            except Exception:
                log.exception("plugin event callback failed")
        async with self._changed:
            self._changed.notify_all()

    def _spawn(self, coro: Any) -> None:
        t: asyncio.Task[None] = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        while True:
            try:
                await self._reconcile()
            except Exception:
                log.exception("plugin watcher iteration failed")
            await asyncio.sleep(self.poll_interval)

    async def _reconcile(self) -> None:
        found = await asyncio.to_thread(_scan, self.registry_dir)
        now = time.monotonic()
        for path in list(self._sockets):
            if path not in found:
                await self._deregister(path, "socket removed", forget=True)
        for path, identity in found.items():
            st = self._sockets.get(path)
            if st is not None and st.identity != identity:
                # A new socket under the old name: a restarted plugin registers afresh.
                await self._deregister(path, "socket replaced", forget=True)
                st = None
            if st is None:
                self._sockets[path] = _SocketState(identity=identity, next_attempt=now)
        for path, st in self._sockets.items():
            if st.busy:
                continue
            if st.plugin is None and now >= st.next_attempt:
                st.busy = True
                self._spawn(self._register(path, st))
            elif st.plugin is not None and now >= st.next_probe:
                st.busy = True
                self._spawn(self._probe(path, st))

    async def _deregister(self, path: str, why: str, forget: bool) -> None:
        st = self._sockets.pop(path, None) if forget else self._sockets.get(path)
        if st is None or st.plugin is None:
            return
        plugin, st.plugin = st.plugin, None
        await plugin.close()
        await self._emit(PluginEvent("deregistered", path, plugin.driver, why))

    async def _get_info(self, path: str, dial_timeout: float, call_timeout: float) -> Any:
        async with grpc.aio.insecure_channel(f"unix:{path}") as ch:
            try:
                await asyncio.wait_for(ch.channel_ready(), dial_timeout)
            except TimeoutError:
                raise RegistrationError(f"dial {path}: no connection after {dial_timeout:g}s") from None
            stub = registration_pb2_grpc.RegistrationStub(ch)
            return await stub.GetInfo(registration_pb2.InfoRequest(), timeout=call_timeout)

    async def _notify(self, path: str, registered: bool, error: str) -> None:
        try:
            async with grpc.aio.insecure_channel(f"unix:{path}") as ch:
                stub = registration_pb2_grpc.RegistrationStub(ch)
                await stub.NotifyRegistrationStatus(
                    registration_pb2.RegistrationStatus(plugin_registered=registered, error=error),
                    timeout=NOTIFY_TIMEOUT,
                )
        except grpc.RpcError as e:
            # The kubelet only logs the outcome of the notification.
            log.warning(
                "NotifyRegistrationStatus failed",
                extra=log_fields(socket=path, error=f"{e.code().name}: {e.details()}"),
            )

    async def _register(self, path: str, st: _SocketState) -> None:
        driver = ""
        try:
            try:
                info = await self._get_info(path, DIAL_TIMEOUT, GET_INFO_TIMEOUT)
            except grpc.RpcError as e:
                raise RegistrationError(f"GetInfo on {path}: {e.code().name}: {e.details()}") from None
            driver = info.name
            plugin, reject = self._validate(path, info)
            if plugin is None:
                await self._notify(path, False, reject)
                await self._emit(PluginEvent("rejected", path, driver, reject))
                raise RegistrationError(reject, rejected=True)
            if self._sockets.get(path) is not st:
                await plugin.close()  # the socket went away while we were registering
                return
            st.plugin = plugin
            st.failures = 0
            st.backoff = BACKOFF_INITIAL
            st.next_probe = time.monotonic() + self.health_interval
            await self._notify(path, True, "")
            await self._emit(
                PluginEvent("registered", path, driver, f"{plugin.service} at {plugin.endpoint}")
            )
        except RegistrationError as e:
            st.next_attempt = time.monotonic() + st.backoff
            st.backoff = min(st.backoff * 2, BACKOFF_MAX)
            if not e.rejected:
                await self._emit(PluginEvent("failed", path, driver, str(e)))
        finally:
            st.busy = False

    def _validate(self, path: str, info: Any) -> tuple[DraPlugin | None, str]:
        if info.type != DRA_PLUGIN_TYPE:
            return None, f"no handler registered for plugin type: {info.type} at socket {path}"
        if not info.name:
            return None, f"plugin at socket {path} did not report a driver name"
        if not info.supported_versions:
            return None, f"plugin {info.name} at socket {path}: supported_versions is empty"
        service = choose_service(list(info.supported_versions), self.known_services)
        if service is None:
            return None, (
                f"plugin {info.name} at socket {path}: none of the offered services "
                f"{list(info.supported_versions)} is supported by this kubelet {list(self.known_services)}"
            )
        endpoint = info.endpoint or path
        for other_path, other in self._sockets.items():
            p = other.plugin
            if p is not None and other_path != path and p.driver == info.name and p.endpoint == endpoint:
                return None, (
                    f"plugin {info.name} at socket {path}: endpoint {endpoint} is already registered "
                    f"through {other_path}"
                )
        return DraPlugin(info.name, endpoint, service, path), ""

    async def _probe(self, path: str, st: _SocketState) -> None:
        try:
            await self._get_info(path, self.health_dial_timeout, HEALTH_GET_INFO_TIMEOUT)
            st.failures = 0
        except (grpc.RpcError, RegistrationError) as e:
            st.failures += 1
            log.warning(
                "plugin health probe failed",
                extra=log_fields(socket=path, failures=st.failures, error=str(e)),
            )
            if st.failures >= self.health_failures and self._sockets.get(path) is st:
                await self._deregister(path, f"{st.failures} failed GetInfo probes", forget=False)
                st.failures = 0
                st.backoff = BACKOFF_INITIAL
                # Probe again at the health cadence; an answer re-registers the plugin.
                st.next_attempt = time.monotonic() + self.health_interval
        finally:
            st.next_probe = time.monotonic() + self.health_interval
            st.busy = False
