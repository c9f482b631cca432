"""``load.workers``: a measured window shared by N client processes on one host.

Each worker has its share of the concurrency (``schedule.concurrency_shares``) and of the
requests, dealt in proportion to its streams (``workload.share``: with equal shares, worker k
sends requests k, k+N, k+2N, ...); each worker is a fresh process with
its own event loop and its own connections, opened before the window. Each makes its own share
of the request bodies first, in parallel with the others (the parent makes none, and says how
many are made). The parent waits until every worker is connected, then gives them one start
time on the shared monotonic clock (``perf_counter_ns`` is system-wide on Linux), so every
request keeps its place on the one schedule and every record is on the run's clock base.
Workers send each record to the parent as it completes (the parent writes ``records.jsonl``, so
nothing measured is lost if a worker dies), their self-check samples, and a last message when
done; a worker never waits for the parent to take them (``Outbox``). A stop (Ctrl-C, SIGTERM,
the abort rule) is passed to every worker, which records its in-flight requests as cancelled.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from typing import Any

import orjson

from loadgen.errors import OutputError
from loadgen.load.client import ClientConfig, StreamingClient, new_loop
from loadgen.load.dispatch import LoadPlan, Requests, run_load
from loadgen.load.schedule import Arrivals, concurrency_shares
from loadgen.load.selfcheck import ClientMonitor
from loadgen.load.stopping import relay
from loadgen.results.readings import ClientReading
from loadgen.results.records import RequestRecord
from loadgen.workload.prompts import MAKE_SLICE, PoolShare, RequestPool
from loadgen.workload.share import Share, request_cycle

# messages on a worker's pipe: a one-byte tag, then the payload
_READY, _START, _STOP, _RECORD, _HEALTH, _END, _MADE = b"C", b"S", b"X", b"R", b"H", b"E", b"M"
START_MARGIN_S = 0.05  # the start time given to the workers, this far ahead of "all ready"
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the parent's to hear, never a worker's


def resolve_workers(workers: int | str) -> int:
    """``auto``: one worker per core this process may run on."""
    if workers == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    return int(workers)


@dataclass(frozen=True, slots=True)
class WorkerJob:
    worker: int
    workers: int
    share: Share  # the run's requests it sends
    client: ClientConfig
    pool: Requests
    count: int | None
    concurrency: int | None
    arrivals: Arrivals
    duration_s: float | None


def watch_pipe(loop: asyncio.AbstractEventLoop, conn: Connection, callback: Callable[..., None], *args: Any) -> None:
    """Call ``callback`` when the pipe has a message, the pipe left blocking: uvloop's watch makes
    it non-blocking, and then a record sent while the pipe is full (the other side busy) fails
    with "Resource temporarily unavailable", and a message read while only part of it has come
    fails the same way. Blocking, a sender waits for room, and a reader for the rest."""
    loop.add_reader(conn.fileno(), callback, *args)
    os.set_blocking(conn.fileno(), True)


# a message's length ahead of it on the pipe, as ``Connection.recv_bytes`` reads it (a message
# of 2 GiB or more is framed otherwise there: none is sent here)
_FRAME = struct.Struct("!i")
OUTBOX_RETRY_S = 0.001  # while the parent has no room for what is waiting, tried again this often


class Outbox:
    """A worker's messages to the parent, in order, never waited for by the event loop.

    The pipe stays blocking (its reads must wait for a whole message, ``watch_pipe``), so a
    plain ``send_bytes`` waited whenever the parent was a moment behind: with its 200 KB or so
    full (some 40 records of 256 tokens) every stream of the worker went unread until the parent caught up, which
    the reads' client delay showed (3 s when the parent was held for 3 s). Here each message is
    framed as ``recv_bytes`` expects and sent with ``MSG_DONTWAIT``, as much as the pipe takes;
    the rest waits in memory and is tried again every millisecond and with each new message.
    ``close`` sends what is left, waiting for room (the worker's work is done by then)."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        # the same socket under a second descriptor: its sends pass MSG_DONTWAIT, its reads
        # (through ``conn``) still block
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._loop = loop
        self._out = bytearray()
        self._retry: asyncio.TimerHandle | None = None
        self.gone = False  # the parent closed its end: what is sent is dropped

    def send(self, msg: bytes) -> None:
        self._out += _FRAME.pack(len(msg))
        self._out += msg
        self._flush()

    def _flush(self) -> None:
        self._retry = None
        out = self._out
        while out and not self.gone:
            try:
                sent = self._sock.send(out, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.gone = True
            else:
                del out[:sent]
        if self.gone:
            out.clear()
        elif out and self._retry is None:
            self._retry = self._loop.call_later(OUTBOX_RETRY_S, self._flush)

    @property
    def waiting(self) -> int:
        """Bytes not yet taken by the pipe."""
        return len(self._out)

    def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._out and not self.gone:
            try:
                self._sock.sendall(self._out)  # (the descriptor blocks: this waits for room)
            except OSError:
                self.gone = True
        self._out.clear()
        self._sock.close()


def worker_main(job: WorkerJob, conn: Connection) -> None:
    """A worker process: make its share of the requests, connect, wait for the start time, run
    its share, report."""
    # a stop is the parent's to hear: Ctrl-C, a closed terminal or `timeout` signal the whole
    # process group, and a worker that died of it would lose its in-flight requests; the parent
    # tells each worker to stop, and a worker whose parent is gone stops when its pipe closes
    for sig in STOPS:
        signal.signal(sig, signal.SIG_IGN)
    # (they were blocked from its start, by the parent: one that came while this process was
    # still importing was held, and is now dropped)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(_worker(job, conn))


async def _worker(job: WorkerJob, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    started: asyncio.Future[int] = loop.create_future()

    def control() -> None:
        try:
            while conn.poll():
                msg = conn.recv_bytes()
                if msg[:1] == _START and not started.done():
                    started.set_result(int(msg[1:]))
                elif msg[:1] == _STOP:
                    stop.set()
                    if not started.done():  # stopped before the window: nothing to send
                        started.set_result(0)
        except (EOFError, OSError):  # the parent is gone: stop
            stop.set()
            if not started.done():
                started.set_result(0)

    watch_pipe(loop, conn, control)
    outbox = Outbox(conn, loop)
    try:
        await _run_share(job, outbox, stop, started)
        outbox.send(_END)  # (not after a failure: the parent says the worker ended unexpectedly)
    finally:
        loop.remove_reader(conn.fileno())
        outbox.close()  # what is waiting (records measured) is sent either way


async def _run_share(job: WorkerJob, outbox: Outbox, stop: asyncio.Event, started: asyncio.Future[int]) -> None:
    if isinstance(job.pool, PoolShare):
        await _make_share(job.pool, outbox, stop)
    client = StreamingClient(job.client, worker=job.worker)
    async with client:
        if not stop.is_set():
            await client.open_connections(job.concurrency or 0)
        outbox.send(_READY)
        start_ns = await started
        def health(v: ClientReading) -> None:
            outbox.send(_HEALTH + orjson.dumps(v.to_dict()))

        monitor = ClientMonitor(client.stats, health, job.worker)
        if start_ns and not stop.is_set():
            plan = LoadPlan(job.pool, job.arrivals.offsets(), job.count, job.concurrency, job.duration_s)
            monitor.start()
            try:
                await run_load(client, plan, start_ns=start_ns, stop=stop, indices=job.share.indices(job.count),
                               emit=lambda r: outbox.send(_RECORD + r.to_json()))
            finally:
                monitor.stop()


async def _make_share(share: PoolShare, outbox: Outbox, stop: asyncio.Event) -> None:
    """This worker's requests, made before it connects, a slice at a time (a stop is heard
    between slices); the parent is told how many are made after each."""
    left = share.make(MAKE_SLICE)
    while True:
        outbox.send(_MADE + str(len(share.ready)).encode())
        if not left:
            return
        await asyncio.sleep(0)
        if stop.is_set():
            return
        left = share.make(MAKE_SLICE)


class WorkerGroup:
    """The worker processes of one window. ``start`` spawns them; each makes its share of the
    requests and connects, and ``start`` returns once all are ready (or a stop came first):
    nothing of this is in the window. ``run`` gives them one start time and collects their
    records until all are done; ``close`` ends them (told to stop where they still run)."""

    def __init__(
        self, jobs: list[WorkerJob], emit: Callable[[RequestRecord], None], health: Callable[[ClientReading], None],
        message: Callable[[str], None], stop: asyncio.Event,
    ) -> None:
        self.jobs, self.emit, self.health, self.message = jobs, emit, health, message
        self.loop = asyncio.get_running_loop()
        self.procs: list[Any] = []
        self.pipes: list[Connection] = []
        self.ready = 0
        self.all_ready: asyncio.Future[None] = self.loop.create_future()
        self.finished: list[asyncio.Future[None]] = [self.loop.create_future() for _ in jobs]
        self.failures: list[OutputError] = []
        self.ending = asyncio.Event()  # the run's stop, or a record that could not be written
        self._relaying = asyncio.ensure_future(relay(stop, self.ending))
        self.made = [0] * len(jobs)
        self.to_make = sum(job.pool.total for job in jobs if isinstance(job.pool, PoolShare))
        self.preparing: Callable[[int, int], None] | None = None

    def _readable(self, k: int, conn: Connection) -> None:
        try:
            while conn.poll():
                msg = conn.recv_bytes()
                tag = msg[:1]
                if tag == _RECORD:
                    try:
                        self.emit(RequestRecord.from_dict(orjson.loads(msg[1:])))
                    except OutputError as exc:  # not written: the workers stop, the run says why
                        self.failures.append(exc)
                        self.ending.set()
                elif tag == _HEALTH:
                    self.health(ClientReading.from_dict(orjson.loads(msg[1:])))
                elif tag == _MADE:
                    self.made[k] = int(msg[1:])
                    if self.preparing is not None:
                        self.preparing(sum(self.made), self.to_make)
                elif tag == _READY:
                    self.ready += 1
                    if self.ready == len(self.jobs) and not self.all_ready.done():
                        self.all_ready.set_result(None)
                elif tag == _END:
                    self.loop.remove_reader(conn.fileno())
                    self.finished[k].set_result(None)
                    return
        except (EOFError, OSError):
            self.loop.remove_reader(conn.fileno())
            code = self.procs[k].exitcode
            self.message(f"warning: client worker {k} ended unexpectedly (exit {code}); "
                         "the records it sent are kept, its in-flight requests are lost")
            if not self.finished[k].done():
                self.finished[k].set_result(None)
            if not self.all_ready.done():
                self.all_ready.set_result(None)

    def _tell(self, tag: bytes) -> None:
        for k, p in enumerate(self.pipes):
            if not self.finished[k].done():
                try:
                    p.send_bytes(tag)
                except OSError:
                    pass

    async def start(self, preparing: Callable[[int, int], None] | None = None) -> bool:
        """Spawn the workers and wait until all are ready; False when a stop came first.
        ``preparing(made, total)`` follows the requests they make (all of them together)."""
        ctx = mp.get_context("spawn")  # a fresh interpreter: no event loop or threads inherited
        self.preparing = preparing
        for job in self.jobs:
            parent, child = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=worker_main, args=(job, child), name=f"loadgen-worker-{job.worker}",
                               daemon=True)
            # the new process starts with the stop signals blocked, so that one that comes while it
            # imports (a Ctrl-C to the whole group) is held for it to drop, not a traceback; the
            # parent's own are held for the instant and then delivered. (Python's resource tracker,
            # started with the first process, unblocks SIGINT and SIGTERM once it is started: it
            # is started first.)
            resource_tracker.ensure_running()
            held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
            try:
                proc.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            child.close()
            self.procs.append(proc)
            self.pipes.append(parent)
            watch_pipe(self.loop, parent, self._readable, job.worker, parent)
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self.ending.wait())
        try:
            await asyncio.wait([self.all_ready, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        return not self.ending.is_set()

    async def run(self) -> None:
        """One start time for every worker, then their records until all are done (or a stop)."""
        self._tell(_START + str(time.perf_counter_ns() + int(START_MARGIN_S * 1e9)).encode())
        stopped: asyncio.Future[Any] = asyncio.ensure_future(self.ending.wait())
        done_all: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(*self.finished))
        await asyncio.wait([done_all, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not done_all.done():
            self._tell(_STOP)  # the workers record their in-flight requests as cancelled and end
            await done_all

    async def close(self) -> None:
        """Every worker ended (those not started yet are told to stop and waited for), their
        processes joined; a record that could not be written is raised here."""
        self._relaying.cancel()
        try:
            if not all(f.done() for f in self.finished):
                self._tell(_STOP)
                await asyncio.gather(*self.finished)
        finally:
            for p in self.pipes:
                try:
                    self.loop.remove_reader(p.fileno())
                except (OSError, ValueError):
                    pass
            for proc in self.procs:
                await asyncio.to_thread(proc.join, 10)
                if proc.is_alive():
                    proc.kill()
            for p in self.pipes:
                p.close()
        if self.failures:
            raise self.failures[0]


def worker_jobs(
    workers: int, client: ClientConfig, pool: Requests, count: int | None, concurrency: int | None,
    arrivals: Arrivals, duration_s: float | None,
) -> list[WorkerJob]:
    """One job per worker, with its share of the concurrency and of the requests."""
    shares = concurrency_shares(workers, concurrency)
    cycle = request_cycle(shares)
    jobs = []
    for k, conc in enumerate(shares):
        share = Share.of(k, cycle)
        jobs.append(WorkerJob(k, workers, share, client, PoolShare(pool, share) if isinstance(pool, RequestPool)
                              else pool, count, conc, arrivals, duration_s))
    return jobs
