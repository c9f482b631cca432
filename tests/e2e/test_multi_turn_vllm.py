"""Multi-turn sessions on real vLLM (CPU build): its own per-answer cached-token counts show the
history served from its prefix cache from the second turn on, while random prompts share none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines

SCENARIO = """
name: turns
target: {{api: chat}}
workload: {{input_tokens: 32, output_tokens: 16, {extra}}}
load: {{concurrency: 2, warmup_requests: 1}}
"""


def run(base_url: str, tmp_path: Path, name: str, extra: str) -> dict[str, object]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SCENARIO.format(extra=extra))
    done = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--base-url", base_url,
                           "--out", str(tmp_path / name)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, object] = json.loads((tmp_path / name / "summary.json").read_text())
    return summary


def test_turns_hit_the_prefix_cache_and_random_prompts_do_not(vllm_engine: str, tmp_path: Path) -> None:
    summary = run(vllm_engine, tmp_path, "mt", "num_prompts: 4, multi_turn: {turns: 3, system_tokens: 256}")
    metrics = summary["cells"][0]["metrics"]  # type: ignore[index]
    turns = metrics["turns"]
    print("\nprefix-cache hit rate per turn (vLLM's cached_tokens):",
          [round(t["prefix_cache_hit_rate"], 3) for t in turns])
    assert [t["turn"] for t in turns] == [0, 1, 2]
    assert turns[0]["prefix_cache_hit_rate"] < 0.1
    assert all(t["prefix_cache_hit_rate"] > 0.5 for t in turns[1:]), turns
    random_prompts = run(vllm_engine, tmp_path, "rnd", "num_prompts: 8")
    cell = random_prompts["cells"][0]  # type: ignore[index]
    print("random prompts, server prefix-cache hit rate:", cell["server_prefix_cache_hit_rate"])
    assert cell["server_prefix_cache_hit_rate"] < 0.05
