"""loadgen's CTranslate2 engine: ``python -m loadgen.servers.ct2serve`` on this interpreter, on
the checkpoint converted to CTranslate2's format into loadgen's cache (once, before launch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loadgen.engines.engine import Echo, Engine, Setup, missing_modules, modules_installed
from loadgen.engines.spec import EngineSpec
from loadgen.errors import LaunchError, UsageError
from loadgen.servers.heartbeat import Heartbeat
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.tiny import cache_root

VERSION = "4.8.5"
NEEDS = ("ctranslate2", "transformers")
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


def command(spec: EngineSpec) -> LaunchSpec:
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
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    for module in missing_modules(*NEEDS):
        return f"the CTranslate2 engine needs {module}: pip install 'loadgen[ctranslate2]'"
    return None


def prepare(spec: EngineSpec, launch: LaunchSpec, echo: Echo) -> None:
    """The checkpoint in CTranslate2's format, converted once into the cache."""
    out = ct2_dir(spec.model.checkpoint)
    if not (out / "model.bin").is_file():
        from loadgen.servers.ct2serve import convert

        echo(f"converting {spec.model.checkpoint} to CTranslate2's format: {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with Heartbeat(echo, "converting to CTranslate2's format"):
            convert(spec.model.checkpoint, out)


def setup(echo: Echo, *, version: str = VERSION) -> None:
    """CTranslate2's wheel (with its CPU kernels) into this interpreter; converting a checkpoint
    also needs torch and transformers (loadgen[transformers])."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            f"ctranslate2=={version}"]
    echo("$ " + " ".join(argv))
    if subprocess.run(argv, check=False).returncode != 0:
        raise LaunchError(f"setup ctranslate2: pip could not install ctranslate2=={version}")
    for module in missing_modules("torch", *NEEDS[1:]):
        echo(f"converting checkpoints also needs {module}: pip install 'loadgen[transformers]'")
    echo(f"CTranslate2 {version} ready")


ENGINE = Engine(
    name="ctranslate2", label="CTranslate2", about="(loadgen's ctranslate2 engine)", command=command,
    hardware="CPU or NVIDIA GPU", install="loadgen setup ctranslate2",
    installed=lambda: modules_installed(*NEEDS, "torch"), missing=missing, prepare=prepare, cpu=True,
    setup=Setup("ctranslate2", setup, "CTranslate2 into this Python"),
    quants=("int8", "int8_float16", "int8_bfloat16", "int8_float32", "float16", "bfloat16", "float32"),
)
