"""`loadgen serve` and `loadgen sim` take their options from the one declaration of each
(EngineOptions, SimOptions): every field is a flag with the field's help, and what a scenario's
serve.sim block says reaches the simulator unchanged through the command line."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.scenario.serve import EngineOptions, SimOptions, flag


def help_text(command: str) -> str:
    done = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"}, terminal_width=400)
    assert done.exit_code == 0, done.output
    return done.output


def test_every_engine_option_is_a_serve_flag() -> None:
    text = help_text("serve")
    for name, field in EngineOptions.model_fields.items():
        if name in ("model", "extra_args"):  # the argument, and what follows --
            continue
        assert flag(name) in text, name
        if name == "backend":  # its help lists the engines the registry declares
            assert "vllm | transformers | ctranslate2" in text
        elif name != "port":  # the command line's default port is 8000, a run's a free one
            assert str(field.description)[:30] in text, name


def test_every_sim_option_is_a_sim_flag() -> None:
    text = help_text("sim")
    for name, field in SimOptions.model_fields.items():
        assert flag(name) in text, name
        assert str(field.description)[:30] in text, name


def test_a_scenario_sim_block_reaches_the_simulator_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    given = SimOptions(
        ttft_ms=12.5, itl_ms=3, tokens_per_chunk=2, model="m", max_model_len=4096,
        faults={"http_503": 0.1, "stall": 0.05}, fault_seed=7, retry_after_s=2, stall_s=0.5, slow_ttft_ms=80,
        crash_after=9, reasoning_tokens=4, reject_params=("ignore_eos", "min_tokens"), max_seqs=8,
        itl_per_seq_us=250, prefill_per_token_us=30,
    )
    got: dict[str, Any] = {}

    def fake_serve(options: SimOptions, api_key: str | None, host: str, port: int) -> None:
        got.update(options=options, host=host, port=port)

    monkeypatch.setattr("loadgen.servers.sim.serve_sim", fake_serve)
    done = CliRunner().invoke(app, ["sim", "--port", "8123", *given.argv()])
    assert done.exit_code == 0, done.output
    assert got["options"] == given
    assert got["port"] == 8123
    # defaults are not written out: the simulator's own defaults are the declaration's
    assert SimOptions().argv() == []
