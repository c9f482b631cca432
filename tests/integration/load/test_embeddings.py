"""``target.api: embeddings`` against the simulator, whose answer takes --ttft-ms plus
--embedding-per-token-us for each input token: latency, requests/s, input tokens/s and
embeddings/s by hand, and a capacity search on E2E latency."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.results.records import read_records
from tests.conftest import StartSim


def run(path: Path, base_url: str, out: Path) -> dict:
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return orjson.loads((out / "summary.json").read_bytes())


def test_a_batch_of_8_at_a_known_cost_per_token(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=10, itl_ms=1, embedding_per_token_us=100)
    path = tmp_path / "emb.yaml"
    path.write_text("name: emb\ntarget: {api: embeddings}\nworkload: {num_prompts: 16, input_tokens: 64, batch_size: 8}\n"
                    "load: {concurrency: 2, warmup_requests: 0}\n")
    (cell,) = run(path, base_url, tmp_path / "run")["cells"]
    m = cell["metrics"]
    # 8 inputs of 64 tokens: 10 ms + 512 x 0.1 ms = 61.2 ms each, no first token
    assert m["completed"] == 16
    assert m["e2e_s"]["p50"] == pytest.approx(0.0612, abs=0.004)
    assert m["ttft_s"]["p50"] is None
    # two at a time: 2 / 61.2 ms requests/s, each 8 vectors and 512 input tokens
    assert m["request_throughput"] == pytest.approx(2 / 0.0612, rel=0.08)
    assert m["embeddings_per_s"] == pytest.approx(8 * m["request_throughput"])
    assert m["total_token_throughput"] == pytest.approx(512 * m["request_throughput"])
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r.request_id >= 0]
    assert {(r.embeddings, r.prompt_tokens, r.input_tokens) for r in records} == {(8, 512, 512)}


def test_a_capacity_search_on_e2e_latency(start_sim: StartSim, tmp_path: Path) -> None:
    # 4 served at once: a fifth waits a whole answer (about 2 x 61 ms) and breaks 100 ms
    base_url = start_sim(ttft_ms=10, itl_ms=1, embedding_per_token_us=100, max_seqs=4)
    path = tmp_path / "cap.yaml"
    path.write_text("name: cap\ntarget: {api: embeddings}\nworkload: {num_prompts: 48, input_tokens: 64, batch_size: 8}\n"
                    "load: {warmup_requests: 0, search: {by: concurrency, min: 2, max: 8, slo: {e2e_ms: {p99: 100}}}}\n")
    cap = run(path, base_url, tmp_path / "run")["capacity"]
    assert cap["max_meeting_slo"] == 4
    assert cap["limiting_slo"] == ["e2e_ms.p99"]
