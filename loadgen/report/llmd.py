"""``loadgen report RUN --format llmd``: llm-d's Benchmark Report (schema v0.2.1, the newest in
llm-d-benchmark's ``llmdbenchmark/analysis/benchmark_report/``), one report per measured cell,
as a JSON array.

Which loadgen figure fills which field (the README has the same table):

- ``run``: ``uid`` the run directory's name and the cell's number, ``eid`` the run directory's
  name, ``time`` the run's start and end (provenance.json), ``description`` the scenario's name.
- ``scenario.load.standardized``: ``tool`` loadgen and its version, ``parallelism`` the client's
  worker processes, ``source`` random (generated prompts) or sampled (a dataset, sessions, a
  trace), ``input_seq_len`` / ``output_seq_len`` fixed at the cell's lengths, ``rate_qps`` the
  rate, ``concurrency`` the concurrency, ``multi_turn`` for sessions; ``native.config`` the
  scenario as resolved.
- ``scenario.stack``: one ``inference_engine`` for the server measured (its engine and version,
  model, GPU count and tensor / pipeline parallelism; ``CPU`` as the accelerator of a CPU engine).
- ``results.request_performance.aggregate``: requests (total, failures, cancelled as
  incomplete, prompt and output lengths per request), latency (TTFT, TPOT, ITL and E2E in
  seconds, with mean, stddev, min, p50, p90, p95, p99, p99.9, max), throughput (input, output
  and total tokens/s and requests/s, means over the cell).
- ``results.request_performance.time_series``: the cell's windows (``report.window_s``): TTFT and
  ITL p50 / p99, output tokens/s, each at its window's start (the run's start plus the window's
  offset on the run's clock).

Left empty: ``normalized_time_per_output_token``, ``session_performance``, ``observability``,
``profiling`` and ``component_health`` (loadgen measures none of them in that form).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import yaml

from loadgen import __version__
from loadgen.data import Unchecked
from loadgen.report.headline import workload_text
from loadgen.report.summary import cell_warnings
from loadgen.results.figures import Distribution
from loadgen.results.metrics import distribution
from loadgen.results.records import RequestRecord, read_records
from loadgen.results.rundir import PROVENANCE, RECORDS, SCENARIO, read_json
from loadgen.results.summary import CellSummary, Summary

VERSION = "0.2.1"


def _stats(d: Distribution, units: str) -> dict[str, Any] | None:
    if d.mean is None:
        return None
    out = {"units": units, "mean": d.mean, "stddev": d.std, "min": d.min, "p50": d.p50, "p90": d.p90,
           "p95": d.p95, "p99": d.p99, "p99p9": d.p99_9, "max": d.max}
    return {k: v for k, v in out.items() if v is not None}


def _lengths(values: list[int]) -> dict[str, Any] | None:
    if not values:
        return None
    return _stats(distribution(values), "count")


def _rate(value: float | None, units: str) -> dict[str, Any] | None:
    return None if value is None else {"units": units, "mean": value}


def _hash(data: Any) -> str:
    return hashlib.sha256(orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]


def _clean(value: Any) -> Any:
    """None-valued keys left out (the schema's fields are optional or nullable, not required as null)."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _engine(cell: CellSummary) -> dict[str, Any] | None:
    s = cell.server
    if s.backend is None and s.model is None:
        return None
    gpus = s.gpu_count or len(s.gpus)
    standardized = {
        "kind": "inference_engine", "tool": s.backend or "unknown", "tool_version": s.version or "unknown",
        "role": "replica", "replicas": 1, "model": {"name": s.model or "unknown"},
        "accelerator": {"model": "GPU" if gpus else "CPU", "count": gpus,
                        "parallelism": {"tp": s.tp or 1, "pp": s.pp or 1}},
    }
    native = {"args": {k: v for k, v in s.to_dict().items() if v not in (None, [], "")}}
    label = f"{s.backend or 'server'}-{s.model or 'model'}"
    return {"metadata": {"schema_version": "0.0.1", "label": label, "cfg_id": _hash(native)},
            "standardized": standardized, "native": native}


def _load(cell: CellSummary, scenario: Unchecked, workers: int) -> dict[str, Any]:
    p = cell.params
    workload = scenario.get("workload") or {}
    source = "random" if p.get("workload") is None or str(p.get("workload")).startswith("multi-turn") else "sampled"
    multi = workload.get("multi_turn")
    standardized: dict[str, Any] = {
        "tool": "loadgen", "tool_version": __version__, "parallelism": workers, "source": source,
        "input_seq_len": {"distribution": "fixed", "value": p["input_tokens"]},
        "output_seq_len": {"distribution": "fixed", "value": p["output_tokens"]},
        "rate_qps": p.get("rate"),
        "concurrency": p["concurrency"] if isinstance(p.get("concurrency"), int) else None,
    }
    if isinstance(multi, dict):
        standardized["multi_turn"] = {"enabled": True, "max_turns": _max_turns(cell, multi.get("turns"))}
    return {"metadata": {"schema_version": "0.0.1", "cfg_id": _hash([p, scenario]), "description": workload_text(p)},
            "standardized": standardized, "native": {"config": scenario}}


def _max_turns(cell: CellSummary, turns: object) -> dict[str, Any] | None:
    """Generated sessions have ``turns`` each; a session file's vary, up to the most turns any of
    its sessions had in this cell (its per-turn figures, turn 0 the first), unknown where none finished."""
    if isinstance(turns, int):
        return {"distribution": "fixed", "value": turns}
    seen = 1 + max((t.value for t in cell.metrics.turns), default=-1) if cell.metrics and cell.metrics.turns else 0
    return {"distribution": "other", "value": seen, "max": seen} if seen else None


def _series(cell: CellSummary, start: datetime | None, origin: float) -> dict[str, Any] | None:
    """The cell's windows as time series; ``origin``: its first send on the run's clock."""
    m = cell.metrics
    if m is None or not m.windows or start is None:
        return None

    def ts(offset: float) -> str:
        return (start + timedelta(seconds=offset)).isoformat()

    def points(pairs: list[tuple[float, dict[str, Any]]]) -> list[dict[str, Any]]:
        return [{"ts": ts(t), **{k: v for k, v in values.items() if v is not None}} for t, values in pairs]

    w = m.windows
    return {
        "latency": {
            "time_to_first_token": {"units": "s", "series": points(
                [(origin + x.start_s, {"p50": x.ttft_p50_s, "p99": x.ttft_p99_s}) for x in w])},
            "inter_token_latency": {"units": "s/token", "series": points(
                [(origin + x.start_s, {"p50": x.itl_p50_s, "p99": x.itl_p99_s}) for x in w])},
        },
        "throughput": {"units": "tokens/s", "output_token_rate": {"units": "tokens/s", "series": points(
            [(origin + x.start_s, {"value": x.output_tokens_per_s}) for x in w])}},
    }


def _described(scenario: str, cell: CellSummary) -> str:
    """The run's description: the scenario's name, then the cell's warnings as loadgen's console,
    report.md and report.html give them (the schema has no field of its own for them)."""
    said = cell_warnings(cell)
    return scenario if not said else f"{scenario}; warnings: " + "; ".join(said)


def benchmark_reports(summary: Summary, run_dir: Path) -> list[dict[str, Any]]:
    """One Benchmark Report v0.2.1 per measured cell of the run."""
    prov: Unchecked = read_json(run_dir / PROVENANCE) if (run_dir / PROVENANCE).exists() else {}
    scenario: Unchecked = yaml.safe_load((run_dir / SCENARIO).read_text()) if (run_dir / SCENARIO).exists() else {}
    workers = (scenario.get("load") or {}).get("workers", 1)
    workers = workers if isinstance(workers, int) else 1
    start = datetime.fromisoformat(prov["start_wall"]) if prov.get("start_wall") else None
    end = datetime.fromisoformat(prov["end_wall"]) if prov.get("end_wall") else None
    records: dict[int, list[RequestRecord]] = {}
    if (run_dir / RECORDS).exists():
        for r in read_records(run_dir / RECORDS):
            if not r.warmup:
                records.setdefault(r.cell, []).append(r)
    origins: dict[int, float] = {}
    for k, rs in records.items():
        sent = [r.sent_at for r in rs if r.sent_at is not None and r.done_at is not None]
        if sent:
            origins[k] = min(sent)
    out = []
    for cell in summary.measured:
        m = cell.metrics
        assert m is not None
        ok = [r for r in records.get(cell.cell, []) if r.ok and r.first_token_at is not None]
        time = {"start": start.isoformat() if start else None, "end": end.isoformat() if end else None,
                "duration": f"PT{(end - start).total_seconds():.3f}S" if start and end else None}
        stack = [e] if (e := _engine(cell)) is not None else None
        report = {
            "version": VERSION,
            "run": {"uid": f"{run_dir.name}-cell-{cell.number}", "eid": run_dir.name, "time": time,
                    "description": _described(summary.scenario, cell), "keywords": ["loadgen"]},
            "scenario": {"stack": stack, "load": _load(cell, scenario, workers)},
            "results": {"request_performance": {
                "aggregate": {
                    "requests": {
                        "total": m.requests, "failures": m.failed, "incomplete": m.cancelled,
                        "input_length": _lengths([r.prompt_tokens or r.input_tokens or 0 for r in ok]),
                        "output_length": _lengths([r.output_tokens for r in ok]),
                    },
                    "latency": {
                        "time_to_first_token": _stats(m.ttft_s, "s"),
                        "time_per_output_token": _stats(m.tpot_s, "s/token"),
                        "inter_token_latency": _stats(m.itl_s, "s/token"),
                        "request_latency": _stats(m.e2e_s, "s"),
                    },
                    "throughput": {
                        "input_token_rate": _rate(m.prompt_tokens_total / m.duration_s if m.duration_s else None,
                                                  "tokens/s"),
                        "output_token_rate": _rate(m.output_throughput, "tokens/s"),
                        "total_token_rate": _rate(m.total_token_throughput, "tokens/s"),
                        "request_rate": _rate(m.request_throughput, "queries/s"),
                    },
                },
                "time_series": _series(cell, start, origins.get(cell.cell, 0.0)),
            }},
        }
        out.append(_clean(report))
    return out
