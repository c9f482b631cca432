from __future__ import annotations

import numpy as np
import pytest

from loadgen.load.schedule import Arrivals, concurrency_shares, iter_offsets, ramp_rate, vllm_offsets


def build_schedule(count: int, rate: float | None, **kw: object) -> np.ndarray:
    """The first ``count`` offsets of ``iter_offsets`` as an array."""
    it = iter_offsets(rate, **kw)  # type: ignore[arg-type]
    return np.fromiter((next(it) for _ in range(count)), dtype=np.float64, count=count)


def test_constant_rate_offsets_are_exact() -> None:
    assert build_schedule(5, 4.0, arrival="constant").tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_no_rate_offers_everything_at_once() -> None:
    assert build_schedule(3, None).tolist() == [0.0, 0.0, 0.0]


def test_poisson_offsets_for_a_fixed_seed() -> None:
    gaps = np.random.default_rng(7).exponential(0.5, 4096)[:3]
    expected = [0.0, gaps[0], gaps[0] + gaps[1], gaps[0] + gaps[1] + gaps[2]]
    assert build_schedule(4, 2.0, seed=7).tolist() == pytest.approx(expected)
    assert build_schedule(4, 2.0, seed=7).tolist() == build_schedule(4, 2.0, seed=7).tolist()
    assert build_schedule(4, 2.0, seed=8).tolist() != build_schedule(4, 2.0, seed=7).tolist()


def test_gamma_mean_gap_is_one_over_rate_and_stream_continues_across_blocks() -> None:
    offsets = build_schedule(10_000, 50.0, arrival="gamma", burstiness=0.5, seed=1)
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.05)
    assert np.all(gaps >= 0)


def test_concurrency_shares_add_up_to_the_total() -> None:
    assert concurrency_shares(3, 8) == [3, 3, 2]
    assert concurrency_shares(2, None) == [None, None]


def test_constant_offsets_are_exact_multiples_of_the_gap() -> None:
    import itertools

    from loadgen.load.schedule import iter_offsets

    offsets = list(itertools.islice(iter_offsets(10, arrival="constant"), 11))
    # the eleventh request is due exactly at 1 s, so a 1 s window excludes it
    assert offsets[10] == 1.0
    assert offsets == [i / 10 for i in range(11)]


def _vllm_rule(gaps: list[float], count: int, rate: float | None) -> list[float]:
    """vLLM's benchmark, re-derived: delay i is the running sum of the gaps drawn for requests
    0..i (the first request waits one gap too); without a ramp-up the delays are scaled so the
    last is count / rate."""
    delays, t = [], 0.0
    for g in gaps:
        t += g
        delays.append(t)
    if rate is not None and delays[-1] != 0:
        factor = (count / rate) / delays[-1]
        delays = [d * factor for d in delays]
    return delays


@pytest.mark.parametrize(("arrival", "burstiness"), [("poisson", 1.0), ("gamma", 0.5), ("constant", 1.0)])
def test_vllm_pacing_follows_vllms_rule_for_the_seeds_gaps(arrival: str, burstiness: float) -> None:
    count, rate, seed = 128, 4.0, 17
    rng = np.random.default_rng(seed)  # the gaps this seed draws, one per request
    if arrival == "poisson":
        gaps = [float(rng.exponential(1 / rate)) for _ in range(count)]
    elif arrival == "gamma":
        gaps = [float(rng.gamma(burstiness, 1 / (rate * burstiness))) for _ in range(count)]
    else:
        gaps = [1 / rate] * count
    arrivals = Arrivals(rate, arrival, burstiness, seed, pacing="vllm-bench", count=count)
    offsets = list(arrivals.offsets())
    assert offsets == pytest.approx(_vllm_rule(gaps, count, rate), rel=1e-12)
    assert len(offsets) == count
    assert offsets[-1] == pytest.approx(32.0)  # the last send at num_prompts / rate
    assert offsets[0] > 0  # a gap before the first request, as vLLM waits one
    # loadgen's own pacing sends the first at 0 and keeps the gaps as drawn
    own = Arrivals(rate, arrival, burstiness, seed)
    assert next(own.offsets()) == 0.0


def test_vllm_pacing_of_a_ramp_draws_each_gap_at_its_requests_rate_and_keeps_it() -> None:
    count, seed = 50, 3
    rng = np.random.default_rng(seed)
    rates = [ramp_rate("linear", 1.0, 10.0, i, count) for i in range(count)]
    gaps = [float(rng.exponential(1 / r)) for r in rates]
    offsets = vllm_offsets(count, 10.0, Arrivals(None, "poisson", 1.0, seed), ("linear", 1.0, 10.0))
    assert offsets == pytest.approx(_vllm_rule(gaps, count, None), rel=1e-12)
