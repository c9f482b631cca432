"""llama.cpp (built from source by `loadgen setup llamacpp`) and loadgen's CTranslate2 engine,
serving the tiny model on CPU through the CLI as a user runs them; then the cross-engine
comparison of every engine installed here, rendered in the reference table's layout."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from loadgen.results.records import read_records
from tests.conftest import live_group_members
from tests.e2e.test_engines import ROOT, assert_exact_usage, chunks_read_in_compiled_code, loadgen, popen, scenario
from tests.helpers.leftovers import engine_shared_memory, left_of

pytestmark = pytest.mark.engines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def serve_and_run(tmp_path: Path, *serve_args: str, per_cell: int, exact_chunks: bool = True,
                  read_chunks: bool = False) -> str:
    """`loadgen serve tiny ARGS`, two cells of ``per_cell`` requests (concurrency 4, then 8)
    against it, then Ctrl-C; returns what the ready line said. Not one request may fail, and
    nothing of the engine may outlive the Ctrl-C: no process, no shared memory. ``read_chunks``:
    the engine's chunks are read by the compiled chunk reading too."""
    port = free_port()
    serve = popen("serve", "tiny", *serve_args, "--port", str(port), "--log", str(tmp_path / "engine.log"))
    try:
        assert serve.stdout is not None
        ready = serve.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in ready, ready + (tmp_path / "engine.log").read_text()[-3000:]
        engine = subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True, text=True).stdout.split()
        shared = set().union(*(engine_shared_memory(int(p)) for p in engine if int(p) != serve.pid))
        path = scenario(tmp_path, f"""
workload: {{num_prompts: {per_cell}, input_tokens: 64, output_tokens: 32}}
load: {{concurrency: [4, 8], warmup_requests: 1}}
""")
        run_dir = tmp_path / "run"
        proc = loadgen("run", str(path), "--base-url", f"http://127.0.0.1:{port}/v1", "--out", str(run_dir))
        assert proc.returncode == 0, proc.stderr
        summary = orjson.loads((run_dir / "summary.json").read_bytes())
        assert [c["metrics"]["completed"] for c in summary["cells"]] == [per_cell, per_cell]
        recs = list(read_records(run_dir / "records.jsonl"))
        assert [r for r in recs if r.error is not None] == []  # not one request lost, warmups included
        if read_chunks:
            # (llama.cpp holds back a token that is not yet whole UTF-8: fewer chunks than tokens)
            chunks_read_in_compiled_code(f"http://127.0.0.1:{port}/v1", least=2)
        if exact_chunks:
            assert_exact_usage(run_dir, 64, 32, 2 * per_cell)
        else:
            # llama.cpp holds back a token whose bytes are not yet whole UTF-8 (frequent with the
            # tiny model's random tokens) and sends no usage per chunk: usage is exact, and what
            # the chunks miss is reported as the discrepancy
            measured = [r for r in recs if not r.warmup]
            assert {(r.prompt_tokens, r.output_tokens, r.token_count_source) for r in measured} == {(64, 32, "usage")}
            assert all(sum(r.chunk_tokens) <= 32 for r in measured)
            for cell in summary["cells"]:
                missing = sum(32 - sum(r.chunk_tokens) for r in measured if r.cell == cell["cell"])
                assert cell["metrics"]["chunk_token_discrepancy"]["tokens"] == missing
    finally:
        serve.send_signal(signal.SIGINT)
        _, stderr = serve.communicate(timeout=60)
    assert serve.returncode == 0, stderr
    assert live_group_members(serve.pid) == []
    left = subprocess.run(["pgrep", "-f", f"--port {port}"], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    assert left_of(shared, serve.pid) == []  # its shared memory and its temporary directory
    return ready


def test_llamacpp_serves_the_tiny_model_with_its_defaults(llamacpp_built: None, tmp_path: Path) -> None:
    # llama-server closes the connection after every streamed answer: 300 requests, none lost
    ready = serve_and_run(tmp_path, "--backend", "llamacpp", per_cell=150, exact_chunks=False, read_chunks=True)
    assert "llamacpp" in ready
    assert "f16.gguf" in (tmp_path / "engine.log").read_text()  # no --quant: the checkpoint's precision


def test_llamacpp_q8_0_serves_the_tiny_model(llamacpp_built: None, tmp_path: Path) -> None:
    serve_and_run(tmp_path, "--backend", "llamacpp", "--quant", "q8_0", "--slots", "4", per_cell=20,
                  exact_chunks=False)
    assert "q8_0.gguf" in (tmp_path / "engine.log").read_text()


def test_ctranslate2_serves_the_tiny_model_with_its_defaults(tmp_path: Path) -> None:
    ready = serve_and_run(tmp_path, "--backend", "ctranslate2", per_cell=50)
    assert "loadgen-ctranslate2" in ready


REFERENCE_HEADERS = "| Software | Settings | Avg Tok/s | Max Mem | Speed X | Max mem % | Notes |"


def test_engine_compare_on_cpu(llamacpp_built: None, vllm_cpu: None, tmp_path: Path) -> None:
    run_dir = tmp_path / "engines"
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", "scenarios/engine-compare.yaml", "--out", str(run_dir),
         "--set", "workload.output_tokens=128"],
        capture_output=True, text=True, timeout=1500, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    by = {(c["server"]["backend"], c["server"].get("quant"), c["server"].get("tp"), c["server"].get("attn"),
           c["server"].get("load_in"), c["server"].get("grad_mode")): c for c in summary["cells"]}
    measured = {k[:2] for k, c in by.items() if c["status"] == "done"}
    print("\nmeasured:", sorted(measured))
    for engine in ("transformers", "vllm", "llamacpp", "ctranslate2"):
        assert any(e == engine for e, _ in measured), (engine, proc.stderr[-3000:])
    assert {q for e, q in measured if e == "llamacpp"} == {"f16", "q8_0", "q4_k_m"}
    skipped = [c for c in summary["cells"] if c["status"] == "skipped"]
    # no GPU here: MLC, ExLlamaV2, flash-attention, bitsandbytes and vLLM over 2 GPUs are skipped, with why
    assert {c["server"]["backend"] for c in skipped} >= {"mlc", "exllamav2"}
    assert all(c["reason"] for c in skipped)
    assert not [c for c in summary["cells"] if c["status"] == "failed"], proc.stderr[-3000:]
    assert "skipped" in proc.stderr

    table = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run_dir), "--table", "compare",
                            "--format", "md"], capture_output=True, text=True, cwd=ROOT)
    assert table.returncode == 0, table.stderr
    lines = [x for x in table.stdout.splitlines() if x.startswith("|")]
    print(table.stdout)
    assert " ".join(lines[0].split()) == REFERENCE_HEADERS  # the reference table's layout
    baseline = lines[2].split("|")
    assert baseline[1].strip() == "HF Transformers"
    assert baseline[2].strip().startswith("Baseline (FP32)")
    assert baseline[5].strip() == "1.00"  # Speed X of the first row
    softwares = {row.split("|")[1].strip() for row in lines[2:]}
    assert {"HF Transformers", "vLLM", "llama.cpp", "CTranslate2", "MLC LLM", "ExLlamaV2"} <= softwares
    # a measured row has figures; a skipped one says why in its notes
    for row in lines[2:]:
        cols = [c.strip() for c in row.split("|")[1:-1]]
        if cols[0] in ("MLC LLM", "ExLlamaV2"):
            assert cols[2] == ""
            assert "skipped" in cols[6]
        elif cols[0] in ("llama.cpp", "CTranslate2"):
            assert float(cols[2]) > 0
            assert float(cols[4]) > 0
    # the run itself printed the comparison too
    assert REFERENCE_HEADERS.split(" |")[0] in proc.stdout


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGKILL])
def test_loadgen_serve_hung_up_or_killed_leaves_no_engine(tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port()
    serve = popen("serve", "tiny", "--backend", "ctranslate2", "--quant", "int8", "--port", str(port),
                  "--log", str(tmp_path / "engine.log"))
    assert serve.stdout is not None
    ready = serve.stdout.readline()
    assert f"http://127.0.0.1:{port}/v1" in ready, (tmp_path / "engine.log").read_text()[-3000:]
    engine = subprocess.run(["pgrep", "-f", f"ct2serve.*--port {port}"], capture_output=True, text=True)
    pids = [int(p) for p in engine.stdout.split()]
    assert pids
    serve.send_signal(sig)
    serve.communicate(timeout=60)
    if sig == signal.SIGHUP:
        assert serve.returncode == 0  # stopped as Ctrl-C stops it
    deadline = time.monotonic() + 30
    while any(live_group_members(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if live_group_members(p)] == []
