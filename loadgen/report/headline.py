"""The answer first: a run's title, what it tested and what it found, in a few lines, at the
top of ``report.md`` and ``report.html`` (the tables and charts follow)."""

from __future__ import annotations

from loadgen.data import Labels
from loadgen.report.capacity import answer_lines, slo_text
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.summary import CellSummary, Summary


def workload_text(params: Labels) -> str:
    """``input 1024 / output 128 tokens``, a dataset's prompts, or sessions' messages."""
    lengths = f"input {params['input_tokens']} / output {params['output_tokens']} tokens"
    if (source := params.get("workload")) is not None:
        lengths = f"{source} ({lengths} per message)" if source.startswith("multi-turn") else f"{source} prompts"
    return lengths


def load_text(concurrency: int | str | None, rate: float | None) -> str:
    """The load as it was applied: ``closed loop of 16`` (each stream sends its next request
    when the last ends), ``rate 4/s`` (open loop, at most N in flight when capped), or ``all at
    once`` (every request sent at the start)."""
    capped = concurrency not in (None, "unlimited")
    if rate is not None:
        return f"rate {rate:g}/s" + (f", at most {concurrency} in flight" if capped else "")
    return f"closed loop of {concurrency}" if capped else "all at once"


def cell_load(cell: CellSummary) -> str:
    """A cell's load as it ran: a Locust test's users, a schedule, a closed loop that fell
    short of its concurrency by what it reached (``closed loop of 32 (64 set)``), else as set."""
    if cell.users is not None:
        return cell.users.text()
    if (schedule := cell.params.get("schedule")) is not None:
        return str(schedule)
    if (ran := cell.concurrency_ran) is not None:
        return f"{load_text(ran, None)} ({cell.params.get('concurrency')} set)"
    return load_text(cell.params.get("concurrency"), cell.params.get("rate"))


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _engine(server: ServerInfo) -> str:
    if server.backend is None:
        return f"a server at {server.base_url}" if server.base_url else "a given server"
    name = "loadgen's simulator" if server.backend == "sim" else server.backend
    return f"{name} {server.version}" if server.version else name


def _hardware(server: ServerInfo) -> str:
    if server.gpu_count or server.gpus:
        ids = ",".join(map(str, server.gpus))
        count = server.gpu_count or len(server.gpus)
        return f"{count} GPU{'s' if count != 1 else ''}" + (f" ({ids})" if ids else "")
    if server.device == "cpu" or server.backend == "sim":
        return "CPU"
    return "" if server.backend is None else "CPU"


def title(summary: Summary) -> str:
    """``throughput-1000: Qwen/Qwen2-57B on vllm 0.32.0``."""
    models = _unique([c.server.model or "" for c in summary.cells]) or ([summary.model] if summary.model else [])
    engines = _unique([_engine(c.server) for c in summary.cells])
    out = summary.scenario
    if models:
        out += f": {', '.join(models[:3])}" + (" and more" if len(models) > 3 else "")
    if engines:
        out += f" on {', '.join(engines[:3])}" + (" and more" if len(engines) > 3 else "")
    return out


def about(summary: Summary) -> list[tuple[str, str]]:
    """What was tested: model, engine, quantization, hardware, workload, load, objectives."""
    cells = list(summary.cells)
    rows = [
        ("Model", ", ".join(_unique([c.server.model or "" for c in cells]) or [summary.model or "unknown"])),
        ("Engine", ", ".join(_unique([_engine(c.server) for c in cells])) or "unknown"),
        ("Quantization", ", ".join(_unique([c.server.quant or "" for c in cells])) or "none declared"),
        ("Hardware", ", ".join(_unique([_hardware(c.server) for c in cells])) or "not known (a given server)"),
        ("Workload", ", ".join(_unique([workload_text(c.params) for c in cells]))),
    ]
    if summary.capacity:
        loads = [f"search by {cap.by} in {cap.min:g}..{cap.max:g}" for cap in summary.capacity]
    else:
        loads = [cell_load(c) for c in cells]
    rows.append(("Load", "; ".join(_unique([str(v) for v in loads]))))
    objectives = _unique([slo_text(cap.slo) for cap in summary.capacity]) or _unique(
        [", ".join(f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in (c.metrics.slo or {}).items())
         for c in cells if c.metrics is not None])
    rows.append(("Objectives", "; ".join(objectives) or "none set"))
    return [(k, v) for k, v in rows if v]


def verdict(summary: Summary) -> list[str]:
    """What the run found, first: each search's answer; else the highest throughput measured
    and where, with the objectives' attainment there, and what failed."""
    if summary.capacity:
        return answer_lines(summary)
    measured = [c for c in summary.measured if c.metrics is not None and c.metrics.output_throughput]
    if not measured:
        return ["no cell completed a request"] if summary.cells else []
    best: CellSummary = max(measured, key=lambda c: c.metrics.output_throughput or 0.0)  # type: ignore[union-attr]
    m = best.metrics
    assert m is not None
    line = (f"highest output throughput: {m.output_throughput:,.1f} tok/s ({m.request_throughput or 0:,.2f} "
            f"requests/s) in cell {best.number}, {cell_load(best)}")
    if m.slo_attained is not None:
        line += f"; {m.slo_attained:.1%} of its requests met the objectives"
    out = [line]
    failed = sum(c.metrics.failed for c in summary.measured if c.metrics is not None)
    total = sum(c.metrics.requests for c in summary.measured if c.metrics is not None)
    if failed:
        out.append(f"{failed} of {total} requests failed (per cell below)")
    return out


def headline_md(summary: Summary) -> list[str]:
    """report.md's opening: the title, the verdict in bold, then what was tested."""
    lines = [f"# {title(summary)}", ""]
    for line in verdict(summary):
        lines += [f"**{line}**", ""]
    lines += [f"- {k}: {v}" for k, v in about(summary)] + [""]
    return lines
