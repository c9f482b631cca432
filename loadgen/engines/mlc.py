"""MLC LLM: ``mlc_llm serve`` (OpenAI-compatible) on a model compiled to one of
MLC's weight formats (q0f16, q4f16_1, ...): a local directory, or mlc-ai's prebuilt
``HF://mlc-ai/NAME-FORMAT-MLC`` for a catalogued model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loadgen.engines.engine import Engine, program_installed
from loadgen.engines.spec import EngineSpec
from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec

PROGRAM = "mlc_llm"


def mlc_model(spec: EngineSpec) -> str:
    ckpt = spec.model.checkpoint
    if Path(ckpt).expanduser().exists() or ckpt.startswith("HF://"):
        return ckpt
    fmt = spec.model.quant if spec.model.quant.startswith("q") else "q0f16"
    return f"HF://mlc-ai/{ckpt.split('/')[-1]}-{fmt}-MLC"


def command(spec: EngineSpec) -> LaunchSpec:
    if spec.device != "cuda":
        raise UsageError("--backend mlc: loadgen runs MLC LLM on NVIDIA GPUs (--device cuda)")
    if spec.pp > 1:
        raise UsageError("--pp: MLC LLM shards tensors (--tp); pipeline parallelism is not offered")
    exe = os.environ.get("LOADGEN_MLC_LLM") or shutil.which(PROGRAM) or PROGRAM
    overrides = f"tensor_parallel_shards={spec.tp};max_num_sequence={spec.slots};" \
                f"context_window_size={spec.setting.max_model_len}"
    argv = [exe, "serve", mlc_model(spec), "--device", "cuda", "--mode", "server", "--host", spec.host,
            "--port", str(spec.port), "--overrides", overrides]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    exe = launch.argv[0]
    if shutil.which(exe) is None and not Path(exe).is_file():
        return (f"{exe!r} is not on PATH: pip install mlc-llm (see https://llm.mlc.ai/docs/install/mlc_llm.html), "
                "or set LOADGEN_MLC_LLM")
    return None


def installed() -> tuple[bool, str]:
    return program_installed(os.environ.get("LOADGEN_MLC_LLM") or PROGRAM, f"{PROGRAM} not on PATH")


ENGINE = Engine(
    name="mlc", label="MLC LLM", command=command, hardware="NVIDIA GPU",
    install="pip install mlc-llm (the CUDA wheels of llm.mlc.ai)", installed=installed, missing=missing,
    quants=("q0f16", "q0f32", "q3f16_1", "q4f16_1", "q4f32_1", "q4f16_awq"), options=("slots",),
    ready_paths=("/v1/models",),  # it has no /health
)
