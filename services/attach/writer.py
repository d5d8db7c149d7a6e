"""Store writes of the NRI hooks, done in order right after the hook answers.

The runtime holds a node-wide lock while a hook runs, so the hooks do only the
netlink work and one store read under it; attach results, activity times and
clears are written a moment later, in the order the hooks made them (a pod's
"attached" always lands before its "returned"). Every write is idempotent (by
key), so a write that meets a restarting store is retried until it lands.
Losing the queue (SIGKILL) loses nothing the next Synchronize cannot rebuild:
the devices themselves are where the hooks put them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from proto.dranet.store.v1 import store_pb2 as st
from shared.logs import log_fields
from shared.storeclient import StoreCallError, StoreClient

log = logging.getLogger(__name__)

# Codes that will not get better by retrying the same write.
_PERMANENT = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNIMPLEMENTED", "DATA_LOSS"}


@dataclass(frozen=True)
class _Write:
    what: str
    pod_uid: str
    device: str
    call: Callable[[], Awaitable[object]]


class StoreWriter:
    """An ordered queue of store writes with one worker; ``flush`` waits for it."""

    def __init__(self, store: StoreClient, retry_max_s: float = 1.0) -> None:
        self.store = store
        self.retry_max_s = retry_max_s
        self._queue: asyncio.Queue[_Write] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="store-writer")

    async def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_s``), then stop the worker."""
        with contextlib.suppress(TimeoutError):
            await self.flush(timeout_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if not self._queue.empty():
            log.error("store writes lost at shutdown", extra=log_fields(pending=self._queue.qsize()))

    async def flush(self, timeout_s: float | None = None) -> None:
        """Until every write queued so far has landed (or was given up)."""
        async with asyncio.timeout(timeout_s):
            await self._queue.join()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # -- what the hooks write ------------------------------------------------------

    def put_result(self, result: st.AttachResult) -> None:
        stamped = st.AttachResult()
        stamped.CopyFrom(result)
        if not stamped.updated_unix_nano:
            stamped.updated_unix_nano = time.time_ns()
        self._queue.put_nowait(
            _Write(
                "attach result", result.pod_uid, result.device, lambda: self.store.put_attach_result(stamped)
            )
        )

    def touch(self, pod_uid: str) -> None:
        """The pod's NRI activity, stamped now (not when the write lands)."""
        now = time.time_ns()
        self._queue.put_nowait(_Write("activity", pod_uid, "", lambda: self.store.touch_pod(pod_uid, now)))

    def clear(self, pod_uid: str) -> None:
        self._queue.put_nowait(
            _Write("clear attach state", pod_uid, "", lambda: self.store.clear_attach_state(pod_uid))
        )

    # -- worker --------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            w = await self._queue.get()
            try:
                await self._write(w)
            finally:
                self._queue.task_done()

    async def _write(self, w: _Write) -> None:
        delay = 0.05
        attempts = 0
        while True:
            attempts += 1
            try:
                await w.call()
            except StoreCallError as exc:
                fields = log_fields(pod_uid=w.pod_uid, device=w.device, write=w.what, error=str(exc))
                if exc.code in _PERMANENT:
                    log.error("store refused a write; dropping it", extra=fields)
                    return
                if attempts == 1 or attempts % 20 == 0:
                    log.warning("store write failed; retrying until it lands", extra=fields)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)
                continue
            if attempts > 1:
                log.info(
                    "store write landed after retries",
                    extra=log_fields(pod_uid=w.pod_uid, device=w.device, write=w.what, attempts=attempts),
                )
            return
