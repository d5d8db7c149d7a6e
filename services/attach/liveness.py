"""The attach service's liveness in the store, for prepare's safety gate.

One ReportLiveness stream stays open for the life of the process. It carries
``connected`` (the NRI plugin is registered and synchronized: the runtime will
call our hooks) and ``draining`` (graceful stop: serve pods already prepared,
but prepare must take no new claims). The store reports us disconnected the
moment the stream breaks, so a SIGKILLed attach service needs no clean-up. The
store forgets liveness when it restarts; every new stream therefore starts
with the current state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from proto.dranet.store.v1 import store_pb2 as st
from shared.logs import log_fields
from shared.storeclient import StoreCallError, StoreClient

log = logging.getLogger(__name__)


class LivenessReporter:
    """Keeps the store told whether the runtime can reach our hooks."""

    def __init__(
        self,
        store: StoreClient,
        instance: str,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 2.0,
    ) -> None:
        self.store = store
        self._state = st.LivenessReport(instance=instance)
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        # Reports the current stream has taken from us; 0 when no stream is open.
        self._sent_on_stream = 0
        self.streams = 0

    @property
    def state(self) -> st.LivenessReport:
        out = st.LivenessReport()
        out.CopyFrom(self._state)
        return out

    @property
    def stream_open(self) -> bool:
        """A stream is open and has carried the current state."""
        return self._sent_on_stream > 0

    def set(
        self,
        *,
        connected: bool | None = None,
        draining: bool | None = None,
        runtime_name: str | None = None,
        runtime_version: str | None = None,
    ) -> None:
        """Change what we report; the open stream sends it at once."""
        new = self.state
        if connected is not None:
            new.connected = connected
        if draining is not None:
            new.draining = draining
        if runtime_name is not None:
            new.runtime_name = runtime_name
        if runtime_version is not None:
            new.runtime_version = runtime_version
        if new != self._state:
            self._state = new
            self._changed.set()
            log.info(
                "liveness",
                extra=log_fields(
                    connected=new.connected, draining=new.draining, runtime=new.runtime_name or None
                ),
            )

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="liveness")

    async def close(self, timeout_s: float = 2.0) -> None:
        """Report disconnected, end the stream, stop reconnecting."""
        self.set(connected=False)
        self._closing.set()
        self._changed.set()
        if self._task is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    async def _reports(self) -> AsyncIterator[st.LivenessReport]:
        last: st.LivenessReport | None = None
        try:
            while True:
                self._changed.clear()
                current = self.state
                if current != last:
                    yield current
                    self._sent_on_stream += 1
                    last = current
                if self._closing.is_set():
                    return
                await self._changed.wait()
        finally:
            self._sent_on_stream = 0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.backoff_initial_s
        while not self._closing.is_set():
            self.streams += 1
            opened = loop.time()
            try:
                await self.store.hold_liveness(self._reports())
            except StoreCallError as exc:
                if loop.time() - opened > 5 * self.backoff_max_s:
                    delay = self.backoff_initial_s  # it had been up for a while: a fresh outage
                log.warning(
                    "liveness stream to the store broke; reopening",
                    extra=log_fields(error=str(exc), retry_s=round(delay, 2)),
                )
            else:
                if self._closing.is_set():
                    return
                delay = self.backoff_initial_s
            self._sent_on_stream = 0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closing.wait()
            delay = min(delay * 2, self.backoff_max_s)
