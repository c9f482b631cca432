from __future__ import annotations

import dataclasses
import math

import pytest

from loadgen.results.metrics import distribution, in_flight, itl_values, summarize
from loadgen.scenario.schema import Slo
from tests.helpers.records import rec


def test_distribution_against_hand_computed_values() -> None:
    d = distribution([1.0, 2.0, 3.0, 4.0]).to_dict()
    # linear interpolation: rank = p/100 * (n-1); p50 -> 1.5 -> 2.5, p90 -> 2.7 -> 3.7
    assert d["p50"] == pytest.approx(2.5)
    assert d["p90"] == pytest.approx(3.7)
    assert d["p95"] == pytest.approx(3.85)
    assert d["p99"] == pytest.approx(3.97)
    assert d["p99.9"] == pytest.approx(3.997)
    assert d["mean"] == pytest.approx(2.5)
    assert d["min"] == 1.0
    assert d["max"] == 4.0
    assert d["std"] == pytest.approx(math.sqrt(1.25))  # population std


def test_distribution_of_nothing_is_all_none() -> None:
    assert set(distribution([]).to_dict().values()) == {None}


def test_itl_divides_each_gap_by_the_tokens_of_the_later_chunk() -> None:
    r = rec(0, 0.0, (0.1, 0.12, 0.16, 0.19), (1, 1, 2, 3), 0.2)
    assert list(itl_values(r)) == pytest.approx([0.02, 0.02, 0.01])
    # tpot: (0.19 - 0.1) / (7 - 1); ttft 0.1 after the send at 0; e2e 0.2
    assert r.tpot_s == pytest.approx(0.015)
    assert (r.ttft_s, r.e2e_s) == (pytest.approx(0.1), pytest.approx(0.2))


def test_one_slo_check_per_request() -> None:
    r = rec(0, 0.0, (0.1, 0.12, 0.16, 0.19), (1, 1, 2, 3), 0.2)  # ttft 100 ms, tpot 15 ms, e2e 200 ms
    assert r.meets({})
    assert r.meets({"ttft_ms": 100, "tpot_ms": 15, "e2e_ms": 200})
    assert not r.meets({"ttft_ms": 99.9})
    assert not r.meets({"tpot_ms": 14.9})
    assert not r.meets({"e2e_ms": 199.9})
    unfinished = dataclasses.replace(r, done_at=None)
    assert not unfinished.meets({})


def test_summary_figures_by_hand() -> None:
    records = [
        rec(0, 0.0, (0.1, 0.2, 0.3), (1, 1, 1), 0.35),
        rec(1, 0.5, (0.2, 0.3), (1, 3), 1.0),
        rec(2, 0.6, (), (), 0.7, error="http_status", status=500, output_tokens=0, chunk_tokens_total=0),
        rec(3, 0.0, (0.05,), (1,), 0.1, warmup=True),
        rec(4, 0.7, (0.05,), (1,), None, error="cancelled", done_at=None),
    ]
    m = summarize(records, Slo(ttft_ms=150)).to_dict()
    assert m["requests"] == 4
    assert m["completed"] == 2
    assert m["failed"] == 1
    assert m["cancelled"] == 1
    assert m["failures_by_class"] == {"http_status": 1}
    # window: first sent 0.0 to last successful done 1.0
    assert m["duration_s"] == pytest.approx(1.0)
    assert m["request_throughput"] == pytest.approx(2.0)
    assert m["output_throughput"] == pytest.approx(7.0)
    assert m["total_token_throughput"] == pytest.approx(27.0)
    assert m["ttft_s"]["mean"] == pytest.approx(0.15)
    assert m["e2e_s"]["max"] == pytest.approx(0.5)
    # ITL pooled: 0.1, 0.1 from the first; 0.1 / 3 from the second
    assert m["itl_s"]["max"] == pytest.approx(0.1)
    assert m["itl_s"]["min"] == pytest.approx(0.1 / 3)
    # tpot: 0.2/2 and 0.1/3
    assert m["tpot_s"]["mean"] == pytest.approx((0.1 + 0.1 / 3) / 2)
    # only request 0 has TTFT <= 150 ms; goodput over the 1 s window
    assert m["goodput"] == pytest.approx(1.0)
    # of the 3 requests judged (the cancelled one neither met nor missed an objective), 1 met it
    assert m["slo_attained"] == pytest.approx(1 / 3)
    assert m["token_count_source"] == "usage"


def test_schedule_figures_only_for_open_loop_cells() -> None:
    # scheduled at 0 for both; the second waited 0.4 s for a free slot and was sent at 0.5
    records = [
        rec(0, 0.0, (0.1, 0.2), (1, 1), 0.3),
        rec(1, 0.5, (0.1, 0.2), (1, 1), 0.8, scheduled_at=0.0, slot_wait_s=0.4),
    ]
    closed = summarize(records, open_loop=False)
    assert closed.ttft_from_schedule_s.max is None
    assert closed.send_lag_s.max is None
    assert closed.ttft_s.mean == pytest.approx(0.1)
    opened = summarize(records)
    assert opened.ttft_from_schedule_s.max == pytest.approx(0.6)
    assert opened.send_lag_s.max == pytest.approx(0.1)


def test_prompt_drift_and_chunk_discrepancy_are_reported() -> None:
    records = [
        rec(0, 0.0, (0.1, 0.2), (1, 1), 0.3, prompt_tokens=12),
        rec(1, 0.0, (0.1, 0.2), (1, 1), 0.3, output_tokens=3, max_tokens=3),
    ]
    m = summarize(records).to_dict()
    assert m["prompt_tokens_mismatched"] == 1
    assert m["prompt_tokens_drift_mean"] == pytest.approx(1.0)
    assert m["chunk_token_discrepancy"] == {"requests": 1, "tokens": 1}
    assert "goodput" not in m


def test_requests_in_flight_by_hand() -> None:
    # sent at 0, 0, 1 and 3; ended at 2, 4, 2 and 4: two in flight over [0, 1), three over
    # [1, 2), one over [2, 3), two over [3, 4): peak 3, mean (2 + 3 + 1 + 2) / 4 = 2.0; a
    # request ending as another starts does not overlap it
    records = [rec(0, 0.0, (0.5,), (1,), 2.0), rec(1, 0.0, (0.5,), (1,), 4.0), rec(2, 1.0, (1.5,), (1,), 2.0),
               rec(3, 3.0, (3.5,), (1,), 4.0)]
    assert in_flight(records) == (3, 2.0)
    m = summarize(records)
    assert (m.peak_in_flight, m.mean_in_flight) == (3, 2.0)
    assert in_flight([rec(0, 0.0, (0.5,), (1,), 1.0), rec(1, 1.0, (1.5,), (1,), 2.0)]) == (1, 1.0)
    assert in_flight([]) == (0, None)


def test_answers_that_fail_the_schema_at_max_tokens_are_counted_as_cut() -> None:
    """4 structured answers: one valid, one invalid at 3 of its 3 tokens (cut), one invalid at 2 of
    3 (malformed), one invalid at 3 of 3: valid JSON 25%, 2 cut; the line says so."""
    from loadgen.report.summary import _throughput_line
    from loadgen.results.summary import CellSummary, ServerInfo

    records = [rec(i, 0.0, (0.01, 0.02, 0.03)[:n], (1,) * n, 0.05, valid_json=ok, max_tokens=3)
               for i, (n, ok) in enumerate(((3, True), (3, False), (2, False), (3, False)))]
    m = summarize(records)
    assert m.valid_json == 0.25
    assert m.json_cut == 2
    cell = CellSummary(0, {}, "done", None, "", ServerInfo(), m)
    assert "valid JSON 25.0% (2 answers cut at max_tokens: raise workload.output_tokens)" in _throughput_line(cell)
    assert summarize(records[:1]).json_cut == 0
