"""client_health against hand-computed values."""

from __future__ import annotations

from dataclasses import replace

from loadgen.results.clienthealth import client_health
from loadgen.results.readings import ClientReading
from loadgen.results.records import RequestRecord
from loadgen.results.samples import Sample


def sample(worker: int, cpu: float, wall: float, lags: list[float], reads: int = 10, read_ms: float = 1.0) -> Sample:
    return Sample(0, 0.0, ClientReading(worker, wall, cpu, reads, read_ms, tuple(lags)))


def rec(i: int, scheduled: float, sent: float) -> RequestRecord:
    return RequestRecord(i, 0, False, scheduled, sent, sent + 0.05, sent + 0.1, sent + 0.1, 8, 4, 8, 4, "usage", 4)


def test_healthy_client() -> None:
    out = client_health([sample(0, 0.2, 1.0, [0.1, 0.2, 0.3]), sample(0, 0.3, 1.0, [0.4, 0.5])], [], False)
    assert out is not None
    assert out.workers == 1
    assert out.loop_lag_ms.p50 == 0.3
    assert out.loop_lag_ms.max == 0.5
    # numpy's linear interpolation: 0.4 + 0.96 * (0.5 - 0.4)
    assert abs(out.loop_lag_ms.p99 - 0.496) < 1e-9
    assert out.cpu_s == 0.5
    assert out.cpu_share_max == 0.25
    assert out.reads == 20
    assert out.read_us_mean == 100.0
    assert out.send_lag_ms is None  # a closed loop has no schedule
    assert out.client_bound is False
    assert out.reasons == ()
    assert out.advice is None


def test_each_threshold_names_itself() -> None:
    records = [rec(i, i * 0.1, i * 0.1 + (0.02 if i == 9 else 0.001)) for i in range(10)]
    out = client_health([sample(0, 0.95, 1.0, [1.0] * 90 + [30.0] * 10), sample(1, 0.5, 1.0, [1.0])], records, True)
    assert out is not None
    assert out.workers == 2
    assert out.cpu_share_max == 0.95
    assert abs(out.send_lag_ms.p50 - 1.0) < 1e-9
    assert abs(out.send_lag_ms.max - 20.0) < 1e-9
    assert out.client_bound is True
    assert out.reasons[0].startswith("event-loop lag p99 ")
    assert out.reasons[1].startswith("send lag p99 ")
    assert out.reasons[2] == "client CPU 95% of a core > 90%"
    assert "load.workers: 4" in out.advice


def test_the_workers_advised_count_the_reads_a_saturated_client_merged() -> None:
    # one worker at a whole core over 100 reads: where each read carried one event it needs
    # 1 / 0.6 of a core (2 workers); where its reads carried three (TCP merged the events while
    # it was behind), one read per event would take 3 cores: 3 / 0.6, 5 workers
    def records(events: int) -> list[RequestRecord]:
        return [replace(rec(i, i * 0.1, i * 0.1), chunk_offsets_s=(0.05,) * (events // 10))
                for i in range(10)]

    for events, workers in ((100, 2), (300, 5)):
        out = client_health([sample(0, 1.0, 1.0, [1.0], reads=100)], records(events), False)
        assert out is not None
        assert out.verdict == "saturated"
        assert f"set load.workers: {workers} " in (out.advice or "")


def test_nothing_sampled() -> None:
    assert client_health([], [], False) is None


def stamped(worker: int, cpu: float, delays: list[float], delay_max: float, reads: int = 100,
            queued: float | None = None) -> Sample:
    """A kernel-clock reading: the loop lagged 40 ms, the reads were handled ``delays`` after
    arriving, and the loop's thread waited ``queued`` ms for its core."""
    return Sample(0, 0.0, ClientReading(worker, 1.0, cpu, reads, 1.0, (40.0,), None, tuple(delays), delay_max,
                                        len(delays), queued))


def test_with_kernel_stamps_the_verdict_is_judged_on_the_measured_delay() -> None:
    # 100 delays: 99 of 1 ms and one of 9 ms (the sampled max); the longest of all was 12 ms
    out = client_health([stamped(0, 0.3, [1.0] * 99 + [9.0], 12.0)], [], False)
    assert out is not None
    assert out.clock == "kernel"
    assert out.client_delay_ms is not None
    assert out.client_delay_ms.p50 == 1.0
    assert abs(out.client_delay_ms.p99 - (1.0 + 0.01 * 8.0)) < 1e-9  # 1 + (99 * 0.99 - 98) x 8
    assert out.client_delay_ms.max == 12.0  # the interval's own maximum, not the sample's
    # the loop lagged 40 ms, but the reads were handled within 1.08 ms at p99: no lag reason
    assert out.client_bound is False
    assert out.reasons == ()


def test_a_starved_client_with_kernel_stamps_says_its_figures_do_not_carry_the_delay() -> None:
    records = [replace(rec(i, 0.0, 0.0), coalesced_reads=3) for i in range(2)]
    out = client_health([stamped(0, 0.1, [20.0] * 100, 31.0)], records, False)
    assert out is not None
    assert out.verdict == "starved"
    assert out.reasons[0] == "client delay p99 20.0 ms > 5 ms"
    assert out.effect == ("kernel receive stamps kept the client's delay out of its TTFT / ITL (the loop's clock would "
                          "have added up to 20.0 ms at p99, 31.0 ms at most); 6.0% of reads carried several tokens "
                          "(TCP merged them before the client read them): those tokens share one time, on any clock")
    assert out.coalesced_reads == 6


def test_on_the_loop_clock_the_figures_carry_the_lag() -> None:
    out = client_health([sample(0, 0.95, 1.0, [30.0] * 10)], [], False)
    assert out is not None
    assert (out.clock, out.client_delay_ms) == ("loop", None)
    assert out.effect == "its TTFT / ITL include the client's own delay"


def test_the_kernel_says_whether_a_late_client_was_kept_from_its_core() -> None:
    # reads handled 8 ms late (p99) by a client at 4% of a core, over two 1 s intervals
    late = [0.1] * 95 + [8.0] * 5
    # its thread waited 300 ms a second on the run queue: another process held its core
    out = client_health([stamped(0, 0.04, late, 9.0, queued=250.0), stamped(0, 0.04, late, 9.0, queued=350.0)],
                        [], False)
    assert out is not None
    assert (out.verdict, out.client_bound, out.queued_ms_per_s) == ("starved", True, 300.0)
    assert out.reasons == ("client delay p99 8.0 ms > 5 ms",
                           "while the client itself used only 4% of a core, and its thread waited 300 ms a second "
                           "for one")
    # it waited 0.2 ms a second: no process held the core, the machine woke it late; the kernel
    # stamps kept the delay out of the figures, so the cell is not the client's
    out = client_health([stamped(0, 0.04, late, 9.0, queued=0.1), stamped(0, 0.04, late, 9.0, queued=0.3)], [], False)
    assert out is not None
    assert (out.verdict, out.client_bound, out.reasons, out.queued_ms_per_s) == ("ok", False, (), 0.2)
    assert out.client_delay_ms is not None
    assert out.client_delay_ms.p99 == 8.0
    # one of two workers without the statistic (a run directory from before): the kernel cannot
    # say, and the lag alone decides, as before
    out = client_health([stamped(0, 0.04, late, 9.0, queued=0.1), stamped(1, 0.04, late, 9.0)], [], False)
    assert out is not None
    assert (out.verdict, out.queued_ms_per_s) == ("starved", None)
    # on the loop's clock the figures carry the lag whatever its cause: bound, but not called starved
    loop = [Sample(0, 0.0, ClientReading(0, 1.0, 0.04, 10, 1.0, (9.0,) * 10, queued_ms=0.5))]
    out = client_health(loop, [], False)
    assert out is not None
    assert (out.verdict, out.client_bound) == ("lagging", True)
    assert out.advice is not None
    assert out.advice.startswith(
        "the client's event loop fell behind, yet its thread waited only 0.5 ms a second for its core")
