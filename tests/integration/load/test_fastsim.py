"""benchmarks/fastsim/fastsim.c, the ground truth of the client-capacity benchmark, holds the
contract `loadgen sim` holds: built here, measured by loadgen's client, its tokens come at
ttft + i * itl with exact usage, and its own /stats (the true send times) agree."""

from __future__ import annotations

import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from loadgen.load.run import execute
from loadgen.scenario.loader import parse_scenario
from loadgen.servers.launch import free_port

SOURCE = Path(__file__).resolve().parents[3] / "benchmarks" / "fastsim" / "fastsim.c"
TTFT_MS, ITL_MS, OUTPUT, PROMPTS = 20, 5, 16, 12


def start_fastsim(tmp_path: Path, ttft_us: int, itl_us: int, threads: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    """fastsim built here and ready: (its process, its root URL)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build benchmarks/fastsim/fastsim.c")
    exe = tmp_path / "fastsim"
    subprocess.run([cc, "-O2", "-pthread", "-Wall", "-Werror", "-o", str(exe), str(SOURCE)], check=True)
    port = free_port()
    proc = subprocess.Popen([str(exe), str(port), str(ttft_us), str(itl_us), str(threads)])
    root = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(root + "/health", timeout=1, trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    return proc, root


def run_against(root: str, tmp_path: Path, prompts: int, concurrency: int) -> dict[str, Any]:
    """``loadgen run``'s metrics for ``prompts`` requests of ``OUTPUT`` tokens at ``concurrency``,
    fastsim's counts reset first."""
    httpx.get(root + "/stats?reset=1", trust_env=False)
    sc = parse_scenario({
        "name": "fastsim", "target": {"base_url": root + "/v1", "api": "completions"},
        "workload": {"num_prompts": prompts, "input_tokens": 32, "output_tokens": OUTPUT, "prompt": "token-ids"},
        "load": {"concurrency": concurrency, "warmup_requests": 0},
    })
    return dict(execute(sc, tmp_path / "run").summary.to_dict()["cells"][0]["metrics"])


def test_fastsim_builds_and_holds_the_simulator_contract(tmp_path: Path) -> None:
    proc, root = start_fastsim(tmp_path, TTFT_MS * 1000, ITL_MS * 1000)
    try:
        m = run_against(root, tmp_path, PROMPTS, 2)
        stats = httpx.get(root + "/stats", trust_env=False).json()
    finally:
        proc.terminate()
        proc.wait(10)
    assert (m["completed"], m["failed"]) == (PROMPTS, 0)
    assert m["output_tokens_total"] == PROMPTS * OUTPUT == stats["tokens"]
    assert m["token_count_source"] == "usage"
    assert m["output_tokens_short"] == 0
    # the server's true times are the contract, within how late its own sends were on this
    # machine at the time (its /stats measure that too: a busy core wakes it late); the client
    # sees them within its own delay
    late = stats["late_ms"]["p99"]
    assert stats["ttft_ms"]["p50"] == pytest.approx(TTFT_MS, abs=1.0 + late)
    assert stats["itl_ms"]["p50"] == pytest.approx(ITL_MS, abs=0.5 + late)
    # one true TPOT a request (its last token less its first, over its tokens less one)
    assert stats["tpot_ms"]["count"] == PROMPTS
    assert stats["tpot_ms"]["p50"] == pytest.approx(ITL_MS, abs=0.5 + late)
    assert m["tpot_s"]["p50"] * 1e3 == pytest.approx(stats["tpot_ms"]["p50"], abs=0.5)
    assert m["ttft_s"]["p50"] * 1e3 == pytest.approx(stats["ttft_ms"]["p50"], abs=3.0)
    assert m["itl_s"]["p50"] * 1e3 == pytest.approx(stats["itl_ms"]["p50"], abs=1.0)


def test_fastsim_threads_serve_one_port_and_its_stats_merge_them(tmp_path: Path) -> None:
    # the benchmark's server for more client cores than one server core outruns: two threads on
    # the port, the kernel spreading 32 connections over them (all on one: a chance of 2^-31),
    # and /stats counting every request, token and true time once, whichever thread answers it
    prompts = 64
    proc, root = start_fastsim(tmp_path, TTFT_MS * 1000, ITL_MS * 1000, threads=2)
    try:
        m = run_against(root, tmp_path, prompts, 32)
        stats = httpx.get(root + "/stats?reset=1", trust_env=False).json()
        after = httpx.get(root + "/stats", trust_env=False).json()
    finally:
        proc.terminate()
        proc.wait(10)
    assert (m["completed"], m["failed"]) == (prompts, 0)
    assert len(stats["thread_requests"]) == 2
    assert sum(stats["thread_requests"]) == stats["requests"] == prompts
    assert min(stats["thread_requests"]) > 0
    assert stats["tokens"] == m["output_tokens_total"] == prompts * OUTPUT
    assert stats["ttft_ms"]["count"] == stats["tpot_ms"]["count"] == prompts
    assert stats["itl_ms"]["count"] == prompts * (OUTPUT - 1)
    assert stats["itl_ms"]["p50"] == pytest.approx(ITL_MS, abs=0.5 + stats["late_ms"]["p99"])
    # a reset clears every thread's samples
    assert (after["requests"], after["tokens"], after["thread_requests"]) == (0, 0, [0, 0])
    assert after["itl_ms"] == {"count": 0}


def test_fastsim_past_its_capacity_still_reads_new_requests(tmp_path: Path) -> None:
    """A token due every microsecond on each of 8 streams is far past what one thread sends: a
    request sent meanwhile (here GET /stats, answered as soon as it is read) is read within a
    step, not once the streams have ended (as an engine takes new requests in at every step;
    before, the server kept finding tokens due and read nothing until the load fell, so the
    benchmark's rows past its capacity counted that wait in the client's TTFT error)."""
    streams, tokens = 8, 40_000
    proc, root = start_fastsim(tmp_path, 1000, 1)
    port = int(root.rsplit(":", 1)[1])
    body = b'{"model": "m", "prompt": "hi", "max_tokens": %d, "stream": true}' % tokens
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(streams)]
    ended: list[int] = []

    def drain() -> None:
        with selectors.DefaultSelector() as sel:
            for s in socks:
                sel.register(s, selectors.EVENT_READ)
            tails = {s: b"" for s in socks}
            while len(ended) < streams:
                for key, _ in sel.select(timeout=30):
                    s = key.fileobj
                    assert isinstance(s, socket.socket)
                    data = s.recv(1 << 20)
                    tails[s] = (tails[s] + data)[-16:]
                    if not data or tails[s].endswith(b"\r\n0\r\n\r\n"):
                        sel.unregister(s)
                        ended.append(1)

    try:
        for s in socks:
            s.sendall(request)
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        time.sleep(0.3)
        stats = httpx.get(root + "/stats", timeout=60, trust_env=False).json()
        streams_ended_first = len(ended)
        reader.join(120)
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(10)
    assert not reader.is_alive()
    assert stats["requests"] == streams
    # answered while the streams were still sending: fewer tokens sent than they asked for
    assert stats["tokens"] < streams * tokens
    assert streams_ended_first == 0


@pytest.mark.alone  # the reference clients' TTFT within 3 ms: a crowded machine delays them more
@pytest.mark.parametrize("client", ["refclient", "pyfloor"])
def test_the_benchmarks_reference_clients_count_what_fastsim_sent(tmp_path: Path, client: str) -> None:
    # the floors the capacity benchmark holds loadgen against (in C, and in Python with no
    # parsing) count every request, token and gap the server sent, and time them as it did
    streams, per_stream = 4, 3
    if client == "refclient":
        exe = tmp_path / "refclient"
        subprocess.run([shutil.which("cc") or "gcc", "-O2", "-Wall", "-Werror", "-o", str(exe),
                        str(SOURCE.with_name("refclient.c"))], check=True)
        argv = [str(exe)]
    else:
        argv = [sys.executable, str(SOURCE.with_name("pyfloor.py"))]
    proc, root = start_fastsim(tmp_path, TTFT_MS * 1000, ITL_MS * 1000)
    try:
        port = root.rsplit(":", 1)[1]
        done = subprocess.run([*argv, port, str(streams), str(per_stream), str(OUTPUT)], capture_output=True,
                              check=True, timeout=60)
        stats = httpx.get(root + "/stats", trust_env=False).json()
    finally:
        proc.terminate()
        proc.wait(10)
    out = orjson.loads(done.stdout)
    requests = streams * per_stream
    assert (out["requests"], out["tokens"]) == (requests, requests * OUTPUT) == (stats["requests"], stats["tokens"])
    assert (len(out["ttft_us"]), len(out["itl_us"]), len(out["tpot_us"])) == (
        requests, requests * (OUTPUT - 1), requests)
    assert sorted(out["tpot_us"])[requests // 2] / 1e3 == pytest.approx(stats["tpot_ms"]["p50"], abs=1.0)
    assert sorted(out["ttft_us"])[requests // 2] / 1e3 == pytest.approx(stats["ttft_ms"]["p50"], abs=3.0)
