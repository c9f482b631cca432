"""One run writes a run directory at a time: the lock file, refused while its process lives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.errors import UsageError
from loadgen.results.rundir import LOCK, RunDirWriter, claim


def test_a_second_writer_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / LOCK).write_text(f"{other.pid}\n")
        with pytest.raises(UsageError, match=rf"another run \(pid {other.pid}\) is writing this directory"):
            RunDirWriter(tmp_path)
    finally:
        other.kill()
        other.wait()
    # its process is gone: the lock is stale and taken over
    writer = RunDirWriter(tmp_path)
    assert (tmp_path / LOCK).read_text().strip().isdigit()
    writer.close()
    assert not (tmp_path / LOCK).exists()


def test_out_that_is_a_file_or_not_writable_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(UsageError, match="is a file, not a directory"):
        claim(afile)
    with pytest.raises(UsageError, match="cannot create the run directory"):
        claim(afile / "below")


def test_a_scenario_name_never_leads_out_of_runs() -> None:
    from loadgen.results.rundir import default_run_dir
    from loadgen.scenario.loader import parse_scenario

    for name, stem in (("../../x", "_.._x"), ("a b/c", "a_b_c"), ("...", "run"), ("ok-1.2_x", "ok-1.2_x")):
        path = default_run_dir(parse_scenario({"name": name}), Path("runs"))
        assert path.parent == Path("runs")
        assert path.name.startswith(stem + "-")


@pytest.mark.parametrize(("name", "garbage", "message"), [
    ("provenance.json", b"{bad json", "provenance.json: not valid JSON"),
    ("summary.json", b"{bad", "summary.json: not valid JSON"),
    ("cells.jsonl", b'{"cell": 0, "status"\n', "cells.jsonl: line 1 is not a cell status"),
    ("probes.jsonl", b'{"cell": 0}\n', "probes.jsonl: line 1 is not a sample"),
])
def test_report_on_a_corrupt_file_names_it(tmp_path: Path, name: str, garbage: bytes, message: str) -> None:
    from loadgen.errors import RunDirError
    from loadgen.results.rundir import SCENARIO, rebuild_summary
    from loadgen.scenario.loader import parse_scenario
    from loadgen.scenario.redact import dump_scenario

    (tmp_path / SCENARIO).write_text(dump_scenario(parse_scenario({"name": "x"})))
    (tmp_path / "records.jsonl").write_bytes(b"")
    (tmp_path / name).write_bytes(garbage)
    with pytest.raises(RunDirError, match=message):
        rebuild_summary(tmp_path)


def test_a_bad_dataset_is_refused_before_the_run_directory_exists(tmp_path: Path) -> None:
    from loadgen.errors import ScenarioError
    from loadgen.load.run import execute
    from loadgen.scenario.loader import load_scenario

    (tmp_path / "bad.jsonl").write_text('{"prompt_token_ids": [1, -5]}\n')
    (tmp_path / "s.yaml").write_text(
        "target: {base_url: 'http://127.0.0.1:9/v1', model: m}\n"
        "workload: {dataset: {kind: jsonl, path: bad.jsonl}, num_prompts: 1}\n"
    )
    with pytest.raises(ScenarioError, match="bad.jsonl: line 1: prompt_token_ids must be a non-empty list"):
        execute(load_scenario(tmp_path / "s.yaml"), tmp_path / "run")
    assert not (tmp_path / "run").exists()
