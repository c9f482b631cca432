"""The run directory: what a run writes, and how a summary is re-derived from it alone.

    RUN_DIR/
      scenario.resolved.yaml   the scenario with every default filled in
      provenance.json          loadgen/python/host, times, seed, clock base, server answers
      records.jsonl            one RequestRecord per line, appended as each request ends
      cells.jsonl              one line per finished cell: done / failed, the reason, its server
                               (a search's probe has a line when it starts too, with its value)
      probes.jsonl             raw samples of the server's /metrics, GPU memory and the client, per cell
      summary.json             {"cells": [{"params", "status", "server", "metrics", ...}], ...}
      report.md                the summary as Markdown tables
      server.log               the launched server's output (server-N.log, one per engine, in a matrix)
      records.set-aside.jsonl  records of cells a --resume measured again (kept, not counted)
      run.lock                 while a run writes the directory: its process id (a second run is refused)
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from loadgen.data import Unchecked
from loadgen.errors import OutputError, RunDirError, ScenarioError, UsageError
from loadgen.results.capacity import capacity_of, first_wave, probe_entry
from loadgen.results.cellstatus import CellStatus, ServerInfo
from loadgen.results.clienthealth import client_health
from loadgen.results.enginecores import engine_cores
from loadgen.results.enginegap import engine_gaps, gap_warnings
from loadgen.results.files import AppendFile, pid_alive, remove_stale, write_file
from loadgen.results.readings import ENGINE_CORES, EngineCoreReading

__all__ = ["write_file"]  # charts and report.html are written through it too
from loadgen.results.metrics import summarize
from loadgen.results.provenance import Provenance
from loadgen.results.records import RecordWriter, RequestRecord, UnreadableRecord, read_records
from loadgen.results.repeats import FIGURES, repeat_groups
from loadgen.results.samples import (
    SAMPLES,
    Sample,
    SampleLog,
    prefix_cache_hit_rate,
    read_samples,
    summarize_energy,
    summarize_gpu,
    summarize_server_metrics,
)
from loadgen.results.summary import CellMetrics, CellSummary, RequestBounds, Summary, short_of_load
from loadgen.results.windows import DEFAULT_WIDTH_S, steady_state, time_windows, window_width
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import Cell, SearchLine, expand_cells, search_lines
from loadgen.scenario.redact import as_recorded, dump_scenario, redact_labels
from loadgen.scenario.schema import Scenario

RECORDS = "records.jsonl"
SUMMARY = "summary.json"
SCENARIO = "scenario.resolved.yaml"
PROVENANCE = "provenance.json"
REPORT = "report.md"
SERVER_LOG = "server.log"
CELLS = "cells.jsonl"
# above this share of prompt tokens served from the prefix cache, a workload of unique prompts
# was not measured cold (a template shared by every request stays far below it)
CACHE_HIT_WARN = 0.05


def default_run_dir(scenario: Scenario, root: Path = Path("runs")) -> Path:
    """``runs/NAME-TIME``, the name reduced to a file name's safe characters (a name such as
    ``../../x`` never leads out of ``runs/``)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{safe_name(scenario.name)}-{stamp}"


def safe_name(name: str) -> str:
    """Letters, digits, ``.``, ``_`` and ``-``; anything else becomes ``_``; no leading dots."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".")[:100]
    return cleaned or "run"


def write_json(path: Path, data: Any) -> None:
    write_file(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def over_time(metrics: CellMetrics, records: list[RequestRecord], point: Scenario, open_loop: bool) -> CellMetrics:
    """The cell's windows (``report.window_s``, or ``report.windows`` over its span) and its
    steady state."""
    width = point.report.window_s or DEFAULT_WIDTH_S
    if point.report.windows is not None:
        width = max(metrics.duration_s / point.report.windows, 1e-3)
    width = window_width(records, width)
    windows = time_windows(records, width)
    return replace(metrics, windows=windows,
                   steady_state=steady_state(records, windows, width, point.slo, open_loop))


def cell_summary(
    cell: Cell,
    records: list[RequestRecord],
    status: CellStatus,
    samples: dict[str, list[Sample]],
) -> CellSummary:
    """One entry of ``summary.json: cells``, from the cell's records, status line and probe samples."""
    point = cell.point
    server = status.server or ServerInfo()
    if server.device == "cpu":
        no_gpu = "the engine runs on CPU"
    elif not server.launched:
        no_gpu = "the server was not started by loadgen: no process to attribute GPU memory to"
    else:
        no_gpu = "no GPU memory samples (no NVIDIA GPU visible through NVML)"
    measured = any(not r.warmup for r in records)
    server_metrics = summarize_server_metrics(samples.get("metrics", []))
    hit_rate, _ = prefix_cache_hit_rate(server_metrics)
    warnings = []
    # a chat template's tokens are the same in every request: the server may serve them from its cache
    shared = max(float(status.template_tokens or 0.0), 0.0) / max(cell.input_tokens, 1)
    if (
        hit_rate is not None and hit_rate > CACHE_HIT_WARN + shared
        and not point.workload.shares_content
    ):
        warnings.append(
            f"the server answered {hit_rate:.1%} of this cell's prompt tokens from its prefix cache, while no two "
            "prompts of the run share content: the cache held prompts of an earlier run (a seed given again "
            "repeats them), so TTFT is below a cold prefill's; let loadgen draw the seed, or set "
            "load.reset_cache: between-cells"
        )
    metrics = (summarize(records, point.slo, open_loop=cell.open_loop, tools=point.workload.tools is not None)
               if measured else None)
    if metrics is not None:
        metrics = over_time(metrics, records, point, cell.open_loop)
    gaps = engine_gaps(metrics, server_metrics)
    calls = metrics.tool_calls.requests if metrics is not None and metrics.tool_calls is not None else 0
    warnings += gap_warnings(gaps, metrics.completed if metrics is not None else 0, calls)
    if metrics is not None and metrics.connection_retries:
        warnings.append(
            f"{metrics.connection_retries} requests were sent again on a new connection: the server closed a "
            "kept-alive connection before answering (llama.cpp closes after every answer); each kept the time "
            "of its first attempt, so its TTFT includes the new connection"
        )
    if (ran := short_of_load(cell.concurrency, metrics, cell.open_loop)) is not None:
        assert metrics is not None
        why = f" (the cell had {metrics.requests} requests)" if metrics.requests < (cell.concurrency or 0) else ""
        warnings.append(
            f"concurrency {cell.concurrency} was set, but at most {ran} requests were in flight{why}: the "
            f"cell's figures are those of a closed loop of {ran}, and its label and charts say so"
        )
    warnings += [lost.warning() for lost in status.workers_lost]
    cores = engine_cores([s.values for s in samples.get(ENGINE_CORES, []) if isinstance(s.values, EngineCoreReading)])
    if cores is not None and (said := cores.warning()) is not None:
        warnings.append(said)
    probe = None
    if cell.search is not None and point.load.search is not None:
        value = cell.concurrency if point.load.search.by == "concurrency" else cell.rate
        assert value is not None
        probe = probe_entry(
            cell.search, point.load.search, float(value), [r for r in records if not r.warmup],
            status.status, status.stopped_early, metrics.duration_s if metrics else None, first_wave(cell),
        )
    gpu_memory = summarize_gpu(samples.get("gpu", []), reason=no_gpu)
    energy = summarize_energy(samples.get("energy", []), list(gpu_memory.peak_gib_per_gpu or {}) or None,
                              metrics.output_tokens_total if metrics is not None else 0)
    if energy is not None and energy.gpu_energy_j is None and server.device == "cpu":
        energy = replace(energy, gpu_reason="the engine runs on CPU")
    return CellSummary(
        cell=cell.index,
        params=cell.params(),
        status=status.status,
        reason=status.reason,
        note=point.note,
        server=server,
        metrics=metrics,
        server_metrics=server_metrics,
        gpu_memory=gpu_memory,
        client=client_health(samples.get("client", []), records, cell.rate is not None),
        server_prefix_cache_hit_rate=hit_rate,
        cache_reset=status.cache_reset,
        warnings=tuple(warnings),
        probe=probe,
        records_lost=status.records_lost,
        request_bounds=RequestBounds.of(point.target.timeouts, cell.output_tokens),
        engine_gap=gaps,
        engine_cores=cores,
        users=status.users,
        energy=energy,
    )


def assemble_summary(
    scenario: Scenario, cells: list[CellSummary], lines: Sequence[SearchLine], *, model: str | None,
    interrupted: bool, aborted: str | None = None, resumed: int = 0,
) -> Summary:
    """The summary of ``cells``, with the answer of each of the scenario's searches (``lines``,
    expanded once by the caller)."""
    capacity = tuple(
        capacity_of(line.index, line.search, {**redact_labels(dict(line.labels)), "input_tokens": line.input_tokens,
                                              "output_tokens": line.output_tokens},
                    [c for c in cells if c.probe is not None and c.probe.search == line.index])
        for line in lines
    )
    repeats = repeat_groups([(c.params, c.number, repeat_figures(c.metrics)) for c in cells if c.metrics is not None],
                            scenario.report.noisy_cv)
    return Summary(
        scenario=scenario.name, kind=scenario.kind, speed=scenario.speed, model=model, interrupted=interrupted,
        cells=tuple(cells), aborted=aborted, seed=scenario.seed, capacity=capacity, resumed=resumed,
        repeats=repeats,
    )


def repeat_figures(m: CellMetrics) -> dict[str, float | None]:
    """The figures a repeat contributes, by their summary.json names."""
    out: dict[str, float | None] = {}
    for key in FIGURES:
        name, _, stat = key.partition(".")
        out[key] = getattr(m, name).get(stat) if stat else getattr(m, name)
    return out


def probe_cells(lines: Sequence[SearchLine], statuses: dict[int, CellStatus]) -> list[Cell]:
    """The probes a run directory's searches measured, from their status lines (a probe's line
    is written when it starts, with its value, and again when it ends)."""
    cells = []
    for index, status in sorted(statuses.items()):
        probe = status.probe
        if probe is not None and 0 <= probe.search < len(lines):
            cells.append(lines[probe.search].probe(index, probe.value))
    return cells


def taken_message(run_dir: Path, resumable: bool = True) -> str:
    """Why ``run_dir`` cannot take a new run, and what to do (a Locust test cannot continue one)."""
    return (f"{run_dir}: already holds a run ({RECORDS}); choose another --out"
            + (", remove it, or continue it with --resume" if resumable else " or remove it"))


class RunDirWriter:
    """A run directory being written, by ``loadgen run`` or by a Locust run, and the only code
    that writes one: claims the directory, then appends records, cell statuses and samples as
    they come and rewrites the scenario, provenance, summary and report atomically whenever
    they change."""

    def __init__(self, run_dir: Path, *, resume: bool = False, lock: Path | None = None,
                 resumable: bool = True) -> None:
        self.lock = lock or claim(run_dir)
        try:
            for name in (RECORDS, CELLS, SAMPLES):
                if (run_dir / name).is_symlink():
                    raise OutputError(
                        f"{run_dir / name}: is a symbolic link, which loadgen does not follow in a run "
                        "directory; remove it, or choose another --out"
                    )
            if not resume and (run_dir / RECORDS).exists():
                raise UsageError(taken_message(run_dir, resumable))
            self.run_dir = run_dir
            self.records = RecordWriter(run_dir / RECORDS)
            self.cells = CellStatusLog(run_dir)
            self.samples = SampleLog(run_dir / SAMPLES)
        except BaseException:
            self.lock.unlink(missing_ok=True)
            raise

    def write_scenario(self, scenario: Scenario) -> None:
        write_file(self.run_dir / SCENARIO, dump_scenario(scenario).encode())

    def write_provenance(self, provenance: Provenance) -> None:
        write_json(self.run_dir / PROVENANCE, provenance.to_dict())

    def write_summary(self, summary: Summary, report: str | None) -> None:
        write_json(self.run_dir / SUMMARY, summary.to_dict())
        if report is not None:
            write_file(self.run_dir / REPORT, report.encode())

    def close(self) -> None:
        self.records.close()
        self.cells.close()
        self.samples.close()
        self.lock.unlink(missing_ok=True)


LOCK = "run.lock"


def claim(run_dir: Path) -> Path:
    """Make the run directory and create ``run.lock`` in it (with this process's id)
    exclusively: two runs never write one directory. A lock whose process is gone (a run
    killed outright) is taken over."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {run_dir}: is a file, not a directory; choose another --out")
    if run_dir.is_dir() and not any((run_dir / name).exists() or (run_dir / name).is_symlink()
                                     for name in (RECORDS, PROVENANCE, LOCK)):
        # a directory of the user's own: its report.md, summary.json... are not loadgen's to replace
        if others := sorted(p.name for p in run_dir.iterdir())[:3]:
            raise UsageError(
                f"--out {run_dir}: holds files that are not a run's ({', '.join(others)}); choose a new or empty "
                "directory"
            )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {run_dir}: cannot create the run directory ({exc.strerror})") from None
    lock = run_dir / LOCK
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or "0")
            except (OSError, ValueError):
                pid = 0
            if pid > 0 and pid != os.getpid() and pid_alive(pid):
                raise UsageError(
                    f"{run_dir}: another run (pid {pid}) is writing this directory; choose another --out, "
                    "or wait for it to end"
                ) from None
            lock.unlink(missing_ok=True)  # its run is gone: stale
            continue
        except OSError as exc:
            raise UsageError(f"--out {run_dir}: cannot write there ({exc.strerror})") from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        remove_stale(run_dir)  # what a run killed mid-write left
        return lock
    raise UsageError(f"{run_dir}: could not claim the run directory ({LOCK} keeps reappearing)")



class CellStatusLog:
    """Appends one line per finished cell to ``cells.jsonl`` (the resume point of a matrix)."""

    def __init__(self, run_dir: Path) -> None:
        self._file = AppendFile(run_dir / CELLS)

    def write(self, line: CellStatus) -> None:
        self._file.append(orjson.dumps(line.to_dict()) + b"\n")

    def close(self) -> None:
        self._file.close()


def read_cell_status(run_dir: Path) -> dict[int, CellStatus]:
    """The last status line of each cell (a resumed cell's new line replaces its old one)."""
    out: dict[int, CellStatus] = {}
    path = run_dir / CELLS
    if path.is_file():
        for n, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
            if line.endswith(b"\n"):
                try:
                    entry = CellStatus.from_dict(orjson.loads(line))
                    out[entry.cell] = entry
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                    raise RunDirError(f"{path}: line {n} is not a cell status ({exc})") from None
    return out


def read_json(path: Path) -> Any:
    """A JSON file of the run directory, or a one-line error naming it."""
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise RunDirError(f"{path}: not valid JSON ({exc}); restore it, or remove it to re-derive it") from None


def set_aside_records(run_dir: Path, keep: set[int]) -> None:
    """Before a resume: records and probe samples of cells not in ``keep`` move to ``*.set-aside.jsonl``."""
    for name in (RECORDS, SAMPLES):
        path = run_dir / name
        if not path.is_file():
            continue
        kept: list[bytes] = []
        aside: list[bytes] = []
        for n, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
            if not line.endswith(b"\n"):
                continue  # cut short by a crash
            try:
                cell = orjson.loads(line)["cell"]
            except (orjson.JSONDecodeError, TypeError, KeyError):
                raise RunDirError(f"{path}: line {n} is not a record of a cell; the file is damaged: restore it, "
                                  "or remove that line (its request is then left out)") from None
            (kept if cell in keep else aside).append(line)
        if aside:
            kept_aside = AppendFile(run_dir / name.replace(".jsonl", ".set-aside.jsonl"))
            try:
                kept_aside.append(b"".join(aside))
            finally:
                kept_aside.close()
        write_file(path, b"".join(kept))


NOT_STARTED = "the run ended before this cell started"


def build_summary_from_dir(run_dir: Path, scenario: Scenario, *, read_back: bool = False) -> Summary:
    """``summary.json`` re-derived from the run directory's records, statuses and probe samples;
    ``read_back`` (``loadgen report``): a run that ended unfinished lists the cells it never started."""
    by_cell: dict[int, list[RequestRecord]] = defaultdict(list)
    if (run_dir / RECORDS).is_file():
        try:
            for record in read_records(run_dir / RECORDS):
                by_cell[record.cell].append(record)
        except UnreadableRecord as exc:
            raise RunDirError(
                f"{run_dir / RECORDS}: {exc}; the file is damaged: restore it, or remove that line "
                "(the figures then leave that request out)"
            ) from None
    statuses = read_cell_status(run_dir)
    legacy = not (run_dir / CELLS).is_file()
    probes = read_samples(run_dir / SAMPLES)
    entries = []
    lines = search_lines(scenario)
    planned = expand_cells(scenario)
    # a run that wrote no summary ended without finishing (killed, or its disk full): unfinished
    # where a planned cell has no final status
    unfinished = not (run_dir / SUMMARY).is_file() and any(
        (st := statuses.get(c.index)) is None or st.status in ("started", "interrupted") for c in planned)
    for cell in [*planned, *probe_cells(lines, statuses)]:
        status = statuses.get(cell.index)
        if status is None or status.status == "started":
            if cell.index not in by_cell:
                if read_back and unfinished and status is None and cell.search is None:
                    entries.append(cell_summary(cell, [], CellStatus(cell.index, "interrupted", NOT_STARTED), {}))
                continue
            status = replace(status or CellStatus(cell.index, ""), status="done" if legacy else "interrupted")
        entries.append(cell_summary(cell, by_cell.get(cell.index, []), status, probes.get(cell.index, {})))
    provenance: Unchecked = {}
    if (run_dir / PROVENANCE).is_file():
        provenance = read_json(run_dir / PROVENANCE)
    stored: Unchecked = {}
    if (run_dir / SUMMARY).is_file():
        stored = read_json(run_dir / SUMMARY)
    if not isinstance(provenance, dict) or not isinstance(stored, dict):
        raise RunDirError(f"{run_dir}: provenance.json and summary.json must hold JSON objects")
    return assemble_summary(
        scenario, entries, lines, model=provenance.get("model", stored.get("model")),
        interrupted=bool(stored.get("interrupted", False)) or unfinished, aborted=stored.get("aborted") or None,
        resumed=len(provenance.get("resumed_wall") or ()),
    )


def stored_seed(run_dir: Path) -> int | None:
    """The seed a run directory's prompts were drawn from (its resolved scenario says)."""
    try:
        data = yaml.safe_load((run_dir / SCENARIO).read_text())
    except (OSError, yaml.YAMLError):
        return None
    seed = data.get("seed") if isinstance(data, dict) else None
    return seed if isinstance(seed, int) else None


def load_scenario_of(run_dir: Path) -> Scenario:
    """The scenario a run directory was made with."""
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    scenario_path = run_dir / SCENARIO
    for p in (scenario_path, run_dir / RECORDS):
        if not p.is_file():
            raise RunDirError(f"{run_dir}: missing {p.name}; is this a loadgen run directory?")
    try:
        data = yaml.safe_load(scenario_path.read_text())
        return parse_scenario(as_recorded(data) if isinstance(data, dict) else data, str(scenario_path))
    except ScenarioError as exc:
        raise RunDirError(str(exc)) from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise RunDirError(f"{scenario_path}: not valid YAML{line}; restore the file the run wrote") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunDirError(f"{scenario_path}: cannot be read ({exc}); restore the file the run wrote") from None


def rebuild_summary(run_dir: Path) -> Summary:
    """Re-derive ``summary.json`` from ``scenario.resolved.yaml``, records, statuses and probes."""
    return build_summary_from_dir(run_dir, load_scenario_of(run_dir), read_back=True)
