"""Exit codes that never hide a failure: ``bench serve`` follows ``loadgen run`` (3 when no
request succeeded), and a run whose streams all ended without a token is not a success."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import StartSim
from tests.helpers.rawserver import MODELS_ANSWER, RawServer, is_models

ROOT = Path(__file__).parents[2]


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
    class Empty(RawServer):  # every stream a 200 that ends at once: [DONE], no token
        def serve(self, conn: socket.socket) -> None:
            empty = b"data: [DONE]\n\n"
            while head := conn.recv(65536):
                conn.sendall(MODELS_ANSWER if is_models(head) else
                             b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
                             % (len(empty), empty))

    server = Empty()
    try:
        proc = loadgen("run", "--base-url", server.base_url, "--num-prompts", "3",
                       "--set", "workload.prompt=random-tokens", "--set", "load.warmup_requests=0",
                       "--out", str(tmp_path / "run"))
    finally:
        server.close()
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no request streamed a token (3 streams ended without one)" in proc.stderr
