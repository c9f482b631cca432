from __future__ import annotations

import numpy as np
import pytest

from loadgen.load.schedule import concurrency_shares, iter_offsets


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
