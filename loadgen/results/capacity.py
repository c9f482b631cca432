"""Capacity under SLOs: a probe's figures against the objectives, the search's next probe, and
the answer (the most load meeting every objective, and which objective binds above it).

Everything here is a function of records and cell summaries, so ``loadgen report`` re-derives
a search's answer from its run directory alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from loadgen.data import Labels
from loadgen.results.cellstatus import EarlyStop
from loadgen.results.intervals import bounded_above_from, mean_interval, percentile_interval, share_interval
from loadgen.results.metrics import itl_values
from loadgen.results.probe import CapacityAnswer, ProbeResult, ProbeRow
from loadgen.results.records import RequestRecord
from loadgen.results.summary import CellSummary
from loadgen.scenario.matrix import Cell
from loadgen.scenario.shapes import SLO_METRICS, Search, SearchSlo, stat_quantile

ERROR_RATE = "error_rate"
QUEUE = "queue"  # an early stop on the server's growing queue, not on a figure


def objective_key(metric: str, stat: str) -> str:
    """``("ttft_ms", "p99")`` -> ``"ttft_ms.p99"``: how figures and broken objectives are named."""
    return f"{metric}.{stat}"


def objective_label(key: str) -> str:
    """``"tpot_ms.p99"`` -> ``"TPOT p99"``; ``"error_rate"`` -> ``"error rate"``."""
    if key == ERROR_RATE:
        return "error rate"
    if key == QUEUE:
        return "the server's queue"
    metric, _, stat = key.partition(".")
    return f"{SLO_METRICS.get(metric, metric)} {stat}"


def latency_values(records: Sequence[RequestRecord], metric: str) -> np.ndarray:
    """The values (ms) an objective on ``metric`` is computed over, from successful requests."""
    ok = [r for r in records if r.answered and r.sent_at is not None]
    if metric == "ttft_ms":
        vals: Iterable[float] = (v for r in ok if (v := r.ttft_s) is not None)
    elif metric == "tpot_ms":
        vals = (v for r in ok if (v := r.tpot_s) is not None)
    elif metric == "e2e_ms":
        vals = (v for r in ok if (v := r.e2e_s) is not None)
    else:
        return np.concatenate([itl_values(r) for r in ok]) * 1e3 if ok else np.empty(0)
    return np.fromiter(vals, dtype=np.float64) * 1e3


def statistic(values: np.ndarray, stat: str) -> float | None:
    if values.size == 0:
        return None
    q = stat_quantile(stat)
    if q is not None:
        return float(np.percentile(values, q))
    return float(values.mean() if stat == "mean" else values.max())


def counted(records: Iterable[RequestRecord]) -> tuple[int, int]:
    """(requests that ended, those that failed) among measured ones; cancelled ones are not counted."""
    ended = failed = 0
    for r in records:
        if r.warmup or r.error == "cancelled":
            continue
        ended += 1
        failed += not r.answered
    return ended, failed


def slo_figures(records: Sequence[RequestRecord], slo: SearchSlo) -> dict[str, float | None]:
    """Each objective's figure over a probe's measured records: latencies in ms, the error rate a share."""
    measured = [r for r in records if not r.warmup]
    out: dict[str, float | None] = {}
    cache: dict[str, np.ndarray] = {}
    for metric, stat, _ in slo.bounds():
        if metric not in cache:
            cache[metric] = latency_values(measured, metric)
        out[objective_key(metric, stat)] = statistic(cache[metric], stat)
    if slo.error_rate is not None:
        ended, failed = counted(measured)
        out[ERROR_RATE] = failed / ended if ended else None
    return out


def interval(values: np.ndarray, stat: str) -> tuple[float, float] | None:
    """95% interval of a statistic's true value, an end the sample cannot bound at 95% (too few
    values for that percentile) being the sample's own extreme there (a maximum: the sample's,
    which bounds it from below only)."""
    if values.size == 0:
        return None
    q = stat_quantile(stat)
    if q is not None:
        low, high = percentile_interval(values, q)
        return (float(values.min()) if math.isinf(low) else low), (float(values.max()) if math.isinf(high) else high)
    if stat == "mean":
        return mean_interval(values)
    top = float(values.max())
    return top, top


def slo_ranges(records: Sequence[RequestRecord], slo: SearchSlo) -> tuple[dict[str, tuple[float, float] | None],
                                                                         list[str]]:
    """Each objective's figure as a 95% interval (see ``loadgen.results.intervals``), and the
    percentile objectives whose upper end is only the slowest request's, too few having been
    measured to bound it; ITL objectives pool every gap, which are not independent draws:
    their intervals are narrower than the truth's."""
    measured = [r for r in records if not r.warmup]
    out: dict[str, tuple[float, float] | None] = {}
    edge: list[str] = []
    cache: dict[str, np.ndarray] = {}
    for metric, stat, _ in slo.bounds():
        if metric not in cache:
            cache[metric] = latency_values(measured, metric)
        key = objective_key(metric, stat)
        out[key] = interval(cache[metric], stat)
        q = stat_quantile(stat)
        if q is not None and 0 < cache[metric].size < bounded_above_from(q):
            edge.append(key)
    if slo.error_rate is not None:
        ended, failed = counted(measured)
        out[ERROR_RATE] = share_interval(failed, ended) if ended else None
    return out, edge


def broken(figures: dict[str, float | None], slo: SearchSlo) -> list[str]:
    """The objectives a probe's figures break (a figure that could not be computed breaks its objective)."""
    out = []
    for metric, stat, bound in slo.bounds():
        value = figures.get(objective_key(metric, stat))
        if value is None or value > bound:
            out.append(objective_key(metric, stat))
    if slo.error_rate is not None:
        rate = figures.get(ERROR_RATE)
        if rate is None or rate > slo.error_rate:
            out.append(ERROR_RATE)
    return out


def bound_of(key: str, slo: SearchSlo) -> float | None:
    if key == ERROR_RATE:
        return slo.error_rate
    metric, _, stat = key.partition(".")
    return (getattr(slo, metric, None) or {}).get(stat) if metric in SLO_METRICS else None


def goodput_count(records: Sequence[RequestRecord], slo: SearchSlo) -> int:
    """Requests meeting every per-request latency bound (TTFT, TPOT, E2E: the tightest bound
    given for each); ITL objectives are over pooled gaps and bound no single request."""
    limits = slo.request_limits()
    return sum(1 for r in records if not r.warmup and r.ok and r.meets(limits))


def first_wave(cell: Cell) -> int:
    """The first wave of a concurrency search's probe: its concurrency (0 for anything else)."""
    point = cell.point
    search = point.load.search
    if (search is None or search.by != "concurrency" or cell.rate is not None or cell.concurrency is None
            or point.workload.multi_turn is not None):
        return 0
    return int(cell.concurrency)


def after_first_wave(records: Sequence[RequestRecord], wave: int) -> tuple[list[RequestRecord], int]:
    """The requests a closed loop's verdict is judged on, and how many were left out: its first
    ``wave`` requests (sent at once, every prompt prefilled together: a burst the loop never
    sees again) are not, where at least as many again follow."""
    measured = [r for r in records if not r.warmup]
    if wave <= 0 or len(measured) < 2 * wave:
        return measured, 0
    # the first sent, not the lowest numbered: Locust's master numbers records as its workers'
    # reports arrive, across the whole run (loadgen run's closed loop numbers them as sent)
    never = float("inf")
    by_send = sorted(measured, key=lambda r: (never if r.sent_at is None else r.sent_at, r.request_id))
    first = {id(r) for r in by_send[:wave]}
    kept = [r for r in measured if id(r) not in first]
    return kept, len(measured) - len(kept)


def probe_entry(
    search: int, search_spec: Search, value: float, records: Sequence[RequestRecord], status: str,
    stopped_early: EarlyStop | None, duration_s: float | None, wave: int = 0,
) -> ProbeResult:
    """``summary.json: cells[].probe``: what the probe measured against the objectives (over
    the requests after a closed loop's first ``wave``)."""
    slo = search_spec.slo
    judged, left_out = after_first_wave(records, wave)
    figures = slo_figures(judged, slo)
    ranges, edge = slo_ranges(judged, slo)
    broke = broken(figures, slo)
    if stopped_early is not None and stopped_early.objective not in broke:
        broke.append(stopped_early.objective)
    good = goodput_count(records, slo)
    return ProbeResult(
        search=search, by=search_spec.by, value=value, figures=figures, broken=tuple(broke),
        meets_slo=status == "done" and not broke and stopped_early is None, stopped_early=stopped_early,
        goodput=good / duration_s if duration_s else None, ramp_left_out=left_out,
        ranges={k: None if v is None else (round(v[0], 6), round(v[1], 6)) for k, v in ranges.items()},
        at_edge=tuple(edge),
    )


def verdicts(results: Sequence[tuple[float, bool]]) -> list[tuple[float, bool]]:
    """One verdict per probed value, in first-probe order: it meets the SLOs where more than
    half of its probes did (a value measured once: that probe's verdict)."""
    met: Counter[float] = Counter()
    seen: Counter[float] = Counter()
    for v, ok in results:
        seen[v] += 1
        met[v] += ok
    return [(v, 2 * met[v] > n) for v, n in seen.items()]


def next_value(search: Search, results: Sequence[tuple[float, bool]]) -> float | None:
    """The next value to probe after ``results`` ((value, met the SLOs) in probe order), or
    None when the boundary is bracketed: double from ``min`` until a probe breaks an SLO or
    ``max`` meets them, then bisect (halves in concurrency, geometric means in rate); with
    ``confirm``, then measure the values either side of the boundary again."""
    merged = verdicts(results)
    nxt = _bisect(search, merged)
    if nxt is not None or not search.confirm or not merged:
        return nxt
    times = Counter(v for v, _ in results)
    for value in bracket(merged):
        if value is not None and times[value] < 1 + search.confirm:
            return value
    return None


def _bisect(search: Search, results: Sequence[tuple[float, bool]]) -> float | None:
    conc = search.by == "concurrency"
    if not results:
        return float(int(search.min)) if conc else search.min
    lo, hi = bracket(results)
    if hi is None:
        assert lo is not None
        if lo >= search.max:
            return None
        nxt = min(lo * 2, search.max)
    elif lo is None:
        return None  # min itself breaks them
    elif conc:
        if hi - lo <= 1:
            return None
        nxt = float((int(lo) + int(hi)) // 2)
    else:
        if hi / lo <= 1 + search.rate_tolerance:
            return None
        nxt = float(f"{math.sqrt(lo * hi):.4g}")
    if conc:
        nxt = float(int(nxt))
    return None if any(v == nxt for v, _ in results) else nxt


def bracket(results: Sequence[tuple[float, bool]]) -> tuple[float | None, float | None]:
    """(highest value meeting the SLOs below the lowest breaking one, the lowest breaking one);
    a probe that met them above one that broke them is not trusted."""
    fails = [v for v, ok in results if not ok]
    hi = min(fails) if fails else None
    passes = [v for v, ok in results if ok and (hi is None or v < hi)]
    return (max(passes) if passes else None), hi


def _figure_text(key: str, value: float | None, bound: float | None) -> str:
    if value is None or bound is None:
        return "no figure"
    if key == ERROR_RATE:
        return f"{value:.1%} > {bound:.1%}"
    return f"{value:.2f} ms > {bound:g} ms"


def _load_text(by: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{int(value)}" if by == "concurrency" else f"{value:.4g} req/s"


def capacity_of(index: int, spec: Search, labels: Labels, probes: Sequence[CellSummary]) -> CapacityAnswer:
    """One search's answer from its probes (cell summaries with ``probe``), in probe order."""
    # an interrupted probe has no verdict: a resumed run measures it again
    done = sorted(
        ((p, p.probe) for p in probes if p.probe is not None and p.status in ("done", "failed")),
        key=lambda pair: pair[0].cell,
    )
    results = [(r.value, r.meets_slo) for _, r in done]
    merged = dict(verdicts(results))
    lo, hi = bracket(list(merged.items())) if results else (None, None)
    # a value probed more than once stands for its last probe that agrees with its verdict
    at = {r.value: (p, r) for p, r in done if merged[r.value] == r.meets_slo}
    limiting: tuple[str, ...] = ()
    binds = ""  # "TPOT p99 binds at 22 (20.50 ms > 20.25 ms)"
    if hi is not None:
        entry = at[hi][1]
        limiting, early = entry.broken, entry.stopped_early
        where = _load_text(spec.by, hi)
        if limiting:
            names = " and ".join(objective_label(k) for k in limiting)
            why = "; ".join(
                (early.reason if early is not None else "it kept growing") if k == QUEUE
                else _figure_text(k, entry.figures.get(k), bound_of(k, spec.slo)) for k in limiting
            )
            binds = f"{names} {'binds' if len(limiting) == 1 else 'bind'} at {where} ({why})"
        else:
            binds = f"the probe at {where} failed ({at[hi][0].reason})"
        if early is not None:
            binds += ", stopped early"
    best = at[lo] if lo is not None else None
    m = best[0].metrics if best is not None else None
    complete = bool(results) and next_value(spec, results) is None
    word = spec.by
    if not results:
        answer = f"search by {word}: no probe measured yet"
    elif lo is None and hi is not None:
        answer = f"no {word} in {_load_text(word, spec.min)}..{_load_text(word, spec.max)} meets the SLOs: {binds}"
    elif hi is None:
        answer = f"max {word} meeting the SLOs: {_load_text(word, lo)}"
        if complete:
            answer += " (the top of the search range: the SLOs were met all the way)"
    else:
        answer = f"max {word} meeting the SLOs: {_load_text(word, lo)}; {binds}"
    if results and not complete:
        answer = f"search unfinished ({len(results)} probes): " + answer
    likely = likely_range(spec, lo, hi, done)
    # a probe whose client or engine other programs starved has no sure verdict: its figures
    # hold their delay, and a quiet machine may well have judged it otherwise
    quiet = likely_range(spec, lo, hi, done, trust_starved=True)
    widened = tuple(r.value for p, r in done if ran_starved(p)) if likely != quiet else ()
    margin = margin_of(spec, lo, best[1] if best is not None else None, likely, results, widened)
    return CapacityAnswer(
        search=index, labels=labels, by=word, min=spec.min, max=spec.max,
        slo=spec.slo.model_dump(exclude_none=True, exclude_defaults=True),
        max_meeting_slo=lo, limiting_slo=limiting, binds_at=hi, complete=complete,
        goodput=best[1].goodput if best is not None else None,
        request_throughput=m.request_throughput if m else None,
        output_throughput=m.output_throughput if m else None,
        answer=answer,
        probes=tuple(
            ProbeRow(
                cell=p.cell, value=r.value, meets_slo=r.meets_slo, figures=r.figures, broken=r.broken,
                stopped_early=r.stopped_early, status=p.status,
                request_throughput=p.metrics.request_throughput if p.metrics else None,
                output_throughput=p.metrics.output_throughput if p.metrics else None, goodput=r.goodput,
            )
            for p, r in done
        ),
        margin=margin, likely=likely,
    )


# an answer whose probe came this close to an objective is said to be near it: measured again,
# the search may well answer one step lower
NEAR = 0.95


def sure(result: ProbeResult, spec: Search) -> bool:
    """Whether a probe's verdict holds at 95%: met, every objective's interval is within its
    bound; broken, some broken objective's interval is wholly over it (or it stopped early,
    which takes a figure certain or twice its bound)."""
    if result.stopped_early is not None:
        return True
    keys = result.figures.keys() if result.meets_slo else result.broken
    inside = []
    for key in keys:
        span, bound = result.ranges.get(key), bound_of(key, spec.slo)
        if key == ERROR_RATE and result.figures.get(key) == 0:
            # no request failed: clear of any error-rate bound (an interval would ask hundreds of
            # requests to show a 1% bound held)
            inside.append(result.meets_slo)
            continue
        if span is None or bound is None:
            inside.append(not result.meets_slo)  # no figure: broken for sure, met it cannot be
            continue
        inside.append(span[1] <= bound if result.meets_slo else span[0] > bound)
    return all(inside) if result.meets_slo else any(inside)


def ran_starved(cell: CellSummary) -> bool:
    """Whether a cell ran with its client not keeping up (its self-check's verdict) or its
    engine starved by other programs: its figures hold that delay."""
    return (cell.client is not None and cell.client.verdict != "ok") or (
        cell.engine_cores is not None and cell.engine_cores.starved)


def likely_range(spec: Search, lo: float | None, hi: float | None, done: Sequence[tuple[CellSummary, ProbeResult]],
                 *, trust_starved: bool = False) -> tuple[float, float] | None:
    """Where the answer lies, judged on the probes' 95% intervals: down to the highest value
    whose every probe surely met the SLOs (or ``min``), up to the highest probed value not
    surely broken below the lowest surely broken one. A starved probe's verdict is never sure
    (unless ``trust_starved``)."""
    if lo is None:
        return None
    surely = {id(r) for p, r in done if sure(r, spec) and (trust_starved or not ran_starved(p))}
    met_surely = [r.value for _, r in done if r.meets_slo and r.value <= lo and id(r) in surely]
    unsure_met = {r.value for _, r in done if r.meets_slo and id(r) not in surely}
    low = max((v for v in met_surely if v not in unsure_met), default=spec.min)
    broken_surely = [r.value for _, r in done if not r.meets_slo and id(r) in surely]
    ceiling = min(broken_surely, default=math.inf)
    high = max([lo, *(r.value for _, r in done if lo < r.value < ceiling)])
    if hi is None:
        high = lo
    return min(low, lo), high


def margin_of(spec: Search, value: float | None, result: ProbeResult | None,
              likely: tuple[float, float] | None = None, results: Sequence[tuple[float, bool]] = (),
              widened: Sequence[float] = ()) -> str:
    """How sure the answer is, in words: where it likely lies (``widened``: the starved probes
    that widened it), how close the answer's probe came to its tightest objective, and the
    repeated probes' tallies."""
    if value is None or result is None:
        return ""
    parts = []
    if likely is not None:
        low, high = likely
        if low == high == value:
            parts.append("every probe's 95% interval is clear of the bounds")
        elif widened:
            at = ", ".join(_load_text(spec.by, v) for v in sorted(set(widened)))
            parts.append(f"likely {_load_text(spec.by, low)} to {_load_text(spec.by, high)} (the probes at {at} ran "
                         "with the client behind or the engine starved (their self-check): their verdicts are unsure)")
        else:
            parts.append(f"likely {_load_text(spec.by, low)} to {_load_text(spec.by, high)} "
                         "(the probes' 95% intervals straddle a bound)")
    shares = []
    for key, figure in result.figures.items():
        bound = bound_of(key, spec.slo)
        if figure is not None and bound:
            shares.append((figure / bound, key, figure, bound))
    if shares:
        share, key, figure, bound = max(shares)
        shown = f"{figure:.1%} of {bound:.1%}" if key == ERROR_RATE else f"{figure:.2f} ms against {bound:g} ms"
        parts.append(f"at {_load_text(spec.by, value)} {objective_label(key)} was {shown} ({share:.0%} of its bound"
                     + (f", within {1 - NEAR:.0%})" if share >= NEAR else ")"))
    # the objective closest to its bound first
    closeness = {key: share for share, key, _, _ in shares}
    for key in sorted(result.at_edge, key=lambda k: -closeness.get(k, 0.0))[:1]:
        q = stat_quantile(key.partition(".")[2])
        assert q is not None
        parts.append(f"{objective_label(key)}'s upper end is the slowest request's until a probe has "
                     f"{bounded_above_from(q)} requests (after the first wave): raise num_prompts for a surer answer")
    times = Counter(v for v, _ in results)
    tallies = [f"{_load_text(spec.by, v)} met {sum(ok for w, ok in results if w == v)} of {n}"
               for v, n in sorted(times.items()) if n > 1]
    if tallies:
        parts.append("probed again: " + ", ".join(tallies))
    return "margin: " + "; ".join(parts)
