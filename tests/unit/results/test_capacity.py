"""Capacity search arithmetic: the probe sequence, a probe's figures against its objectives,
and the answer, against values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadgen.results.capacity import broken, capacity_of, goodput_count, next_value, slo_figures
from loadgen.results.cellstatus import ServerInfo
from loadgen.results.probe import ProbeResult
from loadgen.results.records import RequestRecord
from loadgen.results.summary import CellSummary
from loadgen.scenario.shapes import Search, SearchSlo


def rec(ttft_ms: float, tpot_ms: float = 10.0, tokens: int = 11, ok: bool = True, i: int = 0) -> RequestRecord:
    """A request sent at 0 whose tokens came at TTFT, then every TPOT (the chunks' times say so)."""
    first = ttft_ms / 1e3
    last = first + (tokens - 1) * tpot_ms / 1e3
    return RequestRecord(
        cell=0, request_id=i, warmup=False, scheduled_at=0.0, sent_at=0.0,
        first_token_at=first if ok else None, last_token_at=last if ok else None, done_at=last if ok else 0.5,
        input_tokens=8, max_tokens=tokens, prompt_tokens=8, output_tokens=tokens if ok else 0,
        token_count_source="usage", chunk_tokens_total=tokens if ok else 0,
        chunk_offsets_s=tuple(first + k * tpot_ms / 1e3 for k in range(tokens)) if ok else (),
        chunk_tokens=(1,) * tokens if ok else (), status=200 if ok else 503, error=None if ok else "http_503",
    )


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
          figures: dict[str, float] | None = None) -> CellSummary:
    return CellSummary(
        cell=cell, params={}, status="done", reason=None, note="", server=ServerInfo(), metrics=None,
        probe=ProbeResult(0, "concurrency", value, dict(figures or {}), tuple(broke or ()), meets, None, 2.0),
    )


def test_the_answer_names_the_binding_objective() -> None:
    spec = search(ttft_ms={"p99": 300}, tpot_ms={"p99": 20.25})
    values = [1, 2, 4, 8, 16, 32, 24, 20, 22, 21]
    cells = [
        probe(i, v, v <= 21, [] if v <= 21 else ["tpot_ms.p99"],
              {"ttft_ms.p99": 52.0, "tpot_ms.p99": 10 + (v - 1) * 0.5})
        for i, v in enumerate(values)
    ]
    cap = capacity_of(0, spec, {}, cells).to_dict()
    assert cap["max_meeting_slo"] == 21
    assert cap["binds_at"] == 22
    assert cap["limiting_slo"] == ["tpot_ms.p99"]
    assert cap["complete"] is True
    assert cap["answer"] == "max concurrency meeting the SLOs: 21; TPOT p99 binds at 22 (20.50 ms > 20.25 ms)"
    assert [p["value"] for p in cap["probes"]] == values
    # 20.00 of 20.25 ms is 98.8% of the bound: said, with what it means
    assert cap["margin"] == ("margin at 21: TPOT p99 20.00 ms against 20.25 ms (99% of its bound, within 5%: "
                             "measured again, the answer may be one step lower)")
    wide = capacity_of(0, search(ttft_ms={"p99": 300}, tpot_ms={"p99": 40.0}), {}, cells[:6]).to_dict()
    assert wide["margin"] == "margin at 16: TPOT p99 17.50 ms against 40 ms (44% of its bound)"

    # interrupted after 6 probes: the search says it is unfinished and what it knows
    early = capacity_of(0, spec, {}, cells[:6]).to_dict()
    assert early["complete"] is False
    assert early["answer"].startswith("search unfinished (6 probes): max concurrency meeting the SLOs: 16;")

    none = capacity_of(0, spec, {}, [probe(0, 1, False, ["ttft_ms.p99"], {"ttft_ms.p99": 812.0})]).to_dict()
    assert none["max_meeting_slo"] is None
    assert none["answer"] == "no concurrency in 1..256 meets the SLOs: TTFT p99 binds at 1 (812.00 ms > 300 ms)"


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
