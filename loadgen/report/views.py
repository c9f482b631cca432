"""What ``loadgen run`` and ``loadgen report`` print for a summary: the published table of
its kind (single-stream, throughput) or a search's capacity table in a chosen format, or the sweep's console view."""

from __future__ import annotations

from dataclasses import replace

from loadgen.errors import UsageError
from loadgen.report.capacity import capacity_table
from loadgen.report.charts import cell_label
from loadgen.report.layouts import (
    compare_rows,
    compare_table,
    model_label,
    single_stream_tables,
    throughput_rows,
    throughput_table,
    varying_axes,
)
from loadgen.report.summary import sweep_table
from loadgen.report.tables import Table, render
from loadgen.results.summary import Summary

TABLES = ("single-stream", "throughput", "capacity", "compare", "sweep")
FORMATS = ("console", "md", "rst", "csv", "json")


def check_choice(option: str, value: str | None, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise UsageError(f"{option} {value!r}: choose {', '.join(choices)}")


def failure_notes(summary: Summary) -> tuple[str, ...]:
    """One note per measured cell whose requests failed: how many, of which class, and that its
    figures count the ones that finished (a table never hides a failed request)."""
    cells = [c for c in summary.measured if c.metrics is not None and c.metrics.failed]
    axes = varying_axes(list(summary.measured))
    notes = []
    for c in cells:
        m = c.metrics
        assert m is not None
        classes = ", ".join(f"{n} {k}" for k, n in m.failures_by_class.items())
        where = cell_label(c, axes) if axes else model_label(c.server)
        notes.append(f"{where}: {m.failed} of {m.requests} requests failed ({classes}); "
                     f"its figures count the {m.completed} that finished")
    return tuple(notes)


def published_tables(summary: Summary, table: str, spread: bool) -> list[Table]:
    """The single-stream tables (one per model), the throughput table, or the capacity table
    (one row per search) of a summary; failed requests are said under each table."""
    tables = _published(summary, table, spread)
    notes = failure_notes(summary)
    if not notes or table == "sweep":  # the sweep table has a column of its own for them
        return tables
    return [replace(t, footnotes=(*t.footnotes, *notes)) for t in tables]


def _published(summary: Summary, table: str, spread: bool) -> list[Table]:
    if table == "single-stream":
        return single_stream_tables(summary, spread=spread)
    if table == "compare":
        rows, base = compare_rows([(summary.scenario, summary)], (summary.scenario, summary))
        if base < 0:
            raise UsageError("--table compare: the run has no finished cell to compare against")
        return [compare_table(rows, base)]
    if table == "capacity":
        if not summary.capacity:
            raise UsageError("--table capacity: this run has no search (load.search, or loadgen run --search)")
        return [capacity_table(summary)]
    if table == "sweep":
        if not summary.measured:
            raise UsageError("--table sweep: the run has no measured cell")
        return [sweep_table(summary)]
    return [throughput_table(throughput_rows(summary), title=f"- {summary.scenario}")]


def render_tables(tables: list[Table], fmt: str) -> str:
    """Tables in one format; Markdown and RST get their titles above them."""
    parts = []
    for t in tables:
        if fmt in ("rst", "md") and t.title:
            parts.append(t.title + "\n")
        parts.append(render(t, fmt))
        if fmt in ("rst", "md"):
            parts.append("")
    return "\n".join(parts)
