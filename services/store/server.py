"""The dranet.store.v1 PodConfigStore service over gRPC.

Writes are serialised (one LMDB transaction at a time, on one worker thread so
fsync never blocks the event loop); reads are answered from memory. Watchers get
every committed change in revision order. The attach service's liveness is the
state of its open ReportLiveness stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from proto.dranet.store.v1 import store_pb2 as pb
from proto.dranet.store.v1 import store_pb2_grpc
from services.store import metrics
from services.store.db import Change, StoreDB, StoreError
from shared.tasks import TaskSet

log = logging.getLogger(__name__)

T = TypeVar("T")
WATCH_QUEUE = 4096
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def _consume(task: asyncio.Future[Any]) -> None:
    """Mark a dropped task's outcome as retrieved."""
    if not task.cancelled():
        task.exception()


class _Closed:
    """What a stream step returns instead of a value once the store is stopping."""


_CLOSED = _Closed()
R = TypeVar("R")


class _Watcher:
    def __init__(self, kept_only: bool = False) -> None:
        self.queue: asyncio.Queue[pb.WatchEvent | None] = asyncio.Queue(WATCH_QUEUE)
        self.overflowed = False
        # Only KeptDevice events (the inventory's watch).
        self.kept_only = kept_only


def _event(change: Change, revision: int) -> pb.WatchEvent:
    ev = pb.WatchEvent(
        type=pb.WatchEvent.PUT if change.kind == "put" else pb.WatchEvent.DELETE, revision=revision
    )
    if change.table == "devices":
        ev.device.CopyFrom(change.record)
    elif change.table == "results":
        ev.result.CopyFrom(change.record)
    elif change.table == "kept":
        ev.kept.CopyFrom(change.record)
    else:
        ev.activity.CopyFrom(change.record)
    return ev


class Liveness:
    """The attach service's connection to the runtime, as its open streams report it."""

    def __init__(self) -> None:
        self._streams: dict[int, pb.LivenessReport] = {}
        self._next = 0
        self.state = pb.AttachLiveness(connected=False, since_unix_nano=time.time_ns())

    def open(self) -> int:
        self._next += 1
        return self._next

    def update(self, stream: int, report: pb.LivenessReport | None) -> pb.AttachLiveness | None:
        """Record a report (None: the stream ended). Returns the new state if it changed."""
        if report is None:
            self._streams.pop(stream, None)
        else:
            self._streams[stream] = report
        live = [r for r in self._streams.values() if r.connected]
        newest = live[-1] if live else (list(self._streams.values())[-1] if self._streams else None)
        new = pb.AttachLiveness(
            connected=bool(live),
            # Draining only if every connected instance drains: during a rolling
            # update the new instance serves while the old one drains.
            draining=bool(live) and all(r.draining for r in live),
            runtime_name=newest.runtime_name if newest else "",
            runtime_version=newest.runtime_version if newest else "",
            instance=newest.instance if newest else "",
        )
        old = pb.AttachLiveness()
        old.CopyFrom(self.state)
        old.since_unix_nano = 0
        if new == old:
            return None
        new.since_unix_nano = time.time_ns()
        self.state = new
        return new


class StoreService(store_pb2_grpc.PodConfigStoreServicer):
    """PodConfigStore over a StoreDB."""

    def __init__(self, db: StoreDB) -> None:
        self.db = db
        self._write_lock = asyncio.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")
        self._watchers: set[_Watcher] = set()
        self.liveness = Liveness()
        self._closing = asyncio.Event()
        self._open_streams = 0
        self._streams_ended = asyncio.Event()
        metrics.bind(
            revision=lambda: self.db.revision,
            records=self.db.counts,
            map_size=lambda: self.db.map_size,
            streams=lambda: self._open_streams,
            attach_connected=lambda: self.liveness.state.connected,
        )

    async def end_streams(self, within: float = 2.0) -> None:
        """End every Watch, Session and ReportLiveness stream from our side, as finished calls.
        Called before the gRPC server stops: a stream still open then is cancelled by grpc,
        which logs it as an unhandled CancelledError traceback."""
        self._closing.set()
        for w in list(self._watchers):
            with contextlib.suppress(asyncio.QueueFull):
                w.queue.put_nowait(None)
        if self._open_streams:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._streams_ended.wait(), within)

    @contextlib.contextmanager
    def _stream(self) -> Iterator[None]:
        self._open_streams += 1
        self._streams_ended.clear()
        try:
            yield
        finally:
            self._open_streams -= 1
            if not self._open_streams:
                self._streams_ended.set()

    async def _unless_closing(self, step: Awaitable[R]) -> R | _Closed:
        """``await step``, or _CLOSED as soon as the store is stopping (the step is cancelled)."""
        if self._closing.is_set():
            return _CLOSED
        task = asyncio.ensure_future(step)
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            await asyncio.wait((task, closing), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The RPC itself was cancelled (its client went away): the step is dropped, and
            # its outcome (StopAsyncIteration when the stream ended) is consumed, or asyncio
            # logs "Task exception was never retrieved" (seen under churn on a real node).
            task.cancel()
            task.add_done_callback(_consume)
            raise
        finally:
            closing.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return _CLOSED

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        for w in list(self._watchers):
            with contextlib.suppress(asyncio.QueueFull):
                w.queue.put_nowait(None)

    # --- plumbing -----------------------------------------------------------------------

    async def _write(self, fn: Callable[[], tuple[T, list[Change]]]) -> T:
        async with self._write_lock:
            result, changes = await asyncio.get_running_loop().run_in_executor(self._writer, fn)
            if changes:
                self._publish(changes, self.db.revision)
            return result

    def _publish(self, changes: list[Change], revision: int) -> None:
        for change in changes:
            ev = _event(change, revision)
            self._broadcast(ev)

    def _broadcast(self, ev: pb.WatchEvent) -> None:
        kept = ev.WhichOneof("record") == "kept"
        for w in list(self._watchers):
            if w.kept_only and not kept:
                continue
            try:
                w.queue.put_nowait(ev)
            except asyncio.QueueFull:
                # A watcher that cannot keep up is cut off; it re-lists and re-watches.
                w.overflowed = True
                self._watchers.discard(w)
                with contextlib.suppress(asyncio.QueueEmpty):
                    w.queue.get_nowait()
                w.queue.put_nowait(None)

    async def _call(
        self, context: grpc.aio.ServicerContext, name: str, op: Awaitable[T] | Callable[[], T]
    ) -> T:
        started = time.perf_counter()
        status = "INTERNAL"
        try:
            result = op() if callable(op) else await op
            status = "OK"
            return result
        except StoreError as exc:
            status = exc.code
            await context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
            raise AssertionError("unreachable") from None
        except asyncio.CancelledError:
            status = "CANCELLED"
            raise
        finally:
            metrics.record(name, status, time.perf_counter() - started)

    # --- operations shared by unary calls and sessions ---------------------------------

    async def put_devices(self, req: pb.PutDevicesRequest) -> pb.PutDevicesResponse:
        revisions = await self._write(
            lambda: self.db.put_devices(req.configs, req.kept, expect_new=req.expect_new)
        )
        return pb.PutDevicesResponse(revisions=revisions)

    async def put_attach_result(self, req: pb.AttachResult) -> pb.PutResponse:
        return pb.PutResponse(revision=await self._write(lambda: self.db.put_result(req)))

    async def touch_pod(self, req: pb.PodActivity) -> pb.PutResponse:
        return pb.PutResponse(revision=await self._write(lambda: self.db.touch_pod(req)))

    async def delete_device(self, req: pb.DeviceKey) -> pb.DeleteResponse:
        n = await self._write(lambda: self.db.delete_device(req.pod_uid, req.device))
        return pb.DeleteResponse(deleted=n, revision=self.db.revision)

    async def delete_pod(self, req: pb.PodKey) -> pb.DeleteResponse:
        n = await self._write(lambda: self.db.delete_pod(req.pod_uid))
        return pb.DeleteResponse(deleted=n, revision=self.db.revision)

    async def clear_attach_state(self, req: pb.PodKey) -> pb.DeleteResponse:
        n = await self._write(lambda: self.db.clear_attach_state(req.pod_uid))
        return pb.DeleteResponse(deleted=n, revision=self.db.revision)

    async def delete_claim(self, req: pb.ClaimKey) -> pb.DeleteClaimResponse:
        removed = await self._write(lambda: self.db.delete_claim(req.claim_uid))
        return pb.DeleteClaimResponse(removed=removed, revision=self.db.revision)

    # --- unary gRPC ---------------------------------------------------------------------

    async def PutDevices(self, request: pb.PutDevicesRequest, context: Any) -> pb.PutDevicesResponse:
        return await self._call(context, "put_devices", self.put_devices(request))

    async def GetDevice(self, request: pb.DeviceKey, context: Any) -> pb.DeviceConfig:
        return await self._call(
            context, "get_device", lambda: self.db.get_device(request.pod_uid, request.device)
        )

    async def DeleteDevice(self, request: pb.DeviceKey, context: Any) -> pb.DeleteResponse:
        return await self._call(context, "delete_device", self.delete_device(request))

    async def GetPod(self, request: pb.PodKey, context: Any) -> pb.PodState:
        return await self._call(context, "get_pod", lambda: self.db.pod_state(request.pod_uid))

    async def DeletePod(self, request: pb.PodKey, context: Any) -> pb.DeleteResponse:
        return await self._call(context, "delete_pod", self.delete_pod(request))

    async def ClearAttachState(self, request: pb.PodKey, context: Any) -> pb.DeleteResponse:
        return await self._call(context, "clear_attach_state", self.clear_attach_state(request))

    async def DeleteClaim(self, request: pb.ClaimKey, context: Any) -> pb.DeleteClaimResponse:
        return await self._call(context, "delete_claim", self.delete_claim(request))

    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListResponse:
        return await self._call(context, "list", lambda: self.db.list(request.pod_uid, request.claim_uid))

    async def ListKept(self, request: pb.ListKeptRequest, context: Any) -> pb.ListKeptResponse:
        return await self._call(context, "list_kept", self.db.list_kept)

    async def PutAttachResult(self, request: pb.AttachResult, context: Any) -> pb.PutResponse:
        return await self._call(context, "put_attach_result", self.put_attach_result(request))

    async def TouchPod(self, request: pb.PodActivity, context: Any) -> pb.PutResponse:
        return await self._call(context, "touch_pod", self.touch_pod(request))

    async def GetLiveness(self, request: pb.GetLivenessRequest, context: Any) -> pb.AttachLiveness:
        return await self._call(context, "get_liveness", lambda: self.liveness.state)

    async def ReportLiveness(
        self, request_iterator: AsyncIterator[pb.LivenessReport], context: Any
    ) -> pb.LivenessAck:
        stream = self.liveness.open()
        reports = request_iterator.__aiter__()
        try:
            with self._stream():
                while True:
                    report = await self._unless_closing(reports.__anext__())
                    if isinstance(report, _Closed):
                        break
                    self._liveness_changed(self.liveness.update(stream, report))
        except (StopAsyncIteration, asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        finally:
            # The stream ended: the attach process stopped or died.
            self._liveness_changed(self.liveness.update(stream, None))
        return pb.LivenessAck()

    def _liveness_changed(self, state: pb.AttachLiveness | None) -> None:
        if state is None:
            return
        log.info(
            "attach liveness changed",
            extra={"connected": state.connected, "runtime": state.runtime_name, "instance": state.instance},
        )
        ev = pb.WatchEvent(type=pb.WatchEvent.PUT, revision=self.db.revision)
        ev.liveness.CopyFrom(state)
        self._broadcast(ev)

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.WatchEvent]:
        w = _Watcher(kept_only=request.kept_only)
        if self._closing.is_set():
            return
        # Register before the snapshot so nothing committed after it is missed; a
        # change seen in both is harmless (puts are idempotent for watchers).
        self._watchers.add(w)
        self._open_streams += 1
        self._streams_ended.clear()
        try:
            if request.initial:
                revision = self.db.revision
                for change in self.db.snapshot(kept_only=request.kept_only):
                    yield _event(change, revision)
                if not request.kept_only:
                    live = pb.WatchEvent(type=pb.WatchEvent.PUT, revision=revision)
                    live.liveness.CopyFrom(self.liveness.state)
                    yield live
                yield pb.WatchEvent(type=pb.WatchEvent.SYNCED, revision=revision)
            while True:
                ev = await w.queue.get()
                if ev is None:
                    if w.overflowed:
                        await context.abort(
                            grpc.StatusCode.RESOURCE_EXHAUSTED, "watch fell behind; list and watch again"
                        )
                    return
                yield ev
        finally:
            self._watchers.discard(w)
            self._open_streams -= 1
            if not self._open_streams:
                self._streams_ended.set()

    # --- sessions -----------------------------------------------------------------------

    async def Session(self, request_iterator: Any, context: Any) -> None:
        """Uses the handler's read/write API rather than iterators: one fewer queue
        and task switch per call, which is most of a session read's cost."""
        write_lock = asyncio.Lock()
        pending = TaskSet()

        async def send(resp: pb.SessionResponse) -> None:
            async with write_lock:
                await context.write(resp)

        async def handle(req: pb.SessionRequest) -> None:
            with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AbortError, RuntimeError):
                await send(await self._session_call(req))

        try:
            with self._stream():
                await self._session_loop(context, send, handle, pending)
        finally:
            await pending.gather()

    async def _session_loop(
        self,
        context: Any,
        send: Callable[[pb.SessionResponse], Awaitable[None]],
        handle: Callable[[pb.SessionRequest], Coroutine[Any, Any, None]],
        pending: TaskSet,
    ) -> None:
        while True:
            req = await self._unless_closing(context.read())
            if req is grpc.aio.EOF or isinstance(req, _Closed):
                return
            if req.WhichOneof("op") in ("get_device", "get_pod", "list", "list_kept", "get_liveness"):
                # Reads come from memory: answer inline.
                await send(await self._session_call(req))
                continue
            pending.spawn(handle(req))

    async def _session_call(self, req: pb.SessionRequest) -> pb.SessionResponse:
        started = time.perf_counter()
        resp = await self._session_op(req)
        op = req.WhichOneof("op") or "none"
        metrics.record(op, _CODE_NAMES.get(resp.code, str(resp.code)), time.perf_counter() - started)
        return resp

    async def _session_op(self, req: pb.SessionRequest) -> pb.SessionResponse:
        resp = pb.SessionResponse(id=req.id)
        op = req.WhichOneof("op")
        try:
            if op == "get_device":
                resp.device.CopyFrom(self.db.get_device(req.get_device.pod_uid, req.get_device.device))
            elif op == "get_pod":
                resp.pod.CopyFrom(self.db.pod_state(req.get_pod.pod_uid))
            elif op == "list":
                resp.list.CopyFrom(self.db.list(req.list.pod_uid, req.list.claim_uid))
            elif op == "list_kept":
                resp.list_kept.CopyFrom(self.db.list_kept())
            elif op == "get_liveness":
                resp.liveness.CopyFrom(self.liveness.state)
            elif op == "put_devices":
                resp.put_devices.CopyFrom(await self.put_devices(req.put_devices))
            elif op == "delete_device":
                resp.deleted.CopyFrom(await self.delete_device(req.delete_device))
            elif op == "delete_pod":
                resp.deleted.CopyFrom(await self.delete_pod(req.delete_pod))
            elif op == "clear_attach_state":
                resp.deleted.CopyFrom(await self.clear_attach_state(req.clear_attach_state))
            elif op == "delete_claim":
                resp.delete_claim.CopyFrom(await self.delete_claim(req.delete_claim))
            elif op == "put_attach_result":
                resp.put.CopyFrom(await self.put_attach_result(req.put_attach_result))
            elif op == "touch_pod":
                resp.put.CopyFrom(await self.touch_pod(req.touch_pod))
            else:
                resp.code = grpc.StatusCode.UNIMPLEMENTED.value[0]
                resp.message = f"session op {op!r} is not known to this store"
        except StoreError as exc:
            resp.code = getattr(grpc.StatusCode, exc.code).value[0]
            resp.message = str(exc)
        except Exception as exc:
            log.exception("session call failed", extra={"op": op})
            resp.code = grpc.StatusCode.INTERNAL.value[0]
            resp.message = f"{op}: {exc}"
        return resp

    def register(self, server: grpc.aio.Server) -> None:
        store_pb2_grpc.add_PodConfigStoreServicer_to_server(self, server)
