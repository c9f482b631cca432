"""The self-check flags a client that cannot keep up, names why, and only then."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loadgen.results.records import read_records
from tests.conftest import CpuHog, StartSim
from tests.helpers.runs import run, scenario


@pytest.mark.alone
def test_a_saturated_client_is_reported_client_bound(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 1)
    body["workload"].update(num_prompts=24, output_tokens=64)
    # every socket read costs 3 ms: 8 streams x 200 chunks/s need 4.8 s of CPU per second
    run_dir, stderr = run(tmp_path, "starved", body, env={"LOADGEN_TEST_CHUNK_DELAY_MS": "3"})
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["client_bound"] is True
    assert client["verdict"] == "saturated"
    assert client["loop_lag_ms"]["p99"] > 5
    assert client["cpu_share_max"] > 0.9
    # the kernel stamped the reads: the client's delay is measured, and kept out of the figures
    assert client["clock"] == "kernel"
    assert client["client_delay_ms"]["p99"] > 5
    assert any(r.startswith("client delay p99") for r in client["reasons"])
    assert client["read_us_mean"] >= 3000
    # 4.8 cores' worth of reads, one per event: the advice counts the events its merged reads
    # carried (a whole core seen, which once advised 2 workers)
    advised = int(re.search(r"load\.workers: (\d+)", client["advice"]).group(1))
    assert advised >= 4
    assert "was client-bound (client delay p99" in stderr
    assert "kernel receive stamps kept the client's delay out of its TTFT / ITL" in " ".join(stderr.split())
    assert "load.workers" in stderr
    # on the loop's clock the same starved client is judged by its loop's lag, and its figures carry it
    body["load"]["clock"] = "loop"
    run_dir, stderr = run(tmp_path, "starved-loop", body, env={"LOADGEN_TEST_CHUNK_DELAY_MS": "3"})
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert (client["clock"], client["client_delay_ms"], client["verdict"]) == ("loop", None, "saturated")
    assert any(r.startswith("event-loop lag p99") for r in client["reasons"])
    assert "its TTFT / ITL include the client's own delay" in " ".join(stderr.split())


@pytest.mark.alone
def test_a_light_run_is_not_flagged(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 1, concurrency=1)
    body["workload"]["num_prompts"] = 6
    run_dir, stderr = run(tmp_path, "light", body)
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["client_bound"] is False, client["reasons"]
    assert client["verdict"] == "ok"
    assert client["queued_ms_per_s"] < 10  # an idle machine: under 1 ms a second (measured 0.2)
    # about one read per token chunk (two chunks close together may share a read)
    assert client["reads"] >= 0.9 * 6 * 24
    assert "client-bound" not in stderr
    # the simulator's core, which the client found it pinned to, had no other program
    cores = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["engine_cores"]
    assert cores["starved"] is False
    assert cores["others_share"] < 0.1
    assert "the engine was starved" not in stderr
    assert f"self-check ok: the client kept up; the engine's cores {','.join(map(str, cores['cores']))} had no other program" in stderr


def test_a_busy_process_on_the_engines_core_is_named(start_sim: StartSim, cpu_hog: CpuHog, tmp_path: Path) -> None:
    """A process spinning on the simulator's core: the engine was starved, and the cell says by whom."""
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    hog = cpu_hog("server")
    body = scenario(base_url, 1, concurrency=2)
    body["workload"].update(num_prompts=30, output_tokens=24)
    run_dir, stderr = run(tmp_path, "engine-hogged", body)
    cell = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]
    cores = cell["engine_cores"]
    assert cores["starved"] is True
    assert cores["others_share"] > 0.5  # the spinning process takes most of a core beside a light engine
    assert hog in [h["pid"] for h in cores["others"]]
    assert "the engine was starved: other programs took" in stderr
    assert f"(pid {hog})" in stderr
    assert "self-check ok" not in stderr
    assert any(f"(pid {hog})" in w for w in cell["warnings"])


@pytest.mark.alone
def test_a_client_sharing_its_core_with_a_busy_process_is_starved_and_names_it(
    start_sim: StartSim, tmp_path: Path
) -> None:
    """A process spinning on the client's core: the loop lags while the client itself idles."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: the simulator on one, the client and the busy process on the other")
    client_core = cores[-1]
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {client_core})
        body = scenario(base_url, 1, concurrency=2, client_cpus=[client_core])
        body["workload"].update(num_prompts=30, output_tokens=32)
        # the client at a lower priority than the busy process, as an engine's spinning threads
        # outrank a client that sleeps between chunks
        run_dir, stderr = run(tmp_path, "hogged", body, prefix=["nice", "-n", "10"])
    finally:
        hog.kill()
        hog.wait()
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["verdict"] == "starved", client
    assert client["cpu_share_max"] < 0.5
    # the kernel's scheduler statistics: the loop's thread was kept waiting for its core
    assert client["queued_ms_per_s"] > 10 * 5  # five times the threshold (measured: 200 to 400)
    assert "its thread waited" in client["reasons"][-1]
    assert hog.pid in [h["pid"] for h in client["hogs"]]
    assert f"pid {hog.pid}" in client["advice"]
    assert "load.workers" not in client["advice"]  # more workers would not help
    assert "was client-starved" in stderr


@pytest.mark.alone
def test_waiting_for_a_concurrency_slot_is_not_send_lag(start_sim: StartSim, tmp_path: Path) -> None:
    """40 requests/s offered to one slot that serves ~18/s: they queue for the slot, and that
    wait is reported as slot wait; the client itself sends each as soon as its slot is free."""
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 1, concurrency=1, rate=40, arrival="constant", warmup_requests=0)
    body["workload"].update(num_prompts=12, output_tokens=8)  # 20 + 7 x 5 = 55 ms each
    run_dir, stderr = run(tmp_path, "slots", body)
    cell = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]
    m = cell["metrics"]
    # request i waits for the i requests before it, 55 ms each, minus its own 25 ms offset
    assert m["slot_wait_s"]["max"] > 0.3
    assert m["send_lag_s"]["p99"] < 0.005
    assert cell["client"]["send_lag_ms"]["p99"] < 5
    assert cell["client"]["client_bound"] is False
    records = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup]
    before, last = sorted(records, key=lambda r: r.request_id)[-2:]
    # its slot was freed when the request before it ended (handled a moment after its last
    # bytes came): the wait is that end less its own schedule, however late a busy machine ran
    assert before.done_at is not None
    assert 0 <= last.slot_wait_s - (before.done_at - last.scheduled_at) < 0.01
    # and at least what the schedule alone gives: the simulator is never early, so each of the
    # 11 requests before it took 55 ms or more, while it was scheduled 11 x 25 ms later
    assert last.slot_wait_s > 11 * 0.055 - 11 * 0.025 - 0.005


def test_every_request_of_a_closed_loop_that_waited_for_a_slot_reports_that_wait(
    start_sim: StartSim, tmp_path: Path,
) -> None:
    """12 requests on 4 slots, no rate: 4 at once, then 4 as those end (together), then 4 more.
    Each of the last 8 waited for a slot since the start, and says so, not only the one the
    dispatcher happened to be waiting on (the others, sent in the same step, said 0)."""
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 1, concurrency=4, warmup_requests=0)
    body["workload"].update(num_prompts=12, output_tokens=8)  # 20 + 7 x 5 = 55 ms each
    run_dir, _ = run(tmp_path, "closed", body)
    records = sorted((r for r in read_records(run_dir / "records.jsonl") if not r.warmup), key=lambda r: r.sent_at)
    assert len(records) == 12
    ends = sorted(r.done_at for r in records)
    for r in records[:4]:
        assert r.slot_wait_s == 0.0
    for k, r in enumerate(records[4:]):
        # its slot was given back when one of the first 4 (then of the next 4) ended: that end
        # less its schedule, handled a moment after the last bytes came
        freed = ends[k] - r.scheduled_at
        assert r.slot_wait_s >= 0.05  # at least most of a 55 ms request
        assert 0 <= r.slot_wait_s - freed < 0.01
    cell = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]
    assert cell["metrics"]["slot_wait_s"]["p50"] >= 0.05  # 8 of 12 waited
