"""``loadgen locust`` as real processes (Locust master, workers, the one-process runner) against
``loadgen sim`` on 127.0.0.1: figures against the simulator's configured truth and its own count."""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson
import pytest

from loadgen.results.records import read_records
from loadgen.results.rundir import SUMMARY, rebuild_summary
from loadgen.servers.launch import free_port
from tests.conftest import StartSim, live_group_members
from tests.helpers.locust import OUTPUT, headless, locust, write_scenario
from tests.helpers.rundirs import wait_for_records
from tests.helpers.simtruth import sim_requests

pytestmark = pytest.mark.locust

TTFT_MS, ITL_MS = 50.0, 10.0


def stats_rows(prefix: Path) -> dict[str, dict[str, str]]:
    with Path(f"{prefix}_stats.csv").open() as f:
        return {row["Name"]: row for row in csv.DictReader(f) if row["Type"] == "LLM"}


def llm_rows(prefix: Path) -> dict[str, dict[str, str]]:
    with Path(f"{prefix}_llm.csv").open() as f:
        return {row["Name"]: row for row in csv.DictReader(f)}


@pytest.mark.timing  # TTFT to 5 ms: 56 ms read once against 50, with the whole Locust tier beside it
def test_headless_run_matches_the_simulator(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    scenario = write_scenario(tmp_path / "s.yaml")
    prefix = tmp_path / "stats"
    run = headless(scenario, base_url, tmp_path, 20, "10s", 30)
    assert run.returncode == 0, run.stderr[-3000:]
    served = sim_requests(base_url) - 2  # text prompts: two calibration probes first
    rows = stats_rows(prefix)
    assert set(rows) == {"TTFT", "TPOT", "E2E"}  # one request event per request: no ITL rows
    # every request the simulator served is one E2E entry, none failed, each with a first token
    assert int(rows["E2E"]["Request Count"]) == served
    assert int(rows["E2E"]["Failure Count"]) == 0
    assert int(rows["TTFT"]["Request Count"]) == served
    assert int(rows["TPOT"]["Request Count"]) == served
    # Locust's Aggregated row (its header RPS and charts) counts requests, not chunks
    with Path(f"{prefix}_stats.csv").open() as f:
        aggregated = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    assert int(aggregated["Request Count"]) == served
    assert abs(float(rows["TTFT"]["Median Response Time"]) - TTFT_MS) <= 5
    # E2E: 50 + 31 x 10 ms; the size column is the response body's bytes (an SSE event per token)
    assert abs(float(rows["E2E"]["Median Response Time"]) - (TTFT_MS + (OUTPUT - 1) * ITL_MS)) <= 15
    assert float(rows["E2E"]["Average Content Size"]) > OUTPUT * 50
    assert served > 20 * 10  # about 10 s of 20 back-to-back streams of ~0.36 s

    llm = llm_rows(prefix)
    assert list(llm) == ["Total"]
    assert int(llm["Total"]["Requests"]) == served
    assert int(llm["Total"]["Output tokens"]) == served * OUTPUT
    # the ITL distribution from the records, exact: one token every 10 ms
    assert abs(float(llm["Total"]["ITL p50 (ms)"]) - ITL_MS) <= 1
    assert abs(float(llm["Total"]["TTFT p50 (ms)"]) - TTFT_MS) <= 5

    # loadgen's run directory: the same requests, and a summary re-derivable from it
    run_dir = tmp_path / "run"
    records = list(read_records(run_dir / "records.jsonl"))
    assert len(records) == served
    assert all(r.ok and r.output_tokens == OUTPUT and r.prompt_tokens == 64 for r in records)
    summary = orjson.loads((run_dir / SUMMARY).read_bytes())
    metrics = summary["cells"][0]["metrics"]
    assert metrics["completed"] == served
    assert summary["cells"][0]["params"]["concurrency"] == 20
    assert abs(metrics["ttft_s"]["p50"] * 1e3 - TTFT_MS) <= 5
    assert rebuild_summary(run_dir).to_dict() == summary
    report = subprocess.run(
        [sys.executable, "-m", "loadgen", "report", str(run_dir)], capture_output=True, text=True, check=False
    )
    assert report.returncode == 0
    assert f"completed {served}/{served}" in report.stdout


def test_master_and_two_workers_merge_llm_metrics(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    scenario = str(write_scenario(tmp_path / "s.yaml"))
    port = free_port("127.0.0.1")
    prefix = tmp_path / "stats"
    cmd = [sys.executable, "-m", "loadgen", "locust", "--scenario", scenario]
    master = subprocess.Popen(
        [*cmd, "--host", base_url, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
         "--expect-workers", "2", "--headless", "-u", "10", "-r", "10", "-t", "6s", "--stop-timeout", "30",
         "--csv", str(prefix), "--out", str(tmp_path / "run"), "--only-summary"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    workers = [
        subprocess.Popen(
            [*cmd, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for _ in range(2)
    ]
    try:
        out, _ = master.communicate(timeout=120)
        for w in workers:
            w.communicate(timeout=60)
    finally:
        for p in (master, *workers):
            if p.poll() is None:
                p.kill()
    assert master.returncode == 0, out[-3000:]
    assert all(w.returncode == 0 for w in workers)
    served = sim_requests(base_url) - 4  # each worker calibrates its text prompts

    llm = llm_rows(prefix)
    assert list(llm) == ["worker 1", "worker 2", "Total"]
    per_worker = [int(llm[f"worker {k}"]["Requests"]) for k in (1, 2)]
    assert all(n > 0 for n in per_worker)
    assert sum(per_worker) == int(llm["Total"]["Requests"]) == served
    assert int(llm["Total"]["Output tokens"]) == served * OUTPUT
    # Locust's own merged entries agree
    assert int(stats_rows(prefix)["E2E"]["Request Count"]) == served

    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert Counter(r.worker for r in records) == {1: per_worker[0], 2: per_worker[1]}
    # the run directory says what each worker sent, by its own count, and what is on record
    provenance = orjson.loads((tmp_path / "run" / "provenance.json").read_bytes())
    assert provenance["requests_by_worker"] == [{"worker": k, "sent": n, "recorded": n}
                                                for k, n in ((1, per_worker[0]), (2, per_worker[1]))]
    assert sorted(r.request_id for r in records) == list(range(served))
    # moved onto the master's clock: the whole run fits its 6 s window (plus the last streams)
    sent = [r.sent_at for r in records if r.sent_at is not None]
    assert max(sent) - min(sent) < 6.5
    ttfts = sorted((r.first_token_at or 0) - (r.sent_at or 0) for r in records)
    assert abs(ttfts[len(ttfts) // 2] * 1e3 - TTFT_MS) <= 5


def test_shape_runs_the_concurrency_steps_as_cells_with_calibrated_chat(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    scenario = write_scenario(
        tmp_path / "s.yaml", target={"api": "chat"}, load={"concurrency": [2, 4], "duration_s": 3},
    )
    run = locust(
        "--shape", "--scenario", str(scenario), "--host", base_url, "--headless", "--stop-timeout", "30",
        "--out", str(tmp_path / "run"), "--only-summary",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = orjson.loads((tmp_path / "run" / SUMMARY).read_bytes())
    cells = summary["cells"]
    assert [c["params"]["concurrency"] for c in cells] == [2, 4]
    completed = [c["metrics"]["completed"] for c in cells]
    # back-to-back streams of ~0.36 s: about 3 s / 0.36 s per user in each step
    assert 2 * 5 <= completed[0] < 2 * 10
    assert 4 * 5 <= completed[1] < 4 * 10
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    # chat prompts hit 64 tokens exactly once calibrated against the server's template
    assert {r.prompt_tokens for r in records} == {64}
    # two calibration probes, then every measured request
    assert sim_requests(base_url) == len(records) + 2


@pytest.mark.timing
def test_failures_are_reported_in_loadgen_classes(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    scenario = write_scenario(tmp_path / "s.yaml", target={"timeouts": {"first_token_s": 0.02}})
    prefix = tmp_path / "stats"
    run = headless(scenario, base_url, tmp_path, 4, "3s", 10)
    # Locust exits 1 when requests failed
    assert run.returncode == 1, run.stderr[-3000:]
    rows = stats_rows(prefix)
    assert set(rows) == {"E2E"}
    failed = int(rows["E2E"]["Failure Count"])
    assert failed == int(rows["E2E"]["Request Count"]) > 0
    with Path(f"{prefix}_failures.csv").open() as f:
        failures = list(csv.DictReader(f))
    assert [(r["Name"], r["Error"], int(r["Occurrences"])) for r in failures] == [
        ("E2E", "LLMRequestFailed('timeout: first token')", failed)
    ]
    # each timed out at the 20 ms first-token deadline (never earlier), before the 50 ms first token
    assert float(rows["E2E"]["Min Response Time"]) >= 20
    # (and before the 50 ms first token: a busy CI machine read 28 to 32 ms at the median)
    assert 20 <= float(rows["E2E"]["Median Response Time"]) <= 45
    summary = orjson.loads((tmp_path / "run" / SUMMARY).read_bytes())
    assert summary["cells"][0]["metrics"]["failures_by_class"] == {"timeout": failed}


def test_unreachable_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path / "s.yaml")
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    run = locust("--scenario", str(scenario), "--host", url, "--headless", "-u", "2", "-t", "20s", timeout=60)
    assert run.returncode == 2
    assert f"error: {url}/models: cannot reach the server" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(("content", "message"), [
    ("workload: {input_tokens: [64, 128]}\n", "workload.input_tokens -> Locust runs one input"),
    ("load: {concurency: 4}\n", "load.concurency"),
])
def test_bad_scenario_is_one_line_and_exit_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    run = locust("--scenario", str(path), "--host", "http://127.0.0.1:9/v1", "--headless", timeout=60)
    assert run.returncode == 2
    assert message in run.stderr
    assert str(path) in run.stderr
    assert "Traceback" not in run.stderr


def test_sigterm_to_loadgen_stops_locust_and_keeps_the_run(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    scenario = write_scenario(tmp_path / "s.yaml")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "locust", "--scenario", str(scenario), "--host", base_url,
         "--headless", "-u", "4", "-r", "4", "-t", "10m", "--out", str(run_dir), "--only-summary"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    records = run_dir / "records.jsonl"
    wait_for_records(run_dir, 5000)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    # Locust's own SIGTERM handling ends the test and writes what it measured
    assert live_group_members(proc.pid) == [], stderr[-2000:]
    summary = orjson.loads((run_dir / SUMMARY).read_bytes())
    measured = list(read_records(records))
    assert measured
    ok = [r for r in measured if r.ok]
    assert summary["cells"][0]["metrics"]["completed"] == len(ok) > 0


def test_chunks_of_the_wrong_type_are_recorded_as_malformed(start_sim: StartSim, tmp_path: Path) -> None:
    # half the streams carry "choices": 5 halfway through: each is a record of class malformed,
    # and every request the simulator saw has its record
    base_url = start_sim(ttft_ms=5, itl_ms=1, faults={"wrong_types": 0.5}, fault_seed=3)
    scenario = write_scenario(tmp_path / "s.yaml", target={"api": "completions"},
                              workload={"num_prompts": 50, "input_tokens": 16, "output_tokens": 8,
                                        "prompt": "random-tokens"})
    headless(scenario, base_url, tmp_path, 4, "4s", 10)
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    classes = Counter(r.error for r in records)
    assert len(records) == sim_requests(base_url)
    assert classes["malformed"] > 0
    assert set(classes) == {None, "malformed"}
    assert all("choices is not a list" in (r.error_detail or "") for r in records if r.error)


def test_a_second_web_ui_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        scenario = write_scenario(tmp_path / "s.yaml")
        proc = locust("--scenario", str(scenario), "--host", "http://127.0.0.1:9/v1", "--web-port", str(port),
                      timeout=60)
    finally:
        taken.close()
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --web-port {port}: 127.0.0.1:{port} is in use")


@pytest.mark.parametrize(("shape", "steps"), [(False, []), (True, [1, 4])])
def test_the_start_page_shows_the_shape_steps_only_under_the_shape(
    start_sim: StartSim, tmp_path: Path, shape: bool, steps: list[int],
) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    scenario = write_scenario(tmp_path / "s.yaml", load={"concurrency": [1, 4]})
    port = free_port("127.0.0.1")
    with (tmp_path / "locust.log").open("w") as log:
        ui = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "locust", *(["--shape"] if shape else []), "--scenario", str(scenario),
             "--host", base_url, "--web-port", str(port), "--out", str(tmp_path / "run")],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                said = httpx.get(f"http://127.0.0.1:{port}/llm/scenario", timeout=5).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, (tmp_path / "locust.log").read_text()
                assert ui.poll() is None, (tmp_path / "locust.log").read_text()
                time.sleep(0.2)
    finally:
        ui.terminate()
        ui.wait(30)
    assert said["steps"] == steps


@pytest.mark.parametrize("processes", [1, 2])
def test_the_html_file_carries_the_llm_figures(start_sim: StartSim, tmp_path: Path, processes: int) -> None:
    """Locust's --html file, written at its end (by the master over 2 processes): Locust's
    report with the LLM figures of the test below it, its request count the run directory's."""
    base_url = start_sim(ttft_ms=5, itl_ms=2)
    scenario = write_scenario(tmp_path / "s.yaml")
    run = locust("--scenario", str(scenario), "--host", base_url, "--headless", "-u", "4", "-r", "4", "-t", "3s",
                 "--processes", str(processes), "--html", str(tmp_path / "report.html"), "--out", str(tmp_path / "run"),
                 "--only-summary")
    assert run.returncode == 0, run.stderr[-3000:]
    page = (tmp_path / "report.html").read_text()
    assert "LLM (loadgen)" in page
    answered = sum(1 for r in read_records(tmp_path / "run" / "records.jsonl") if r.error != "cancelled")
    assert f"<th>Requests</th><td>{answered:,}</td>" in page
    assert page.index("LLM (loadgen)") > page.index("<body")
