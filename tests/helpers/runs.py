"""`loadgen run` as a test runs it, in a process of its own, with a scenario of worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def run(
    tmp_path: Path, name: str, body: dict[str, Any], env: dict[str, str] | None = None, prefix: list[str] | None = None,
) -> tuple[Path, str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **body}))
    run_dir = tmp_path / name
    proc = subprocess.run([*(prefix or []), sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)],
                          capture_output=True, text=True, timeout=180, check=False, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, proc.stderr


def scenario(base_url: str, workers: int | str, **load: Any) -> dict[str, Any]:
    return {
        "target": {"base_url": base_url, "api": "completions"},
        "workload": {"num_prompts": 48, "input_tokens": 32, "output_tokens": 24},
        "load": {"concurrency": 8, "warmup_requests": 2, "workers": workers, **load},
    }
