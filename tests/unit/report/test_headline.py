"""report.md and report.html open with the answer: the title, what was found, what was tested."""

from __future__ import annotations

from pathlib import Path

from loadgen.report.headline import about, title, verdict
from loadgen.report.html import render_html
from loadgen.report.summary import render_markdown
from loadgen.results.rundir import rebuild_summary

RUN = Path(__file__).parents[2] / "data" / "rundir-v2"


def test_a_search_opens_with_its_answer_and_what_it_tested() -> None:
    summary = rebuild_summary(RUN)
    assert title(summary) == "v2: loadgen-sim on loadgen's simulator"
    assert verdict(summary)[0] == "max concurrency meeting the SLOs: 4; TPOT p99 binds at 5 (13.00 ms > 12 ms), stopped early"
    tested = dict(about(summary))
    assert tested["Load"] == "search by concurrency in 1..16"
    assert tested["Objectives"] == "TTFT p99 <= 100 ms, TPOT p99 <= 12 ms, error rate <= 1%"
    assert tested["Workload"] == "multi-turn x2 (input 32 / output 8 tokens per message)"
    md = render_markdown(summary).splitlines()
    assert md[0] == "# v2: loadgen-sim on loadgen's simulator"
    assert md[2] == f"**{verdict(summary)[0]}**"
    assert "- Objectives: TTFT p99 <= 100 ms, TPOT p99 <= 12 ms, error rate <= 1%" in md[:16]
    html = render_html(summary, RUN)
    assert "<title>v2: loadgen-sim on loadgen&#x27;s simulator: loadgen report</title>" in html
    assert html.index('class="verdict"') < html.index("<h2>Tables</h2>")


def test_a_sweep_opens_with_its_highest_throughput() -> None:
    summary = rebuild_summary(RUN)
    # without its search: the cells as a sweep, the best by output tokens/s named with its load
    from dataclasses import replace

    sweep = replace(summary, capacity=())
    best = max(sweep.measured, key=lambda c: c.metrics.output_throughput or 0)  # type: ignore[union-attr]
    assert best.metrics is not None
    line = verdict(sweep)[0]
    assert line.startswith(f"highest output throughput: {best.metrics.output_throughput:,.1f} tok/s")
    assert line.endswith(f"in cell {best.number}, closed loop of {best.params['concurrency']}")


def test_data_files_hold_numbers_not_strings() -> None:
    from loadgen.report.tables import Table, plain, render_csv, render_json

    assert [plain(c) for c in ("-", "36.8%", "0.0%", "21", "20.50", "1e-3", "vllm 0.32.0", "8 (stopped early)")] == [
        None, 0.368, 0.0, 21, 20.5, 0.001, "vllm 0.32.0", "8 (stopped early)"]
    table = Table(("engine", "QPS", "rate", "cache hits"), (("vllm", "12.345", "-", "36.8%"),))
    assert render_csv(table) == "engine,QPS,rate,cache hits\nvllm,12.345,,0.368\n"
    assert '"rate": null' in render_json(table)
    assert '"cache hits": 0.368' in render_json(table)


def test_a_searchs_capacity_chart_comes_first() -> None:
    from loadgen.report.html import charts

    summary = rebuild_summary(RUN)
    assert [t for t, _ in charts(summary, RUN)][0] == "Capacity search"


def test_latency_charts_draw_the_objectives() -> None:
    from loadgen.report.charts import slo_bounds

    assert slo_bounds(rebuild_summary(RUN)) == {"TTFT": [("objective p99", 100.0)], "TPOT": [("objective p99", 12.0)]}
