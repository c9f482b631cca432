"""ExLlamaV2 through TabbyAPI, its OpenAI-compatible server: ``python TABBY/main.py`` with the
model directory's parent as ``--model-dir`` and its name as ``--model-name``. The checkpoint
is an EXL2 (bits per weight in its name, e.g. ``exl2-4.65bpw``) or GPTQ directory;
``$LOADGEN_TABBYAPI`` names the TabbyAPI checkout and ``$LOADGEN_TABBYAPI_PYTHON`` the Python that
runs it (default: this one)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from loadgen.engines.engine import Engine, missing_modules
from loadgen.engines.spec import EngineSpec
from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec

# the Python package, and TabbyAPI's name for the backend
MODULE = "exllamav2"


def tabby_main() -> str:
    return str(Path(os.environ.get("LOADGEN_TABBYAPI", "tabbyAPI")) / "main.py")


def exl2_dir(spec: EngineSpec) -> Path:
    """The checkpoint directory: as given, or NAME-exl2-BPW beside the others in TabbyAPI's models/."""
    ckpt = spec.model.checkpoint
    if Path(ckpt).expanduser().is_absolute() or Path(ckpt).expanduser().exists():
        return Path(ckpt).expanduser()
    suffix = f"-{spec.model.quant}" if spec.model.quant.startswith("exl2") else ""  # GPTQ: the hub's name
    root = Path(os.environ.get("LOADGEN_TABBYAPI", "tabbyAPI")) / "models"
    return root / f"{ckpt.split('/')[-1]}{suffix}"


def command(spec: EngineSpec) -> LaunchSpec:
    if spec.device != "cuda":
        raise UsageError("--backend exllamav2: ExLlamaV2 runs on NVIDIA GPUs (--device cuda)")
    if spec.pp > 1:
        raise UsageError("--pp: ExLlamaV2 splits layers over the GPUs given (or --tp); drop --pp")
    model = exl2_dir(spec)
    python = os.environ.get("LOADGEN_TABBYAPI_PYTHON") or sys.executable
    argv = [
        python, tabby_main(), "--host", spec.host, "--port", str(spec.port), "--disable-auth", "true",
        "--model-dir", str(model.parent), "--model-name", model.name, "--backend", MODULE,
        "--max-seq-len", str(spec.setting.max_model_len), "--max-batch-size", str(spec.slots),
    ]
    if len(spec.gpus) > 1:
        argv += ["--tensor-parallel", "true"] if spec.tp > 1 else ["--gpu-split-auto", "true"]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    if not Path(main := launch.argv[1]).is_file():
        return (f"TabbyAPI (ExLlamaV2's OpenAI server) is not at {main}: clone "
                "https://github.com/theroyallab/tabbyAPI, install it, and set LOADGEN_TABBYAPI to the checkout")
    return None


def installed() -> tuple[bool, str]:
    ok = Path(tabby_main()).is_file() and not missing_modules(MODULE)
    return ok, tabby_main() if ok else f"no TabbyAPI checkout (LOADGEN_TABBYAPI) or no {MODULE}"


ENGINE = Engine(
    name=MODULE, label="ExLlamaV2", about="(TabbyAPI)", command=command, hardware="NVIDIA GPU",
    install="TabbyAPI: git clone theroyallab/tabbyAPI, install it, set LOADGEN_TABBYAPI", installed=installed,
    missing=missing, quants=("exl2-8.0bpw", "exl2-6.0bpw", "exl2-5.0bpw", "exl2-4.65bpw", "exl2-4.0bpw", "exl2-3.0bpw"),
    options=("slots",),
)
