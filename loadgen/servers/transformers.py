"""The command line of loadgen's transformers engine (``python -m loadgen.servers.hfserve`` on
this interpreter)."""

from __future__ import annotations

import sys

from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec


def transformers_command(spec: EngineSpec) -> LaunchSpec:
    """loadgen's own transformers engine (``loadgen.servers.hfserve``) on this interpreter."""
    if spec.pp > 1:
        raise UsageError("--pp: the transformers engine spreads layers over the GPUs given; use --gpus only")
    if spec.kv_cache_dtype or spec.load_format:
        raise UsageError("--kv-cache-dtype / --load-format: vLLM and SGLang options; the transformers engine has none")
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
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, env, spec.ready_timeout_s, "transformers")
