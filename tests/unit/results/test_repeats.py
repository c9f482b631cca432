"""Repeats by hand: means, Student's t intervals, CVs, the groups and the noisy flag."""

from __future__ import annotations

import math

import pytest

from loadgen.results.repeats import repeat_groups, repeated


def test_a_figure_over_three_and_over_five_repeats_by_hand() -> None:
    # 10, 12, 14: mean 12, s = 2, t(0.975, 2 df) = 4.303: half-width 4.303 x 2 / sqrt(3) = 4.969
    r = repeated([10.0, 12.0, 14.0])
    assert r.mean == 12.0
    assert r.half_width == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert r.cv == pytest.approx(2 / 12)
    # 10, 11, 12, 13, 14: s = sqrt(2.5), t(0.975, 4 df) = 2.776: half-width 2.776 x 1.581 / sqrt(5)
    # = 1.963, narrower with more repeats by both the smaller t and the larger sqrt(N)
    five = repeated([10.0, 11.0, 12.0, 13.0, 14.0])
    assert five.half_width == pytest.approx(2.776 * math.sqrt(2.5) / math.sqrt(5))
    assert five.half_width < r.half_width
    # one value: no interval
    assert repeated([5.0]).half_width is None


def test_groups_gather_a_cells_repeats_and_flag_the_noisy_figures() -> None:
    def cell(c: int, k: int) -> dict[str, object]:
        return {"input_tokens": 16, "concurrency": c, "repeat": k}

    cells = [
        (cell(2, 1), 1, {"tpot_s.p50": 0.010, "request_throughput": 10.0}),
        (cell(2, 2), 2, {"tpot_s.p50": 0.010, "request_throughput": 12.0}),
        (cell(4, 1), 3, {"tpot_s.p50": 0.020, "request_throughput": 20.0}),
        (cell(4, 2), 4, {"tpot_s.p50": 0.020, "request_throughput": 20.2}),
        ({"input_tokens": 16, "concurrency": 8}, 5, {"tpot_s.p50": 0.030}),  # not a repeat
        ({"input_tokens": 16, "concurrency": 16, "repeat": 1}, 6, {"tpot_s.p50": 0.040}),  # its only repeat
    ]
    groups = repeat_groups(cells, noisy_cv=0.05)
    assert [(g.params, g.cells) for g in groups] == [({"input_tokens": 16, "concurrency": 2}, (1, 2)),
                                                     ({"input_tokens": 16, "concurrency": 4}, (3, 4))]
    # 10 and 12 req/s: s = sqrt(2), CV 1.414 / 11 = 12.9% > 5%: noisy; 20 and 20.2: 0.7%
    assert groups[0].noisy == ("request_throughput",)
    assert groups[1].noisy == ()
    assert groups[0].figures["request_throughput"].half_width == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2))
    assert set(groups[0].figures) == {"tpot_s.p50", "request_throughput"}
