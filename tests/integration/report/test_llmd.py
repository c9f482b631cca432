"""``loadgen report RUN --format llmd``: llm-d's Benchmark Report v0.2.1, one per measured cell,
valid against the JSON Schema llm-d-benchmark publishes (tests/data/llmd, with its source and
licence), for a sweep, a capacity search and a multi-turn run; its figures are the run's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import orjson
from typer.testing import CliRunner

from loadgen.cli import app
from tests.conftest import StartSim

DATA = Path(__file__).resolve().parents[2] / "data"
SCHEMA = json.loads((DATA / "llmd" / "br_v0_2_1_json_schema.json").read_text())


def reports(run_dir: Path) -> list[dict]:
    result = CliRunner().invoke(app, ["report", str(run_dir), "--format", "llmd"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for report in out:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(report)]
        assert errors == [], errors[:5]
    return out


def test_a_sweep_a_search_and_a_multi_turn_run_give_valid_reports(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=2, max_seqs=8, itl_per_seq_us=500)
    runs = {
        "sweep": "workload: {num_prompts: 12, input_tokens: [16, 32], output_tokens: 8}\n"
                 "load: {concurrency: [1, 4], warmup_requests: 0}\n",
        "search": "workload: {num_prompts: 24, input_tokens: 16, output_tokens: 8}\n"
                  "load: {warmup_requests: 0, search: {by: concurrency, min: 2, max: 16, "
                  "slo: {ttft_ms: {p99: 200}}}}\n",
    }
    for name, body in runs.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\n{body}")
        result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    sweep = reports(tmp_path / "sweep")
    summary = orjson.loads((tmp_path / "sweep" / "summary.json").read_bytes())
    assert len(sweep) == len(summary["cells"]) == 4
    for report, cell in zip(sweep, summary["cells"], strict=True):
        agg = report["results"]["request_performance"]["aggregate"]
        assert agg["requests"]["total"] == cell["metrics"]["requests"] == 12
        assert agg["latency"]["time_to_first_token"]["mean"] == cell["metrics"]["ttft_s"]["mean"]
        assert agg["latency"]["time_to_first_token"]["units"] == "s"
        assert agg["throughput"]["output_token_rate"]["mean"] == cell["metrics"]["output_throughput"]
        load = report["scenario"]["load"]["standardized"]
        assert (load["input_seq_len"]["value"], load["concurrency"]) == (cell["params"]["input_tokens"],
                                                                         cell["params"]["concurrency"])
        assert load["tool"] == "loadgen"
    search = reports(tmp_path / "search")
    probes = orjson.loads((tmp_path / "search" / "summary.json").read_bytes())["capacity"]["probes"]
    assert [r["scenario"]["load"]["standardized"]["concurrency"] for r in search] == [p["value"] for p in probes]
    # a multi-turn run kept from an earlier version: its sessions are said
    shutil.copytree(DATA / "rundir-v2", tmp_path / "turns")
    turns = reports(tmp_path / "turns")
    assert turns
    assert turns[0]["scenario"]["load"]["standardized"]["multi_turn"]["enabled"] is True
