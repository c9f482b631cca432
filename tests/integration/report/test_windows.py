"""A staged ramp on the simulator, cut into one-second windows: the windows show the ramp, the
steady state begins where the ramp ends, and its TTFT is the simulator's."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from tests.conftest import StartSim
from tests.helpers.simtruth import mean_lateness, sim_metrics

pytestmark = pytest.mark.timing


def test_windows_reproduce_a_ramp_and_the_steady_state_starts_at_its_end(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=50, itl_ms=5)
    path = tmp_path / "ramp.yaml"
    path.write_text(
        "name: ramp\nworkload: {num_prompts: 1500, input_tokens: 16, output_tokens: 8}\n"
        "load: {warmup_requests: 0, stages: [{duration_s: 2, concurrency: 2}, {duration_s: 2, concurrency: 4},\n"
        "  {duration_s: 5, concurrency: 8}]}\nreport: {window_s: 1}\n"
    )
    result = CliRunner().invoke(app, ["run", str(path), "--base-url", base_url, "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    m = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())["cells"][0]["metrics"]
    windows = m["windows"]
    # the ramp as it was set: 2, then 4, then 8 in flight (the windows count from the first send,
    # the stages from the schedule's start: a window at a stage's edge may hold some of both)
    flight = [w["in_flight"] for w in windows]
    assert flight[0] == pytest.approx(2, abs=0.3)
    assert flight[2] == pytest.approx(4, abs=0.5)
    assert flight[5:8] == pytest.approx([8] * 3, abs=0.6)
    assert all(a <= b + 0.6 for a, b in zip(flight[:6], flight[1:7], strict=True)), flight
    # throughput follows: a request takes 50 + 7 x 5 = 85 ms (as measured: a busy machine makes the
    # simulator's chunks late), so c streams give c x 8 / 0.085 tok/s
    assert m["e2e_s"]["p50"] == pytest.approx(0.085, abs=0.015)
    for w, c in ((windows[0], 2), (windows[2], 4), (windows[5], 8)):
        assert w["output_tokens_per_s"] == pytest.approx(c * 8 / m["e2e_s"]["p50"], rel=0.12)
    ss = m["steady_state"]
    assert abs(ss["start_s"] - 4.0) <= 1.0  # within one window of the ramp's end
    assert ss["end_s"] >= 8.0
    # within 2 ms and the simulator's own mean lateness, thrice (53 ms once, beside another run of
    # the suite on the same 2 cores)
    sim = sim_metrics(base_url)
    late = mean_lateness(sim)
    assert abs(ss["ttft_s"]["p50"] - 0.050) < 0.002 + 3 * late
    assert ss["mean_in_flight"] == pytest.approx(8, abs=0.6)
    # said on the console and re-derived by loadgen report
    assert "steady state " in result.output
    report = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "--format", "md"])
    assert f"steady state {ss['start_s']:g} to {ss['end_s']:g} s" in report.output
