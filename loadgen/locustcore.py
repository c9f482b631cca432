"""The parts of the Locust integration that need neither gevent nor Locust: which load a
scenario asks Locust for, live LLM statistics over records, and the run directory a Locust
run writes. ``loadgen locust`` validates with these before it starts Locust; the Locust
process (``loadgen.llmuser``) uses them while it runs.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from loadgen.errors import ScenarioError, UsageError
from loadgen.matrix import expand_cells, points
from loadgen.records import RECORD_TIMES, RecordWriter, RequestRecord
from loadgen.report import render_markdown
from loadgen.rundir import (
    CELLS,
    PROVENANCE,
    RECORDS,
    REPORT,
    SCENARIO,
    SUMMARY,
    CellStatusLog,
    build_summary_from_dir,
    write_json,
)
from loadgen.scenario import Scenario, apply_overrides, dump_scenario

# the request_type of loadgen's entries in Locust's statistics
LLM = "LLM"
ENTRIES: tuple[str, ...] = ("TTFT", "TPOT", "ITL", "E2E")


@dataclass(frozen=True, slots=True)
class LocustPlan:
    """What a scenario asks of Locust: one workload, and concurrency steps for the shape."""

    scenario: Scenario
    input_tokens: int
    output_tokens: int
    steps: tuple[int, ...]  # users per step of the load shape (the scenario's concurrency sweep)
    step_s: float | None  # load.duration_s: how long each step lasts, when the scenario says


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
    if any(r is not None for r in ld.rate):
        raise ScenarioError(
            f"{source}: load.rate -> Locust users are closed-loop (each sends its next request when "
            "the last one ends); remove load.rate and set users with -u or load.concurrency"
        )
    steps = tuple(c for c in ld.concurrency if isinstance(c, int))
    if len(steps) != len(ld.concurrency):
        raise ScenarioError(
            f"{source}: load.concurrency -> 'unlimited' is not a number of Locust users; give numbers"
        )
    return LocustPlan(scenario, w.input_tokens[0], w.output_tokens[0], steps, ld.duration_s)


def locust_scenario(plan: LocustPlan, users: tuple[int, ...]) -> Scenario:
    """The scenario a Locust run's directory holds: its concurrency is the users it ran with
    (the shape's steps, or the peak user count of a run without a shape)."""
    data = plan.scenario.model_dump(mode="json", exclude_unset=True)
    data = apply_overrides(data, [], {"load.concurrency": list(users), "load.warmup_requests": 0})
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


class StepClock:
    """Which cell a request belongs to: the shape step in force when it was sent."""

    def __init__(self) -> None:
        self._starts: list[float] = []

    def step_started(self, at_s: float) -> None:
        self._starts.append(at_s)

    def cell_of(self, sent_at: float | None) -> int:
        if not self._starts or sent_at is None:
            return 0
        return max(0, bisect.bisect_right(self._starts, sent_at) - 1)


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


class LiveStats:
    """Output tokens per second, overall and over the last ``window_s``, per worker and in
    total, from records as they arrive (the master's view merges every worker's records).

    Tokens are counted when their chunk arrived, so the windowed rate is the rate tokens
    streamed, not the rate requests finished.
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._by_worker: dict[int, _Counts] = defaultdict(_Counts)
        self._total = _Counts()
        self._buckets: Counter[int] = Counter()  # whole second of the run -> tokens streamed

    def add(self, r: RequestRecord) -> None:
        self._total.add(r)
        self._by_worker[r.worker].add(r)
        if r.ok and r.sent_at is not None:
            for offset, n in zip(r.chunk_offsets_s, r.chunk_tokens, strict=True):
                self._buckets[int(r.sent_at + offset)] += n

    def reset(self) -> None:
        self._by_worker.clear()
        self._total = _Counts()
        self._buckets.clear()

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

    def rows(self, now_s: float, users: int, lag_s: float = 0.0) -> list[dict[str, Any]]:
        """One row per worker (distributed runs) and a ``Total`` row."""
        out = []
        if len(self._by_worker) > 1 or any(k != 0 for k in self._by_worker):
            out += [_row(f"worker {k}", c, None, None) for k, c in sorted(self._by_worker.items())]
        recent = self.recent_rate(now_s, lag_s)
        out.append(_row("Total", self._total, recent, users))
        return out


def _row(name: str, c: _Counts, recent: float | None, users: int | None) -> dict[str, Any]:
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
        "recent_tok_s": None if recent is None else round(recent, 1),
        "tok_s_per_user": round(recent / users, 1) if recent is not None and users else None,
        "stream_tok_s": round(c.decode_tokens / c.decode_s, 1) if c.decode_s > 0 else None,
    }


CSV_COLUMNS: tuple[tuple[str, str], ...] = (
    ("name", "Name"),
    ("requests", "Requests"),
    ("failures", "Failures"),
    ("failure_classes", "Failure classes"),
    ("output_tokens", "Output tokens"),
    ("prompt_tokens", "Prompt tokens"),
    ("output_tok_s", "Output tok/s (whole run)"),
    ("recent_tok_s", "Output tok/s (last 10 s)"),
    ("tok_s_per_user", "Output tok/s per user"),
    ("stream_tok_s", "Decode tok/s per stream"),
)


def rows_csv(rows: list[dict[str, Any]]) -> str:
    lines = [",".join(f'"{title}"' for _, title in CSV_COLUMNS)]
    for row in rows:
        cells = []
        for key, _ in CSV_COLUMNS:
            v = row.get(key)
            cells.append(f'"{v}"' if isinstance(v, str) else ("" if v is None else str(v)))
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n"


class RunDirSink:
    """loadgen's run directory written from a Locust run (on the master, or the one process):
    records appended as they arrive, summary and report re-derived from them at the end."""

    def __init__(self, run_dir: Path, plan: LocustPlan, provenance: dict[str, Any]) -> None:
        if (run_dir / RECORDS).exists():
            raise UsageError(f"{run_dir}: already holds a run ({RECORDS}); choose another directory")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir, self.plan, self.provenance = run_dir, plan, provenance
        write_json(run_dir / PROVENANCE, provenance)
        self.writer = RecordWriter(run_dir / RECORDS)
        self.cells_seen: set[int] = set()

    def add(self, record: RequestRecord) -> None:
        self.writer.write(record)
        self.cells_seen.add(record.cell)

    def close(self, users: tuple[int, ...], *, interrupted: bool, server: dict[str, Any]) -> dict[str, Any]:
        """Write the scenario, cell statuses, summary and report; returns the summary."""
        self.writer.close()
        scenario = locust_scenario(self.plan, users)
        (self.run_dir / SCENARIO).write_text(dump_scenario(scenario))
        if not (self.run_dir / CELLS).exists():
            log = CellStatusLog(self.run_dir)
            for cell in expand_cells(scenario):
                if cell.index in self.cells_seen:
                    log.write({"cell": cell.index, "status": "done", "reason": None, "server": server})
            log.close()
        self.provenance["end_wall"] = datetime.now(UTC).isoformat()
        write_json(self.run_dir / PROVENANCE, self.provenance)
        summary = build_summary_from_dir(self.run_dir, scenario)
        summary["interrupted"] = interrupted
        write_json(self.run_dir / SUMMARY, summary)
        (self.run_dir / REPORT).write_text(render_markdown(summary))
        return summary

