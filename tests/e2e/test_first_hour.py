"""A newcomer's first hour on a machine without a GPU: the card's own scenario says once why it
cannot run here and prints the command that runs it on CPU; that command, pasted as printed,
measures all 1000 requests on vLLM's CPU build, saying where the engine start is on the way."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from loadgen.servers.gpus import gpu_count

pytestmark = pytest.mark.engines

ROOT = Path(__file__).parents[2]


@pytest.mark.usefixtures("vllm_cpu")
def test_a_gpu_scenario_without_gpus_gives_one_reason_and_a_command_that_runs(tmp_path: Path) -> None:
    if gpu_count():
        pytest.skip("this machine has a GPU: the scenario runs as written")
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    refused = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", "scenarios/throughput-1000.yaml", "--out", str(run_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert refused.returncode == 3, refused.stderr
    assert time.monotonic() - t0 < 60  # said before anything is launched
    assert refused.stderr.count("has no NVIDIA GPU") == 1, refused.stderr  # once, not per cell
    assert "starting" not in refused.stderr
    assert not run_dir.exists()
    lines = refused.stderr.strip().splitlines()
    assert lines[-2].startswith("error: scenarios/throughput-1000.yaml: it starts vllm qwen1.5-32b on 2 GPUs;")
    command = lines[-1].strip()
    assert command.startswith("loadgen run scenarios/throughput-1000.yaml --out ")

    # the command as printed (its first word is the loadgen on PATH; this test runs its own). It
    # keeps the scenario's workload, 1,000 prompts of 1,000 tokens; the test sends 100 of them
    # (the 1,000 took 50 s of the engines tier's time, and a count is not what is checked here)
    argv = shlex.split(command)
    assert not [a for a in argv if a.startswith("workload.")], command
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", *argv[1:], "--set", "workload.num_prompts=100"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said: list[float] = []
    assert proc.stderr is not None
    for line in proc.stderr:  # the engine start says where it is every few seconds
        if line.startswith("vllm starting:") or line.startswith("vllm ready"):
            said.append(time.monotonic() - start)
        if line.startswith("vllm ready"):
            break
    out, rest = proc.communicate(timeout=600)
    assert proc.returncode == 0, rest
    assert said
    gaps = [b - a for a, b in zip([0.0, *said], said, strict=False)]
    assert max(gaps) < 8, gaps  # every 5 s, with a margin for a busy machine
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    (cell,) = summary["cells"]
    assert cell["status"] == "done"
    assert cell["server"]["device"] == "cpu"
    assert cell["metrics"]["requests"] == 100
    assert cell["metrics"]["completed"] == 100, cell["metrics"]["failures_by_class"]
    assert cell["metrics"]["prompt_tokens_total"] == 100 * 1000  # the scenario's lengths, as sent
    row = next(line for line in out.splitlines() if line.startswith("| tiny"))
    qps = float(re.split(r"\s*\|\s*", row)[4])
    assert qps > 0


@pytest.mark.usefixtures("vllm_cpu")
def test_an_engine_that_dies_says_why_on_the_console(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "serve", "tiny", "--log", str(tmp_path / "vllm.log"), "--",
         "--no-such-engine-flag"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 3, proc.stderr
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
    # the engine's own reason, from its log, on the error line itself
    assert "exited with status" in error
    assert "--no-such-engine-flag" in error, error
