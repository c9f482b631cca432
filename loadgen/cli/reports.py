"""`loadgen report` and `loadgen compare`: re-render run directories without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer

from loadgen.cli.console import err, handles_errors, out, print_summary, print_text
from loadgen.cli.root import Command, app
from loadgen.errors import UsageError


@app.command(cls=Command)
@handles_errors
def report(
    run_dirs: Annotated[list[Path], typer.Argument(metavar="RUN_DIR", help="run directories")],
    table: Annotated[
        str | None,
        typer.Option(help="single-stream | throughput | capacity | compare | sweep (default: the scenario's kind)"),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="console | md | rst | csv | json | llmd "
                                     "(llm-d's Benchmark Report v0.2.1, one per cell, as a JSON array)")] = "console",
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

    check_choice("--format", fmt, (*FORMATS, "llmd"))
    check_choice("--table", table, TABLES)
    for run_dir in run_dirs:
        summary = rebuild_summary(run_dir)
        if fmt == "llmd":  # llm-d's Benchmark Report v0.2.1, one per measured cell
            from loadgen.report.llmd import benchmark_reports

            print_text(orjson.dumps(benchmark_reports(summary, run_dir), option=orjson.OPT_INDENT_2).decode())
            continue
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
            from loadgen.report.summary import render_markdown

            print_text(render_markdown(summary))
        else:
            out().print(f"{run_dir}", style="bold", markup=False, highlight=False)
            print_summary(summary)


@app.command(cls=Command)
@handles_errors
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(
        metavar="RUN_DIR", help="run directories; the first is the baseline the others are measured against")],
    baseline: Annotated[
        Path | None, typer.Option(metavar="RUN_DIR", help="the baseline, if not the first run directory")
    ] = None,
    label: Annotated[list[str] | None, typer.Option(
        metavar="NAME", help="a run's name in the output; repeatable, once per run in order (default: its "
        "model, engine and quantization)")] = None,
    table: Annotated[str, typer.Option(
        metavar="TABLE", help="changes: each matched cell's latency and throughput with 95% intervals and a "
        "verdict | cross-engine: the published comparison (Avg Tok/s, Max Mem, Speed X, Max mem %)")] = "changes",
    fmt: Annotated[str, typer.Option("--format", metavar="FORMAT", help="md | csv | json (and rst for "
                                     "--table cross-engine)")] = "md",
    min_change: Annotated[float, typer.Option(
        metavar="PERCENT", help="a smaller change is never called better or worse, whatever its interval")] = 2.0,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="also write compare.md, .csv, .json, .png (latency against throughput, "
        "every run on one chart) and a self-contained compare.html")] = None,
) -> None:
    """Runs against a baseline: per matched cell, the change of TTFT, TPOT, ITL and E2E (p50, p99),
    requests/s and output tok/s, with a 95% interval and a verdict (better, worse, within noise)."""
    from loadgen.report.comparison import compare_all, load_runs, render_text, write_outputs
    from loadgen.report.layouts import compare_rows, compare_table
    from loadgen.report.tables import render
    from loadgen.results.rundir import rebuild_summary

    if table not in ("changes", "cross-engine"):
        raise UsageError(f"--table {table!r}: choose changes or cross-engine")
    formats = ("md", "rst", "csv", "json") if table == "cross-engine" else ("md", "csv", "json")
    if fmt not in formats:
        raise UsageError(f"--format {fmt!r}: choose {', '.join(formats[:-1])} or {formats[-1]}")
    if min_change < 0:
        raise UsageError(f"--min-change {min_change:g}: a percentage of 0 or more, such as 2")
    dirs = list(dict.fromkeys([baseline, *run_dirs] if baseline is not None else run_dirs))
    if table == "changes" and len(dirs) < 2:
        raise UsageError("compare needs two run directories or more: the baseline first, then the runs to "
                         "measure against it")
    if len(label or []) > len(dirs):
        raise UsageError(f"--label given {len(label or [])} times for {len(dirs)} runs: one per run, in order")
    summaries = [rebuild_summary(d) for d in dirs]
    if table == "cross-engine":
        rows, base = compare_rows([(str(d), s) for d, s in zip(dirs, summaries, strict=True)],
                                  (str(dirs[0]), summaries[0]))
        if base < 0:
            raise UsageError(f"{dirs[0]}: the baseline has no finished cell to compare against")
        print_text(render(compare_table(rows, base), fmt))
        return
    runs = load_runs(dirs, summaries, list(label or []))
    comparisons = compare_all(runs, min_change / 100)
    print_text(render_text(runs[0], comparisons, fmt, min_change / 100))
    if out_dir is not None:
        written = write_outputs(out_dir, runs[0], comparisons, runs, min_change / 100)
        err().print(f"wrote {', '.join(p.name for p in written)} into {out_dir}", markup=False, highlight=False)
