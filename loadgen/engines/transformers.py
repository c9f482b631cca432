"""loadgen's transformers engine: ``python -m loadgen.servers.hfserve`` on this interpreter
(Hugging Face Transformers' ``generate`` behind loadgen's OpenAI server)."""

from __future__ import annotations

import importlib.util
import sys

from loadgen.engines.engine import Engine, missing_modules, modules_installed
from loadgen.engines.spec import EngineSpec
from loadgen.errors import UsageError
from loadgen.results.cellstatus import ServerInfo
from loadgen.servers.launch import LaunchSpec

NEEDS = ("torch", "transformers")


def command(spec: EngineSpec) -> LaunchSpec:
    if spec.pp > 1:
        raise UsageError("--pp: the transformers engine spreads layers over the GPUs given; use --gpus only")
    argv = [
        sys.executable, "-m", "loadgen.servers.hfserve", "--model", spec.model.checkpoint,
        "--served-model-name", spec.served_name, "--host", spec.host, "--port", str(spec.port),
        "--device", spec.device, "--attn-implementation", spec.attn,
        "--max-model-len", str(spec.setting.max_model_len),
    ]
    if spec.dtype != "auto":
        argv += ["--dtype", spec.dtype]
    if spec.load_in is not None:
        argv += ["--load-in", spec.load_in]
    if spec.grad_mode != "inference_mode":
        argv += ["--grad-mode", spec.grad_mode]
    env = spec.env | ({"OMP_NUM_THREADS": str(len(spec.cpus))} if spec.cpus else {})  # torch's threads
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    for module in missing_modules(*NEEDS):
        return f"the transformers engine needs {module}: pip install 'loadgen[transformers]'"
    no_cuda = spec.device != "cuda"
    if spec.attn == "flash_attention_2" and (no_cuda or importlib.util.find_spec("flash_attn") is None):
        return "attn flash_attention_2 needs a CUDA GPU and the flash-attn package (pip install flash-attn)"
    if spec.load_in is not None and (no_cuda or importlib.util.find_spec("bitsandbytes") is None):
        return f"load_in {spec.load_in} needs a CUDA GPU and bitsandbytes (pip install bitsandbytes)"
    return None


def settings(server: ServerInfo) -> list[str]:
    """The reference table's Settings lines: how the model was loaded and run."""
    lines = []
    if server.load_in:
        lines.append(f"load_in_{server.load_in}=True")
    lines.append(f"torch.{server.grad_mode or 'inference_mode'}()")
    if server.attn:
        lines.append(f"attn_implementation={server.attn}")
    return lines


ENGINE = Engine(
    name="transformers", label="HF Transformers", table_label="Transformer", about="(loadgen's transformers engine)",
    command=command, hardware="CPU or NVIDIA GPU", install="pip install 'loadgen[transformers]'",
    installed=lambda: modules_installed(*NEEDS), missing=missing, cpu=True,
    # the full-precision checkpoint loaded as another dtype (the reference's FP32 baseline, FP16)
    quants=("fp32", "fp16", "bf16"), options=("attn", "load_in", "grad_mode"),
    reports_peak_memory=True, settings=settings,
)
