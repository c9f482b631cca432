"""The dispatcher: sends a schedule of requests at absolute offsets under a concurrency cap.

One dispatcher walks the schedule in order: it sleeps until a request's absolute start time,
waits for a free concurrency slot, then starts the request as a task. ``scheduled_at`` is the
schedule's time and ``sent_at`` the actual one, so send lag is visible on every record.
A stop event (Ctrl-C, SIGTERM) ends dispatching and cancels what is in flight; each
cancelled request is still recorded. Every request task is awaited: the first that raised
(a record that could not be written) ends the load the same way, and is raised once the
requests in flight have ended. The dispatcher works on any slice of the schedule
(``indices``), so worker processes can each run a share and their records be merged.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from loadgen.load.client import PreparedRequest, StreamingClient
from loadgen.load.stopping import relay
from loadgen.results.records import RequestRecord


class Requests(Protocol):
    """Request i of a cell (a list, or a pool that makes requests past its end on demand)."""

    def __getitem__(self, i: int, /) -> PreparedRequest: ...
    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What to send: ``pool[i]`` for request i, at ``start + offsets[i]``."""

    pool: Requests
    offsets: Iterable[float]
    count: int | None
    concurrency: int | None
    duration_s: float | None = None


class Slots:
    """The concurrency limit: its free slots, each with the time it became free (oldest first),
    and the dispatcher's wake-up. A request whose exchange ended gives its slot back at once (the
    dispatcher runs at the loop's next step, where a semaphore's acquire, in a task of its own under
    ``asyncio.wait``, took three: at C = 1024 every step then held the records of the requests that
    ended in the one before, 100 ms between a request's end and the next one's send)."""

    __slots__ = ("_free", "_wake")

    def __init__(self, count: int) -> None:
        self._free = deque([0] * count)  # (0: free from the start)
        self._wake: asyncio.Future[None] | None = None

    def take(self) -> int | None:
        """The oldest free slot: when it became free (ns); None where every slot is taken."""
        return self._free.popleft() if self._free else None

    def give(self) -> None:
        self._free.append(time.perf_counter_ns())
        self.wake()

    def wake(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def wait(self) -> None:
        """Until a slot is given back (or ``wake``)."""
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None


class _Held:
    """A request's slot until it gives it back (once: at its exchange's end, or when its task ends)."""

    __slots__ = ("slots", "held")

    def __init__(self, slots: Slots) -> None:
        self.slots, self.held = slots, True

    def __call__(self) -> None:
        if self.held:
            self.held = False
            self.slots.give()


async def _wait(stop: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds unless stopped first; True when stopped."""
    if delay <= 0:
        return stop.is_set()
    if stop.is_set():
        return True
    try:
        async with asyncio.timeout(delay):
            await stop.wait()
    except TimeoutError:
        return False
    return True


async def run_load(
    client: StreamingClient,
    plan: LoadPlan,
    *,
    start_ns: int,
    emit: Callable[[RequestRecord], None],
    stop: asyncio.Event,
    indices: Iterator[int] | None = None,
) -> int:
    """Send the plan's requests (all, or those in ``indices``); returns how many were sent."""
    outer = stop
    stop = asyncio.Event()  # the caller's stop, or a request task that raised
    if outer.is_set():
        stop.set()
    relaying = asyncio.ensure_future(relay(outer, stop))
    failures: list[BaseException] = []
    slots = Slots(plan.concurrency) if plan.concurrency else None
    tasks: set[asyncio.Task[None]] = set()
    end_ns = start_ns + int(plan.duration_s * 1e9) if plan.duration_s else None
    offsets = iter(plan.offsets)
    wanted = indices
    next_wanted = next(wanted, None) if wanted is not None else None
    pool = plan.pool
    sent = 0
    stop_wait = asyncio.ensure_future(stop.wait())
    if slots is not None:
        stop_wait.add_done_callback(lambda _: slots.wake())

    def release(free: _Held | None, task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if free is not None:
            free()
        if not task.cancelled() and (exc := task.exception()) is not None:
            failures.append(exc)
            stop.set()

    try:
        i = -1
        while plan.count is None or i + 1 < plan.count:
            i += 1
            offset = next(offsets)
            if wanted is not None:
                if next_wanted is None:
                    break
                if i != next_wanted:
                    continue
                next_wanted = next(wanted, None)
            scheduled_ns = start_ns + int(offset * 1e9)
            if end_ns is not None and scheduled_ns >= end_ns:
                break
            if await _wait(stop, (scheduled_ns - time.perf_counter_ns()) / 1e9):
                break
            # the event loop's timers may fire up to a millisecond early: never send before the schedule
            while time.perf_counter_ns() < scheduled_ns:  # noqa: ASYNC110 - a sub-millisecond yield loop
                await asyncio.sleep(0)
            freed = 0
            if slots is not None:
                while (taken := slots.take()) is None and not stop.is_set():
                    await slots.wait()
                if taken is None:
                    break
                freed = taken
            # when a slot was free for it: only the wait for one is slot wait; any other delay (the
            # loop's, the client's) is its lag
            slot_ns = max(scheduled_ns, freed)
            if stop.is_set() or (end_ns is not None and time.perf_counter_ns() >= end_ns):
                break
            free = _Held(slots) if slots is not None else None
            task = asyncio.create_task(client.send(pool[i], i, scheduled_ns, emit, slot_ns, free=free))
            task.add_done_callback(partial(release, free))
            tasks.add(task)
            sent += 1
        if tasks:
            pending = asyncio.ensure_future(asyncio.wait(set(tasks)))
            await asyncio.wait({pending, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                pending.cancel()
    finally:
        stop_wait.cancel()
        relaying.cancel()
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    if failures:
        raise failures[0]
    return sent
