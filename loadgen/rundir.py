"""The run directory: what a run writes, and how a summary is re-derived from it alone.

    RUN_DIR/
      scenario.resolved.yaml   the scenario with every default filled in
      provenance.json          loadgen/python/host, times, seed, clock base, server answers
      records.jsonl            one RequestRecord per line, appended as each request ends
      summary.json             {"cells": [{"params": ..., "metrics": ...}], ...}
      report.md                the summary as Markdown tables
      server.log               the launched server's output, when loadgen started one
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from loadgen.errors import RunDirError, ScenarioError
from loadgen.metrics import summarize
from loadgen.records import RequestRecord, read_records
from loadgen.scenario import Cell, Scenario, expand_cells, parse_scenario

RECORDS = "records.jsonl"
SUMMARY = "summary.json"
SCENARIO = "scenario.resolved.yaml"
PROVENANCE = "provenance.json"
REPORT = "report.md"
SERVER_LOG = "server.log"


def default_run_dir(scenario: Scenario, root: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return root / f"{scenario.name}-{stamp}"


def write_json(path: Path, data: Any) -> None:
    """Write atomically (temp file + rename), so a crash never leaves half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    tmp.replace(path)


def cell_summary(scenario: Scenario, cell: Cell, records: list[RequestRecord]) -> dict[str, Any]:
    """One entry of ``summary.json: cells``."""
    return {"cell": cell.index, "params": cell.params(), "metrics": summarize(records, scenario.slo)}


def assemble_summary(
    scenario: Scenario, cells: list[dict[str, Any]], *, model: str | None, interrupted: bool
) -> dict[str, Any]:
    return {"scenario": scenario.name, "model": model, "interrupted": interrupted, "cells": cells}


def build_summary(
    scenario: Scenario,
    records_by_cell: dict[int, list[RequestRecord]],
    *,
    model: str | None,
    interrupted: bool,
) -> dict[str, Any]:
    """``summary.json`` from records; a run builds the same entries cell by cell as it goes."""
    entries = [
        cell_summary(scenario, cell, records_by_cell[cell.index])
        for cell in expand_cells(scenario)
        if cell.index in records_by_cell
    ]
    return assemble_summary(scenario, entries, model=model, interrupted=interrupted)


def load_run(run_dir: Path) -> tuple[Scenario, dict[int, list[RequestRecord]], dict[str, Any]]:
    """The scenario, records by cell and provenance of a run directory."""
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    scenario_path = run_dir / SCENARIO
    records_path = run_dir / RECORDS
    for p in (scenario_path, records_path):
        if not p.is_file():
            raise RunDirError(f"{run_dir}: missing {p.name}; is this a loadgen run directory?")
    try:
        scenario = parse_scenario(yaml.safe_load(scenario_path.read_text()), str(scenario_path))
    except ScenarioError as exc:
        raise RunDirError(str(exc)) from exc
    by_cell: dict[int, list[RequestRecord]] = defaultdict(list)
    try:
        for record in read_records(records_path):
            by_cell[record.cell].append(record)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise RunDirError(f"{records_path}: unreadable record ({exc})") from exc
    provenance: dict[str, Any] = {}
    if (run_dir / PROVENANCE).is_file():
        provenance = orjson.loads((run_dir / PROVENANCE).read_bytes())
    return scenario, dict(by_cell), provenance


def rebuild_summary(run_dir: Path) -> dict[str, Any]:
    """Re-derive ``summary.json`` from ``scenario.resolved.yaml`` and ``records.jsonl``."""
    scenario, by_cell, provenance = load_run(run_dir)
    stored: dict[str, Any] = {}
    if (run_dir / SUMMARY).is_file():
        stored = orjson.loads((run_dir / SUMMARY).read_bytes())
    return build_summary(
        scenario,
        by_cell,
        model=provenance.get("model", stored.get("model")),
        interrupted=bool(stored.get("interrupted", False)),
    )
