"""Background tasks that are kept until they finish.

The event loop holds only a weak reference to a task: one nobody keeps can be collected
while it runs. ``TaskSet`` keeps each task it spawned until it is done, then forgets it,
and can wait for, or cancel, those still running (on shutdown).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


class TaskSet:
    """``spawn(coro)`` starts a task and keeps it until it is done."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def wait(self, timeout_s: float | None = None) -> int:
        """Until every task is done or ``timeout_s`` passed; returns how many still run."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout_s)
            return len(still)
        return 0

    async def gather(self) -> None:
        """Until every task is done, whatever each ends with (its own code reports errors)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every running task and wait until each has ended."""
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
