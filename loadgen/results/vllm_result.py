"""vLLM's ``bench serve`` result JSON, computed from a cell's records with vLLM's definitions.

- ``total_input_tokens``: the server's ``usage.prompt_tokens`` of each request where it sent
  usage (as vLLM's client takes it), else the length the client counted.
- ``ttfts``, ``latencies``: from the request's send; ``itls``: the raw gaps between
  token-bearing chunks (vLLM's ITL, one gap per chunk, not per token); ``tpot``:
  (latency - ttft) / (output tokens - 1) for requests of more than one token.
- ``duration``: from the first request's scheduled start to the last request's end.
- ``max_output_tokens_per_s``: tokens per whole second after the first send, as vLLM buckets
  them; ``max_concurrent_requests``: the most requests in flight at one instant (vLLM 0.32
  counted the requests running at any time within a whole second, which can exceed the
  concurrency cap; ``peak_concurrent_per_second`` keeps that figure for comparison).
- ``client_queue_time``: the wait for a concurrency slot (with ``--max-concurrency``);
  ``e2el_including_client_queue``: that wait plus E2E latency (with a finite request rate).
- goodput: requests meeting every ``--goodput`` objective (a 1-token answer's TPOT is 0).
- ``generated_texts``: loadgen does not keep answers (empty strings).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from loadgen.results.records import RequestRecord

# vLLM's result JSON: its keys follow the flags (the percentiles and metrics asked for, --metadata)
VllmResult = dict[str, Any]


def _stats(values: list[float], name: str, percentiles: list[float], out: VllmResult) -> None:
    arr = np.asarray(values or [0.0], dtype=np.float64) * 1000
    out[f"mean_{name}_ms"] = float(np.mean(arr))
    out[f"median_{name}_ms"] = float(np.median(arr))
    out[f"std_{name}_ms"] = float(np.std(arr))
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(arr, p))


def _gaps(r: RequestRecord) -> list[float]:
    offs = r.chunk_offsets_s
    return [b - a for a, b in zip(offs, offs[1:], strict=False)]


def exact_peak(ok: list[RequestRecord]) -> int:
    """The most requests in flight at one instant (a request ending as another starts is not
    counted twice)."""
    events = sorted([(r.sent_at, 1) for r in ok if r.sent_at is not None]
                    + [(r.done_at, -1) for r in ok if r.done_at is not None])
    peak = running = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def _peaks(ok: list[RequestRecord]) -> tuple[float, int]:
    if not ok:
        return 0.0, 0
    start = min(r.sent_at for r in ok if r.sent_at is not None)
    end = max(r.done_at for r in ok if r.done_at is not None)
    n = int(math.ceil(end - start)) + 1
    tokens = np.zeros(n)
    running = np.zeros(n)
    for r in ok:
        assert r.sent_at is not None
        assert r.done_at is not None
        for off, k in zip(r.chunk_offsets_s, r.chunk_tokens, strict=False):
            b = int(r.sent_at + off - start)
            if 0 <= b < n:
                tokens[b] += k
        for b in range(int(r.sent_at - start), min(int(r.done_at - start), n - 1) + 1):
            running[b] += 1
    return float(tokens.max()), int(running.max())


def vllm_result(
    records: list[RequestRecord], *, percentile_metrics: list[str], percentiles: list[float],
    goodput: dict[str, float] | None, max_concurrency: int | None, detailed: bool, lead_s: float = 0.0,
    request_rate: float = math.inf,
) -> VllmResult:
    """The benchmark part of vLLM's result JSON (the header fields are the caller's); its
    duration runs from the start of the benchmark, ``lead_s`` before the first request was due
    (vLLM's pacing waits a drawn gap before it), to the last answer, as vLLM measures it."""
    measured = sorted((r for r in records if not r.warmup), key=lambda r: r.request_id)
    ok = [r for r in measured if r.ok and r.first_token_at is not None and r.sent_at is not None]
    good_ids = {id(r) for r in ok}
    start = min((r.scheduled_at for r in measured), default=0.0) - lead_s
    end = max((r.done_at for r in measured if r.done_at is not None), default=start)
    duration = max(end - start, 1e-9)

    def prompt_len(r: RequestRecord) -> int:
        return r.prompt_tokens if r.prompt_tokens is not None else (r.input_tokens or 0)

    ttft = {id(r): r.ttft_s or 0.0 for r in ok}
    latency = {id(r): (r.done_at or r.last_token_at or 0.0) - r.sent_at for r in ok}  # type: ignore[operator]
    tpots = {id(r): (latency[id(r)] - ttft[id(r)]) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0 for r in ok}
    total_input = sum(prompt_len(r) for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    out: VllmResult = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(measured) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
    }
    if goodput:
        limits = {k: v / 1000 for k, v in goodput.items()}
        good = sum(
            1 for r in ok
            if ttft[id(r)] <= limits.get("ttft", math.inf) and tpots[id(r)] <= limits.get("tpot", math.inf)
            and latency[id(r)] <= limits.get("e2el", math.inf)
        )
        out["request_goodput"] = good / duration
    if detailed:
        out.update({
            "input_lens": [prompt_len(r) for r in measured],
            "output_lens": [r.output_tokens if id(r) in good_ids else 0 for r in measured],
            "ttfts": [ttft.get(id(r), 0.0) for r in measured],
            "itls": [_gaps(r) if id(r) in good_ids else [] for r in measured],
            "latencies": [latency.get(id(r), 0.0) for r in measured],
            "start_times": [r.sent_at or r.scheduled_at for r in measured],
            "queue_times": [r.slot_wait_s for r in measured],
            "generated_texts": ["" for _ in measured],
            "errors": ["" if r.ok else f"{r.error}: {r.error_detail or ''}".strip() for r in measured],
        })
    peak_tokens, peak_running = _peaks(ok)
    out["max_output_tokens_per_s"] = peak_tokens
    out["max_concurrent_requests"] = exact_peak(ok)
    out["peak_concurrent_per_second"] = peak_running
    out["rtfx"] = 0.0
    values = {
        "ttft": list(ttft.values()),
        "tpot": [tpots[id(r)] for r in ok if r.output_tokens > 1],
        "itl": [g for r in ok for g in _gaps(r)],
        "e2el": list(latency.values()),
    }
    for name in ("ttft", "tpot", "itl", "e2el"):
        if name in percentile_metrics:
            _stats(values[name], name, percentiles, out)
    if max_concurrency is not None and "client_queue_time" in percentile_metrics:
        _stats([r.slot_wait_s for r in ok], "client_queue_time", percentiles, out)
    if (max_concurrency is not None and not math.isinf(request_rate)
            and "e2el_including_client_queue" in percentile_metrics):
        _stats([latency[id(r)] + r.slot_wait_s for r in ok], "e2el_including_client_queue", percentiles, out)
    return out


def result_text(result: VllmResult, metrics: list[str]) -> str:
    """The result block ``vllm bench serve`` prints, line for line (scripts read it)."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value: Any, fmt: str = "{:<10.2f}") -> None:
        lines.append(f"{label:<40} " + fmt.format(value))

    row("Successful requests:", result["completed"], "{:<10}")
    row("Failed requests:", result["failed"], "{:<10}")
    if result.get("max_concurrency") is not None:
        row("Maximum request concurrency:", result["max_concurrency"], "{:<10}")
    if isinstance(result.get("request_rate"), (int, float)):
        row("Request rate configured (RPS):", result["request_rate"])
    row("Benchmark duration (s):", result["duration"])
    row("Total input tokens:", result["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", result["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", result["request_throughput"])
    if result.get("request_goodput") is not None:
        row("Request goodput (req/s):", result["request_goodput"])
    row("Output token throughput (tok/s):", result["output_throughput"])
    row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"])
    row("Peak concurrent requests:", result["max_concurrent_requests"])
    row("Total token throughput (tok/s):", result["total_token_throughput"])
    headers = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
               "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency"),
               "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
               "e2el_including_client_queue": ("E2EL incl. Client Queue", "Queue-inclusive End-to-end Latency")}
    for key in headers:
        if key not in metrics or f"mean_{key}_ms" not in result:
            continue
        short, header = headers[key]
        lines.append("{s:{c}^{n}}".format(s=header, n=50, c="-"))
        row(f"Mean {short} (ms):", result[f"mean_{key}_ms"])
        row(f"Median {short} (ms):", result[f"median_{key}_ms"])
        for name, value in result.items():
            if (name.startswith("p") and name.endswith(f"_{key}_ms") and name[1].isdigit()
                    and name.split("_", 1)[1] == f"{key}_ms"):
                row(f"P{name[1:].split('_')[0]} {short} (ms):", value)
    lines.append("=" * 50)
    return "\n".join(lines)
