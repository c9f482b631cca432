"""SIGINT, SIGTERM and SIGHUP end a run within a second in the phases before the load, against
a server that accepts connections and then never answers (or answers a byte a second)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.load.prepare import QuietObserver
from loadgen.load.run import execute
from loadgen.load.sidecall import SideCallError, side_call, side_client
from loadgen.results.records import read_records
from loadgen.results.rundir import RECORDS, SAMPLES
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import Cell
from loadgen.servers.launch import free_port
from loadgen.servers.tiny import ensure_tiny
from tests.conftest import StartSim, live_group_members
from tests.helpers.rawserver import MODELS_ANSWER, RawServer, is_models

ROOT = Path(__file__).parents[3]


class Stubborn(RawServer):
    """``silent`` reads a request and never answers; ``drip`` sends its status line a byte a
    second; ``models`` answers the model list and is silent on the rest."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.holding = threading.Event()  # set once it holds the call of the phase
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        head = conn.recv(65536)
        if self.mode == "models" and is_models(head):
            conn.sendall(MODELS_ANSWER)
            head = conn.recv(65536)
        self.holding.set()
        if self.mode == "drip":
            for byte in b"HTTP/1.1 200 OK\r\n":
                if self.closing.wait(1.0):
                    return
                conn.sendall(bytes([byte]))
        self.closing.wait(600)


@pytest.fixture
def stubborn() -> Iterator[type[Stubborn]]:
    made: list[Stubborn] = []

    def make(mode: str) -> Stubborn:
        server = Stubborn(mode)
        made.append(server)
        return server

    yield make  # type: ignore[misc]
    for s in made:
        s.close()


def _default_sigint() -> None:
    # a non-interactive shell starts background jobs with SIGINT ignored: undo that, or the
    # SIGINT case would prove nothing
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
@pytest.mark.parametrize(("mode", "phase"), [
    ("silent", "model lookup"), ("drip", "model lookup"), ("models", "text calibration"),
])
def test_a_stop_ends_the_run_in_the_phases_before_the_load(
    stubborn: type[Stubborn], tmp_path: Path, sig: signal.Signals, mode: str, phase: str,
) -> None:
    server = stubborn(mode)  # type: ignore[call-arg]
    out = tmp_path / "run"
    # the default prompts are text: they are calibrated against the server before the load
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "run", "--base-url", f"http://127.0.0.1:{server.port}/v1",
         "--num-prompts", "4", "--out", str(out)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
    )
    # well into the phase: the server holds its call (loadgen's start takes seconds on a busy machine)
    assert server.holding.wait(60), proc.communicate()
    time.sleep(0.5)
    assert proc.poll() is None, f"ended before the signal in the {phase}: {proc.communicate()}"
    err = _stop_and_wait(proc, sig, phase, 3.0)  # not the 600 s the server would hold it (1.7 s seen on a crowded machine)
    assert "interrupted" in err
    assert not (out / "run.lock").exists()


@pytest.mark.parametrize("mode", ["silent", "drip"])
def test_a_side_call_is_bounded_in_time(stubborn: type[Stubborn], mode: str) -> None:
    server = stubborn(mode)  # type: ignore[call-arg]

    async def call() -> None:
        async with side_client() as http:
            await side_call(http, "GET", f"http://127.0.0.1:{server.port}/v1/models", what="the model list",
                            total_s=1.5)

    t = time.monotonic()
    with pytest.raises(SideCallError, match=r"^the model list: no full answer within 1.5 s$"):
        asyncio.run(call())
    assert time.monotonic() - t < 2.5


def test_a_side_call_is_bounded_in_size(tmp_path: Path) -> None:
    endless = socket.socket()
    endless.bind(("127.0.0.1", 0))
    endless.listen(1)
    port = endless.getsockname()[1]

    def serve() -> None:
        conn, _ = endless.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            try:
                while True:
                    conn.sendall(b"x" * 65536)  # a metrics page without end
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()

    async def call() -> None:
        async with side_client() as http:
            await side_call(http, "GET", f"http://127.0.0.1:{port}/metrics", what="the server's /metrics",
                            max_bytes=1 << 20)

    with pytest.raises(SideCallError, match=r"^the server's /metrics: the answer is over 1 MiB$"):
        asyncio.run(call())
    endless.close()


def _stop_and_wait(proc: subprocess.Popen[str], sig: signal.Signals, phase: str, bound_s: float) -> str:
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{sig.name} ignored during the {phase}")
    took = time.monotonic() - sent
    assert took < bound_s, f"{sig.name} took {took:.1f} s during the {phase}"
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    return err


STOPS = pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])


@STOPS
def test_a_stop_ends_the_engine_start_and_the_engine(tmp_path: Path, sig: signal.Signals) -> None:
    ensure_tiny()
    # an engine that never gets ready: the wait for it is the phase stopped
    engine = tmp_path / "engine"
    engine.write_text("#!/bin/sh\necho started $$\nexec sleep 600\n")
    engine.chmod(0o755)
    log = tmp_path / "engine.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "serve", "tiny", "--backend", "vllm", "--port", "0", "--log", str(log)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint,
        env={**os.environ, "LOADGEN_VLLM_PYTHON": str(engine)},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and b"started" in log.read_bytes()):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.5)
    err = _stop_and_wait(proc, sig, "engine start", 3.0)
    assert "interrupted" in err
    assert [pid for pid in live_group_members(_engine_pid(log)) if pid != proc.pid] == []  # the engine was stopped


def _engine_pid(log: Path) -> int:
    """The pid of the fake engine, from the line it wrote as its first (``started PID``)."""
    return int(log.read_text().split("started ", 1)[1].split()[0])


@STOPS
def test_a_stop_ends_the_warmup(tmp_path: Path, sig: signal.Signals) -> None:
    # the launched simulator holds its first token for five minutes: the warmup request waits
    port = free_port("127.0.0.1")
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: warmup-stop\n"
        f"serve: {{backend: sim, port: {port}, sim: {{ttft_ms: 5, itl_ms: 1, faults: {{slow_ttft: 1.0}}, "
        "slow_ttft_ms: 300000}}\n"
        "workload: {num_prompts: 4, input_tokens: 8, output_tokens: 4, prompt: token-ids}\n"
    )
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(out)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    # the simulator is up and holds the warmup request (its own count of the requests it answers;
    # a fixed wait was too short on a busy machine)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "loadgen_sim_requests_running 1" not in _metrics(port):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    err = _stop_and_wait(proc, sig, "warmup", 3.0)
    assert "interrupted" in err
    summary = (out / "summary.json").read_text()
    assert '"interrupted": true' in summary
    assert not (out / "run.lock").exists()


def _metrics(port: int) -> str:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2, trust_env=False).text
    except httpx.HTTPError:
        return ""


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@STOPS
def test_a_stop_ends_the_report_and_leaves_no_half_written_file(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "big"
    shutil.copytree(ROOT / "tests" / "data" / "rundir-v2", run_dir)
    lines = (run_dir / "records.jsonl").read_bytes().splitlines()
    measured = [line for line in lines if b'"warmup":false' in line and b'"cell":0,' in line]
    first = 1000
    with (run_dir / "records.jsonl").open("ab") as f:  # 300,000 records: a report that takes a while
        for i in range(300_000):
            line = measured[i % len(measured)]
            f.write(b'{"request_id":%d,' % (first + i) + line[line.index(b'"cell"'):] + b"\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != "records.jsonl"}
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "report", str(run_dir), "--html"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    time.sleep(3.0)  # reading the records
    assert proc.poll() is None, f"the report ended before the signal: {proc.communicate()}"
    err = _stop_and_wait(proc, sig, "report", 1.5)
    assert err.strip().splitlines()[-1] == "interrupted"
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != "records.jsonl"}
    assert after == before  # nothing half-written, nothing left behind


def test_a_stop_while_the_requests_are_made_sends_none_of_them(start_sim: StartSim, tmp_path: Path) -> None:
    """Ctrl-C while a large cell's bodies are made: the run ends there, without opening the cell's
    window (no request sent, no sample taken, no progress bar for it)."""
    base_url = start_sim(ttft_ms=2, itl_ms=0.5)
    told: list[str] = []

    class Interrupting(QuietObserver):
        def preparing(self, cell: Cell, made: int, total: int, cells: int) -> None:
            told.append(f"making {made}/{total} of cell {cell.index + 1}/{cells}")
            if len(told) == 2:
                os.kill(os.getpid(), signal.SIGINT)  # heard by the run's own handler, as from a terminal

        def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
            told.append("window")

    sc = parse_scenario({"name": "stop-making", "target": {"base_url": base_url},
                         "workload": {"num_prompts": 40_000, "input_tokens": 8, "output_tokens": 4},
                         "load": {"concurrency": 8, "warmup_requests": 2}})
    out = tmp_path / "run"
    assert execute(sc, out, observer=Interrupting()).interrupted
    assert told[:2] == ["making 2000/40000 of cell 1/1", "making 4000/40000 of cell 1/1"]
    assert "window" not in told  # (before: the window opened, sent nothing and closed)
    assert len(told) < 10  # heard within a few slices of 2,000 (of 20)
    records = list(read_records(out / RECORDS))
    assert records  # the warmup's
    assert all(r.warmup for r in records)  # and no measured request
    assert not (out / SAMPLES).exists() or (out / SAMPLES).read_bytes() == b""
