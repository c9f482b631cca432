"""`loadgen locust` as a test runs it: a scenario file, and the command, headless or not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

OUTPUT = 32  # output tokens of write_scenario's requests


def write_scenario(path: Path, **sections: object) -> Path:
    data: dict[str, object] = {
        "name": "locust",
        "target": {"api": "completions"},
        "workload": {"num_prompts": 50, "input_tokens": 64, "output_tokens": OUTPUT},
    }
    data.update(sections)
    path.write_text(yaml.safe_dump(data))
    return path


def locust(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", "locust", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def headless(scenario: Path, base_url: str, tmp_path: Path, users: int, run_time: str, stop_timeout: int
             ) -> subprocess.CompletedProcess[str]:
    """`loadgen locust` headless with CSVs at tmp_path/stats and loadgen's run directory at tmp_path/run."""
    return locust(
        "--scenario", str(scenario), "--host", base_url, "--headless", "-u", str(users), "-r", str(users),
        "-t", run_time, "--stop-timeout", str(stop_timeout), "--csv", str(tmp_path / "stats"),
        "--out", str(tmp_path / "run"), "--only-summary",
    )
