"""Two `loadgen run --out X` at once: the second is refused with exit 2, the first's records
stay its own (one line per request, no duplicated keys)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from loadgen.results.records import read_records
from tests.conftest import StartSim


def test_two_runs_into_one_directory(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=5)
    path = tmp_path / "s.yaml"
    # long enough to outlast the second run's start on a busy machine; stopped once it was refused
    path.write_text(yaml.safe_dump({
        "target": {"base_url": base_url},
        "workload": {"num_prompts": 4000, "input_tokens": 16, "output_tokens": 32},
        "load": {"concurrency": 2},
    }))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadgen", "run", str(path), "--out", str(out)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (out / "run.lock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert first.poll() is None, "the first run ended before the second started"
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert second.returncode == 2, second.stderr
    assert "another run (pid" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    # the first run's records alone: one line per request, none twice
    records = [r for r in read_records(out / "records.jsonl") if not r.warmup]
    keys = [(r.cell, r.request_id) for r in records]
    assert records
    assert len(keys) == len(set(keys))
    assert not (out / "run.lock").exists()  # released when the run ended
