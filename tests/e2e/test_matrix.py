"""Matrix runs through the CLI: a reduced speed grid on two real engines with the published
tables rendered from it; a failed engine that does not stop the matrix; --resume after Ctrl-C."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import pytest

from loadgen.results.records import read_records
from loadgen.results.rundir import rebuild_summary
from tests.e2e.test_engines import engine_gone, loadgen, popen, scenario
from tests.helpers.reference import parse_grid

GRID = """
name: grid
kind: single-stream
serve: {model: tiny, backend: [transformers, vllm]}
workload: {num_prompts: 2, output_tokens: 64}
load: {warmup_requests: 1}
matrix:
  input_tokens: [16, 256]
"""


@pytest.mark.engines
def test_reduced_grid_on_two_engines_renders_the_published_tables(tmp_path: Path, vllm_cpu: None) -> None:
    run_dir = tmp_path / "grid"
    r = loadgen("run", str(scenario(tmp_path, GRID)), "--out", str(run_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    cells = summary["cells"]
    assert [(c["server"]["backend"], c["params"]["input_tokens"], c["status"]) for c in cells] == [
        ("transformers", 16, "done"), ("transformers", 256, "done"), ("vllm", 16, "done"), ("vllm", 256, "done"),
    ]
    # two engines, each launched once for its two input lengths, each stopped
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    assert [s["log"] for s in provenance["servers"]] == ["server-1.log", "server-2.log"]
    for server in provenance["servers"]:
        engine_gone({"server": server})
    records = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup]
    for cell in cells:
        mine = [r for r in records if r.cell == cell["cell"]]
        assert len(mine) == 2
        assert all(r.output_tokens == 64 and r.prompt_tokens == cell["params"]["input_tokens"] for r in mine)
        # speed = generated tokens / request time, averaged over the repeats
        speeds = [r.output_tokens / (r.done_at - r.sent_at) for r in mine]
        assert abs(cell["metrics"]["speed_tokens_per_s"]["mean"] - sum(speeds) / 2) < 1e-9
        assert cell["gpu_memory"] == {"available": False, "reason": "the engine runs on CPU"}
    # vLLM's own /metrics, scraped around each measured window: its token counters saw exactly our requests
    for cell in cells[2:]:
        server_side = cell["server_metrics"]
        assert server_side["scrapes"] >= 2
        assert server_side["generation_tokens"] == 2 * 64
        assert server_side["prompt_tokens"] == 2 * cell["params"]["input_tokens"]
        assert server_side["ttft_s"]["count"] == 2

    rst = loadgen("report", str(run_dir), "--table", "single-stream", "--format", "rst")
    assert rst.returncode == 0, rst.stderr
    blocks = [b for b in rst.stdout.split("\n\n") if b.startswith("+")]
    assert len(blocks) == 2  # one table per model and engine, as the documents
    for block, engine_cells in zip(blocks, (cells[:2], cells[2:]), strict=True):
        grid = parse_grid(block)
        assert grid.headers == (
            "Model", "Input Length", "Quantization", "GPU Num", "Speed(tokens/s)", "GPU Memory(GB)",
        )
        assert [row[:4] for row in grid.cells] == [("tiny-qwen2", "16", "Auto", "CPU"), ("", "256", "Auto", "CPU")]
        assert grid.open_borders == ((True, False, False, False, False, False),)  # the model cell is merged
        assert [row[4] for row in grid.cells] == [
            f"{c['metrics']['speed_tokens_per_s']['mean']:.2f}" for c in engine_cells
        ]
        assert [row[5] for row in grid.cells] == ["n/a (CPU)", "n/a (CPU)"]
    assert "-  tiny-qwen2 (Transformer)" in rst.stdout
    assert "-  tiny-qwen2 (vLLM)" in rst.stdout

    tput = loadgen("report", str(run_dir), "--table", "throughput", "--format", "rst")
    grid = parse_grid(next(b for b in tput.stdout.split("\n\n") if b.startswith("+")))
    # the rows differ by input length and engine: a column each, so that they can be told apart
    assert grid.headers == (
        "Model", "Quantization", "Input Length", "Engine", "# Prompts", "QPS", "Tokens/s", "Output Tokens/s",
    )
    assert [row[2:4] for row in grid.cells] == [("16", "transformers"), ("256", "transformers"), ("16", "vllm"),
                                                ("256", "vllm")]
    assert grid.cells[0][5] == f"{cells[0]['metrics']['request_throughput']:.2f}"

    cmp = loadgen("compare", str(run_dir), "--table", "cross-engine")
    assert cmp.returncode == 0, cmp.stderr
    lines = cmp.stdout.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == [
        "Software", "Settings", "Avg Tok/s", "Max Mem", "Speed X", "Max mem %", "Notes",
    ]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:] if not ln.startswith("|  ")]
    assert [r[0] for r in rows] == ["HF Transformers", "vLLM"]
    hf = sum(c["metrics"]["speed_tokens_per_s"]["mean"] for c in cells[:2]) / 2
    vl = sum(c["metrics"]["speed_tokens_per_s"]["mean"] for c in cells[2:]) / 2
    assert rows[0][1:5] == ["Baseline (Auto)", f"{hf:.2f}", "", "1.00"]
    assert rows[1][2:5] == [f"{vl:.2f}", "", f"{vl / hf:.2f}"]

    plot = loadgen("report", str(run_dir), "--plot")
    assert plot.returncode == 0, plot.stderr
    assert (run_dir / "speed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SIM_MATRIX = """
name: sims
serve: {{backend: sim}}
workload: {{num_prompts: {n}, input_tokens: 8, output_tokens: 20}}
load: {{warmup_requests: 0}}
matrix:
  - {{serve.sim.itl_ms: [5, 6]}}
  - {{backend: transformers, device: cpu, model: {broken}}}
  - {{serve.sim.itl_ms: 7}}
"""


@pytest.mark.engines
def test_a_failed_engine_is_recorded_and_the_matrix_goes_on(tmp_path: Path) -> None:
    (tmp_path / "broken").mkdir()  # a model directory with nothing in it: the engine exits at load
    path = scenario(tmp_path, SIM_MATRIX.format(n=3, broken=tmp_path / "broken"))
    run_dir = tmp_path / "run"
    r = loadgen("run", str(path), "--out", str(run_dir))
    assert r.returncode == 0, r.stderr[-3000:]
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert [c["status"] for c in summary["cells"]] == ["done", "done", "failed", "done"]
    failed = summary["cells"][2]
    assert failed["reason"].startswith("engine did not start: transformers exited with status")
    assert "cell 3 failed: engine did not start" in r.stderr
    # the simulator's configured inter-token latency comes back, per point
    itl = [c["metrics"]["itl_s"]["p50"] for c in summary["cells"] if c["status"] == "done"]
    assert [round(x * 1e3) for x in itl] == [5, 6, 7]
    # nothing left to do: a resume measures nothing again
    before = (run_dir / "records.jsonl").read_bytes()
    again = loadgen("run", str(path), "--resume", str(run_dir))
    assert again.returncode == 0, again.stderr[-2000:]
    assert (run_dir / "records.jsonl").read_bytes() == before


def test_resume_after_ctrl_c_finishes_without_redoing_finished_cells(tmp_path: Path) -> None:
    body = SIM_MATRIX.format(n=12, broken="x").replace("  - {backend: transformers, device: cpu, model: x}\n", "")
    path = scenario(tmp_path, body)
    run_dir = tmp_path / "run"
    proc = popen("run", str(path), "--out", str(run_dir))
    cells_log = run_dir / "cells.jsonl"
    records = run_dir / "records.jsonl"
    deadline = time.monotonic() + 60
    # stop once the second cell has measured a couple of requests
    measured_of_cell_1 = b'"cell":1,"warmup":false'
    while time.monotonic() < deadline and (records.read_bytes() if records.exists() else b"").count(measured_of_cell_1) < 2:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    first = [orjson.loads(x) for x in cells_log.read_bytes().splitlines()]
    assert [x["cell"] for x in first] == [0]
    partial = sum(1 for r in read_records(run_dir / "records.jsonl") if r.cell == 1 and not r.warmup)
    assert 0 < partial < 12

    r = loadgen("run", str(path), "--resume", str(run_dir))
    assert r.returncode == 0, r.stderr[-2000:]
    done = [orjson.loads(x) for x in cells_log.read_bytes().splitlines()]
    assert [(x["cell"], x["status"]) for x in done] == [(0, "done"), (1, "done"), (2, "done")]
    records_now = list(read_records(run_dir / "records.jsonl"))
    per_cell = [sum(1 for r in records_now if r.cell == i and not r.warmup) for i in range(3)]
    assert per_cell == [12, 12, 12]  # cell 0 not measured twice; cell 1's partial records set aside
    # each cell runs on its own simulator, whose text prompts two calibration probes measure first
    assert [sum(1 for r in records_now if r.cell == i and r.warmup) for i in range(3)] == [2, 2, 2]
    aside = list(read_records(run_dir / "records.set-aside.jsonl"))
    assert sum(not r.warmup for r in aside) == partial
    assert all(r.cell == 1 for r in aside)
    # the run says it was continued, in its summary and its report, and re-derives it so
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["resumed"] == 1
    assert "**Resumed**: the run was continued once after a stop" in (run_dir / "report.md").read_text()
    assert rebuild_summary(run_dir).resumed == 1
    # a resume with another scenario is refused
    other = loadgen("run", str(path), "--resume", str(run_dir), "--set", "workload.num_prompts=5")
    assert other.returncode == 2
    assert "scenario differs" in other.stderr
