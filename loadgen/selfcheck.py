"""The client's own health in every measured window, and the verdict "client-bound".

Each client process (the run's, or each worker's) samples while the window runs:

- event-loop lag: a timer set every 10 ms; how late it fires plus how long the loop then takes
  to reach a callback it queues. That is the backlog a chunk arriving at that moment waits
  behind before its arrival is timestamped, so it bounds the error added to TTFT and ITL. An
  idle loop shows up to about 1 ms (uvloop's timers have millisecond resolution).
- CPU: the process's CPU seconds over the wall seconds of each 1 s interval.
- reads: how many socket reads the client handled and the time spent in them (the per-chunk
  work: a clock reading, the HTTP parser, the SSE scan).

Samples go to ``probes.jsonl`` (probe ``client``, one line per process and second). The
summary adds send lag (``sent_at - scheduled_at``) from the records of rate-driven cells
(a closed loop has no schedule to lag behind). ``summarize_client`` derives it all from the run
directory, so ``loadgen report`` reproduces the verdict.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from loadgen.records import RequestRecord

PROBE_EVERY_S = 0.010
INTERVAL_S = 1.0
# beyond these the run is reported client-bound
LOOP_LAG_P99_MS = 5.0
SEND_LAG_P99_MS = 5.0
CPU_SHARE = 0.90


class ClientMonitor:
    """Samples one process's event loop and CPU; ``emit`` receives one dict per interval."""

    def __init__(self, stats: Any, emit: Callable[[dict[str, Any]], None], worker: int = 0) -> None:
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

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._t, self._cpu = time.perf_counter(), time.process_time()
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
        cpu = time.process_time()
        s = self._stats
        self._emit({
            "worker": self._worker,
            "wall_s": round(now - self._t, 6),
            "cpu_s": round(cpu - self._cpu, 6),
            "reads": s.reads - self._reads,
            "read_ms": round((s.read_ns - self._read_ns) / 1e6, 3),
            "loop_lag_ms": [round(x * 1e3, 3) for x in self._lags],
        })
        self._t, self._cpu = now, cpu
        self._reads, self._read_ns = s.reads, s.read_ns
        self._lags = []
        self._next_flush = now + INTERVAL_S

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._flush(time.perf_counter())


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    a = np.asarray(values)
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def summarize_client(
    samples: list[dict[str, Any]], records: list[RequestRecord], rate_driven: bool
) -> dict[str, Any] | None:
    """The ``client`` entry of a cell in ``summary.json``; None when nothing was sampled."""
    samples = [s["values"] for s in samples]  # probes.jsonl lines: {"cell", "probe", "wall", "values"}
    if not samples:
        return None
    lags = [x for s in samples for x in s["loop_lag_ms"]]
    per_worker: dict[int, list[float]] = {}
    for s in samples:
        acc = per_worker.setdefault(int(s.get("worker", 0)), [0.0, 0.0])
        acc[0] += s["cpu_s"]
        acc[1] += s["wall_s"]
    workers = len(per_worker)
    cpu_s = sum(c for c, _ in per_worker.values())
    share = max((c / w for c, w in per_worker.values() if w > 0), default=0.0)
    reads = sum(s["reads"] for s in samples)
    read_ms = sum(s["read_ms"] for s in samples)
    send = None
    if rate_driven:
        send = _stats([(r.sent_at - r.scheduled_at) * 1e3 for r in records if not r.warmup and r.sent_at is not None])
    loop = _stats(lags)
    reasons = []
    if loop is not None and loop["p99"] > LOOP_LAG_P99_MS:
        reasons.append(f"event-loop lag p99 {loop['p99']:.1f} ms > {LOOP_LAG_P99_MS:g} ms")
    if send is not None and send["p99"] > SEND_LAG_P99_MS:
        reasons.append(f"send lag p99 {send['p99']:.1f} ms > {SEND_LAG_P99_MS:g} ms")
    if share > CPU_SHARE:
        reasons.append(f"client CPU {share:.0%} of a core > {CPU_SHARE:.0%}")
    bound = bool(reasons)
    advice = None
    if bound:
        more = max(workers + 1, math.ceil(workers * max(share, 1.0) / 0.6))
        advice = (f"the client, not the server, limited this cell: set load.workers: {more} "
                  "(or auto), or spread the load over hosts with loadgen locust --master")
    return {
        "workers": workers,
        "loop_lag_ms": loop,
        "send_lag_ms": send,
        "cpu_s": round(cpu_s, 3),
        "cpu_share_max": round(share, 4),
        "reads": reads,
        "read_us_mean": round(read_ms * 1e3 / reads, 3) if reads else None,
        "client_bound": bound,
        "reasons": reasons,
        "advice": advice,
        "thresholds": {"loop_lag_p99_ms": LOOP_LAG_P99_MS, "send_lag_p99_ms": SEND_LAG_P99_MS,
                       "cpu_share": CPU_SHARE},
    }
