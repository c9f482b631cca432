"""The progress bar: tokens/s and the median TTFT of the latest requests while a cell runs, the
cell's own figures once it ends."""

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
    assert task.fields["ttft"] in ("30.0", "20.0")  # redrawn a few times a second: the first or the latest
    metrics = summarize(records)
    bar.cell_finished(cell, CellSummary(0, cell.params(), "done", None, "", ServerInfo(), metrics))
    assert task.fields["ttft"] == "30.0"
    assert task.fields["tps"] == f"{metrics.output_throughput:,.0f}"
    bar.close()
