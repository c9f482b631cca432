"""The live progress bar of ``loadgen run``: requests done / total, output tokens/s, errors."""

from __future__ import annotations

import time
from collections import deque

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from loadgen.results.records import RequestRecord
from loadgen.results.summary import CellSummary
from loadgen.scenario.matrix import Cell


class ProgressObserver:
    """Live progress: requests done / total, current output tokens/s, errors."""

    WINDOW_S = 3.0

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tps]:>9} tok/s"),
            TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.errors = 0
        self.recent: deque[tuple[float, int]] = deque()

    def message(self, text: str) -> None:
        self.console.print(text, style="dim", markup=False, highlight=False, soft_wrap=True)

    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
        if self.task is None:
            self.progress.start()
        self.errors = 0
        self.recent.clear()
        p = cell.params()
        desc = (
            f"cell {cell.index + 1}/{cells} in={p['input_tokens']} "
            f"out={p['output_tokens']} c={p['concurrency']}"
        )
        if p["rate"] is not None:
            desc += f" rate={p['rate']:g}"
        self.task = self.progress.add_task(desc, total=total, tps="-", errors=0)

    def record(self, record: RequestRecord) -> None:
        if record.warmup or self.task is None:
            return
        now = time.monotonic()
        if record.ok:
            self.recent.append((now, record.output_tokens))
        elif record.error != "cancelled":
            self.errors += 1
        while self.recent and now - self.recent[0][0] > self.WINDOW_S:
            self.recent.popleft()
        span = min(self.WINDOW_S, max(now - self.recent[0][0], 0.5)) if self.recent else 1.0
        tps = sum(n for _, n in self.recent) / span
        self.progress.update(self.task, advance=1, tps=f"{tps:,.0f}", errors=self.errors)

    def cell_finished(self, cell: Cell, summary: CellSummary) -> None:
        pass

    def close(self) -> None:
        self.progress.stop()
