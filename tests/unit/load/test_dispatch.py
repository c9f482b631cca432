"""The dispatcher awaits every request task: one that raises ends the load and is raised. A
request's slot wait is the time until the slot it took was given back, for every request that
waited, not only the one the dispatcher was blocked on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from loadgen.errors import OutputError
from loadgen.load.dispatch import LoadPlan, run_load


class Requests:
    def __getitem__(self, i: int) -> int:
        return i

    def __len__(self) -> int:
        return 1000


class FailingClient:
    """Each request takes 5 ms; recording the 10th fails as a full disk would."""

    def __init__(self) -> None:
        self.started = 0
        self.recorded: list[int] = []
        self.cancelled = 0

    async def send(self, request: Any, i: int, scheduled_ns: int, emit: Callable[[int], None], slot_ns: int,
                   free: Callable[[], None] | None = None) -> None:
        self.started += 1
        try:
            await asyncio.sleep(0.005)
        except asyncio.CancelledError:
            self.cancelled += 1
            return
        if len(self.recorded) == 9:
            raise OutputError("records.jsonl: cannot append to it: No space left on device (ENOSPC)")
        self.recorded.append(i)


def test_a_request_task_that_raises_ends_the_load_and_is_raised() -> None:
    client = FailingClient()
    plan = LoadPlan(Requests(), [0.0] * 1000, 1000, 4)  # type: ignore[arg-type]

    async def go() -> None:
        await run_load(client, plan, start_ns=0, emit=lambda r: None, stop=asyncio.Event())  # type: ignore[arg-type]

    with pytest.raises(OutputError, match="ENOSPC"):
        asyncio.run(go())
    # it stopped sending at once: at most the 4 in flight beside the failing one were started after
    assert len(client.recorded) == 9
    assert client.started <= 9 + 1 + 4 + 4
    assert client.started < 1000


class TimedClient:
    """Each request takes 30 ms and gives its slot back at its end, noting when."""

    def __init__(self) -> None:
        self.slot_ns: dict[int, int] = {}
        self.scheduled_ns: dict[int, int] = {}
        self.freed: list[tuple[int, int]] = []  # (just before, just after) each give-back, in order

    async def send(self, request: Any, i: int, scheduled_ns: int, emit: Callable[[int], None], slot_ns: int,
                   free: Callable[[], None] | None = None) -> None:
        self.slot_ns[i], self.scheduled_ns[i] = slot_ns, scheduled_ns
        await asyncio.sleep(0.03)
        assert free is not None
        before = time.perf_counter_ns()
        free()
        self.freed.append((before, time.perf_counter_ns()))
        free()  # (a second call gives nothing back)


def test_every_request_that_waited_for_a_slot_has_that_wait_as_its_slot_wait() -> None:
    # 8 requests due at once, 2 slots: the first 2 go at their schedule; request k >= 2 takes the
    # slot given back k - 2 give-backs before, and that moment is its slot time (before, only the
    # request the dispatcher was blocked on had it: the one after it, sent in the same step, had
    # none, and its wait counted as the client's lag)
    client = TimedClient()
    plan = LoadPlan(Requests(), [0.0] * 8, 8, 2)  # type: ignore[arg-type]

    async def go() -> None:
        await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=lambda r: None,  # type: ignore[arg-type]
                       stop=asyncio.Event())

    asyncio.run(go())
    assert len(client.freed) == 8
    for i in (0, 1):
        assert client.slot_ns[i] == client.scheduled_ns[i]
    for i in range(2, 8):
        before, after = client.freed[i - 2]
        assert before <= client.slot_ns[i] <= after
