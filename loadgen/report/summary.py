"""A run's summary for people: console tables (rich) and Markdown (report.md), through the one
table renderer. Times are shown in ms."""

from __future__ import annotations

import textwrap

from rich.table import Table as RichTable
from rich.text import Text

from loadgen.data import Labels
from loadgen.report.capacity import answer_lines, capacity_table, probe_table
from loadgen.report.headline import cell_load, headline_md, load_text, workload_text
from loadgen.report.layouts import axis_title, axis_value, varying_axes
from loadgen.report.narrow import fit, wrap_parts
from loadgen.report.tables import Table, render_md
from loadgen.results.figures import Distribution
from loadgen.results.summary import CellMetrics, CellSummary, Summary

LATENCIES: tuple[tuple[str, str], ...] = (
    ("ttft_s", "TTFT"),
    ("ttft_from_schedule_s", "TTFT (from schedule)"),
    ("tpot_s", "TPOT"),
    ("itl_s", "ITL"),
    ("e2e_s", "E2E latency"),
)
COLUMNS: tuple[str, ...] = ("mean", "p50", "p90", "p95", "p99", "p99.9", "min", "max", "std")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.2f}"


def _num(v: float | None, digits: int = 2, sep: str = ",") -> str:
    return "-" if v is None else f"{v:{sep}.{digits}f}"


def latency_rows(cell: CellSummary) -> list[list[str]]:
    m = cell.metrics
    assert m is not None
    rows = []
    for key, label in LATENCIES:
        if key == "ttft_from_schedule_s" and not cell.open_loop:
            continue
        dist: Distribution = getattr(m, key)
        rows.append([label, *(_ms(dist.get(c)) for c in COLUMNS)])
    return rows


def cell_title(cell: CellSummary) -> str:
    """A cell's heading: ``[2] input 8 / output 16 tokens, closed loop of 40``; a Locust test's
    load as its users ran, not as it was set (a ramp is no closed loop of its peak)."""
    return f"[{cell.number}] {params_text(cell.params, cell_load(cell))}"


def params_text(params: Labels, load: str | None = None) -> str:
    """The workload and the load (``load``: said otherwise than by the parameters)."""
    rate = params.get("rate")
    lengths = workload_text(params)
    if load is not None:
        return f"{lengths}, {load}"
    if (schedule := params.get("schedule")) is not None:
        return f"{lengths}, {schedule}"
    return f"{lengths}, {load_text(params['concurrency'], rate)}"


def _cache_text(cell: CellSummary) -> str:
    """The server's own word on the cell: its prefix cache, and its latencies against the client's."""
    parts = []
    if cell.server_prefix_cache_hit_rate is not None:
        parts.append(f"server prefix-cache hits {cell.server_prefix_cache_hit_rate:.1%} of prompt tokens")
    if cell.cache_reset:
        parts.append(f"cache emptied before the cell ({cell.cache_reset})")
    if (ec := cell.engine_cores) is not None:  # the engine's cores: who used them while the cell ran
        parts.append(f"engine cores {','.join(map(str, ec.cores))}: engine {ec.engine_share:.0%}, "
                     f"other programs {ec.others_share:.0%}")
    if cell.engine_gap:  # the client against the engine's own histograms
        parts.append("client - engine " + ", ".join(
            f"{g.metric.upper()} {g.gap_ms:+.2f} ms" for g in cell.engine_gap if g.metric != "tpot"))
    if (e := cell.energy) is not None:
        parts.append("GPU energy " + (f"{e.gpu_energy_j:,.1f} J ({e.gpu_avg_power_w:,.1f} W, "
                                      f"{e.gpu_j_per_output_token or 0:.4f} J per output token)"
                                      if e.gpu_energy_j is not None else f"not measured: {e.gpu_reason}"))
        parts.append("CPU package energy " + (f"{e.cpu_energy_j:,.1f} J ({e.cpu_avg_power_w:,.1f} W, the whole "
                                              "package)" if e.cpu_energy_j is not None
                                              else f"not measured: {e.cpu_reason}"))
    return "".join(f" | {p}" for p in parts)


def steady_line(m: CellMetrics) -> str | None:
    """The steady window's figures, where the cell has one shorter than the whole."""
    ss = m.steady_state
    if ss is None or (ss.start_s <= 0 and ss.end_s >= m.duration_s - 1e-6):
        return None
    s = ss.metrics
    ms = [f"{name} p50 {_ms(d.p50)} ms, p99 {_ms(d.p99)} ms" for name, d in (("TTFT", s.ttft_s), ("TPOT", s.tpot_s))]
    return " | ".join([f"steady state {ss.start_s:g} to {ss.end_s:g} s: {s.requests} requests",
                       f"req/s {_num(s.request_throughput, 3)}", f"output tok/s {_num(s.output_throughput, 1)}",
                       f"in flight: mean {_num(s.mean_in_flight, 1)}", *ms])


def _throughput_line(cell: CellSummary) -> str:
    m = cell.metrics
    assert m is not None
    failures = ", ".join(f"{k} {v}" for k, v in m.failures_by_class.items()) or "none"
    parts = [f"completed {m.completed}/{m.requests}", f"failed {m.failed} ({failures})"]
    if cell.status == "interrupted":  # the cell's figures are of what it sent before the stop
        prompts = cell.params.get("num_prompts")
        of = (f" of its {prompts}" if isinstance(prompts, int) and m.requests < prompts
              and not str(cell.params.get("workload") or "").startswith("multi-turn") else "")
        parts.insert(0, f"interrupted after {m.requests} requests{of}")
    if m.cancelled:
        parts.append(f"cancelled {m.cancelled}")
    if m.failed:
        parts.append(f"throughput and latency over the {m.completed} successful requests")
    parts += [
        f"duration {m.duration_s:.2f} s",
        f"req/s {_num(m.request_throughput, 3)}",
        # embeddings: vectors and input tokens per second (no output is streamed)
        *([f"embeddings/s {_num(m.embeddings_per_s, 1)}", f"input tok/s {_num(m.total_token_throughput, 1)}"]
          if m.embeddings_per_s is not None else
          [f"output tok/s {_num(m.output_throughput, 1)}", f"total tok/s {_num(m.total_token_throughput, 1)}"]),
        f"in flight: peak {m.peak_in_flight}, mean {_num(m.mean_in_flight, 1)}",
        *([] if m.valid_json is None else [f"valid JSON {m.valid_json:.1%}" + (
            f" ({m.json_cut} answers cut at max_tokens: raise workload.output_tokens)" if m.json_cut else "")]),
        *([f"images {m.image_bytes_total / 2**20:,.2f} MiB sent"] if m.image_bytes_total else []),
        *([] if m.tool_calls is None or m.tool_calls.requests else [
            "tool calls 0: no answer called a tool (check tool_choice, and that the engine parses calls: "
            "serve.tool_parser)"]),
        *([] if m.tool_calls is None or not m.tool_calls.requests else [
            f"tool calls {m.tool_calls.requests} ({m.tool_calls.tool_call_tokens_total} tokens, first token after "
            f"p50 {_ms(m.tool_calls.time_to_tool_call_s.get('p50'))} ms)"
            + ("" if m.tool_calls.as_expected is None else
               f"; as the session file expected in {m.tool_calls.as_expected:.0%} of {m.tool_calls.expected_turns} "
               "turns")]),
        *([] if m.embeddings_per_s is not None or m.token_count_source is None
          else [f"tokens from {m.token_count_source}"]),
    ]
    if m.slo is not None:
        attained = "-" if m.slo_attained is None else f"{m.slo_attained:.1%}"
        cancelled = f", {m.cancelled} cancelled not counted" if m.cancelled else ""
        parts.append(f"goodput {_num(m.goodput, 3)} req/s ({attained} in SLO{cancelled})")
    if m.prompt_tokens_mismatched:
        parts.append(
            f"prompt length off on {m.prompt_tokens_mismatched} requests "
            f"(mean drift {m.prompt_tokens_drift_mean or 0:+.1f} tokens)"
        )
    if m.output_tokens_short:
        parts.append(f"{m.output_tokens_short} requests not at max_tokens")
    if m.chunk_token_discrepancy.requests:
        parts.append(f"usage disagrees with the streamed chunks on {m.chunk_token_discrepancy.requests} requests")
    return " | ".join(parts)


def breakdown_tables(cell: CellSummary) -> list[Table]:
    """A cell's figures per turn of its sessions and per stage of its load (latencies in ms)."""
    m = cell.metrics
    out = []
    for groups, by in ((m.turns if m else None, "turn"), (m.stages if m else None, "stage")):
        if not groups:
            continue
        rows = tuple(
            (str(g.value + 1), str(g.metrics.completed), str(g.metrics.failed), _ms(g.metrics.ttft_s.p50),
             _ms(g.metrics.ttft_s.p99), _ms(g.metrics.tpot_s.p50), _ms(g.metrics.itl_s.p99),
             _num(g.metrics.output_throughput, 0),
             "-" if g.prefix_cache_hit_rate is None else f"{g.prefix_cache_hit_rate:.1%}")
            for g in groups
        )
        headers = (by, "done", "failed", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p99", "output tok/s", "cached")
        out.append(Table(headers, rows, title=f"[{cell.number}] per {by} (ms)"))
    return out


def console_lines(summary: Summary) -> list[str]:
    """Each cell's line of figures (throughput, failures, goodput, cache) and a search's answer."""
    out = [
        f"[{cell.number}] {_throughput_line(cell)}{_cache_text(cell)}"
        for cell in summary.cells if cell.metrics is not None and cell.probe is None
    ]
    return out + list(answer_lines(summary))


def console_tables(summary: Summary, width: int = 400) -> list[RichTable | Text | str]:
    """One latency table per cell, its throughput line, and a sweep overview when swept; each
    table fitted to ``width`` columns (turned on its side where it would not fit), each line of
    figures broken between its parts."""
    out: list[RichTable | Text | str] = []
    for cell in summary.cells:
        if cell.probe is not None:
            continue  # a search's probes are one table below
        if cell.metrics is None:
            out.append(f"{cell_title(cell)}: {cell.ending}")
            continue
        rows = tuple(tuple(r) for r in latency_rows(cell))
        out += fit(Table(("ms", *COLUMNS), rows, title=cell_title(cell)), width, bold_first=True)
        out.append(wrap_parts(_throughput_line(cell) + _cache_text(cell), width))
        if (steady := steady_line(cell.metrics)) is not None:
            out.append(wrap_parts(steady, width))
        for t in breakdown_tables(cell):
            out += fit(t, width)
        out += [_wrapped(f"warning: {w}", width) for w in cell_warnings(cell)]
    for cap in summary.capacity:
        out += fit(probe_table(cap), width)
    out += [_wrapped(f"warning: probe {c.number}: {w}", width)
            for c in summary.cells if c.probe is not None for w in cell_warnings(c)]
    if len(summary.capacity) > 1:
        out += fit(capacity_table(summary), width)
    out += answer_lines(summary)
    if (repeated := repeats_table(summary)) is not None:
        out += fit(repeated, width)
        out += [Text(note) for note in repeated.footnotes]
    if len(summary.measured) > 1 and not summary.capacity:
        headers, body = sweep_rows(summary)
        table = Table(("cell", *headers), tuple((str(c.number), *r) for c, r in zip(summary.measured, body,
                                                                                      strict=True)), title="sweep")
        out += fit(table, width)
    return out


def sweep_rows(summary: Summary, sep: str = ",") -> tuple[list[str], list[list[str]]]:
    """The sweep: a row per measured cell; matrix axes the cells differ by get a column each;
    ``sep``: the thousands separator of the figures (none in exported tables)."""
    fixed = ("input_tokens", "output_tokens", "concurrency", "rate")
    extra = [k for k in varying_axes(list(summary.measured)) if k not in fixed]
    headers = [
        *(axis_title(k) for k in extra), "input", "output", "concurrency", "rate", "req/s", "output tok/s",
        "total tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "ITL p50 ms", "ITL p99 ms", "failed", "cache hits",
    ]
    rows = []
    for cell in summary.measured:
        p, m = cell.params, cell.metrics
        assert m is not None
        rows.append([
            *(axis_value(p.get(k)) for k in extra),
            str(p["input_tokens"]), str(p["output_tokens"]), str(p["concurrency"]),
            "-" if p["rate"] is None else f"{p['rate']:g}",
            _num(m.request_throughput, 3, sep), _num(m.output_throughput, 1, sep),
            _num(m.total_token_throughput, 1, sep),
            _ms(m.ttft_s.p50), _ms(m.ttft_s.p99), _ms(m.tpot_s.p50), _ms(m.itl_s.p50), _ms(m.itl_s.p99),
            str(m.failed),
            "-" if cell.server_prefix_cache_hit_rate is None else f"{cell.server_prefix_cache_hit_rate:.1%}",
        ])
    return headers, rows


REPEATED = {
    "ttft_s.p50": "TTFT p50 ms", "ttft_s.p99": "TTFT p99 ms", "tpot_s.p50": "TPOT p50 ms", "tpot_s.p99": "TPOT p99 ms",
    "itl_s.p50": "ITL p50 ms", "itl_s.p99": "ITL p99 ms", "e2e_s.p50": "E2E p50 ms", "e2e_s.p99": "E2E p99 ms",
    "request_throughput": "req/s", "output_throughput": "output tok/s", "goodput": "goodput req/s",
}


def repeats_table(summary: Summary) -> Table | None:
    """Each repeated cell's figures: mean ± the 95% interval's half-width (CV), a column per cell."""
    if not summary.repeats:
        return None
    groups = summary.repeats
    rows = []
    for key, label in REPEATED.items():
        if not any(key in g.figures for g in groups):
            continue
        scale = 1e3 if key.endswith(("p50", "p99")) else 1.0
        row = [label]
        for g in groups:
            r = g.figures.get(key)
            if r is None:
                row.append("-")
                continue
            half = "" if r.half_width is None else f" ± {r.half_width * scale:,.2f}"
            cv = "" if r.cv is None else f" ({r.cv:.1%}{', noisy' if key in g.noisy else ''})"
            row.append(f"{r.mean * scale:,.2f}{half}{cv}")
        rows.append(tuple(row))
    n = sorted({len(g.cells) for g in groups})
    notes = [f"cells {','.join(map(str, g.cells))}: {params_text(g.params)}" for g in groups]
    notes += [f"mean ± half-width of its 95% interval (Student's t over {'/'.join(map(str, n))} repeats), "
             f"coefficient of variation in brackets"]
    noisy = [f"{params_text(g.params)}: {', '.join(REPEATED[k] for k in g.noisy)}" for g in groups if g.noisy]
    if noisy:
        notes.append("noisy (CV above the threshold, report.noisy_cv): " + "; ".join(noisy))
    headers = ("figure", *(f"cells {','.join(map(str, g.cells))}" for g in groups))
    return Table(headers, tuple(rows), title="repeats", footnotes=tuple(notes))


def sweep_table(summary: Summary) -> Table:
    # exported figures carry no thousands separators (a CSV reader would split them)
    headers, rows = sweep_rows(summary, sep="")
    return Table(tuple(headers), tuple(tuple(r) for r in rows), title=f"- {summary.scenario}: sweep")


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    return render_md(Table(tuple(headers), tuple(tuple(r) for r in rows)))


def _wrapped(text: str, width: int) -> str:
    """A sentence broken between words to ``width`` columns (its later lines indented)."""
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False)) or text


def cell_warnings(cell: CellSummary) -> tuple[str, ...]:
    """Every warning of a cell, as the console said it during the run: the client's self-check
    verdict first, then the cell's own (the engine starved, the cache, the engine gap, ...)."""
    client = cell.client.warning if cell.client is not None else None
    return (*([client] if client else []), *cell.warnings)


def render_markdown(summary: Summary) -> str:
    """``report.md``: a section per cell (latency table and throughput line) and the sweep."""
    parts = headline_md(summary)
    if summary.interrupted:
        parts += ["**Interrupted**: figures cover what was measured before the stop.", ""]
    if summary.resumed:
        times = "once" if summary.resumed == 1 else f"{summary.resumed} times"
        parts += [f"**Resumed**: the run was continued {times} after a stop; finished cells were kept.", ""]
    if summary.aborted:
        parts += [f"**Aborted**: {summary.aborted}.", ""]
    if summary.records_lost:
        parts += [f"**Incomplete**: {summary.records_lost} measured requests could not be written to "
                  "records.jsonl (see the run's error); the figures leave them out.", ""]
    for cell in summary.cells:
        parts += [f"## {cell_title(cell)}", ""]
        if cell.metrics is None:
            parts += [cell.ending, ""]
            continue
        parts += [_md_table(["ms", *COLUMNS], latency_rows(cell)), ""]
        parts += [_throughput_line(cell) + _cache_text(cell), ""]
        if (steady := steady_line(cell.metrics)) is not None:
            parts += [steady, ""]
        for t in breakdown_tables(cell):
            parts += [f"{t.title}", "", render_md(t), ""]
        said = cell_warnings(cell)
        parts += [f"**Warning**: {w}" for w in said] + ([""] if said else [])
    if summary.capacity:
        parts += ["## Capacity", ""]
        for cap in summary.capacity:
            table = probe_table(cap)
            parts += [table.title, "", render_md(table), ""]
        if len(summary.capacity) > 1:
            parts += [render_md(capacity_table(summary)), ""]
        parts += [f"**{line}**" for line in answer_lines(summary)] + [""]
    elif len(summary.measured) > 1:
        parts += ["## Sweep", "", _md_table(*sweep_rows(summary)), ""]
    if (repeated := repeats_table(summary)) is not None:
        parts += ["## Repeats", "", render_md(repeated), ""]
    return "\n".join(parts)
