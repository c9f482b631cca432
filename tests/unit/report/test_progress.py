"""The progress bar: tokens/s and the TTFT p50/p99 of the latest requests while a cell runs, the
cell's own figures once it ends; a narrow terminal drops the bar, never a figure."""

from __future__ import annotations

import io

from rich.console import Console

from loadgen.report.progress import ProgressObserver
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.metrics import summarize
from loadgen.results.summary import CellSummary
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells
from tests.helpers.records import rec


def test_the_bar_shows_ttft_and_ends_on_the_cells_figures() -> None:
    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 3}, "load": {"concurrency": 2}}))
    bar = ProgressObserver(Console(file=io.StringIO(), width=120))
    bar.cell_started(cell, 3, 1)
    # TTFT 20, 40 and 30 ms: the median is 30 ms
    records = [rec(i, float(i), (ttft, ttft + 0.01), (1, 1), float(i) + ttft + 0.01) for i, ttft in
               enumerate((0.020, 0.040, 0.030))]
    for r in records:
        bar.record(r)
    task = bar.progress.tasks[0]
    assert task.completed == 3
    # redrawn a few times a second: the first (20 ms alone) or the latest (median 30, p99 the 40 ms)
    assert task.fields["ttft"] in ("30.0/40.0", "20.0/20.0")
    metrics = summarize(records)
    bar.cell_finished(cell, CellSummary(0, cell.params(), "done", None, "", ServerInfo(), metrics))
    # the cell's own p50 and p99 (numpy's, interpolated: 30 + 0.98 x 10 = 39.8 ms)
    assert task.fields["ttft"] == "30.0/39.8"
    assert task.fields["tps"] == f"{metrics.output_throughput:,.0f}"
    bar.close()


def test_a_narrow_terminal_drops_the_bar_and_the_lengths() -> None:
    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 3}, "load": {"concurrency": 2}}))
    wide, narrow = (ProgressObserver(Console(file=io.StringIO(), width=w)) for w in (120, 80))
    for bar in (wide, narrow):
        bar.cell_started(cell, 3, 1)
    assert len(wide.progress.columns) == len(narrow.progress.columns) + 1
    assert wide.progress.tasks[0].description.startswith("cell 1/1 in=")
    assert narrow.progress.tasks[0].description == "cell 1/1 c=2"
    for bar in (wide, narrow):
        bar.close()


def line_of(bar: ProgressObserver, width: int) -> str:
    """The progress line as a terminal ``width`` columns wide shows it."""
    text = io.StringIO()
    Console(file=text, width=width).print(bar.progress.make_tasks_table(bar.progress.tasks))
    return text.getvalue().rstrip("\n")


def test_80_columns_hold_a_large_runs_line_whole_and_the_making_of_its_requests() -> None:
    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 200_000}, "load": {"concurrency": 64}}))
    bar = ProgressObserver(Console(file=io.StringIO(), width=80))
    bar.preparing(cell, 2000, 200_000, 1)
    bar.preparing(cell, 52_000, 200_000, 1)
    making = line_of(bar, 80)
    assert making.startswith("cell 1/1: making requests  52000/200000 ")
    assert "tok/s" not in making
    bar.cell_started(cell, 200_000, 1)
    assert len(bar.progress.tasks) == 1  # the making line gave way to the cell's
    bar.progress.update(bar.progress.tasks[0].id, completed=199_999)
    bar.tps, bar.ttft, bar.errors = "148,136", "112.5/245.1", 12
    bar._update(advance=1)
    line = line_of(bar, 80)
    # (before: "cell 1/1 c=64   2630/2… 55,510 tok/s TTFT p50/p99 10.1/18.4 ms errors 0 0:00:03")
    assert line.startswith("cell 1/1 c=64 200000/200000 148,136 tok/s TTFT 112.5/245.1 ms errors 12 ")
    assert "…" not in line
    assert len(line) <= 80
    bar.close()


def test_the_live_rate_counts_exactly_the_tokens_of_its_window() -> None:
    from loadgen.report.progress import LiveRate

    # one stream, back to back: a request a second from 0 to 9, 10 tokens each arriving
    # 0.075, 0.175, ... 0.975 s after it was sent (two in its 5th chunk: 9 chunks, 10 tokens)
    offsets = tuple(k / 10 - 0.025 for k in (1, 2, 3, 4, 5, 7, 8, 9, 10))
    tokens = (1, 1, 1, 1, 2, 1, 1, 1, 1)
    live = LiveRate(window_s=3.0)
    live.add(rec(0, 0.0, offsets, tokens, 0.975))
    # the window would start before the first send: the tokens over the time since it
    assert live.rate() == 10 / 0.975
    for i in range(1, 10):
        live.add(rec(i, float(i), offsets, tokens, i + 0.975))
    # the last end 9.975, the longest request 0.975 s: the window is (6, 9], which holds the
    # requests sent at 6, 7 and 8 whole and none of those sent at 5 (last token 5.975) or 9
    assert live.rate() == 30 / 3.0
    # a record whose chunk times and token counts differ in length counts the pairs it has
    live.add(rec(10, 10.0, offsets, tokens[:3], 10.975))
    assert live.rate() == 30 / 3.0  # window (7, 10]: 7, 8, 9
    live.add(rec(11, 11.0, offsets, tokens, 11.975))
    assert live.rate() == (10 + 10 + 3) / 3.0  # window (8, 11]: 8, 9 and the three pairs of 10


def test_80_columns_wrap_long_figures_whole_onto_a_second_line() -> None:
    """1,000 prompts, TTFTs of two minutes, a rate and a long cell count: more than 80 columns
    hold. The figures go on a second line, whole (before: "1…" and "0:0…")."""
    (cell,) = expand_cells(parse_scenario({"workload": {"num_prompts": 1000}, "load": {"concurrency": 1024}}))
    bar = ProgressObserver(Console(file=io.StringIO(), width=80))
    bar.cell_started(cell, 1000, 24)
    for r in [rec(i, float(i), (ttft, ttft + 0.5), (1, 1), float(i) + ttft + 0.5)
              for i, ttft in enumerate((124.674, 130.0005, 98.25))]:
        bar.next_rate = 0.0  # (redrawn at each, not a few times a second)
        bar.record(r)
    bar.tps, bar.errors = "1,148,136", 1234
    bar._update()
    text = line_of(bar, 80)
    assert "…" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
    joined = " ".join(text.split())
    for figure in ("cell 1/24 c=1024", "3/1000", "1,148,136 tok/s", "TTFT 124,674/130,000 ms", "errors 1234"):
        assert figure in joined, (figure, text)
    bar.close()
