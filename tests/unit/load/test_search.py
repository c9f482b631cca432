"""The search's early stop, its queue of probes across a resume, and how it is asked for."""

from __future__ import annotations

import pytest

from loadgen.errors import ScenarioError, UsageError
from loadgen.load.search import Numbering, ProbeWatch, SearchQueue, resumed_results
from loadgen.results.cellstatus import EarlyStop, ServerInfo
from loadgen.results.probe import ProbeResult
from loadgen.results.readings import Scrape
from loadgen.results.summary import CellSummary
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells, search_lines
from loadgen.scenario.overrides import search_overrides
from loadgen.scenario.shapes import Search
from tests.helpers.records import steady_rec as rec


class Stops:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def watch(planned: int | None, open_loop: bool = False, **slo: object) -> tuple[ProbeWatch, Stops]:
    stops = Stops()
    spec = Search.model_validate({"by": "rate" if open_loop else "concurrency", "slo": slo})
    return ProbeWatch(spec, planned, open_loop, stops), stops


def test_stops_once_the_percentile_must_break() -> None:
    # 100 planned, p99: numpy's p99 of 100 values exceeds the bound once 100 - floor(99 * 0.99) = 2 do
    w, stops = watch(100, ttft_ms={"p99": 300})
    for i in range(10):
        w.add(rec(50.0, i=i))
    w.add(rec(400.0, i=10))
    assert stops.count == 0
    w.add(rec(301.0, i=11))
    assert stops.count == 1
    assert w.stopped is not None
    assert w.stopped.objective == "ttft_ms.p99"
    assert w.stopped.reason.startswith("2 of the 100 requests over 300 ms")
    w.add(rec(900.0, i=12))
    assert stops.count == 1  # told once


def test_stops_on_more_failures_than_the_error_rate_allows() -> None:
    w, stops = watch(100, error_rate=0.05)
    for i in range(5):
        w.add(rec(0, ok=False, i=i))
    assert stops.count == 0  # 5 of 100 is 5%: still met if every other request succeeds
    w.add(rec(0, ok=False, i=5))
    assert stops.count == 1
    assert w.stopped == EarlyStop("error_rate", "6 of the 100 requests failed: the error rate is "
                                  "over 5.0% whatever the rest do")


def test_a_running_figure_far_over_stops_a_probe_of_unknown_length() -> None:
    w, stops = watch(None, tpot_ms={"p50": 20})
    for i in range(19):
        w.add(rec(50.0, tpot_ms=45.0, i=i))
    assert stops.count == 0  # fewer than 20 requests: too few to call
    w.add(rec(50.0, tpot_ms=45.0, i=19))
    assert stops.count == 1
    assert w.stopped is not None
    assert w.stopped.reason == "TPOT p50 over the first 20 requests is 45.0 ms, more than 2 times its bound"
    # under twice the bound, a running figure says nothing yet
    w2, stops2 = watch(None, tpot_ms={"p50": 20})
    for i in range(40):
        w2.add(rec(50.0, tpot_ms=35.0, i=i))
    assert stops2.count == 0


@pytest.mark.parametrize(("stat", "stops_at"), [("p90", 80), ("p99", 640)])
def test_a_running_percentile_is_judged_only_with_five_requests_beyond_it(stat: str, stops_at: int) -> None:
    # checks at 20, 40, 80, ...: a p90 needs 5 / 0.1 = 50 requests (first stop at 80), a p99 500 (at 640)
    w, stops = watch(None, tpot_ms={stat: 20})
    for i in range(stops_at - 1):
        w.add(rec(50.0, tpot_ms=45.0, i=i))
    assert stops.count == 0
    w.add(rec(50.0, tpot_ms=45.0, i=stops_at - 1))
    assert stops.count == 1
    assert w.stopped is not None
    assert w.stopped.reason.startswith(f"TPOT {stat} over the first {stops_at} requests is 45.0 ms")


def test_a_growing_server_queue_stops_an_open_loop_probe() -> None:
    def scrapes(w: ProbeWatch, waiting: list[float]) -> None:
        for n in waiting:
            w.scrape(Scrape(gauges={"waiting": n, "running": 8}))

    w, stops = watch(None, open_loop=True, ttft_ms={"p99": 300})
    scrapes(w, [0, 2, 2, 5, 9])  # flat once, then grew three times: 2 -> 5 -> 9 is not yet 3 rises
    assert stops.count == 0
    scrapes(w, [14])
    assert stops.count == 1
    assert w.stopped is not None
    assert w.stopped.objective == "queue"
    # closed loop: the queue is bounded by the concurrency, never a reason to stop
    closed, stops_closed = watch(None, open_loop=False, ttft_ms={"p99": 300})
    scrapes(closed, [0, 2, 5, 9, 14, 20])
    assert stops_closed.count == 0


def test_no_early_stop_when_turned_off() -> None:
    stops = Stops()
    spec = Search.model_validate({"by": "concurrency", "early_stop": False, "slo": {"ttft_ms": {"max": 10}}})
    w = ProbeWatch(spec, 10, False, stops)
    w.add(rec(50.0))
    assert stops.count == 0


SCENARIO = {
    "target": {"base_url": "http://127.0.0.1:1/v1"},
    "load": {"search": {"by": "concurrency", "min": 1, "max": 64, "slo": {"tpot_ms": {"p99": 20}}}},
}


def probe_summary(cell: int, value: float, meets: bool, status: str = "done") -> CellSummary:
    return CellSummary(cell=cell, params={}, status=status, reason=None, note="", server=ServerInfo(), metrics=None,
                       probe=ProbeResult(0, "concurrency", value, {}, (), meets, None, None))


def test_a_resumed_search_goes_on_from_its_finished_probes() -> None:
    sc = parse_scenario(SCENARIO)
    assert expand_cells(sc) == []  # a search has no cells of its own
    lines = search_lines(sc)
    # finished: 1, 2, 4, 8 met, 16 broke; the probe at 12 was interrupted (no verdict)
    entries = [probe_summary(i, v, v <= 10) for i, v in enumerate([1, 2, 4, 8, 16])]
    entries.append(probe_summary(5, 12, False, status="interrupted"))
    queue = SearchQueue(lines, resumed_results(entries), Numbering(6))
    cell = queue.take()
    assert cell is not None
    assert (cell.index, cell.concurrency, cell.rate, cell.search) == (6, 12, None, 0)
    queue.finished(cell, probe_summary(6, 12, False))
    nxt = queue.take()
    assert nxt is not None
    assert (nxt.index, nxt.concurrency) == (7, 10)


def test_flags_become_the_search() -> None:
    sets = search_overrides("concurrency:1:64", ["ttft:p99:300", "tpot_ms:p99.9:20.5", "ttft:p50:100",
                                                 "error_rate:0.01"])
    sc = parse_scenario({"target": {"base_url": "http://x/v1"}}, "loadgen run", sets)
    s = sc.load.search
    assert s is not None
    assert (s.by, s.min, s.max) == ("concurrency", 1, 64)
    assert s.slo.ttft_ms == {"p99": 300, "p50": 100}
    assert s.slo.tpot_ms == {"p99.9": 20.5}
    assert s.slo.error_rate == 0.01
    rate = parse_scenario({}, "x", search_overrides("rate", ["e2e:mean:5000"]))
    assert rate.load.search is not None
    assert rate.load.concurrency == (None,)  # a rate search is uncapped (None: unlimited) unless told


@pytest.mark.parametrize(("search", "slos", "message"), [
    ("load", [], "--search 'load': give concurrency or rate"),
    ("rate:1", [], "--search 'rate:1': give concurrency or rate, optionally with MIN:MAX"),
    ("rate", ["ttft:300"], "--slo 'ttft:300': give METRIC:STAT:MS"),
    ("rate", ["queue:p99:3"], "--slo 'queue:p99:3': give METRIC:STAT:MS"),
])
def test_bad_flags_say_what_to_give(search: str, slos: list[str], message: str) -> None:
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace("'", "'")):
        search_overrides(search, slos)


@pytest.mark.parametrize(("load", "message"), [
    ({"search": {"by": "rate"}}, "load.search -> a search needs its objectives: slo: {ttft_ms: {p99: 300}, ...} "
                                 "(on the command line: --slo ttft:p99:300)"),
    ({"search": {"by": "rate", "slo": {}}}, "give at least one objective"),
    ({"search": {"by": "rate", "slo": {"ttft_ms": 300}}}, "ttft_ms: give a statistic and a bound in ms, e.g. "
                                                          "ttft_ms: {p99: 300}"),
    ({"search": {"by": "rate", "slo": {"ttft_ms": {"q99": 300}}}}, "'q99' is not a statistic"),
    ({"search": {"by": "rate", "slo": {"ttft_ms": {"p99": 0}}}}, "ttft_ms.p99: the bound must be > 0 ms"),
    ({"search": {"by": "concurrency", "min": 1.5, "slo": {"error_rate": 0.1}}}, "needs whole numbers"),
    ({"search": {"by": "concurrency", "min": 8, "max": 4, "slo": {"error_rate": 0.1}}}, "max (4) is below min (8)"),
    ({"concurrency": 8, "search": {"by": "concurrency", "slo": {"error_rate": 0.1}}},
     "search by concurrency sets load.concurrency itself: drop load.concurrency"),
    ({"rate": 8, "search": {"by": "rate", "slo": {"error_rate": 0.1}}}, "search by rate sets load.rate itself"),
    ({"stages": [{"duration_s": 1, "rate": 2}], "search": {"by": "rate", "slo": {"error_rate": 0.1}}},
     "search chooses each probe's load: drop ramp_up and stages"),
])
def test_bad_searches_are_one_line_errors(load: dict[str, object], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"load": load}, "s.yaml")
    text = str(err.value)
    assert text.startswith("s.yaml: ")
    assert message in text
    assert "\n" not in text


def test_the_first_wave_is_not_judged() -> None:
    # a closed loop of 8 over 40 planned requests: its first 8 (all prefilled at once) are left
    # out, so p99 over the other 32 breaks once 32 - floor(31 * 0.99) = 2 of them are over
    stops = Stops()
    spec = Search.model_validate({"by": "concurrency", "slo": {"ttft_ms": {"p99": 300}}})
    w = ProbeWatch(spec, 40, False, stops, wave=8)
    for i in range(8):
        w.add(rec(900.0, i=i))  # the whole first wave over the bound
    assert stops.count == 0
    w.add(rec(400.0, i=8))
    w.add(rec(400.0, i=9))
    assert stops.count == 1
    assert w.stopped is not None
    assert w.stopped.reason.startswith("2 of the 32 requests over 300 ms")
    # too few requests to leave a wave out: every one is judged
    short = ProbeWatch(spec, 12, False, Stops(), wave=8)
    assert short.wave == 0
    assert short.planned == 12


def test_a_probes_figures_leave_its_first_wave_out() -> None:
    from loadgen.results.capacity import after_first_wave

    records = [rec(900.0, i=i) for i in range(4)] + [rec(50.0, i=i) for i in range(4, 12)]
    kept, left_out = after_first_wave(records, 4)
    assert left_out == 4
    assert [r.request_id for r in kept] == list(range(4, 12))
    assert after_first_wave(records[:7], 4) == (records[:7], 0)  # fewer than twice the wave: all kept


def test_the_first_wave_is_the_first_sent_whatever_the_numbering() -> None:
    """Locust's master numbers a probe's records as its workers' reports arrive, across the run
    (here 86 onwards, a worker's later requests before the other's first): the first wave is
    still the 4 requests sent first, at 0 s, and only they are left out."""
    from dataclasses import replace

    from loadgen.results.capacity import after_first_wave

    first = [replace(rec(900.0, i=90 + k), sent_at=0.0) for k in range(4)]
    later = [replace(rec(50.0, i=86 + k), sent_at=0.5 + k / 10) for k in range(4)]
    later += [replace(rec(50.0, i=94 + k), sent_at=1.0 + k / 10) for k in range(4)]
    kept, left_out = after_first_wave(later[:4] + first + later[4:], 4)
    assert left_out == 4
    assert sorted(r.request_id for r in kept) == [86, 87, 88, 89, 94, 95, 96, 97]
