"""Charts a reader can read, checked on the figures themselves: a distribution over the data's
range with its axis marked when it does not start at zero, nothing on the frame of the latency
chart, a timeline title that says what is drawn."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from loadgen.report import charts, plots
from loadgen.results.records import read_records
from loadgen.results.rundir import rebuild_summary

FIXTURE = Path(__file__).parents[2] / "data" / "rundir-v2"


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the charts make, kept instead of saved."""
    kept: list[Any] = []

    def keep(fig: Any, path: Path, dpi: int = 120) -> Path:
        fig.canvas.draw()
        kept.append(fig)
        return path

    monkeypatch.setattr(charts, "save", keep)
    monkeypatch.setattr(plots, "save", keep, raising=False)
    return kept


def run(tmp_path: Path) -> tuple[Any, list[Any]]:
    shutil.copytree(FIXTURE, tmp_path / "run")
    summary = rebuild_summary(tmp_path / "run")
    return summary, list(read_records(tmp_path / "run" / "records.jsonl"))


def test_distributions_span_the_data_and_say_where_the_axis_starts(tmp_path: Path, figures: list[Any]) -> None:
    summary, records = run(tmp_path)
    assert charts.plot_distributions(summary, records, tmp_path / "d.png") is not None
    (fig,) = figures
    for ax in fig.axes:
        xs = [x for line in ax.get_lines() for x in line.get_xdata()]
        lo, hi = ax.get_xlim()
        assert lo <= min(xs)
        assert max(xs) <= hi
        span = max(xs) - min(xs)
        assert hi - lo <= span * 1.2 + 0.05  # and the data fill the width (no zero-based squeeze)
        if lo > 0:
            assert ax.get_xlabel().endswith(f"axis from {lo:.3g} ms, not zero")


def test_the_latency_chart_keeps_points_and_labels_off_the_frame(tmp_path: Path, figures: list[Any]) -> None:
    summary, _ = run(tmp_path)
    assert plots.plot_latency(summary, tmp_path / "l.png") is not None
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        top = ax.get_ylim()[1]
        ys = [y for line in ax.get_lines() for y in line.get_ydata()]
        assert max(ys) < top * 0.9  # no point on the top border
        frame = ax.get_window_extent(renderer)
        for text in ax.texts:  # each point's label lies inside the plot
            box = text.get_window_extent(renderer)
            assert frame.x0 <= box.x0
            assert box.x1 <= frame.x1
            assert frame.y0 <= box.y0
            assert box.y1 <= frame.y1


def test_the_timeline_title_says_what_is_drawn(tmp_path: Path, figures: list[Any]) -> None:
    summary, records = run(tmp_path)
    assert charts.plot_timeline(summary, records, tmp_path / "t.png") is not None
    (fig,) = figures
    title = fig.axes[0].get_title()
    assert "each request from its send to its last token; a tick marks its first token" in title
    assert "| first token" not in title
