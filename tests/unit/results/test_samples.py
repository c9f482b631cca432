"""Prometheus parsing and per-cell server metrics against hand-computed values."""

from __future__ import annotations

import math

from loadgen.load.sampling import KNOWN
from loadgen.results.readings import GpuReading
from loadgen.results.samples import (
    Sample,
    histogram_quantile,
    parse_metrics,
    summarize_gpu,
    summarize_server_metrics,
)

PAGE = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {running}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m"}} {kv}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{model_name="m"}} {pre}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {b1}
vllm:time_to_first_token_seconds_bucket{{le="0.5",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {b2}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} {s}
vllm:time_to_first_token_seconds_count{{model_name="m"}} {b2}
"""


def test_parse_and_summarise_a_cell() -> None:
    a = parse_metrics(PAGE.format(running=0, kv=0.0, pre=2, b1=1, b2=1, s=0.05), KNOWN)
    b = parse_metrics(PAGE.format(running=4, kv=0.25, pre=5, b1=3, b2=5, s=1.25), KNOWN)
    assert a.gauges == {"running": 0.0, "kv_cache_usage": 0.0}
    assert b.counters["preemptions"] == 5.0
    typed = summarize_server_metrics([Sample(0, 0.0, a), Sample(0, 1.0, b)])
    assert typed is not None
    assert typed.gauges["running"].max == 4.0
    summary = typed.to_dict()  # as summary.json holds it
    assert summary["running"] == {"max": 4.0, "mean": 2.0}
    assert summary["preemptions"] == 3.0
    ttft = summary["ttft_s"]
    # 4 new requests: 2 in (0, 0.1], 2 in (0.1, 0.5]; mean (1.25 - 0.05) / 4 = 0.3
    assert ttft["count"] == 4
    assert math.isclose(ttft["mean"], 0.3)
    # median: rank 2 of 4 is the top of the first bucket
    assert math.isclose(ttft["p50"], 0.1)
    # p90: rank 3.6, 1.6 of the 2 in (0.1, 0.5] -> 0.1 + 0.4 * 0.8 = 0.42
    assert math.isclose(ttft["p90"], 0.42)


def test_histogram_quantile_in_the_open_bucket_is_its_lower_bound() -> None:
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0
    assert histogram_quantile(0.5, []) is None


def test_gpu_summary_peaks_per_gpu_and_in_total() -> None:
    gib = 1 << 30
    samples = [
        Sample(0, 0.0, GpuReading({"0": 2 * gib, "1": 1 * gib})),
        Sample(0, 0.2, GpuReading({"0": 1 * gib, "1": 3 * gib})),
    ]
    s = summarize_gpu(samples)
    assert s.peak_gib_per_gpu == {"0": 2.0, "1": 3.0}
    assert s.peak_gib_total == 4.0  # the peak of the sum, not the sum of the peaks
    assert summarize_gpu([], reason="the engine runs on CPU").to_dict() == {
        "available": False, "reason": "the engine runs on CPU",
    }


def test_reading_only_known_families_agrees_with_prometheus_own_parser() -> None:
    """A real page of vLLM 0.32 (CPU build, after 36 requests): the fast reader loadgen runs on
    its event loop gives what prometheus_client's parser gives for every family it reports."""
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    text = (Path(__file__).resolve().parents[2] / "data" / "vllm-0.32-metrics.txt").read_text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_bucket"):
                samples[s.name] = samples.get(s.name, 0.0) + s.value
    got = parse_metrics(text, KNOWN)
    assert got.counters["prefix_cache_queries"] == samples["vllm:prefix_cache_queries_total"] == 18496
    assert got.counters["prefix_cache_hits"] == samples["vllm:prefix_cache_hits_total"] == 0
    assert got.counters["prompt_tokens"] == samples["vllm:prompt_tokens_total"]
    assert got.gauges["kv_cache_usage"] == samples["vllm:kv_cache_usage_perc"]
    ttft = got.histograms["ttft_s"]
    assert ttft.count == samples["vllm:time_to_first_token_seconds_count"] == 38
    assert ttft.sum == samples["vllm:time_to_first_token_seconds_sum"]
    assert ttft.buckets[-1] == (float("inf"), 38.0)
