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

from loadgen.results.metrics import itl_values, summarize
from loadgen.results.records import RequestRecord
from loadgen.results.summary import SteadyState, Window
from loadgen.scenario.schema import Slo

DEFAULT_WIDTH_S = 10.0
STEADY_SHARE = 0.10
RULE = ("in flight within 10% (or one request) of the plateau, the median in-flight of the windows at least "
        "half as busy as the busiest; the longest run of such whole windows")


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


def time_windows(records: Sequence[RequestRecord], width: float) -> tuple[Window, ...]:
    measured = [r for r in records if not r.warmup and r.sent_at is not None and r.done_at is not None]
    if not measured or width <= 0:
        return ()
    t0 = min(r.sent_at for r in measured)  # type: ignore[type-var]
    end = max(r.done_at for r in measured) - t0  # type: ignore[operator,type-var]
    count = max(1, int(np.ceil(end / width - 1e-9)))
    edges = np.minimum(np.arange(count + 1) * width, end)
    sent = np.asarray([r.sent_at - t0 for r in measured])  # type: ignore[operator]
    done = np.asarray([r.done_at - t0 for r in measured])  # type: ignore[operator]
    ok = [r for r in measured if r.ok and r.first_token_at is not None]
    ok_sent = np.asarray([r.sent_at - t0 for r in ok])  # type: ignore[operator]
    ok_done = np.asarray([r.done_at - t0 for r in ok])  # type: ignore[operator]
    ttft = np.asarray([r.first_token_at - r.sent_at for r in ok])  # type: ignore[operator]
    # each gap at the time its later token arrived; each chunk's tokens at its arrival
    gap_at, gaps, token_at, tokens = [], [], [], []
    for r in ok:
        at = np.asarray(r.chunk_offsets_s, dtype=np.float64) + (r.sent_at - t0)  # type: ignore[operator]
        token_at.append(at)
        tokens.append(np.asarray(r.chunk_tokens, dtype=np.float64))
        if at.size > 1:
            gap_at.append(at[1:])
            gaps.append(itl_values(r))
    gap_times = np.concatenate(gap_at) if gap_at else np.empty(0)
    gap_values = np.concatenate(gaps) if gaps else np.empty(0)
    arrivals = np.concatenate(token_at) if token_at else np.empty(0)
    arrived = np.concatenate(tokens) if tokens else np.empty(0)
    out = []
    for i in range(count):
        lo, hi = float(edges[i]), float(edges[i + 1])
        last = i == count - 1
        span = hi - lo
        inside = (sent >= lo) & ((sent < hi) | last)
        # requests in flight, time-weighted: each request's overlap with the window
        overlap = np.clip(np.minimum(done, hi) - np.maximum(sent, lo), 0, None).sum()
        in_gap = (gap_times >= lo) & ((gap_times < hi) | last)
        in_tok = (arrivals >= lo) & ((arrivals < hi) | last)
        ok_in = (ok_sent >= lo) & ((ok_sent < hi) | last)
        out.append(Window(
            start_s=round(lo, 6), end_s=round(hi, 6), started=int(inside.sum()),
            completed=int(((ok_done >= lo) & ((ok_done < hi) | last)).sum()),
            in_flight=round(float(overlap / span), 3) if span > 0 else 0.0,
            ttft_p50_s=_pct(ttft[ok_in], 50), ttft_p99_s=_pct(ttft[ok_in], 99),
            itl_p50_s=_pct(gap_values[in_gap], 50), itl_p99_s=_pct(gap_values[in_gap], 99),
            output_tokens_per_s=round(float(arrived[in_tok].sum() / span), 3) if span > 0 else 0.0,
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
