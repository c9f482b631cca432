"""The client against the engine's own histograms, with figures computed by hand."""

from __future__ import annotations

import pytest

from loadgen.results.enginegap import engine_gaps, gap_warnings
from loadgen.results.metrics import summarize
from loadgen.results.records import RequestRecord
from loadgen.results.samples import HistogramSummary, ServerMetrics


def rec(i: int, ttft: float, done: float) -> RequestRecord:
    # 3 tokens one each: the first at ttft, then 10 ms apart
    offsets = (ttft, ttft + 0.010, ttft + 0.020)
    return RequestRecord(
        request_id=i, cell=0, warmup=False, scheduled_at=0.0, sent_at=0.0, first_token_at=ttft,
        last_token_at=ttft + 0.020, done_at=done, input_tokens=8, max_tokens=3, prompt_tokens=8, output_tokens=3,
        token_count_source="usage", chunk_tokens_total=3, chunk_offsets_s=offsets, chunk_tokens=(1, 1, 1),
    )


def server(ttft_ms: float, e2e_ms: float, count: int = 2) -> ServerMetrics:
    return ServerMetrics(scrapes=2, gauges={}, counters={}, histograms={
        "ttft_s": HistogramSummary(count, ttft_ms / 1e3, None, None, None),
        "e2e_s": HistogramSummary(count, e2e_ms / 1e3, None, None, None),
    })


def test_the_gap_is_the_clients_mean_minus_the_engines() -> None:
    metrics = summarize([rec(0, 0.030, 0.060), rec(1, 0.050, 0.080)])
    # client: TTFT mean 40 ms, E2E mean 70 ms; engine: 36 ms and 68 ms
    gaps = {g.metric: g for g in engine_gaps(metrics, server(36.0, 68.0))}
    assert set(gaps) == {"ttft", "e2e"}  # the engine exports no TPOT or ITL histogram here
    assert gaps["ttft"].gap_ms == pytest.approx(4.0)
    assert gaps["ttft"].gap_share == pytest.approx(4.0 / 36.0)
    assert gaps["e2e"].gap_ms == pytest.approx(2.0)
    assert (gaps["e2e"].client_count, gaps["e2e"].engine_count) == (2, 2)
    # 11% but 4 ms: the HTTP server's own work on a short TTFT, no warning
    assert gap_warnings(tuple(gaps.values()), 2) == []


def test_a_client_far_above_the_engine_is_warned_of_only_on_the_same_requests() -> None:
    metrics = summarize([rec(0, 0.030, 0.060), rec(1, 0.050, 0.080)])
    gaps = engine_gaps(metrics, server(20.0, 68.0))  # TTFT 40 ms against 20 ms: +20 ms, 100%
    (warning,) = gap_warnings(gaps, 2)
    assert warning.startswith("the client reads TTFT 100% above the engine's own figure (40.00 ms against 20.00 ms)")
    # the engine counted other requests too (another client): not the same requests, no verdict
    assert gap_warnings(engine_gaps(metrics, server(20.0, 68.0, count=5)), 2) == []
    assert engine_gaps(metrics, None) == ()


def test_a_ttft_gap_of_answers_that_called_tools_is_the_tool_parsers() -> None:
    """The same 20 ms gap where both answers called a tool: vLLM's parser holds the bytes until
    the function's name is read; the warning names it instead of the network or the client."""
    metrics = summarize([rec(0, 0.030, 0.060), rec(1, 0.050, 0.080)])
    gaps = engine_gaps(metrics, server(20.0, 68.0))
    (plain,) = gap_warnings(gaps, 2)
    (tools,) = gap_warnings(gaps, 2, tool_calls=2)
    assert "the network or the client adds that much" in plain
    assert tools == ("the client reads TTFT 100% above the engine's own figure (40.00 ms against 20.00 ms): the "
                     "engine's tool-call parser holds an answer's first bytes until it has read the function's "
                     "name, and the engine's own TTFT stops at its first token: the gap is the parser's wait, not "
                     "the network's or the client's")
