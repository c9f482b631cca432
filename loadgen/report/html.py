"""``loadgen report RUN --html``: one self-contained HTML file of a run, readable offline.

The run's tables (the published table of its kind, the sweep, a capacity search's, each
cell's latency percentiles), its charts as inline SVG (the same charts ``--plot`` writes as
PNG, text kept as outlines, so no font or script is fetched) and its provenance: what was
measured, on what, by which loadgen, when. Nothing in the file refers to anything outside it.
"""

from __future__ import annotations

import html
import re
import tempfile
from pathlib import Path
from typing import Any

from loadgen.data import Unchecked
from loadgen.report.capacity import plot_capacity
from loadgen.report.headline import about, title, verdict
from loadgen.report.interactive import chart_specs, charts_html
from loadgen.report.plots import write_plots
from loadgen.report.summary import (
    COLUMNS,
    breakdown_tables,
    cell_title,
    cell_warnings,
    console_lines,
    latency_rows,
    repeats_table,
)
from loadgen.report.tables import Table
from loadgen.report.views import published_tables
from loadgen.results.records import read_records
from loadgen.results.rundir import PROVENANCE, RECORDS, read_json, write_file
from loadgen.results.summary import Summary

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.6em 0 1em; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; } td:first-child, th:first-child { text-align: left; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
figure.interactive { max-width: 1100px; } .uchart { width: 100%; }
.u-legend { font-size: 0.8em; } .u-legend .u-value { font-family: ui-monospace, monospace; }
.warning { color: #8a4b00; }
.figures, .note { font-family: ui-monospace, monospace; font-size: 0.85em; color: #444; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; font-size: 0.9em; }
dt { font-weight: 600; } dd { margin: 0; font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
"""
# the interactive chart (by id) that stands for a static one (by file stem) in the page
INTERACTIVE_REPLACES = {"chart-latency-ttft": "latency", "chart-load": "load", "chart-pct-ttft": "distributions"}
CHART_TITLES = {
    "speed": "Single-stream speed against input length",
    "throughput": "Throughput per checkpoint",
    "latency": "Latency against throughput",
    "load": "Throughput against the load",
    "distributions": "Latency distributions",
    "timeline": "Requests over time",
    "windows": "Each cell over time",
    "capacity": "Capacity search",
}


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def table_html(table: Table, css_class: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in table.headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(c).replace(chr(10), '<br>')}</td>" for c in row) + "</tr>" for row in table.rows
    )
    caption = f"<caption>{_e(table.title.lstrip('- '))}</caption>" if table.title else ""
    notes = "".join(f'<p class="note">{_e(n)}</p>' for n in table.footnotes)
    return f'<table class="{css_class}">{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}'


def inline_svg(path: Path) -> str:
    """An SVG file's element, for inlining (its XML prologue and doctype dropped; ids made
    unique per chart so two charts' clip paths never collide)."""
    text = path.read_text()
    text = text[text.index("<svg"):]
    prefix = re.sub(r"\W", "", path.stem)
    return re.sub(r'(id="|url\(#|href="#)([^")]+)', lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", text)


def charts(summary: Summary, run_dir: Path, skip: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """(title, inline SVG) for each chart the run can show, but those named in ``skip`` (drawn
    interactively instead)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        # a search's answer first: its capacity chart leads
        paths = [p for i, cap in enumerate(summary.capacity)
                 if (p := plot_capacity(cap, where / f"capacity-{i + 1}.svg", summary.scenario)) is not None]
        paths += write_plots(summary, run_dir, where, "svg", skip)  # those drawn live: not drawn twice
        for p in paths:
            out.append((CHART_TITLES.get(p.stem.split("-")[0], p.stem), inline_svg(p)))
    return out


def _provenance(run_dir: Path) -> str:
    path = run_dir / PROVENANCE
    prov: Unchecked = read_json(path) if path.exists() else {}
    server = prov.get("server") or {}
    rows = [
        ("loadgen", prov.get("loadgen_version")), ("started", prov.get("start_wall")), ("ended", prov.get("end_wall")),
        ("host", prov.get("host")), ("platform", prov.get("platform")), ("python", prov.get("python")),
        ("command", " ".join(map(str, prov.get("argv") or []))), ("seed", prov.get("seed")),
        ("model served", prov.get("model")), ("client cores", prov.get("cpus")),
        ("server", server.get("backend")), ("server command", " ".join(map(str, server.get("argv") or []))),
        ("server version", (server.get("engine") or {}).get("version")),
    ]
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(_text(v))}</dd>" for k, v in rows if v not in (None, "", [], {}))
    return f"<dl>{items}</dl>"


def _text(value: Any) -> str:
    """A provenance value as text: a mapping as ``key value; ...``, a list comma-separated."""
    if isinstance(value, dict):
        return "; ".join(f"{k} {_text(v)}" for k, v in value.items() if v not in (None, "", [], {}))
    if isinstance(value, list | tuple):
        return ", ".join(_text(v) for v in value)
    return str(value)


def _cell_sections(summary: Summary) -> str:
    parts = []
    for cell in summary.cells:
        if cell.probe is not None:
            continue
        title = cell_title(cell)
        if cell.metrics is None:
            parts.append(f"<h3>{_e(title)}</h3><p>{_e(cell.status)}: {_e(cell.reason)}</p>")
            continue
        rows = tuple(tuple(r) for r in latency_rows(cell))
        table = Table(("ms", *COLUMNS), rows, title=title)
        parts.append(table_html(table, "latency"))
        parts += [table_html(t, "breakdown") for t in breakdown_tables(cell)]
        parts += [f'<p class="warning"><strong>Warning</strong>: {_e(w)}</p>' for w in cell_warnings(cell)]
    return "".join(parts)


def render_html(summary: Summary, run_dir: Path) -> str:
    tables = []
    kinds = [summary.kind] if summary.kind != "sweep" else []
    if summary.measured:
        kinds.append("sweep")
    if summary.capacity:
        kinds.append("capacity")
    for kind in dict.fromkeys(kinds):
        tables += [table_html(t, kind) for t in published_tables(summary, kind, spread=False)]
    if (repeated := repeats_table(summary)) is not None:
        tables.append(table_html(repeated, "repeats"))
    lines = "".join(f'<p class="figures">{_e(line)}</p>' for line in console_lines(summary))
    records = list(read_records(run_dir / RECORDS)) if (run_dir / RECORDS).exists() else []
    specs = chart_specs(summary, records)
    live, scripts = charts_html(specs)
    # the charts drawn live replace their static pictures (still written as PNG by --plot)
    skip = frozenset(INTERACTIVE_REPLACES[s["id"]] for s in specs if s["id"] in INTERACTIVE_REPLACES)
    static = [(t, svg) for t, svg in charts(summary, run_dir, skip)]
    capacity = [(t, svg) for t, svg in static if t == CHART_TITLES["capacity"]]
    figures = "".join(
        f'<figure class="chart"><figcaption>{_e(title)}</figcaption>{svg}</figure>' for title, svg in capacity
    ) + live + "".join(
        f'<figure class="chart"><figcaption>{_e(title)}</figcaption>{svg}</figure>'
        for title, svg in static if title != CHART_TITLES["capacity"]
    )
    interrupted = "<p><strong>Interrupted</strong>: figures cover what was measured before the stop.</p>"
    heading = title(summary)
    found = "".join(f'<p class="verdict"><strong>{_e(line)}</strong></p>' for line in verdict(summary))
    # a search's answer rests on its probes: their warnings stand beside it
    found += "".join(f'<p class="warning"><strong>Warning</strong>: probe {c.number}: {_e(w)}</p>'
                     for c in summary.cells if c.probe is not None for w in cell_warnings(c))
    tested = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in about(summary))
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(heading)}: loadgen report</title><style>{STYLE}</style></head><body>"
        f"<h1>{_e(heading)}</h1>" + found + f'<dl class="tested">{tested}</dl>'
        + f"<p>{len(summary.cells)} cells, re-derived from <code>{_e(run_dir.name)}/records.jsonl</code>.</p>"
        + (interrupted if summary.interrupted else "")
        + (f"<p><strong>Resumed</strong>: continued {summary.resumed} time(s) after a stop; finished cells "
           "were kept.</p>" if summary.resumed else "")
        + (f"<p><strong>Incomplete</strong>: {summary.records_lost} measured requests could not be written to "
           "records.jsonl; the figures leave them out.</p>" if summary.records_lost else "")
        + "<h2>Tables</h2>" + "".join(tables) + lines
        + "<h2>Charts</h2>" + (figures or "<p>No chart: the run has no successful request.</p>")
        + "<h2>Cells</h2>" + _cell_sections(summary)
        + "<h2>Provenance</h2>" + _provenance(run_dir)
        + scripts + "</body></html>\n"
    )


def write_html(summary: Summary, run_dir: Path) -> Path:
    path = run_dir / "report.html"
    write_file(path, render_html(summary, run_dir).encode())
    return path
