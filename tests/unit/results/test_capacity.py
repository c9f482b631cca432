"""Capacity search arithmetic: the probe sequence, a probe's figures against its objectives,
and the answer, against values worked out by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from loadgen.results.capacity import broken, capacity_of, goodput_count, next_value, slo_figures, slo_ranges
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.clienthealth import ClientHealth
from loadgen.results.probe import ProbeResult
from loadgen.results.summary import CellSummary
from loadgen.scenario.shapes import Search, SearchSlo
from tests.helpers.records import steady_rec as rec


def search(by: str = "concurrency", **slo: object) -> Search:
    return Search.model_validate({"by": by, "min": 1, "max": 256, "slo": slo or {"tpot_ms": {"p99": 20.25}}})


def run_search(spec: Search, meets: object) -> list[float]:
    """The values a search probes when ``meets(value)`` is the truth."""
    results: list[tuple[float, bool]] = []
    while (v := next_value(spec, results)) is not None:
        results.append((v, bool(meets(v))))  # type: ignore[operator]
        assert len(results) < 50
    return [v for v, _ in results]


def test_concurrency_search_gallops_then_bisects_to_the_boundary() -> None:
    # boundary at 21: doubling breaks at 32, halving 16..32 gives 24, 20, 22, 21
    assert run_search(search(), lambda c: c <= 21) == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    # at the edges: min breaks the SLOs (one probe), max meets them (stops there)
    assert run_search(search(), lambda c: False) == [1]
    assert run_search(search(), lambda c: True) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # every boundary in 1..255 is found exactly, in at most 16 probes
    for edge in range(1, 256):
        probes = run_search(search(), lambda c, edge=edge: c <= edge)
        assert max(p for p in probes if p <= edge) == edge
        assert min(p for p in probes if p > edge) == edge + 1
        assert len(probes) <= 16


def test_rate_search_brackets_the_boundary_to_five_percent() -> None:
    spec = search("rate")
    truth = 16.666
    probes = run_search(spec, lambda r: r <= truth)
    passed = max(p for p in probes if p <= truth)
    failed = min(p for p in probes if p > truth)
    assert failed / passed <= 1.05
    assert probes[:6] == [1, 2, 4, 8, 16, 32]
    assert all(len(f"{p:g}".replace(".", "")) <= 4 for p in probes)  # 4 significant digits, readable


def test_confirm_measures_the_boundary_again_and_a_changed_verdict_moves_it() -> None:
    spec = Search.model_validate({"by": "concurrency", "min": 1, "max": 256, "confirm": 1,
                                  "slo": {"tpot_ms": {"p99": 20.25}}})
    # a steady truth: 21 and 22 once more each, then done
    assert run_search(spec, lambda c: c <= 21) == [1, 2, 4, 8, 16, 32, 24, 20, 22, 21, 21, 22]
    # 21 breaks the second time: met once of twice is not more than half, so 21 breaks; the
    # boundary is then 20..21, and 20 is measured again
    results = [(v, v <= 21) for v in (1, 2, 4, 8, 16, 32, 24, 20, 22, 21)] + [(21.0, False)]
    assert next_value(spec, results) == 20
    results.append((20.0, True))
    assert next_value(spec, results) is None
    cells = [probe(i, v, ok, [] if ok else ["tpot_ms.p99"], {"tpot_ms.p99": 10 + (v - 1) * 0.5})
             for i, (v, ok) in enumerate(results)]
    cap = capacity_of(0, spec, {}, cells).to_dict()
    assert cap["max_meeting_slo"] == 20
    assert cap["binds_at"] == 21
    assert cap["complete"] is True
    assert cap["margin"].endswith("probed again: 20 met 2 of 2, 21 met 1 of 2")


def test_a_pass_above_a_break_is_not_trusted() -> None:
    # noise: 16 met, 32 broke, 24 met, 20 broke: the boundary is bracketed between 16 and 20
    spec = search()
    results = [(1.0, True), (2.0, True), (4.0, True), (8.0, True), (16.0, True), (32.0, False), (24.0, True),
               (20.0, False)]
    assert next_value(spec, results) == 18


def test_figures_and_broken_objectives_by_hand() -> None:
    # TTFT 1..100 ms: numpy's linear p99 sits at rank 0.99 * 99 = 98.01 -> 99 + 0.01 = 99.01 ms
    records = [rec(float(t), i=t) for t in range(1, 101)] + [rec(0, ok=False, i=101)]
    slo = SearchSlo.model_validate({"ttft_ms": {"p99": 99.0, "p50": 60}, "tpot_ms": {"max": 10.5},
                                    "error_rate": 0.01})
    figs = slo_figures(records, slo)
    assert figs["ttft_ms.p99"] == pytest.approx(99.01)
    assert figs["ttft_ms.p50"] == pytest.approx(50.5)
    assert figs["tpot_ms.max"] == pytest.approx(10.0)
    assert figs["error_rate"] == pytest.approx(1 / 101)
    assert broken(figs, slo) == ["ttft_ms.p99"]
    # goodput counts requests within every per-request bound: TTFT <= 60 (the tighter of 99 and 60) -> 60
    assert goodput_count(records, slo) == 60


def probe(cell: int, value: float, meets: bool, broke: list[str] | None = None,
          figures: dict[str, float] | None = None,
          ranges: dict[str, tuple[float, float] | None] | None = None, edge: tuple[str, ...] = ()) -> CellSummary:
    return CellSummary(
        cell=cell, params={}, status="done", reason=None, note="", server=ServerInfo(), metrics=None,
        probe=ProbeResult(0, "concurrency", value, dict(figures or {}), tuple(broke or ()), meets, None, 2.0,
                          ranges=dict(ranges or {}), at_edge=edge),
    )


def tpot_cells(half_width: float, below: float | None = None, above: float | None = None) -> list[CellSummary]:
    """The probes of a search whose TPOT p99 is 10 + 0.5 (C - 1) ms, each figure known within
    +-``half_width`` ms (``below``/``above``: the 95% interval's ends at 21 and 22 instead)."""
    values = [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    out = []
    for i, v in enumerate(values):
        tpot = 10 + (v - 1) * 0.5
        span = (tpot - half_width, tpot + half_width)
        if v == 21 and above is not None:
            span = (span[0], above)
        if v == 22 and below is not None:
            span = (below, span[1])
        out.append(probe(i, v, v <= 21, [] if v <= 21 else ["tpot_ms.p99"],
                         {"ttft_ms.p99": 52.0, "tpot_ms.p99": tpot},
                         {"ttft_ms.p99": (50.0, 54.0), "tpot_ms.p99": span}))
    return out


def test_a_starved_probe_widens_the_likely_range_and_says_why() -> None:
    """The same probes, every interval clear of its bound (a sure 21), but the probes at 20, 21
    and 22 ran with their client starved by other programs: their verdicts are not sure, so the
    answer likely lies from 16 (the highest surely met) to 22 (below 24, the lowest surely
    broken)."""
    spec = search(ttft_ms={"p99": 300}, tpot_ms={"p99": 20.25})
    starved = ClientHealth.from_dict({"verdict": "starved"})
    cells = [dataclasses.replace(c, client=starved) if c.probe is not None and c.probe.value in (20, 21, 22) else c
             for c in tpot_cells(0.1)]
    cap = capacity_of(0, spec, {}, cells).to_dict()
    assert (cap["max_meeting_slo"], cap["binds_at"]) == (21, 22)  # the verdicts themselves stand
    assert cap["likely"] == [16, 22]
    assert cap["margin"].startswith(
        "margin: likely 16 to 22 (the probes at 20, 21, 22 ran with the client behind or the engine starved (their "
        "self-check): their verdicts are unsure); at 21")
    # and without them starved, every interval is clear (the same probes as below)
    assert capacity_of(0, spec, {}, tpot_cells(0.1)).to_dict()["likely"] == [21, 21]


def test_the_answer_names_the_binding_objective() -> None:
    spec = search(ttft_ms={"p99": 300}, tpot_ms={"p99": 20.25})
    values = [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    cells = tpot_cells(0.1)
    cap = capacity_of(0, spec, {}, cells).to_dict()
    assert cap["max_meeting_slo"] == 21
    assert cap["binds_at"] == 22
    assert cap["limiting_slo"] == ["tpot_ms.p99"]
    assert cap["complete"] is True
    assert cap["answer"] == "max concurrency meeting the SLOs: 21; TPOT p99 binds at 22 (20.50 ms > 20.25 ms)"
    assert [p["value"] for p in cap["probes"]] == values
    # 21 surely met (20.1 <= 20.25), 22 surely broke (20.4 > 20.25); 20.00 of 20.25 ms is 98.8% of the bound
    assert cap["likely"] == [21, 21]
    assert cap["margin"] == ("margin: every probe's 95% interval is clear of the bounds; at 21 TPOT p99 "
                             "was 20.00 ms against 20.25 ms (99% of its bound, within 5%)")
    wide = capacity_of(0, search(ttft_ms={"p99": 300}, tpot_ms={"p99": 40.0}), {}, cells[:5]).to_dict()
    assert wide["margin"] == ("margin: every probe's 95% interval is clear of the bounds; at 16 TPOT p99 "
                              "was 17.50 ms against 40 ms (44% of its bound)")
    # 21's interval reaches over the bound: down to 20, the highest surely met; 22's reaches under
    # it: up to 22
    unsure = capacity_of(0, spec, {}, tpot_cells(0.1, below=20.2, above=20.3)).to_dict()
    assert unsure["max_meeting_slo"] == 21
    assert unsure["likely"] == [20, 22]
    assert unsure["margin"].startswith("margin: likely 20 to 22 (the probes' 95% intervals straddle a bound); at 21")
    # too few requests to bound a p99 from above: the upper ends are the slowest requests', and said so
    few = capacity_of(0, spec, {}, [
        probe(c.cell, c.probe.value, c.probe.meets_slo, list(c.probe.broken), dict(c.probe.figures),  # type: ignore[union-attr]
              dict(c.probe.ranges), ("tpot_ms.p99",))  # type: ignore[union-attr]
        for c in cells
    ]).to_dict()
    assert few["likely"] == [21, 21]
    assert few["margin"].endswith("TPOT p99's upper end is the slowest request's until a probe has 368 requests "
                                  "(after the first wave): raise num_prompts for a surer answer")

    # interrupted after 6 probes: the search says it is unfinished and what it knows
    early = capacity_of(0, spec, {}, cells[:6]).to_dict()
    assert early["complete"] is False
    assert early["answer"].startswith("search unfinished (6 probes): max concurrency meeting the SLOs: 16;")

    none = capacity_of(0, spec, {}, [probe(0, 1, False, ["ttft_ms.p99"], {"ttft_ms.p99": 812.0})]).to_dict()
    assert none["max_meeting_slo"] is None
    assert none["answer"] == "no concurrency in 1..256 meets the SLOs: TTFT p99 binds at 1 (812.00 ms > 300 ms)"


def test_a_probes_intervals_by_hand() -> None:
    # TTFT 1..100 ms: the p50's 95% interval is the 40th to the 61st value (binomial ranks); the
    # p99's upper end is beyond 100 values (368 needed), so the slowest request's, and said so;
    # the mean's is t(99) x s / sqrt(100) either side; 1 failure of 101: Wilson's interval
    records = [rec(float(t), i=t) for t in range(1, 101)] + [rec(0, ok=False, i=101)]
    slo = SearchSlo.model_validate({"ttft_ms": {"p50": 60, "p99": 99.0, "mean": 60}, "error_rate": 0.01})
    ranges, edge = slo_ranges(records, slo)
    assert ranges["ttft_ms.p50"] == (40.0, 61.0)
    assert ranges["ttft_ms.p99"] == (97.0, 100.0)
    assert edge == ["ttft_ms.p99"]
    half = 1.984 * float(np.std(np.arange(1, 101), ddof=1)) / 10
    low, high = ranges["ttft_ms.mean"]  # type: ignore[misc]
    assert low == pytest.approx(50.5 - half, abs=0.01)
    assert high == pytest.approx(50.5 + half, abs=0.01)
    low, high = ranges["error_rate"]  # type: ignore[misc]
    assert low == pytest.approx(0.00175, abs=1e-4)
    assert high == pytest.approx(0.0540, abs=1e-3)


def test_certain_failure_threshold_is_exact() -> None:
    """ProbeWatch stops once ``n - floor((n - 1) q)`` of n planned values are over the bound:
    then numpy's percentile over any m <= n of them is over it; one fewer is not enough."""
    rng = np.random.default_rng(0)
    for n in (20, 60, 100, 257):
        for q in (50.0, 90.0, 99.0, 99.9):
            need = n - math.floor((n - 1) * q / 100)
            for m in (n, max(need, n - 3)):
                values = np.concatenate([rng.uniform(0, 1, m - need), np.full(need, 2.0)])
                assert np.percentile(values, q) > 1.0
            # one fewer over the bound (by a hair) and the rest at 0: the percentile can still meet it
            values = np.concatenate([np.zeros(n - need + 1), np.full(need - 1, 1.0 + 1e-9)])
            assert np.percentile(values, q) <= 1.0
