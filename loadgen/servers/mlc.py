"""MLC LLM's command line: ``mlc_llm serve`` (OpenAI-compatible) on a model compiled to one of
MLC's weight formats (q0f16, q4f16_1, ...): a local directory, or mlc-ai's prebuilt
``HF://mlc-ai/NAME-FORMAT-MLC`` for a catalogued model."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec


def mlc_model(spec: EngineSpec) -> str:
    ckpt = spec.model.checkpoint
    if Path(ckpt).expanduser().exists() or ckpt.startswith("HF://"):
        return ckpt
    fmt = spec.model.quant if spec.model.quant.startswith("q") else "q0f16"
    return f"HF://mlc-ai/{ckpt.split('/')[-1]}-{fmt}-MLC"


def mlc_command(spec: EngineSpec) -> LaunchSpec:
    if spec.device != "cuda":
        raise UsageError("--backend mlc: loadgen runs MLC LLM on NVIDIA GPUs (--device cuda)")
    if spec.pp > 1:
        raise UsageError("--pp: MLC LLM shards tensors (--tp); pipeline parallelism is not offered")
    exe = os.environ.get("LOADGEN_MLC_LLM") or shutil.which("mlc_llm") or "mlc_llm"
    overrides = f"tensor_parallel_shards={spec.tp};max_num_sequence={spec.slots};" \
                f"context_window_size={spec.setting.max_model_len}"
    argv = [exe, "serve", mlc_model(spec), "--device", "cuda", "--mode", "server", "--host", spec.host,
            "--port", str(spec.port), "--overrides", overrides]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s, "mlc",
                      ready_paths=("/v1/models",))
