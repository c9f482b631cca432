"""SIGINT, SIGTERM and SIGHUP end a run within a second in the phases before the load, against
a server that accepts connections and then never answers (or answers a byte a second)."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.load.sidecall import SideCallError, side_call, side_client
from tests.rawserver import MODELS_ANSWER, RawServer, is_models

ROOT = Path(__file__).parents[3]
class Stubborn(RawServer):
    """``silent`` reads a request and never answers; ``drip`` sends its status line a byte a
    second; ``models`` answers the model list and is silent on the rest."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        head = conn.recv(65536)
        if self.mode == "models" and is_models(head):
            conn.sendall(MODELS_ANSWER)
            head = conn.recv(65536)
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
    time.sleep(3.0)  # well into the phase: the interpreter started, the server holds the call
    assert proc.poll() is None, f"ended before the signal in the {phase}: {proc.communicate()}"
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{sig.name} ignored during the {phase}")
    took = time.monotonic() - sent
    assert took < 1.5, f"{sig.name} took {took:.1f} s during the {phase}"
    assert proc.returncode == 130, err
    assert "Traceback" not in err
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
