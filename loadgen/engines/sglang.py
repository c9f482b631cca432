"""SGLang: ``python -m sglang.launch_server`` on this interpreter, with Prometheus metrics on."""

from __future__ import annotations

import sys

from loadgen.engines.engine import Engine, Image, missing_modules, modules_installed
from loadgen.engines.serving_flags import ServingFlags, parallel_settings, serving_args
from loadgen.engines.spec import EngineSpec
from loadgen.servers.launch import LaunchSpec

FLAGS = ServingFlags("--pp-size", "--mem-fraction-static", "--context-length", "--disable-cuda-graph",
                     "--json-model-override-args", ("--tool-call-parser",))


def command(spec: EngineSpec) -> LaunchSpec:
    head = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", spec.model.checkpoint,
        "--host", spec.host, "--port", str(spec.port), "--served-model-name", spec.served_name,
        "--tp", str(spec.tp),
    ]
    # --enable-cache-report: each answer's usage says how many prompt tokens came from the cache
    argv = serving_args(spec, head, FLAGS, ("--enable-metrics", "--enable-cache-report"))
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    return "SGLang is not installed: pip install 'sglang[all]'" if missing_modules("sglang") else None


IMAGE = Image("lmsysorg/sglang:v0.5.19-cu129", "SGLANG_IMAGE", ("python3", "-m", "sglang.launch_server"), 3,
              "/root/.cache/huggingface", 30000, ipc_host=True)

ENGINE = Engine(
    name="sglang", label="SGLang", command=command, hardware="NVIDIA GPU", install="pip install 'sglang[all]'",
    installed=lambda: modules_installed("sglang"), missing=missing,
    options=("kv_cache_dtype", "load_format", "tool_parser"),
    image=lambda spec: IMAGE,
    metrics={
        "running": ("sglang:num_running_reqs",), "waiting": ("sglang:num_queue_reqs",),
        "kv_cache_usage": ("sglang:token_usage",),
        # its radix cache's hit rate, as a gauge
        "prefix_cache_hit_rate": ("sglang:cache_hit_rate",),
        "prompt_tokens": ("sglang:prompt_tokens",), "generation_tokens": ("sglang:generation_tokens",),
        "ttft_s": ("sglang:time_to_first_token_seconds",), "tpot_s": ("sglang:time_per_output_token_seconds",),
        "itl_s": ("sglang:inter_token_latency_seconds",), "e2e_s": ("sglang:e2e_request_latency_seconds",),
    },
    preallocates=True, uses_eager=True, settings=parallel_settings,
)
