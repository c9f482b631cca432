"""llama.cpp's command line: ``llama-server`` (``$LOADGEN_LLAMA_SERVER``, else the one on
``PATH``, else the one ``loadgen setup llamacpp`` built) on a ``.gguf`` file: as given, or the
checkpoint converted (f16) and quantized (q8_0, q4_k_m, ...) into loadgen's cache."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.llamacpp_setup import built_tool
from loadgen.servers.spec import EngineSpec
from loadgen.servers.tiny import cache_root


def gguf_path(spec: EngineSpec) -> str:
    """A ``.gguf`` file as given, else the conversion of the Hugging Face checkpoint in the cache."""
    ckpt = spec.model.checkpoint
    if ckpt.endswith(".gguf"):
        return ckpt
    stem = Path(ckpt).name if Path(ckpt).is_absolute() else ckpt.replace("/", "--")
    kind = gguf_kind(spec)
    return str(cache_root() / "gguf" / f"{stem}-{kind}.gguf")


def gguf_kind(spec: EngineSpec) -> str:
    """The GGUF type a quantization names (full precision: f16, as the reference tables' rows)."""
    q = spec.model.quant
    if q in ("bf16", "fp16", "auto", "f16", "fp32"):
        return "f16"
    if q.startswith(("gptq", "awq", "fp8")):
        raise UsageError(f"--quant {q}: llama.cpp quantizes GGUF files itself; use f16, q8_0, q6_k, q5_k_m, "
                         "q4_k_m or q4_0")
    return q


def llama_server() -> str:
    built = built_tool("llama-server")
    return (os.environ.get("LOADGEN_LLAMA_SERVER") or shutil.which("llama-server")
            or str(built))


def llamacpp_command(spec: EngineSpec) -> LaunchSpec:
    """``llama-server`` with ``-np`` parallel slots, each of the full context, and ``--metrics``."""
    if spec.pp > 1:
        raise UsageError("--pp: llama.cpp splits layers over the GPUs given; use --gpus only")
    server = llama_server()
    length = spec.setting.max_model_len
    argv = [
        server, "-m", gguf_path(spec), "--host", spec.host, "--port", str(spec.port), "--alias", spec.served_name,
        "-np", str(spec.slots), "-c", str(length * spec.slots), "--metrics",
    ]
    if spec.cpus:
        argv += ["-t", str(len(spec.cpus))]  # one thread per core it was given
    if spec.device == "cuda":
        argv += ["-ngl", "999"]
        if len(spec.gpus) > 1:
            argv += ["--split-mode", "layer"]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s, "llamacpp")
