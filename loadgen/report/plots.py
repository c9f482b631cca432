"""PNG charts of a run, written into its run directory (matplotlib, no display needed).

- ``speed.png``: single-stream speed against input length, one line per quantization (and
  engine), one panel per model; the bars are the spread over repeats (min to max).
- ``throughput.png``: total and output tokens/s per checkpoint, req/s written on each bar.
- ``latency.png``: for a concurrency or rate sweep, output tokens/s against TTFT and TPOT
  (p50 and p99), each point labelled with its concurrency or rate.
- ``capacity.png``: a capacity search's probes against its SLOs (``loadgen.report.capacity``).
- ``load.png``, ``distributions.png``, ``timeline.png``: see ``loadgen.report.charts``.

Quantities are drawn from zero (a bar, a throughput, a latency), so small changes look small.
"""

from __future__ import annotations

from pathlib import Path

from loadgen.report.capacity import write_capacity_plots
from loadgen.report.charts import plot_distributions, plot_load, plot_timeline, plot_windows, save
from loadgen.report.charts import pyplot as _pyplot
from loadgen.report.layouts import (
    ENGINE_LABELS,
    axis_title,
    axis_value,
    model_label,
    quant_label,
    speed_of,
    varying_axes,
)
from loadgen.results.figures import Distribution
from loadgen.results.records import read_records
from loadgen.results.rundir import RECORDS
from loadgen.results.summary import Summary


def plot_speed(summary: Summary, path: Path) -> Path | None:
    panels: dict[str, dict[str, list[tuple[int, float, float, float]]]] = {}
    for cell in summary.cells:
        dist = speed_of(summary, cell)
        if dist.mean is None or dist.min is None or dist.max is None:
            continue
        s = cell.server
        engine = str(s.backend)
        line = f"{quant_label(s)} ({ENGINE_LABELS.get(engine, engine)})"
        panels.setdefault(model_label(s), {}).setdefault(line, []).append(
            (int(cell.params["input_tokens"]), dist.mean, dist.min, dist.max)
        )
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (model, lines) in zip(axes[0], panels.items(), strict=True):
        for label, pts in lines.items():
            pts.sort()
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label)
        ax.set_xscale("symlog", linthresh=1)
        ticks = sorted({p[0] for pts in lines.values() for p in pts})
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_title(model)
        ax.set_xlabel("input length (tokens)")
        ax.set_ylabel("speed (total tokens/s)" if summary.speed == "total" else "speed (generated tokens/s)")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(f"{summary.scenario}: single-stream speed (batch 1)")
    fig.tight_layout()
    return save(fig, path)


def plot_throughput(summary: Summary, path: Path) -> Path | None:
    bars = []
    axes = varying_axes(list(summary.measured))
    for cell in summary.cells:
        m = cell.metrics
        if m is None or m.total_token_throughput is None:
            continue
        s = cell.server
        label = f"{model_label(s)}\n{quant_label(s)}, {cell.params.get('num_prompts')} prompts"
        label += "".join(f"\n{axis_title(k).lower()} {axis_value(cell.params.get(k))}" for k in axes)
        bars.append((label, m.total_token_throughput, m.output_throughput or 0.0, m.request_throughput or 0.0))
    if not bars:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.8 * len(bars)), 4.5))
    xs = range(len(bars))
    ax.bar([x - 0.2 for x in xs], [b[1] for b in bars], width=0.4, label="total tokens/s")
    ax.bar([x + 0.2 for x in xs], [b[2] for b in bars], width=0.4, label="output tokens/s")
    for x, b in zip(xs, bars, strict=True):
        ax.annotate(f"{b[3]:.2f} req/s", (x - 0.2, b[1]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [b[0] for b in bars], fontsize=8)
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{summary.scenario}: throughput")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return save(fig, path)


def plot_latency(summary: Summary, path: Path) -> Path | None:
    pts: list[tuple[float, Distribution, Distribution, str]] = []
    for cell in summary.cells:
        m = cell.metrics
        if m is None or m.output_throughput is None:
            continue
        p = cell.params
        label = f"c={p['concurrency']}" if p.get("rate") is None else f"{p['rate']:g}/s"
        pts.append((m.output_throughput, m.ttft_s, m.tpot_s, label))
    if len(pts) < 2:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, name in ((axes[0], "TTFT"), (axes[1], "TPOT")):
        dists = [(p[0], p[1] if name == "TTFT" else p[2], p[3]) for p in pts]
        for q, style in (("p50", "o-"), ("p99", "s--")):
            xs = [x for x, d, _ in dists if d.get(q) is not None]
            ys = [(d.get(q) or 0.0) * 1e3 for _, d, _ in dists if d.get(q) is not None]
            ax.plot(xs, ys, style, label=f"{name} {q}")
        # room above the highest point and right of the last label: nothing on the frame or cut
        top = max([(d.get(q) or 0.0) * 1e3 for _, d, _ in dists for q in ("p50", "p99")] or [1.0])
        right = max(x for x, _, _ in dists) or 1.0
        placed: list[tuple[float, float]] = []
        for x, d, label in sorted(dists, key=lambda p: p[0]):
            if d.p50 is None:
                continue
            y = d.p50 * 1e3
            # near saturation the points crowd together: a label that would overlap one already
            # placed is left out (the interactive chart of report.html shows every point's load)
            if any(abs(x - px) < 0.06 * right and abs(y - py) < 0.06 * top for px, py in placed):
                continue
            placed.append((x, y))
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tok/s")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_xlim(0, max(x for x, _, _ in dists) * 1.15 or 1.0)
        ax.set_ylim(0, top * 1.15 or 1.0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"{summary.scenario}: latency against throughput")
    fig.tight_layout()
    return save(fig, path)


def write_plots(
    summary: Summary, run_dir: Path, out_dir: Path | None = None, suffix: str = "png",
    skip: frozenset[str] = frozenset(),
) -> list[Path]:
    """The charts that fit the run (into ``out_dir``, default the run directory, as PNG or SVG),
    but those named in ``skip`` (by file stem: drawn otherwise); returns the files written."""
    out = out_dir or run_dir
    kind = summary.kind
    made = []
    if kind == "single-stream":
        made.append(plot_speed(summary, out / f"speed.{suffix}"))
    if kind == "throughput":
        made.append(plot_throughput(summary, out / f"throughput.{suffix}"))
    if kind != "single-stream" and not summary.capacity:
        if "latency" not in skip:
            made.append(plot_latency(summary, out / f"latency.{suffix}"))
        if "load" not in skip:
            made.append(plot_load(summary, out / f"load.{suffix}"))
    records = list(read_records(run_dir / RECORDS)) if (run_dir / RECORDS).exists() else []
    if "distributions" not in skip:
        made.append(plot_distributions(summary, records, out / f"distributions.{suffix}"))
    made.append(plot_timeline(summary, records, out / f"timeline.{suffix}"))
    made.append(plot_windows(summary, out / f"windows.{suffix}"))
    capacity = write_capacity_plots(summary, run_dir) if suffix == "png" and out == run_dir else []
    return [p for p in made if p is not None] + capacity
