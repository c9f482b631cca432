"""vLLM's result figures that loadgen counts differently from vLLM 0.32, by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadgen.results.records import RequestRecord
from loadgen.results.vllm_result import vllm_result


def rec(i: int, sent: float, done: float) -> RequestRecord:
    return RequestRecord(
        request_id=i, cell=0, warmup=False, scheduled_at=sent, sent_at=sent, first_token_at=sent + 0.01,
        last_token_at=done, done_at=done, input_tokens=8, max_tokens=2, prompt_tokens=8, output_tokens=2,
        token_count_source="usage", chunk_tokens_total=2, chunk_offsets_s=(0.01, done - sent), chunk_tokens=(1, 1),
    )


def test_the_peak_is_requests_at_one_instant_not_per_second() -> None:
    # two at a time, back to back: 0.0-0.3 and 0.0-0.3, then 0.3-0.6 twice, then 0.6-0.9 twice;
    # all six run at some time within the first second, but never more than two at once
    records = [rec(2 * k + j, 0.3 * k, 0.3 * (k + 1)) for k in range(3) for j in range(2)]
    out = vllm_result(records, percentile_metrics=["ttft"], percentiles=[99.0], goodput=None, max_concurrency=2,
                      detailed=False)
    assert out["max_concurrent_requests"] == 2
    assert out["peak_concurrent_per_second"] == 6  # what vllm bench serve 0.32 prints


def test_queue_inclusive_latency_needs_a_rate_and_a_cap() -> None:
    # the second request was due at 0.1 and waited 0.4 s for the only slot
    records = [rec(0, 0.0, 0.5), replace(rec(1, 0.5, 1.0), scheduled_at=0.1, slot_wait_s=0.4)]
    metrics = ["e2el", "client_queue_time", "e2el_including_client_queue"]
    paced = vllm_result(records, percentile_metrics=metrics, percentiles=[50.0], goodput=None, max_concurrency=1,
                        detailed=False, request_rate=10.0)
    assert paced["mean_e2el_ms"] == pytest.approx(500.0)
    assert paced["mean_client_queue_time_ms"] == pytest.approx(200.0)
    assert paced["mean_e2el_including_client_queue_ms"] == pytest.approx(700.0)
    unpaced = vllm_result(records, percentile_metrics=metrics, percentiles=[50.0], goodput=None, max_concurrency=1,
                          detailed=False)
    assert "mean_e2el_including_client_queue_ms" not in unpaced  # vLLM leaves it out at rate inf
