"""Lengths and times past any real run are refused where they are read, in one line naming the
file and row, instead of a body of gigabytes, an overflow, or a run that waits for decades."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import MAX_TOKENS, Lengths
from loadgen.workload.lengths import draw, read_histogram
from loadgen.workload.trace import read_trace


def test_a_histogram_length_past_ten_million_tokens_names_its_row(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("length,weight\n128,1\n100000000000,1\n")
    with pytest.raises(ScenarioError, match=r"lengths.csv:3: length must be 1 to 10,000,000 and weight >= 0"):
        read_histogram(path)


def test_a_trace_of_decades_or_of_huge_lengths_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    year_ms = 365 * 86400 * 1000
    path.write_text('{"timestamp": 0, "input_length": 8, "output_length": 2}\n'
                    f'{{"timestamp": {54 * year_ms}, "input_length": 8, "output_length": 2}}\n')
    with pytest.raises(ScenarioError, match=r"the trace spans 19,710 days at speedup 1, past a run's 116; raise "
                                             r"trace\.speedup"):
        read_trace(path)
    assert read_trace(path, speedup=1e4)[-1].offset_s == pytest.approx(54 * year_ms / 1e7)  # 54 years at 10^4 x
    path.write_text('{"timestamp": 0, "input_length": 300000000, "output_length": 2}\n')
    with pytest.raises(ScenarioError, match=r"trace.jsonl:1: input_length must be an integer from 1 to 10,000,000"):
        read_trace(path)


@pytest.mark.parametrize("dist", [Lengths(kind="lognormal", sigma=1000), Lengths(kind="normal", stdev=1e300)])
def test_spreads_without_bound_draw_within_ten_million_tokens(dist: Lengths) -> None:
    rng = np.random.default_rng(1)
    drawn = [draw(dist, 1000, rng) for _ in range(200)]  # exp(1000) overflowed; a huge stdev drew +-inf
    assert all(1 <= n <= MAX_TOKENS for n in drawn)
    assert MAX_TOKENS in drawn
