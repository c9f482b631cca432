"""The published tables, built from run summaries: single-stream speed and memory (Qwen's speed
benchmark), throughput (QPS and Tokens/s) and the cross-engine comparison (Speed X, Max mem %).

Rows are plain dataclasses, so the same builders render a run's figures and, in the reference
round-trip test, the documents' own rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from loadgen.engines.catalogue import load_catalogue, resolve_setting
from loadgen.engines.registry import ENGINES, SIM, engine_of_server
from loadgen.report.tables import Table
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.figures import Distribution
from loadgen.results.summary import CellSummary, Summary

QUANT_LABELS: dict[str, str] = {
    "bf16": "BF16", "fp16": "FP16", "fp32": "FP32", "gptq-int8": "GPTQ-Int8", "gptq-int4": "GPTQ-Int4",
    "awq": "AWQ", "fp8": "FP8", "auto": "Auto",
}
# the cross-engine comparison's Software column, and the speed tables' engine word
SOFTWARE_LABELS: dict[str, str] = {**{e.name: e.label for e in ENGINES}, SIM: "loadgen sim"}
ENGINE_LABELS: dict[str, str] = {**SOFTWARE_LABELS, **{e.name: e.word for e in ENGINES}}
GIB = float(1 << 30)


UNKNOWN = "unknown"


def model_label(server: ServerInfo) -> str:
    """``Qwen2-7B-Instruct`` for a catalogued model; the last path part of a checkpoint or of
    the id the server serves; ``unknown`` where nobody said (never a part of the URL)."""
    name = server.model
    if name:
        entry = load_catalogue().get(str(name).lower())
        if entry is not None:
            return entry.hub.split("/")[-1]
    named = server.checkpoint or name
    return PurePath(str(named)).name if named else UNKNOWN


def quant_label(server: ServerInfo) -> str:
    """What was launched (an engine's dtype or quantization) or declared (``target.quant``);
    ``unknown`` otherwise."""
    quant = server.quant
    return QUANT_LABELS.get(str(quant), str(quant)) if quant else UNKNOWN


def software_label(server: ServerInfo) -> str:
    """The engine loadgen launched; for a given URL, the owner ``/v1/models`` names, else unknown."""
    if server.backend:
        return SOFTWARE_LABELS.get(server.backend, server.backend)
    return f"{server.owned_by} (at {server.base_url})" if server.owned_by else UNKNOWN


AXIS_TITLES: dict[str, str] = {
    "input_tokens": "Input Length", "output_tokens": "Output Length", "concurrency": "Concurrency",
    "rate": "Request Rate", "schedule": "Schedule", "workload": "Workload", "backend": "Engine",
    "engine": "Engine", "model": "Model", "quant": "Quantization",
}
NOT_AXES = ("num_prompts",)


def varying_axes(cells: list[CellSummary]) -> list[str]:
    """The parameters the cells differ by (lengths, load, matrix axes), in a stable order; the
    server's engine and quantization are shown by their own columns."""
    keys: list[str] = []
    for cell in cells:
        keys += [k for k in cell.params if k not in keys and k not in NOT_AXES]
    return [k for k in keys if len({repr(c.params.get(k)) for c in cells}) > 1]


def axis_title(key: str) -> str:
    return AXIS_TITLES.get(key, key.replace("_", " ").title())


def axis_value(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def cell_memory(cell: CellSummary) -> tuple[float | None, str]:
    """GiB for the memory column, or why there is none: the transformers engine's own peak
    allocation (as the documents measure it), else what NVML saw the engine's processes hold."""
    server = cell.server
    gpu = cell.gpu_memory
    gauge = cell.server_metrics.gauges.get("engine_peak_allocated_bytes") if cell.server_metrics else None
    peak = gauge.max if gauge is not None else None
    if server.device == "cpu":
        return None, "n/a (CPU)"
    if (engine := engine_of_server(server)) is not None and engine.reports_peak_memory and peak:
        return peak / GIB, ""
    if gpu.available and gpu.peak_gib_total is not None:
        return gpu.peak_gib_total, ""
    return None, "n/a (no GPU)"


def setting_label(name: str | None) -> str:
    return "-" if name in (None, "default") else f"[Setting {name}]"


def setting_footnote(name: str, model: str | None = None) -> str:
    entry = load_catalogue().get((model or "").lower())
    s = resolve_setting(name, entry)
    title = "Default Setting" if s.name == "default" else f"Setting {s.name}"
    return (
        f"[{title}]=(gpu_memory_utilization={s.gpu_memory_utilization} "
        f"max_model_len={s.max_model_len} enforce_eager={s.enforce_eager})"
    )


@dataclass(frozen=True, slots=True)
class SpeedRow:
    model: str
    input_length: int
    quantization: str
    gpu_num: str
    speed: float | None
    memory_gib: float | None = None
    memory_text: str = ""
    note: str = ""
    setting: str | None = None
    speed_std: float | None = None


def speed_of(summary: Summary, cell: CellSummary) -> Distribution:
    """The single-stream speed the scenario asks for (output, or prompt + output, tokens/s)."""
    if cell.metrics is None:
        return Distribution()
    return cell.metrics.speed_total_tokens_per_s if summary.speed == "total" else cell.metrics.speed_tokens_per_s


def speed_rows(summary: Summary) -> list[SpeedRow]:
    """One row per single-stream cell (failed cells keep their row, with the reason as note)."""
    rows = []
    for cell in summary.cells:
        server = cell.server
        dist = speed_of(summary, cell)
        mem, mem_text = cell_memory(cell)
        note = cell.note
        if cell.status == "failed":
            note = f"failed: {cell.reason}"[:60]
        gpus = server.gpu_count
        rows.append(SpeedRow(
            model=model_label(server), input_length=int(cell.params["input_tokens"]),
            quantization=quant_label(server),
            gpu_num="CPU" if server.device == "cpu" else ("-" if gpus is None else str(gpus)),
            speed=dist.mean, speed_std=dist.std, memory_gib=mem, memory_text=mem_text,
            note=note, setting=server.setting,
        ))
    return rows


def _num(v: float | None, text: str = "-") -> str:
    return text if v is None else f"{v:.2f}"


def single_stream_table(
    rows: list[SpeedRow],
    *,
    memory: bool = True,
    extra: str | None = "Note",
    spread: bool = False,
    title: str = "",
    footnotes: tuple[str, ...] = (),
) -> Table:
    """``Model | Input Length | Quantization | GPU Num | Speed(tokens/s) | GPU Memory(GB) | Note``;
    ``extra`` is ``"Note"`` (free text), ``"Setting"`` (``[Setting N]`` / ``-``) or None."""
    headers = ["Model", "Input Length", "Quantization", "GPU Num", "Speed(tokens/s)"]
    if spread:
        headers.append("Speed std")
    if memory:
        headers.append("GPU Memory(GB)")
    if extra:
        headers.append(extra)
    body = []
    for r in rows:
        cells = [r.model, str(r.input_length), r.quantization, r.gpu_num, _num(r.speed)]
        if spread:
            cells.append(_num(r.speed_std))
        if memory:
            cells.append(_num(r.memory_gib, r.memory_text or "-"))
        if extra == "Setting":
            cells.append(setting_label(r.setting))
        elif extra:
            cells.append(r.note)
        body.append(tuple(cells))
    return Table(tuple(headers), tuple(body), group_columns=2, key_columns=4, title=title, footnotes=footnotes)


def single_stream_tables(summary: Summary, *, spread: bool = False) -> list[Table]:
    """The documents' layout: one table per model and engine, settings presets as footnotes."""
    groups: dict[tuple[str, str], list[tuple[SpeedRow, CellSummary]]] = {}
    for row, cell in zip(speed_rows(summary), summary.cells, strict=True):
        engine = str(cell.server.backend)
        groups.setdefault((row.model, engine), []).append((row, cell))
    tables = []
    for (model, engine), items in groups.items():
        rows = [r for r, _ in items]
        server = items[0][1].server
        settings = sorted({r.setting for r in rows if r.setting}, key=lambda s: (s != "default", s))
        notes = []
        if any(s != "default" for s in settings):
            notes = [setting_footnote(s, server.model) for s in ["default", *settings] if s]
            notes = list(dict.fromkeys(notes))
        declared = engine_of_server(server)
        if declared is not None and declared.preallocates and any(c.server.device != "cpu" for _, c in items):
            kv = [
                g.max for _, c in items if c.server_metrics and (g := c.server_metrics.gauges.get("kv_cache_usage"))
            ]
            kv_peak = max((k for k in kv if k is not None), default=None)
            notes.append(
                f"{ENGINE_LABELS.get(engine, engine)} pre-allocates its KV cache: GPU Memory is what its "
                "processes hold (NVML)" + ("" if kv_peak is None else f"; peak KV-cache usage {kv_peak:.2%}")
            )
        has_note = any(r.note for r in rows)
        extra = "Note" if has_note else ("Setting" if any(s != "default" for s in settings) else None)
        title = f"-  {model} ({ENGINE_LABELS.get(engine, engine)})"
        tables.append(single_stream_table(rows, extra=extra, spread=spread, title=title, footnotes=tuple(notes)))
    return tables


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    model: str
    quantization: str
    prompts: int
    qps: float | None
    tokens_per_s: float | None
    output_tokens_per_s: float | None = None
    # the parameters the run's rows differ by (title, value): input length, concurrency, ...
    axes: tuple[tuple[str, str], ...] = ()


def throughput_rows(summary: Summary) -> list[ThroughputRow]:
    rows = []
    cells = list(summary.cells)
    axes = [k for k in varying_axes(cells) if k not in ("model", "quant")]  # columns of their own
    for cell in cells:
        server, m = cell.server, cell.metrics
        rows.append(ThroughputRow(
            model=model_label(server), quantization=quant_label(server),
            prompts=int(cell.params.get("num_prompts") or (m.requests if m else 0)),
            qps=m.request_throughput if m else None, tokens_per_s=m.total_token_throughput if m else None,
            output_tokens_per_s=m.output_throughput if m else None,
            axes=tuple((axis_title(k), axis_value(cell.params.get(k))) for k in axes),
        ))
    return rows


def throughput_table(rows: list[ThroughputRow], *, output: bool = True, title: str = "") -> Table:
    """``Model | Quantization | <the axes the rows differ by> | # Prompts | QPS | Tokens/s``
    (+ output tokens/s alongside)."""
    axes = [t for t, _ in rows[0].axes] if rows else []
    headers = ["Model", "Quantization", *axes, "# Prompts", "QPS", "Tokens/s"] + (["Output Tokens/s"] if output else [])
    body = []
    for r in rows:
        cells = [r.model, r.quantization, *(v for _, v in r.axes), str(r.prompts), _num(r.qps), _num(r.tokens_per_s)]
        if output:
            cells.append(_num(r.output_tokens_per_s))
        body.append(tuple(cells))
    return Table(tuple(headers), tuple(body), title=title)


@dataclass(frozen=True, slots=True)
class CompareRow:
    software: str
    settings: tuple[str, ...]
    avg_tok_s: float | None
    max_mem_mib: float | None
    notes: str = ""


MATCH_KEYS = ("input_tokens", "output_tokens", "concurrency", "rate", "num_prompts")


def _match_key(cell: CellSummary) -> tuple[Any, ...]:
    return tuple(cell.params.get(k) for k in MATCH_KEYS)


def _avg_speed(cell: CellSummary, kind: str) -> float | None:
    m = cell.metrics
    if m is None:
        return None
    return m.speed_tokens_per_s.mean if kind == "single-stream" else m.output_throughput


def compare_rows(
    runs: list[tuple[str, Summary]], baseline: tuple[str, Summary]
) -> tuple[list[CompareRow], int]:
    """One row per (run, engine configuration), averaged over the cells whose parameters the
    baseline also measured; returns the rows and the baseline row's index."""
    def configs(summary: Summary, done: bool = True) -> dict[str, list[CellSummary]]:
        out: dict[str, list[CellSummary]] = {}
        for cell in summary.cells:
            if cell.status == "done" or not done:
                s = cell.server
                key = repr(sorted((k, str(v)) for k, v in s.to_dict().items() if k not in ("version", "gpus")))
                out.setdefault(key, []).append(cell)
        return out

    base_name, base_summary = baseline
    base_cfgs = configs(base_summary)
    if not base_cfgs:
        return [], -1
    base_keys = {_match_key(c) for c in next(iter(base_cfgs.values()))}
    rows: list[CompareRow] = []
    base_index = -1
    for name, summary in runs:
        for all_cells in configs(summary, done=False).values():
            cells = [c for c in all_cells if c.status == "done"]
            if not cells:  # skipped or failed: a row without figures, the reason as its note (as the reference)
                c = all_cells[0]
                s = c.server
                rows.append(CompareRow(
                    software=software_label(s), settings=settings_lines(s), avg_tok_s=None, max_mem_mib=None,
                    notes=f"{name}: {c.ending}",
                ))
                continue
            common = [c for c in cells if _match_key(c) in base_keys]
            if name == base_name and base_index < 0:
                base_index = len(rows)
            speeds = [v for c in common if (v := _avg_speed(c, summary.kind)) is not None]
            mems = [m for c in common if (m := cell_memory(c)[0]) is not None]
            s = common[0].server if common else cells[0].server
            notes = name
            if s.version:
                notes += f", {SOFTWARE_LABELS.get(str(s.backend), '')} {s.version}"
            if not common:
                notes += ": no cell in common with the baseline"
            if cells and not mems:
                notes += f"; memory {cell_memory(cells[0])[1]}"
            rows.append(CompareRow(
                software=software_label(s),
                settings=settings_lines(s),
                avg_tok_s=sum(speeds) / len(speeds) if speeds else None,
                max_mem_mib=max(mems) * 1024 if mems else None,
                notes=notes,
            ))
    return rows, base_index


def settings_lines(server: ServerInfo) -> tuple[str, ...]:
    """The cross-engine comparison's Settings column: the dtype / quantization and each engine
    option that differs from a plain run."""
    lines = [quant_label(server)]
    if (engine := engine_of_server(server)) is not None:
        lines += engine.settings(server)
    if server.setting not in (None, "default"):
        lines.append(f"Setting {server.setting}")
    if server.device == "cpu":
        lines.append("CPU")
    return tuple(lines)


def compare_table(rows: list[CompareRow], baseline: int) -> Table:
    """``Software | Settings | Avg Tok/s | Max Mem | Speed X | Max mem % | Notes`` (Max Mem in MiB)."""
    base = rows[baseline] if 0 <= baseline < len(rows) else None
    body = []
    for i, r in enumerate(rows):
        speed_x = mem_pct = ""
        if base is not None and base.avg_tok_s and r.avg_tok_s is not None:
            speed_x = f"{r.avg_tok_s / base.avg_tok_s:.2f}"
        if base is not None and base.max_mem_mib and r.max_mem_mib is not None:
            mem_pct = f"{100 * r.max_mem_mib / base.max_mem_mib:.1f}"
        settings = list(r.settings)
        if i == baseline:
            settings[0] = f"Baseline ({settings[0]})"
        body.append((
            r.software, "\n".join(settings), "" if r.avg_tok_s is None else f"{r.avg_tok_s:.2f}",
            "" if r.max_mem_mib is None else f"{r.max_mem_mib:.1f}", speed_x, mem_pct, r.notes,
        ))
    headers = ("Software", "Settings", "Avg Tok/s", "Max Mem", "Speed X", "Max mem %", "Notes")
    return Table(headers, tuple(body))
