"""`loadgen locust` obeys every stop: SIGINT, SIGTERM and SIGHUP end Locust at once, the run
directory is finished and labelled interrupted, and loadgen exits 130; the model lookup of its
users is bounded in time and in size against a server that never answers or never ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadgen.results.records import read_records
from loadgen.servers.launch import free_port
from tests.conftest import StartSim, live_group_members
from tests.helpers.rawserver import RawServer
from tests.helpers.rundirs import wait_for_records
from tests.helpers.simtruth import sim_requests

pytestmark = pytest.mark.locust

ROOT = Path(__file__).parents[3]


def _default_sigint() -> None:
    # a non-interactive shell starts background jobs with SIGINT ignored: undo that
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _locust_measuring(url: str, tmp_path: Path, users: int, min_bytes: int, extra: list[str], output_tokens: int = 16,
                      **popen: Any) -> tuple[subprocess.Popen[str], Path]:
    """``loadgen locust`` headless with ``users`` users, once its records.jsonl holds ``min_bytes``:
    (its process, its run directory)."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({"name": "stops", "workload": {"input_tokens": 8,
                                                                      "output_tokens": output_tokens}}))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "locust", "--scenario", str(scenario), "--host", url, "--headless",
         "-u", str(users), "-r", str(users), "-t", "10m", "--out", str(run_dir), "--only-summary", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen,
    )
    wait_for_records(run_dir, min_bytes)
    assert proc.poll() is None, proc.communicate()
    return proc, run_dir


def _assert_ended_interrupted(proc: subprocess.Popen[str], err: str, run_dir: Path, url: str,
                              processes: int = 1) -> None:
    """Exit 130, no traceback, no process left, the run directory finished and labelled
    interrupted, its summary counting every ok record, and every request the server was sent
    on record (those in flight at the stop as cancelled)."""
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    assert live_group_members(proc.pid) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    assert not (run_dir / "run.lock").exists()
    completed = summary["cells"][0]["metrics"]["completed"]
    lines = (run_dir / "records.jsonl").read_bytes().splitlines()
    assert completed == sum(1 for line in lines if b'"error":null' in line) > 0
    sent = [r for r in read_records(run_dir / "records.jsonl") if r.sent_at is not None]
    assert len(sent) == sim_requests(url) - 2 * processes  # each process calibrated its text with 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_a_stop_ends_locust_and_labels_the_run_interrupted(start_sim: StartSim, tmp_path: Path,
                                                          sig: signal.Signals) -> None:
    url = start_sim(ttft_ms=5, itl_ms=5)
    proc, run_dir = _locust_measuring(url, tmp_path, 2, 2000, [], preexec_fn=_default_sigint)
    proc.send_signal(sig)  # to loadgen alone, as `kill` sends it
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{sig.name} did not stop loadgen locust")
    _assert_ended_interrupted(proc, err, run_dir, url)


@pytest.mark.parametrize(("sig", "processes"), [(signal.SIGINT, 2), (signal.SIGTERM, 2), (signal.SIGHUP, 2),
                                             (signal.SIGHUP, 1), (signal.SIGINT, 4)],
                         ids=["INT-2", "TERM-2", "HUP-2", "HUP-1", "INT-4"])
def test_a_stop_to_the_whole_group_ends_locust_once(start_sim: StartSim, tmp_path: Path, sig: signal.Signals,
                                                    processes: int) -> None:
    """Ctrl-C, `timeout` and a closed terminal signal loadgen and Locust (and Locust's worker
    processes) together: Locust stops once, its own clean way. Before, a closed terminal ended
    Locust at once (no summary.json, the run directory left locked), and with `--processes` the
    stop loadgen passed on arrived mid-way through Locust's own and a Ctrl-C landed in a user's
    greenlet, each printing a traceback."""
    url = start_sim(ttft_ms=5, itl_ms=5)
    # (a port of the test's own for the forked workers: Locust's default is one for the machine)
    extra = ["--processes", str(processes), "--master-bind-port", str(free_port("127.0.0.1"))] if processes > 1 else []
    proc, run_dir = _locust_measuring(url, tmp_path, 8, 20_000, extra, start_new_session=True)
    os.killpg(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{sig.name} to the group did not stop loadgen locust")
    _assert_ended_interrupted(proc, err, run_dir, url, processes)


class Endless(RawServer):
    """``silent`` never answers; ``endless`` answers its model list without end."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        conn.recv(65536)
        if self.mode == "endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
            while not self.closing.is_set():
                conn.sendall(b" " * 65536)
        self.closing.wait(120)


@pytest.mark.parametrize(("mode", "message"), [
    ("silent", "no full answer within 1.5 s; check --host"),
    ("endless", "the model list is over 1 MiB; is --host the server's /v1 base URL?"),
])
def test_the_model_lookup_of_locust_users_is_bounded(mode: str, message: str) -> None:
    server = Endless(mode)
    try:
        # in a process of its own: Locust's modules patch the standard library with gevent's
        code = textwrap.dedent(f"""
            import time
            from geventhttpclient.url import URL
            from loadgen.errors import LoadgenError
            from loadgen.locust.transport import fetch_model, open_client
            from loadgen.scenario.target import Timeouts
            url = URL("{server.base_url}/models")
            http = open_client(url, Timeouts())
            t = time.monotonic()
            try:
                fetch_model(http, url, {{}}, total_s=1.5, max_bytes=1 << 20)
            except LoadgenError as exc:
                print(exc)
            print(round(time.monotonic() - t))
        """)
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              check=False)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    said, took = proc.stdout.strip().splitlines()
    assert said == f"{server.base_url}/models: {message}"
    assert int(took) <= 3


def test_comments_alone_do_not_keep_a_locust_request_alive(tmp_path: Path) -> None:
    from loadgen.results.records import read_records
    from tests.integration.load.test_request_bounds import Misbehaving

    server = Misbehaving("token_then_comments")  # one token, then a comment every 0.2 s without end
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "comments", "target": {"model": "m", "timeouts": {"between_tokens_s": 1.0}},
        "workload": {"input_tokens": 8, "output_tokens": 4, "prompt": "token-ids"},
    }))
    run_dir = tmp_path / "run"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "locust", "--scenario", str(scenario), "--host", server.base_url,
             "--headless", "-u", "1", "-r", "1", "-t", "4s", "--out", str(run_dir), "--only-summary"],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )
    finally:
        server.close()
    records = list(read_records(run_dir / "records.jsonl"))
    ended = [r for r in records if r.error != "cancelled"]
    assert ended, proc.stderr[-2000:]
    assert {r.error for r in ended} == {"timeout"}
    assert {r.error_detail for r in ended} == {"no token for 1 s (between_tokens_s)"}


def _e2e_p99(run_dir: Path) -> float:
    """The E2E p99 of the run's answered requests, from its records, in seconds."""
    import numpy as np

    done = [r.done_at - r.sent_at for r in read_records(run_dir / "records.jsonl")  # type: ignore[operator]
            if r.error is None and r.sent_at is not None and r.done_at is not None]
    assert len(done) > 100
    return float(np.percentile(done, 99))


@pytest.mark.timing
@pytest.mark.alone  # two runs' p99s to 5%: another test's load between them is drift it cannot tell
@pytest.mark.parametrize("processes", [1, 2], ids=["one-process", "two-processes"])
def test_a_stopped_tests_latencies_are_those_of_one_that_ran_out_its_time(start_sim: StartSim, tmp_path: Path,
                                                                         processes: int) -> None:
    """A Ctrl-C to the group ends the test without turning the requests in flight into slow
    successes (the answered requests' E2E p99 of a stopped test once read 580 ms against 411 for
    the same test run out): the two E2E p99s agree within 5%."""
    url = start_sim(ttft_ms=20, itl_ms=5)  # E2E 20 + 63 x 5 = 335 ms

    def extra() -> list[str]:
        return (["--processes", str(processes), "--master-bind-port", str(free_port("127.0.0.1"))]
                if processes > 1 else [])

    stopped_dir = tmp_path / "stopped"
    stopped_dir.mkdir()
    proc, stopped = _locust_measuring(url, stopped_dir, 16, 600_000, extra(), output_tokens=64,
                                      start_new_session=True)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("Ctrl-C to the group did not stop loadgen locust")
    assert proc.returncode == 130, err[-2000:]
    timed = tmp_path / "timed"
    ran = subprocess.run(
        [sys.executable, "-m", "loadgen", "locust", "--scenario", str(stopped_dir / "s.yaml"), "--host", url,
         "--headless", "-u", "16", "-r", "16", "-t", "8s", "--out", str(timed), "--only-summary", *extra()],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    # the requests in flight at the stop are cut as cancelled, or, where their answers were in
    # before Locust got round to stopping its users, answered at their true times (the bytes'
    # kernel stamps): never slow successes
    assert _e2e_p99(stopped) == pytest.approx(_e2e_p99(timed), rel=0.05)
