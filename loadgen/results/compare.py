"""Two runs' matched cells, metric by metric: the change, its 95% bootstrap interval, a verdict.

A cell of a run is matched to the baseline's cell with the same parameters (lengths, load,
workload), the number of prompts aside: 32 and 48 prompts of the same load compare. Where a
run holds several cells with the same parameters (a matrix over models or quantizations), the
server's model, engine and quantization join the match.

Each figure's interval comes from resampling each run's own measurements (2,000 draws, a fixed
seed, so the same runs always give the same intervals):

- TTFT, TPOT and E2E percentiles: the requests, resampled with replacement (above 2,000
  requests, the resampled percentile's rank is drawn from its normal limit instead);
- ITL percentiles: the requests resampled whole, each drawn request bringing all its gaps (the
  gaps of one stream are correlated: resampled one by one, they give an interval too narrow);
- a percentile gets no interval from fewer values than can bound it at all (368 for a p99,
  6 for a p50): its verdict is "too few values";
- requests/s and output tokens/s: in a closed loop, the requests in flight over the mean E2E
  latency (Little's law), the requests resampled; in an open loop, the completions drawn as a
  Poisson count.

The interval is that of the relative change (run / baseline - 1). It holds the sampling noise
within each run, not the drift of a machine between runs: a change whose interval excludes
zero but which is smaller than ``min_change`` is no significant change. Where either run's
self-check found its client or its engine starved, or the two cells ran different loads (a
closed loop's peak or mean in flight apart by more than a tenth), no change is called better or
worse: the cell's notes say why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from loadgen.results.intervals import bounded_above_from, t95
from loadgen.results.metrics import itl_values
from loadgen.results.records import RequestRecord
from loadgen.results.repeats import Repeated
from loadgen.results.summary import CellSummary, Summary

DRAWS = 2000
RESAMPLE_UP_TO = 2000  # above, a percentile's bootstrap rank is drawn from its normal limit
MIN_REQUESTS_FOR_RATE = 8
MIN_CHANGE = 0.02
SEED = 20261126
BETTER, WORSE, SAME, FEW, UNKNOWN = "better", "worse", "within noise", "too few values", "not measured"
NOT_JUDGED = "no verdict"  # a change not judged: the cell's notes say why
LOAD_APART = 0.10  # two closed loops whose peak or mean in flight differ by more ran different loads


@dataclass(frozen=True, slots=True)
class Metric:
    key: str  # as summary.json names it: ttft_ms.p99, output_throughput
    label: str
    higher_is_better: bool
    q: float | None = None  # a percentile (0-100) of per-request or per-gap values; None: a rate


METRICS = tuple(
    Metric(f"{name}_ms.p{q}", f"{title} p{q} (ms)", False, float(q))
    for name, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))
    for q in (50, 99)
) + (
    Metric("request_throughput", "req/s", True),
    Metric("output_throughput", "output tok/s", True),
)


@dataclass(frozen=True, slots=True)
class Change:
    metric: str
    label: str
    base: float | None
    value: float | None
    change: float | None  # relative: value / base - 1
    low: float | None  # the change's 95% interval (None: too few measurements for one)
    high: float | None
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "baseline": self.base, "value": self.value, "change": self.change,
                "change_low": self.low, "change_high": self.high, "verdict": self.verdict}


@dataclass(frozen=True, slots=True)
class CellMatch:
    params: dict[str, Any]
    base_cell: int  # the cells' numbers, from 1
    cell: int
    base_requests: int  # (by_repeats: the repeats)
    requests: int
    changes: tuple[Change, ...]
    by_repeats: bool = False  # the changes come from both runs' repeats, not from one cell's requests
    # why its changes get no verdict (a starved client or engine, different loads), or what a
    # reader should know of its match
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        counted = "repeats" if self.by_repeats else "requests"
        return {"params": self.params, "baseline_cell": self.base_cell, "cell": self.cell,
                f"baseline_{counted}": self.base_requests, counted: self.requests,
                "interval": "Student's t over the repeats" if self.by_repeats else "bootstrap over the requests",
                "notes": list(self.notes), "changes": [c.to_dict() for c in self.changes]}


@dataclass(frozen=True, slots=True)
class RunComparison:
    """One run against the baseline: its matched cells and the cells of either run left unmatched."""

    label: str
    path: str
    matches: tuple[CellMatch, ...]
    unmatched: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "path": self.path, "cells": [m.to_dict() for m in self.matches],
                "unmatched": list(self.unmatched)}


@dataclass(frozen=True, slots=True)
class Run:
    """A run as compared: its label, directory, summary and measured records by cell index."""

    label: str
    path: str
    summary: Summary
    records: dict[int, list[RequestRecord]]


def match_key(cell: CellSummary, with_server: bool) -> tuple[tuple[str, str], ...]:
    key = sorted((k, repr(v)) for k, v in cell.params.items() if k != "num_prompts")
    if with_server:
        s = cell.server
        key += [("model", repr(s.model)), ("backend", repr(s.backend)), ("quant", repr(s.quant))]
    return tuple(key)


def _keyed(summary: Summary) -> dict[tuple[tuple[str, str], ...], CellSummary]:
    # a search's probes too (two searches compare at the loads both probed); a load probed twice
    # (a confirmation) compares by its last probe
    cells = [c for c in summary.cells if c.status == "done" and c.metrics is not None]
    servers: dict[tuple[tuple[str, str], ...], set[tuple[str, str]]] = {}
    for c in cells:
        servers.setdefault(match_key(c, False), set()).update(match_key(c, True)[-3:])
    # the same parameters on different servers (a matrix over models): the server joins the match
    with_server = any(len(s) > 3 for s in servers.values())
    return {match_key(c, with_server): c for c in cells}


def _loose(key: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(kv for kv in key if kv[0] not in ("model", "backend", "quant"))


def _group_key(params: dict[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in params.items() if k not in ("num_prompts", "repeat")))


def _from_repeats(metric: Metric, a: Repeated | None, b: Repeated | None, min_change: float) -> Change:
    """The change between two repeated figures, its 95% interval by the delta method on the
    ratio of the means, with Welch's degrees of freedom for Student's t."""
    if a is None or b is None or a.mean <= 0:
        return Change(metric.key, metric.label, None if a is None else _ms(metric, a.mean),
                      None if b is None else _ms(metric, b.mean), None, None, None, UNKNOWN)
    change = b.mean / a.mean - 1
    na, nb = len(a.values), len(b.values)
    if na < 2 or nb < 2 or b.mean <= 0:
        return Change(metric.key, metric.label, _ms(metric, a.mean), _ms(metric, b.mean), change, None, None, FEW)
    va, vb = (float(np.var(a.values, ddof=1)) / (a.mean**2 * na), float(np.var(b.values, ddof=1)) / (b.mean**2 * nb))
    se = math.sqrt(va + vb) * (1 + change)
    df = (va + vb) ** 2 / ((va**2 / (na - 1) if va else 0) + (vb**2 / (nb - 1) if vb else 0) or 1e-300)
    half = t95(max(1, int(df))) * se
    low, high = change - half, change + half
    significant = (low > 0 or high < 0) and abs(change) >= min_change
    verdict = SAME if not significant else (BETTER if (change > 0) == metric.higher_is_better else WORSE)
    return Change(metric.key, metric.label, _ms(metric, a.mean), _ms(metric, b.mean), change, low, high, verdict)


def _ms(metric: Metric, value: float) -> float:
    return value * 1e3 if metric.q is not None else value


def _compare_repeats(base: Run, run: Run, min_change: float) -> RunComparison:
    """Both runs measured each cell several times: their repeat groups matched by parameters,
    each change from the repeats' means and spread."""
    groups = {_group_key(g.params): g for g in base.summary.repeats}
    matches, unmatched = [], []
    for g in run.summary.repeats:
        if (b := groups.pop(_group_key(g.params), None)) is None:
            unmatched.append(f"{run.label}: cells {','.join(map(str, g.cells))}: the baseline has no repeats "
                             "with these parameters")
            continue
        changes = tuple(_from_repeats(m, b.figures.get(_figure(m)), g.figures.get(_figure(m)), min_change)
                        for m in METRICS)
        # a repeat whose client or engine was starved: its figure holds that delay
        notes = tuple(dict.fromkeys(
            n for side, group in ((base, b), (run, g)) for c in side.summary.cells if c.number in group.cells
            for n in unjudged(c, c, side.label, side.label) if "different loads" not in n))
        if notes:
            changes = tuple(_unjudged(c) for c in changes)
        matches.append(CellMatch(dict(g.params), b.cells[0], g.cells[0], len(b.cells), len(g.cells), changes,
                                 by_repeats=True, notes=notes))
    unmatched += [f"{base.label}: cells {','.join(map(str, g.cells))}: {run.label} has no repeats with these "
                  "parameters" for g in groups.values()]
    return RunComparison(run.label, run.path, tuple(matches), tuple(unmatched))


def _figure(metric: Metric) -> str:
    """summary.json's name of a repeated figure: ttft_ms.p99 -> ttft_s.p99."""
    return metric.key.replace("_ms.", "_s.")


def compare(base: Run, run: Run, min_change: float = MIN_CHANGE) -> RunComparison:
    """``run`` against ``base``, cell by matched cell (or, where both measured their cells
    several times, repeats against repeats)."""
    if base.summary.repeats and run.summary.repeats:
        return _compare_repeats(base, run, min_change)
    base_cells, cells = _keyed(base.summary), _keyed(run.summary)
    # a key with the server in it on one side only: match on the parameters alone
    if any(len(k) != len(_loose(k)) for k in (*base_cells, *cells)):
        if not all(len(k) != len(_loose(k)) for k in (*base_cells, *cells)):
            base_cells = {_loose(k): c for k, c in base_cells.items()}
            cells = {_loose(k): c for k, c in cells.items()}
    rng = np.random.default_rng(SEED)
    matches = []
    for key, cell in cells.items():
        if (b := base_cells.get(key)) is None:
            continue
        b_rec, rec = base.records.get(b.cell, []), run.records.get(cell.cell, [])
        changes = tuple(_change(m, b, cell, b_rec, rec, rng, min_change) for m in METRICS)
        notes = unjudged(b, cell, base.label, run.label)
        if notes:
            changes = tuple(_unjudged(c) for c in changes)
        matches.append(CellMatch(dict(cell.params), b.number, cell.number, len(b_rec), len(rec), changes, notes=notes))
    unmatched = [f"{run.label}: cell {c.number} ({_params(c)}): the baseline has no cell with these parameters"
                 for k, c in cells.items() if k not in base_cells]
    unmatched += [f"{base.label}: cell {c.number} ({_params(c)}): {run.label} has no cell with these parameters"
                  for k, c in base_cells.items() if k not in cells]
    unmatched += [f"{r.label}: cell {c.number}: {c.ending}, nothing to compare"
                  for r in (base, run) for c in r.summary.cells if c.status != "done" and c.probe is None]
    return RunComparison(run.label, run.path, tuple(matches), tuple(unmatched))


def unjudged(base: CellSummary, cell: CellSummary, base_label: str, label: str) -> tuple[str, ...]:
    """Why two matched cells' changes cannot be called better or worse: either side's client or
    engine starved by other programs (its figures hold their delay), or a closed loop that ran a
    different load than its match (peak or mean in flight more than ``LOAD_APART`` apart)."""
    notes = []
    for name, c in ((base_label, base), (label, cell)):
        if c.client is not None and c.client.verdict != "ok":
            notes.append(f"{name}: the client was {c.client.verdict} (its self-check): a verdict needs both "
                         "runs measured with the client's core its own")
        if c.engine_cores is not None and c.engine_cores.starved:
            notes.append(f"{name}: the engine was starved: other programs took {c.engine_cores.others_share:.0%} "
                         "of its cores")
    a, b = base.metrics, cell.metrics
    if a is not None and b is not None and not base.open_loop and not cell.open_loop:
        for what, x, y in (("peak", a.peak_in_flight, b.peak_in_flight),
                           ("mean", a.mean_in_flight, b.mean_in_flight)):
            if x and y and abs(x - y) > LOAD_APART * max(x, y):
                notes.append(f"the cells ran different loads: {what} in flight {x:.3g} in {base_label}, "
                             f"{y:.3g} in {label}")
                break
    return tuple(notes)


def _unjudged(c: Change) -> Change:
    return replace(c, verdict=NOT_JUDGED) if c.verdict in (BETTER, WORSE, SAME) else c


def _params(cell: CellSummary) -> str:
    return ", ".join(f"{k} {v}" for k, v in cell.params.items() if v is not None and k != "num_prompts")


MAX_DRAWN_VALUES = 20_000_000  # sorted gaps times draws weighed at once (about 80 MB of counts)


def _itl_draws(records: Sequence[RequestRecord], q: float, rng: np.random.Generator) -> np.ndarray | None:
    """``DRAWS`` bootstrap values of the ``q``-th percentile of the pooled ITL gaps (ms), the
    requests resampled whole: each draw takes n requests with replacement and pools their gaps.
    A draw's percentile is np.percentile's (linear between the two closest ranks) of that pool,
    read from the gaps sorted once, each weighted by how often its request was drawn. Only the
    sorted gaps near the pooled percentile are weighed (a window wide enough for any plausible
    draw, the gaps below it counted per request); a draw whose percentile falls outside is read
    from all of them."""
    parts = [itl_values(r) * 1e3 for r in records]
    parts = [p for p in parts if p.size]
    n, total = len(parts), sum(p.size for p in parts)
    if n < 2 or total < max(2, bounded_above_from(q)):
        return None
    sizes = np.asarray([p.size for p in parts], dtype=np.int64)
    owner = np.repeat(np.arange(n), sizes)
    order = np.argsort(np.concatenate(parts), kind="stable")
    gaps, owner = np.concatenate(parts)[order], owner[order]
    # the window: four times the rank's spread were every request's gaps one value (the most they
    # can move together)
    p = q / 100
    centre = int(p * (total - 1))
    half = int(4 * math.sqrt(total * p * (1 - p) + 1) * math.sqrt(total / n)) + 2
    lo_at, hi_at = max(0, centre - half), min(total, centre + half)
    below = np.bincount(owner[:lo_at], minlength=n)  # each request's gaps under the window
    out = np.empty(DRAWS)
    step = max(1, MAX_DRAWN_VALUES // (hi_at - lo_at))
    for start in range(0, DRAWS, step):
        d = min(step, DRAWS - start)
        picks = rng.integers(0, n, size=(d, n))
        counts = np.bincount((picks + n * np.arange(d)[:, None]).ravel(), minlength=d * n).reshape(d, n)
        pooled, under = counts @ sizes, counts @ below
        rank = (pooled - 1) * p
        first = np.floor(rank).astype(np.int64)
        frac = rank - first
        second = np.minimum(first + 1, pooled - 1)
        cum = under[:, None] + np.cumsum(counts[:, owner[lo_at:hi_at]], axis=1)
        inside = (under <= first) & (second < cum[:, -1])
        a = lo_at + (cum <= first[:, None]).sum(axis=1)
        b = lo_at + (cum <= second[:, None]).sum(axis=1)
        for k in np.flatnonzero(~inside):  # outside the window: all the gaps
            whole = np.cumsum(counts[k, owner])
            a[k] = int(np.searchsorted(whole, first[k], side="right"))
            b[k] = int(np.searchsorted(whole, second[k], side="right"))
        out[start:start + d] = gaps[a] + frac * (gaps[b] - gaps[a])
    return out


def _values(records: Sequence[RequestRecord], metric: Metric) -> np.ndarray:
    name = metric.key.split("_ms")[0]
    if name == "itl":
        parts = [itl_values(r) for r in records]
        return np.concatenate(parts) * 1e3 if parts else np.empty(0)
    get: Callable[[RequestRecord], float | None] = {
        "ttft": lambda r: r.ttft_s, "tpot": lambda r: r.tpot_s, "e2e": lambda r: r.e2e_s,
    }[name]
    return np.asarray([v * 1e3 for r in records if (v := get(r)) is not None], dtype=np.float64)


def _rate_draws(
    records: Sequence[RequestRecord], metric: Metric, point: float, open_loop: bool, rng: np.random.Generator,
) -> np.ndarray | None:
    """``DRAWS`` bootstrap values of requests/s or output tokens/s around ``point`` (the cell's
    figure). A closed loop's request rate is its requests in flight over its mean E2E latency
    (Little's law): its spread is that of the mean latency, the requests resampled. An open
    loop's completions are a count over a window: drawn as Poisson. Output tokens/s is the
    request rate times the mean output tokens, resampled with the same requests."""
    pairs = np.asarray([(e2e, r.output_tokens) for r in records if (e2e := r.e2e_s) is not None and e2e > 0],
                       dtype=np.float64).reshape(-1, 2)
    n = len(pairs)
    if n < MIN_REQUESTS_FOR_RATE:
        return None
    picked = pairs[rng.integers(0, n, size=(DRAWS, n))]
    if open_loop:
        factor = rng.poisson(n, DRAWS) / n
    else:
        factor = pairs[:, 0].mean() / picked[:, :, 0].mean(axis=1)
    if metric.key == "output_throughput":
        factor = factor * picked[:, :, 1].mean(axis=1) / max(pairs[:, 1].mean(), 1e-12)
    drawn: np.ndarray = point * factor
    return drawn


def _draws(values: np.ndarray, q: float, rng: np.random.Generator) -> np.ndarray | None:
    """``DRAWS`` bootstrap values of the ``q``-th percentile; None where the sample cannot bound
    it (below ``bounded_above_from(q)`` values, 368 for a p99, any interval would be too narrow)."""
    n = values.size
    if n < max(2, bounded_above_from(q)):
        return None
    if n <= RESAMPLE_UP_TO:
        drawn: np.ndarray = np.percentile(values[rng.integers(0, n, size=(DRAWS, n))], q, axis=1)
        return drawn
    ordered = np.sort(values)
    p = q / 100
    ranks = np.rint(p * (n - 1) + math.sqrt(n * p * (1 - p)) * rng.standard_normal(DRAWS)).astype(np.int64)
    return ordered[np.clip(ranks, 0, n - 1)]


def _change(
    metric: Metric, base_cell: CellSummary, cell: CellSummary, base: Sequence[RequestRecord],
    run: Sequence[RequestRecord], rng: np.random.Generator, min_change: float,
) -> Change:
    b_draws = draws = None
    if metric.q is None:  # the figures as each summary gives them
        point_b, point = getattr(base_cell.metrics, metric.key, None), getattr(cell.metrics, metric.key, None)
        if point_b and point:
            b_draws = _rate_draws(base, metric, point_b, base_cell.open_loop, rng)
            draws = _rate_draws(run, metric, point, cell.open_loop, rng)
    else:
        b_vals, vals = _values(base, metric), _values(run, metric)
        point_b = float(np.percentile(b_vals, metric.q)) if b_vals.size else None
        point = float(np.percentile(vals, metric.q)) if vals.size else None
        if metric.key.startswith("itl"):
            b_draws, draws = _itl_draws(base, metric.q, rng), _itl_draws(run, metric.q, rng)
        else:
            b_draws, draws = _draws(b_vals, metric.q, rng), _draws(vals, metric.q, rng)
    if point_b is None or point is None or point_b <= 0:
        return Change(metric.key, metric.label, point_b, point, None, None, None, UNKNOWN)
    change = point / point_b - 1
    if b_draws is None or draws is None:
        return Change(metric.key, metric.label, point_b, point, change, None, None, FEW)
    low = high = None
    if (b_draws > 0).all():
        low, high = (float(x) for x in np.percentile(draws / b_draws - 1, (2.5, 97.5)))
    significant = low is not None and high is not None and (low > 0 or high < 0) and abs(change) >= min_change
    if not significant:
        verdict = SAME
    else:
        verdict = BETTER if (change > 0) == metric.higher_is_better else WORSE
    return Change(metric.key, metric.label, point_b, point, change, low, high, verdict)

