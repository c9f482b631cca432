"""Aggregation: records -> the metrics of one cell, exactly as design.md defines them.

All inputs and outputs are in seconds; renderers convert. Warmup records are excluded;
failed requests are counted by class and never folded into latency or throughput figures;
cancelled requests (the run was stopped while they were in flight) are counted apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from loadgen.results.figures import ChunkDiscrepancy, Distribution, Reasoning
from loadgen.results.records import RequestRecord
from loadgen.results.summary import Breakdown, CellMetrics
from loadgen.results.toolcalls import ToolCalls
from loadgen.scenario.schema import Slo

PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)


def distribution(values: Iterable[float] | np.ndarray) -> Distribution:
    """mean, min, max, population std and linear-interpolated percentiles (numpy's default)."""
    arr = np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.float64)
    if arr.size == 0:
        return Distribution()
    p50, p90, p95, p99, p99_9 = (float(v) for v in np.percentile(arr, PERCENTILES))
    return Distribution(
        mean=float(arr.mean()), min=float(arr.min()), max=float(arr.max()), std=float(arr.std()),
        p50=p50, p90=p90, p95=p95, p99=p99, p99_9=p99_9,
    )


def itl_values(record: RequestRecord) -> np.ndarray:
    """Gaps between consecutive token-bearing chunks, each divided by the later chunk's tokens."""
    if len(record.chunk_offsets_s) < 2:
        return np.empty(0)
    offsets = np.asarray(record.chunk_offsets_s, dtype=np.float64)
    tokens = np.asarray(record.chunk_tokens[1:], dtype=np.float64)
    return np.diff(offsets) / tokens


def _prompt_len(r: RequestRecord) -> int:
    if r.prompt_tokens is not None:
        return r.prompt_tokens
    return r.input_tokens or 0


def _group(measured: list[RequestRecord], key: str, value: int) -> Breakdown:
    """The cell's figures over the records whose ``key`` (turn, stage) is ``value``, with the
    prefix-cache hit rate from the server's per-answer cached_tokens, where it reports them."""
    rs = [r for r in measured if getattr(r, key) == value]
    reported = [r for r in rs if r.ok and r.cached_tokens is not None and r.prompt_tokens]
    cached = sum(r.cached_tokens or 0 for r in reported)
    prompt = sum(r.prompt_tokens or 0 for r in reported)
    return Breakdown(key, value, summarize(rs, breakdown=False), cached if reported else None,
                     cached / prompt if prompt else None)


def in_flight(records: Sequence[RequestRecord]) -> tuple[int, float | None]:
    """(the most requests in flight at once, the time-weighted mean from the first sent to the
    last ended); a request is in flight from its send to its end, whatever its outcome."""
    spans = [(r.sent_at, r.done_at) for r in records if r.sent_at is not None and r.done_at is not None]
    if not spans:
        return 0, None
    events = sorted([(s, 1) for s, _ in spans] + [(d, -1) for _, d in spans], key=lambda e: (e[0], e[1]))
    level = peak = 0
    area = 0.0
    last = events[0][0]
    for at, step in events:
        area += level * (at - last)
        last = at
        level += step
        peak = max(peak, level)
    span = events[-1][0] - events[0][0]
    return peak, (round(area / span, 3) if span > 0 else float(peak))


def summarize(
    records: Iterable[RequestRecord], slo: Slo | None = None, *, breakdown: bool = True, open_loop: bool = True,
    tools: bool = False,
) -> CellMetrics:
    """The metrics of one cell (``summary.json: cells[].metrics``); ``breakdown``: with the
    figures per turn and per stage where the records have them; ``open_loop``: requests were
    sent on a schedule (a rate), so TTFT from the schedule and the send lag mean lateness. In a
    closed loop a request's schedule is the moment the run started it, and the time it waited
    for a free slot is the concurrency limit at work: those figures are left empty. ``tools``:
    the requests offered tools, so the tool calls are counted even where no answer called one."""
    measured = [r for r in records if not r.warmup]
    # a success: an answer with tokens, or an embeddings answer with its vectors
    ok = [r for r in measured if r.answered]
    # a successful stream with no token at all cannot give latency figures: count it apart
    empty = [r for r in measured if r.ok and r.first_token_at is None and not r.embeddings]
    failed = [r for r in measured if not r.ok and r.error != "cancelled"]
    cancelled = sum(1 for r in measured if r.error == "cancelled")
    by_class: Counter[str] = Counter(r.error or "" for r in failed)
    if empty:
        by_class["no_tokens"] = len(empty)

    sent = [r.sent_at for r in measured if r.sent_at is not None]
    done = [r.done_at for r in ok if r.done_at is not None]
    duration = (max(done) - min(sent)) if done and sent else 0.0
    output_total = sum(r.output_tokens for r in ok)
    prompt_total = sum(_prompt_len(r) for r in ok)

    def per_s(x: float) -> float | None:
        return x / duration if duration > 0 else None

    sources = {r.token_count_source for r in ok}
    prompt_checked = [r for r in ok if r.prompt_tokens is not None and r.input_tokens is not None]
    prompt_drift = [r.prompt_tokens - r.input_tokens for r in prompt_checked]  # type: ignore[operator]
    chunk_diff = [r.chunk_tokens_total - r.output_tokens for r in ok]

    metrics = CellMetrics(
        requests=len(measured),
        completed=len(ok),
        failed=len(failed) + len(empty),
        cancelled=cancelled,
        failures_by_class=dict(sorted(by_class.items())),
        throughput_over="successful requests",
        duration_s=duration,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(output_total),
        total_token_throughput=per_s(output_total + prompt_total),
        prompt_tokens_total=prompt_total,
        output_tokens_total=output_total,
        token_count_source=sources.pop() if len(sources) == 1 else ("mixed" if sources else None),
        prompt_tokens_checked=len(prompt_checked),
        prompt_tokens_mismatched=sum(1 for d in prompt_drift if d != 0),
        prompt_tokens_drift_mean=float(np.mean(prompt_drift)) if prompt_drift else None,
        output_tokens_short=sum(1 for r in ok if r.output_tokens != r.max_tokens and not r.embeddings),
        chunk_token_discrepancy=ChunkDiscrepancy(
            requests=sum(1 for d in chunk_diff if d != 0), tokens=int(sum(abs(d) for d in chunk_diff)),
        ),
        ttft_s=distribution(v for r in ok if (v := r.ttft_s) is not None),
        ttft_from_schedule_s=distribution(
            v for r in (ok if open_loop else ()) if (v := r.ttft_from_schedule_s) is not None
        ),
        tpot_s=distribution(v for r in ok if (v := r.tpot_s) is not None),
        itl_s=distribution(
            np.concatenate([itl_values(r) for r in ok]) if ok else np.empty(0)
        ),
        e2e_s=distribution(v for r in ok if (v := r.e2e_s) is not None),
        # the client's own lateness: from the schedule (or the free slot) to the request on the wire
        send_lag_s=distribution(
            r.sent_at - r.scheduled_at - r.slot_wait_s for r in measured if r.sent_at is not None and open_loop
        ),
        # waiting for a free concurrency slot (the concurrency limit), not the client's lateness
        slot_wait_s=distribution(r.slot_wait_s for r in measured if r.sent_at is not None),
        # Qwen's single-stream "Speed(tokens/s)": output tokens over the whole request time
        speed_tokens_per_s=distribution(
            r.output_tokens / e2e for r in ok if (e2e := r.e2e_s) is not None and e2e > 0
        ),
        # the newer definition: (prompt + output tokens) over the whole request time
        speed_total_tokens_per_s=distribution(
            (r.output_tokens + _prompt_len(r)) / e2e for r in ok if (e2e := r.e2e_s) is not None and e2e > 0
        ),
    )
    if retries := sum(r.retries for r in measured):
        metrics = replace(metrics, connection_retries=retries)
    peak, mean = in_flight(measured)
    metrics = replace(metrics, peak_in_flight=peak, mean_in_flight=mean)
    calls = [r for r in ok if r.first_tool_call_at is not None and r.sent_at is not None]
    expected = [r.expected_tool_call for r in ok if r.expected_tool_call is not None]
    if calls or expected or (tools and ok):
        waits = distribution(r.first_tool_call_at - r.sent_at for r in calls)  # type: ignore[operator]
        metrics = replace(metrics, tool_calls=ToolCalls(len(calls), sum(r.tool_call_tokens for r in calls), {
            k: waits.get(k) for k in ("mean", "p50", "p90", "p99")}, len(expected),
            sum(expected) / len(expected) if expected else None))
    if vectors := sum(r.embeddings for r in ok):
        metrics = replace(metrics, embeddings_per_s=per_s(vectors))
    if images := sum(r.image_bytes for r in measured if r.sent_at is not None):
        metrics = replace(metrics, image_bytes_total=images)
    if checked := [r.valid_json for r in ok if r.valid_json is not None]:
        cut = sum(1 for r in ok if r.valid_json is False and r.max_tokens and r.output_tokens >= r.max_tokens)
        metrics = replace(metrics, valid_json=sum(checked) / len(checked), json_cut=cut)
    thinking = [r for r in ok if r.reasoning_tokens > 0]
    if thinking:
        metrics = replace(metrics, reasoning=Reasoning(
            len(thinking), sum(r.reasoning_tokens for r in thinking),
            float(np.mean([r.reasoning_tokens for r in thinking])),
            # TTFT is the first token of any kind; this is the first token of the answer
            distribution(
                r.first_answer_at - r.sent_at for r in thinking
                if r.first_answer_at is not None and r.sent_at is not None
            ),
        ))
    if breakdown and any(r.turn is not None for r in measured):
        metrics = replace(metrics, turns=tuple(_group(measured, "turn", t) for t in sorted(
            {r.turn for r in measured if r.turn is not None})))
    if breakdown and any(r.stage is not None for r in measured):
        metrics = replace(metrics, stages=tuple(_group(measured, "stage", t) for t in sorted(
            {r.stage for r in measured if r.stage is not None})))
    if slo is not None and any(v is not None for v in (slo.ttft_ms, slo.tpot_ms, slo.e2e_ms)):
        good = sum(1 for r in ok if r.meets(slo.limits()))
        # requests the run cancelled (stopped in flight) neither met nor missed an objective
        judged = len(measured) - cancelled
        metrics = replace(
            metrics, slo=slo.model_dump(exclude_none=True), slo_attained=good / judged if judged else None,
            goodput=per_s(good),
        )
    return metrics
