"""`loadgen bench serve --request-rate R` offers the load `vllm bench serve` offers: vLLM's pacing
(a drawn gap before the first request, the last sent at num_prompts / R), so the same command
gives the same offered load and the same benchmark duration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.load.schedule import Arrivals, vllm_offsets
from loadgen.results.records import read_records
from tests.conftest import StartSim

pytestmark = pytest.mark.timing

ROOT = Path(__file__).parents[3]


def test_bench_serve_paces_128_requests_at_rate_16_like_vllm(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=5, itl_ms=2)
    out, result = tmp_path / "run", tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "bench", "serve", "--base-url", url.removesuffix("/v1"),
         "--model", "loadgen-sim", "--dataset-name", "random", "--random-input-len", "16",
         "--random-output-len", "8", "--num-prompts", "128", "--request-rate", "16", "--seed", "7",
         "--out", str(out), "--save-result", "--result-filename", str(result)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    measured = sorted((r for r in read_records(out / "records.jsonl") if not r.warmup), key=lambda r: r.request_id)
    assert len(measured) == 128
    # the send schedule is vLLM's rule on the seed's gaps: the same offsets, relative to the start
    expected = vllm_offsets(128, 16.0, Arrivals(16.0, "poisson", 1.0, 7))
    start = measured[0].scheduled_at - expected[0]
    assert [r.scheduled_at - start for r in measured] == pytest.approx(expected, abs=1e-6)
    assert expected[-1] == pytest.approx(8.0)
    # and the benchmark's duration, as vLLM counts it (from before the first gap), is 8 s and the
    # last answer (about 20 ms): within 2%
    duration = json.loads(result.read_text())["duration"]
    assert duration == pytest.approx(8.0, rel=0.02)


def test_vllms_harmless_flags_are_taken_and_append_result_appends(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1)
    result = tmp_path / "result.json"
    flags = ["--trust-remote-code", "--tokenizer-mode", "auto", "--request-id-prefix", "bench-x-",
             "--ready-check-timeout-sec", "30", "--plot-timeline", "--probe-request-rate", "2", "--logprobs", "1",
             "--insecure"]
    for n in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "bench", "serve", "--base-url", url.removesuffix("/v1"),
             "--model", "loadgen-sim", "--random-input-len", "8", "--random-output-len", "2", "--num-prompts", "3",
             *flags, "--save-result", "--result-filename", str(result), "--append-result",
             "--out", str(tmp_path / f"run{n}")],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        for flag in ("--trust-remote-code", "--tokenizer-mode", "--plot-timeline", "--probe-request-rate",
                     "--logprobs"):
            assert f"{flag} ignored: " in proc.stderr
    # vLLM's --append-result: the second result follows the first, a JSON document a line
    documents = [json.loads(line) for line in result.read_text().splitlines()]
    assert [d["completed"] for d in documents] == [3, 3]
