"""Waiting on a run directory a running process writes."""

from __future__ import annotations

import time
from pathlib import Path


def wait_for_records(run_dir: Path, min_bytes: int, timeout_s: float = 60.0, poll_s: float = 0.1) -> bool:
    """Until the run's records.jsonl holds ``min_bytes`` (requests are being measured), at most
    ``timeout_s``; whether it got there."""
    records = run_dir / "records.jsonl"
    deadline = time.monotonic() + timeout_s
    while not records.exists() or records.stat().st_size < min_bytes:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True
