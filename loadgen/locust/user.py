"""loadgen's Locust user: streams the scenario's completions or chat requests and reports each
request to Locust once (E2E), with TTFT and TPOT rows beside it; merges LLM metrics and
records on the master.

Imported only inside a Locust process (Locust patches the standard library with gevent at
import; ``loadgen locust`` starts that process). It shares loadgen's pure parts -- scenario
loading, prompts and payloads, the SSE parser and stream accounting, records and metrics --
and never imports the asyncio client. Importing it registers loadgen's Locust event
listeners (``loadgen.locust.hooks``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import gevent
from geventhttpclient.response import HTTPConnectionClosed, HTTPParseError
from geventhttpclient.url import URL
from locust import LoadTestShape, User, constant, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner

from loadgen.errors import LoadgenError
from loadgen.load.stream import StreamState
from loadgen.locust import hooks
from loadgen.locust.plan import LocustPlan, locust_scenario, segments
from loadgen.locust.state import BASE_EPOCH_NS, BASE_NS, REPORT_LAG_S, STATE, log, now_s
from loadgen.locust.stats import LLM, failure_kind
from loadgen.locust.transport import Workbench, closed_after_answer, open_client, stream_request
from loadgen.results.capacity import first_wave, next_value, probe_entry
from loadgen.results.records import RequestRecord
from loadgen.scenario.matrix import search_lines
from loadgen.scenario.shapes import Search
from loadgen.scenario.target import default_total_s
from loadgen.workload.payload import ENDPOINTS, PreparedRequest
from loadgen.workload.sessions import Answer, Conversation, Turns

__all__ = ["LLMUser", "ScenarioSteps", "STATE", "LLMRequestFailed", "hooks"]


class LLMRequestFailed(Exception):
    """A failed request as Locust shows it: ``<failure class>: <detail>``."""


def report(env: Environment, record: RequestRecord, elapsed_ms: float, body_bytes: int) -> None:
    """The record in Locust's statistics: one request event per request (``E2E``: its whole
    time, the body's bytes as its size), so Locust's RPS, failures and Response Times chart
    count and time requests; TTFT and TPOT as rows of their own that Locust's totals leave out.
    ITL gaps are no Locust entries (one per token would count as requests): the LLM tab shows
    their exact percentiles from the records."""
    if record.error == "cancelled":
        return  # the run stopped it; kept in records.jsonl, not a failure of the server
    start = BASE_EPOCH_NS / 1e9 + (record.sent_at or 0.0)
    # one row of Locust's failures table per kind of failure: the ids and numbers a server puts in
    # its messages (each answer's own) are left out of it; records.jsonl keeps them whole
    exc = None if record.ok else LLMRequestFailed(f"{record.error}: {failure_kind(record.error_detail or '')[:160]}")
    if record.ok:
        if (ttft := record.ttft_s) is not None:
            # a float, as Locust's own request events log it (its annotation says int)
            env.stats.get("TTFT", LLM).log(ttft * 1e3, 0)  # type: ignore[arg-type]
        if (t := record.tpot_s) is not None:
            env.stats.get("TPOT", LLM).log(t * 1e3, 0)  # type: ignore[arg-type]
    env.events.request.fire(request_type=LLM, name="E2E", response_time=elapsed_ms, response_length=body_bytes,
                            exception=exc, context={}, start_time=start)


class LLMUser(User):
    """One closed-loop stream: sends the scenario's next prompt as soon as the last one ends."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.bench: Workbench | None = None
        self.answered = False  # an open loop: this user has sent a request and been answered
        try:
            if self.host is None:
                raise LoadgenError("--host: give the server's base URL, e.g. --host http://127.0.0.1:8000/v1")
            self.bench = STATE.workbench(self.host)
        except LoadgenError as exc:
            STATE.give_up(str(exc))
            return  # the task stops this user (Locust logs a traceback for a StopUser raised here)
        self.http = open_client(URL(self.bench.host + self.bench.path), self.bench.timeouts,
                                kernel_clock=self.bench.kernel_clock)
        # open the connection before the first measured request, so TTFT holds no TCP setup
        try:
            self.http.get(URL(self.bench.host + "/models").request_uri, headers=self.bench.headers).read()
        except (OSError, HTTPConnectionClosed, HTTPParseError):
            pass  # the first request records what is wrong

    def on_stop(self) -> None:
        if self.bench is not None:
            self.http.close()

    @task
    def stream(self) -> None:
        bench = self.bench
        if bench is None:
            raise StopUser()
        if STATE.stopping:
            return
        if bench.turns is not None:
            if bench.entries is None:
                self.session(bench, bench.turns, next(bench.next_session))
                return
            s = next(bench.next_entry)  # a session file's: this process's share, each session once a test
            if s >= bench.entries:
                STATE.exhausted()
                raise StopUser()
            self.session(bench, bench.turns, s)
            return
        if bench.next_arrival is not None:
            self.arrive(bench, bench.next_arrival)
            return
        if bench.entries is None:
            self.send(bench, bench.pool[next(bench.next_prompt)])  # a new prompt every time, never a repeat
            return
        i = next(bench.next_entry)  # this process's share of the dataset, each entry once a test
        if i >= bench.entries:
            STATE.exhausted()
            raise StopUser()
        due_ns = None
        STATE.in_flight += 1  # drawn, so not done until answered: a trace's row waits for its time first
        try:
            if bench.offsets:  # a trace: the row is due at its offset after the trace's start
                due_ns = STATE.test_start_ns + int((TRACE_LEAD_S + bench.offsets[i]) * 1e9)
                wait = (due_ns - time.perf_counter_ns()) / 1e9
                if wait > 0:
                    gevent.sleep(wait)
            self.send(bench, bench.pool[i], due_ns=due_ns)
        finally:
            STATE.in_flight -= 1

    def arrive(self, bench: Workbench, arrivals: Iterator[tuple[int, float]]) -> None:
        """An open loop: this user takes the process's next arrival, waits for its time and
        sends it (a dataset's entry of that number, else a new prompt). An arrival already due
        when a user that has just been answered takes it went out late for want of a free user."""
        arrival = next(arrivals, None)
        if arrival is None or (bench.entries is not None and arrival[0] >= bench.entries):
            STATE.exhausted()
            raise StopUser()
        i, offset = arrival
        taken_ns = time.perf_counter_ns()  # a user free for it: past its due time, the wait for one
        STATE.in_flight += 1  # taken, so not done until answered
        try:
            due_ns = STATE.test_start_ns + int((TRACE_LEAD_S + offset) * 1e9)
            wait = (due_ns - time.perf_counter_ns()) / 1e9
            if wait > 0:
                gevent.sleep(wait)
            elif self.answered and -wait > LATE_S:
                STATE.arrived_late(-wait)
            if STATE.stopping:
                return
            self.send(bench, bench.pool[i] if bench.entries is not None else bench.pool[next(bench.next_prompt)],
                      due_ns=due_ns, slot_ns=taken_ns)
            self.answered = True
        finally:
            STATE.in_flight -= 1

    def session(self, bench: Workbench, turns: Turns, session: int) -> None:
        """One whole multi-turn session on this user: each turn sends the conversation so far
        with the answers the server gave, after the think time; a failed turn ends it."""
        talk = Conversation(turns, session)
        STATE.in_flight += 1  # a session between turns (its think time) is not done either
        try:
            for t in range(talk.count):
                if (pause := talk.think_s(t)) > 0:
                    gevent.sleep(pause)
                    if STATE.stopping:
                        return
                answer = Answer()
                record = self.send(bench, talk.request(t), answer=answer)
                if record is None or not record.ok or STATE.stopping:
                    return
                talk.answered(answer)
        finally:
            STATE.in_flight -= 1

    def send(self, bench: Workbench, req: PreparedRequest, answer: Answer | None = None,
             due_ns: int | None = None, slot_ns: int | None = None) -> RequestRecord | None:
        """One streamed request, reported to Locust and recorded; ``answer`` collects its text;
        ``due_ns``: when it was due (a trace's row, an open loop's arrival), its record's
        scheduled time; ``slot_ns``: when a user was free to send it (an open loop), so that
        the wait for a free user is its record's slot wait, as a concurrency slot's in
        loadgen run, and not the client's send lag."""
        request_id = next(STATE.request_ids)
        t = bench.timeouts
        total = t.total_s if t.total_s is not None else default_total_s(req.max_tokens)
        st = StreamState(t.first_token_s, total, req.max_tokens)
        st.answer = answer if answer is not None or req.structured is None else Answer()  # kept to be checked
        st.whole = bytearray() if req.embeddings else None  # an embeddings answer: one JSON body
        st.inputs = req.embeddings
        st.responses = bench.path.endswith(ENDPOINTS["responses"])
        STATE.in_flight += 1
        try:
            error, detail, body_bytes = stream_request(
                self.http, bench.path, req.body, bench.headers, bench.timeouts, st)
        except gevent.GreenletExit:
            if st.sent_ns:
                STATE.take(st.record(req, request_id, due_ns or st.sent_ns, BASE_NS, "cancelled", "run stopped",
                                     slot_ns=slot_ns))
            raise
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the request sent is on record
            error, detail, body_bytes = "malformed", f"{type(exc).__name__}: {str(exc)[:200]}", 0
            st.done_ns = st.done_ns or time.perf_counter_ns()
        finally:
            STATE.in_flight -= 1
        if (st.retries or closed_after_answer(self.http)) and bench.headers.get("Connection") != "close":
            # the server closes its connections after each answer: from now on every request
            # opens its own (and its TTFT includes the connect), as for every client of it
            bench.headers["Connection"] = "close"
            log.info("loadgen: the server closes its connections after each answer: every request "
                     "from here on opens a new connection, and its TTFT includes the connect")
        record = st.record(req, request_id, due_ns or st.sent_ns, BASE_NS, error, detail, slot_ns=slot_ns)
        end = st.done_ns or time.perf_counter_ns()
        report(self.environment, record, (end - st.sent_ns) / 1e6, body_bytes)
        STATE.take(record)
        return record


# a trace's first row (an open loop's first arrival) is due this long after the test's start:
# time for the users to look up the model and calibrate their text, so that no row is late for
# want of a ready user
TRACE_LEAD_S = 1.0
# an open loop's arrival this late when a free user takes it: the users ran out (a user woken on
# time is within a millisecond or two of it)
LATE_S = 0.010
# how often Locust asks a shape for its users (its shape worker's loop)
TICK_S = 1.0
# users per second a search's probe starts with: all of them at once
SPAWN_AT_ONCE = 1000.0


class ScenarioSteps(LoadTestShape):
    """The scenario's concurrency sweep as steps, or its capacity search (by users) as probes
    (see ``_search``). Steps: each holds that many users for
    ``--step-time`` seconds (else the scenario's ``load.duration_s``, else 60); each step
    is one cell of the run directory. Locust's ``-t`` ends it too (Locust itself counts its
    run time only after a shape has ended)."""

    def __init__(self) -> None:
        super().__init__()
        self._step = -1
        self._cells = 0  # the cells of the timeline begun so far
        self._results: list[tuple[float, bool]] = []  # a search's (users, met the SLOs) so far
        self._value: float | None = None
        self._since = 0.0
        self._draining = False
        self._drain_since: float | None = None

    def reset_time(self) -> None:
        """A test starts (a second one from the web UI too): its timeline from its first step."""
        super().reset_time()
        self._step, self._cells = -1, 0

    def tick(self) -> tuple[int, float] | None:
        plan = STATE.plan
        if plan is None:
            return None
        if plan.search is not None:
            return self._search(plan, plan.search)
        step_s = _option("step_time", None) or plan.step_s or 60.0
        run_time = self.get_run_time()
        limit = _option("run_time", None)
        if limit is not None and run_time >= limit:
            return None  # -t: Locust's own limit starts only once a shape has ended
        timeline = segments(plan, step_s)
        ends = list(itertools.accumulate(length for _, length, _ in timeline))
        k = next((i for i, end in enumerate(ends) if run_time < end), len(ends))
        if k == self._step and ends[k] - run_time < TICK_S:
            # Locust asks every second: the step's end comes first, so the change is made at it
            # (a 1.5 s cooldown lasted 1 s, and a 3 s stage 3.5, when made at the next tick)
            gevent.sleep(ends[k] - run_time)
            runner = STATE.env.runner if STATE.env is not None else None
            if runner is None or runner.state not in ("spawning", "running"):
                return timeline[k][0], float(max(timeline[k][0], 1))  # stopped meanwhile: no change
            run_time = max(self.get_run_time(), ends[k])
            k = next((i for i, end in enumerate(ends) if run_time < end), len(ends))
        if k >= len(timeline):
            return None
        users, _, cell = timeline[k]
        if k != self._step:
            self._step = k
            STATE.stopping = not cell  # a user answered before Locust stops it sends no more
            if not cell:  # a cooldown between repeats: its cell ends, no user runs
                STATE.cells.close(now_s())
                log.info("loadgen: cooldown of %g s before the next repeat", plan.cooldown_s)
            else:
                if self._cells:  # the test's start opened the first step's cell
                    STATE.step_started()
                self._cells += 1
                cells = sum(1 for *_, c in timeline if c)
                repeat = f" (repeat {(self._cells - 1) % plan.repeats + 1}/{plan.repeats})" if plan.repeats > 1 else ""
                log.info("loadgen: step %d/%d, %d users%s", self._cells, cells, users, repeat)
        # a cooldown stops every user at once (Locust stops users at the spawn rate)
        return users, float(max(users, 1)) if cell else SPAWN_AT_ONCE


    def _search(self, plan: LocustPlan, search: Search) -> tuple[int, float] | None:
        """A capacity search by users: each probe holds its users until it has num_prompts
        answers (or load.duration_s passed), is judged on them as loadgen run judges its
        probes, and the next probe's users follow from the verdicts so far."""
        run_time = self.get_run_time()
        limit = _option("run_time", None)
        if limit is not None and run_time >= limit:
            return None
        if self._draining:
            if not self._drained(run_time):
                return 0, SPAWN_AT_ONCE
            # every request of the probe is answered and in: its verdict, on all of them (the run
            # directory's answer is the one the run found), then the next probe starts all its
            # users at once, as loadgen run starts a probe's streams
            if self._value is not None:
                verdict = self._verdict(plan, search)
                self._results.append((self._value, verdict))
                log.info("loadgen: probe of %d users %s the SLOs", self._value, "meets" if verdict else "breaks")
            self._draining = False
            nxt = next_value(search, self._results)
            if nxt is None:
                return None
            self._value, self._since = nxt, run_time
            STATE.probe_started(nxt)
            log.info("loadgen: probe %d, %d users", len(self._results) + 1, nxt)
        elif self._value is None or self._probe_done(plan, run_time):
            # no new requests: those in flight are answered, and judged with the rest
            self._draining, self._drain_since = True, None
            if self._value is None:  # the first probe: nothing to drain
                self._drain_since = -REPORT_LAG_S
            return 0, SPAWN_AT_ONCE
        assert self._value is not None
        return int(self._value), SPAWN_AT_ONCE

    def _drained(self, run_time: float) -> bool:
        """The probe's users are gone and its records are in: at once in one process; a report
        interval after the workers' users are gone under a master (their last records come
        with their next report)."""
        runner = self.runner
        if runner is None or runner.user_count > 0 or STATE.in_flight > 0:
            return False
        if not isinstance(runner, MasterRunner):
            return True
        if self._drain_since is None:
            self._drain_since = run_time
        return run_time - self._drain_since >= REPORT_LAG_S + 0.5

    def _probe_done(self, plan: LocustPlan, run_time: float) -> bool:
        if plan.scenario.load.duration_s:
            return run_time - self._since >= plan.scenario.load.duration_s
        finished = sum(1 for r in STATE.probe_records if r.error != "cancelled")
        return finished >= plan.scenario.workload.num_prompts

    def _verdict(self, plan: LocustPlan, search: Search) -> bool:
        records = [r for r in STATE.probe_records if not r.warmup]
        sent = [r.sent_at for r in records if r.sent_at is not None]
        done = [r.done_at for r in records if r.done_at is not None]
        span = max(done) - min(sent) if sent and done else None
        value = self._value
        assert value is not None
        line = search_lines(locust_scenario(plan, ()))[0]
        cell = line.probe(len(STATE.probes) - 1, value)
        return probe_entry(0, search, value, records, "done", None, span, first_wave(cell)).meets_slo


def _option(name: str, default: Any) -> Any:
    opts = STATE.env.parsed_options if STATE.env is not None else None
    value = getattr(opts, name, None) if opts is not None else None
    return default if value is None else value
