"""Structured output: ``workload.response_format`` sent as each API asks for it, every answer
checked; the simulator answers JSON meeting the schema (valid_json 1.0), or plain text when it
ignores the format, as a server without structured output does (valid_json 0.0)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.results.records import read_records
from tests.conftest import StartSim

SCENARIO = """name: json
workload:
  num_prompts: 9
  input_tokens: 16
  output_tokens: 12
  response_format:
    type: json_schema
    schema: {type: object, properties: {city: {type: string}, population: {type: integer}},
             required: [city, population]}
load: {concurrency: 3, warmup_requests: 0}
"""


@pytest.mark.parametrize("api", ["chat", "completions", "responses"])
def test_valid_json_is_one_with_json_answers_and_zero_with_plain_text(
    start_sim: StartSim, tmp_path: Path, api: str,
) -> None:
    path = tmp_path / "json.yaml"
    path.write_text(SCENARIO)
    for structured, share in ((True, 1.0), (False, 0.0)):
        base_url = start_sim(ttft_ms=5, itl_ms=1, structured_output=structured)
        run = tmp_path / f"run-{structured}"
        result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--set", f"target.api={api}",
                                          "--out", str(run)])
        assert result.exit_code == 0, result.output
        (cell,) = orjson.loads((run / "summary.json").read_bytes())["cells"]
        assert cell["metrics"]["valid_json"] == share
        records = [r for r in read_records(run / "records.jsonl") if r.request_id >= 0]
        assert [r.valid_json for r in records] == [structured] * 9
        # the answer's length is the server's own: the 12 tokens the simulator gives, from its usage
        assert {r.output_tokens for r in records} == {12}
        assert f"valid JSON {share:.1%}" in result.output
