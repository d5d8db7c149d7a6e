"""ClaimStatusWriter keeps the attach service's liveness from the store's watch, for the gate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from proto.dranet.store.v1 import store_pb2 as st
from services.prepare.status import ClaimStatusWriter
from shared.storeclient import StoreCallError


def live(connected: bool) -> st.WatchEvent:
    ev = st.WatchEvent(type=st.WatchEvent.PUT, revision=1)
    ev.liveness.CopyFrom(st.AttachLiveness(connected=connected))
    return ev


class ScriptedStore:
    """One watch stream: the initial listing, then what the test pushes, then an error."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[st.WatchEvent | None] = asyncio.Queue()
        self.watches = 0

    async def watch(self, initial: bool = False) -> AsyncIterator[st.WatchEvent]:
        assert initial
        self.watches += 1
        while True:
            ev = await self.events.get()
            if ev is None:
                raise StoreCallError("UNAVAILABLE", "store stopped")
            yield ev


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_liveness_is_current_only_while_the_watch_is_synced() -> None:
    store = ScriptedStore()
    writer = ClaimStatusWriter(store, kube=None, driver="dra.net")  # type: ignore[arg-type]
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop))
    try:
        # The initial listing: liveness comes before SYNCED and counts only after it.
        await store.events.put(live(True))
        await settle()
        assert writer.attach is None
        await store.events.put(st.WatchEvent(type=st.WatchEvent.SYNCED, revision=1))
        await settle()
        assert writer.attach is not None and writer.attach.connected
        # attach dies: the store's next event says so.
        await store.events.put(live(False))
        await settle()
        assert writer.attach is not None and not writer.attach.connected
        # The watch breaks: no view (the gate asks the store) until the next one syncs.
        await store.events.put(None)
        await settle()
        assert writer.attach is None
        await asyncio.sleep(0.6)  # the writer watches again after 0.5 s
        assert store.watches == 2
        await store.events.put(live(True))
        await store.events.put(st.WatchEvent(type=st.WatchEvent.SYNCED, revision=2))
        await settle()
        assert writer.attach is not None and writer.attach.connected
    finally:
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert writer.attach is None
