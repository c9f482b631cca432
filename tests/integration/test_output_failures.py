"""A run directory that cannot be written: every record reaches the disk or the run says it did
not (one line naming the file and the OS error, a non-zero exit, the lost count in the summary),
no line is left half written, and no link planted in the directory is followed."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from loadgen.results.rundir import rebuild_summary
from tests.conftest import StartSim

ROOT = Path(__file__).parents[2]


def loadgen(*args: str, limit_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    def limits() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, check=False, preexec_fn=limits)


def whole_lines(path: Path) -> list[dict[str, object]]:
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path.name} ends in half a line"
    return [orjson.loads(line) for line in data.splitlines()]


def requests_received(base_url: str) -> int:
    page = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=5).text
    line = next(x for x in page.splitlines() if x.startswith("loadgen_sim_requests_total "))
    return int(float(line.split()[1]))


def test_records_that_cannot_be_written_stop_the_run_and_are_counted(start_sim: StartSim, tmp_path: Path) -> None:
    # records.jsonl may not grow past 24 KiB (as if its disk filled), while the small files
    # (summary, provenance) still fit: the run stops at the first record it cannot write
    url = start_sim(ttft_ms=2, itl_ms=1)
    out = tmp_path / "run"
    proc = loadgen("run", "--base-url", url, "--num-prompts", "400", "--input-len", "16", "--output-len", "4",
                   "--concurrency", "8", "--out", str(out), limit_bytes=24 * 1024)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "records.jsonl: cannot append to it: File too large (EFBIG)" in last
    assert "Traceback" not in proc.stderr
    records = whole_lines(out / "records.jsonl")
    summary = orjson.loads((out / "summary.json").read_bytes())
    lost = summary["records_lost"]
    (cell,) = summary["cells"]
    assert cell["status"] == "failed"
    assert "records.jsonl: cannot append to it" in cell["reason"]
    assert lost >= 1
    assert f"{lost} measured requests could not be recorded" in last
    # the run stopped early: far fewer than the 400 planned, every one of them accounted for
    received = requests_received(url)
    assert len(records) < 400
    assert len(records) + lost >= received
    ids = [r["request_id"] for r in records if not r["warmup"]]
    assert len(ids) == len(set(ids))
    # the lost count is re-derived from the run directory, and the report says the run is incomplete
    report = loadgen("report", str(out), "--format", "md")
    assert report.returncode == 0, report.stderr
    assert f"**Incomplete**: {lost} measured requests could not be written" in report.stdout
    assert whole_lines(out / "cells.jsonl")[-1]["records_lost"] == lost  # the cell's own count, on record

    # once there is room: the failed cell measured again holds every record, and nothing is lost now
    again = loadgen("run", "--base-url", url, "--num-prompts", "400", "--input-len", "16", "--output-len", "4",
                    "--concurrency", "8", "--resume", str(out), "--retry-failed")
    assert again.returncode == 0, again.stderr
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert "records_lost" not in summary
    assert summary["cells"][0]["status"] == "done"
    assert summary["cells"][0]["metrics"]["completed"] == 400
    assert rebuild_summary(out).to_dict() == summary


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the file-size limit test covers the same path")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"this machine refuses a tmpfs mount ({proc.stderr.strip()})")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_disk_that_stays_full_gives_one_line_and_whole_files(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    with small_tmpfs(tmp_path / "disk", "400k") as disk:
        # a ballast leaves about 40 KiB free: the scenario and provenance fit, the records soon do not
        ballast = disk / "ballast"
        with contextlib.suppress(OSError), ballast.open("wb") as f:
            f.write(b"\0" * (360 * 1024))
        out = disk / "run"
        proc = loadgen("run", "--base-url", url, "--num-prompts", "2000", "--input-len", "16",
                       "--output-len", "4", "--concurrency", "8", "--out", str(out))
        assert proc.returncode == 1, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert "No space left on device (ENOSPC)" in last
        assert "Traceback" not in proc.stderr
        assert not list(out.glob("*.tmp")), "a temporary file was left behind"
        records = whole_lines(out / "records.jsonl")
        assert 0 < len(records) < 2000
        # once there is room again, the run directory is whole: the report re-derives it
        ballast.unlink()
        report = loadgen("report", str(out), "--format", "md")
        assert report.returncode == 0, report.stderr
        # the samples and statuses are whole lines too
        for name in ("probes.jsonl", "cells.jsonl"):
            if (out / name).exists():
                whole_lines(out / name)


def test_links_planted_in_the_run_directory_are_not_followed(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "run"
    args = ("run", "--base-url", url, "--num-prompts", "4", "--input-len", "8", "--output-len", "2", "--out", str(out))
    assert loadgen(*args).returncode == 0
    # planted in a run directory, where a whole-file write stages its temporary file, and the
    # report: replaced when the run is continued, never written through
    (out / "summary.json.tmp").symlink_to(victim)
    (out / "report.md").unlink()
    (out / "report.md").symlink_to(victim)
    proc = loadgen(*args[:-2], "--resume", str(out))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "keep me\n"
    assert not (out / "report.md").is_symlink()
    assert not (out / "summary.json.tmp").exists()

    # a link where an appended file belongs is refused, by name, before anything is measured
    out2 = tmp_path / "run2"
    out2.mkdir()
    (out2 / "records.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    proc = loadgen("run", "--base-url", url, "--num-prompts", "4", "--input-len", "8", "--output-len", "2",
                   "--out", str(out2))
    assert proc.returncode != 0
    assert "records.jsonl" in proc.stderr
    assert "symbolic link" in proc.stderr
    assert victim.read_text() == "keep me\n"



def test_a_directory_of_the_users_own_is_not_written_into(tmp_path: Path) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "report.md").write_text("my own report\n")
    proc = loadgen("run", "--base-url", "http://127.0.0.1:9/v1", "--num-prompts", "2", "--out", str(mine))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --out {mine}: holds files that are not a run's (report.md); choose a new or empty directory")
    assert (mine / "report.md").read_text() == "my own report\n"
    assert sorted(p.name for p in mine.iterdir()) == ["report.md"]


def test_report_into_a_full_disk_is_one_line_and_leaves_nothing_half_written(
    start_sim: StartSim, tmp_path: Path,
) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    with small_tmpfs(tmp_path / "disk", "400k") as disk:
        out = disk / "run"
        assert loadgen("run", "--base-url", url, "--num-prompts", "2", "--input-len", "8", "--output-len", "2",
                       "--out", str(out)).returncode == 0
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        with contextlib.suppress(OSError), (disk / "ballast").open("wb") as f:
            f.write(b"\0" * (400 * 1024))  # every byte left
        for flag in ("--html", "--plot"):
            proc = loadgen("report", str(out), flag)
            assert proc.returncode == 1, proc.stderr
            assert "No space left on device (ENOSPC)" in proc.stderr.strip().splitlines()[-1]
            assert "Traceback" not in proc.stderr
            # no temporary file, no empty chart, nothing of the run touched
            assert {p.name: p.read_bytes() for p in out.iterdir()} == before
