"""Tool calls: ``workload.tools`` sent with chat requests; the simulator answers each with a call
of the function (its name, then JSON arguments meeting the parameters' schema), and loadgen
counts the call's tokens as output and its first token as the first token."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.results.records import read_records
from tests.conftest import StartSim
from tests.helpers.simtruth import sim_metrics

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}]


@pytest.mark.timing
@pytest.mark.alone
def test_a_tool_calls_first_token_and_tokens_by_hand(start_sim: StartSim, tmp_path: Path) -> None:
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    path = tmp_path / "tools.yaml"
    path.write_text("name: tools\ntarget: {api: chat}\n"
                    "workload: {num_prompts: 8, input_tokens: 16, output_tokens: 10, tools: {file: tools.json}}\n"
                    "load: {concurrency: 2, warmup_requests: 0}\n")
    base_url = start_sim(ttft_ms=40, itl_ms=5)
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r.request_id >= 0]
    late = sim_metrics(base_url)["loadgen_sim_chunk_lateness_seconds_max"]  # a busy machine's allowance
    for r in records:
        # the call's name is the first token, 40 ms after the send; its 10 tokens are the output
        assert r.first_tool_call_at == r.first_token_at
        assert r.ttft_s == pytest.approx(0.040, abs=0.005 + late)
        assert (r.tool_call_tokens, r.output_tokens, r.chunk_tokens_total) == (10, 10, 10)
    (cell,) = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())["cells"]
    calls = cell["metrics"]["tool_calls"]
    assert (calls["requests"], calls["tool_call_tokens_total"]) == (8, 80)
    assert calls["time_to_tool_call_s"]["p50"] == pytest.approx(0.040, abs=0.005 + late)
    assert "tool calls 8 (80 tokens" in " ".join(result.output.split())


def test_tools_no_answer_called_are_said(start_sim: StartSim, tmp_path: Path) -> None:
    """tool_choice none: the simulator answers text, as vLLM does; the cell says that none of its
    8 answers called a tool, instead of saying nothing of tools."""
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    path = tmp_path / "tools.yaml"
    path.write_text("name: tools\ntarget: {api: chat}\n"
                    "workload: {num_prompts: 8, input_tokens: 16, output_tokens: 10, "
                    "tools: {file: tools.json, choice: none}}\nload: {concurrency: 2, warmup_requests: 0}\n")
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    (cell,) = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())["cells"]
    assert cell["metrics"]["completed"] == 8
    assert cell["metrics"]["tool_calls"]["requests"] == 0
    assert "tool calls 0: no answer called a tool" in " ".join(result.output.split())


def test_tools_need_chat_and_a_real_definition(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text('[{"type": "function"}]')
    for body, needle in (
        ("target: {api: completions}\nworkload: {tools: {file: bad.json}}\n",
         "workload.tools are sent with chat requests: set target.api: chat"),
        ("target: {api: chat, base_url: 'http://127.0.0.1:9'}\nworkload: {tools: {file: bad.json}}\n",
         "bad.json: entry 1 is not {type: function, function: {name: ..., parameters: ...}}"),
        ("target: {api: chat}\nworkload: {tools: {file: nope.json}}\n", "workload.tools.file -> no such file"),
    ):
        path = tmp_path / "s.yaml"
        path.write_text(body)
        result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
        assert result.exit_code == 2, result.output
        assert needle in " ".join(result.output.split()), result.output
