"""A cell over time: its figures in consecutive windows, and its steady state.

Windows are ``width`` seconds long from the cell's first measured send (the last one shorter).
In each: the requests sent and completed in it, the time-weighted mean of requests in flight,
TTFT at p50 and p99 of the requests sent in it, ITL at p50 and p99 of the token gaps that ended
in it, and output tokens/s of the tokens that arrived in it.

The steady state is found by this rule (the README states it):

1. the plateau is the median in-flight of the windows whose in-flight is at least half the
   highest window's (the ramp's first windows and the drain's last ones fall below);
2. a window is steady when its in-flight is within 10% of the plateau, or within one request
   where 10% is less than one;
3. the steady state is the longest run of consecutive steady windows (the earliest where two are
   as long), and needs at least two windows; the last, shorter window never counts.

Its figures are the cell's own metrics over the requests sent within it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loadgen.results.figures import Window
from loadgen.results.metrics import itl_values, summarize
from loadgen.results.records import RequestRecord
from loadgen.results.summary import SteadyState
from loadgen.scenario.schema import Slo

DEFAULT_WIDTH_S = 10.0
MAX_WINDOWS = 10_000  # a cell in more windows than this is cut in this many (as report.windows allows)
STEADY_SHARE = 0.10
RULE = ("in flight within 10% (or one request) of the plateau, the median in-flight of the windows at least "
        "half as busy as the busiest; the longest run of such whole windows")


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def _per_window(index: np.ndarray, values: np.ndarray, count: int, q: float) -> list[float | None]:
    """The ``q``-th percentile of ``values`` in each window (by ``index``); None where it has none."""
    if not values.size:
        return [None] * count
    order = np.argsort(index, kind="stable")
    groups = np.split(values[order], np.cumsum(np.bincount(index, minlength=count))[:-1])
    return [float(np.percentile(g, q)) if g.size else None for g in groups]


def _span(records: Sequence[RequestRecord]) -> tuple[list[RequestRecord], float, float]:
    """The measured requests with a send and an end, the first send and the span to the last end."""
    measured = [r for r in records if not r.warmup and r.sent_at is not None and r.done_at is not None]
    sent = [r.sent_at for r in measured if r.sent_at is not None]
    done = [r.done_at for r in measured if r.done_at is not None]
    if not measured:
        return [], 0.0, 0.0
    return measured, min(sent), max(done) - min(sent)


def window_width(records: Sequence[RequestRecord], width: float) -> float:
    """``width``, or wider where the cell's span would need more than ``MAX_WINDOWS`` of it (a
    window of a microsecond over a run of seconds: millions of windows, each with no request)."""
    return max(width, _span(records)[2] / MAX_WINDOWS)


def time_windows(records: Sequence[RequestRecord], width: float) -> tuple[Window, ...]:
    """The cell in windows of ``width`` seconds from its first send. Every figure is binned by
    index (one pass over the requests, one over their tokens): a long run's many windows cost
    no more than its few."""
    measured, t0, end = _span(records)
    if not measured or width <= 0:
        return ()
    width = max(width, end / MAX_WINDOWS)
    count = max(1, int(np.ceil(end / width - 1e-9)))
    edges = np.minimum(np.arange(count + 1) * width, end)

    def index(times: np.ndarray) -> np.ndarray:
        return np.clip((times / width).astype(np.int64), 0, count - 1)

    sent = np.sort(np.asarray([r.sent_at - t0 for r in measured]))  # type: ignore[operator]
    done = np.sort(np.asarray([r.done_at - t0 for r in measured]))  # type: ignore[operator]
    # requests in flight, time-weighted: the area under the in-flight count up to each edge,
    # A(e) = sum of done before e - sum of sent before e + e x (sent before e - done before e)
    sent_sum, done_sum = np.concatenate([[0.0], np.cumsum(sent)]), np.concatenate([[0.0], np.cumsum(done)])
    n_sent, n_done = np.searchsorted(sent, edges, side="left"), np.searchsorted(done, edges, side="left")
    area = done_sum[n_done] - sent_sum[n_sent] + edges * (n_sent - n_done)
    ok = [r for r in measured if r.ok and r.first_token_at is not None]
    ok_sent = index(np.asarray([r.sent_at - t0 for r in ok]))  # type: ignore[operator]
    ttft = np.asarray([r.first_token_at - r.sent_at for r in ok])  # type: ignore[operator]
    # each chunk's tokens at its arrival; each gap at the arrival of its later token
    tokens = np.zeros(count)
    gap_index, gap_values = [], []
    for r in ok:
        at = index(np.asarray(r.chunk_offsets_s, dtype=np.float64) + (r.sent_at - t0))  # type: ignore[operator]
        np.add.at(tokens, at, np.asarray(r.chunk_tokens, dtype=np.float64))
        if at.size > 1:
            gap_index.append(at[1:].astype(np.int32))
            gap_values.append(itl_values(r))
    gaps_at = np.concatenate(gap_index).astype(np.int64) if gap_index else np.empty(0, dtype=np.int64)
    gaps = np.concatenate(gap_values) if gap_values else np.empty(0)
    ttft_p50, ttft_p99 = _per_window(ok_sent, ttft, count, 50), _per_window(ok_sent, ttft, count, 99)
    itl_p50, itl_p99 = _per_window(gaps_at, gaps, count, 50), _per_window(gaps_at, gaps, count, 99)
    started = np.bincount(index(sent), minlength=count)
    completed = np.bincount(index(np.asarray([r.done_at - t0 for r in ok])), minlength=count)  # type: ignore[operator]
    out = []
    for i in range(count):
        span = float(edges[i + 1] - edges[i])
        out.append(Window(
            start_s=round(float(edges[i]), 6), end_s=round(float(edges[i + 1]), 6), started=int(started[i]),
            completed=int(completed[i]),
            in_flight=round(float((area[i + 1] - area[i]) / span), 3) if span > 0 else 0.0,
            ttft_p50_s=ttft_p50[i], ttft_p99_s=ttft_p99[i], itl_p50_s=itl_p50[i], itl_p99_s=itl_p99[i],
            output_tokens_per_s=round(float(tokens[i] / span), 3) if span > 0 else 0.0,
        ))
    return tuple(out)


def steady_run(windows: Sequence[Window], width: float) -> tuple[int, int] | None:
    """(first, last + 1) of the steady windows by the module's rule; None where there are none."""
    whole = [w for w in windows if w.end_s - w.start_s >= width - 1e-9]
    if len(whole) < 2:
        return None
    top = max(w.in_flight for w in whole)
    if top <= 0:
        return None
    plateau = float(np.median([w.in_flight for w in whole if w.in_flight >= top / 2]))
    tolerance = max(STEADY_SHARE * plateau, 1.0 if STEADY_SHARE * plateau < 1 else 0.0)
    steady = [abs(w.in_flight - plateau) <= tolerance for w in whole]
    best, start = (0, 0), None
    for i, ok in enumerate([*steady, False]):
        if ok and start is None:
            start = i
        elif not ok and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    return best if best[1] - best[0] >= 2 else None


def steady_state(
    records: Sequence[RequestRecord], windows: Sequence[Window], width: float, slo: Slo | None, open_loop: bool,
) -> SteadyState | None:
    found = steady_run(windows, width)
    if found is None:
        return None
    lo, hi = windows[found[0]].start_s, windows[found[1] - 1].end_s
    measured = [r for r in records if not r.warmup and r.sent_at is not None and r.done_at is not None]
    t0 = min(r.sent_at for r in measured)  # type: ignore[type-var]
    inside = [r for r in measured if lo <= r.sent_at - t0 < hi]  # type: ignore[operator]
    if not inside:
        return None
    return SteadyState(lo, hi, RULE, summarize(inside, slo, breakdown=False, open_loop=open_loop))
