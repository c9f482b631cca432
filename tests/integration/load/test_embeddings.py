"""``target.api: embeddings`` against the simulator, whose answer takes --ttft-ms plus
--embedding-per-token-us for each input token: latency, requests/s, input tokens/s and
embeddings/s by hand, and a capacity search on E2E latency."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.results.records import read_records
from tests.conftest import StartSim
from tests.helpers.rawserver import MODELS_ANSWER, RawServer, is_models
from tests.helpers.simtruth import sim_metrics


def run(path: Path, base_url: str, out: Path) -> dict:
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return orjson.loads((out / "summary.json").read_bytes())


@pytest.mark.timing
def test_a_batch_of_8_at_a_known_cost_per_token(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=10, itl_ms=1, embedding_per_token_us=100)
    path = tmp_path / "emb.yaml"
    path.write_text("name: emb\ntarget: {api: embeddings}\nworkload: {num_prompts: 16, input_tokens: 64, batch_size: 8}\n"
                    "load: {concurrency: 2, warmup_requests: 0}\n")
    (cell,) = run(path, base_url, tmp_path / "run")["cells"]
    m = cell["metrics"]
    # 8 inputs of 64 tokens: 10 ms + 512 x 0.1 ms = 61.2 ms each, no first token; never early,
    # and late by at most 4 ms and the simulator's own latest answer (a busy CI machine's
    # timers woke 4.5 ms late at p50)
    assert m["completed"] == 16
    late = sim_metrics(base_url)["loadgen_sim_chunk_lateness_seconds_max"]
    assert 0.0612 - 0.001 <= m["e2e_s"]["p50"] <= 0.0612 + 0.004 + late
    assert m["ttft_s"]["p50"] is None
    # two at a time: 2 / 61.2 ms requests/s (on a busy machine, 2 over the answers' measured mean
    # time, a few of them late), each 8 vectors and 512 input tokens
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r.request_id >= 0]
    taken = [r.done_at - r.sent_at for r in records if r.done_at is not None and r.sent_at is not None]
    assert m["request_throughput"] == pytest.approx(2 / max(0.0612, sum(taken) / len(taken)), rel=0.08)
    assert m["embeddings_per_s"] == pytest.approx(8 * m["request_throughput"])
    assert m["total_token_throughput"] == pytest.approx(512 * m["request_throughput"])
    assert {(r.embeddings, r.prompt_tokens, r.input_tokens) for r in records} == {(8, 512, 512)}
    # the two probes that calibrate the text (16 and 48 words, a token each on the simulator) are
    # embeddings requests of one input, answered as such
    probes = sorted((r for r in read_records(tmp_path / "run" / "records.jsonl") if r.request_id < 0),
                    key=lambda r: -r.request_id)
    assert [(r.ok, r.embeddings, r.prompt_tokens) for r in probes] == [(True, 1, 16), (True, 1, 48)]


@pytest.mark.timing
@pytest.mark.alone
def test_a_capacity_search_on_e2e_latency(start_sim: StartSim, tmp_path: Path) -> None:
    # 4 served at once: a fifth waits a whole answer (about 2 x 61 ms) and breaks 100 ms
    base_url = start_sim(ttft_ms=10, itl_ms=1, embedding_per_token_us=100, max_seqs=4)
    path = tmp_path / "cap.yaml"
    path.write_text("name: cap\ntarget: {api: embeddings}\nworkload: {num_prompts: 48, input_tokens: 64, batch_size: 8}\n"
                    "load: {warmup_requests: 0, search: {by: concurrency, min: 2, max: 8, slo: {e2e_ms: {p99: 100}}}}\n")
    cap = run(path, base_url, tmp_path / "run")["capacity"]
    assert cap["max_meeting_slo"] == 4
    assert cap["limiting_slo"] == ["e2e_ms.p99"]


class WrongVectors(RawServer):
    """Answers every embeddings request of 4 inputs with what a broken server might send: one
    vector, items without one, or a negative token count."""

    def __init__(self, answer: dict) -> None:
        self.answer = json.dumps(answer).encode()
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        while (head := conn.recv(65536)):
            if is_models(head):
                conn.sendall(MODELS_ANSWER)
                continue
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(self.answer), self.answer))


@pytest.mark.parametrize(("answer", "error", "detail"), [
    ({"data": [{"embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 32}},
     "malformed", "the embeddings answer holds 1 vectors for 4 inputs"),
    ({"data": [{"index": i} for i in range(4)], "usage": {"prompt_tokens": 32}},
     "malformed", "an item of the embeddings answer has no embedding"),
    ({"data": [{"embedding": [0.1]} for _ in range(4)], "usage": {"prompt_tokens": -5}},
     "usage_invalid", "usage.prompt_tokens is -5, not a count of the inputs' tokens"),
])
def test_an_embeddings_answer_that_does_not_answer_the_inputs_fails(
    tmp_path: Path, answer: dict, error: str, detail: str,
) -> None:
    server = WrongVectors(answer)
    path = tmp_path / "emb.yaml"
    path.write_text("name: emb\ntarget: {api: embeddings, model: m}\n"
                    "workload: {num_prompts: 3, input_tokens: 8, batch_size: 4, prompt: token-ids}\n"
                    "load: {warmup_requests: 0}\n")
    try:
        result = CliRunner().invoke(app, ["run", str(path), "--base-url", server.base_url, "--out", str(tmp_path / "r")])
    finally:
        server.close()
    assert result.exit_code == 3, result.output  # every request failed: the server cannot serve the scenario
    records = [r for r in read_records(tmp_path / "r" / "records.jsonl") if r.request_id >= 0]
    assert {(r.error, (r.error_detail or "")[:len(detail)]) for r in records} == {(error, detail)}
