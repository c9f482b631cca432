"""Runs that did not finish: killed mid-cell (SIGKILL: no handler runs, no summary is written)
and read back with ``loadgen report``, where the run is said to be interrupted and the cut cell
says how far it got of its prompts; stopped and resumed against the same server, whose prefix
cache must answer none of the resumed cell's prompts; resumed over a damaged record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.errors import RunDirError
from loadgen.results.records import read_records
from loadgen.results.rundir import set_aside_records
from tests.conftest import StartSim

ROOT = Path(__file__).parents[3]


def start_run(tmp_path: Path, name: str, base_url: str, workload: dict, load: dict,
              after: int = 10) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``loadgen run`` of a scenario as a user starts it, once ``after`` lines of records are written:
    the process, the scenario's path, the run directory."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": name, "target": {"base_url": base_url}, "workload": workload,
                                    "load": load}))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = run_dir / "records.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (records.exists() and records.read_bytes().count(b"\n") >= after):
        time.sleep(0.1)
    return proc, path, run_dir


def test_a_killed_run_reads_back_as_interrupted_with_its_cut_cell_said(start_sim: StartSim, tmp_path: Path) -> None:
    # 0.1 s a request, one at a time, then two at a time
    proc, _, run_dir = start_run(tmp_path, "killed", start_sim(ttft_ms=5, itl_ms=5),
                                 {"num_prompts": 200, "input_tokens": 8, "output_tokens": 20},
                                 {"concurrency": [1, 2], "warmup_requests": 0})
    records = run_dir / "records.jsonl"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert not (run_dir / "summary.json").exists()  # (what a killed run leaves: records, no summary)
    sent = sum(1 for r in read_records(records) if r.request_id >= 0 and not r.warmup)  # (not the checks)
    assert 5 <= sent < 200

    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"interrupted after {sent} requests of its 200" in text
    summary = orjson.loads(CliRunner().invoke(app, ["report", str(run_dir), "--format", "json"]).output)
    assert summary["interrupted"] is True
    # the second never began: listed as such (it was left out, as if the run had planned one cell)
    assert [(c["cell"], c["status"], c["reason"]) for c in summary["cells"]] == [
        (0, "interrupted", None), (1, "interrupted", "the run ended before this cell started")]
    assert summary["cells"][1]["metrics"] is None
    report_md = CliRunner().invoke(app, ["report", str(run_dir), "--format", "md"]).output
    assert "**Interrupted**: figures cover what was measured before the stop." in report_md
    assert f"interrupted after {sent} requests of its 200" in " ".join(report_md.split())
    assert "interrupted: the run ended before this cell started" in report_md


def test_a_resumed_cell_draws_new_prompts_so_the_server_answers_none_from_its_cache(
    start_sim: StartSim, tmp_path: Path,
) -> None:
    """Ctrl-C mid-cell, then --resume against the same server: the cut cell is measured again
    with prompts of its own (the first ones were sent already, and sit in the server's prefix
    cache: before, the simulator answered all 64 tokens of each resumed prompt from it)."""
    proc, path, run_dir = start_run(tmp_path, "resumed", start_sim(ttft_ms=5, itl_ms=5),
                                    {"num_prompts": 40, "input_tokens": 64, "output_tokens": 20}, {"concurrency": 1})
    records = run_dir / "records.jsonl"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    result = CliRunner().invoke(app, ["run", str(path), "--resume", str(run_dir)])
    assert result.exit_code == 0, result.output
    again = [r for r in read_records(records) if r.request_id >= 0 and not r.warmup]
    assert len(again) == 40
    assert [r.cached_tokens for r in again] == [0] * 40, [r.cached_tokens for r in again]


def test_a_resume_over_a_damaged_record_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "records.jsonl").write_bytes(b'{"cell": 0}\n{"cell": 0, "req\n{"cell": 1}\n')
    with pytest.raises(RunDirError, match=r"records.jsonl: line 2 is not a record of a cell; the file is damaged"):
        set_aside_records(tmp_path, keep={0})
    assert (tmp_path / "records.jsonl").read_bytes().count(b"\n") == 3  # nothing moved or lost
