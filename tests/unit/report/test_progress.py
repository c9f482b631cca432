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
from tests.unit.results.test_metrics import rec


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
