"""The interactive charts of ``report.html``: figures computed here, drawn in the page by uPlot
(inlined, with loadgen's ``report_charts.js``), so that hovering shows the values under the
cursor, a click on a legend entry hides or shows its series, and dragging zooms (a double
click zooms back out). Nothing is fetched: the library, the script and the data are in the page.

- Throughput against the load: output tok/s and req/s against the concurrency (as it ran) or
  the rate, one line per combination of the other axes.
- Latency against throughput: TTFT and E2E, then TPOT and ITL (p50, p99) against output tok/s.
- Latency by percentile: TTFT, TPOT and E2E at each percentile, a line per cell (the curve of
  ``distributions.png`` turned so that every cell shares the percentile axis).
- Over time: output tok/s, requests in flight and completions per second over the whole run.

Each latency chart draws the run's objectives as dashed lines.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

import numpy as np
import orjson

from loadgen.report.charts import METRICS, cell_label, measured_by_cell, slo_bounds
from loadgen.report.layouts import axis_title, axis_value, varying_axes
from loadgen.results.records import RequestRecord
from loadgen.results.summary import CellSummary, Summary

# percentiles on the shared axis: every whole one, then the tail in finer steps
PERCENTILES = [float(p) for p in range(0, 100)] + [99 + i / 10 for i in range(1, 10)] + \
    [99.9 + i / 100 for i in range(1, 10)] + [100.0]
STEPS_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
MAX_BINS = 1500
Spec = dict[str, Any]


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None or not np.isfinite(v) else float(f"{v:.{digits}g}")


def _load_x(cell: CellSummary, load: str) -> float:
    ran = cell.concurrency_ran if load == "concurrency" else None
    return float(ran if ran is not None else cell.params[load])


def _aligned(lines: dict[str, list[tuple[float, float | None]]]) -> tuple[list[float], list[list[float | None]]]:
    """Lines with their own x values on one shared, sorted x axis (None where a line has no point)."""
    xs = sorted({x for pts in lines.values() for x, _ in pts})
    out = []
    for pts in lines.values():
        at = dict(pts)
        out.append([at.get(x) for x in xs])
    return xs, out


def load_chart(summary: Summary) -> Spec | None:
    cells = [c for c in summary.measured if c.probe is None and c.metrics is not None]
    axes = varying_axes(cells)
    load = "rate" if "rate" in axes else ("concurrency" if "concurrency" in axes else None)
    if load is None or any(c.params.get(load) in (None, "unlimited") for c in cells):
        return None
    others = [k for k in axes if k != load]
    lines: dict[str, list[tuple[float, float | None]]] = {}
    series = []
    for key, unit, axis in (("output_throughput", "output tok/s", 0), ("request_throughput", "req/s", 1)):
        for c in cells:
            group = ", ".join(f"{axis_title(k).lower()} {axis_value(c.params.get(k))}" for k in others)
            name = f"{unit}" + (f", {group}" if group else "")
            if name not in lines:
                lines[name] = []
                series.append({"label": name, "unit": unit, "axis": axis, "dash": axis == 1})
            lines[name].append((_load_x(c, load), _r(getattr(c.metrics, key))))
    xs, ys = _aligned(lines)
    return {
        "id": "chart-load", "title": "Throughput against the load",
        "x": {"label": "request rate (req/s)" if load == "rate" else "concurrency (most requests in flight)"},
        "y": {"label": "output tok/s"}, "y2": {"label": "req/s"}, "points": True,
        "series": series, "data": [xs, *ys],
    }


def latency_charts(summary: Summary) -> list[Spec]:
    cells = [c for c in summary.measured if c.probe is None and c.metrics is not None and c.metrics.output_throughput]
    if len(cells) < 2:
        return []
    bounds = slo_bounds(summary)
    # a line per workload (the axes other than the load), its points the loads
    others = [k for k in varying_axes(cells) if k not in ("concurrency", "rate")]
    groups: dict[str, list[CellSummary]] = {}
    for c in cells:
        groups.setdefault(", ".join(f"{axis_title(k).lower()} {axis_value(c.params.get(k))}" for k in others),
                          []).append(c)
    out = []
    for ident, names in (("chart-latency-ttft", (("ttft_s", "TTFT"), ("e2e_s", "E2E latency"))),
                         ("chart-latency-tpot", (("tpot_s", "TPOT"), ("itl_s", "ITL")))):
        lines: dict[str, list[tuple[float, float | None]]] = {}
        series = []
        for key, name in names:
            for q in ("p50", "p99"):
                for group, members in groups.items():
                    label = f"{name} {q}" + (f", {group}" if group else "")
                    series.append({"label": label, "unit": "ms", "axis": 0, "dash": q == "p50"})
                    lines[label] = [
                        (float(c.metrics.output_throughput or 0.0),  # type: ignore[union-attr]
                         _r(ms * 1e3 if (ms := getattr(c.metrics, key).get(q)) is not None else None))
                        for c in members]
        xs, ys = _aligned(lines)
        title = " and ".join(n for _, n in names) + " against throughput"
        objectives = [(f"{label} {name}", ms) for _, name in names for label, ms in bounds.get(name, [])]
        out.append(_with_objectives({
            "id": ident, "title": title, "x": {"label": "output tok/s"}, "y": {"label": "ms"}, "points": True,
            "series": series, "data": [xs, *ys],
        }, objectives))
    return out


def percentile_charts(summary: Summary, records: list[RequestRecord]) -> list[Spec]:
    by_cell = measured_by_cell(records)
    cells = [c for c in summary.measured if by_cell.get(c.cell)]
    if not cells:
        return []
    axes_k = varying_axes(cells)
    bounds = slo_bounds(summary)
    out = []
    for name, value in METRICS:
        series, ys = [], []
        for c in cells:
            vals = np.asarray([v * 1e3 for r in by_cell[c.cell] if (v := value(r)) is not None])
            if not vals.size:
                continue
            series.append({"label": cell_label(c, axes_k), "unit": "ms", "axis": 0})
            ys.append([_r(v) for v in np.percentile(vals, PERCENTILES)])
        if not series:
            continue
        out.append(_with_objectives({
            "id": f"chart-pct-{name.split()[0].lower()}", "title": f"{name} by percentile",
            "x": {"label": "percentile of requests"}, "y": {"label": f"{name} (ms)"}, "points": False,
            "series": series, "data": [PERCENTILES, *ys],
        }, bounds.get(name, [])))
    return out


def time_chart(records: list[RequestRecord]) -> Spec | None:
    measured = [r for r in records if not r.warmup and r.sent_at is not None and r.done_at is not None]
    if len(measured) < 2:
        return None
    t0 = min(r.sent_at for r in measured)  # type: ignore[type-var]
    end = max(r.done_at for r in measured) - t0  # type: ignore[operator,type-var]
    step = next((s for s in STEPS_S if end / s <= MAX_BINS), STEPS_S[-1])
    bins = int(end // step) + 1
    edges = np.arange(bins + 1) * step
    tokens = np.zeros(bins)
    for r in measured:  # each record's tokens into their bins: no run-long array of arrivals
        if r.ok and r.chunk_offsets_s:
            at = (np.asarray(r.chunk_offsets_s) + (r.sent_at - t0)) / step  # type: ignore[operator]
            np.add.at(tokens, np.clip(at.astype(np.int64), 0, bins - 1), np.asarray(r.chunk_tokens, dtype=np.float64))
    done = np.histogram([r.done_at - t0 for r in measured if r.ok], bins=edges)[0]  # type: ignore[operator]
    sent = np.sort([r.sent_at - t0 for r in measured])  # type: ignore[operator]
    ended = np.sort([r.done_at - t0 for r in measured])  # type: ignore[operator]
    mids = edges[:-1] + step / 2
    in_flight = np.searchsorted(sent, mids, side="right") - np.searchsorted(ended, mids, side="right")
    return {
        "id": "chart-time", "title": f"Over time ({step:g} s bins; drag to zoom, double-click to zoom out)",
        "x": {"label": "seconds since the first request was sent"}, "y": {"label": "output tok/s"},
        "y2": {"label": "requests"}, "points": False,
        "series": [
            {"label": "output tok/s", "unit": "tok/s", "axis": 0},
            {"label": "requests in flight", "unit": "", "axis": 1},
            {"label": "completed req/s", "unit": "req/s", "axis": 1, "dash": True},
        ],
        "data": [[_r(x) for x in edges[:-1]], [_r(v) for v in tokens / step], [int(v) for v in in_flight],
                 [_r(v) for v in done / step]],
    }


def _with_objectives(spec: Spec, objectives: list[tuple[str, float]]) -> Spec:
    """Each objective as a dashed constant line across the chart."""
    for label, ms in objectives:
        spec["series"].append({"label": f"{label} {ms:g} ms", "unit": "ms", "axis": 0, "dash": True,
                               "objective": True})
        spec["data"].append([ms] * len(spec["data"][0]))
    return spec


def chart_specs(summary: Summary, records: list[RequestRecord]) -> list[Spec]:
    specs: list[Spec | None] = []
    if summary.kind != "single-stream" and not summary.capacity:
        specs += [*latency_charts(summary), load_chart(summary)]
    specs += [*percentile_charts(summary, records), time_chart(records)]
    return [s for s in specs if s is not None]


def _asset(name: str) -> str:
    return resources.files("loadgen.report").joinpath(name).read_text(encoding="utf-8")


def charts_html(specs: list[Spec]) -> tuple[str, str]:
    """(the figures, the scripts and style to put at the end of the page): empty without charts."""
    if not specs:
        return "", ""
    figures = "".join(
        f'<figure class="chart interactive"><figcaption>{html.escape(s["title"])}</figcaption>'
        f'<div class="uchart" id="{s["id"]}"></div></figure>' for s in specs
    )
    # the data as JSON inside the page; "</" escaped so that no value can close the script element
    data = orjson.dumps(specs).decode().replace("</", "<\\/")
    tail = (f"<style>{_asset('vendor/uPlot.min.css')}</style>"
            f'<script type="application/json" id="loadgen-charts">{data}</script>'
            f"<script>{_asset('vendor/uPlot.iife.min.js')}</script><script>{_asset('report_charts.js')}</script>")
    return figures, tail
