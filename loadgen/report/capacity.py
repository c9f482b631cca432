"""A capacity search for people: its probes as a table, the answer as one sentence, searches
across a matrix as a comparison table (one row per engine, quantization and length), and a
chart of each SLO'd figure and the throughput against the load, the SLO lines drawn and the
answer marked (``capacity.png``; ``capacity-N.png`` for search N of several).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from loadgen.report.charts import save
from loadgen.report.layouts import model_label, quant_label, software_label
from loadgen.report.tables import Table
from loadgen.results.capacity import ERROR_RATE, QUEUE, objective_label, ran_starved
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.probe import CapacityAnswer, Objectives, ProbeRow
from loadgen.results.summary import CellSummary, Summary


def _value(by: str, v: float | None) -> str:
    if v is None:
        return "-"
    return str(int(v)) if by == "concurrency" else f"{v:.4g}"


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _figure(key: str, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1%}" if key == ERROR_RATE else f"{v:.2f}"


def objective_keys(cap: CapacityAnswer) -> list[str]:
    """The objectives a search checked, in the order its figures are kept."""
    keys: list[str] = []
    for probe in cap.probes:
        keys += [k for k in probe.figures if k not in keys]
    return keys


def _verdict(probe: ProbeRow) -> str:
    if probe.meets_slo:
        return "meets"
    if not probe.broken:
        return probe.status
    text = "breaks " + ", ".join(objective_label(k) for k in probe.broken)
    return text + (" (stopped early)" if probe.stopped_early else "")


def probe_table(cap: CapacityAnswer) -> Table:
    """One row per probe, numbered in the order the search ran them."""
    keys = objective_keys(cap)
    unit = {k: "" if k == ERROR_RATE else " ms" for k in keys}
    headers = (
        "#", cap.by, *(f"{objective_label(k)}{unit[k]}" for k in keys), "req/s", "output tok/s", "goodput req/s",
        "verdict",
    )
    rows = tuple(
        (
            str(n), _value(cap.by, p.value), *(_figure(k, p.figures.get(k)) for k in keys),
            _num(p.request_throughput, 3), _num(p.output_throughput, 1), _num(p.goodput, 3), _verdict(p),
        )
        for n, p in enumerate(cap.probes, 1)
    )
    return Table(headers, rows, title=f"search by {cap.by}: {slo_text(cap.slo)}")


def slo_text(slo: Objectives) -> str:
    """``TTFT p99 <= 300 ms, TPOT p99 <= 20.25 ms, error rate <= 1%``."""
    parts = []
    for key, stats in slo.items():
        if key == "error_rate":
            parts.append(f"error rate <= {stats:.2%}".replace(".00%", "%"))
        elif isinstance(stats, dict):
            parts += [f"{objective_label(f'{key}.{s}')} <= {b:g} ms" for s, b in stats.items()]
    return ", ".join(parts)


def answer_lines(summary: Summary) -> list[str]:
    """Each search's answer in one sentence (named by its matrix point when there are several)."""
    lines = []
    for cap in summary.capacity:
        prefix = ""
        if len(summary.capacity) > 1:
            prefix = ", ".join(f"{k}={v}" for k, v in cap.labels.items()) + ": "
        lines.append(prefix + cap.answer)
        if cap.margin:
            lines.append(prefix + cap.margin)
        if (unsure := starved_probes(summary, cap)) is not None:
            lines.append(prefix + unsure)
    return lines


def starved_probes(summary: Summary, cap: CapacityAnswer) -> str | None:
    """Where probes of a search ran with their client or engine starved by other programs (their
    self-check): the answer rests on figures that hold that delay, and says so."""
    cells = {c.cell: c for c in summary.cells}
    starved = [p for p in cap.probes if (c := cells.get(p.cell)) is not None and ran_starved(c)]
    if not starved:
        return None
    at = ", ".join(f"{p.value:g}" for p in starved)
    return (f"not sure: {len(starved)} of its {len(cap.probes)} probes (at {at}) ran with the client or the engine "
            "starved by other programs (their self-check): their figures hold that delay, and a quiet machine may "
            "answer otherwise")


def _first_probe(summary: Summary, cap: CapacityAnswer) -> CellSummary | None:
    cells = {c.cell: c for c in summary.cells}
    return next((cells[p.cell] for p in cap.probes if p.cell in cells), None)


def capacity_table(summary: Summary) -> Table:
    """The comparison in SLO terms: one row per search (engine, quantization, lengths), with the
    most load meeting the SLOs, what was served there, and what binds above it."""
    by = {cap.by for cap in summary.capacity}
    what = "Concurrency" if by == {"concurrency"} else ("Rate" if by == {"rate"} else "Load")
    # matrix axes the other columns do not show (serve.tp, a setting, ...) get a column each
    shown = ("model", "quant", "backend", "engine", "input_tokens", "output_tokens")
    axes = list(dict.fromkeys(k for cap in summary.capacity for k in cap.labels if k not in shown))
    headers = ("Model", "Software", "Quantization", *axes, "Input Length", "Output Length",
               f"Max {what} at SLO", "req/s", "output tok/s", "goodput req/s", "Binds")
    rows = []
    for cap in summary.capacity:
        cell = _first_probe(summary, cap)
        server = cell.server if cell is not None else ServerInfo()
        server = replace(server, model=server.model or summary.model)
        binds = ", ".join(objective_label(k) for k in cap.limiting_slo if k != QUEUE) or (
            "queue" if QUEUE in cap.limiting_slo else "-")
        if cap.binds_at is not None:
            binds += f" at {_value(cap.by, cap.binds_at)}"
        rows.append((
            model_label(server), software_label(server), quant_label(server),
            *(str(cap.labels.get(k, "-")) for k in axes),
            str(cap.labels.get("input_tokens", "-")),
            str(cap.labels.get("output_tokens", "-")),
            _value(cap.by, cap.max_meeting_slo) + ("" if cap.complete else " (unfinished)"),
            _num(cap.request_throughput, 3), _num(cap.output_throughput, 1), _num(cap.goodput, 3), binds,
        ))
    slos = {slo_text(cap.slo) for cap in summary.capacity}
    notes = tuple(f"SLOs: {s}" for s in sorted(slos))
    if any(c.probe is not None and c.probe.ramp_left_out for c in summary.cells):
        notes += ("each probe is judged after its first wave: the first C requests of a closed loop of C, sent at "
                  "once and prefilled together, are left out where at least as many again follow",)
    return Table(headers, tuple(rows), group_columns=2, key_columns=5 + len(axes),
                 title=f"- {summary.scenario}: capacity",
                 footnotes=notes)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_ticks() -> Any:
    """Tick labels as plain numbers (1, 2, 4, ... rather than powers of 2)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}")


def plot_capacity(cap: CapacityAnswer, path: Path, title: str) -> Path | None:
    """One panel per objective (its figure per probe, the bound as a line) and one of the
    throughput; probes meeting the SLOs in green, the others in red; the answer marked."""
    probes = sorted(cap.probes, key=lambda p: p.value)
    if not probes:
        return None
    keys = objective_keys(cap)
    slo = cap.slo
    plt = _pyplot()
    n = len(keys) + 1
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.8), squeeze=False)
    xs = [p.value for p in probes]
    answer = cap.max_meeting_slo
    word = cap.by if cap.by == "concurrency" else "rate (req/s)"
    for ax, key in zip(axes[0], [*keys, "throughput"], strict=True):
        if key == "throughput":
            # a probe stopped early ran a partial window: its throughput is drawn hollow, off the line
            full = [(x, p.output_throughput) for x, p in zip(xs, probes, strict=True)
                    if not p.stopped_early and p.output_throughput is not None]
            ax.plot([x for x, _ in full], [y for _, y in full], "-", color="0.6", zorder=1)
            ax.set_ylabel("output tokens/s")
            ax.set_title("throughput")
            series = [p.output_throughput for p in probes]
        else:
            series = [p.figures.get(key) for p in probes]
            pts = [(x, y) for x, y in zip(xs, series, strict=True) if y is not None]
            ax.plot([x for x, _ in pts], [y for _, y in pts], "-", color="0.6", zorder=1)
            if key == ERROR_RATE:
                bound = slo.get("error_rate")
                ax.set_ylabel("error rate")
            else:
                metric, _, stat = key.partition(".")
                stats = slo.get(metric)
                bound = stats.get(stat) if isinstance(stats, dict) else None
                ax.set_ylabel(f"{objective_label(key)} (ms)")
            if bound is not None:
                unit = f"{bound:.2%}" if key == ERROR_RATE else f"{bound:g} ms"
                ax.axhline(bound, color="tab:red", linestyle="--", linewidth=1, label=f"objective {unit}")
                ax.legend(fontsize=8, loc="upper left")
            ax.set_title(objective_label(key))
        for x, y, p in zip(xs, series, probes, strict=True):
            if y is None:
                continue
            colour = "tab:green" if p.meets_slo else "tab:red"
            if key == "throughput" and p.stopped_early:
                ax.scatter([x], [y], marker="o", facecolors="none", edgecolors=colour, zorder=3)
            else:
                ax.scatter([x], [y], marker="o" if p.meets_slo else "x", color=colour, zorder=3)
        if answer is not None:
            ax.axvline(answer, color="tab:green", linewidth=1, alpha=0.7)
            ax.annotate(f"{_value(cap.by, answer)}", (answer, 0.97), xycoords=("data", "axes fraction"),
                        va="top", ha="right", fontsize=8, color="tab:green",
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"})
        if ax.has_data():  # an objective no probe has a figure for draws an empty panel
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(_plain_ticks())
        ax.minorticks_off()
        ax.set_xlabel(word)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{title}: {cap.answer}", fontsize=9, wrap=True)
    fig.tight_layout()
    return save(fig, path, dpi=110)


def write_capacity_plots(summary: Summary, run_dir: Path) -> list[Path]:
    made = []
    for i, cap in enumerate(summary.capacity):
        name = "capacity.png" if len(summary.capacity) == 1 else f"capacity-{i + 1}.png"
        title = summary.scenario
        if cap.labels and len(summary.capacity) > 1:
            title += " (" + ", ".join(f"{k}={v}" for k, v in cap.labels.items()) + ")"
        if (p := plot_capacity(cap, run_dir / name, title)) is not None:
            made.append(p)
    return made
