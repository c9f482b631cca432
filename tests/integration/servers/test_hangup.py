"""A hangup (SIGHUP: a closed terminal, a dropped SSH session) stops loadgen as Ctrl-C does,
and an engine loadgen launched never outlives it, even when loadgen is killed outright."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.conftest import live_group_members

SCENARIO = {
    "serve": {"backend": "sim", "sim": {"ttft_ms": 20, "itl_ms": 20}},
    "workload": {"num_prompts": 400, "input_tokens": 16, "output_tokens": 64},
    "load": {"concurrency": 2},
}


def start_run(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    records = run_dir / "records.jsonl"
    while time.monotonic() < deadline and (not records.exists() or len(records.read_bytes().splitlines()) < 10):
        time.sleep(0.05)
    return proc, run_dir


def engine_pid(run_dir: Path) -> int:
    provenance = json.loads((run_dir / "provenance.json").read_text())
    pid = provenance["server"]["pid"]
    assert isinstance(pid, int)
    return pid


def test_sighup_mid_run_finishes_the_run_directory_and_stops_the_engine(tmp_path: Path) -> None:
    proc, run_dir = start_run(tmp_path)
    pid = engine_pid(run_dir)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    recorded = len((run_dir / "records.jsonl").read_bytes().splitlines())
    cell = summary["cells"][0]["metrics"]
    # every request sent is on record: the measured ones, the warmup and the two calibration probes
    assert cell["requests"] + 3 == recorded
    assert live_group_members(pid) == []


def test_an_engine_does_not_outlive_a_killed_loadgen(tmp_path: Path) -> None:
    proc, run_dir = start_run(tmp_path)
    pid = engine_pid(run_dir)
    assert live_group_members(pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30
    while live_group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_group_members(pid) == []
