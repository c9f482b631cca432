"""`loadgen bench serve` with the vLLM flags that change how it talks to the server:
--insecure (a self-signed https server), --request-id-prefix (X-Request-Id on each request),
--ready-check-timeout-sec (waits for a server that is not up yet); and vLLM's layout without
--save-result (no file, no run directory), with the client-queueing sections when asked."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadgen.scenario.serve import SimOptions
from loadgen.servers.sim import SimApp
from tests.conftest import StartSim

ROOT = Path(__file__).parents[3]


def bench(*flags: str, cwd: Path = ROOT, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", "bench", "serve", "--model", "loadgen-sim", "--random-input-len", "8",
         "--random-output-len", "4", "--disable-tqdm", *flags],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recording:
    """The simulator as an ASGI app, keeping each completion request's headers."""

    def __init__(self) -> None:
        self.app = SimApp(SimOptions(ttft_ms=2, itl_ms=1))
        self.heads: list[dict[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            self.heads.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


@pytest.fixture
def tls_sim(tmp_path: Path) -> Iterator[tuple[str, Recording]]:
    """The simulator behind https with a self-signed certificate, on a free port."""
    import uvicorn

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    port = free_port()
    rec = Recording()
    server = uvicorn.Server(uvicorn.Config(rec, host="127.0.0.1", port=port, ssl_keyfile=str(key),
                                           ssl_certfile=str(cert), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the https simulator did not start"
        time.sleep(0.05)
    yield f"https://127.0.0.1:{port}", rec
    server.should_exit = True
    thread.join(10)


def test_insecure_takes_a_self_signed_server_and_the_prefix_names_each_request(
    tls_sim: tuple[str, Recording], tmp_path: Path,
) -> None:
    url, rec = tls_sim
    refused = bench("--base-url", url, "--num-prompts", "2", cwd=tmp_path)
    assert refused.returncode != 0
    assert "certificate" in refused.stderr.lower(), refused.stderr
    assert rec.heads == []  # not one request went to a server whose certificate was not checked

    proc = bench("--base-url", url, "--num-prompts", "5", "--insecure", "--request-id-prefix", "bench-x-",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Successful requests:                     5" in proc.stdout
    # the five measured requests by number; the two that calibrate text lengths before them, as warmups
    assert sorted(h["x-request-id"] for h in rec.heads) == [
        *(f"bench-x-{i}" for i in range(5)), "bench-x-warmup1", "bench-x-warmup2"]


def test_the_ready_check_waits_for_a_server_that_starts_late(start_sim: StartSim, tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
         "--model", "loadgen-sim", "--random-input-len", "8", "--random-output-len", "4", "--num-prompts", "3",
         "--disable-tqdm", "--ready-check-timeout-sec", "60"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        time.sleep(3)
        assert proc.poll() is None, proc.communicate()  # still waiting: nothing listens yet
        start_sim(ttft_ms=2, itl_ms=1, port=port)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"waiting up to 60 s for http://127.0.0.1:{port}/v1 to answer" in err
    assert "Successful requests:                     3" in out


def test_the_ready_check_gives_up_after_its_timeout_in_one_line(tmp_path: Path) -> None:
    port = free_port()
    t0 = time.monotonic()
    proc = bench("--base-url", f"http://127.0.0.1:{port}", "--num-prompts", "2", "--ready-check-timeout-sec", "3",
                 cwd=tmp_path)
    assert proc.returncode != 0
    assert time.monotonic() - t0 >= 3
    assert "did not answer within --ready-check-timeout-sec 3" in proc.stderr.strip().splitlines()[-1]


def test_without_save_result_nothing_is_written_and_queueing_is_printed(start_sim: StartSim, tmp_path: Path) -> None:
    url = start_sim(ttft_ms=20, itl_ms=5)
    cwd, scratch = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    scratch.mkdir()
    proc = bench("--base-url", url.removesuffix("/v1"), "--num-prompts", "12", "--max-concurrency", "2",
                 "--request-rate", "100",
                 "--percentile-metrics", "ttft,e2el,client_queue_time,e2el_including_client_queue", cwd=cwd,
                 TMPDIR=str(scratch))
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == []
    assert list(scratch.iterdir()) == []  # the scratch run directory is gone too  # as vLLM: no result file, no run directory
    assert "no run directory kept" in proc.stderr
    # where its requests differ from vllm bench serve's, said before the run
    assert "each request also asks for continuous_usage_stats" in proc.stderr
    assert "2 requests of 1 output token go first" in proc.stderr
    out = proc.stdout
    assert "Request rate configured (RPS):           100.00" in out
    assert "Maximum request concurrency:             2" in out
    assert "Peak concurrent requests:                2" in out  # never more than the cap
    for header in ("Client-side Queueing", "Queue-inclusive End-to-end Latency"):
        assert header in out

    def mean(label: str) -> float:
        return float(next(line for line in out.splitlines() if line.startswith(f"Mean {label} (ms):")).split()[-1])

    # 12 requests due within 0.12 s through 2 slots of ~35 ms each: most wait for a slot
    assert mean("Client Queue Time") > 10
    assert mean("E2EL incl. Client Queue") == pytest.approx(mean("E2EL") + mean("Client Queue Time"), abs=0.02)


def test_repeats_print_each_result_and_the_means_with_intervals(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1).removesuffix("/v1")
    proc = bench("--base-url", base_url, "--num-prompts", "8", "--max-concurrency", "2", "--repeats", "3",
                 "--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # vLLM's block for each repeat, then the repeats' means with their intervals
    assert [f"repeat {k} of 3" in proc.stdout for k in (1, 2, 3)] == [True] * 3
    assert proc.stdout.count("Successful requests:") == 3
    assert " ± " in proc.stdout
    # the result file: one JSON document per repeat, a line each (vLLM's --append-result layout)
    documents = [json.loads(line) for line in (tmp_path / "r.json").read_text().splitlines()]
    assert [d["completed"] for d in documents] == [8, 8, 8]
