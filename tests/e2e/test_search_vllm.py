"""A capacity search on real vLLM (CPU build), through the CLI as a user runs it: it finishes,
every verdict follows from its figures, the probes are the ones the search rule picks, each
probe's prompts are fresh (vLLM's own prefix-cache counters), and the plot is written."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen.results.capacity import next_value
from loadgen.results.records import read_records
from loadgen.scenario.shapes import Search

pytestmark = pytest.mark.engines

SEARCH = {"by": "concurrency", "min": 1, "max": 8,
          "slo": {"ttft_ms": {"p99": 2000}, "tpot_ms": {"p99": 8}, "error_rate": 0.0}}
SCENARIO = f"""
name: vllm-capacity
workload: {{num_prompts: 24, input_tokens: 64, output_tokens: 16}}
load:
  search: {json.dumps(SEARCH)}
"""


def test_a_search_on_vllm_finishes_and_plots(vllm_engine: str, tmp_path: Path) -> None:
    path = tmp_path / "search.yaml"
    path.write_text(SCENARIO)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--base-url", vllm_engine,
                           "--out", str(run_dir)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    cap = summary["capacity"]
    print("\n" + cap["answer"])
    for p in cap["probes"]:
        print(f"  c={p['value']:g}: {p['figures']} -> {'meets' if p['meets_slo'] else p['broken']}")
    assert cap["complete"] is True
    assert cap["answer"] in done.stdout

    spec = Search.model_validate(SEARCH)
    cells = {c["cell"]: c for c in summary["cells"]}
    records = list(read_records(run_dir / "records.jsonl"))
    results: list[tuple[float, bool]] = []
    for p in cap["probes"]:
        # the search picked this value from the verdicts before it
        assert p["value"] == next_value(spec, results)
        figs = p["figures"]
        within = figs["ttft_ms.p99"] <= 2000 and figs["tpot_ms.p99"] <= 8 and figs["error_rate"] == 0
        assert p["meets_slo"] == within
        results.append((p["value"], p["meets_slo"]))
        cell = cells[p["cell"]]
        assert cell["params"]["concurrency"] == p["value"]
        # the verdict's TPOT p99 is over the requests after the probe's first wave (its first C)
        skip = cells[p["cell"]]["probe"]["ramp_left_out"]
        assert skip == (p["value"] if 24 >= 2 * p["value"] else 0)
        tpots = [r.tpot_s * 1e3 for r in records if r.cell == p["cell"] and not r.warmup and r.ok
                 and r.tpot_s is not None and r.request_id >= skip]
        assert abs(figs["tpot_ms.p99"] - float(np.percentile(tpots, 99))) < 1e-6
        # fresh prompts in every probe: vLLM answered (almost) nothing from its prefix cache
        assert cell["server_prefix_cache_hit_rate"] < 0.05
        assert "running" in cell["server_metrics"]  # vLLM's queue gauges were read
    assert next_value(spec, results) is None
    passing = [v for v, ok in results if ok]
    assert cap["max_meeting_slo"] == (max(passing) if passing else None)

    png = (run_dir / "capacity.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (round(4.2 * 4 * 110), round(3.8 * 110))  # 3 objectives and the throughput
