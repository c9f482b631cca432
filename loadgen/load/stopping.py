"""How the measuring side obeys a stop (Ctrl-C, SIGTERM, SIGHUP, a failure that ends the
load): in every phase, not only while requests are in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def relay(source: asyncio.Event, target: asyncio.Event) -> None:
    """Set ``target`` once ``source`` is set (run it as a task; cancel it when done)."""
    await source.wait()
    target.set()


async def unless_stopped(stop: asyncio.Event, work: Coroutine[Any, Any, T]) -> T | None:
    """``work``'s result, or None when ``stop`` is set first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return None
