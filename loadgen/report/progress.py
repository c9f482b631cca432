"""The live progress bar of ``loadgen run``: requests done / total, output tokens/s, TTFT p50 and
p99 of the latest requests, errors."""

from __future__ import annotations

import statistics
import time
from bisect import bisect_right
from collections import deque
from itertools import accumulate

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Column

from loadgen.results.records import RequestRecord
from loadgen.results.summary import CellSummary
from loadgen.scenario.matrix import Cell

RATE_EVERY_S = 0.25  # how often the bar's tokens/s is recomputed


class LiveRate:
    """Output tokens/s over the last ``window_s`` seconds of token arrivals.

    A record comes when its request ends, with the arrival time of each of its tokens. The
    window is placed as far back as the longest request seen lately, so that every request with
    tokens inside it has ended and been counted: the rate holds every token that arrived in the
    window and no other. Before that much has been seen, the rate is the tokens received over the
    time since the first request was sent (an underestimate, never more than what arrived).
    All times are the records' own (the run's clock).

    Nothing is done per token: a record is kept with its running token count, and the rate (a
    few times a second) finds where the window cuts each kept request by bisection.
    """

    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = window_s
        # the requests that may have tokens in the window: (sent, chunk offsets, tokens up to each)
        self.kept: deque[tuple[float, tuple[float, ...], list[int], float]] = deque()
        self.durations: deque[float] = deque(maxlen=256)  # E2E of the latest requests
        self.first_sent: float | None = None
        self.latest = 0.0  # the last end of a request seen
        self.tokens = 0

    def add(self, r: RequestRecord) -> None:
        if not r.ok or r.sent_at is None or r.done_at is None:
            return
        self.first_sent = r.sent_at if self.first_sent is None else min(self.first_sent, r.sent_at)
        self.latest = max(self.latest, r.done_at)
        self.durations.append(r.e2e_s or 0.0)
        offsets, tokens = r.chunk_offsets_s, r.chunk_tokens
        if len(offsets) != len(tokens):  # (a progress bar never stops a run over a mismatch)
            offsets, tokens = offsets[:min(len(offsets), len(tokens))], tokens[:min(len(offsets), len(tokens))]
        upto = [0, *accumulate(tokens)]
        self.kept.append((r.sent_at, offsets, upto, r.done_at))
        self.tokens += upto[-1]

    def rate(self) -> float | None:
        if self.first_sent is None:
            return None
        end = self.latest - max(self.durations)
        start = end - self.window_s
        if start < self.first_sent:
            span = self.latest - self.first_sent
            return self.tokens / span if span > 0 else None
        kept = self.kept
        while kept and kept[0][3] <= start:  # (they end in about that order: all their tokens came before)
            kept.popleft()
        total = 0
        for sent, offsets, upto, _ in kept:  # the tokens that arrived in (start, end]
            total += upto[bisect_right(offsets, end - sent)] - upto[bisect_right(offsets, start - sent)]
        return total / self.window_s


WIDE = 110  # the whole line: lengths, bar, done / total, tok/s, TTFT, errors, time


def _ms(seconds: float) -> str:
    """Milliseconds as the line shows them: a tenth below 100 ms, whole ones above (124,674)."""
    ms = seconds * 1e3
    return f"{ms:,.1f}" if ms < 100 else f"{ms:,.0f}"


def _ttft_text(ttfts: list[float]) -> str:
    """``p50/p99`` in ms of the latest requests' TTFT (s)."""
    if not ttfts:
        return "-"
    ordered = sorted(ttfts)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{_ms(statistics.median(ordered))}/{_ms(p99)}"


def _text(template: str, wraps: bool) -> TextColumn:
    """A column of text; one that ``wraps`` goes onto a second line where a narrow terminal cannot
    hold the whole line: a figure is never cut short ("1…")."""
    return TextColumn(template, table_column=Column(no_wrap=False, overflow="fold") if wraps else None)


class ProgressObserver:
    """Live progress: requests done / total, current output tokens/s, errors."""

    def __init__(self, console: Console) -> None:
        self.console = console
        # a terminal narrower than the whole line drops the bar and the lengths, never a figure
        self.narrow = console.width < WIDE
        # a cell's figures are one column (``_figures``): the line of a pool being made has none
        self.progress = Progress(
            _text("{task.description}", self.narrow),
            *(() if self.narrow else (BarColumn(),)),  # (a wide line's bar gives way to its figures)
            MofNCompleteColumn(),
            _text("{task.fields[figures]}", self.narrow),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.making: TaskID | None = None  # the line of a cell's requests being made
        self.errors = 0
        self.rate = LiveRate()
        self.tps = "-"
        self.ttfts: deque[float] = deque(maxlen=256)  # the latest requests' TTFT (s)
        self.ttft = "-"
        self.next_rate = 0.0

    def message(self, text: str) -> None:
        self.console.print(text, style="dim", markup=False, highlight=False, soft_wrap=True)

    def _figures(self, tps: str, ttft: str, errors: int) -> str:
        # (narrow: without "p50/p99", so that 80 columns hold the line with its whole count)
        return f"{tps:>7} tok/s TTFT{'' if self.narrow else ' p50/p99'} {ttft} ms errors {errors}"

    def _update(self, advance: int = 0) -> None:
        assert self.task is not None
        self.progress.update(self.task, advance=advance, tps=self.tps, ttft=self.ttft, errors=self.errors,
                             figures=self._figures(self.tps, self.ttft, self.errors))

    def preparing(self, cell: Cell, made: int, total: int, cells: int) -> None:
        """A cell's requests being made before its window: many take seconds (200,000: about nine)."""
        if self.making is None:
            if self.task is None:
                self.progress.start()
            what = f"cell {cell.index + 1}/{cells}" if cell.search is None else f"probe {cell.index + 1}"
            self.making = self.progress.add_task(f"{what}: making requests", total=total, figures="")
        self.progress.update(self.making, completed=made)

    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
        if self.making is not None:
            self.progress.remove_task(self.making)
            self.making = None
        elif self.task is None:
            self.progress.start()
        self.errors = 0
        self.rate = LiveRate()
        self.tps, self.next_rate = "-", 0.0
        self.ttfts.clear()
        self.ttft = "-"
        p = cell.params()
        lengths = p.get("workload") or f"in={p['input_tokens']} out={p['output_tokens']}"
        what = f"probe {cell.index + 1}" if cell.search is not None else f"cell {cell.index + 1}/{cells}"
        desc = f"{what} c={p['concurrency']}" if self.narrow else f"{what} {lengths} c={p['concurrency']}"
        if p["rate"] is not None:
            desc += f" rate={p['rate']:g}"
        self.task = self.progress.add_task(desc, total=total, tps="-", ttft="-", errors=0,
                                           figures=self._figures("-", "-", 0))

    def record(self, record: RequestRecord) -> None:
        if record.warmup or self.task is None:
            return
        if record.ok:
            self.rate.add(record)
            if (ttft := record.ttft_s) is not None:
                self.ttfts.append(ttft)
        elif record.error != "cancelled":
            self.errors += 1
        # this runs on the client's event loop for every request that ends: the rate (a pass
        # over the window's token arrivals) is recomputed a few times a second, not per request
        now = time.monotonic()
        if now >= self.next_rate:
            self.next_rate = now + RATE_EVERY_S
            tps = self.rate.rate()
            self.tps = "-" if tps is None else f"{tps:,.0f}"
            self.ttft = _ttft_text(list(self.ttfts))
        self._update(advance=1)

    def cell_finished(self, cell: Cell, summary: CellSummary) -> None:
        """The bar ends on the cell's figure, the one its table shows (output tokens over the
        measured window), not on the last live reading."""
        m = summary.metrics
        if self.task is not None and m is not None and m.output_throughput is not None:
            p50, p99 = m.ttft_s.p50, m.ttft_s.p99
            self.tps = f"{m.output_throughput:,.0f}"
            self.ttft = "-" if p50 is None or p99 is None else f"{_ms(p50)}/{_ms(p99)}"
            self._update()

    def close(self) -> None:
        self.progress.stop()
