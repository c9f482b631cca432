"""Samples taken beside the load, and their summaries: the server's Prometheus ``/metrics``, GPU
memory (NVML) and the client's own health. ``loadgen.load.sampling`` takes them. (The file keeps
its first name, ``probes.jsonl``, and each line names its kind under ``"probe"``; a capacity
search's measured cells are its "probes", which is another thing.)

Both write raw samples to ``probes.jsonl`` (one JSON object per line, tagged with the cell),
and the summaries are computed from those lines alone, so ``loadgen report`` re-derives them:

- ``metrics``: every ``interval_s`` the engine's ``/metrics`` is scraped; gauges (running and
  waiting requests, KV-cache usage, the transformers engine's peak allocated memory),
  counters (preemptions, tokens) and histograms (server-side TTFT, TPOT / ITL, E2E).
- ``gpu``: NVML memory held on each GPU by the launched engine's process tree, and each
  GPU's used memory, every ``interval_s``.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import orjson

from loadgen.errors import OutputError, RunDirError
from loadgen.results.files import AppendFile
from loadgen.results.readings import EnergyReading, GpuReading, Histogram, Reading, Scrape, kind_of, reading

SAMPLES = "probes.jsonl"  # the samples file's name in a run directory
GIB = float(1 << 30)

# what loadgen reports, by kind; each engine declares its own names for them (``Engine.metrics``)
GAUGES: tuple[str, ...] = ("running", "waiting", "kv_cache_usage", "engine_peak_allocated_bytes",
                           "prefix_cache_hit_rate")
COUNTERS: tuple[str, ...] = ("preemptions", "prompt_tokens", "generation_tokens", "prefix_cache_queries",
                             "prefix_cache_hits")
HISTOGRAMS: tuple[str, ...] = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
# loadgen's own servers' names: the simulator's, and its transformers and CTranslate2 engines'
OWN_NAMES: dict[str, tuple[str, ...]] = {
    "running": ("loadgen_sim_requests_running",), "waiting": ("loadgen_sim_requests_waiting",),
    "engine_peak_allocated_bytes": ("loadgen_engine_peak_allocated_bytes",),
    "prefix_cache_queries": ("loadgen_sim_prefix_cache_queries",),
    "prefix_cache_hits": ("loadgen_sim_prefix_cache_hits",),
}


@dataclass(frozen=True)
class MetricNames:
    """loadgen's metric name -> the Prometheus names that report it, in the order tried."""

    names: Mapping[str, tuple[str, ...]]

    @classmethod
    def of(cls, *tables: Mapping[str, tuple[str, ...]]) -> MetricNames:
        merged: dict[str, tuple[str, ...]] = {}
        for table in (OWN_NAMES, *tables):
            for key, names in table.items():
                if key not in (*GAUGES, *COUNTERS, *HISTOGRAMS):
                    raise ValueError(f"metric {key!r}: loadgen reports {', '.join((*GAUGES, *COUNTERS, *HISTOGRAMS))}")
                merged[key] = (*merged.get(key, ()), *names)
        return cls(merged)

    @functools.cached_property
    def prefixes(self) -> tuple[str, ...]:
        return tuple(sorted({n for names in self.names.values() for n in names}))


_LE = re.compile(r'le="([^"]*)"')


def parse_metrics(text: str, known: MetricNames) -> Scrape:
    """The metrics of ``known`` from a Prometheus text page, each summed over its label sets,
    by loadgen's names.

    It runs on the client's event loop once a second while a cell is measured, and an engine's
    page runs to hundreds of lines: so it reads only the samples of the families it knows,
    ``name{labels} value`` each, rather than the whole page with a general parser (vLLM's page
    took 14 ms that way, a delay every chunk arriving meanwhile would have carried).
    """
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        if not line.startswith(known.prefixes):
            continue
        if "{" in line:
            name, _, after = line.partition("{")
            labels, _, rest = after.rpartition("}")
        else:
            name, _, rest = line.partition(" ")
            labels = ""
        fields = rest.split()  # the value, maybe a timestamp after it
        try:
            value = float(fields[0])
        except (ValueError, IndexError):
            continue
        if name.endswith("_bucket"):
            m = _LE.search(labels)
            le = float(m.group(1)) if m else math.inf
            per = buckets.setdefault(name.removesuffix("_bucket"), {})
            per[le] = per.get(le, 0.0) + value
        else:
            values[name] = values.get(name, 0.0) + value

    def first(names: tuple[str, ...], suffix: str = "") -> float | None:
        return next((values[n + suffix] for n in names if n + suffix in values), None)

    out = Scrape()
    table = known.names
    for key in GAUGES:
        if (v := first(table.get(key, ()))) is not None:
            out.gauges[key] = v
    for key in COUNTERS:
        names = table.get(key, ())
        v = first(names, "_total") if first(names, "_total") is not None else first(names)
        if v is not None:
            out.counters[key] = v
    for key in HISTOGRAMS:
        names = table.get(key, ())
        hist = next((n for n in names if n in buckets), None)
        if hist is not None:
            out.histograms[key] = Histogram(
                tuple(sorted(buckets[hist].items())), values.get(hist + "_sum", 0.0), values.get(hist + "_count", 0.0)
            )
    return out


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding q."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of ``probes.jsonl``: what a cell's sample read, at a wall-clock time."""

    cell: int
    wall: float
    values: Reading

    @property
    def kind(self) -> str:
        """metrics | gpu | client (the line's "probe")."""
        return kind_of(self.values)

    def to_dict(self) -> dict[str, object]:
        return {"cell": self.cell, "probe": self.kind, "wall": self.wall, "values": self.values.to_dict()}


@dataclass(frozen=True, slots=True)
class GaugeSummary:
    max: float
    mean: float


@dataclass(frozen=True, slots=True)
class HistogramSummary:
    count: float
    mean: float
    p50: float | None
    p90: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """One cell's server-side view (``summary.json: cells[].server_metrics``): gauge peaks and
    means, counter and histogram increases over the cell, by loadgen's metric names."""

    scrapes: int
    gauges: dict[str, GaugeSummary]
    counters: dict[str, float]
    histograms: dict[str, HistogramSummary]

    def to_dict(self) -> dict[str, object]:
        return {
            "scrapes": self.scrapes, **{k: asdict(v) for k, v in self.gauges.items()}, **self.counters,
            **{k: asdict(v) for k, v in self.histograms.items()},
        }

    @classmethod
    def from_dict(cls, data: object) -> ServerMetrics | None:
        if not isinstance(data, dict):
            return None
        return cls(
            scrapes=int(data.get("scrapes", 0)),
            gauges={k: GaugeSummary(**data[k]) for k in GAUGES if isinstance(data.get(k), dict)},
            counters={k: float(data[k]) for k in COUNTERS if data.get(k) is not None},
            histograms={k: HistogramSummary(**data[k]) for k in HISTOGRAMS if isinstance(data.get(k), dict)},
        )


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """GPU memory the engine's processes held during a cell (NVML), or why there is no figure."""

    available: bool
    reason: str | None = None
    source: str | None = None
    peak_gib_per_gpu: dict[str, float] | None = None
    peak_gib_total: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: object) -> GpuMemory:
        if not isinstance(data, dict):
            return cls(False, "no GPU samples")
        return cls(bool(data.get("available")), data.get("reason"), data.get("source"), data.get("peak_gib_per_gpu"),
                   data.get("peak_gib_total"))


@dataclass(frozen=True, slots=True)
class Energy:
    """Energy over a cell, from the counters at its start and end: the engine's GPUs (NVML) and
    the CPU packages (RAPL: the whole package, the client's work included); a figure that could
    not be measured is None, with the reason, never zero."""

    seconds: float
    gpu_energy_j: float | None = None
    gpu_avg_power_w: float | None = None
    gpu_j_per_output_token: float | None = None
    gpus: tuple[str, ...] = ()
    gpu_reason: str | None = None
    cpu_energy_j: float | None = None
    cpu_avg_power_w: float | None = None
    cpu_reason: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()
                if v is not None and v != ()}

    @classmethod
    def from_dict(cls, data: object) -> Energy | None:
        if not isinstance(data, dict):
            return None
        return cls(**{**data, "gpus": tuple(data.get("gpus") or ())})


def summarize_energy(samples: list[Sample], gpus: list[str] | None, output_tokens: int) -> Energy | None:
    """The energy between the first and the last counter reading of a cell; ``gpus``: the
    engine's GPUs (those it held memory on; None: not known)."""
    readings = [s.values for s in samples if isinstance(s.values, EnergyReading)]
    if len(readings) < 2:
        return None
    first, last = readings[0], readings[-1]
    span = last.at_s - first.at_s
    if span <= 0:
        return None
    out = Energy(round(span, 3))
    if first.gpu_mj is None or last.gpu_mj is None:
        out = replace(out, gpu_reason=last.gpu_reason or first.gpu_reason or "no GPU energy counter")
    elif not gpus:
        out = replace(out, gpu_reason="the engine held memory on no GPU: its GPUs are not known")
    else:
        joules = sum(last.gpu_mj[g] - first.gpu_mj[g] for g in gpus if g in first.gpu_mj and g in last.gpu_mj) / 1e3
        out = replace(out, gpu_energy_j=round(joules, 3), gpu_avg_power_w=round(joules / span, 3), gpus=tuple(gpus),
                      gpu_j_per_output_token=round(joules / output_tokens, 6) if output_tokens else None)
    if first.cpu_uj is None or last.cpu_uj is None:
        return replace(out, cpu_reason=last.cpu_reason or first.cpu_reason or "no CPU energy counter")
    total = 0
    for name, end in last.cpu_uj.items():
        start = first.cpu_uj.get(name, end)
        wrap = last.cpu_range_uj.get(name, 0)
        total += end - start if end >= start else end + wrap - start  # the counter wrapped once
    joules = total / 1e6
    return replace(out, cpu_energy_j=round(joules, 3), cpu_avg_power_w=round(joules / span, 3))


def summarize_server_metrics(samples: list[Sample]) -> ServerMetrics | None:
    """One cell's server-side view from its scrapes: gauge peaks and means, counter and histogram
    increases over the cell (last scrape minus first)."""
    scrapes = [s.values for s in samples if isinstance(s.values, Scrape)]
    if not scrapes:
        return None
    first, last = scrapes[0], scrapes[-1]
    gauges: dict[str, GaugeSummary] = {}
    counters: dict[str, float] = {}
    histograms: dict[str, HistogramSummary] = {}
    for key in GAUGES:
        seen = [s.gauges[key] for s in scrapes if key in s.gauges]
        if seen:
            gauges[key] = GaugeSummary(max(seen), sum(seen) / len(seen))
    for key in COUNTERS:
        if key in first.counters and key in last.counters:
            counters[key] = last.counters[key] - first.counters[key]
    for key in HISTOGRAMS:
        a, b = first.histograms.get(key), last.histograms.get(key)
        if a is None or b is None:
            continue
        before = dict(a.buckets)
        delta = [(le, c - before.get(le, 0.0)) for le, c in b.buckets]
        n = b.count - a.count
        if n <= 0:
            continue
        histograms[key] = HistogramSummary(
            n, (b.sum - a.sum) / n, histogram_quantile(0.5, delta), histogram_quantile(0.9, delta),
            histogram_quantile(0.99, delta),
        )
    return ServerMetrics(len(scrapes), gauges, counters, histograms)


def summarize_gpu(samples: list[Sample], reason: str | None = None) -> GpuMemory:
    """Peak GiB the engine held per GPU and in total (the peak of the per-sample sum)."""
    readings = [s.values for s in samples if isinstance(s.values, GpuReading)]
    if not readings:
        return GpuMemory(False, reason or "no GPU samples")
    per: dict[str, float] = {}
    total = 0.0
    for r in readings:
        held = r.held
        for gpu, b in held.items():
            per[gpu] = max(per.get(gpu, 0.0), b / GIB)
        total = max(total, sum(held.values()) / GIB)
    return GpuMemory(True, source="nvml process tree", peak_gib_per_gpu=per, peak_gib_total=total)


class SampleLog:
    """Appends samples to ``probes.jsonl`` (thread-safe; a line per sample). Samples come from
    threads and callbacks that must not raise: a sample that cannot be written is kept as
    ``failure`` (the first) and ``on_failure`` is called, for the run to stop and say why."""

    def __init__(self, path: Path) -> None:
        self._file = AppendFile(path)
        self._lock = threading.Lock()
        self._by_cell: dict[int, dict[str, list[Sample]]] = {}
        self.failure: OutputError | None = None
        self.on_failure: Callable[[], None] | None = None

    def write(self, cell: int, values: Reading) -> None:
        sample = Sample(cell, time.time(), values)
        line = orjson.dumps(sample.to_dict()) + b"\n"
        with self._lock:
            try:
                self._file.append(line)
            except OutputError as exc:
                first = self.failure is None
                self.failure = self.failure or exc
                if first and self.on_failure is not None:
                    self.on_failure()
                return
            self._by_cell.setdefault(cell, {}).setdefault(sample.kind, []).append(sample)

    def samples(self, cell: int) -> dict[str, list[Sample]]:
        """What this log wrote for ``cell`` (the lines ``read_samples`` gives back), without reading the file."""
        with self._lock:
            return {k: list(v) for k, v in self._by_cell.get(cell, {}).items()}

    def close(self) -> None:
        self._file.close()


def read_samples(path: Path) -> dict[int, dict[str, list[Sample]]]:
    """Samples by cell and kind; a last line cut short by a crash is skipped."""
    out: dict[int, dict[str, list[Sample]]] = {}
    if not path.is_file():
        return out
    with path.open("rb") as f:
        for n, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                break
            try:
                s = orjson.loads(line)
                sample = Sample(int(s["cell"]), float(s.get("wall") or 0.0), reading(str(s["probe"]), s["values"]))
                out.setdefault(sample.cell, {}).setdefault(sample.kind, []).append(sample)
            except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
                raise RunDirError(f"{path}: line {n} is not a sample ({exc})") from None
    return out


def prefix_cache_hit_rate(server_metrics: ServerMetrics | None) -> tuple[float | None, str]:
    """The share of prompt tokens the server served from its prefix cache during a cell, from
    its own counters (hits / queries over the cell), else its hit-rate gauge; or why unknown."""
    if not server_metrics:
        return None, "the server's /metrics could not be read"
    queries = server_metrics.counters.get("prefix_cache_queries")
    hits = server_metrics.counters.get("prefix_cache_hits")
    if queries is not None and hits is not None:
        return (hits / queries if queries > 0 else 0.0), "prefix-cache hit and query counters"
    gauge = server_metrics.gauges.get("prefix_cache_hit_rate")
    if gauge is not None:
        return gauge.mean, "prefix-cache hit-rate gauge (mean over the cell)"
    return None, "the server exports no prefix-cache counter"
