"""``loadgen compare RUN [RUN ...]``: each run against the first (the baseline), cell by matched
cell, as text, CSV or JSON; with ``--out DIR``, also ``compare.png`` (latency against
throughput, every run on the same axes) and a self-contained ``compare.html``."""

from __future__ import annotations

import html
import tempfile
from pathlib import Path

import orjson

from loadgen.report.charts import pyplot, save
from loadgen.report.headline import workload_text
from loadgen.report.html import STYLE, inline_svg, table_html
from loadgen.report.summary import params_text
from loadgen.report.tables import Table, render_csv, render_md
from loadgen.results.compare import MIN_CHANGE, Run, RunComparison, compare
from loadgen.results.records import RequestRecord, read_records
from loadgen.results.rundir import RECORDS, write_file
from loadgen.results.summary import CellSummary, Summary

NOTE = ("95% bootstrap intervals over each run's requests (ITL: its gaps, the requests drawn whole; rates: its "
        "mean E2E latency, or a Poisson count in an open loop). They hold the noise within each run, not the drift "
        "between runs (a busy machine, a server warmed differently): two runs of one server can differ by more, "
        "and --repeats on both runs gives intervals over the repeats. 'within noise': the interval holds 0, or "
        "the change is under {:.0%}; 'no verdict': a starved client or engine, or different loads (said under "
        "the table); "
        "'too few values': too few to bound the percentile (a p99 needs 368); where both runs have repeats, "
        "the intervals come from the repeats (Student's t on the ratio of their means)")
CURVES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E latency"))


def run_label(summary: Summary) -> str:
    """A run as its cells' servers say: model, engine (and version), quantization."""
    parts: list[str] = []
    for cell in summary.cells:
        s = cell.server
        engine = "simulator" if s.backend == "sim" else (s.backend or "")
        if s.version:
            engine += f" {s.version}"
        text = " · ".join(x for x in (s.model or summary.model or "", engine, s.quant or "") if x)
        if text and text not in parts:
            parts.append(text)
    return "; ".join(parts[:2]) + (" and more" if len(parts) > 2 else "") or summary.scenario


def load_runs(paths: list[Path], summaries: list[Summary], labels: list[str]) -> list[Run]:
    """Each run with its label (``labels`` in order, else its servers'; a label two runs share
    gets the directory's name) and its measured, successful records by cell."""
    names = [labels[i] if i < len(labels) else run_label(s) for i, s in enumerate(summaries)]
    taken = {n for n in names if names.count(n) > 1}
    runs = []
    for path, summary, name in zip(paths, summaries, names, strict=True):
        if name in taken:
            name = f"{name} ({path.name})"
        records: dict[int, list[RequestRecord]] = {}
        if (path / RECORDS).exists():
            for r in read_records(path / RECORDS):
                if not r.warmup and r.ok and r.first_token_at is not None:
                    records.setdefault(r.cell, []).append(r)
        runs.append(Run(name, str(path), summary, records))
    return runs


def compare_all(runs: list[Run], min_change: float = MIN_CHANGE) -> list[RunComparison]:
    return [compare(runs[0], run, min_change) for run in runs[1:]]


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if abs(v) < 1 else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1%}"


def tables(base: Run, comparisons: list[RunComparison], min_change: float = MIN_CHANGE) -> list[Table]:
    """One table per run and matched cell: metric, baseline, run, change, 95% interval, verdict."""
    out = []
    note = NOTE.format(min_change)
    for comp in comparisons:
        for m in comp.matches:
            rows = tuple(
                (c.label, _num(c.base), _num(c.value), _pct(c.change),
                 "-" if c.low is None else f"{c.low:+.1%}..{c.high:+.1%}", c.verdict)
                for c in m.changes
            )
            counted = "repeats, intervals by Student's t over them" if m.by_repeats else "requests"
            title = (f"{comp.label} against {base.label}: {params_text(m.params)} "
                     f"(cells {m.base_cell} / {m.cell}, {m.base_requests} / {m.requests} {counted})")
            out.append(Table(("metric", "baseline", "run", "change", "95% interval", "verdict"), rows,
                             title=title, footnotes=(*m.notes, note)))
    return out


def flat_table(comparisons: list[RunComparison]) -> Table:
    """Every change in one table, for spreadsheets: numbers plain."""
    rows = []
    for comp in comparisons:
        for m in comp.matches:
            for c in m.changes:
                rows.append((comp.label, str(m.base_cell), str(m.cell), c.metric, _raw(c.base), _raw(c.value),
                             _raw(c.change), _raw(c.low), _raw(c.high), c.verdict))
    return Table(("run", "baseline cell", "cell", "metric", "baseline", "value", "change", "change low",
                  "change high", "verdict"), tuple(rows))


def _raw(v: float | None) -> str:
    return "" if v is None else repr(round(v, 6))


def render_text(base: Run, comparisons: list[RunComparison], fmt: str, min_change: float = MIN_CHANGE) -> str:
    if fmt == "json":
        data = {"baseline": {"label": base.label, "path": base.path}, "min_change": min_change,
                "runs": [c.to_dict() for c in comparisons]}
        return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
    if fmt == "csv":
        return render_csv(flat_table(comparisons))
    lines = [f"baseline: {_named(base.label, base.path)}"]
    lines += [f"run: {_named(c.label, c.path)}" for c in comparisons]
    for t in tables(base, comparisons, min_change):
        lines += ["", f"## {t.title}", "", render_md(Table(t.headers, t.rows))]
        lines += [f"no verdict: {n}" for n in t.footnotes[:-1]]  # the cell's own notes (the last is NOTE)
    if comparisons and not any(c.matches for c in comparisons):
        lines += ["", "no cell of the runs matches one of the baseline's (same lengths and load)"]
    unmatched = [u for c in comparisons for u in c.unmatched]
    if unmatched:
        lines += ["", "not compared:", *(f"- {u}" for u in dict.fromkeys(unmatched))]
    if any(c.matches for c in comparisons):
        lines += ["", NOTE.format(min_change)]
    return "\n".join(lines)


def _named(label: str, path: str) -> str:
    """A run's label with its directory, unless the label already names it."""
    return label if label.endswith(f"({Path(path).name})") else f"{label} ({path})"


def _curves(run: Run) -> dict[str, list[CellSummary]]:
    """A run's cells grouped into lines: the same workload, loads differing."""
    out: dict[str, list[CellSummary]] = {}
    for c in run.summary.cells:
        if c.status == "done" and c.metrics is not None and c.metrics.output_throughput:
            out.setdefault(workload_text(c.params), []).append(c)
    return out


def plot_overlay(runs: list[Run], path: Path) -> Path | None:
    """p50 (dashed) and p99 (solid) of TTFT, TPOT, ITL and E2E against output tokens/s, each
    run a colour, each of its workloads a line through its loads."""
    if not any(_curves(r) for r in runs):
        return None
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        groups = _curves(run)
        for name, cells in groups.items():
            cells = sorted(cells, key=lambda c: c.metrics.output_throughput or 0.0)  # type: ignore[union-attr]
            xs = [c.metrics.output_throughput for c in cells]  # type: ignore[union-attr]
            label = run.label if len(groups) == 1 else f"{run.label}, {name}"
            for ax, (key, _) in zip(axes.flat, CURVES, strict=True):
                for q, style in (("p99", "o-"), ("p50", "o--")):
                    ys = [getattr(getattr(c.metrics, key.replace("_ms", "_s")), q) * 1e3 for c in cells]
                    ax.plot(xs, ys, style, color=colour, label=f"{label} {q}", alpha=1.0 if q == "p99" else 0.6)
    for ax, (_, title) in zip(axes.flat, CURVES, strict=True):
        ax.set_xlabel("output tok/s")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("latency against throughput: p99 solid, p50 dashed")
    fig.tight_layout()
    return save(fig, path)


def render_html(base: Run, comparisons: list[RunComparison], runs: list[Run], min_change: float) -> str:
    e = html.escape
    with tempfile.TemporaryDirectory() as tmp:
        chart = plot_overlay(runs, Path(tmp) / "compare.svg")
        svg = inline_svg(chart) if chart is not None else "<p>No chart: no run has a finished cell.</p>"
    text = render_text(base, comparisons, "md", min_change)
    tail = text.split("\n\nnot compared:\n", 1)[1].split("\n\n")[0] if "\n\nnot compared:\n" in text else ""
    parts = [f"<p>baseline: <strong>{e(_named(base.label, base.path))}</strong></p>"]
    parts += [f"<p>run: <strong>{e(_named(c.label, c.path))}</strong></p>" for c in comparisons]
    parts.append(f"<h2>Latency against throughput</h2><figure>{svg}</figure><h2>Changes</h2>")
    parts += [table_html(t, "compare") for t in tables(base, comparisons, min_change)]
    if tail:
        parts.append("<h2>Not compared</h2><ul>" + "".join(
            f"<li>{e(line[2:])}</li>" for line in tail.splitlines()) + "</ul>")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>loadgen compare</title>'
            f"<style>{STYLE}</style></head><body><h1>{e(' against '.join([c.label for c in comparisons][:3]))}"
            f" against {e(base.label)}</h1>" + "".join(parts) + "</body></html>\n")


def write_outputs(out: Path, base: Run, comparisons: list[RunComparison], runs: list[Run],
                  min_change: float) -> list[Path]:
    """compare.md, compare.json, compare.csv, compare.png and compare.html under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("md", "json", "csv"):
        path = out / f"compare.{fmt}"
        write_file(path, (render_text(base, comparisons, fmt, min_change) + "\n").encode())
        written.append(path)
    if (png := plot_overlay(runs, out / "compare.png")) is not None:
        written.append(png)
    page = out / "compare.html"
    write_file(page, render_html(base, comparisons, runs, min_change).encode())
    written.append(page)
    return written

