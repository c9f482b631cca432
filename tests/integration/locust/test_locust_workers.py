"""A Locust worker lost mid-test (its processes killed, as when its machine goes): the master
goes on with the others, says which worker it lost and when, and the run directory keeps it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from loadgen.results.records import read_records
from loadgen.servers.launch import free_port
from tests.conftest import StartSim
from tests.helpers.locust import write_scenario
from tests.helpers.rundirs import wait_for_records

pytestmark = pytest.mark.locust


def test_a_worker_killed_mid_test_is_named_and_the_others_go_on(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    scenario = str(write_scenario(tmp_path / "s.yaml", workload={"input_tokens": 16, "output_tokens": 16}))
    port = free_port("127.0.0.1")
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadgen", "locust", "--scenario", scenario]
    master = subprocess.Popen(
        [*cmd, "--host", base_url, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
         "--expect-workers", "2", "--headless", "-u", "8", "-r", "8", "-t", "14s", "--stop-timeout", "5",
         "--out", str(run_dir), "--only-summary"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    # each worker in a group of its own: loadgen's process and Locust's under it, killed together
    workers = [
        subprocess.Popen([*cmd, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        for _ in range(2)
    ]
    try:
        assert wait_for_records(run_dir, 1, timeout_s=60), "no records came"
        time.sleep(1.0)
        killed_at = time.monotonic()
        os.killpg(workers[1].pid, signal.SIGKILL)
        out, _ = master.communicate(timeout=120)
        workers[0].wait(timeout=60)
    finally:
        if master.poll() is None:
            master.kill()
        for p in workers:
            if _group_alive(p.pid):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    ended_after_s = time.monotonic() - killed_at

    records = list(read_records(run_dir / "records.jsonl"))
    last_sent = {w: max(r.sent_at or 0.0 for r in records if r.worker == w) for w in (1, 2)}
    assert set(last_sent) == {1, 2}  # both reported before the kill
    lost, kept = sorted(last_sent, key=last_sent.__getitem__)
    # the one killed stopped sending seconds before the other, which went on to the end
    assert last_sent[kept] - last_sent[lost] > 3.0
    cell = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]
    said = [w for w in cell["warnings"] if "stopped answering its master" in w]
    assert len(said) == 1, cell["warnings"]
    assert said[0].startswith(f"worker {lost} (")
    assert "4 users" in said[0]  # its share of the 8
    assert said[0] in out  # the master said it as it happened, in the same words
    # the one that went on: all it sent is on record; the lost one: what it had reported
    by_worker = {w["worker"]: w for w in orjson.loads((run_dir / "provenance.json").read_bytes())["requests_by_worker"]}
    assert by_worker[kept]["sent"] == by_worker[kept]["recorded"] == sum(1 for r in records if r.worker == kept)
    assert by_worker[lost]["recorded"] == sum(1 for r in records if r.worker == lost)
    status = [orjson.loads(line) for line in (run_dir / "cells.jsonl").read_bytes().splitlines()][-1]
    assert [w["worker"] for w in status["workers_lost"]] == [lost]
    # found missing within Locust's heartbeats (3 s) of the kill, and the test went on to its 14 s
    at_s = status["workers_lost"][0]["at_s"]
    assert ended_after_s > 5.0
    assert 0 < at_s < 14
    report = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run_dir)],
                            capture_output=True, text=True, check=False)
    assert f"worker {lost} (" in report.stdout + report.stderr


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
