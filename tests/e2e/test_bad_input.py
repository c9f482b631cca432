"""Bad input wherever a user types, and servers that cannot serve the scenario: one readable
line (the engine's log tail aside), the right exit code, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.servers.launch import free_port
from loadgen.servers.tiny import ensure_tiny
from tests.conftest import StartSim

ROOT = Path(__file__).parents[2]


def loadgen(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, check=False)


def one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(("text", "needle"), [
    ("serve: {backend: vllm, model: qwen9-1b}\n", "serve.model -> model 'qwen9-1b': not a catalogue alias"),
    ("workload: {prompt: {file: nope.jsonl}}\n", "workload.prompt.file -> no such file"),
    ("target: {base_url: 'localhost:8000'}\n", "target -> base_url must start with http:// or https://"),
    ("workload: {num_prompts: 0}\n", "workload.num_prompts -> Input should be greater than 0"),
    ("workload: {input_tokens: [128, -1]}\n", "workload.input_tokens -> must be a positive integer"),
    # a prompt of 300 million tokens built 2.6 GB before anyone could stop it
    ("workload: {input_tokens: 300000000}\n", "workload.input_tokens -> must be at most 10,000,000 (got 300000000)"),
    ("load: {abort_on_error_rate: 1.5}\n", "load.abort_on_error_rate -> Input should be less than or equal to 1"),
    ("serve: {backend: sim, sim: {faults: {meltdown: 0.1}}}\n", "unknown fault 'meltdown'"),
    ("load: [1, 2]\n", "load -> Input should be a valid dictionary"),
    # times past any run: a clear bound, not an overflow deep in the event loop
    ("target: {timeouts: {total_s: 1e300}}\n", "target.timeouts.total_s -> Input should be less than or equal to"),
    ("load: {duration_s: 1e300}\n", "load.duration_s -> Input should be less than or equal to 10000000"),
    # repeats, windows and their noise threshold
    ("load: {repeats: 0}\n", "load.repeats -> Input should be greater than or equal to 1 (got 0)"),
    ("load: {repeats: 3, search: {by: concurrency, slo: {ttft_ms: {p99: 100}}}}\n",
     "load -> a search measures again with search.confirm: drop load.repeats"),
    ("report: {window_s: 5, windows: 3}\n", "report -> give window_s or windows, not both"),
    ("report: {window_s: 0.000001}\n", "report.window_s -> Input should be greater than or equal to 0.01 (got 1e-06)"),
    ("report: {noisy_cv: -1}\n", "report.noisy_cv -> Input should be greater than 0 (got -1)"),
    # structured output and the APIs
    ("workload: {response_format: {type: json_schema}}\n",
     "workload.response_format -> type json_schema needs schema: the JSON Schema of the answer"),
    ("target: {headers: {X-Team: 'caf\u00e9 \u20ac'}}\n",  # Latin-1 goes through; the euro sign cannot
     "target -> header X-Team: it holds characters an HTTP header cannot carry (beyond Latin-1); encode or drop them"),
    ("target: {api: embeddings}\nworkload: {multi_turn: {turns: 2}}\n",
     "workload.multi_turn sends conversations: set target.api: chat (or responses)"),
    # a schema from someone else's file: checked, and never a reason to fetch anything
    ("workload: {response_format: {type: json_schema, schema: {$ref: 'http://169.254.169.254/x.json'}}}\n",
     "workload.response_format -> schema: $ref 'http://169.254.169.254/x.json' points outside the schema, and "
     "loadgen fetches nothing; put the definition under $defs and refer to it as #/$defs/NAME"),
    ("workload: {response_format: {type: json_schema, schema: {$ref: '#'}}}\n",
     "workload.response_format -> schema: its $ref leads back to itself without end"),
    ("workload: {response_format: {type: json_schema, schema: {type: 5}}}\n",
     "workload.response_format -> schema.type: not a JSON Schema (5 is not valid under any of the given schemas)"),
    ("workload: {response_format: {type: xml}}\n",
     "workload.response_format.type -> Input should be 'json_object' or 'json_schema' (got 'xml')"),
    ("target: {api: images}\n", "target.api -> Input should be 'completions', 'chat', 'responses' or 'embeddings'"),
    ("workload: {batch_size: 0}\n", "workload.batch_size -> Input should be greater than or equal to 1 (got 0)"),
    ("workload: {images: {count: 0}}\n", "workload.images.count -> Input should be greater than or equal to 1"),
])
def test_bad_scenario_files(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    line = one_line(loadgen("run", str(path), "--out", str(tmp_path / "run")), 2, needle)
    assert str(path) in line


def test_input_and_output_beyond_the_models_context(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "serve: {backend: sim, sim: {max_model_len: 128}}\n"
        "workload: {num_prompts: 4, input_tokens: 100, output_tokens: 50}\n"
    )
    one_line(loadgen("run", str(path), "--out", str(tmp_path / "run")), 2,
             "100 + 50 = 150 exceeds the model's context of 128 tokens")


def test_a_wrong_base_url_path_is_one_line_exit_3(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim()
    path = tmp_path / "s.yaml"
    path.write_text("target: {model: m}\nworkload: {num_prompts: 4, input_tokens: 8, output_tokens: 4}\n")
    wrong = base_url.removesuffix("/v1") + "/v2"
    one_line(loadgen("run", str(path), "--base-url", wrong, "--out", str(tmp_path / "run")), 3,
             "POST /completions: HTTP 404", "usually .../v1")


def test_an_html_server_is_one_line_exit_3(tmp_path: Path) -> None:
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text("<html><body>It works!</body></html>")
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                           cwd=tmp_path / "www", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        path = tmp_path / "s.yaml"
        path.write_text("workload: {num_prompts: 4, input_tokens: 8, output_tokens: 4}\n")
        for _ in range(50):
            probe = loadgen("run", str(path), "--base-url", f"http://127.0.0.1:{port}/v1", "--out",
                            str(tmp_path / f"run{_}"))
            if "Connection refused" not in probe.stderr:
                break
        one_line(probe, 3, "/models: cannot list models", "is an OpenAI-compatible server running there?")
        # with the model named there is no lookup: the first request finds no OpenAI endpoint
        one_line(loadgen("run", str(path), "--base-url", f"http://127.0.0.1:{port}/v1", "--set", "target.model=m",
                         "--out", str(tmp_path / "named")), 3, "POST /completions: HTTP 501")
    finally:
        web.terminate()
        web.wait(timeout=10)


@pytest.mark.engines
def test_chat_to_a_model_without_a_chat_template(tmp_path: Path) -> None:
    model = tmp_path / "no-template"
    shutil.copytree(ensure_tiny(), model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    path = tmp_path / "s.yaml"
    path.write_text(
        f"serve: {{backend: transformers, device: cpu, model: {model}}}\ntarget: {{api: chat}}\n"
        "workload: {num_prompts: 4, input_tokens: 16, output_tokens: 4}\n"
    )
    one_line(loadgen("run", str(path), "--out", str(tmp_path / "run")), 3,
             "POST /chat/completions: HTTP 400", "the model has no chat template: use target.api: completions")


@pytest.mark.parametrize(("args", "code", "needle"), [
    (["serve", "qwen2.5-7b", "--tp", "3", "--gpus", "0,1", "--dry-run"], 2, "--tp 3 --gpus 0,1"),
    (["serve", "qwen2.5-7b", "--quant", "int3", "--dry-run"], 2, "--quant 'int3'"),
    (["sim", "--fault", "stream_cut=2"], 2, "a rate is between 0 and 1"),
    (["sim", "--fault", "http_503=0.6", "--fault", "reset=0.6"], 2, "add up to more than 1"),
    (["report", "/nonexistent/run"], 2, "no such run directory"),
    # a GPU engine asked of a machine without one: where its launch can be had instead
    pytest.param(["serve", "qwen2-57b", "--tp", "2"], 3, "this engine needs GPUs: `loadgen serve ... --script` (or "
                 "`--dry-run`) prints the launch to run on a GPU host", marks=pytest.mark.skipif(
                     shutil.which("nvidia-smi") is not None, reason="a machine with GPUs launches it")),
])
def test_bad_command_lines(args: list[str], code: int, needle: str) -> None:
    one_line(loadgen(*args), code, needle)


def test_rows_of_chat_messages_sent_to_the_completions_api_are_refused_before_the_run(tmp_path: Path) -> None:
    rows = tmp_path / "chats.jsonl"
    rows.write_text('{"messages": [{"role": "user", "content": "hello"}]}\n' * 3)
    path = tmp_path / "s.yaml"
    path.write_text(f"name: chats\nworkload: {{dataset: {{kind: jsonl, path: {rows}}}, num_prompts: 3}}\n")
    one_line(loadgen("run", str(path), "--base-url", f"http://127.0.0.1:{free_port()}/v1", "--out",
                     str(tmp_path / "run")), 2,
             f"{rows}: its rows are chat messages, which target.api completions cannot send; set target.api: chat")
    assert not (tmp_path / "run").exists()


def test_a_port_out_of_range_is_refused_before_the_simulator_binds() -> None:
    proc = loadgen("sim", "--port", "-1")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "Invalid value for '--port': Input should be greater than or equal to 1" in " ".join(proc.stderr.split())
