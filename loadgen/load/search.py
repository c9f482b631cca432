"""What a run measures next: the listed cells in order, or a capacity search's probes, each
chosen from the verdicts of those before it; and the watch that stops a probe early once it
has clearly broken an objective.

A probe stops early when its verdict can no longer change (enough requests already over a
bound that the percentile over every planned request must exceed it, or more failures than
the error rate allows), when a running figure is over twice its bound (checked at 20, 40, 80,
... requests, and for a percentile only once its tail holds 5 requests: 500 for a p99, 50 for a
p90, so a p99 is never judged on the first wave's few slowest streams), or, open loop, when
the server's queue (``vllm:num_requests_waiting`` and its peers) grew at each of the last
scrapes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from loadgen.load.serving import group_cells, serve_key
from loadgen.results.capacity import (
    ERROR_RATE,
    QUEUE,
    bound_of,
    broken,
    first_wave,
    next_value,
    objective_key,
    objective_label,
    slo_figures,
)
from loadgen.results.cellstatus import EarlyStop
from loadgen.results.readings import Scrape
from loadgen.results.records import RequestRecord
from loadgen.results.summary import CellSummary
from loadgen.scenario.matrix import Cell, SearchLine
from loadgen.scenario.schema import Scenario
from loadgen.scenario.shapes import Search, stat_quantile


class CellQueue(Protocol):
    """The cells one engine measures, one at a time."""

    @property
    def point(self) -> Scenario: ...
    def peek(self) -> Cell | None: ...
    def take(self) -> Cell | None: ...
    def known(self) -> list[Cell]: ...
    def finished(self, cell: Cell, entry: CellSummary) -> None: ...


class ListQueue:
    """Cells known in advance (a sweep, a matrix group)."""

    def __init__(self, cells: Sequence[Cell]) -> None:
        assert cells
        self._point: Scenario = cells[0].point
        self.cells = list(cells)

    @property
    def point(self) -> Scenario:
        return self._point

    def peek(self) -> Cell | None:
        return self.cells[0] if self.cells else None

    def known(self) -> list[Cell]:
        return list(self.cells)

    def take(self) -> Cell | None:
        return self.cells.pop(0) if self.cells else None

    def finished(self, cell: Cell, entry: CellSummary) -> None:
        pass


class Numbering:
    """Cell numbers for probes, after every number the run directory already holds."""

    def __init__(self, start: int) -> None:
        self.next = start

    def take(self) -> int:
        self.next += 1
        return self.next - 1


class SearchQueue:
    """The searches of one engine, one after another; each probe's value comes from the
    verdicts before it (``done``: the probes a resumed run already finished, by search)."""

    def __init__(self, lines: Sequence[SearchLine], done: dict[int, list[tuple[float, bool]]], numbers: Numbering):
        self.lines = list(lines)
        self.results = {line.index: list(done.get(line.index, [])) for line in self.lines}
        self.numbers = numbers
        self._pending: Cell | None = None

    @property
    def point(self) -> Scenario:
        return self.lines[0].point

    def peek(self) -> Cell | None:
        if self._pending is None:
            while self.lines:
                line = self.lines[0]
                value = next_value(line.search, self.results[line.index])
                if value is not None:
                    self._pending = line.probe(self.numbers.take(), value)
                    break
                self.lines.pop(0)
        return self._pending

    def take(self) -> Cell | None:
        cell = self.peek()
        self._pending = None
        return cell

    def known(self) -> list[Cell]:
        """The next probe (the later ones depend on its verdict)."""
        cell = self.peek()
        return [] if cell is None else [cell]

    def finished(self, cell: Cell, entry: CellSummary) -> None:
        if cell.search is not None and entry.probe is not None and entry.status in ("done", "failed"):
            self.results[cell.search].append((entry.probe.value, entry.probe.meets_slo))


def resumed_results(entries: Sequence[CellSummary]) -> dict[int, list[tuple[float, bool]]]:
    """The finished probes of a resumed run, by search, in probe order."""
    out: dict[int, list[tuple[float, bool]]] = {}
    for e in sorted(entries, key=lambda e: e.cell):
        if e.probe is not None and e.status in ("done", "failed"):
            out.setdefault(e.probe.search, []).append((e.probe.value, e.probe.meets_slo))
    return out


class ProbeWatch:
    """Watches a probe's records and the server's queue; ``stop()`` is called once, with the
    reason in ``stopped`` (``{"objective", "reason"}``), when the probe has clearly broken an objective."""

    MIN_RECORDS = 20
    FAR = 2.0
    QUEUE_SCRAPES = 4  # the queue grew at each of the last 3 intervals between these scrapes
    QUEUE_MIN = 4

    def __init__(self, search: Search, planned: int | None, open_loop: bool, stop: Callable[[], None],
                 wave: int = 0) -> None:
        self.slo = search.slo
        self.enabled = search.early_stop
        # a closed loop's first wave is left out of the verdict (where as many again follow): of it too
        self.wave = wave if planned is not None and planned >= 2 * wave else 0
        if planned is not None:
            planned -= self.wave
        self.planned, self.open_loop, self._stop = planned, open_loop, stop
        self.stopped: EarlyStop | None = None
        self.records: list[RequestRecord] = []
        self.over: Counter[str] = Counter()
        self.ended = self.failed = 0
        self.waiting: list[float] = []
        self.next_check = self.MIN_RECORDS

    def _halt(self, objective: str, reason: str) -> None:
        self.stopped = EarlyStop(objective, reason)
        self._stop()

    def add(self, r: RequestRecord) -> None:
        if not self.enabled or self.stopped is not None or r.warmup or r.error == "cancelled":
            return
        if r.request_id < self.wave:
            return
        self.ended += 1
        ok = r.answered and r.sent_at is not None
        self.failed += not ok
        self.records.append(r)
        if ok:
            values = _request_values(r)
            for metric, stat, bound in self.slo.bounds():
                v = values.get(metric)
                if v is not None and v > bound:
                    self.over[objective_key(metric, stat)] += 1
        if self.planned is not None and self._certain(self.planned):
            return
        # the running figures over every record so far, at 20, 40, 80, ... records: this runs on
        # the client's event loop, and checking at doubling counts keeps it O(n log n) in all
        n = len(self.records)
        if n >= self.next_check:
            self.next_check *= 2
            self._far_over()

    def _certain(self, planned: int) -> bool:
        """Whether the probe must break an objective whatever its remaining requests do."""
        rate = self.slo.error_rate
        if rate is not None and self.failed > rate * planned:
            self._halt(ERROR_RATE, f"{self.failed} of the {planned} requests failed: the error rate is over "
                                   f"{rate:.1%} whatever the rest do")
            return True
        for metric, stat, bound in self.slo.bounds():
            key = objective_key(metric, stat)
            q = stat_quantile(stat)
            if metric == "itl_ms" or (q is None and stat == "mean"):
                continue  # pooled gaps, and a mean, can still come down
            # numpy's linear percentile over m <= planned values exceeds the bound once this many do
            need = 1 if q is None else planned - math.floor((planned - 1) * q / 100)
            if self.over[key] >= need:
                self._halt(key, f"{self.over[key]} of the {planned} requests over {bound:g} ms: "
                                f"{objective_label(key)} is over it whatever the rest do")
                return True
        return False

    def _far_over(self) -> None:
        figures = slo_figures(self.records, self.slo)
        for key in broken(figures, self.slo):
            if len(self.records) < min_records(key):
                continue
            value = figures.get(key)
            bound = bound_of(key, self.slo)
            if value is not None and bound is not None and value > self.FAR * bound and bound > 0:
                shown = f"{value:.1%}" if key == ERROR_RATE else f"{value:.1f} ms"
                self._halt(key, f"{objective_label(key)} over the first {len(self.records)} requests is {shown}, "
                                f"more than {self.FAR:g} times its bound")
                return

    def scrape(self, values: Scrape) -> None:
        """A /metrics sample: open loop, a queue that grew at each of the last scrapes stops the probe."""
        if not self.enabled or self.stopped is not None or not self.open_loop:
            return
        waiting = values.gauges.get("waiting")
        if waiting is None:
            return
        self.waiting.append(float(waiting))
        last = self.waiting[-self.QUEUE_SCRAPES:]
        if (
            len(last) == self.QUEUE_SCRAPES and all(b > a for a, b in zip(last, last[1:], strict=False))
            and last[-1] >= self.QUEUE_MIN
        ):
            self._halt(QUEUE, f"the server's queue grew at every scrape, from {last[0]:g} to {last[-1]:g} "
                              "requests waiting: the load is over what it serves")


# a running percentile is judged once this many requests lie beyond it
TAIL = 5


def min_records(key: str) -> int:
    """The requests a running figure needs before it can stop a probe: a pNN needs TAIL of
    them above it (p99: 500, p90: 50, p50: 20), any other figure ProbeWatch.MIN_RECORDS."""
    metric, _, stat = key.partition(".")
    q = stat_quantile(stat) if stat and metric != "itl_ms" else None
    if q is None:
        return ProbeWatch.MIN_RECORDS
    return max(ProbeWatch.MIN_RECORDS, math.ceil(TAIL / (1 - q / 100) - 1e-9))


def probe_watch(cell: Cell, stop: Callable[[], None]) -> ProbeWatch | None:
    """The early-stop watch of a search's probe (None for any other cell)."""
    point = cell.point
    if cell.search is None or point is None or point.load.search is None:
        return None
    w = point.workload
    # every request the probe plans, when it is a number of them (not a duration)
    turns = 1 if w.multi_turn is None else w.multi_turn.turns  # (None: a session file's, not known here)
    planned = None if point.load.duration_s or turns is None else w.num_prompts * turns
    return ProbeWatch(point.load.search, planned, cell.rate is not None, stop, first_wave(cell))


def _request_values(r: RequestRecord) -> dict[str, float]:
    """One request's TTFT, TPOT and E2E latency in ms (what a per-request bound is checked on)."""
    seconds = {"ttft_ms": r.ttft_s, "tpot_ms": r.tpot_s, "e2e_ms": r.e2e_s}
    return {k: v * 1e3 for k, v in seconds.items() if v is not None}


def make_queues(
    cells: Sequence[Cell], lines: Sequence[SearchLine], finished: set[int], entries: Sequence[CellSummary],
    *, launched: bool,
) -> list[CellQueue]:
    """The run's work, one queue per engine it needs: the listed cells not yet finished, then
    the searches (probes numbered after every cell the run directory holds)."""
    queues: list[CellQueue] = []
    for group in group_cells(list(cells), launched=launched):
        todo = [c for c in group if c.index not in finished]
        if todo:
            queues.append(ListQueue(todo))
    if lines:
        numbers = Numbering(max([len(cells) - 1, *finished, *(e.cell for e in entries)], default=-1) + 1)
        done = resumed_results(entries)
        groups: dict[str, list[SearchLine]] = {}
        for line in lines:
            groups.setdefault(serve_key(line.point) if launched else "", []).append(line)
        queues += [SearchQueue(group, done, numbers) for group in groups.values()]
    return queues
