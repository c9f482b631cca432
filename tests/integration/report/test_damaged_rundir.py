"""`loadgen report` on a damaged or read-only run directory: one line naming the file, the
line where it applies and what to do, a non-zero exit code, no traceback, and nothing written."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]
FIXTURE = ROOT / "tests" / "data" / "rundir-v2"


def _append(name: str, text: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        with (run / name).open("a") as f:
            f.write(text)
    return damage


def _replace(name: str, text: str) -> Callable[[Path], None]:
    return lambda run: (run / name).write_text(text)


def _torn_middle(run: Path) -> None:
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    lines[4] = lines[4][:40] + b"\n"  # a line cut short, with more after it: not a crash's tail
    (run / "records.jsonl").write_bytes(b"".join(lines))


@pytest.mark.parametrize(("damage", "expected"), [
    (_replace("scenario.resolved.yaml", "name: x\nworkload: [\n"),
     "scenario.resolved.yaml: not valid YAML at line 3; restore the file the run wrote"),
    (_torn_middle, "records.jsonl: line 5 is not a request record ("),
    (_append("records.jsonl", '{"request_id": 5}\n'), "records.jsonl: line 79 is not a request record ("),
    (_replace("cells.jsonl", "garbage\n"), "cells.jsonl: line 1 is not a cell status ("),
    (_replace("provenance.json", "[]"), "provenance.json and summary.json must hold JSON objects"),
    (_replace("probes.jsonl", "{bad\n"), "probes.jsonl: line 1 is not a sample ("),
], ids=["scenario-yaml", "torn-record", "record-without-fields", "cells", "provenance", "samples"])
def test_a_damaged_run_directory_is_one_line(tmp_path: Path, damage: Callable[[Path], None], expected: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    (run / "summary.json").unlink()  # the report re-derives it from the files damaged
    damage(run)
    before = sorted(p.name for p in run.iterdir())
    proc = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run), "--html"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ")
    assert expected in line
    assert sorted(p.name for p in run.iterdir()) == before  # no report, no temporary file


def test_a_record_cut_short_at_the_end_is_left_out_not_refused(tmp_path: Path) -> None:
    # a run killed while writing its last record: the report goes on without that record
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    data = (run / "records.jsonl").read_bytes()
    (run / "records.jsonl").write_bytes(data + data.splitlines(keepends=True)[-1][:60])
    proc = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run), "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    mount = tmp_path / "ro"
    mount.mkdir()
    # root ignores file modes: a read-only bind mount is what refuses its writes
    made = subprocess.run(["mount", "--bind", str(run), str(mount)], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"a read-only mount needs root here: {made.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mount)], check=True, capture_output=True)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False, capture_output=True)


@pytest.mark.parametrize(("flag", "file"), [("--html", "report.html"), ("--plot", "distributions.png")])
def test_a_report_into_a_read_only_run_directory_is_one_line(read_only: Path, flag: str, file: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "loadgen", "report", str(read_only), flag], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {read_only / file}: cannot write it: Read-only file system (EROFS)")
    # the tables themselves still print: reading needs no writing
    tables = subprocess.run([sys.executable, "-m", "loadgen", "report", str(read_only)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert tables.returncode == 0, tables.stderr
