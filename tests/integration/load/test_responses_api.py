"""``target.api: responses`` against the simulator: the same timings give the same TTFT, ITL and
usage as the chat path, counted from the Responses API's own events."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.load.stream import NOT_RESPONSES
from loadgen.results.records import read_records
from tests.conftest import StartSim
from tests.helpers.rawserver import MODELS_ANSWER, RawServer, is_models
from tests.helpers.simtruth import mean_lateness, sim_metrics


@pytest.mark.timing
@pytest.mark.alone
def test_the_responses_api_measures_as_chat_does(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=30, itl_ms=5)
    path = tmp_path / "r.yaml"
    path.write_text("name: r\nworkload: {num_prompts: 16, input_tokens: 32, output_tokens: 16}\n"
                    "load: {concurrency: 2, warmup_requests: 0}\n")
    figures = {}
    for api in ("responses", "chat"):
        result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--set", f"target.api={api}",
                                          "--out", str(tmp_path / api)])
        assert result.exit_code == 0, result.output
        (cell,) = orjson.loads((tmp_path / api / "summary.json").read_bytes())["cells"]
        figures[api] = cell["metrics"]
        records = [r for r in read_records(tmp_path / api / "records.jsonl") if r.request_id >= 0]
        # usage from the stream's last event: the exact lengths, 16 deltas of one token each
        assert {(r.prompt_tokens, r.output_tokens, r.token_count_source) for r in records} == {(32, 16, "usage")}
        assert {len(r.chunk_offsets_s) for r in records} == {16}
    r, c = figures["responses"], figures["chat"]
    assert r["completed"] == c["completed"] == 16
    # the simulator's 30 ms to the first token and 5 ms between tokens, read alike on both paths,
    # within the simulator's own mean lateness on this machine at the time, thrice
    late = 3 * mean_lateness(sim_metrics(base_url))
    assert r["ttft_s"]["p50"] == pytest.approx(0.030, abs=0.003 + late)
    assert r["ttft_s"]["p50"] == pytest.approx(c["ttft_s"]["p50"], abs=0.002 + late)
    assert r["itl_s"]["p50"] == pytest.approx(0.005, abs=0.0005 + late)
    assert r["tpot_s"]["p50"] == pytest.approx(c["tpot_s"]["p50"], abs=0.0005)
    assert r["prompt_tokens_total"] == c["prompt_tokens_total"] == 16 * 32


class AnswersChatChunks(RawServer):
    """A ``/v1/responses`` that streams chat completions chunks, as a proxy routing every path to
    one chat endpoint would."""

    def serve(self, conn: socket.socket) -> None:
        while (head := conn.recv(65536)):
            if is_models(head):
                conn.sendall(MODELS_ANSWER)
                continue
            events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (
                {"choices": [{"index": 0, "delta": {"content": " a"}, "finish_reason": None}]},
                {"choices": [{"index": 0, "delta": {"content": " b"}, "finish_reason": "length"}]},
            )) + b"data: [DONE]\n\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(events), events))


def test_a_responses_endpoint_that_speaks_chat_is_refused_not_measured(tmp_path: Path) -> None:
    server = AnswersChatChunks()
    try:
        result = CliRunner().invoke(app, ["run", "--base-url", server.base_url, "--set", "target.api=responses",
                                          "--set", "target.model=m", "--num-prompts", "3", "--output-len", "2",
                                          "--out", str(tmp_path / "r")])
    finally:
        server.close()
    assert result.exit_code == 3, result.output  # every request failed: the server cannot serve the scenario
    records = [r for r in read_records(tmp_path / "r" / "records.jsonl") if r.request_id >= 0]
    assert {(r.error, r.error_detail) for r in records} == {("malformed", NOT_RESPONSES)}
