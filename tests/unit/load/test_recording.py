"""Finished requests' records are made a slice a step: what the loop was given to do meanwhile
(the next request's send) runs between two slices, and no record is lost or made twice."""

from __future__ import annotations

import asyncio
from functools import partial

import pytest

from loadgen.load.recording import SLICE, Recorder


def test_what_comes_due_while_records_wait_runs_after_one_slice_of_them() -> None:
    order: list[int | str] = []

    async def go() -> None:
        loop = asyncio.get_running_loop()
        recorder = Recorder(loop)
        tasks = [asyncio.create_task(recorder.record(partial(order.append, i))) for i in range(40)]
        await asyncio.sleep(0)  # every task has queued its record (a slice is due)
        loop.call_soon(order.append, "send")
        await asyncio.gather(*tasks)

    asyncio.run(go())
    assert order.index("send") == SLICE
    assert [x for x in order if x != "send"] == list(range(40))  # in the order they were queued


def test_a_task_cancelled_while_its_record_waits_makes_it_itself_and_once() -> None:
    order: list[int] = []

    async def go() -> list[BaseException | None]:
        recorder = Recorder(asyncio.get_running_loop())
        tasks = [asyncio.create_task(recorder.record(partial(order.append, i))) for i in range(40)]
        await asyncio.sleep(0)
        tasks[30].cancel()  # (a stop, while its record waits behind a slice or more)
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(go())
    assert sorted(order) == list(range(40))
    assert order.index(30) < order.index(16)  # made by its own task, before the queue got to it
    assert isinstance(outcomes[30], asyncio.CancelledError)


def test_a_record_that_cannot_be_made_fails_its_own_task_only() -> None:
    made: list[int] = []

    def make(i: int) -> None:
        if i == 3:
            raise OSError(28, "No space left on device")
        made.append(i)

    async def go() -> list[BaseException | None]:
        recorder = Recorder(asyncio.get_running_loop())
        return await asyncio.gather(*(recorder.record(partial(make, i)) for i in range(6)), return_exceptions=True)

    outcomes = asyncio.run(go())
    assert made == [0, 1, 2, 4, 5]
    assert isinstance(outcomes[3], OSError)
    assert [o for i, o in enumerate(outcomes) if i != 3] == [None] * 5


@pytest.mark.parametrize("count", [1, SLICE, SLICE + 1])
def test_every_record_is_made_whatever_the_count(count: int) -> None:
    made: list[int] = []

    async def go() -> None:
        recorder = Recorder(asyncio.get_running_loop())
        await asyncio.gather(*(recorder.record(partial(made.append, i)) for i in range(count)))
        await recorder.record(partial(made.append, -1))  # and one after the queue went empty

    asyncio.run(go())
    assert made == [*range(count), -1]
