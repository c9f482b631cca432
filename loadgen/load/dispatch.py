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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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
    sem = asyncio.Semaphore(plan.concurrency) if plan.concurrency else None
    tasks: set[asyncio.Task[None]] = set()
    end_ns = start_ns + int(plan.duration_s * 1e9) if plan.duration_s else None
    offsets = iter(plan.offsets)
    wanted = indices
    next_wanted = next(wanted, None) if wanted is not None else None
    pool = plan.pool
    sent = 0
    stop_wait = asyncio.ensure_future(stop.wait())

    def release(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if sem is not None:
            sem.release()
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
            waited = False
            if sem is not None and sem.locked():
                waited = True
                acquire = asyncio.ensure_future(sem.acquire())
                await asyncio.wait({acquire, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                if not acquire.done():
                    acquire.cancel()
                    break
                if stop.is_set():
                    sem.release()
                    break
            elif sem is not None:
                await sem.acquire()
            # when a slot was free: only a wait for one is slot wait; any other delay is the client's lag
            slot_ns = time.perf_counter_ns() if waited else scheduled_ns
            if end_ns is not None and time.perf_counter_ns() >= end_ns:
                if sem is not None:
                    sem.release()
                break
            task = asyncio.create_task(client.send(pool[i], i, scheduled_ns, emit, slot_ns))
            task.add_done_callback(release)
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
