"""The command line of loadgen's CTranslate2 engine (``python -m loadgen.servers.ct2serve`` on
this interpreter) and where the converted checkpoint lives."""

from __future__ import annotations

import sys
from pathlib import Path

from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec
from loadgen.servers.tiny import cache_root

# the catalogue's plain precisions as CTranslate2 compute types
PLAIN = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def ct2_dir(checkpoint: str) -> Path:
    """Where the checkpoint's conversion to CTranslate2's format is kept."""
    stem = Path(checkpoint).name if Path(checkpoint).is_absolute() else checkpoint.replace("/", "--")
    return cache_root() / "ct2" / stem


def compute_type(spec: EngineSpec) -> str:
    """The quantization as a compute type; the tiny model's own precision is CTranslate2's default."""
    q = spec.model.quant
    return PLAIN.get(q, "default" if q == "auto" else q)


def ctranslate2_command(spec: EngineSpec) -> LaunchSpec:
    if spec.tp > 1 or spec.pp > 1 or len(spec.gpus) > 1:
        raise UsageError("--backend ctranslate2 runs on one device: drop --tp, --pp and extra --gpus")
    if spec.model.quant not in (*PLAIN, "auto") and spec.model.quant.startswith(("gptq", "awq", "fp8")):
        raise UsageError(f"--quant {spec.model.quant}: CTranslate2 quantizes itself; use int8, int8_float16, "
                         "float16, bfloat16 or float32")
    argv = [
        sys.executable, "-m", "loadgen.servers.ct2serve", "--model", str(ct2_dir(spec.model.checkpoint)),
        "--tokenizer", spec.model.checkpoint, "--served-model-name", spec.served_name, "--host", spec.host,
        "--port", str(spec.port), "--compute-type", compute_type(spec), "--device", spec.device,
        "--max-model-len", str(spec.setting.max_model_len),
    ]
    if spec.cpus:
        argv += ["--threads", str(len(spec.cpus))]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s, "ctranslate2")
