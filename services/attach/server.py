"""The attach service's surfaces: the NRI plugin (to the runtime), its liveness
(to the store, for prepare's safety gate), dranet.admin.v1 (log level, health),
and the graceful stop.

Graceful stop, dranet's order adapted to our split (seed "Restart and shutdown"):
1. report draining: prepare refuses new claims from now on (dranet stops its
   kubelet plugin here; prepare is another process, the store tells it);
2. keep serving NRI until every prepared pod (a DeviceConfig in the store) has
   had no NRI activity for ``quiet`` (a prepared pod with none yet counts from
   the start of the stop), checking every ``poll``, for at most ``timeout``;
3. stop the NRI plugin, report disconnected, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.attach.engine import DeviceEngine
from services.attach.hooks import AttachHooks, HookConfig
from services.attach.liveness import LivenessReporter
from services.attach.nri.stub import NriStub, RuntimeInfo, StubConfig
from services.attach.writer import StoreWriter
from shared.admin import AdminServicer
from shared.logs import log_fields
from shared.metrics import NAMESPACE, REGISTRY
from shared.rpc import UdsServer
from shared.storeclient import StoreCallError, StoreClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DrainConfig:
    """dranet's graceful-stop timings: 10 s quiet, 5 s poll, 5 min cap."""

    quiet_s: float = 10.0
    poll_s: float = 5.0
    timeout_s: float = 300.0


def instance_id() -> str:
    """Names this process in the liveness record: host, pid and start time."""
    return f"{socket.gethostname()}/{os.getpid()}/{time.time_ns()}"


async def wait_for_nri_quiet(store: StoreClient, writer: StoreWriter, cfg: DrainConfig) -> str:
    """Step 2 of the graceful stop. Returns why it stopped waiting."""
    start = time.time_ns()
    quiet_ns = int(cfg.quiet_s * 1e9)
    deadline = time.monotonic() + cfg.timeout_s
    unreachable_since: float | None = None
    while True:
        with contextlib.suppress(TimeoutError):
            await writer.flush(1.0)  # our own activity stamps first
        wake = cfg.poll_s
        try:
            listing = await store.list()
            unreachable_since = None
        except StoreCallError as exc:
            # Without the store nothing new can be prepared either: waiting longer than one
            # quiet period for it would only hold the pod's stop (and the node's next driver).
            now_m = time.monotonic()
            unreachable_since = unreachable_since if unreachable_since is not None else now_m
            if now_m - unreachable_since >= cfg.quiet_s:
                log.warning(
                    "graceful stop: the store is gone; stopping without its list",
                    extra=log_fields(error=str(exc), waited_s=round(now_m - unreachable_since, 1)),
                )
                return "store unavailable"
            log.info("graceful stop: cannot list the store yet", extra=log_fields(error=str(exc)))
            listing = None
            wake = min(cfg.poll_s, 1.0)
        if listing is not None:
            # Provisional configs count: prepare is working on that pod right now.
            prepared = {d.pod.uid for d in listing.devices}
            if not prepared:
                return "no prepared pods"
            last = {a.pod_uid: a.last_nri_activity_unix_nano for a in listing.activities}
            now = time.time_ns()
            busy = {
                uid: (last.get(uid) or start) for uid in prepared if now - (last.get(uid) or start) < quiet_ns
            }
            if not busy:
                return f"{len(prepared)} prepared pods quiet for {cfg.quiet_s}s"
            log.info(
                "graceful stop: waiting for prepared pods to finish their NRI hooks",
                extra=log_fields(prepared=len(prepared), busy=len(busy), pods=sorted(busy)[:10]),
            )
            # Look again when the first busy pod would turn quiet, not a whole poll later.
            first_quiet_s = (min(busy.values()) + quiet_ns - now) / 1e9
            wake = min(cfg.poll_s, max(0.05, first_quiet_s + 0.01))
        left = deadline - time.monotonic()
        if left <= 0:
            log.warning(f"graceful stop: gave up waiting after {cfg.timeout_s}s")
            return "timeout"
        await asyncio.sleep(min(wake, left))


class _AttachCollector(Collector):
    """The attach service's own gauges, read at scrape time."""

    def __init__(self) -> None:
        self.service: AttachService | None = None

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        if svc is None:
            return
        yield GaugeMetricFamily(
            f"{NAMESPACE}_attach_nri_connected",
            "1 while the NRI plugin is registered and synchronized with the runtime.",
            value=1.0 if svc.stub.connected else 0.0,
        )
        yield CounterMetricFamily(
            f"{NAMESPACE}_attach_nri_connects",
            "Connections made to the runtime's NRI socket.",
            value=svc.stub.connects,
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_attach_pods", "Pods the attach service tracks.", value=len(svc.hooks.pods)
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_attach_devices_lost",
            "Devices the last recovery after Synchronize could not find (see the attach logs).",
            value=len(svc.hooks.recovery.lost),
        )
        yield GaugeMetricFamily(
            f"{NAMESPACE}_attach_store_writes_pending",
            "Results and activity stamps not yet written to the store.",
            value=svc.writer.pending,
        )


_COLLECTOR = _AttachCollector()
REGISTRY.register(_COLLECTOR)


class AttachService:
    """Wires the NRI stub, the hooks, the store writer, liveness and admin."""

    def __init__(
        self,
        store: StoreClient,
        engine: DeviceEngine,
        stub_config: StubConfig,
        admin_socket: str,
        hook_config: HookConfig | None = None,
        drain: DrainConfig | None = None,
        instance: str | None = None,
    ) -> None:
        self.store = store
        self.drain = drain or DrainConfig()
        self.writer = StoreWriter(store)
        self.hooks = AttachHooks(store, engine, self.writer, hook_config)
        self.liveness = LivenessReporter(store, instance or instance_id())
        self.stub = NriStub(
            self.hooks, stub_config, on_connected=self._on_connected, on_disconnected=self._on_disconnected
        )
        self.admin_servicer = AdminServicer("attach", self.health)
        self.admin = UdsServer(admin_socket).add(self.admin_servicer.register)
        _COLLECTOR.service = self
        self._stub_task: asyncio.Task[None] | None = None
        self._background: list[asyncio.Task[None]] = []
        self.draining = False

    async def _on_connected(self, info: RuntimeInfo) -> None:
        self.liveness.set(connected=True, runtime_name=info.name, runtime_version=info.version)

    async def _on_disconnected(self, reason: str) -> None:
        self.liveness.set(connected=False)

    def health(self) -> tuple[bool, str]:
        """Ready while the runtime can call our hooks and no recovery is running."""
        parts = []
        info = self.stub.runtime
        ready = info is not None and not self.hooks.recovering
        parts.append(
            f"connected to {info.name} {info.version}"
            if info
            else f"not connected to NRI at {self.stub.config.socket_path}"
        )
        if self.hooks.recovering:
            parts.append("recovering devices after Synchronize")
        if not self.liveness.stream_open:
            parts.append("liveness not reported to the store")
        if self.draining:
            parts.append("draining")
        lost = self.hooks.recovery.lost
        if lost:
            parts.append(f"{len(lost)} devices lost: " + "; ".join(sorted(lost.values())[:3]))
        if self.writer.pending:
            parts.append(f"{self.writer.pending} store writes pending")
        return ready, ", ".join(parts)

    async def start(self) -> None:
        await self.admin.start()
        self.writer.start()
        self.liveness.start()
        self._background = [
            asyncio.create_task(self.hooks.collect_garbage(), name="attach-state-gc"),
            asyncio.create_task(self.hooks.watch_netns(), name="netns-watch"),
        ]
        self._stub_task = asyncio.create_task(self.stub.run(), name="nri")

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``, then stop gracefully."""
        await self.start()
        stopped = asyncio.create_task(stop.wait())
        assert self._stub_task is not None
        done, _ = await asyncio.wait({stopped, self._stub_task}, return_when=asyncio.FIRST_COMPLETED)
        if self._stub_task in done and not stopped.done():
            stopped.cancel()
            exc = self._stub_task.exception()
            await self.close()
            raise RuntimeError(f"NRI plugin ended: {exc}")
        await self.graceful_stop()

    async def graceful_stop(self) -> None:
        log.info("graceful stop: draining", extra=log_fields(**vars(self.drain)))
        self.draining = True
        await self.admin_servicer.grpc_health.stopping()
        self.liveness.set(draining=True)
        why = await wait_for_nri_quiet(self.store, self.writer, self.drain)
        log.info("graceful stop: stopping the NRI plugin", extra=log_fields(reason=why))
        await self.close()

    async def close(self) -> None:
        await self.stub.stop()
        if self._stub_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._stub_task, 10)
            self._stub_task = None
        await self.hooks.close()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background = []
        await self.liveness.close()
        await self.writer.close()
        await self.admin.stop(grace=0)
