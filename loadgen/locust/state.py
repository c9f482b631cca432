"""This Locust process's share of a run: the plan, the request pool, live statistics and
where records go (the master's run directory, or the master for a worker).

Clock: every process reads ``perf_counter_ns`` against its own base, taken together with the
wall clock at import. Records carry times on their process's clock; the master moves a
worker's records onto its own clock by the difference of the two wall-clock bases (exact on
one host; across hosts as good as their clock synchronisation).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from dataclasses import dataclass, field, replace

import gevent
from gevent.lock import Semaphore
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from loadgen.data import Unchecked
from loadgen.locust.plan import CellClock, LocustPlan, RunDirSink, arrivals_in_words, plan_for, rebase
from loadgen.locust.stats import LiveStats, Row
from loadgen.locust.transport import Workbench, build_workbench
from loadgen.results.cellstatus import AppliedUsers, LostWorker
from loadgen.results.readings import ClientReading
from loadgen.results.records import RequestRecord
from loadgen.scenario.loader import load_scenario

log = logging.getLogger("loadgen")



def _paired_clocks(tries: int = 16) -> tuple[int, int]:
    """The monotonic clock and the wall clock read at one instant: the read of the wall clock
    closest bracketed by two of the monotonic one (a process descheduled between two reads
    would put the pause into every record a worker sends its master)."""
    best: tuple[int, int, int] | None = None
    for _ in range(tries):
        before = time.perf_counter_ns()
        epoch = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) // 2, epoch)
    assert best is not None
    return best[1], best[2]


# this process's clock base, on both clocks: a worker's records move onto its master's clock by
# the difference of their wall-clock bases
BASE_NS, BASE_EPOCH_NS = _paired_clocks()


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What a worker adds to Locust's report to the master (under ``"loadgen"``): its records
    since the last report, as JSON lines, its clock base and the model it found."""

    records: list[bytes]
    base_epoch_ns: int
    model: str | None
    # its self-check's readings since the last report: {"at": its clock's seconds, "reading": ...}
    samples: list[Unchecked] = field(default_factory=list)
    # sent with its users stopped: every record of its test is in this report or an earlier one
    final: bool = False
    sent: int = 0  # the requests its users have sent in the run so far

    def to_dict(self) -> dict[str, object]:
        return {"records": self.records, "base_epoch_ns": self.base_epoch_ns, "model": self.model,
                "samples": self.samples, "final": self.final, "sent": self.sent}

    @classmethod
    def from_dict(cls, data: Unchecked) -> WorkerReport:
        return cls(list(data["records"]), int(data["base_epoch_ns"]), data.get("model"),
                   list(data.get("samples") or []), bool(data.get("final")), int(data.get("sent") or 0))


# the master sees a worker's records this late (Locust's worker report interval)
REPORT_LAG_S = 3.0


def now_s() -> float:
    return (time.perf_counter_ns() - BASE_NS) / 1e9


DONE_MESSAGE = "loadgen-done"  # a worker to its master: its share of the dataset is sent and answered


class _State:
    """This process's share of the run: the plan, the workbench, and where records go."""

    def __init__(self) -> None:
        self.env: Environment | None = None
        self.source: str | None = None
        self.overrides: list[str] = []
        self.plan: LocustPlan | None = None
        self.bench: Workbench | None = None
        self._bench_lock = Semaphore()
        self.request_ids = itertools.count()
        self.pending: list[bytes] = []  # a worker's records not yet sent to the master
        self.pending_samples: list[Unchecked] = []  # ... and its self-check's readings
        self.live = LiveStats()
        self.cells = CellClock()
        self.sink: RunDirSink | None = None
        self.peak_users = 0  # of the test running, or of the last one
        # this process's share of a dataset: (index, count) of the processes sending it
        self.share = (0, 1)
        # the run's seed: the scenario's, else drawn once by the master (or the one process) and
        # given to every worker, so that a trace's shared blocks are the same text everywhere
        self.seed = secrets.randbits(63)
        self.exhausted_said = False
        # an open loop's arrivals sent late for want of a free user, this test, and whether said
        self.late, self.late_said = 0, False
        # the master: the workers given a share of this test, and those whose share is all sent
        self.workers_in_test = 0
        self.workers_done: set[int] = set()
        self.in_flight = 0  # requests this process's users are sending now, and sessions under way
        self.test_start_ns = time.perf_counter_ns()  # this process's start of the test running (a trace's zero)
        # a capacity search under the shape: each probe's value (users), by cell, and the records
        # of the probe measuring now (the master's, merged from its workers)
        self.probes: list[float] = []
        # the run so far, over every test: the LLM tab shows it under the test's figures
        self.run_totals: dict[str, int] = {"tests": 0, "requests": 0, "output_tokens": 0}
        self.probe_records: list[RequestRecord] = []
        # the master quitting: the workers whose final report (their users stopped) it waits for
        self.awaiting_final: set[str] | None = None
        # the master: each worker's last report (when, its users), those found missing, by cell
        self.last_report: dict[int, tuple[float, int]] = {}
        self.workers_lost: dict[int, list[LostWorker]] = {}
        self.sent = 0  # requests this process's users sent (a worker tells its master with each report)
        # the master: by worker, the requests it said it sent and those whose records came in
        self.by_worker: dict[int, list[int]] = {}
        self.test_at = 0.0  # the test's start on the run's clock
        self.model: str | None = None
        self.closed = False
        self.failed = False
        # set when Locust starts stopping the test: a user between two requests sends no more
        # (Locust kills waiting users, and its kill can land after the next request was sent)
        self.stopping = False

    # -- set-up ---------------------------------------------------------------------------------
    def load(self, source: str, overrides: list[str]) -> None:
        scenario = load_scenario(source, overrides)
        self.plan = plan_for(scenario, source)
        if scenario.seed is not None:
            self.seed = scenario.seed
        self.source, self.overrides = source, overrides
        self.bench = None

    def workbench(self, host: str) -> Workbench:
        """The request pool for ``host`` (model resolved, text calibrated), built by the first user."""
        with self._bench_lock:
            if self.bench is None or self.bench.host != host:
                assert self.plan is not None
                runner = self.env.runner if self.env is not None else None
                process = (int(getattr(runner, "worker_index", -1)) + 1) % 1024  # 0: the master or one process
                self.bench = build_workbench(self.plan, host, self.seed, process)
                self.bench.share(*self.share)
                self.model = self.bench.model
            return self.bench

    def new_share(self, index: int, count: int, seed: int | None = None, start_epoch_ns: int | None = None) -> None:
        """A test starts: this process sends entries index, index + count, ... of a dataset,
        and as many of an open loop's arrivals (``seed``: the master's, for a worker; and
        ``start_epoch_ns``, the master's start of the test on the wall clock, the zero of the
        schedule every worker shares)."""
        self.share = (index, count)
        if seed is not None and seed != self.seed:
            self.seed = seed
            self.bench = None  # made again with the run's seed
        # on this process's clock, as its records move onto the master's (by the wall-clock bases)
        now_ns = time.perf_counter_ns()
        self.test_start_ns = now_ns if start_epoch_ns is None else BASE_NS + start_epoch_ns - BASE_EPOCH_NS
        self.exhausted_said = False
        self.late, self.late_said = 0, False
        if self.bench is not None:
            self.bench.share(index, count)

    def exhausted(self) -> None:
        """Every entry of this process's share of the dataset is sent: its users stop; one
        process alone ends the test, a worker tells its master once its last answer is in (the
        master ends the test when every worker has)."""
        if self.exhausted_said:
            return
        self.exhausted_said = True
        bench = self.bench
        sessions = bench is not None and bench.turns is not None
        what, count = _what_is_done(bench)
        log.info("loadgen: every %s (%s) sent once in this test: the users stop", what, count)
        runner = self.env.runner if self.env is not None else None
        if runner is not None and not isinstance(runner, (WorkerRunner, MasterRunner)):
            headless = bool(getattr(self.env.parsed_options, "headless", False)) if self.env is not None else False

            def finish() -> None:
                while self.in_flight > 0:  # the other users' last entries (and sessions' turns) are measured
                    gevent.sleep(0.02)
                (runner.quit if headless else runner.stop)()

            gevent.spawn(finish)
        elif isinstance(runner, WorkerRunner):
            entries = count if isinstance(count, int) else None
            index = self.share[0]

            def tell_master() -> None:
                while self.in_flight > 0:  # its last entries measured first
                    gevent.sleep(0.02)
                # its records with a report of their own first (the master gets its messages in
                # order): the master quits once the last worker is done, and waits only 0.5 s for
                # the workers' final reports, which a slow machine missed (a test with every
                # record lost)
                runner._send_stats()
                runner.send_message(DONE_MESSAGE, {"index": index, "entries": entries, "sessions": sessions,
                                                   "what": what})

            gevent.spawn(tell_master)

    def worker_done(self, index: int, entries: int | None, sessions: bool, what: str | None = None) -> None:
        """The master: a worker's share of the dataset is all sent and answered; once every
        worker's is, the test ends (headless: Locust quits; the web UI: the test stops)."""
        self.workers_done.add(index)
        runner = self.env.runner if self.env is not None else None
        if runner is None or len(self.workers_done) < self.workers_in_test or self.exhausted_said:
            return
        self.exhausted_said = True
        what = what or ("session of the session file" if sessions else "entry of the dataset")
        log.info("loadgen: every %s (%s) sent once in this test by its %d workers: the test ends", what,
                 entries if entries is not None else "?", self.workers_in_test)
        headless = bool(getattr(self.env.parsed_options, "headless", False)) if self.env is not None else False
        gevent.spawn(runner.quit if headless else runner.stop)

    def arrived_late(self, late_s: float) -> None:
        """An open loop's arrival went out ``late_s`` after its time: every user was busy. Said
        once a test, with the remedy; each record keeps its own time due and time sent."""
        self.late += 1
        if not self.late_said:
            self.late_said = True
            users = self.env.runner.user_count if self.env is not None and self.env.runner is not None else 0
            log.warning("loadgen: a request went out %.0f ms after its time: all %d users of this process were "
                        "busy, so the rate outruns them; raise -u (each user has one request in flight)",
                        late_s * 1e3, users)

    def give_up(self, message: str) -> None:
        """Nothing can be sent (no server, no model): say it once and end the test."""
        if self.failed:
            return
        self.failed = True
        log.error("error: %s", message)
        env = self.env
        if env is not None and env.runner is not None:
            env.process_exit_code = 2
            gevent.spawn(env.runner.quit)

    # -- records --------------------------------------------------------------------------------
    def take(self, record: RequestRecord) -> None:
        """A record of this process's users: kept for the master (worker) or counted here."""
        env = self.env
        self.sent += record.sent_at is not None
        if env is not None and isinstance(env.runner, WorkerRunner):
            self.pending.append(record.to_json())
            return
        self.count(replace(record, cell=self.cells.cell_of(record.sent_at)))

    def health(self, reading: ClientReading) -> None:
        """A second of this process's self-check: kept for the master (worker), or written
        into the run directory under the cell running."""
        env = self.env
        if env is not None and isinstance(env.runner, WorkerRunner):
            self.pending_samples.append({"at": now_s(), "reading": reading.to_dict()})
        elif self.sink is not None and not self.closed:
            self.sink.out.samples.write(self.cells.cell_of(now_s()), reading)

    def users_running(self) -> bool:
        runner = self.env.runner if self.env is not None else None
        return runner is not None and runner.user_count > 0 and runner.state in ("spawning", "running")

    def test_started(self) -> None:
        """A test starts (the web UI's form, the API, headless, a new step of the shape): a cell
        of its own, and the LLM tab's figures from zero, as Locust's own."""
        users = self.env.runner.user_count if self.env is not None and self.env.runner is not None else 0
        self.test_at = now_s()
        self.cells.open(self.test_at, users, new_test=True)
        self.run_totals["tests"] += 1
        self.live.reset()
        self.peak_users = users

    def step_started(self) -> None:
        """A later step of the shape: a cell of its own, in the same test."""
        users = self.env.runner.user_count if self.env is not None and self.env.runner is not None else 0
        self.cells.open(now_s(), users, new_test=False)

    def probe_started(self, value: float) -> None:
        """A search's probe of ``value`` users: a cell of its own (the test's first cell for the
        first probe), its records kept for its verdict."""
        if self.probes:
            self.step_started()
        self.probes.append(value)
        self.probe_records = []

    def see_users(self) -> None:
        """The users running now, for the open cell's record of its load."""
        runner = self.env.runner if self.env is not None else None
        if runner is not None:
            self.cells.see(now_s(), runner.user_count)
            self.peak_users = max(self.peak_users, runner.user_count)

    def applied(self) -> list[AppliedUsers]:
        """Each cell's users as they ran, so far."""
        now = now_s()
        return [seen.applied(now) for seen in self.cells.users]

    def count(self, record: RequestRecord) -> None:
        if self.closed:
            return  # after the run directory was written (nothing is sent by then)
        self.live.add(record)
        if record.error != "cancelled":
            self.run_totals["requests"] += 1
            self.run_totals["output_tokens"] += record.output_tokens or 0
        if self.probes and record.cell == len(self.probes) - 1:
            self.probe_records.append(record)
        if self.sink is not None:
            self.sink.add(record)
        self.see_users()

    def merge(self, worker: int, report: WorkerReport) -> None:
        """The master: a worker's report -> its records on the master's clock."""
        shift = (report.base_epoch_ns - BASE_EPOCH_NS) / 1e9
        self.model = self.model or report.model
        counts = self.by_worker.setdefault(worker, [0, 0])
        counts[0] = max(counts[0], report.sent)
        for line in report.records:
            record = rebase(line, shift, next(self.request_ids), worker)
            counts[1] += record.sent_at is not None
            self.count(replace(record, cell=self.cells.cell_of(record.sent_at)))
        if self.sink is not None and not self.closed:
            for sample in report.samples:
                reading = replace(ClientReading.from_dict(sample["reading"]), worker=worker)
                self.sink.out.samples.write(self.cells.cell_of(float(sample["at"]) + shift), reading)

    def look_for_lost_workers(self, runner: MasterRunner) -> None:
        """The master: a worker Locust marked missing (no heartbeat for its 3 s: the process
        killed, its machine gone) is said once, in the log and as its cell's warning: the
        records it had not reported are lost with it."""
        said = {w.node for lost in self.workers_lost.values() for w in lost}
        for client in list(runner.clients.all):
            if client.state != "missing" or client.id in said:
                continue
            at = now_s()
            index = runner.get_worker_index(client.id) + 1
            last = self.last_report.get(index)
            lost = LostWorker(index, str(client.id), round(at - self.test_at, 3), last[1] if last else 0,
                              round(at - last[0], 3) if last else None)
            self.workers_lost.setdefault(self.cells.cell_of(at), []).append(lost)
            log.warning("loadgen: %s", lost.warning())

    def requests_by_worker(self) -> list[dict[str, int]]:
        """The master: each worker's requests sent, by its own count, and those on record; said
        in the log where they differ."""
        out = []
        for worker, (sent, recorded) in sorted(self.by_worker.items()):
            out.append({"worker": worker, "sent": sent, "recorded": recorded})
            if sent > recorded:
                log.warning("loadgen: worker %d sent %d requests, of which %d have no record in the run directory",
                            worker, sent, sent - recorded)
        return out

    def rows(self, users: int | None = None) -> list[Row]:
        """The LLM table of the test running (or the last one); per user of the users running
        now, or after a stop (``users`` given, or none running) of the test's peak over the
        whole test."""
        running, lag = self._view()
        stopped = users is not None or not running
        return self.live.rows(now_s(), (running or self.peak_users) if users is None else users, lag, stopped=stopped)

    def sample(self) -> Row:
        """A point of the LLM tab's charts, now."""
        running, lag = self._view()
        return self.live.sample(now_s(), running, lag)

    def _view(self) -> tuple[int, float]:
        """The users running now, and how late this process sees records (a master: a
        worker's report interval)."""
        runner = self.env.runner if self.env is not None else None
        lag = REPORT_LAG_S if isinstance(runner, MasterRunner) else 0.0
        return (runner.user_count if runner is not None else 0), lag

    def describe(self, host: str | None) -> dict[str, object]:
        """What the start page shows under its form: the scenario's API, model and lengths."""
        if self.plan is None:
            return {}
        sc = self.plan.scenario
        w = sc.workload
        return {
            "scenario": self.source, "name": sc.name, "api": sc.target.api, "host": host,
            "model": self.model or (sc.target.model if sc.target.model != "auto" else "auto (the server's first)"),
            "input_tokens": self.plan.input_tokens, "output_tokens": self.plan.output_tokens,
            "prompts": w.source if w.source != "generated" else f"generated {w.prompt}",
            # the concurrency steps run only under the shape (loadgen locust --shape)
            "steps": list(self.plan.steps) if self.env is not None and self.env.shape_class is not None else [],
            "step_s": self.plan.step_s,
            "arrivals": arrivals_in_words(self.plan),
        }


STATE = _State()


def _what_is_done(bench: Workbench | None) -> tuple[str, int | str]:
    """What a process has sent all of, and how many: sessions, a dataset's entries, or an open
    loop's scheduled requests."""
    if bench is None:
        return "entry of the dataset", "?"
    if bench.turns is not None:
        return "session of the session file", bench.entries if bench.entries is not None else "?"
    if bench.entries is None and bench.arrivals is not None:
        return "request of the schedule", bench.arrivals
    return "entry of the dataset", bench.entries if bench.entries is not None else "?"

