"""Text Generation Inference's command line (``text-generation-launcher`` from ``PATH``);
its container form is ``loadgen.servers.containers``."""

from __future__ import annotations

from loadgen.errors import UsageError
from loadgen.servers.catalogue import QUANT_METHOD
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec

TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.4"


def tgi_command(spec: EngineSpec) -> LaunchSpec:
    s = spec.setting
    if spec.pp > 1:
        raise UsageError("--pp: TGI has no pipeline parallelism; use --tp")
    if spec.rope:
        raise UsageError(
            f"max_model_len {s.max_model_len}: TGI takes rope scaling from the checkpoint's config; "
            "use a setting within the native context"
        )
    argv = [
        "text-generation-launcher", "--model-id", spec.model.checkpoint, "--hostname", spec.host,
        "--port", str(spec.port), "--num-shard", str(spec.tp),
    ]
    method = QUANT_METHOD.get(spec.model.quant)
    if method is not None:
        argv += ["--quantize", method]
    elif spec.dtype != "auto":
        argv += ["--dtype", spec.dtype]
    argv += [
        "--max-total-tokens", str(s.max_model_len), "--max-input-tokens", str(s.max_model_len - 1),
        "--cuda-memory-fraction", str(float(s.gpu_memory_utilization)),
    ]
    argv += spec.extra_args
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s, "tgi")
