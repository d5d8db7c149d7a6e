"""shared/tasks.py: spawned tasks are kept until done, then forgotten; wait and cancel."""

from __future__ import annotations

import asyncio
import gc

import pytest

from shared.tasks import TaskSet


async def test_a_spawned_task_is_kept_until_done_then_forgotten() -> None:
    tasks = TaskSet()
    gate = asyncio.Event()
    ran = []

    async def work() -> str:
        await gate.wait()
        ran.append(1)
        return "done"

    t = tasks.spawn(work(), name="w")
    del t
    gc.collect()  # the set's reference keeps it alive
    assert len(tasks) == 1
    assert [x.get_name() for x in tasks] == ["w"]
    gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    assert ran == [1]
    assert len(tasks) == 0


async def test_wait_returns_how_many_still_run_after_the_timeout() -> None:
    tasks = TaskSet()
    tasks.spawn(asyncio.sleep(0))
    slow = tasks.spawn(asyncio.sleep(10))
    assert await tasks.wait(0.05) == 1
    assert not slow.done()
    await tasks.cancel()
    assert slow.cancelled()
    assert len(tasks) == 0
    assert await tasks.wait(0.01) == 0


async def test_gather_waits_for_all_and_swallows_their_errors() -> None:
    tasks = TaskSet()

    async def boom() -> None:
        raise ValueError("x")

    ok = tasks.spawn(asyncio.sleep(0.01, result=5))
    bad = tasks.spawn(boom())
    await tasks.gather()
    assert ok.result() == 5
    with pytest.raises(ValueError):
        bad.result()
    assert len(tasks) == 0


async def test_cancel_of_an_empty_set_is_a_no_op() -> None:
    await TaskSet().cancel()
