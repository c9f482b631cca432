"""Open loops under Locust: ``load.rate``, ``load.ramp_up`` and stages at a rate. Every process
fires its share of one arrival schedule (arrivals i, i + n, ... of n), made from the run's seed
and timed from the master's start of the test, each due arrival taken by a free user; the users
(-u) are the most in flight, and where they run out the arrivals go late and Locust says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.load.schedule import Arrivals, ramp_offsets
from loadgen.results.records import RequestRecord, read_records
from loadgen.servers.launch import free_port
from tests.conftest import CpuHog, StartSim
from tests.helpers.locust import locust, write_scenario
from tests.helpers.simtruth import sim_requests

pytestmark = pytest.mark.locust


def run_open_loop(base_url: str, tmp_path: Path, load: dict[str, object], users: int, run_time: str,
                  *extra: str, num_prompts: int = 50) -> tuple[str, list[RequestRecord], dict]:
    scenario = write_scenario(tmp_path / "s.yaml", load=load,
                              workload={"num_prompts": num_prompts, "input_tokens": 16, "output_tokens": 8})
    proc = locust("--scenario", str(scenario), "--host", base_url, "--headless", "-u", str(users), "-r", str(users),
                  "-t", run_time, "--out", str(tmp_path / "run"), "--only-summary", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    return proc.stderr, records, json.loads((tmp_path / "run" / "summary.json").read_text())


def answered(records: list[RequestRecord]) -> list[RequestRecord]:
    """The answered requests, in the order they were due."""
    return sorted((r for r in records if r.ok), key=lambda r: r.scheduled_at or 0.0)


@pytest.mark.timing
@pytest.mark.parametrize("processes", [1, 2])
def test_a_rate_is_sent_on_its_schedule_by_every_process(start_sim: StartSim, tmp_path: Path,
                                                          processes: int) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=5)
    extra = ["--processes", "2", "--master-bind-port", str(free_port("127.0.0.1"))] if processes > 1 else []
    err, records, summary = run_open_loop(base_url, tmp_path, {"rate": 10, "arrival": "constant"}, 4, "5s", *extra)
    # 4 users carry 10 requests/s of ~40 ms answers: none late for want of a user
    assert "after its time" not in err
    done = answered(records)
    assert 25 <= len(done) <= 45  # 10/s from 1 s into a 5 s test
    # one schedule, shared out: every 100 ms exactly, whichever process sent it
    due = np.array([r.scheduled_at for r in done])
    assert np.diff(due) == pytest.approx(0.1, abs=0.001)
    late = np.array([(r.sent_at or 0.0) - (r.scheduled_at or 0.0) for r in done])
    assert np.median(late) < 0.003
    assert late.min() >= 0
    if processes == 2:  # arrivals i, i + 2, ... to each worker
        assert len({r.worker for r in done[0::2]}) == 1
        assert {r.worker for r in done[1::2]} == {1, 2} - {done[0].worker}
    # every request the server saw is on record (each process calibrated its text with 2)
    sent = [r for r in records if r.sent_at is not None]
    assert sim_requests(base_url) - 2 * processes == len(sent)
    cell = summary["cells"][0]
    assert (cell["params"]["rate"], cell["params"]["concurrency"]) == (10, 4)


def test_too_few_users_for_the_rate_are_said_and_the_arrivals_go_late(start_sim: StartSim, tmp_path: Path) -> None:
    # one user, ~55 ms an answer: 18 a second at most, against 40 due
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    err, records, _ = run_open_loop(base_url, tmp_path, {"rate": 40, "arrival": "constant"}, 1, "4s")
    assert "all 1 users of this process were busy, so the rate outruns them; raise -u" in err
    done = answered(records)
    late = [(r.sent_at or 0.0) - (r.scheduled_at or 0.0) for r in done]
    assert late[-1] > 0.5  # falling further behind: 3 s of 40/s due, half of it sent
    assert all(b >= a - 0.005 for a, b in zip(late, late[1:], strict=False))
    # the wait is for a free user, as a closed loop's for a slot, not the client's send lag: the
    # self-check's send lag is the rest, milliseconds (it read 3.3 s before the wait was a slot's)
    assert done[-1].slot_wait_s > 0.5
    assert max((r.sent_at or 0.0) - (r.scheduled_at or 0.0) - r.slot_wait_s for r in done) < 0.05
    client = json.loads((tmp_path / "run" / "summary.json").read_text())["cells"][0]["client"]
    assert client["send_lag_ms"]["p99"] < 50


def test_a_ramp_is_sent_at_its_rates_and_ends_the_test(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=5)
    ramp = {"strategy": "linear", "start_rate": 4, "end_rate": 12}
    err, records, _ = run_open_loop(base_url, tmp_path, {"arrival": "constant", "ramp_up": ramp}, 4, "60s",
                                    num_prompts=12)
    # the 12 requests of the ramp, then the test ends on its own (not at -t's 60 s)
    assert "every request of the schedule (12) sent once in this test" in err
    done = answered(records)
    assert len(done) == 12
    due = np.array([r.scheduled_at for r in done])
    expected = ramp_offsets(12, "linear", 4, 12, Arrivals(None, "constant"))
    assert due - due[0] == pytest.approx(expected, abs=1e-6)


def test_every_request_of_many_users_over_two_processes_is_on_record_after_the_run_time(
        start_sim: StartSim, cpu_hog: CpuHog, tmp_path: Path) -> None:
    """256 users over two worker processes on a busy machine, each stream ~0.7 s, until -t: every request the
    server was sent has a record, those in flight at the end as cancelled. (The master waited a
    fixed 0.5 s for its workers' last reports, and a worker stopping 128 users took longer: 386
    of 875 requests had no record once.)"""
    cpu_hog("any")  # a busy machine: two programs keep the cores busy, as on a shared CI runner
    cpu_hog("any")
    base_url = start_sim(ttft_ms=50, itl_ms=20)
    scenario = write_scenario(tmp_path / "s.yaml", workload={"input_tokens": 8, "output_tokens": 32})
    proc = locust("--scenario", str(scenario), "--host", base_url, "--headless", "-u", "256", "-r", "256",
                  "-t", "5s", "--stop-timeout", "0", "--out", str(tmp_path / "run"), "--only-summary",
                  "--processes", "2", "--master-bind-port", str(free_port("127.0.0.1")))
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if r.sent_at is not None]
    assert sum(1 for r in records if r.error == "cancelled") > 0
    assert sim_requests(base_url) - 2 * 2 == len(records)  # each process calibrated its text with 2
