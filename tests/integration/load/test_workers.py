"""load.workers: the schedule shared by worker processes, merged into one run directory."""

from __future__ import annotations

import collections
import faulthandler
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import psutil
import pytest
import yaml

from loadgen.load.prepare import QuietObserver
from loadgen.load.run import execute
from loadgen.load.workers import resolve_workers
from loadgen.results.records import RequestRecord, read_records
from loadgen.results.rundir import rebuild_summary
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import Cell
from tests.conftest import StartSim
from tests.helpers.runs import run, scenario


@pytest.mark.alone
def test_two_workers_give_the_records_and_aggregates_of_one(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=30, itl_ms=5)
    one, _ = run(tmp_path, "one", scenario(base_url, 1))
    two, _ = run(tmp_path, "two", scenario(base_url, 2))
    s1 = orjson.loads((one / "summary.json").read_bytes())["cells"][0]
    s2 = orjson.loads((two / "summary.json").read_bytes())["cells"][0]
    r1 = [r for r in read_records(one / "records.jsonl") if not r.warmup]
    r2 = [r for r in read_records(two / "records.jsonl") if not r.warmup]
    # the same requests: every id once, the same lengths and token counts, all successful
    assert len(r1) == len(r2) == 48
    assert sorted(r.request_id for r in r2) == list(range(48))
    assert sorted((r.request_id, r.input_tokens, r.output_tokens, r.prompt_tokens) for r in r1) == \
        sorted((r.request_id, r.input_tokens, r.output_tokens, r.prompt_tokens) for r in r2)
    # shared round-robin: worker k sent the ids congruent to k, with 4 streams each
    assert collections.Counter(r.worker for r in r2) == {0: 24, 1: 24}
    assert all(r.request_id % 2 == r.worker for r in r2)
    assert {r.worker for r in r1} == {0}
    m1, m2 = s1["metrics"], s2["metrics"]
    for key in ("requests", "completed", "failed", "failures_by_class", "prompt_tokens_total", "output_tokens_total",
                "prompt_tokens_mismatched", "chunk_token_discrepancy", "token_count_source"):
        assert m1[key] == m2[key], key
    # one clock: every record of both workers lies inside the run's window, TTFT and ITL the
    # simulator's truth in both runs
    for m in (m1, m2):
        assert abs(m["ttft_s"]["p50"] - 0.030) < 0.004
        assert abs(m["itl_s"]["p50"] - 0.005) < 0.001
    assert s2["client"]["workers"] == 2
    assert s1["client"]["workers"] == 1
    # the merged directory re-derives its own summary
    assert rebuild_summary(two).to_dict() == orjson.loads((two / "summary.json").read_bytes())


def test_workers_with_unequal_streams_take_requests_as_their_streams_would(start_sim: StartSim,
                                                                           tmp_path: Path) -> None:
    # 8 streams over 3 workers (3, 3, 2) and 48 requests: each stream sends 6, as in one process.
    # Dealt round-robin (16 each), the worker with two streams ran two rounds after the others
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    run_dir, _ = run(tmp_path, "uneven", scenario(base_url, 3, warmup_requests=0))
    records = [r for r in read_records(run_dir / "records.jsonl") if r.request_id >= 0]  # (not the calibration's)
    assert sorted(r.request_id for r in records) == list(range(48))
    assert all(r.ok for r in records)
    assert collections.Counter(r.worker for r in records) == {0: 18, 1: 18, 2: 12}
    summary = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]
    assert summary["client"]["workers"] == 3


def test_workers_keep_each_request_on_the_one_schedule(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=10, itl_ms=2)
    body = scenario(base_url, 2, rate=40, arrival="constant", concurrency="unlimited")
    body["workload"]["num_prompts"] = 40
    run_dir, _ = run(tmp_path, "rate", body)
    records = sorted((r for r in read_records(run_dir / "records.jsonl") if not r.warmup), key=lambda r: r.request_id)
    assert len(records) == 40
    start = records[0].scheduled_at
    # request i at i / 40 s after the window's start, whichever process sent it
    assert all(abs(r.scheduled_at - start - r.request_id / 40) < 1e-6 for r in records)
    assert {r.worker for r in records} == {0, 1}
    # send lag is measured on a rate-driven cell
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["send_lag_ms"] is not None
    assert client["send_lag_ms"]["p50"] >= 0


def test_auto_is_one_worker_per_usable_core() -> None:
    assert resolve_workers("auto") == len(os.sched_getaffinity(0))
    assert resolve_workers(3) == 3


@pytest.mark.parametrize(("sig", "to_group"), [
    (signal.SIGTERM, False),  # kill PID
    (signal.SIGINT, True),  # Ctrl-C in a terminal: the whole foreground group
    (signal.SIGTERM, True),  # timeout -s TERM: its child's group
    (signal.SIGHUP, True),  # the terminal closed
])
def test_a_stop_ends_every_worker_and_keeps_the_records(start_sim: StartSim, tmp_path: Path, sig: int,
                                                         to_group: bool) -> None:
    """However the stop comes, the workers hear it from the parent: a signal sent to the whole group
    (before: each worker died of it, with a traceback, its in-flight requests lost and "ended
    unexpectedly" said of it) is the parent's to handle."""
    base_url = start_sim(ttft_ms=20, itl_ms=10)
    body = scenario(base_url, 2, duration_s=60, warmup_requests=0)
    body["workload"]["output_tokens"] = 100  # a second a request: the 8 streams are in flight at the stop
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({"name": "long", **body}))
    run_dir = tmp_path / "long"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    records = run_dir / "records.jsonl"
    while time.monotonic() < deadline:  # until the window has finished requests from both workers
        done = [r for r in read_records(records) if not r.warmup] if records.exists() else []
        if {r.worker for r in done} == {0, 1}:
            break
        time.sleep(0.2)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2
    if to_group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert "ended unexpectedly" not in err
    psutil.wait_procs(children, timeout=10)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    measured = [r for r in read_records(records) if not r.warmup]
    cancelled = [r for r in measured if r.error == "cancelled"]
    # the 8 streams in flight at the stop are recorded as cancelled, by both workers
    assert len(cancelled) == 8
    assert {r.worker for r in cancelled} == {0, 1}
    assert all(r.ok for r in measured if r.error != "cancelled")


def test_a_worker_killed_mid_run_is_said_and_the_others_records_are_kept(start_sim: StartSim,
                                                                          tmp_path: Path) -> None:
    """A worker that dies (killed, out of memory) is not taken for one that finished: the run says
    it ended unexpectedly, keeps what it had sent, and the other worker runs on to the end."""
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 2, warmup_requests=0)
    body["workload"].update(num_prompts=240, output_tokens=40)
    path = tmp_path / "killed.yaml"
    path.write_text(yaml.safe_dump({"name": "killed", **body}))
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records = run_dir / "records.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both workers have sent records
        done = [r for r in read_records(records) if r.request_id >= 0] if records.exists() else []
        if {r.worker for r in done} == {0, 1}:
            break
        time.sleep(0.1)
    workers = [c for c in psutil.Process(proc.pid).children() if "spawn_main" in " ".join(c.cmdline())]
    assert len(workers) == 2
    workers[0].kill()
    _, err = proc.communicate(timeout=120)
    said = re.findall(r"client worker (\d) ended unexpectedly", err)
    assert len(said) == 1, err[-2000:]
    killed = int(said[0])
    measured = [r for r in read_records(records) if r.request_id >= 0]
    by_worker = collections.Counter(r.worker for r in measured)
    assert by_worker[1 - killed] == 120  # the other worker's share, whole
    assert 0 < by_worker[killed] < 120
    assert all(r.ok for r in measured)


def _run_group(base_url: str, tokens: int, count: int, emit: Callable[[RequestRecord], None]) -> list[str]:
    """``count`` requests of ``tokens`` tokens through two workers at C=16, each record handed to
    ``emit`` as the run's parent does; the messages the run had for the user."""
    import asyncio

    from loadgen.load.client import ClientConfig
    from loadgen.load.schedule import Arrivals
    from loadgen.load.workers import WorkerGroup, worker_jobs
    from loadgen.results.readings import ClientReading
    from loadgen.scenario.target import Sampling, Target
    from loadgen.workload.payload import PreparedRequest, Prompt, build_payload, encode_payload

    body = encode_payload(build_payload("completions", "loadgen-sim", Prompt(4, token_ids=(1, 2, 3, 4)), tokens,
                                        sampling=Sampling()))
    pool = [PreparedRequest(0, body, 4, tokens)] * count
    messages: list[str] = []

    def health(v: ClientReading) -> None:
        pass

    async def main() -> None:
        config = ClientConfig(Target(base_url=base_url), base_url, time.perf_counter_ns())
        jobs = worker_jobs(2, config, pool, count, 16, Arrivals(None), None)
        group = WorkerGroup(jobs, emit, health, messages.append, asyncio.Event())
        try:
            assert await group.start()
            await group.run()
        finally:
            await group.close()

    asyncio.run(main())
    return messages


def test_a_parent_slower_than_its_workers_loses_no_record(start_sim: StartSim) -> None:
    """The workers send records faster than the parent takes them (on one core, the parent's
    turn comes late): the pipe fills, and a worker keeps what the pipe has no room for until it
    has, rather than dying with the pipe full ("Resource temporarily unavailable": the event
    loop's watch of the pipe had made it non-blocking), which lost its in-flight requests and
    every one it had yet to send."""
    count = 240
    records: list[RequestRecord] = []

    def slow_emit(r: RequestRecord) -> None:
        records.append(r)
        time.sleep(0.01)  # the parent's own work on each record, made slow

    assert _run_group(start_sim(ttft_ms=1, itl_ms=0.05), 256, count, slow_emit) == []
    assert sorted(r.request_id for r in records) == list(range(count))
    assert all(r.ok and r.output_tokens == 256 for r in records)


def test_a_parent_held_up_never_holds_up_its_workers_reads(start_sim: StartSim) -> None:
    """The parent stops for 3 s on a record (as when it is descheduled, or busy writing) while the
    workers stream: they go on reading their answers, the records they make meanwhile wait in
    their memory, and none is lost. Before, a worker waited on the full pipe (some 200 KB, here
    about 30 records of 400 tokens) and every stream it read went unread until the parent was back: a client
    delay of seconds, and TCP merging the tokens that piled up (their times lost)."""
    hold_s, tokens, count = 3.0, 400, 160
    records: list[RequestRecord] = []

    def held_emit(r: RequestRecord) -> None:
        records.append(r)
        if len(records) == 1:
            time.sleep(hold_s)  # the parent's whole loop held: it takes nothing from the pipes

    assert _run_group(start_sim(ttft_ms=5, itl_ms=1), tokens, count, held_emit) == []
    assert sorted(r.request_id for r in records) == list(range(count))
    assert all(r.ok and r.output_tokens == tokens for r in records)
    # requests ended during the hold (the load went on), and every read of them was handled
    # long before the parent came back (kernel-stamped reads: each one's delay is measured)
    first_done = min(r.done_at for r in records if r.done_at is not None)
    assert sum(1 for r in records if r.done_at is not None and r.done_at < first_done + hold_s) > 60
    delays = [r.client_delay_s for r in records if r.client_delay_s is not None]
    assert len(delays) == count
    assert max(delays) < hold_s / 3


def test_an_outbox_never_waits_for_the_reader_and_delivers_every_message_in_order() -> None:
    """What a worker sends while the parent reads nothing returns at once (the messages wait in
    the worker), and the parent then reads every message whole and in order with
    ``recv_bytes``: the first ones as the pipe takes them, the rest when the worker closes."""
    import asyncio
    import multiprocessing
    import threading

    from loadgen.load.workers import Outbox, watch_pipe

    messages = [bytes([65 + k % 26]) * (1000 + 37 * k) for k in range(400)]  # 2.9 MB, the pipe takes 0.2
    parent, child = multiprocessing.Pipe(duplex=True)
    got: list[bytes] = []

    async def worker() -> int:
        loop = asyncio.get_running_loop()
        watch_pipe(loop, child, lambda: None)  # as a worker's pipe is watched: left blocking
        outbox = Outbox(child, loop)
        for m in messages:
            outbox.send(m)  # with nobody reading: a blocking send would never return
        waiting = outbox.waiting
        loop.remove_reader(child.fileno())
        reader = threading.Thread(target=lambda: got.extend(parent.recv_bytes() for _ in messages))
        reader.start()
        await asyncio.sleep(0.05)  # the retries hand the pipe more as the reader takes it
        outbox.close()  # the rest, waiting for room
        reader.join(30)
        return waiting

    waiting = asyncio.run(asyncio.wait_for(worker(), 60))
    assert waiting > sum(map(len, messages)) // 2
    assert got == messages
    parent.close()
    child.close()


class _Told(QuietObserver):
    """What the console is told: the making of the requests, the window's start."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.told: list[tuple[str, int, int]] = []
        self.interrupt_at = interrupt_at
        self.last_made = 0.0  # when the last of the requests were made (the wall clock)

    def preparing(self, cell: Cell, made: int, total: int, cells: int) -> None:
        self.told.append(("making", made, total))
        self.last_made = time.time()
        if len(self.told) == self.interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # heard by the run's own handler, as from a terminal

    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
        self.told.append(("window", 0, total or 0))


def _run_watched(base_url: str, tmp_path: Path, observer: _Told) -> tuple[bool, list[RequestRecord]]:
    sc = parse_scenario({"name": "made", "target": {"base_url": base_url},
                         "workload": {"num_prompts": 20_000, "input_tokens": 8, "output_tokens": 4},
                         "load": {"concurrency": 8, "warmup_requests": 2, "workers": 2, "duration_s": 1}})
    faulthandler.dump_traceback_later(120, exit=True)  # a run that never ends fails, with its stacks
    try:
        result = execute(sc, tmp_path / "run", observer=observer)
    finally:
        faulthandler.cancel_dump_traceback_later()
    return result.interrupted, [r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup]


def test_workers_make_their_own_requests_and_the_console_follows_them(start_sim: StartSim, tmp_path: Path) -> None:
    """Each worker makes its share of the bodies (the parent made all of them, then sent each
    worker its share); the console follows the making of all of them, then the window starts."""
    base_url = start_sim(ttft_ms=2, itl_ms=0.5)
    observer = _Told()
    interrupted, measured = _run_watched(base_url, tmp_path, observer)
    assert not interrupted
    making = [(made, total) for what, made, total in observer.told if what == "making"]
    # slices of 2,000 by each worker, told as both workers' count together
    assert {total for _, total in making} == {20_000}
    assert [made for made, _ in making] == sorted(made for made, _ in making)
    assert making[-1] == (20_000, 20_000)
    assert len(making) == 10  # 5 slices of each worker's 10,000
    assert observer.told[-1][0] == "window"  # once every worker is ready, not before
    # the window's samples (the server's /metrics here) begin after the making: its seconds with
    # no request would count in the window's gauge means, power and cores
    walls = [orjson.loads(line)["wall"] for line in (tmp_path / "run" / "probes.jsonl").read_bytes().splitlines()]
    assert min(walls) > observer.last_made
    assert measured
    assert all(r.ok for r in measured)
    assert all(r.request_id % 2 == r.worker for r in measured)


def test_a_stop_while_the_workers_make_their_requests_sends_none(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=2, itl_ms=0.5)
    observer = _Told(interrupt_at=1)
    interrupted, measured = _run_watched(base_url, tmp_path, observer)
    assert interrupted
    assert measured == []
    assert "window" not in [what for what, _, _ in observer.told]
    assert len(observer.told) < 10  # not every slice was made


def _is_worker(proc: psutil.Process) -> bool:
    try:
        command = " ".join(proc.cmdline())
    except psutil.Error:  # a short-lived helper, gone already
        return False
    return "spawn_main" in command and "resource_tracker" not in command


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_a_stop_to_the_group_while_the_workers_start_ends_the_run_cleanly(start_sim: StartSim, tmp_path: Path,
                                                                           sig: int) -> None:
    """Ctrl-C (the whole process group) while the workers are still starting: each worker is
    then importing loadgen, before it could set its signals aside; it used to die of it with a
    traceback ("KeyboardInterrupt") and be reported as "ended unexpectedly"."""
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    body = scenario(base_url, 2)
    body["workload"]["num_prompts"] = 20_000
    path = tmp_path / "starting.yaml"
    path.write_text(yaml.safe_dump({"name": "starting", **body}))
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    workers: list[psutil.Process] = []
    while time.monotonic() < deadline and len(workers) < 2:  # until both workers exist
        workers = [c for c in parent.children() if _is_worker(c)]
    assert len(workers) == 2
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err
    assert "ended unexpectedly" not in err
    assert "interrupted" in err
