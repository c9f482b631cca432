"""What `loadgen compare` may call better or worse: ITL intervals that resample whole requests
(the gaps of one stream move together), and no verdict where either run's client or engine
was starved or the two cells ran different loads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from loadgen.results import compare
from loadgen.results.compare import METRICS, NOT_JUDGED, _draws, _itl_draws, _unjudged, unjudged
from loadgen.results.enginecores import EngineCores
from loadgen.results.metrics import itl_values
from loadgen.results.records import RequestRecord
from loadgen.results.rundir import rebuild_summary

ROOT = Path(__file__).parents[3]


def streams(levels_ms: list[float], gaps: int = 50) -> list[RequestRecord]:
    """A request per level: ``gaps`` gaps of exactly that level (its stream's own pace)."""
    out = []
    for i, level in enumerate(levels_ms):
        offsets = tuple(k * level / 1e3 for k in range(gaps + 1))
        out.append(RequestRecord(i, 0, False, 0.0, 0.0, 0.05, 0.05 + offsets[-1], 0.05 + offsets[-1], 16, gaps + 1,
                                 16, gaps + 1, "usage", gaps + 1, offsets, (1,) * (gaps + 1)))
    return out


def interval(base: np.ndarray, run: np.ndarray) -> tuple[float, float]:
    low, high = np.percentile(run / base - 1, (2.5, 97.5))
    return float(low), float(high)


def test_two_samples_of_one_server_are_within_noise_when_requests_are_drawn_whole() -> None:
    """Each stream keeps its own pace (levels 8 to 12 ms): two runs are two draws of 40 streams
    from the same paces. Resampled gap by gap, the 2,000 gaps look like 2,000 independent
    values and the interval of the p50's change excludes 0; drawn as 40 whole requests, it
    holds it, as it must for one server measured twice."""
    rng = np.random.default_rng(7)
    base = streams(list(rng.uniform(8, 12, 40)))
    run = streams(list(rng.uniform(8, 12, 40)))
    pooled_b, pooled = (np.concatenate([itl_values(r) * 1e3 for r in rs]) for rs in (base, run))
    change = np.percentile(pooled, 50) / np.percentile(pooled_b, 50) - 1
    gap_by_gap = interval(_draws(pooled_b, 50, np.random.default_rng(1)), _draws(pooled, 50, np.random.default_rng(1)))
    whole = interval(_itl_draws(base, 50, np.random.default_rng(1)), _itl_draws(run, 50, np.random.default_rng(1)))
    assert abs(change) > 0.01
    assert not gap_by_gap[0] <= 0 <= gap_by_gap[1], gap_by_gap  # the narrow interval calls a change
    assert whole[0] <= 0 <= whole[1], whole
    assert whole[1] - whole[0] > 3 * (gap_by_gap[1] - gap_by_gap[0])


def test_a_draw_is_the_percentile_of_the_requests_it_drew() -> None:
    """By hand: 3 requests of 2 gaps each (1, 1 / 2, 2 / 3, 3 ms). A draw of requests (0, 2, 2)
    pools 1, 1, 3, 3, 3, 3, whose p50 (numpy's) is 3; (0, 0, 1) pools 1, 1, 1, 1, 2, 2: 1."""
    records = streams([1.0, 2.0, 3.0], gaps=2)

    class Picks:
        def __init__(self, rows: list[list[int]]) -> None:
            self.rows = rows

        def integers(self, low: int, high: int, size: tuple[int, int]) -> np.ndarray:
            return np.asarray(self.rows[:size[0]])

    old = compare.DRAWS
    compare.DRAWS = 2
    try:
        drawn = _itl_draws(records, 50, Picks([[0, 2, 2], [0, 0, 1]]))  # type: ignore[arg-type]
        drawn_q = _itl_draws(records, 25, Picks([[0, 2, 2], [1, 2, 2]]))  # type: ignore[arg-type]
    finally:
        compare.DRAWS = old
    assert drawn is not None
    assert drawn_q is not None
    assert list(drawn) == pytest.approx([3.0, 1.0])
    # p25 of 1, 1, 3, 3, 3, 3: rank 1.25 -> 1 + 0.25 x (3 - 1) = 1.5; of 2, 2, 3, 3, 3, 3: 2 + 0.25 x 1 = 2.25
    assert list(drawn_q) == pytest.approx([1.5, 2.25])
    assert list(np.percentile([2, 2, 3, 3, 3, 3], [25])) == [2.25]


def cells() -> tuple:
    summary = rebuild_summary(ROOT / "tests" / "data" / "rundir-v2")
    cell = summary.cells[0]
    assert cell.client is not None
    assert cell.metrics is not None
    assert not cell.open_loop
    return cell, cell


def test_a_starved_client_on_either_side_leaves_every_change_without_a_verdict() -> None:
    base, cell = cells()
    assert unjudged(base, cell, "a", "b") == ()
    starved = replace(cell, client=replace(cell.client, verdict="starved"))
    notes = unjudged(base, starved, "a", "b")
    assert notes == ("b: the client was starved (its self-check): a verdict needs both runs measured with the "
                     "client's core its own",)
    changes = [compare.Change(m.key, m.label, 1.0, 2.0, 1.0, 0.5, 1.5, v)
               for m, v in zip(METRICS[:4], ("worse", "better", "within noise", "too few values"), strict=True)]
    assert [_unjudged(c).verdict for c in changes] == [NOT_JUDGED, NOT_JUDGED, NOT_JUDGED, "too few values"]


def test_a_starved_engine_and_a_different_load_are_said() -> None:
    base, cell = cells()
    hogged = replace(cell, engine_cores=EngineCores((0,), 0.5, 0.4, (), True))
    assert unjudged(hogged, cell, "a", "b") == ("a: the engine was starved: other programs took 40% of its cores",)
    # a closed loop of 64 that ran 32 at once against one that ran 40: the loads differ by 20%
    ran = replace(cell, metrics=replace(cell.metrics, peak_in_flight=40))
    short = replace(cell, metrics=replace(cell.metrics, peak_in_flight=32))
    assert unjudged(short, ran, "a", "b") == ("the cells ran different loads: peak in flight 32 in a, 40 in b",)
    # 38 against 40: within a tenth, the same load
    assert unjudged(replace(cell, metrics=replace(cell.metrics, peak_in_flight=38)), ran, "a", "b") == ()
