"""The load as it ran: a closed loop with fewer requests than its concurrency is labelled,
warned about and charted by the most requests it had in flight, not by what was set."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from loadgen.cli import app
from tests.conftest import StartSim


def test_a_32_prompt_cell_at_concurrency_64_ran_32_and_says_so(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    path = tmp_path / "short.yaml"
    path.write_text(
        "name: short\n"
        "workload: {num_prompts: 32, input_tokens: 16, output_tokens: 8}\n"
        "load: {concurrency: [16, 64], warmup_requests: 0}\n"
    )
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / "run")],
                                env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    cells = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())["cells"]
    # 32 requests, all sent at once by either loop: 16 at most in the first, all 32 in the second
    assert [c["metrics"]["peak_in_flight"] for c in cells] == [16, 32]
    assert not any("was set" in w for w in cells[0].get("warnings", []))
    assert any("concurrency 64 was set, but at most 32 requests were in flight (the cell had 32 requests)" in w
               for w in cells[1]["warnings"])
    # the label says what ran, in the console and in the report
    text = " ".join(result.output.split())
    assert "closed loop of 32 (64 set)" in text
    report = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--format", "md"])
    assert "closed loop of 32 (64 set)" in report.output
    assert "closed loop of 64" not in report.output.replace("(64 set)", "")
