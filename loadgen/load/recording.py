"""Finished requests' records, made and emitted a slice at a time, one slice a step of the loop.

A request whose exchange ended gives its concurrency slot back at once; the dispatcher takes it
at the loop's next step and the next request's task sends at the one after. Made in the request's
own task, its record (about 50 to 80 us with its emission: 256 token times, the JSON line, the
progress) would be made in that same step as every other request that ended with it: at C = 1024
on one core, where streams end together, a step held 20 to 80 ms of records and each next
request waited behind them (the server idles a stream's slot meanwhile). Here the records wait
instead: at most ``SLICE`` of them a step, in the order their requests ended, so a send waits
behind at most a slice. Each request's task still waits for its own record (a failure to write it
ends the run as before), and a task cancelled while waiting makes its record itself.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

# records made in one step of the loop (a millisecond or so)
SLICE = 16


class Recorder:
    """One event loop's queue of records to make (see the module's notes)."""

    __slots__ = ("loop", "_queue", "_due")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queue: deque[tuple[Callable[[], None], asyncio.Future[None]]] = deque()
        self._due = False

    async def record(self, make: Callable[[], None]) -> None:
        """``make()`` (which makes and emits one record) at its turn; raises what it raised."""
        made: asyncio.Future[None] = self.loop.create_future()
        self._queue.append((make, made))
        if not self._due:
            self._due = True
            self.loop.call_soon(self._slice)
        try:
            await made
        except asyncio.CancelledError:
            if made.cancelled():  # not made yet, and it never will be by the queue: made here
                make()
            raise

    def _slice(self) -> None:
        self._due = False
        queue = self._queue
        for _ in range(SLICE):
            if not queue:
                return
            make, made = queue.popleft()
            if made.done():  # its task was cancelled, and made it
                continue
            try:
                make()
            except Exception as exc:  # noqa: BLE001 - raised in its own task, as where the task made it
                made.set_exception(exc)
            else:
                made.set_result(None)
        if queue:
            self._due = True
            self.loop.call_soon(self._slice)
