"""Async client of the dranet.store.v1 PodConfigStore, used by prepare and attach.

Calls go over one long-lived Session stream (cheaper per call than unary gRPC,
which matters on attach's hot path). Every store call is idempotent (puts and
deletes are by key), so a call that meets a broken connection, e.g. while the
store restarts, is retried on a new session until its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc

from proto.dranet.store.v1 import store_pb2 as pb
from proto.dranet.store.v1 import store_pb2_grpc
from shared.rpc import channel

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S = 10.0
_RETRY_CODES = {grpc.StatusCode.UNAVAILABLE.value[0], grpc.StatusCode.CANCELLED.value[0]}
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


class StoreCallError(Exception):
    """A store call failed; ``code`` is the gRPC status name (NOT_FOUND, UNAVAILABLE, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"store {code}: {message}")
        self.code = code
        self.message = message


class _Session:
    def __init__(self, stub: store_pb2_grpc.PodConfigStoreStub) -> None:
        self.call = stub.Session()
        self.pending: dict[int, asyncio.Future[pb.SessionResponse]] = {}
        self.write_lock = asyncio.Lock()
        self.closed = False
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        error = "session closed"
        try:
            while True:
                resp = await self.call.read()
                if resp is grpc.aio.EOF:
                    break
                fut = self.pending.pop(resp.id, None)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
        except grpc.aio.AioRpcError as exc:
            error = f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            error = "session cancelled"
        finally:
            self.closed = True
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(StoreCallError("UNAVAILABLE", error))
            self.pending.clear()

    async def send(self, req: pb.SessionRequest) -> asyncio.Future[pb.SessionResponse]:
        fut: asyncio.Future[pb.SessionResponse] = asyncio.get_running_loop().create_future()
        self.pending[req.id] = fut
        try:
            async with self.write_lock:
                await self.call.write(req)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            self.pending.pop(req.id, None)
            self.closed = True
            raise StoreCallError("UNAVAILABLE", f"session write failed: {exc}") from None
        return fut

    async def close(self) -> None:
        self.closed = True
        self.call.cancel()
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


class StoreClient:
    """The store over its Unix socket. Create inside a running event loop."""

    def __init__(self, socket_path: str | os.PathLike[str], deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.socket_path = os.fspath(socket_path)
        self.deadline_s = deadline_s
        self._channel = channel(self.socket_path)
        self.stub = store_pb2_grpc.PodConfigStoreStub(self._channel)
        self._session: _Session | None = None
        self._ids = itertools.count(1)
        self._session_lock = asyncio.Lock()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._channel.close()

    async def __aenter__(self) -> StoreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _get_session(self) -> _Session:
        async with self._session_lock:
            if self._session is None or self._session.closed:
                if self._session is not None:
                    await self._session.close()
                self._session = _Session(self.stub)
            return self._session

    async def _call(self, deadline_s: float | None = None, **op: Any) -> pb.SessionResponse:
        loop = asyncio.get_running_loop()
        end = loop.time() + (deadline_s or self.deadline_s)
        delay = 0.05
        last = "no attempt"
        while True:
            left = end - loop.time()
            if left <= 0:
                raise StoreCallError(
                    "UNAVAILABLE", f"store at {self.socket_path} did not answer in time ({last})"
                )
            try:
                session = await self._get_session()
                fut = await session.send(pb.SessionRequest(id=next(self._ids), **op))
                async with asyncio.timeout(left):
                    resp = await fut
            except StoreCallError as exc:
                last = exc.message
            except TimeoutError:
                last = "timed out"
                continue
            else:
                if resp.code == 0:
                    return resp
                if resp.code not in _RETRY_CODES:
                    raise StoreCallError(_CODE_NAMES.get(resp.code, str(resp.code)), resp.message)
                last = resp.message
            await asyncio.sleep(min(delay, max(0.0, end - loop.time())))
            delay = min(delay * 2, 1.0)

    # --- calls ------------------------------------------------------------------------

    async def put_devices(
        self,
        configs: Iterable[pb.DeviceConfig],
        kept: Iterable[pb.KeptDevice] = (),
        *,
        expect_new: bool = False,
    ) -> list[int]:
        """Store configs (and kept devices) in one durable transaction; returns the
        configs' revisions. ``expect_new``: FAILED_PRECONDITION (nothing written) when a
        config's device already holds a config, unless a provisional one of the same claim."""
        resp = await self._call(
            put_devices=pb.PutDevicesRequest(configs=list(configs), kept=list(kept), expect_new=expect_new)
        )
        return list(resp.put_devices.revisions)

    async def get_device(self, pod_uid: str, device: str) -> pb.DeviceConfig | None:
        try:
            resp = await self._call(get_device=pb.DeviceKey(pod_uid=pod_uid, device=device))
        except StoreCallError as exc:
            if exc.code == "NOT_FOUND":
                return None
            raise
        return resp.device

    async def delete_device(self, pod_uid: str, device: str) -> int:
        resp = await self._call(delete_device=pb.DeviceKey(pod_uid=pod_uid, device=device))
        return resp.deleted.deleted

    async def get_pod(self, pod_uid: str) -> pb.PodState:
        resp = await self._call(get_pod=pb.PodKey(pod_uid=pod_uid))
        return resp.pod

    async def delete_pod(self, pod_uid: str) -> int:
        resp = await self._call(delete_pod=pb.PodKey(pod_uid=pod_uid))
        return resp.deleted.deleted

    async def clear_attach_state(self, pod_uid: str) -> int:
        resp = await self._call(clear_attach_state=pb.PodKey(pod_uid=pod_uid))
        return resp.deleted.deleted

    async def delete_claim(self, claim_uid: str) -> list[pb.DeviceConfig]:
        resp = await self._call(delete_claim=pb.ClaimKey(claim_uid=claim_uid))
        return list(resp.delete_claim.removed)

    async def list(self, pod_uid: str = "", claim_uid: str = "") -> pb.ListResponse:
        resp = await self._call(list=pb.ListRequest(pod_uid=pod_uid, claim_uid=claim_uid))
        return resp.list

    async def list_kept(self) -> pb.ListKeptResponse:
        """Every kept device (PersistentResourceSliceAttributes)."""
        resp = await self._call(list_kept=pb.ListKeptRequest())
        return resp.list_kept

    async def put_attach_result(self, result: pb.AttachResult) -> int:
        resp = await self._call(put_attach_result=result)
        return resp.put.revision

    async def touch_pod(self, pod_uid: str, unix_nano: int = 0) -> int:
        resp = await self._call(
            touch_pod=pb.PodActivity(pod_uid=pod_uid, last_nri_activity_unix_nano=unix_nano)
        )
        return resp.put.revision

    async def get_liveness(self) -> pb.AttachLiveness:
        resp = await self._call(get_liveness=pb.GetLivenessRequest())
        return resp.liveness

    async def watch(self, initial: bool = True, kept_only: bool = False) -> AsyncIterator[pb.WatchEvent]:
        """Committed changes as they happen (after the current state if ``initial``;
        only kept devices with ``kept_only``). Ends with StoreCallError when the
        stream breaks; re-list and watch again."""
        call = self.stub.Watch(pb.WatchRequest(initial=initial, kept_only=kept_only))
        try:
            async for ev in call:
                yield ev
        except grpc.aio.AioRpcError as exc:
            raise StoreCallError(exc.code().name, exc.details() or "watch ended") from None
        finally:
            call.cancel()

    async def hold_liveness(self, reports: AsyncIterator[pb.LivenessReport]) -> None:
        """Keep a ReportLiveness stream open, sending each report; returns when
        ``reports`` ends. StoreCallError when the store goes away."""
        try:
            await self.stub.ReportLiveness(reports)
        except grpc.aio.AioRpcError as exc:
            raise StoreCallError(exc.code().name, exc.details() or "liveness stream ended") from None
