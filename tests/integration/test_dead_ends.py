"""A way forward from the dead ends a newcomer meets: failed requests said under every table, a
``--set`` that a matrix axis replaces warned about, the same failure reason said once for all
its cells, a model that cannot be had refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from loadgen.results.records import read_records

ROOT = Path(__file__).parents[2]

SCENARIO = """\
name: t
kind: throughput
serve: {backend: sim, sim: {ttft_ms: 2, itl_ms: 1, faults: {http_500: 0.25}, fault_seed: 3}}
workload: {num_prompts: 40, input_tokens: 16, output_tokens: 4}
matrix: {output_tokens: [4, 8]}
"""


def loadgen(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, check=False)


def test_failed_requests_are_under_the_table_and_an_overridden_set_is_warned(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "run"
    proc = loadgen("run", str(path), "--set", "workload.output_tokens=16", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert ("warning: --set workload.output_tokens=16: the matrix axis output_tokens (4, 8) sets "
            "workload.output_tokens in each of its cells; to run only 16: --set 'matrix.output_tokens=[16]'"
            ) in proc.stderr
    records = [r for r in read_records(out / "records.jsonl") if not r.warmup]
    for cell, length in ((0, 4), (1, 8)):
        failed = sum(1 for r in records if r.cell == cell and not r.ok)
        assert failed  # the seeded draw fails some requests of each cell
        assert (f"* output length {length}: {failed} of 40 requests failed ({failed} http_status); "
                f"its figures count the {40 - failed} that finished") in proc.stdout
    # the same notes when the report is printed again from the run directory
    again = loadgen("report", str(out), "--table", "throughput", "--format", "md")
    assert again.returncode == 0, again.stderr
    assert "requests failed" in again.stdout


def test_a_model_that_cannot_be_had_is_refused_in_one_line_before_launch(tmp_path: Path) -> None:
    # a hub id not in the (empty) cache, with the hub out of reach: said at once, nothing started
    env_hub = tmp_path / "hub"
    env_hub.mkdir()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "serve", "Qwen/Qwen2-0.5B-Instruct", "--device", "cpu", "--backend",
         "transformers"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_CACHE": str(env_hub),
             "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 3, proc.stderr
    assert time.monotonic() - t0 < 30
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1
    assert "model Qwen/Qwen2-0.5B-Instruct: not in the Hugging Face cache" in error[0]
    assert "http://127.0.0.1:9 cannot be reached" in error[0]
    assert "starting" not in proc.stderr
