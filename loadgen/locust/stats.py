"""Live LLM statistics of a Locust run, from its records: requests, failures by class,
tokens, output tokens/s over the run and the last seconds, per user and per stream, exact
TTFT / TPOT / ITL / E2E percentiles, and a time series for the LLM tab's charts. The "LLM"
tab, ``/llm/stats``, ``/llm/history`` and ``PREFIX_llm.csv`` show them.
"""

from __future__ import annotations

import html
import re
import time
from array import array
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loadgen.results.metrics import itl_values
from loadgen.results.records import RequestRecord

# the request_type of loadgen's entries in Locust's statistics
LLM = "LLM"
ENTRIES: tuple[str, ...] = ("TTFT", "TPOT", "ITL", "E2E")


_VARYING = re.compile(r"[0-9A-Fa-f]*[0-9][0-9A-Fa-f]*(?:-[0-9A-Fa-f]+)*")


def failure_kind(detail: str) -> str:
    """A failure's message with its ids and long numbers (four characters or more) as ``#``:
    ``chatcmpl-9f2c41`` and ``chatcmpl-77ab01`` are one kind of failure, HTTP 503 and 500 two."""
    return _VARYING.sub(lambda m: "#" if len(m[0]) >= 4 else m[0], detail)


@dataclass
class _Counts:
    requests: int = 0
    failed: int = 0
    cancelled: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    first_sent: float | None = None
    last_done: float | None = None
    decode_s: float = 0.0  # sum over streams of (last token - first token)
    decode_tokens: int = 0  # sum over streams of (output tokens - 1)
    failures: Counter[str] = field(default_factory=Counter)
    # every successful request's figures (s), for exact percentiles: kept for the total only
    # (a worker's row would hold the same values a second time)
    keep_values: bool = False
    ttft: array[float] = field(default_factory=lambda: array("d"))
    tpot: array[float] = field(default_factory=lambda: array("d"))
    itl: array[float] = field(default_factory=lambda: array("d"))
    e2e: array[float] = field(default_factory=lambda: array("d"))
    # the last percentiles: (value counts, figures, when computed, how long that took in s)
    cached: tuple[tuple[int, ...], dict[str, float | None], float, float] | None = None

    def add(self, r: RequestRecord) -> None:
        if r.error == "cancelled":
            self.cancelled += 1
            return
        self.requests += 1
        if r.sent_at is not None:
            self.first_sent = r.sent_at if self.first_sent is None else min(self.first_sent, r.sent_at)
        if r.done_at is not None:
            self.last_done = r.done_at if self.last_done is None else max(self.last_done, r.done_at)
        if not r.ok:
            self.failed += 1
            self.failures[r.error or ""] += 1
            return
        self.output_tokens += r.output_tokens
        self.prompt_tokens += r.prompt_tokens or r.input_tokens or 0
        if r.first_token_at is not None and r.last_token_at is not None and r.output_tokens > 1:
            self.decode_s += r.last_token_at - r.first_token_at
            self.decode_tokens += r.output_tokens - 1
        if not self.keep_values:
            return
        if (ttft := r.ttft_s) is not None:
            self.ttft.append(ttft)
            self.itl.extend(itl_values(r).tolist())
        if (tpot := r.tpot_s) is not None:
            self.tpot.append(tpot)
        if (e2e := r.e2e_s) is not None:
            self.e2e.append(e2e)


PERCENTILES = ("ttft", "tpot", "itl", "e2e")
# a row of the LLM table (by CSV_COLUMNS' keys), or a point of its charts, as the web page gets it
Row = dict[str, str | int | float | None]


QUANTILES = (50, 90, 99)


def _ms(values: Any, q: float) -> float | None:
    return round(float(np.percentile(np.asarray(values), q)) * 1e3, 2) if len(values) else None


def percentiles(c: _Counts) -> dict[str, float | None]:
    """``ttft_p50_ms`` ... ``e2e_p99_ms``: exact, over every value kept (none for a worker's
    row); each metric read in place and partitioned once for its three quantiles."""
    key = tuple(len(getattr(c, k)) for k in PERCENTILES)
    now = time.monotonic()
    if c.cached is not None:
        old_key, old_out, at, cost = c.cached
        # nothing new since the last poll (a stopped run, a second browser tab), or a run so
        # long that sorting its values again now would take more than 5% of the master's time
        if old_key == key or now - at < 20 * cost:
            return old_out
    out: dict[str, float | None] = {}
    for k in PERCENTILES:
        values = getattr(c, k)
        qs = np.percentile(np.frombuffer(values, dtype=np.float64), QUANTILES) if len(values) else [None] * 3
        out |= {f"{k}_p{q}_ms": None if v is None else round(float(v) * 1e3, 2)
                for q, v in zip(QUANTILES, qs, strict=True)}
    c.cached = (key, out, now, time.monotonic() - now)
    return out


class LiveStats:
    """Output tokens per second, overall and over the last ``window_s``, per worker and in
    total, from records as they arrive (the master's view merges every worker's records).

    Tokens are counted when their chunk arrived, so the windowed rate is the rate tokens
    streamed, not the rate requests finished.
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._by_worker: dict[int, _Counts] = defaultdict(_Counts)
        self._total = _Counts(keep_values=True)
        self._buckets: Counter[int] = Counter()  # whole second of the run -> tokens streamed
        # the latest successful requests (done_at, record), for the charts' windowed figures
        self._recent: deque[tuple[float, RequestRecord]] = deque()
        self.history: list[Row] = []

    def add(self, r: RequestRecord) -> None:
        self._total.add(r)
        self._by_worker[r.worker].add(r)
        if r.ok and r.sent_at is not None:
            for offset, n in zip(r.chunk_offsets_s, r.chunk_tokens, strict=True):
                self._buckets[int(r.sent_at + offset)] += n
            if r.done_at is not None and r.first_token_at is not None:
                self._recent.append((r.done_at, r))

    def reset(self) -> None:
        self._by_worker.clear()
        self._total = _Counts(keep_values=True)
        self._buckets.clear()
        self._recent.clear()
        self.history.clear()

    def sample(self, now_s: float, users: int, lag_s: float = 0.0, keep: int = 3600) -> Row:
        """A point of the LLM tab's charts: users now, output tokens/s over the last
        ``window_s`` seconds, and requests/s, TTFT p50/p99, TPOT p50 and ITL p99 over a window of
        that length placed behind the longest recent request, so that every request that was
        in flight in it has ended and is counted (each for the share of it inside the window:
        users that start together do not make the rate jump with their waves)."""
        end = now_s - lag_s
        longest = max((done - (r.sent_at or done) for done, r in self._recent), default=0.0)
        w_end = end - longest
        w_start = w_end - self.window_s
        while self._recent and self._recent[0][0] < w_start:
            self._recent.popleft()
        window = [r for done, r in self._recent if done <= end]
        first = self._total.first_sent
        span = min(self.window_s, w_end - first) if first is not None else 0.0
        share = 0.0
        for r in window:
            sent, done = r.sent_at or 0.0, r.done_at or 0.0
            if done > sent:
                share += max(0.0, min(done, w_end) - max(sent, w_start)) / (done - sent)
        ttft = [v for r in window if (v := r.ttft_s) is not None]
        tpots = [v for r in window if (v := r.tpot_s) is not None]
        itl = np.concatenate([itl_values(r) for r in window]) if window else np.empty(0)
        point: Row = {
            "t": round(end, 2), "users": users,
            "output_tok_s": round(self.recent_rate(now_s, lag_s), 1),
            "requests_s": round(share / span, 3) if span > 0 else 0.0,
            "ttft_p50_ms": _ms(ttft, 50), "ttft_p99_ms": _ms(ttft, 99),
            "tpot_p50_ms": _ms(tpots, 50), "itl_p99_ms": _ms(itl, 99),
        }
        self.history.append(point)
        del self.history[:-keep]
        return point

    def recent_rate(self, now_s: float, lag_s: float = 0.0) -> float:
        """Tokens/s streamed in the ``window_s`` whole seconds before ``now_s - lag_s`` (fewer
        when the run is younger than that)."""
        end = int(now_s - lag_s)
        first = self._total.first_sent
        if first is None:
            return 0.0
        # early in a run the window holds only the seconds since the first request
        start = max(end - int(self.window_s), int(first))
        if end <= start:
            return 0.0
        return sum(self._buckets.get(s, 0) for s in range(start, end)) / (end - start)

    def rows(self, now_s: float, users: int, lag_s: float = 0.0, *, stopped: bool = False) -> list[Row]:
        """One row per worker (distributed runs) and a ``Total`` row; per user: the last 10 s
        over the users running, or once ``stopped`` the whole test over its peak ``users``."""
        out = []
        if len(self._by_worker) > 1 or any(k != 0 for k in self._by_worker):
            out += [_row(f"worker {k}", c, None, None) for k, c in sorted(self._by_worker.items())]
        recent = self.recent_rate(now_s, lag_s)
        out.append(_row("Total", self._total, recent, users, stopped=stopped))
        return out


def _row(name: str, c: _Counts, recent: float | None, users: int | None, *, stopped: bool = False) -> Row:
    span = (c.last_done - c.first_sent) if c.first_sent is not None and c.last_done is not None else 0.0
    overall = c.output_tokens / span if span > 0 else 0.0
    return {
        "name": name,
        "requests": c.requests,
        "failures": c.failed,
        "failure_classes": ", ".join(f"{k} {v}" for k, v in sorted(c.failures.items())) or "-",
        "output_tokens": c.output_tokens,
        "prompt_tokens": c.prompt_tokens,
        "output_tok_s": round(overall, 1),
        "requests_s": round(c.requests / span, 2) if span > 0 else None,
        "recent_tok_s": None if recent is None else round(recent, 1),
        "tok_s_per_user": (round(overall / users, 1) if stopped and users and span > 0
                           else round(recent / users, 1) if recent is not None and users and not stopped else None),
        "stream_tok_s": round(c.decode_tokens / c.decode_s, 1) if c.decode_s > 0 else None,
        **percentiles(c),
    }


CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "Name"),
    ("requests", "Requests"),
    ("failures", "Failures"),
    ("failure_classes", "Failure classes"),
    ("output_tokens", "Output tokens"),
    ("prompt_tokens", "Prompt tokens"),
    ("output_tok_s", "Output tok/s (whole test)"),
    ("requests_s", "Requests/s (whole test)"),
    ("recent_tok_s", "Output tok/s (last 10 s)"),
    ("tok_s_per_user", "Output tok/s per user"),
    ("stream_tok_s", "Decode tok/s per stream"),
    *((f"{k}_p{q}_ms", f"{k.upper()} p{q} (ms)") for k in PERCENTILES for q in QUANTILES),
)


def rows_csv(rows: list[Row]) -> str:
    lines = [",".join(f'"{title}"' for _, title in CSV_COLUMNS)]
    for row in rows:
        cells = []
        for key, _ in CSV_COLUMNS:
            v = row.get(key)
            cells.append(f'"{v}"' if isinstance(v, str) else ("" if v is None else str(v)))
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"


REPORT_TOTALS: tuple[tuple[str, str], ...] = (
    ("requests", "Requests"), ("failures", "Failures"), ("failure_classes", "Failure classes"),
    ("output_tokens", "Output tokens"), ("prompt_tokens", "Prompt tokens"), ("output_tok_s", "Output tok/s"),
    ("tok_s_per_user", "Output tok/s per user"), ("stream_tok_s", "Decode tok/s per stream"),
)


def report_section(rows: list[Row]) -> str:
    """The LLM figures as a static block of Locust's downloadable report (no script): the
    total's counts and throughput, then TTFT, TPOT, ITL and E2E as rows, p50 / p90 / p99 as columns."""
    total = next((r for r in rows if r.get("name") == "Total"), rows[-1] if rows else {})

    def cell(v: object) -> str:
        return "-" if v is None or v == "" else html.escape(f"{v:,}" if isinstance(v, int) else str(v))

    counts = "".join(f"<tr><th>{title}</th><td>{cell(total.get(k))}</td></tr>" for k, title in REPORT_TOTALS)
    latency = "".join(
        f"<tr><th>{k.upper()}</th>" + "".join(f"<td>{cell(total.get(f'{k}_p{q}_ms'))}</td>" for q in QUANTILES)
        + "</tr>" for k in PERCENTILES
    )
    head = "".join(f"<th>p{q} (ms)</th>" for q in QUANTILES)
    style = "font-family: system-ui, sans-serif; margin: 2em; color: #222; background: #fff"
    table = "border-collapse: collapse; margin: 0.5em 0 1.5em"
    return (
        f'<section id="loadgen-llm" style="{style}"><h2>LLM (loadgen)</h2>'
        f'<table style="{table}">{counts}</table>'
        f'<table style="{table}"><tr><th></th>{head}</tr>{latency}</table></section>'
    )


# the LLM tab: metrics as rows, statistics as columns
TAB_COLUMNS: tuple[tuple[str, str], ...] = (
    ("metric", "Metric"), ("value", "Value"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"),
)
TAB_VALUES: tuple[tuple[str, str], ...] = (
    ("output_tok_s", "Output tokens/s (whole test)"), ("requests_s", "Requests/s (whole test)"),
    ("recent_tok_s", "Output tokens/s (last 10 s)"), ("tok_s_per_user", "Output tokens/s per user"),
    ("stream_tok_s", "Decode tokens/s per stream"), ("requests", "Requests"), ("failures", "Failures"),
    ("failure_classes", "Failure classes"), ("output_tokens", "Output tokens"), ("prompt_tokens", "Prompt tokens"),
)


def tab_rows(rows: list[Row], run: dict[str, int] | None = None) -> list[Row]:
    """The LLM tab's rows from the table's: the total's figures one per row, then each
    latency's p50 / p90 / p99 (ms), each worker's output tokens/s and requests, and the run
    so far (``run``: its tests, requests and output tokens)."""
    total = next((r for r in rows if r.get("name") == "Total"), {})
    out: list[Row] = [{"metric": title, "value": total.get(key)} for key, title in TAB_VALUES]
    out += [{"metric": f"{k.upper()} (ms)", **{f"p{q}": total.get(f"{k}_p{q}_ms") for q in QUANTILES}}
            for k in PERCENTILES]
    for row in rows:
        if row.get("name") != "Total":
            out += [{"metric": f"{row['name']}: output tokens/s", "value": row.get("output_tok_s")},
                    {"metric": f"{row['name']}: requests", "value": row.get("requests")}]
    if run:
        out += [{"metric": "Run so far: tests", "value": run.get("tests", 0)},
                {"metric": "Run so far: requests", "value": run.get("requests", 0)},
                {"metric": "Run so far: output tokens", "value": run.get("output_tokens", 0)}]
    return out
