"""What a scenario asks of Locust (one workload, concurrency steps for the shape), the
clock and numbering of records merged from workers, and the run directory a Locust run
writes. ``loadgen locust`` validates with these before it starts Locust; the Locust process
uses them while it runs. Nothing here needs gevent or Locust.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import orjson

from loadgen.errors import ScenarioError
from loadgen.load.schedule import Arrivals, ramp_offsets
from loadgen.report.summary import render_markdown
from loadgen.results.cellstatus import AppliedUsers, CellStatus, LostWorker, SearchProbe, ServerInfo
from loadgen.results.provenance import Provenance
from loadgen.results.records import RECORD_TIMES, RequestRecord
from loadgen.results.rundir import RunDirWriter, build_summary_from_dir
from loadgen.results.summary import Summary
from loadgen.scenario.matrix import expand_cells, points
from loadgen.scenario.overrides import apply_overrides
from loadgen.scenario.schema import Scenario
from loadgen.scenario.shapes import Search, Stage


@dataclass(frozen=True, slots=True)
class LocustPlan:
    """What a scenario asks of Locust: one workload, and concurrency steps for the shape."""

    scenario: Scenario
    input_tokens: int
    output_tokens: int
    steps: tuple[int, ...]  # users per step of the load shape (the scenario's concurrency sweep)
    step_s: float | None  # load.duration_s: how long each step lasts, when the scenario says
    # load.stages by concurrency: each step's own length (s), where the stages give them
    step_lengths: tuple[float, ...] = ()
    # an open loop (load.rate, load.ramp_up, or stages at a rate): requests go out on a schedule
    # shared by every process, the users (-u) the most in flight
    open_loop: bool = False
    # load.repeats: each step runs this many times, each a cell, after a pause of cooldown_s
    # with no user (before each repeat after the first)
    repeats: int = 1
    cooldown_s: float = 0.0

    @property
    def search(self) -> Search | None:
        """The capacity search the shape runs (by concurrency: users), or None."""
        return self.scenario.load.search


def plan_for(scenario: Scenario, source: str) -> LocustPlan:
    """Check that a scenario describes load Locust can apply; the error names the field."""
    if len(points(scenario, source)) > 1:
        raise ScenarioError(
            f"{source}: matrix -> Locust runs one server and workload; drop the matrix or pick a "
            "point with --set"
        )
    w, ld = scenario.workload, scenario.load
    for key, values in (("input_tokens", w.input_tokens), ("output_tokens", w.output_tokens)):
        if len(values) > 1:
            raise ScenarioError(
                f"{source}: workload.{key} -> Locust runs one input and one output length; pick one, "
                f"e.g. --set workload.{key}={values[0]}"
            )
    if ld.search is not None and ld.search.by != "concurrency":
        raise ScenarioError(
            f"{source}: load.search.by -> Locust users are closed-loop: search by concurrency (users), or "
            "search by rate with loadgen run"
        )
    rates = [r for r in ld.rate if r is not None]
    if len(ld.rate) > 1:
        raise ScenarioError(
            f"{source}: load.rate -> a Locust test runs one rate; pick one, e.g. --set load.rate={rates[0]:g}, "
            "or sweep the rates with loadgen run"
        )
    at_rate = [st.rate is not None for st in ld.stages]
    if any(at_rate) and not all(at_rate):
        raise ScenarioError(
            f"{source}: load.stages -> give every stage a rate (an open loop, its users set by -u), or every "
            "stage a concurrency and no rate (users, run with --shape)"
        )
    if any(at_rate) and any(st.concurrency is not None for st in ld.stages):
        raise ScenarioError(
            f"{source}: load.stages -> under Locust the users (-u) are the most in flight for the whole test: "
            "drop the stages' concurrency"
        )
    if ld.repeats > 1 and (rates or ld.ramp_up is not None or ld.stages):
        raise ScenarioError(
            f"{source}: load.repeats -> under Locust each step of users repeats; an open loop or stages run "
            "once a test: drop load.repeats, or run the repeats with loadgen run"
        )
    if rates or ld.ramp_up is not None or any(at_rate):
        if ld.search is not None:
            raise ScenarioError(f"{source}: load.search -> a search sets each probe's users itself: drop load.rate")
        if w.multi_turn is not None or w.source == "trace":
            raise ScenarioError(
                f"{source}: load.rate -> {'sessions' if w.multi_turn is not None else 'a trace'} under Locust "
                "keep their own pace: drop the rate, or run it with loadgen run"
            )
        return LocustPlan(scenario, w.input_tokens[0], w.output_tokens[0], (1,), None, open_loop=True)
    if ld.stages:
        return LocustPlan(scenario, w.input_tokens[0], w.output_tokens[0],
                          tuple(int(st.concurrency or 1) for st in ld.stages), None,
                          tuple(st.duration_s for st in ld.stages))
    steps = tuple(c for c in ld.concurrency if c is not None)
    if len(steps) != len(ld.concurrency):
        raise ScenarioError(
            f"{source}: load.concurrency -> 'unlimited' is not a number of Locust users; give numbers"
        )
    return LocustPlan(scenario, w.input_tokens[0], w.output_tokens[0], steps, ld.duration_s,
                      repeats=ld.repeats, cooldown_s=ld.cooldown_s)


def segments(plan: LocustPlan, step_s: float) -> tuple[tuple[int, float, bool], ...]:
    """The shape's timeline: (users, seconds, whether it is a cell) back to back: each step
    (``step_s`` long, or its stage's length), each step's repeats in turn, and before each
    repeat after the first a cooldown with no user, which is no cell."""
    if plan.step_lengths:
        return tuple((users, length, True) for users, length in zip(plan.steps, plan.step_lengths, strict=True))
    out: list[tuple[int, float, bool]] = []
    for users in plan.steps:
        for k in range(plan.repeats):
            if k and plan.cooldown_s > 0:
                out.append((0, plan.cooldown_s, False))
            out.append((users, step_s, True))
    return tuple(out)


def schedule(plan: LocustPlan, seed: int) -> tuple[Iterator[float], int | None] | None:
    """An open loop's arrival offsets (seconds after the test's start), the same in every
    process from the run's seed, and how many there are (None: endless, until the test ends):
    a rate's endless schedule, a ramp's num_prompts requests, or the stages' rates back to back,
    each for its duration. None for closed-loop users."""
    if not plan.open_loop:
        return None
    ld = plan.scenario.load
    arrivals = Arrivals(ld.rate[0], ld.arrival, ld.burstiness, seed)
    if ld.ramp_up is not None:
        r, count = ld.ramp_up, plan.scenario.workload.num_prompts
        return iter(ramp_offsets(count, r.strategy, r.start_rate, r.end_rate, arrivals)), count
    if ld.stages:
        return _staged(ld.stages, arrivals, seed), None
    return arrivals.offsets(), None


def _staged(stages: tuple[Stage, ...], arrivals: Arrivals, seed: int) -> Iterator[float]:
    """Each stage's arrivals at its rate, from the stage's start until its end (as loadgen run
    draws them: the stage's own seed)."""
    start = 0.0
    for k, stage in enumerate(stages):
        for offset in arrivals.at(stage.rate, seed + k).offsets():
            if offset >= stage.duration_s:
                break
            yield start + offset
        start += stage.duration_s


def arrivals_in_words(plan: LocustPlan) -> str | None:
    """An open loop's schedule as the start page says it (None: closed-loop users)."""
    if not plan.open_loop:
        return None
    ld = plan.scenario.load
    if ld.ramp_up is not None:
        r, count = ld.ramp_up, plan.scenario.workload.num_prompts
        what = f"ramp-up {r.start_rate:g} to {r.end_rate:g}/s over {count} requests"
    elif ld.stages:
        what = ", ".join(f"{st.rate:g}/s for {st.duration_s:g} s" for st in ld.stages if st.rate is not None)
    else:
        what = f"{ld.rate[0]:g}/s"
    return f"{what} ({ld.arrival}); each user has one request in flight"


def locust_scenario(plan: LocustPlan, users: tuple[int, ...]) -> Scenario:
    """The scenario a Locust run's directory holds: its concurrency is the users it ran with
    (each test's or step's peak); a search keeps its search (its probes are the cells)."""
    data = plan.scenario.model_dump(mode="json", exclude_unset=True)
    if plan.search is not None:
        return Scenario.model_validate(apply_overrides(data, [], {"load.warmup_requests": 0}))
    # an open loop keeps its rate, ramp or stages at a rate; its users are its most in flight
    stages: dict[str, object] = {} if plan.open_loop else {"load.stages": []}
    # repeats: the cells are each step's repeats in turn, as loadgen run's (labelled by the first's users)
    steps = list(users[::plan.repeats]) if plan.repeats > 1 else list(users)
    data = apply_overrides(data, [], {"load.concurrency": steps, "load.warmup_requests": 0, **stages})
    return Scenario.model_validate(data)


def rebase(line: bytes, shift_s: float, request_id: int, worker: int) -> RequestRecord:
    """A worker's record moved onto the master's clock (``shift_s`` = worker base - master base),
    numbered in the master's sequence and tagged with the worker's index."""
    data = orjson.loads(line)
    for key in RECORD_TIMES:
        if data.get(key) is not None:
            data[key] += shift_s
    data["request_id"] = request_id
    data["worker"] = worker
    return RequestRecord.from_dict(data)


@dataclass
class UsersSeen:
    """A cell's Locust users over time: (time, users) at each change, from its start to its stop."""

    test: int
    started_s: float
    points: list[tuple[float, int]]
    stopped_s: float | None = None

    def see(self, at_s: float, users: int) -> None:
        if self.stopped_s is None and (not self.points or self.points[-1][1] != users):
            self.points.append((at_s, users))

    def applied(self, now_s: float) -> AppliedUsers:
        """The users as they ran, up to the cell's stop (or ``now_s`` while it runs)."""
        end = self.stopped_s if self.stopped_s is not None else now_s
        points = [p for p in self.points if p[1] > 0] or [(self.started_s, 0)]
        peak = max(u for _, u in points)
        first = points[0][1]
        reached = next(t for t, u in points if u == peak)
        span = max(end - self.started_s, 1e-9)
        area = 0.0
        for (t0, u), (t1, _) in zip(points, [*points[1:], (end, 0)], strict=True):
            area += u * max(min(t1, end) - max(t0, self.started_s), 0.0)
        return AppliedUsers(self.test, first, peak, round(area / span, 2), round(max(reached - points[0][0], 0.0), 3),
                            round(end - self.started_s, 3))


class CellClock:
    """Which cell a request belongs to: each test (started from the web UI, the API or
    headless) opens one, and so does each later step of the shape; the cell is the one open
    when the request was sent. Each cell keeps the users it ran."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self.users: list[UsersSeen] = []
        self.tests = 0

    def open(self, at_s: float, users: int, *, new_test: bool) -> int:
        if self.users:
            self.close(at_s)
        self.tests += new_test or not self.tests
        self._starts.append(at_s)
        self.users.append(UsersSeen(self.tests, at_s, [(at_s, users)]))
        return len(self._starts) - 1

    def close(self, at_s: float) -> None:
        if self.users and self.users[-1].stopped_s is None:
            self.users[-1].stopped_s = at_s

    def see(self, at_s: float, users: int) -> None:
        if self.users:
            self.users[-1].see(at_s, users)

    def cell_of(self, sent_at: float | None) -> int:
        if not self._starts or sent_at is None:
            return 0
        return max(0, bisect.bisect_right(self._starts, sent_at) - 1)


class RunDirSink:
    """loadgen's run directory written from a Locust run (on the master, or the one process):
    records appended as they arrive, summary and report re-derived from them at the end."""

    def __init__(self, run_dir: Path, plan: LocustPlan, provenance: Provenance) -> None:
        self.out = RunDirWriter(run_dir, resumable=False)
        self.run_dir, self.plan, self.provenance = run_dir, plan, provenance
        self.out.write_provenance(provenance)
        self.cells_seen: set[int] = set()

    def add(self, record: RequestRecord) -> None:
        self.out.records.write(record)
        self.cells_seen.add(record.cell)

    def snapshot(self, users: list[AppliedUsers], *, interrupted: bool, server: ServerInfo,
                 probes: tuple[float, ...] = (), lost: Mapping[int, Sequence[LostWorker]] | None = None) -> Summary:
        """Write the scenario, cell statuses, summary and report of what was recorded so far
        (at each stop of the test, and at the end); returns the summary. ``users``: each
        cell's users as they ran (a cell's concurrency is its peak); ``lost``: the workers
        found missing, by cell."""
        lost = lost or {}
        scenario = locust_scenario(self.plan, tuple(max(u.peak, 1) for u in users) or (1,))
        self.out.write_scenario(scenario)
        if self.plan.search is not None:  # a search's cells are its probes, each at its users
            for index, value in enumerate(probes):
                if index in self.cells_seen:
                    applied = users[index] if index < len(users) else None
                    self.out.cells.write(CellStatus(index, "done", server=server, users=applied,
                                                    probe=SearchProbe(0, value),
                                                    workers_lost=tuple(lost.get(index, ()))))
        for cell in expand_cells(scenario):
            if cell.index in self.cells_seen:  # the last status line of a cell is the one read
                applied = users[cell.index] if cell.index < len(users) else None
                self.out.cells.write(CellStatus(cell.index, "done", server=server, users=applied,
                                                workers_lost=tuple(lost.get(cell.index, ()))))
        self.provenance.ended()
        self.out.write_provenance(self.provenance)
        summary = replace(build_summary_from_dir(self.run_dir, scenario), interrupted=interrupted)
        self.out.write_summary(summary, render_markdown(summary))
        return summary

    def close(self, users: list[AppliedUsers], *, interrupted: bool, server: ServerInfo,
              probes: tuple[float, ...] = (), lost: Mapping[int, Sequence[LostWorker]] | None = None) -> Summary:
        """The last snapshot, then the files closed and the directory's lock released."""
        summary = self.snapshot(users, interrupted=interrupted, server=server, probes=probes, lost=lost)
        self.out.close()
        return summary
