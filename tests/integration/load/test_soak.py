"""The soak benchmark, short: a minute of steady load against `loadgen sim` through `loadgen run`;
after warm-up the client's memory stays within 10% and it holds no more file descriptors.
(`python benchmarks/soak.py` is the 30-minute version.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]


@pytest.mark.slow
def test_a_minute_of_load_leaves_memory_and_descriptors_flat(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--duration", "60", "--rate", "20",
         "--interval", "2", "--json", str(out)],
        check=True, timeout=300, capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["exit_code"] == 0
    assert result["failed"] == 0
    # Poisson arrivals at 20/s for 60 s, plus 4 warmup requests
    assert 900 <= result["requests"] <= 1500
    assert len(result["samples"]) >= 20
    assert result["rss_growth_pct"] < 10
    fds = result["fds_after_warmup"]
    assert fds["max"] - fds["min"] <= 2
