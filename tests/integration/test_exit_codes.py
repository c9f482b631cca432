"""Exit codes that never hide a failure: ``bench serve`` follows ``loadgen run`` (3 when no
request succeeded), and a run whose streams all ended without a token is not a success."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.conftest import StartSim

ROOT = Path(__file__).parents[2]
MODELS = b'{"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "test"}]}'


def loadgen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=180,
                          cwd=ROOT, check=False)


def test_bench_serve_exits_3_when_every_request_failed(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=2, itl_ms=1, faults={"http_500": 1.0})
    proc = loadgen("bench", "serve", "--base-url", url.removesuffix("/v1"), "--model", "loadgen-sim",
                   "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "2",
                   "--num-prompts", "4", "--save-result", "--result-dir", str(tmp_path), "--out", str(tmp_path / "b"))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no request succeeded")
    # what happened is still written down: vLLM's result and the run directory
    assert list(tmp_path.glob("*.json"))
    assert (tmp_path / "b" / "records.jsonl").stat().st_size > 0


def test_a_run_whose_streams_carry_no_token_exits_3(tmp_path: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    empty = b"data: [DONE]\n\n"

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    def answer(conn: socket.socket) -> None:
        with conn:
            while head := conn.recv(65536):
                if b"/models" in head.split(b"\r\n")[0]:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
                else:  # a 200 event stream that ends at once
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(empty), empty))

    threading.Thread(target=serve, daemon=True).start()
    try:
        proc = loadgen("run", "--base-url", f"http://127.0.0.1:{port}/v1", "--num-prompts", "3",
                       "--set", "workload.prompt=random-tokens", "--set", "load.warmup_requests=0",
                       "--out", str(tmp_path / "run"))
    finally:
        sock.close()
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no request streamed a token (3 streams ended without one)" in proc.stderr
