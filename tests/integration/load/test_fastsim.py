"""benchmarks/fastsim/fastsim.c, the ground truth of the client-capacity benchmark, holds the
contract `loadgen sim` holds: built here, measured by loadgen's client, its tokens come at
ttft + i * itl with exact usage, and its own /stats (the true send times) agree."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from loadgen.load.run import execute
from loadgen.scenario.loader import parse_scenario
from loadgen.servers.launch import free_port

SOURCE = Path(__file__).resolve().parents[3] / "benchmarks" / "fastsim" / "fastsim.c"
TTFT_MS, ITL_MS, OUTPUT, PROMPTS = 20, 5, 16, 12


def test_fastsim_builds_and_holds_the_simulator_contract(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build benchmarks/fastsim/fastsim.c")
    exe = tmp_path / "fastsim"
    subprocess.run([cc, "-O2", "-Wall", "-Werror", "-o", str(exe), str(SOURCE)], check=True)
    port = free_port()
    proc = subprocess.Popen([str(exe), str(port), str(TTFT_MS * 1000), str(ITL_MS * 1000)])
    root = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if httpx.get(root + "/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        httpx.get(root + "/stats?reset=1", trust_env=False)
        sc = parse_scenario({
            "name": "fastsim", "target": {"base_url": root + "/v1", "api": "completions"},
            "workload": {"num_prompts": PROMPTS, "input_tokens": 32, "output_tokens": OUTPUT,
                         "prompt": "token-ids"},
            "load": {"concurrency": 2, "warmup_requests": 0},
        })
        m = execute(sc, tmp_path / "run").summary.to_dict()["cells"][0]["metrics"]
        stats = httpx.get(root + "/stats", trust_env=False).json()
    finally:
        proc.terminate()
        proc.wait(10)
    assert (m["completed"], m["failed"]) == (PROMPTS, 0)
    assert m["output_tokens_total"] == PROMPTS * OUTPUT == stats["tokens"]
    assert m["token_count_source"] == "usage"
    assert m["output_tokens_short"] == 0
    # the server's true times are the contract; the client sees them within its own delay
    assert stats["ttft_ms"]["p50"] == pytest.approx(TTFT_MS, abs=1.0)
    assert stats["itl_ms"]["p50"] == pytest.approx(ITL_MS, abs=0.5)
    assert m["ttft_s"]["p50"] * 1e3 == pytest.approx(TTFT_MS, abs=3.0)
    assert m["itl_s"]["p50"] * 1e3 == pytest.approx(ITL_MS, abs=1.0)
