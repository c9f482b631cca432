"""Charts drawn from a run's records, for any run (one cell included):

- ``load.png``: output tokens/s and requests/s against the concurrency or rate of the cells, one
  line per combination of the other axes (a sweep of two or more loads).
- ``distributions.png``: TTFT, TPOT and E2E latency as cumulative distributions, one line per
  cell: where the tail starts, not only its p99.
- ``timeline.png``: every request from send to last token (first token marked), coloured by
  cell, as vLLM's ``--plot-timeline``; at most ``TIMELINE_MAX`` requests, evenly chosen.

Every axis of a quantity starts at zero, so a change of 0.3% does not fill a panel.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadgen.report.layouts import axis_title, axis_value, varying_axes
from loadgen.results.records import RequestRecord
from loadgen.results.rundir import write_file
from loadgen.results.summary import CellSummary, Summary

TIMELINE_MAX = 4000


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def cell_label(cell: CellSummary, axes: list[str]) -> str:
    """A cell in a legend: the parameters the run's cells differ by, else its number."""
    parts = [f"{axis_title(k).lower()} {axis_value(cell.params.get(k))}" for k in axes]
    return ", ".join(parts) or f"cell {cell.number}"


def save(fig: Any, path: Path, dpi: int = 120) -> Path:
    """The figure into ``path`` (its format from the suffix), written whole or not at all."""
    image = io.BytesIO()
    fig.savefig(image, format=path.suffix.lstrip("."), dpi=dpi)
    pyplot().close(fig)
    write_file(path, image.getvalue())
    return path


def plot_load(summary: Summary, path: Path) -> Path | None:
    """Throughput against the load: needs two or more cells that differ in concurrency or rate."""
    cells = [c for c in summary.measured if c.probe is None]
    axes = varying_axes(cells)
    load = "rate" if "rate" in axes else ("concurrency" if "concurrency" in axes else None)
    if load is None or any(c.params.get(load) in (None, "unlimited") for c in cells):
        return None
    others = [k for k in axes if k != load]
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for c in cells:
        m = c.metrics
        assert m is not None
        key = ", ".join(f"{axis_title(k).lower()} {axis_value(c.params.get(k))}" for k in others) or "all cells"
        # a closed loop that fell short of its concurrency is drawn where it ran (no false knee)
        x = c.concurrency_ran if load == "concurrency" and c.concurrency_ran is not None else c.params[load]
        lines.setdefault(key, []).append((float(x), m.output_throughput or 0.0, m.request_throughput or 0.0))
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, pts in lines.items():
        pts.sort()
        left.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
        right.plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=name)
    xlabel = "request rate (requests/s)" if load == "rate" else "concurrency (most requests in flight)"
    for ax, ylabel in ((left, "output tokens/s"), (right, "requests/s (completed)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(f"{summary.scenario}: throughput against {load}")
    fig.tight_layout()
    return save(fig, path)


METRICS: tuple[tuple[str, Callable[[RequestRecord], float | None]], ...] = (
    ("TTFT", lambda r: r.ttft_s),
    ("TPOT", lambda r: r.tpot_s),
    ("E2E latency", lambda r: r.e2e_s),
)


def measured_by_cell(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    """Each cell's successful measured requests (no warm-up, no failure, no cancellation)."""
    out: dict[int, list[RequestRecord]] = {}
    for r in records:
        if not r.warmup and r.ok and r.first_token_at is not None:
            out.setdefault(r.cell, []).append(r)
    return out


SLO_KEYS = {"TTFT": "ttft_ms", "TPOT": "tpot_ms", "E2E latency": "e2e_ms"}


def slo_bounds(summary: Summary) -> dict[str, list[tuple[str, float]]]:
    """Each latency's objectives as the run set them (a search's, or the scenario's slo), by
    chart name: (label, ms)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for name, key in SLO_KEYS.items():
        found: dict[tuple[str, float], None] = {}
        for cap in summary.capacity:
            stats = cap.slo.get(key)
            if isinstance(stats, dict):
                found.update({(f"objective {stat}", float(bound)): None for stat, bound in stats.items()})
        for c in summary.measured:
            if c.metrics is not None and c.metrics.slo and (bound := c.metrics.slo.get(key)) is not None:
                found[("objective", float(bound))] = None
        if found:
            out[name] = list(found)
    return out


def plot_distributions(summary: Summary, records: list[RequestRecord], path: Path) -> Path | None:
    """TTFT, TPOT and E2E as cumulative distributions (ms), a line per cell, each objective a
    dashed line at its bound."""
    by_cell = measured_by_cell(records)
    cells = [c for c in summary.measured if by_cell.get(c.cell)]
    if not cells:
        return None
    axes_k = varying_axes(cells)
    bounds = slo_bounds(summary)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, (name, value) in zip(axes, METRICS, strict=True):
        seen: list[float] = []
        for label, ms in bounds.get(name, []):
            ax.axvline(ms, color="#d62728", linestyle="--", linewidth=1.2)
            ax.annotate(f"{label} {ms:g} ms", (ms, 0.04), rotation=90, fontsize=7, color="#d62728",
                        xytext=(3, 0), textcoords="offset points")
            seen.append(ms)
        for c in cells:
            xs = np.sort([v * 1e3 for r in by_cell[c.cell] if (v := value(r)) is not None])
            if xs.size:
                ys = np.arange(1, xs.size + 1) / xs.size
                ax.step(xs, ys, where="post", label=cell_label(c, axes_k))
                seen += [float(xs[0]), float(xs[-1])]
        # a distribution is read over the data's range: from zero, tight curves would be
        # vertical lines on the frame; the label says where the axis starts when it is not zero
        lo, hi = (min(seen), max(seen)) if seen else (0.0, 1.0)
        pad = (hi - lo) * 0.05 or max(hi * 0.05, 0.01)
        left = max(lo - pad, 0.0)
        ax.set_xlim(left, hi + pad)
        ax.set_xlabel(f"{name} (ms)" + (f", axis from {left:.3g} ms, not zero" if left > 0 else ""))
        ax.set_ylabel("share of requests at or below")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    if 1 < len(cells) <= 12:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"{summary.scenario}: latency distributions")
    fig.tight_layout()
    return save(fig, path)


def plot_timeline(summary: Summary, records: list[RequestRecord], path: Path) -> Path | None:
    """A line per request from send to last token, its first token marked, coloured by cell."""
    by_cell = measured_by_cell(records)
    rows = sorted((r for rs in by_cell.values() for r in rs), key=lambda r: r.sent_at or 0.0)
    if not rows:
        return None
    total = len(rows)
    if total > TIMELINE_MAX:
        rows = [rows[int(i)] for i in np.linspace(0, total - 1, TIMELINE_MAX)]
    from matplotlib.collections import LineCollection

    plt = pyplot()
    t0 = min(r.sent_at or 0.0 for r in rows)
    cells = {c.cell: c for c in summary.cells}
    axes_k = varying_axes([cells[k] for k in by_cell if k in cells])
    colours = plt.get_cmap("tab10")
    order = sorted(by_cell)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for i, k in enumerate(order):
        mine = [(y, r) for y, r in enumerate(rows) if r.cell == k]
        if not mine:
            continue
        colour = colours(i % 10)
        segments = [[((r.sent_at or 0.0) - t0, y), ((r.last_token_at or r.done_at or 0.0) - t0, y)] for y, r in mine]
        ax.add_collection(LineCollection(segments, colors=[colour], linewidths=1.0))
        ax.plot([(r.first_token_at or 0.0) - t0 for _, r in mine], [y for y, _ in mine], "|", color=colour,
                markersize=3, label=cell_label(cells[k], axes_k) if k in cells else f"cell {k}")
    ax.set_xlim(left=0, right=max((r.last_token_at or r.done_at or 0.0) - t0 for r in rows) * 1.01 or 1.0)
    ax.set_ylim(-1, len(rows))
    ax.set_xlabel("time since the first request was sent (s)")
    ax.set_ylabel("request (in order sent)")
    shown = "" if total == len(rows) else f" ({len(rows)} of {total} requests, evenly chosen)"
    ax.set_title(f"{summary.scenario}: each request from its send to its last token; a tick marks its first "
                 f"token{shown}", fontsize=10)
    if 1 < len(order) <= 12:
        ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


def plot_windows(summary: Summary, path: Path) -> Path | None:
    """Each cell over its time windows: output tok/s, requests in flight, TTFT p50 (solid) and
    p99 (dashed), from the cell's first send; its steady window shaded. Needs a cell of two
    windows or more."""
    cells = [c for c in summary.measured if c.metrics is not None and len(c.metrics.windows) >= 2]
    if not cells:
        return None
    axes_k = varying_axes(cells)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for i, c in enumerate(cells):
        m = c.metrics
        assert m is not None
        colour = f"C{i % 10}"
        xs = [(w.start_s + w.end_s) / 2 for w in m.windows]
        label = cell_label(c, axes_k)
        axes[0].plot(xs, [w.output_tokens_per_s for w in m.windows], "o-", color=colour, label=label, markersize=3)
        axes[1].plot(xs, [w.in_flight for w in m.windows], "o-", color=colour, markersize=3)
        for q, style in (("p50", "-"), ("p99", "--")):
            axes[2].plot(xs, [None if (v := getattr(w, f"ttft_{q}_s")) is None else v * 1e3 for w in m.windows],
                         style, color=colour)
        if m.steady_state is not None and len(cells) <= 4:
            for ax in axes:
                ax.axvspan(m.steady_state.start_s, m.steady_state.end_s, color=colour, alpha=0.08)
    for ax, ylabel in zip(axes, ("output tok/s", "requests in flight (mean)", "TTFT p50 / p99 (ms)"), strict=True):
        ax.set_xlabel("seconds since the cell's first request")
        ax.set_ylabel(ylabel)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    if 1 < len(cells) <= 12:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"{summary.scenario}: each cell over time (steady state shaded)")
    fig.tight_layout()
    return save(fig, path)

