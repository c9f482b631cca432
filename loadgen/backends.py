"""Engine command lines, each built from one typed ``EngineSpec``.

``build_spec`` resolves a model name, quantization, settings preset and GPU placement into
an ``EngineSpec`` (checking them against each other); ``BUILDERS`` maps a backend name to the
function that turns the spec into the engine's real command line and environment.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from loadgen.catalogue import QUANT_METHOD, ModelRef, Setting, resolve_model, resolve_setting, rope_scaling
from loadgen.errors import UsageError
from loadgen.launcher import LaunchSpec

Backend = Literal["vllm", "sglang", "tgi"]
BACKENDS: tuple[str, ...] = ("vllm", "sglang", "tgi")
DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True, slots=True)
class EngineSpec:
    backend: str
    model: ModelRef
    served_name: str
    host: str
    port: int
    gpus: tuple[int, ...]
    tp: int
    pp: int
    setting: Setting
    rope: dict[str, Any] | None = None
    kv_cache_dtype: str | None = None
    load_format: str | None = None
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = 1800.0

    @property
    def dtype(self) -> str:
        # quantized checkpoints carry their own activation dtype in their config
        return DTYPES.get(self.model.quant, "auto")

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}


def parse_gpus(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(g) for g in text.split(",") if g.strip() != "")
    except ValueError:
        raise UsageError(f"--gpus {text!r}: expected GPU indices such as 0 or 0,1") from None
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {text!r}: expected distinct GPU indices such as 0 or 0,1")
    return gpus


def build_spec(
    model: str,
    *,
    backend: str = "vllm",
    quant: str | None = None,
    setting: str | None = None,
    tp: int | None = None,
    pp: int = 1,
    gpus: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    kv_cache_dtype: str | None = None,
    load_format: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> EngineSpec:
    """Resolve and cross-check everything ``loadgen serve`` was told."""
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    ref = resolve_model(model, quant)
    if tp is not None and tp < 1:
        raise UsageError(f"--tp {tp}: must be >= 1")
    if pp < 1:
        raise UsageError(f"--pp {pp}: must be >= 1")
    placed = parse_gpus(gpus) if gpus is not None else None
    if placed is not None:
        if tp is None:
            if len(placed) % pp:
                raise UsageError(f"--gpus {gpus} --pp {pp}: the GPU count must be a multiple of --pp")
            tp = len(placed) // pp
        elif tp * pp != len(placed):
            raise UsageError(
                f"--tp {tp} --gpus {gpus}: tensor x pipeline parallel size ({tp * pp}) must equal "
                f"the number of GPUs given ({len(placed)}); drop --tp or list {tp * pp} GPUs"
            )
    if tp is None:
        tp = ref.entry.default_gpus(ref.quant) if ref.entry else 1
    if placed is None:
        placed = tuple(range(tp * pp))
    preset = resolve_setting(setting or "default", ref.entry)
    if setting is None and ref.entry is not None:
        # the default preset never asks for more context than the model has natively
        length = min(preset.max_model_len, ref.entry.context)
        preset = Setting(preset.name, preset.gpu_memory_utilization, length, preset.enforce_eager)
    served = ref.entry.alias if ref.entry else ref.checkpoint
    return EngineSpec(
        backend=backend, model=ref, served_name=served, host=host, port=port, gpus=placed, tp=tp,
        pp=pp, setting=preset, rope=rope_scaling(ref.entry, preset.max_model_len),
        kv_cache_dtype=kv_cache_dtype, load_format=load_format, extra_args=extra_args,
    )


@dataclass(frozen=True, slots=True)
class _Flags:
    """How vLLM-like engines spell the same options."""

    pp: str
    memory: str
    length: str
    eager: str
    overrides: str


def _vllm_like(spec: EngineSpec, head: list[str], f: _Flags, tail: tuple[str, ...] = ()) -> list[str]:
    s = spec.setting
    argv = [*head]
    if spec.pp > 1:
        argv += [f.pp, str(spec.pp)]
    argv += ["--dtype", spec.dtype]
    if spec.model.quant == "fp8":  # GPTQ / AWQ checkpoints declare their method; the engine reads it
        argv += ["--quantization", "fp8"]
    argv += [f.memory, str(float(s.gpu_memory_utilization)), f.length, str(s.max_model_len), *tail]
    if s.enforce_eager:
        argv.append(f.eager)
    if spec.kv_cache_dtype:
        argv += ["--kv-cache-dtype", spec.kv_cache_dtype]
    if spec.load_format:
        argv += ["--load-format", spec.load_format]
    if spec.rope:
        argv += [f.overrides, json.dumps({"rope_scaling": spec.rope}, separators=(",", ":"))]
    return argv + list(spec.extra_args)


VLLM_FLAGS = _Flags("--pipeline-parallel-size", "--gpu-memory-utilization", "--max-model-len", "--enforce-eager",
                    "--hf-overrides")
SGLANG_FLAGS = _Flags("--pp-size", "--mem-fraction-static", "--context-length", "--disable-cuda-graph",
                      "--json-model-override-args")


def vllm_command(spec: EngineSpec) -> LaunchSpec:
    head = [
        "vllm", "serve", spec.model.checkpoint, "--host", spec.host, "--port", str(spec.port),
        "--served-model-name", spec.served_name, "--tensor-parallel-size", str(spec.tp),
    ]
    argv = _vllm_like(spec, head, VLLM_FLAGS)
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s, "vllm")


def sglang_command(spec: EngineSpec) -> LaunchSpec:
    head = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", spec.model.checkpoint,
        "--host", spec.host, "--port", str(spec.port), "--served-model-name", spec.served_name,
        "--tp", str(spec.tp),
    ]
    argv = _vllm_like(spec, head, SGLANG_FLAGS, ("--enable-metrics",))
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s, "sglang")


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


BUILDERS: dict[str, Callable[[EngineSpec], LaunchSpec]] = {
    "vllm": vllm_command,
    "sglang": sglang_command,
    "tgi": tgi_command,
}


def launch_spec(spec: EngineSpec) -> LaunchSpec:
    return BUILDERS[spec.backend](spec)
