"""An NRI plugin stub: register with the runtime, serve its calls, stay connected.

Subclass ``NriHandlers`` and override the hooks the plugin needs; the event
subscription sent in Configure is derived from which hooks are overridden.
``NriStub.run`` connects to the runtime's socket, serves the Plugin service on
conn 1 before it registers on conn 2, answers Configure and Synchronize (split
or not), dispatches events, and reconnects with backoff whenever the runtime
closes the connection (it does so when a plugin misses its request timeout,
and on restart); after each reconnect the runtime synchronizes again.

Hooks get a deadline below the runtime's request timeout: a hook that overruns
it is cancelled and answered with DEADLINE_EXCEEDED, which fails that one CRI
operation (the kubelet retries) instead of letting the runtime drop the plugin
and start the pod without the plugin's changes.

Every request is counted and timed as dranet does
(``dranet_driver_nri_plugin_requests_total`` and ``..._latency_seconds`` by
method and status): "failed" when it raised or called ``mark_failed``, "noop"
when the hook called ``mark_noop`` (it had nothing of dra.net's to do), else
"success".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

from proto.nri.v1alpha1 import nri_pb2
from services.attach.nri.connection import NriConnection
from services.attach.nri.rpc import ConnectionClosed, Handler, ProtoMessage, parse
from services.attach.nri.ttrpc import Code, TtrpcError
from shared.logs import log_fields
from shared.metrics import DRIVER_SUBSYSTEM, NAMESPACE, REGISTRY, STATUS_FAILED, STATUS_NOOP, STATUS_SUCCESS

log = logging.getLogger(__name__)

# dranet's names, help texts, labels and (default) buckets (pkg/driver/metrics.go).
NRI_REQUESTS = Counter(
    "nri_plugin_requests_total",
    "Total number of NRI plugin requests.",
    ["method", "status"],
    namespace=NAMESPACE,
    subsystem=DRIVER_SUBSYSTEM,
    registry=REGISTRY,
)
NRI_LATENCY = Histogram(
    "nri_plugin_requests_latency_seconds",
    "NRI plugin request latency in seconds.",
    ["method", "status"],
    namespace=NAMESPACE,
    subsystem=DRIVER_SUBSYSTEM,
    registry=REGISTRY,
)
# The status of the request being handled; a one-item list, so that tasks the hook
# spawns (they copy the context) can set it too.
_outcome: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("nri_outcome", default=None)

# How to turn NRI on, for the warning while the runtime's socket cannot be reached.
NRI_HINT = (
    "the container runtime's NRI must be enabled and its socket mounted into the attach container: "
    "containerd 2.x enables NRI by default; containerd 1.7 needs "
    '[plugins."io.containerd.nri.v1.nri"] disable = false in /etc/containerd/config.toml, then a '
    "containerd restart; the socket is /var/run/nri/nri.sock (--nri-socket)"
)


def mark_noop() -> None:
    """Called by a hook that found nothing of dra.net's to do (a pod without our
    devices): the request counts with status "noop", as dranet's do."""
    cell = _outcome.get()
    if cell is not None:
        cell[0] = STATUS_NOOP


def mark_failed() -> None:
    """Called by a hook that answers the runtime with success although its work
    failed (StopPodSandbox never fails the pod's stop): the request counts "failed"."""
    cell = _outcome.get()
    if cell is not None:
        cell[0] = STATUS_FAILED


PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET_PATH = "/var/run/nri/nri.sock"
# Runtime defaults (nri pkg/api/timeouts.go), used until Configure says otherwise.
DEFAULT_REGISTRATION_TIMEOUT = 5.0
DEFAULT_REQUEST_TIMEOUT = 2.0
# Runtimes up to NRI v0.9 reject any subscription bit above this.
LEGACY_VALID_EVENTS = 0x7FF

_NAME_RE = re.compile(r"^[a-zA-Z0-9_.+-]+$")
_IDX_RE = re.compile(r"^[0-9]{2}$")

Pod = nri_pb2.PodSandbox
Container = nri_pb2.Container
M = TypeVar("M", bound=ProtoMessage)


def event_mask(*events: int) -> int:
    """The Configure subscription bits for the given Event values."""
    mask = 0
    for e in events:
        if not nri_pb2.RUN_POD_SANDBOX <= e < nri_pb2.LAST:
            raise ValueError(f"event {e} cannot be subscribed to")
        mask |= 1 << (e - 1)
    return mask


class NriHandlers:
    """The plugin's hooks. Override what you need; the rest stay unsubscribed.

    The event subscription sent in Configure names only the overridden hooks,
    and only their dedicated RPCs are served (others answer UNIMPLEMENTED, as
    Go's stub does), so the defaults below are never reached through the stub;
    they answer "no change" for subclasses that call them.

    Every hook must return within the stub's deadline (StubConfig.handler_timeout,
    capped below the runtime's request timeout). Raising fails the runtime's
    operation: TtrpcError keeps its code, other exceptions become UNKNOWN.
    """

    async def configure(self, request: nri_pb2.ConfigureRequest) -> None:
        """Called with the runtime's name, version and timeouts before any event."""

    async def synchronize(
        self, pods: Sequence[Pod], containers: Sequence[Container]
    ) -> Sequence[nri_pb2.ContainerUpdate]:
        """All pods and containers the runtime has, after every (re)connect."""
        return ()

    async def shutdown(self) -> None:
        """The runtime is going down; it will close the connection."""

    async def run_pod_sandbox(self, pod: Pod) -> None:
        return None

    async def stop_pod_sandbox(self, pod: Pod) -> None:
        return None

    async def remove_pod_sandbox(self, pod: Pod) -> None:
        return None

    async def create_container(
        self, pod: Pod, container: Container
    ) -> nri_pb2.ContainerAdjustment | nri_pb2.CreateContainerResponse | None:
        """Return an adjustment for the container being created (or a full
        response with updates and evictions), or None for no change."""
        return None

    async def post_create_container(self, pod: Pod, container: Container) -> None:
        return None

    async def start_container(self, pod: Pod, container: Container) -> None:
        return None

    async def post_start_container(self, pod: Pod, container: Container) -> None:
        return None

    async def update_container(
        self, pod: Pod, container: Container, resources: nri_pb2.LinuxResources
    ) -> nri_pb2.UpdateContainerResponse | None:
        return None

    async def post_update_container(self, pod: Pod, container: Container) -> None:
        return None

    async def stop_container(self, pod: Pod, container: Container) -> nri_pb2.StopContainerResponse | None:
        return None

    async def remove_container(self, pod: Pod, container: Container) -> None:
        return None


# Events delivered by StateChange (NRI <= v0.11) or, from v0.12, by a dedicated
# RPC: event -> (hook name, dedicated method, its request type, its response type).
_NOTIFICATIONS: dict[int, tuple[str, str, type[ProtoMessage], type[ProtoMessage]]] = {
    nri_pb2.RUN_POD_SANDBOX: (
        "run_pod_sandbox",
        "RunPodSandbox",
        nri_pb2.RunPodSandboxRequest,
        nri_pb2.RunPodSandboxResponse,
    ),
    nri_pb2.STOP_POD_SANDBOX: (
        "stop_pod_sandbox",
        "StopPodSandbox",
        nri_pb2.StopPodSandboxRequest,
        nri_pb2.StopPodSandboxResponse,
    ),
    nri_pb2.REMOVE_POD_SANDBOX: (
        "remove_pod_sandbox",
        "RemovePodSandbox",
        nri_pb2.RemovePodSandboxRequest,
        nri_pb2.RemovePodSandboxResponse,
    ),
    nri_pb2.POST_CREATE_CONTAINER: (
        "post_create_container",
        "PostCreateContainer",
        nri_pb2.PostCreateContainerRequest,
        nri_pb2.PostCreateContainerResponse,
    ),
    nri_pb2.START_CONTAINER: (
        "start_container",
        "StartContainer",
        nri_pb2.StartContainerRequest,
        nri_pb2.StartContainerResponse,
    ),
    nri_pb2.POST_START_CONTAINER: (
        "post_start_container",
        "PostStartContainer",
        nri_pb2.PostStartContainerRequest,
        nri_pb2.PostStartContainerResponse,
    ),
    nri_pb2.POST_UPDATE_CONTAINER: (
        "post_update_container",
        "PostUpdateContainer",
        nri_pb2.PostUpdateContainerRequest,
        nri_pb2.PostUpdateContainerResponse,
    ),
    nri_pb2.REMOVE_CONTAINER: (
        "remove_container",
        "RemoveContainer",
        nri_pb2.RemoveContainerRequest,
        nri_pb2.RemoveContainerResponse,
    ),
}
# Events that always have their own RPC with a response: event -> hook name.
_REQUESTS: dict[int, str] = {
    nri_pb2.CREATE_CONTAINER: "create_container",
    nri_pb2.UPDATE_CONTAINER: "update_container",
    nri_pb2.STOP_CONTAINER: "stop_container",
}
_POD_EVENTS = {nri_pb2.RUN_POD_SANDBOX, nri_pb2.STOP_POD_SANDBOX, nri_pb2.REMOVE_POD_SANDBOX}


def _state_change_method(evt: nri_pb2.StateChangeEvent) -> str:
    """The metrics method label of an event delivered by StateChange: the name of its
    dedicated RPC (RunPodSandbox, ...), as newer runtimes call it."""
    if evt.event in _NOTIFICATIONS:
        return _NOTIFICATIONS[evt.event][1]
    return "StateChange"


def implemented_events(handlers: NriHandlers) -> list[int]:
    """Event values whose hook ``handlers`` overrides, in enum order."""
    names = {**{e: v[0] for e, v in _NOTIFICATIONS.items()}, **_REQUESTS}
    cls = type(handlers)
    return sorted(e for e, name in names.items() if getattr(cls, name) is not getattr(NriHandlers, name))


@dataclass(frozen=True)
class StubConfig:
    socket_path: str = DEFAULT_SOCKET_PATH
    plugin_name: str = "dra.net"
    plugin_idx: str = "00"
    # Deadline of the RegisterPlugin call (the runtime waits as long for it).
    registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT
    # The stub's own deadline for one hook; None leaves only the runtime's.
    handler_timeout: float | None = 1.5
    # ... and never more than this share of the runtime's request timeout.
    handler_timeout_share: float = 0.75
    # Log a warning when a hook used more than this share of its deadline.
    slow_handler_share: float = 0.5
    # From connect to a finished Synchronize; otherwise reconnect. Runtimes
    # that fail a sync keep the connection open but never send events.
    sync_timeout: float = 30.0
    backoff_initial: float = 0.2
    backoff_max: float = 5.0
    # Sent in RegisterPluginRequest.NRI_version (v0.12+ runtimes); empty: unset.
    nri_version: str = ""
    # While the runtime's socket cannot be reached: a warning with NRI_HINT at the first
    # failure after start or after a disconnect, then at most once per this many seconds.
    unreachable_warning_s: float = 300.0

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.plugin_name):
            raise ValueError(f"NRI plugin name {self.plugin_name!r} must match [a-zA-Z0-9_.+-]+")
        if not _IDX_RE.match(self.plugin_idx):
            raise ValueError(f"NRI plugin index {self.plugin_idx!r} must be exactly two digits")
        if self.handler_timeout is not None and self.handler_timeout <= 0:
            raise ValueError(f"handler_timeout {self.handler_timeout} must be positive or None")
        if not 0 < self.handler_timeout_share <= 1:
            raise ValueError(f"handler_timeout_share {self.handler_timeout_share} must be in (0, 1]")


@dataclass(frozen=True)
class RuntimeInfo:
    """What Configure told us about the runtime."""

    name: str
    version: str
    nri_version: str
    # Seconds; the defaults when the runtime (NRI < v0.7) does not say.
    registration_timeout: float
    request_timeout: float
    events: int


class _Session:
    """State of one connection: configuration and a split Synchronize in progress."""

    def __init__(self) -> None:
        self.runtime: RuntimeInfo | None = None
        self.synced = asyncio.Event()
        self.sync_pods: list[Pod] = []
        self.sync_containers: list[Container] = []


class NriStub:
    """Keeps one plugin registered with the runtime and dispatches its calls."""

    def __init__(
        self,
        handlers: NriHandlers,
        config: StubConfig | None = None,
        on_connected: Callable[[RuntimeInfo], Awaitable[None]] | None = None,
        on_disconnected: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self.handlers = handlers
        self.config = config or StubConfig()
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected
        self.events = implemented_events(handlers)
        self.mask = event_mask(*self.events)
        if self.mask & ~LEGACY_VALID_EVENTS:
            raise ValueError(f"event mask 0x{self.mask:x} has bits older runtimes reject")
        self._session = _Session()
        self._conn: NriConnection | None = None
        self._stop = asyncio.Event()
        self._connected = asyncio.Event()
        self.connects = 0
        self.syncs = 0
        # When the NRI_HINT warning was last logged; None: not since the last connect.
        self._hint_logged: float | None = None

    # -- public ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Registered, configured and synchronized: the runtime sends us events."""
        return self._connected.is_set()

    @property
    def runtime(self) -> RuntimeInfo | None:
        return self._session.runtime if self.connected else None

    async def wait_connected(self, timeout_s: float | None = None) -> RuntimeInfo:
        async with asyncio.timeout(timeout_s):
            await self._connected.wait()
        info = self._session.runtime
        assert info is not None
        return info

    async def run(self) -> None:
        """Connect, serve, and reconnect with backoff until ``stop``."""
        backoff = self.config.backoff_initial
        while not self._stop.is_set():
            synced = await self._one_session()
            if self._stop.is_set():
                break
            if synced:
                backoff = self.config.backoff_initial
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._stop.wait()
            backoff = min(backoff * 2, self.config.backoff_max)

    async def stop(self) -> None:
        """Leave the runtime and make ``run`` return."""
        self._stop.set()
        if self._conn is not None:
            await self._conn.close("plugin stopping")

    # -- one connection -------------------------------------------------------

    async def _one_session(self) -> bool:
        cfg = self.config
        self._session = session = _Session()
        try:
            conn = await NriConnection.open_unix(cfg.socket_path, self._services(session), name="nri")
        except OSError as e:
            now = time.monotonic()
            if self._hint_logged is None or now - self._hint_logged >= cfg.unreachable_warning_s:
                self._hint_logged = now
                log.warning(
                    "not connected to NRI: the runtime socket %s cannot be reached (%s); %s",
                    cfg.socket_path,
                    e,
                    NRI_HINT,
                    extra=log_fields(socket=cfg.socket_path),
                )
            else:
                log.info("NRI runtime socket not reachable: %s", e, extra=log_fields(socket=cfg.socket_path))
            return False
        self._conn = conn
        self.connects += 1
        reason = ""
        try:
            req = nri_pb2.RegisterPluginRequest(
                plugin_name=cfg.plugin_name, plugin_idx=cfg.plugin_idx, NRI_version=cfg.nri_version
            )
            try:
                await conn.client.call_message(
                    RUNTIME_SERVICE, "RegisterPlugin", req, nri_pb2.Empty, cfg.registration_timeout
                )
            except (TtrpcError, ConnectionClosed) as e:
                reason = f"registration failed: {e}"
                log.error("NRI registration as %s-%s failed: %s", cfg.plugin_idx, cfg.plugin_name, e)
                return False
            log.info("registered with the NRI runtime as %s-%s", cfg.plugin_idx, cfg.plugin_name)
            if not await self._first(
                session.synced.wait(), conn.wait_closed(), self._stop.wait(), timeout_s=cfg.sync_timeout
            ):
                reason = f"no Synchronize within {cfg.sync_timeout}s"
                log.error(
                    "NRI runtime did not synchronize the plugin within %ss; reconnecting", cfg.sync_timeout
                )
                return False
            if not session.synced.is_set() or self._stop.is_set():
                reason = "plugin stopping" if self._stop.is_set() else conn.close_reason
                return False
            self._connected.set()
            self._hint_logged = None
            info = session.runtime
            assert info is not None
            log.info(
                "NRI plugin connected",
                extra=log_fields(runtime=info.name, runtime_version=info.version, events=hex(info.events)),
            )
            await self._callback(self._on_connected, info)
            await self._first(conn.wait_closed(), self._stop.wait())
            reason = conn.close_reason if conn.closed else "plugin stopping"
            return True
        finally:
            await conn.close(reason or "session ended")
            self._conn = None
            if self._connected.is_set():
                self._connected.clear()
                log.warning("NRI plugin disconnected: %s", reason or conn.close_reason)
                await self._callback(self._on_disconnected, reason or conn.close_reason)

    @staticmethod
    async def _first(*aws: Coroutine[Any, Any, Any], timeout_s: float | None = None) -> bool:
        """Wait for the first of ``aws``; False if ``timeout_s`` passed first."""
        tasks = [asyncio.ensure_future(a) for a in aws]
        try:
            done, _ = await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            return bool(done)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    @staticmethod
    async def _callback(cb: Callable[..., Awaitable[None]] | None, arg: object) -> None:
        if cb is None:
            return
        try:
            await cb(arg)
        except Exception:
            log.exception("NRI connection callback failed")

    # -- the Plugin service ---------------------------------------------------

    def _services(self, session: _Session) -> Mapping[str, Mapping[str, Handler]]:
        methods: dict[str, Handler] = {
            "Configure": self._method(
                "Configure", nri_pb2.ConfigureRequest, lambda r: self._configure(session, r)
            ),
            "Synchronize": self._method(
                "Synchronize", nri_pb2.SynchronizeRequest, lambda r: self._synchronize(session, r)
            ),
            "Shutdown": self._method("Shutdown", nri_pb2.Empty, self._shutdown),
            "StateChange": self._method("StateChange", nri_pb2.StateChangeEvent, self._state_change),
        }
        for event in self.events:
            if event in _NOTIFICATIONS:
                _, rpc, req_type, resp_type = _NOTIFICATIONS[event]
                methods[rpc] = self._method(rpc, req_type, self._notification(event, resp_type))
        if nri_pb2.CREATE_CONTAINER in self.events:
            methods["CreateContainer"] = self._method(
                "CreateContainer", nri_pb2.CreateContainerRequest, self._create_container
            )
        if nri_pb2.UPDATE_CONTAINER in self.events:
            methods["UpdateContainer"] = self._method(
                "UpdateContainer", nri_pb2.UpdateContainerRequest, self._update_container
            )
        if nri_pb2.STOP_CONTAINER in self.events:
            methods["StopContainer"] = self._method(
                "StopContainer", nri_pb2.StopContainerRequest, self._stop_container
            )
        return {PLUGIN_SERVICE: methods}

    def _method(self, name: str, req_type: type[M], fn: Callable[[M], Awaitable[ProtoMessage]]) -> Handler:
        async def handle(payload: bytes, deadline: float | None) -> bytes:
            req = parse(req_type, payload, PLUGIN_SERVICE)
            method = _state_change_method(req) if isinstance(req, nri_pb2.StateChangeEvent) else name
            resp = await self._guard(req_type.__name__, req, fn(req), deadline, method)
            return resp.SerializeToString()

        return handle

    def _budget(self, deadline: float | None) -> float | None:
        """The stub's deadline for one hook, in seconds from now."""
        cfg = self.config
        if cfg.handler_timeout is None:
            return None
        if deadline is not None:
            runtime_left = deadline - asyncio.get_running_loop().time()
        elif self._session.runtime is not None:
            runtime_left = self._session.runtime.request_timeout
        else:
            runtime_left = DEFAULT_REQUEST_TIMEOUT
        return max(0.0, min(cfg.handler_timeout, runtime_left * cfg.handler_timeout_share))

    async def _guard(self, what: str, req: Any, work: Awaitable[M], deadline: float | None, method: str) -> M:
        budget = self._budget(deadline)
        pod = getattr(req, "pod", None)
        fields = log_fields(
            request=what,
            pod=f"{pod.namespace}/{pod.name}" if pod is not None and pod.name else None,
            pod_uid=pod.uid if pod is not None else None,
        )
        start = time.monotonic()
        outcome = [STATUS_SUCCESS]
        token = _outcome.set(outcome)
        try:
            async with asyncio.timeout(budget):
                resp = await work
        except TimeoutError:
            outcome[0] = STATUS_FAILED
            elapsed = time.monotonic() - start
            if budget is not None and elapsed >= budget:
                log.error(
                    "NRI %s handler overran its %.3fs deadline and was cancelled; failing the request",
                    what,
                    budget,
                    extra=fields,
                )
                raise TtrpcError(
                    Code.DEADLINE_EXCEEDED, f"dra.net {what} handler exceeded its {budget:.3f}s deadline"
                ) from None
            raise
        except BaseException:
            outcome[0] = STATUS_FAILED
            raise
        finally:
            _outcome.reset(token)
            status = outcome[0]
            NRI_REQUESTS.labels(method, status).inc()
            NRI_LATENCY.labels(method, status).observe(time.monotonic() - start)
        elapsed = time.monotonic() - start
        if budget is not None and elapsed > budget * self.config.slow_handler_share:
            log.warning(
                "NRI %s handler took %.3fs of its %.3fs deadline", what, elapsed, budget, extra=fields
            )
        else:
            log.debug("NRI %s handled in %.3fms", what, elapsed * 1000, extra=fields)
        return resp

    async def _configure(self, session: _Session, req: nri_pb2.ConfigureRequest) -> nri_pb2.ConfigureResponse:
        session.runtime = RuntimeInfo(
            name=req.runtime_name,
            version=req.runtime_version,
            nri_version=req.NRI_version,
            registration_timeout=req.registration_timeout / 1000 or DEFAULT_REGISTRATION_TIMEOUT,
            request_timeout=req.request_timeout / 1000 or DEFAULT_REQUEST_TIMEOUT,
            events=self.mask,
        )
        log.info(
            "NRI runtime configures the plugin",
            extra=log_fields(
                runtime=req.runtime_name,
                runtime_version=req.runtime_version,
                nri_version=req.NRI_version,
                request_timeout_s=session.runtime.request_timeout,
            ),
        )
        await self.handlers.configure(req)
        return nri_pb2.ConfigureResponse(events=self.mask)

    async def _synchronize(
        self, session: _Session, req: nri_pb2.SynchronizeRequest
    ) -> nri_pb2.SynchronizeResponse:
        session.sync_pods.extend(req.pods)
        session.sync_containers.extend(req.containers)
        if req.more:
            # Split sync (NRI v0.7+): acknowledge each part without updates.
            return nri_pb2.SynchronizeResponse(more=True)
        pods, containers = session.sync_pods, session.sync_containers
        session.sync_pods, session.sync_containers = [], []
        log.info("NRI synchronize", extra=log_fields(pods=len(pods), containers=len(containers)))
        updates = await self.handlers.synchronize(pods, containers)
        self.syncs += 1
        session.synced.set()
        return nri_pb2.SynchronizeResponse(update=list(updates))

    async def _shutdown(self, _: nri_pb2.Empty) -> nri_pb2.Empty:
        log.info("NRI runtime is shutting down")
        await self.handlers.shutdown()
        return nri_pb2.Empty()

    async def _state_change(self, evt: nri_pb2.StateChangeEvent) -> nri_pb2.Empty:
        if evt.event in _NOTIFICATIONS and evt.event in self.events:
            await self._notify(evt.event, evt.pod, evt.container)
        else:
            log.debug(
                "NRI event %s not handled",
                nri_pb2.Event.Name(evt.event) if evt.event in nri_pb2.Event.values() else evt.event,
            )
        return nri_pb2.Empty()

    def _notification(
        self, event: int, resp_type: type[ProtoMessage]
    ) -> Callable[[Any], Awaitable[ProtoMessage]]:
        async def handle(req: Any) -> ProtoMessage:
            await self._notify(event, req.pod, None if event in _POD_EVENTS else req.container)
            return resp_type()

        return handle

    async def _notify(self, event: int, pod: Pod, container: Container | None) -> None:
        hook = getattr(self.handlers, _NOTIFICATIONS[event][0])
        if event in _POD_EVENTS:
            await hook(pod)
        else:
            await hook(pod, container if container is not None else Container())

    async def _create_container(self, req: nri_pb2.CreateContainerRequest) -> nri_pb2.CreateContainerResponse:
        out = await self.handlers.create_container(req.pod, req.container)
        if isinstance(out, nri_pb2.CreateContainerResponse):
            return out
        resp = nri_pb2.CreateContainerResponse()
        if out is not None:
            resp.adjust.CopyFrom(out)
        return resp

    async def _update_container(self, req: nri_pb2.UpdateContainerRequest) -> nri_pb2.UpdateContainerResponse:
        out = await self.handlers.update_container(req.pod, req.container, req.linux_resources)
        return out if out is not None else nri_pb2.UpdateContainerResponse()

    async def _stop_container(self, req: nri_pb2.StopContainerRequest) -> nri_pb2.StopContainerResponse:
        out = await self.handlers.stop_container(req.pod, req.container)
        return out if out is not None else nri_pb2.StopContainerResponse()
