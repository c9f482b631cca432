"""One cell against a target: calibration probes, warmup (a preflight: a server that cannot
serve the scenario is told apart from a busy one), then the measured window, in this process
or spread over worker processes, with the garbage collector kept quiet and the client's own
health sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from loadgen.errors import TargetError
from loadgen.load.client import StreamingClient
from loadgen.load.dispatch import LoadPlan, run_load
from loadgen.load.sampling import MetricsScraper
from loadgen.load.schedule import Arrivals, iter_offsets, ramp_offsets, vllm_offsets
from loadgen.load.selfcheck import ClientMonitor
from loadgen.load.sessions import SessionPool, SessionRunner
from loadgen.load.target import unusable
from loadgen.load.workers import WorkerGroup, resolve_workers, worker_jobs
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.readings import ClientReading
from loadgen.results.records import RequestRecord
from loadgen.scenario.matrix import Cell
from loadgen.scenario.schema import Scenario
from loadgen.servers.launch import LaunchedServer
from loadgen.workload.payload import PreparedRequest
from loadgen.workload.prompts import (
    MAKE_SLICE,
    RequestPool,
    TextCalibration,
    calibration_from,
    calibration_requests,
)
from loadgen.workload.sessions import turns_of


class AbortRule:
    """``load.abort_on_error_rate``: stops the run once that share of a cell's finished
    measured requests failed (cancelled ones aside), counted from ``abort_min_requests`` on."""

    def __init__(self, point: Scenario, stop: asyncio.Event) -> None:
        self.rate = point.load.abort_on_error_rate
        self.min = point.load.abort_min_requests
        self.stop = stop
        self.finished = 0
        self.failed = 0
        self.reason: str | None = None

    def add(self, r: RequestRecord) -> None:
        if self.rate is None or r.warmup or r.error == "cancelled" or self.reason is not None:
            return
        self.finished += 1
        self.failed += not r.ok
        if self.finished >= self.min and self.failed / self.finished >= self.rate:
            self.reason = (
                f"{self.failed} of {self.finished} requests failed ({self.failed / self.finished:.0%} >= "
                f"load.abort_on_error_rate {self.rate:.0%})"
            )
            self.stop.set()


async def calibrate(
    client: StreamingClient, scenario: Scenario, model: str, seed: int, cell: int,
    emit: Callable[[RequestRecord], None],
) -> TextCalibration:
    """Two calibration requests (16 and 48 words) give the template overhead and tokens per word;
    they are recorded like warmups (request ids -1 and -2 of ``cell``), so every request sent is
    on record."""
    points = []
    for n, (words, body) in enumerate(calibration_requests(scenario, model, seed, cell), 1):
        seen: list[RequestRecord] = []
        # on the embeddings API a probe is one input, answered whole as the measured requests are
        inputs = 1 if scenario.target.api == "embeddings" else 0
        await client.send(PreparedRequest(cell, body, None, 1, warmup=True, embeddings=inputs), -n,
                          time.perf_counter_ns(), seen.append)
        emit(seen[-1])
        points.append((words, seen[-1].prompt_tokens))
    return calibration_from(points)


@dataclass(frozen=True, slots=True)
class Measuring:
    """What every cell of an engine's group is measured with: the client, the scraper of the
    server's /metrics, the engine loadgen launched (None: a server it was given), the model
    served, the text calibration, and the server as the tables describe it."""

    client: StreamingClient
    scraper: MetricsScraper
    server: LaunchedServer | None
    model: str
    calibration: TextCalibration
    desc: ServerInfo


async def warmup(
    client: StreamingClient, cell: Cell, warm: RequestPool, emit: Callable[[RequestRecord], None], stop: asyncio.Event,
) -> None:
    """The cell's warmup requests (prompts of their own, never the measured ones): a preflight
    that tells a server that cannot serve the scenario from a busy one. A repeat after the first
    waits ``load.cooldown_s`` before it (a stop ends the wait)."""
    point = cell.point
    assert point is not None
    if (cell.repeat or 1) > 1 and point.load.cooldown_s > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), point.load.cooldown_s)
        if stop.is_set():
            return
    if len(warm):
        conc = min(cell.concurrency or len(warm), len(warm))
        plan = LoadPlan(warm, iter_offsets(None), len(warm), conc)
        seen: list[RequestRecord] = []

        def keep(r: RequestRecord) -> None:
            seen.append(r)
            emit(r)

        await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=keep, stop=stop)
        if stop.is_set():
            return  # stopped: what was sent is on record, and tells nothing of the server
        if (why := unusable(seen, point.target.api)) is not None:
            raise TargetError(why)


def shaped(point: Scenario) -> str | None:
    """The load shape that runs in one client process, in words (None: a plain schedule)."""
    w, ld = point.workload, point.load
    if w.multi_turn is not None:
        return "multi-turn sessions"
    if w.trace is not None:
        return "a trace replay"
    if ld.ramp_up is not None:
        return "a ramp-up"
    if ld.stages:
        return "stages"
    return None


def _asked_workers(cell: Cell) -> int:
    """``load.workers``, at most one per stream."""
    workers = resolve_workers(cell.point.load.workers)
    return workers if cell.concurrency is None else min(workers, cell.concurrency)


def client_processes(cell: Cell) -> int:
    """How many client processes send the cell's measured requests (shaped loads run in one)."""
    return 1 if shaped(cell.point) is not None else _asked_workers(cell)


@dataclass(frozen=True, slots=True)
class Window:
    """Where a measured window's results go, and what stops it: each record (``emit``), each
    client reading (``health``), its start with the requests it plans (``started``), messages
    for the user, the event that ends it early, and (``preparing(made, total)``) the requests
    worker processes make before it."""

    emit: Callable[[RequestRecord], None]
    health: Callable[[ClientReading], None]
    started: Callable[[int | None], None]
    message: Callable[[str], None]
    stop: asyncio.Event
    preparing: Callable[[int, int], None] = lambda made, total: None


def _arrivals(cell: Cell, pool: RequestPool, seed: int) -> tuple[int | None, Arrivals]:
    """The window's request count (None: a duration) and its arrival schedule."""
    ld = cell.point.load
    count = None if ld.duration_s else len(pool)
    return count, Arrivals(cell.rate, ld.arrival, ld.burstiness, seed, ld.pacing, count)


@asynccontextmanager
async def ahead_of_window(
    client: StreamingClient, cell: Cell, pool: RequestPool, seed: int, window: Window,
) -> AsyncIterator[WorkerGroup | None]:
    """What comes before a cell's window, outside it: its request bodies made (a stop is heard
    between slices), here or by its worker processes, which make their own shares at once and
    connect; gives the workers, ready (None: one process), and ends them after the window."""
    if client_processes(cell) == 1:
        await make_ahead(pool, window.stop, window.preparing)
        yield None
        return
    ld = cell.point.load
    count, arrivals = _arrivals(cell, pool, seed)
    jobs = worker_jobs(client_processes(cell), client.config, pool, count, cell.concurrency, arrivals, ld.duration_s)
    group = WorkerGroup(jobs, window.emit, window.health, window.message, window.stop)
    try:
        await group.start(window.preparing)
        yield group
    finally:
        await group.close()


async def measure_window(
    client: StreamingClient, cell: Cell, pool: RequestPool, seed: int, window: Window,
    workers: WorkerGroup | None = None,
) -> None:
    """A cell's measured requests: from this process, from its worker processes (``workers``,
    ready: ``ahead_of_window``), or shaped (sessions, a trace, a ramp-up, stages), with the
    client's health sampled throughout."""
    point = cell.point
    emit, stop, started, health = window.emit, window.stop, window.started, window.health
    w, ld = point.workload, point.load
    count, arrivals = _arrivals(cell, pool, seed)
    if (shape := shaped(point)) is not None:
        if _asked_workers(cell) > 1:
            window.message(f"{shape} run in one client process (load.workers {ld.workers} is for plain schedules)")
        await _shaped_window(client, cell, pool, seed, window)
        return
    if workers is not None:
        started(count)
        with quiet_gc():
            await workers.run()
        return
    # the connections the window needs, opened (or topped up) right before it, so TTFT holds
    # no connection setup and no idle keep-alive has expired in between
    await client.open_connections(min(cell.in_flight_max, w.num_prompts))
    started(count)
    plan = LoadPlan(pool, arrivals.offsets(), count, cell.concurrency, ld.duration_s)
    monitor = ClientMonitor(client.stats, health)
    with quiet_gc():
        monitor.start()
        try:
            await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=emit, stop=stop)
        finally:
            monitor.stop()


async def make_ahead(pool: RequestPool, stop: asyncio.Event, progress: Callable[[int, int], None]) -> None:
    """Serialise the pool's requests before the window, a slice at a time: a stop (Ctrl-C, a
    signal) is heard within one slice, and ``progress(made, total)`` follows a large pool."""
    left = pool.make(MAKE_SLICE)
    while left:
        progress(pool.ahead - left, pool.ahead)
        await asyncio.sleep(0)
        if stop.is_set():
            return
        left = pool.make(MAKE_SLICE)


@contextmanager
def quiet_gc() -> Iterator[None]:
    """During a measured window: everything allocated before it is frozen out of the
    collector's scans, and young collections run 100 times less often (a full collection
    over a large heap stalls the loop for milliseconds, which lands in TTFT and ITL)."""
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(70_000, before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


async def _shaped_window(client: StreamingClient, cell: Cell, pool: RequestPool, seed: int, window: Window) -> None:
    """Sessions, a trace, a ramp-up or stages, in this process."""
    w, ld = cell.point.workload, cell.point.load
    emit, stop = window.emit, window.stop
    arrivals = Arrivals(cell.rate, ld.arrival, ld.burstiness, seed)
    sender: Any = client
    plans: list[tuple[LoadPlan, int | None]] = []
    if w.multi_turn is not None:
        turns = turns_of(pool.maker)
        sender = SessionRunner(client, turns)
        count = None if ld.duration_s else len(pool)
        sessions = SessionPool(cell.index, len(pool))
        plans.append((LoadPlan(sessions, arrivals.offsets(), count, cell.concurrency, ld.duration_s), None))
        total = None if count is None else turns.planned(count)
    elif pool.maker.trace:
        rows = pool.maker.trace
        # a trace is replayed open loop unless the scenario caps concurrency itself
        conc = cell.concurrency if "concurrency" in ld.model_fields_set else None
        plans.append((LoadPlan(pool, [r.offset_s for r in rows], len(rows), conc, ld.duration_s), None))
        total = len(rows)
    elif ld.ramp_up is not None:
        r = ld.ramp_up
        if ld.pacing == "vllm-bench":
            ramp = vllm_offsets(len(pool), r.end_rate, arrivals, (r.strategy, r.start_rate, r.end_rate))
        else:
            ramp = ramp_offsets(len(pool), r.strategy, r.start_rate, r.end_rate, arrivals)
        plans.append((LoadPlan(pool, ramp, len(pool), cell.concurrency, ld.duration_s), None))
        total = len(pool)
    else:
        for k, step in enumerate(ld.stages):
            offsets = arrivals.at(step.rate, seed + k).offsets()
            plans.append((LoadPlan(pool, offsets, None, step.concurrency, step.duration_s), k))
        total = None
    await client.open_connections(min(cell.concurrency or len(pool), len(pool)))
    window.started(total)
    monitor = ClientMonitor(client.stats, window.health)
    with quiet_gc():
        monitor.start()
        try:
            base = 0
            for plan, index in plans:
                if stop.is_set():
                    break
                if index is None:
                    await run_load(sender, plan, start_ns=time.perf_counter_ns(), emit=emit, stop=stop)
                    continue
                tag = _tagger(emit, base, index)
                staged = LoadPlan(_Shifted(pool, base), plan.offsets, None, plan.concurrency, plan.duration_s)
                base += await run_load(sender, staged, start_ns=time.perf_counter_ns(), emit=tag, stop=stop)
        finally:
            monitor.stop()


def _tagger(emit: Callable[[RequestRecord], None], base: int, stage: int) -> Callable[[RequestRecord], None]:
    def tag(r: RequestRecord) -> None:
        emit(replace(r, request_id=r.request_id + base, stage=stage))

    return tag


class _Shifted:
    """Requests ``base``, ``base + 1``, ... of a pool, as 0, 1, ... (the next stage's)."""

    def __init__(self, pool: RequestPool, base: int) -> None:
        self.pool, self.base = pool, base

    def __getitem__(self, i: int) -> PreparedRequest:
        return self.pool[self.base + i]

    def __len__(self) -> int:
        return max(len(self.pool) - self.base, 0)
