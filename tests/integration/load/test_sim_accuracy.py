"""Measured figures against the simulator's configured truth, at concurrency 1 and 64."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadgen.load.connection import STARVE_ENV
from loadgen.load.run import execute
from loadgen.results.records import read_records
from loadgen.scenario.loader import parse_scenario
from tests.conftest import CpuHog, StartSim
from tests.helpers.simtruth import mean_lateness, sim_metrics

pytestmark = pytest.mark.timing

TTFT_S, ITL_S = 0.050, 0.010


def scenario(base_url: str, concurrency: int, prompts: int, output: int, **extra: object) -> dict[str, object]:
    data: dict[str, object] = {
        "name": "accuracy",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": prompts, "input_tokens": 64, "output_tokens": output},
        "load": {"concurrency": concurrency, "warmup_requests": 2},
    }
    data.update(extra)
    return data


def accuracy(m: dict[str, Any], client: dict[str, Any], sim: dict[str, float]) -> dict[str, tuple[float, float]]:
    """Each figure's error against the simulator's configured truth, with its bound: the client's
    own allowance plus this machine's noise at the time. The noise is what the simulator says of
    its own clock (its chunks' mean lateness: a busy server core delays its timers, and the
    requests it takes in, by several times that) and, when the client's self-check names other
    programs on the client's core, the event-loop lag they caused. A client that is slow by its
    own fault gets no allowance: its self-check names no other program. And where a crowded
    client's reads carried several tokens (over 1% of its reads, which its self-check tells the
    user), a gap may read one ITL long: such tokens share one time on any clock (a slow CI
    machine with a busy program on the client's core read ITL p99 10 ms over)."""
    lateness = mean_lateness(sim)
    crowded = client["loop_lag_ms"]["p99"] / 1e3 if client["hogs"] else 0.0
    merged = ITL_S if client["hogs"] and client["reads"] and client["coalesced_reads"] / client["reads"] > 0.01 else 0.0
    return {
        "ttft p50": (abs(m["ttft_s"]["p50"] - TTFT_S), 0.003 + 6 * lateness + crowded),
        "itl p50": (abs(m["itl_s"]["p50"] - ITL_S), 0.001 + lateness),
        "itl p99": (max(0.0, m["itl_s"]["p99"] - ITL_S), 0.005 + 2 * lateness + crowded + merged),
    }


@pytest.mark.parametrize(
    ("concurrency", "prompts", "output", "hog"),
    [(1, 12, 16, None), (64, 128, 64, None), (64, 128, 64, "server"), (64, 128, 64, "client")],
    ids=["c1", "c64", "c64-cpu-hog-on-the-server-core", "c64-cpu-hog-on-the-client-core"],
)
def test_figures_match_the_configured_truth(
    start_sim: StartSim, cpu_hog: CpuHog, tmp_path: Path, concurrency: int, prompts: int, output: int,
    hog: str | None,
) -> None:
    if hog is not None:
        cpu_hog(hog)
    base_url = start_sim(ttft_ms=TTFT_S * 1e3, itl_ms=ITL_S * 1e3)
    sc = parse_scenario(scenario(base_url, concurrency, prompts, output))
    result = execute(sc, tmp_path / "run")
    cell = result.summary.to_dict()["cells"][0]
    m = cell["metrics"]
    sim = sim_metrics(base_url)

    assert m["completed"] == prompts
    assert m["failed"] == 0
    errors = accuracy(m, cell["client"], sim)
    health = {k: cell["client"][k] for k in ("verdict", "hogs", "reads", "coalesced_reads", "loop_lag_ms")}
    assert all(error <= bound for error, bound in errors.values()), (errors, health)
    assert m["output_tokens_total"] == prompts * output
    assert m["prompt_tokens_total"] == prompts * 64
    assert m["prompt_tokens_mismatched"] == 0
    assert m["output_tokens_short"] == 0
    assert m["token_count_source"] == "usage"
    # each slot runs requests back to back: ttft + (output - 1) * itl apiece
    implied_qps = concurrency / (TTFT_S + (output - 1) * ITL_S)
    assert m["request_throughput"] == pytest.approx(implied_qps, rel=0.05)

    # the simulator's own count: every request reached it, with the 2 calibration probes of the
    # text prompts and the 2 warmups (the connections' GET /models are not completions)
    assert sim["loadgen_sim_requests_completed_total"] == prompts + 4
    # and no request was answered from a cache another request of ours filled
    assert sim["loadgen_sim_prefix_cache_queries_total"] > 0
    assert sim["loadgen_sim_prefix_cache_hits_total"] == 0
    assert result.summary.cells[0].server_prefix_cache_hit_rate == 0.0
    # the simulator kept its schedule well enough to be the reference (a few ms at worst on a
    # busy machine), and never sent a chunk early
    assert mean_lateness(sim) < 0.005
    assert sim["loadgen_sim_chunk_lateness_seconds_min"] >= 0
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert len(records) == prompts + 4
    assert sum(r.warmup for r in records) == 4
    assert sorted(r.request_id for r in records if r.request_id < 0) == [-2, -1]  # the probes


@pytest.mark.alone
def test_the_bounds_catch_a_client_that_falls_behind(
    start_sim: StartSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same check against a client slowed on purpose (half a millisecond of work per read,
    what a regression in its parsing would cost): the bounds that hold on a busy machine fail it."""
    monkeypatch.setenv(STARVE_ENV, "0.5")
    base_url = start_sim(ttft_ms=TTFT_S * 1e3, itl_ms=ITL_S * 1e3)
    result = execute(parse_scenario(scenario(base_url, 64, 128, 64)), tmp_path / "run")
    cell = result.summary.to_dict()["cells"][0]
    assert cell["client"]["hogs"] == []  # nothing else to blame: the client itself is slow
    errors = accuracy(cell["metrics"], cell["client"], sim_metrics(base_url))
    assert any(error > bound for error, bound in errors.values()), errors


def test_open_loop_constant_rate_sends_on_schedule(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    data = scenario(base_url, 64, 40, 8)
    data["load"] = {"concurrency": 64, "rate": 20, "arrival": "constant", "warmup_requests": 0}
    result = execute(parse_scenario(data), tmp_path / "run")
    m = result.summary.to_dict()["cells"][0]["metrics"]
    records = sorted((r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup), key=lambda r: r.request_id)
    starts = [r.scheduled_at - records[0].scheduled_at for r in records]
    assert starts == pytest.approx([i / 20 for i in range(40)], abs=1e-6)
    # 40 requests, 1/20 s apart, each 20 ms + 7 * 5 ms long: window 39/20 + 0.055 s
    assert m["request_throughput"] == pytest.approx(40 / (39 / 20 + 0.055), rel=0.05)
    assert m["send_lag_s"]["p50"] < 0.005
    # within 5 ms and the simulator's own mean lateness at the time, thrice (25.1 ms once, when
    # the suite's other workers shared the 2 cores)
    sim = sim_metrics(base_url)
    late = mean_lateness(sim)
    assert abs(m["ttft_from_schedule_s"]["p50"] - 0.020) < 0.005 + 3 * late


# alone: its TTFT is held to 3 ms; beside other tests, with the reader under AddressSanitizer or in
# Python (.ci/reader), it read 4.9 and 6.6 ms off in one CI run
@pytest.mark.alone
def test_chat_prompts_calibrated_to_exact_length_and_role_delta_not_a_token(
    start_sim: StartSim, tmp_path: Path
) -> None:
    base_url = start_sim(ttft_ms=30, itl_ms=5)
    data = scenario(base_url, 4, 8, 16)
    data["target"] = {"base_url": base_url, "api": "chat"}
    result = execute(parse_scenario(data), tmp_path / "run")
    m = result.summary.to_dict()["cells"][0]["metrics"]
    assert m["completed"] == 8
    assert m["prompt_tokens_checked"] == 8
    assert m["prompt_tokens_mismatched"] == 0
    assert m["output_tokens_total"] == 8 * 16
    # the role-only first delta arrives at once; counting it would put TTFT near 0
    # within 3 ms and the simulator's own mean lateness on this machine at the time, thrice
    sim = sim_metrics(base_url)
    late = mean_lateness(sim)
    assert abs(m["ttft_s"]["p50"] - 0.030) < 0.003 + 3 * late
    assert m["chunk_token_discrepancy"] == {"requests": 0, "tokens": 0}


@pytest.mark.alone
def test_multi_token_chunks_counted_from_per_chunk_usage(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=30, itl_ms=5, tokens_per_chunk=3)
    result = execute(parse_scenario(scenario(base_url, 2, 6, 10)), tmp_path / "run")
    m = result.summary.to_dict()["cells"][0]["metrics"]
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup]
    # 10 tokens in chunks of 3, 3, 3, 1
    assert all(r.chunk_tokens == (3, 3, 3, 1) for r in records)
    # the chunk of tokens 1-3 ends at token 3: TTFT = 30 + 2 * 5 ms
    assert abs(m["ttft_s"]["p50"] - 0.040) < 0.003
    # gaps of 15 ms over 3 tokens and 5 ms over 1 token: 5 ms per token either way
    assert abs(m["itl_s"]["p50"] - 0.005) < 0.001
    assert m["chunk_token_discrepancy"]["tokens"] == 0


def test_without_per_chunk_usage_each_chunk_counts_one_token(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=10, itl_ms=2, tokens_per_chunk=2)
    data = scenario(base_url, 2, 4, 8)
    data["target"] = {"base_url": base_url, "continuous_usage_stats": False}
    m = execute(parse_scenario(data), tmp_path / "run").summary.to_dict()["cells"][0]["metrics"]
    # totals still come from the final usage chunk; per-chunk counting saw 4 chunks, not 8 tokens
    assert m["output_tokens_total"] == 4 * 8
    assert m["token_count_source"] == "usage"
    assert m["chunk_token_discrepancy"] == {"requests": 4, "tokens": 4 * 4}


def test_duration_caps_dispatch_and_reuses_prompts(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    data = scenario(base_url, 8, 3, 4)
    data["load"] = {"concurrency": 8, "rate": 10, "arrival": "constant", "duration_s": 1.0, "warmup_requests": 0}
    m = execute(parse_scenario(data), tmp_path / "run").summary.to_dict()["cells"][0]["metrics"]
    # offsets 0, 0.1, ..., 0.9 fall inside the 1 s window; the 3 prompts are cycled
    assert m["requests"] == 10
    assert m["completed"] == 10


def test_first_token_timeout_is_recorded_not_raised(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=300, itl_ms=1)
    data = scenario(base_url, 2, 4, 4)
    data["target"] = {"base_url": base_url, "timeouts": {"first_token_s": 0.1}}
    data["load"] = {"concurrency": 2, "warmup_requests": 0}
    m = execute(parse_scenario(data), tmp_path / "run").summary.to_dict()["cells"][0]["metrics"]
    assert m["failures_by_class"] == {"timeout": 4}
    assert m["completed"] == 0
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup]  # calibration probes aside
    assert [r.error_detail for r in records] == ["first token"] * 4
