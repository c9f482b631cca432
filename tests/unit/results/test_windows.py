"""A cell over time, by hand: its windows and the steady-state rule."""

from __future__ import annotations

import pytest

from loadgen.results.windows import MAX_WINDOWS, steady_run, steady_state, time_windows, window_width
from tests.helpers.records import rec

# r0 sent at 0, tokens at 0.1, 0.3, 0.6, done at 1; r1 sent at 1, tokens at 1.2 and 2.2 (two),
# done at 3; r2 sent at 1.5, a token at 1.6, done at 3; r3 sent at 2, a token at 2.5, done at 3
RECORDS = [
    rec(0, 0.0, (0.1, 0.3, 0.6), (1, 1, 1), 1.0), rec(1, 1.0, (0.2, 1.2), (1, 2), 3.0),
    rec(2, 1.5, (0.1,), (1,), 3.0), rec(3, 2.0, (0.5,), (1,), 3.0),
]


def test_windows_by_hand() -> None:
    w = time_windows(RECORDS, 1.0)
    assert [(x.start_s, x.end_s) for x in w] == [(0, 1), (1, 2), (2, 3)]
    assert [x.started for x in w] == [1, 2, 1]
    # r0 ends at 1.0: in the second window; the last window holds its end (r1, r2, r3 at 3.0)
    assert [x.completed for x in w] == [0, 1, 3]
    # time-weighted: r0 over [0, 1); r1 over [1, 2) and r2 over [1.5, 2); r1, r2, r3 over [2, 3]
    assert [x.in_flight for x in w] == [1.0, 1.5, 3.0]
    # TTFT of the requests sent in each: 0.1; 0.2 and 0.1; 0.5
    assert [x.ttft_p50_s for x in w] == pytest.approx([0.1, 0.15, 0.5])
    # gaps at their later token: 0.2 (at 0.3) and 0.3 (at 0.6); none; 1.0 over 2 tokens (at 2.2)
    assert w[0].itl_p50_s == pytest.approx(0.25)
    assert w[1].itl_p50_s is None
    assert w[2].itl_p50_s == pytest.approx(0.5)
    # tokens arrived: 3; 1 + 1; 2 + 1
    assert [x.output_tokens_per_s for x in w] == [3.0, 2.0, 3.0]


def test_a_window_too_short_for_the_span_is_widened_to_ten_thousand_of_it() -> None:
    """A microsecond over these 3 s would be 3 million windows, each without a request: 10,000 of
    0.3 ms each instead, holding every request and token all the same."""
    assert window_width(RECORDS, 1e-6) == pytest.approx(3.0 / MAX_WINDOWS)
    assert window_width(RECORDS, 1.0) == 1.0
    w = time_windows(RECORDS, 1e-6)
    assert len(w) == MAX_WINDOWS
    assert w[-1].end_s == pytest.approx(3.0)
    assert (sum(x.started for x in w), sum(x.completed for x in w)) == (4, 4)


def test_the_steady_run_by_the_rule() -> None:
    w = time_windows(RECORDS, 1.0)
    # in flight 1, 1.5, 3: the plateau is the median of those at least half of 3 (1.5 and 3):
    # 2.25; 10% of it is under one request, so one request either side: 1.5 and 3 are steady
    assert steady_run(w, 1.0) == (1, 3)
    ss = steady_state(RECORDS, w, 1.0, None, open_loop=False)
    assert ss is not None
    assert (ss.start_s, ss.end_s) == (1.0, 3.0)
    assert ss.metrics.requests == 3  # r1, r2 and r3 were sent in it
    # one window alone is no steady state, nor is a run without a second whole window
    assert steady_run(w[:1], 1.0) is None
    assert steady_run(time_windows(RECORDS, 2.0), 2.0) is None  # [0, 2) and a shorter [2, 3]
