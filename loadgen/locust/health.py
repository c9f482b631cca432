"""The self-check of a Locust process that runs users (the only one, or each worker), as
``loadgen.load.selfcheck`` samples loadgen run's client: each second while users run, one
``ClientReading``: how late its gevent loop woke a greenlet that asked to sleep 10 ms, its CPU
seconds over the wall seconds, its kernel-stamped reads (how many, and how long after their
bytes arrived each was taken: ``StampedSocket``), the kernel's run-queue wait of its thread.
(Left out: loadgen run's naming of the processes that held a starved client's cores; that scan
of every process, run in two Locust processes at a test's start, came with TTFTs of 60 to 90
ms against 50 in the requests they sent then.) The readings go to
``probes.jsonl`` (a worker's with its report to the master), where the run directory's cell
gets its verdict from them, as loadgen run's cells do.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gevent

from loadgen.load.selfcheck import DELAYS_KEPT, queued_ns
from loadgen.results.readings import ClientReading

PROBE_EVERY_S = 0.010
INTERVAL_S = 1.0


class Reads:
    """This process's kernel-stamped reads since the last reading (``StampedSocket`` counts them)."""

    def __init__(self) -> None:
        self.count = 0
        self.read_ns = 0  # time inside the reads
        self.delays: list[int] = []  # handled minus arrived, per read (ns)

    def take(self) -> tuple[int, int, list[int]]:
        out = (self.count, self.read_ns, self.delays)
        self.count, self.read_ns, self.delays = 0, 0, []
        return out


READS = Reads()


def monitor(running: Callable[[], bool], emit: Callable[[ClientReading], None], worker: int = 0) -> None:
    """Sample this process for as long as it lives (a greenlet's body); readings are emitted
    for the seconds users ran (``running``), the others dropped."""
    lags: list[float] = []
    t, cpu, queued = time.perf_counter(), time.process_time(), queued_ns()
    READS.take()
    while True:
        due = time.perf_counter() + PROBE_EVERY_S
        gevent.sleep(PROBE_EVERY_S)
        now = time.perf_counter()
        lags.append(max(now - due, 0.0) * 1e3)
        if now - t < INTERVAL_S:
            continue
        cpu_now, queued_now = time.process_time(), queued_ns()
        reads, read_ns, delays = READS.take()
        if running():
            kept = delays[::-(-len(delays) // DELAYS_KEPT)] if delays else []
            reading = ClientReading(
                worker, round(now - t, 6), round(cpu_now - cpu, 6), reads, round(read_ns / 1e6, 3),
                tuple(round(x, 3) for x in lags), None, tuple(round(d / 1e6, 3) for d in kept),
                round(max(delays) / 1e6, 3) if delays else None, len(delays),
                None if queued is None or queued_now is None else round((queued_now - queued) / 1e6, 3),
            )
            emit(reading)
        t, cpu, queued, lags = now, cpu_now, queued_now, []
