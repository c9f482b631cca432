"""The dispatcher awaits every request task: one that raises ends the load and is raised."""

from __future__ import annotations

import asyncio
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

    async def send(self, request: Any, i: int, scheduled_ns: int, emit: Callable[[int], None], slot_ns: int) -> None:
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
