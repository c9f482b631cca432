"""llama.cpp's command line: ``llama-server`` from ``PATH`` (``$LOADGEN_LLAMA_SERVER`` names
another) on a ``.gguf`` file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec
from loadgen.servers.tiny import cache_root


def gguf_path(spec: EngineSpec) -> str:
    """A ``.gguf`` file as given, else the conversion of the Hugging Face checkpoint in the cache."""
    ckpt = spec.model.checkpoint
    if ckpt.endswith(".gguf"):
        return ckpt
    stem = Path(ckpt).name if Path(ckpt).is_absolute() else ckpt.replace("/", "--")
    kind = "f16" if spec.model.quant in ("bf16", "fp16", "auto") else spec.model.quant
    return str(cache_root() / "gguf" / f"{stem}-{kind}.gguf")


def llamacpp_command(spec: EngineSpec) -> LaunchSpec:
    """``llama-server`` with ``-np`` parallel slots, each of the full context, and ``--metrics``."""
    if spec.pp > 1:
        raise UsageError("--pp: llama.cpp splits layers over the GPUs given; use --gpus only")
    server = os.environ.get("LOADGEN_LLAMA_SERVER") or shutil.which("llama-server") or "llama-server"
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
