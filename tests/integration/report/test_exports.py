"""What a run against a given URL is labelled with, and every table of it in every format.

The simulator serves the model ``loadgen-sim`` (its /v1/models says so, owned by ``loadgen``);
nobody declares a quantization unless the scenario does (``target.quant``).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.load.run import execute
from loadgen.report.views import FORMATS
from loadgen.scenario.loader import parse_scenario
from tests.conftest import StartSim

KINDS = ("single-stream", "throughput", "compare", "sweep")


@pytest.fixture
def url_run(start_sim: StartSim, tmp_path: Path) -> Path:
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    sc = parse_scenario({
        "name": "labels",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": 6, "input_tokens": [32, 64], "output_tokens": 8},
        "load": {"concurrency": [1, 3], "warmup_requests": 0},
        "slo": {"ttft_ms": 500},
    })
    execute(sc, tmp_path / "run")
    return tmp_path / "run"


def report(*args: str) -> str:
    result = CliRunner().invoke(app, ["report", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


def test_model_quantization_and_lengths_as_the_server_and_scenario_say(url_run: Path) -> None:
    rows = list(csv.DictReader(io.StringIO(report(url_run, "--table", "throughput", "--format", "csv"))))
    assert [(r["Model"], r["Quantization"]) for r in rows] == [("loadgen-sim", "unknown")] * 4
    # the rows differ by input length and concurrency: both are columns
    assert [(r["Input Length"], r["Concurrency"]) for r in rows] == [("32", "1"), ("32", "3"), ("64", "1"), ("64", "3")]
    assert "Output Length" not in rows[0]  # the same for every row
    stream = list(csv.DictReader(io.StringIO(report(url_run, "--table", "single-stream", "--format", "csv"))))
    assert {r["Model"] for r in stream} == {"loadgen-sim"}
    assert [r["Input Length"] for r in stream] == ["32", "32", "64", "64"]
    compare = report(url_run, "--table", "compare", "--format", "csv")
    software = next(csv.DictReader(io.StringIO(compare)))["Software"]
    assert software.startswith("loadgen (at http://127.0.0.1:")
    assert "None" not in compare


def test_a_declared_quantization_is_shown(start_sim: StartSim, tmp_path: Path) -> None:
    sc = parse_scenario({
        "name": "declared", "target": {"base_url": start_sim(ttft_ms=5, itl_ms=1), "quant": "awq"},
        "workload": {"num_prompts": 2, "input_tokens": 16, "output_tokens": 4}, "load": {"warmup_requests": 0},
    })
    execute(sc, tmp_path / "run")
    rows = list(csv.DictReader(io.StringIO(report(tmp_path / "run", "--table", "throughput", "--format", "csv"))))
    assert [(r["Model"], r["Quantization"]) for r in rows] == [("loadgen-sim", "AWQ")]
    # one cell: no sweep to plot, but its distributions and its requests over time
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--plot"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "run").glob("*.png")) == ["distributions.png", "timeline.png"]


def test_every_table_in_every_format(url_run: Path) -> None:
    for kind in KINDS:
        for fmt in FORMATS:
            text = report(url_run, "--table", kind, "--format", fmt)
            if fmt == "json":
                assert json.loads(text)
            elif fmt == "csv":
                assert len(list(csv.reader(io.StringIO(text)))) >= 2
            else:
                assert text.strip()
    for fmt in ("rst", "csv"):  # the default table of a sweep run
        assert "req/s" in report(url_run, "--format", fmt)
    sweep = list(csv.DictReader(io.StringIO(report(url_run, "--table", "sweep", "--format", "csv"))))
    assert len(sweep) == 4
    assert all(float(r["output tok/s"]) > 0 for r in sweep)  # plain numbers: no thousands separator
    capacity = CliRunner().invoke(app, ["report", str(url_run), "--table", "capacity", "--format", "csv"])
    assert capacity.exit_code == 2
    assert "this run has no search" in capacity.output


def test_piped_markdown_is_never_wrapped(url_run: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "report", str(url_run), "--format", "md"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "40"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    figures = [line for line in lines if line.startswith("completed ")]
    assert len(figures) == 4
    # each cell's line whole: its last part (the engine's cores, watched on this host) on it
    assert all("goodput" in line and "prompt tokens" in line for line in figures)
    assert all(re.search(r"engine cores [\d,]+: engine \d+%, other programs \d+%$", line.rstrip()) for line in figures)
    assert all(line.rstrip().endswith("|") for line in lines if line.startswith("|"))
    assert "closed loop of 3" in done.stdout
    assert "all at once" not in done.stdout
