"""`loadgen report` and `loadgen compare`: re-render run directories without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer

from loadgen.cli.console import err, handles_errors, out, print_summary, print_text
from loadgen.cli.root import Command, app
from loadgen.errors import UsageError
from loadgen.report.summary import render_markdown


@app.command(cls=Command)
@handles_errors
def report(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="run directories")],
    table: Annotated[
        str | None,
        typer.Option(help="single-stream | throughput | capacity | compare | sweep (default: the scenario's kind)"),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="console | md | rst | csv | json")] = "console",
    spread: Annotated[bool, typer.Option("--spread", help="single-stream: add the speed's std over repeats")] = False,
    plot: Annotated[bool, typer.Option("--plot", help="write PNG charts into each run directory")] = False,
    as_html: Annotated[
        bool, typer.Option("--html", help="write report.html into each run directory: tables, charts, provenance "
                           "in one file that opens offline")
    ] = False,
) -> None:
    """Re-render run directories from their records alone, without touching a server."""
    from loadgen.report.plots import write_plots
    from loadgen.report.views import FORMATS, TABLES, check_choice, published_tables, render_tables
    from loadgen.results.rundir import rebuild_summary

    check_choice("--format", fmt, FORMATS)
    check_choice("--table", table, TABLES)
    for run_dir in run_dirs:
        summary = rebuild_summary(run_dir)
        kind = table or summary.kind
        if plot:
            written = write_plots(summary, run_dir)
            for path in written:
                err().print(f"wrote {path}", markup=False, highlight=False)
            if not written:
                err().print(f"{run_dir}: no chart to draw: the run has no successful request", highlight=False)
        if as_html:
            from loadgen.report.html import write_html

            err().print(f"wrote {write_html(summary, run_dir)}", markup=False, highlight=False)
            continue
        # a sweep run's default: the whole summary (console, report.md, summary.json); --table
        # sweep, or csv / rst: the sweep table alone
        whole = kind == "sweep" and (table is None or fmt == "console") and fmt in ("console", "md", "json")
        if not whole:
            print_text(render_tables(published_tables(summary, kind, spread), "md" if fmt == "console" else fmt))
        elif fmt == "json":
            print_text(orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2).decode())
        elif fmt == "md":
            print_text(render_markdown(summary))
        else:
            out().print(f"{run_dir}", style="bold", markup=False, highlight=False)
            print_summary(summary)


@app.command(cls=Command)
@handles_errors
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="run directories to compare")],
    baseline: Annotated[
        Path, typer.Option(metavar="RUN_DIR", help="the run the others are measured against (Speed X = 1)")
    ],
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="md | rst | csv | json")] = "md",
) -> None:
    """Runs against a baseline, as the cross-engine comparison: Avg Tok/s, Max Mem (MiB), Speed X, Max mem %."""
    from loadgen.report.layouts import compare_rows, compare_table
    from loadgen.report.tables import render
    from loadgen.results.rundir import rebuild_summary

    if fmt not in ("md", "rst", "csv", "json"):
        raise UsageError(f"--format {fmt!r}: choose md, rst, csv or json")
    dirs = list(dict.fromkeys([baseline, *run_dirs]))
    summaries = [(str(d), rebuild_summary(d)) for d in dirs]
    rows, base = compare_rows(summaries, summaries[0])
    if base < 0:
        raise UsageError(f"--baseline {baseline}: the run has no finished cell to compare against")
    print_text(render(compare_table(rows, base), fmt))

