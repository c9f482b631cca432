"""client_health against hand-computed values."""

from __future__ import annotations

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


def test_nothing_sampled() -> None:
    assert client_health([], [], False) is None
