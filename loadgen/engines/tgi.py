"""Text Generation Inference: ``text-generation-launcher`` from ``PATH``, or its official image."""

from __future__ import annotations

import shutil

from loadgen.engines.catalogue import QUANT_METHOD
from loadgen.engines.engine import Engine, Image, program_installed
from loadgen.engines.spec import EngineSpec
from loadgen.errors import UsageError
from loadgen.servers.launch import LaunchSpec

LAUNCHER = "text-generation-launcher"
IMAGE = Image("ghcr.io/huggingface/text-generation-inference:3.3.4", "TGI_IMAGE", (LAUNCHER,), 1, "/data", 80,
              host_flag="--hostname")


def command(spec: EngineSpec) -> LaunchSpec:
    s = spec.setting
    if spec.pp > 1:
        raise UsageError("--pp: TGI has no pipeline parallelism; use --tp")
    if spec.rope:
        raise UsageError(
            f"max_model_len {s.max_model_len}: TGI takes rope scaling from the checkpoint's config; "
            "use a setting within the native context"
        )
    argv = [
        LAUNCHER, "--model-id", spec.model.checkpoint, "--hostname", spec.host,
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
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    if shutil.which(launch.argv[0]) is None:
        return (f"{launch.argv[0]!r} is not on PATH: install text-generation-inference, or run its official image "
                "with --container docker")
    return None


ENGINE = Engine(
    name="tgi", label="TGI", command=command, hardware="NVIDIA GPU",
    install=f"{LAUNCHER}, or its image with --container docker",
    installed=lambda: program_installed(LAUNCHER, f"{LAUNCHER} not on PATH"), missing=missing,
    image=lambda spec: IMAGE,
    metrics={"running": ("tgi_batch_current_size",), "waiting": ("tgi_queue_size",)},
    preallocates=True,
)
