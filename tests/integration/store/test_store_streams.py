"""The store's stream plumbing on a real LMDB directory: a ReportLiveness stream whose
client goes away while the store waits for its next report must leave nothing behind
that asyncio reports as an error (found under churn on a real node: "Task exception was
never retrieved ... StopAsyncIteration" in the store's log after attach was killed)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from proto.dranet.store.v1 import store_pb2 as pb
from services.store.db import StoreDB
from services.store.server import StoreService


async def test_a_cancelled_liveness_stream_leaves_no_unretrieved_task(tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    db = StoreDB(str(tmp_path / "db"))
    service = StoreService(db)
    ended = asyncio.Event()

    async def reports() -> AsyncIterator[pb.LivenessReport]:
        yield pb.LivenessReport(connected=True, runtime_name="containerd")
        await ended.wait()  # the client's next message never comes: its stream ends instead

    try:
        rpc = asyncio.create_task(service.ReportLiveness(reports(), None))
        await asyncio.sleep(0.2)
        assert service.liveness.state.connected
        rpc.cancel()  # grpc cancels the handler when the client goes away
        await asyncio.gather(rpc, return_exceptions=True)
        ended.set()  # the pending __anext__ now ends with StopAsyncIteration
        await asyncio.sleep(0.2)
        gc.collect()
        await asyncio.sleep(0)
        assert not service.liveness.state.connected
        assert [c.get("message") for c in reported] == [], reported
    finally:
        service.close()
        db.close()
