"""The client's own health in every measured window: each client process (the run's, or
each worker's) samples while the window runs.

- event-loop lag: a timer set every 10 ms; how late it fires plus how long the loop then takes
  to reach a callback it queues. That is the backlog a chunk arriving at that moment waits
  behind before its arrival is timestamped, so it bounds the error added to TTFT and ITL. An
  idle loop shows up to about 1 ms (uvloop's timers have millisecond resolution).
- CPU: the process's CPU seconds over the wall seconds of each 1 s interval.
- reads: how many socket reads the client handled and the time spent in them (the per-chunk
  work: a clock reading, the HTTP parser, the SSE scan).
- client delay, where the kernel stamps the reads (``load.clock``): how long after its bytes
  arrived each read was handled: what the figures would have carried on the loop's clock.
- run-queue wait: the kernel's scheduler statistics of the loop's thread (``schedstat``'s
  run delay): how long it was runnable but not running, which is what another process on its
  core costs it. A delay without that wait was not contention for the core.

Samples go to ``probes.jsonl`` (probe ``client``, one line per process and second);
``loadgen.results.clienthealth`` turns them into the verdict.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from loadgen.results.readings import ClientReading, Hog

PROBE_EVERY_S = 0.010
INTERVAL_S = 1.0
# an interval whose loop lag p99 is over this while the client used under STARVED_SHARE of a
# core was starved: another process held the core; the processes that used CPU are sampled
STARVED_LAG_MS = 5.0
STARVED_SHARE = 0.5
HOG_WINDOW_S = 0.5
DELAYS_KEPT = 1000  # client delays kept per interval (evenly taken from the kernel-timed reads)


def _cpu_by_process(cores: set[int]) -> dict[int, tuple[float, str]]:
    """CPU seconds so far of every process that may run on one of ``cores``."""
    out: dict[int, tuple[float, str]] = {}
    for proc in psutil.process_iter(["name", "cpu_times", "cpu_affinity"]):
        info = proc.info
        times, affinity = info.get("cpu_times"), info.get("cpu_affinity")
        if times is None or (affinity and not cores.intersection(affinity)):
            continue
        out[proc.pid] = (times.user + times.system, str(info.get("name") or "?"))
    return out


def queued_ns() -> int | None:
    """The calling thread's run-queue wait so far (the kernel's scheduler statistics), ns."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_bytes().split()[1])
    except (OSError, IndexError, ValueError):
        return None


class HogSampler(threading.Thread):
    """The processes that used the client's cores over ``HOG_WINDOW_S`` (off the event loop)."""

    def __init__(self) -> None:
        super().__init__(name="hog-sampler", daemon=True)
        self.result: tuple[Hog, ...] | None = None

    def run(self) -> None:
        cores = os.sched_getaffinity(0)
        before, t0 = _cpu_by_process(cores), time.perf_counter()
        time.sleep(HOG_WINDOW_S)
        after, wall = _cpu_by_process(cores), time.perf_counter() - t0
        me = os.getpid()
        used = [
            (round((cpu - before[pid][0]) / wall, 3), pid, name)
            for pid, (cpu, name) in after.items() if pid in before and pid != me
        ]
        busiest = sorted(used, reverse=True)[:3]
        self.result = tuple(Hog(pid, name, share) for share, pid, name in busiest if share > 0.05)


class ClientMonitor:
    """Samples one process's event loop and CPU; ``emit`` receives a reading per interval."""

    def __init__(self, stats: Any, emit: Callable[[ClientReading], None], worker: int = 0) -> None:
        self._stats = stats  # a client.ClientStats: reads, read_ns
        self._emit = emit
        self._worker = worker
        self._lags: list[float] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t = self._cpu = 0.0
        self._reads = self._read_ns = 0
        self._next_flush = 0.0
        self._due = 0.0
        self._hogs: HogSampler | None = None
        self._queued: int | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._t, self._cpu = time.perf_counter(), time.process_time()
        self._queued = queued_ns()
        self._reads, self._read_ns = self._stats.reads, self._stats.read_ns
        self._next_flush = self._t + INTERVAL_S
        self._arm()

    def _tick(self) -> None:
        assert self._loop is not None
        t0 = time.perf_counter()
        late = max(t0 - self._due, 0.0)
        self._loop.call_soon(self._reached, t0, late)
        if t0 >= self._next_flush:
            self._flush(t0)
        self._arm()

    def _arm(self) -> None:
        assert self._loop is not None
        self._due = time.perf_counter() + PROBE_EVERY_S
        self._timer = self._loop.call_later(PROBE_EVERY_S, self._tick)

    def _reached(self, t0: float, late: float) -> None:
        self._lags.append(late + time.perf_counter() - t0)

    def _flush(self, now: float) -> None:
        cpu, queued = time.process_time(), queued_ns()
        s = self._stats
        hogs = None
        if self._hogs is not None and not self._hogs.is_alive():
            hogs = self._hogs.result or ()
            self._hogs = None
        delays, s.delays = s.delays, []
        kept = delays[::-(-len(delays) // DELAYS_KEPT)] if delays else []  # evenly taken, at most DELAYS_KEPT
        sample = ClientReading(
            self._worker, round(now - self._t, 6), round(cpu - self._cpu, 6), s.reads - self._reads,
            round((s.read_ns - self._read_ns) / 1e6, 3), tuple(round(x * 1e3, 3) for x in self._lags), hogs,
            tuple(round(d / 1e6, 3) for d in kept), round(max(delays) / 1e6, 3) if delays else None, len(delays),
            None if queued is None or self._queued is None else round((queued - self._queued) / 1e6, 3),
        )
        share = sample.cpu_s / sample.wall_s if sample.wall_s > 0 else 0.0
        lag_p99 = float(np.percentile(sample.loop_lag_ms, 99)) if self._lags else 0.0
        if lag_p99 > STARVED_LAG_MS and share < STARVED_SHARE and self._hogs is None:
            self._hogs = HogSampler()  # who holds the core: named in the next sample
            self._hogs.start()
        self._emit(sample)
        self._t, self._cpu, self._queued = now, cpu, queued
        self._reads, self._read_ns = s.reads, s.read_ns
        self._lags = []
        self._next_flush = now + INTERVAL_S

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            if self._hogs is not None:
                # a window shorter than two intervals ends while its sampler still looks: without
                # its answer the verdict says 'starved' and names no one
                self._hogs.join(HOG_WINDOW_S * 4)
            self._flush(time.perf_counter())
