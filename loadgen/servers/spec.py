"""``EngineSpec``: everything ``loadgen serve`` (or a scenario's ``serve:`` block) was told,
resolved and cross-checked: the checkpoint and quantization from the catalogue, the settings
preset, the device, GPU placement and parallelism. Each engine family's module turns a spec
into its real command line (``loadgen.servers.commands``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loadgen.errors import UsageError
from loadgen.scenario.schema import ENGINES
from loadgen.servers.catalogue import ModelRef, Setting, resolve_model, resolve_setting, rope_scaling
from loadgen.servers.gpus import gpu_count

DEVICES: tuple[str, ...] = ("auto", "cuda", "cpu")
DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
ATTENTION: tuple[str, ...] = ("sdpa", "eager", "flash_attention_2")


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
    load_in: str | None = None  # the transformers engine: 8bit / 4bit through bitsandbytes
    grad_mode: str = "inference_mode"  # the transformers engine: inference_mode or no_grad
    slots: int = 16  # llama.cpp parallel slots (>= the concurrency it will see)
    extra_args: tuple[str, ...] = ()
    ready_timeout_s: float = 1800.0
    cpus: tuple[int, ...] = ()  # a CPU engine's cores, apart from the client's (empty: any)

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
    if gpus is not None or (tp or 1) > 1 or ref.entry is None or not ref.entry.generated:
        return "cuda"
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
    cpus: tuple[int, ...] = (),
    load_in: str | None = None,
    grad_mode: str = "inference_mode",
) -> EngineSpec:
    """Resolve and cross-check everything ``loadgen serve`` was told."""
    if backend not in ENGINES:
        raise UsageError(f"--backend {backend!r}: choose one of {', '.join(ENGINES)}")
    if attn not in ATTENTION:
        raise UsageError(f"--attn {attn!r}: choose one of {', '.join(ATTENTION)}")
    if slots < 1:
        raise UsageError(f"--slots {slots}: must be >= 1")
    if (load_in is not None or grad_mode != "inference_mode") and backend != "transformers":
        raise UsageError("--load-in / --grad-mode: options of the transformers engine (--backend transformers)")
    if load_in not in (None, "8bit", "4bit"):
        raise UsageError(f"--load-in {load_in!r}: choose 8bit or 4bit")
    if grad_mode not in ("inference_mode", "no_grad"):
        raise UsageError(f"--grad-mode {grad_mode!r}: choose inference_mode or no_grad")
    ref = resolve_model(model, quant, backend)
    if tp is not None and tp < 1:
        raise UsageError(f"--tp {tp}: must be >= 1")
    if pp < 1:
        raise UsageError(f"--pp {pp}: must be >= 1")
    dev = _device(device, ref, gpus, tp)
    placed: tuple[int, ...] | None
    if dev == "cpu":
        if gpus is not None or (tp or 1) > 1 or pp > 1:
            raise UsageError("--device cpu: drop --gpus, --tp and --pp (a CPU engine runs as one process)")
        if backend in GPU_ONLY:
            raise UsageError(
                f"--backend {backend}: no CPU build; on CPU use vllm, transformers, llamacpp or ctranslate2"
            )
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
        kv_cache_dtype=kv_cache_dtype, load_format=load_format, attn=attn, slots=slots, load_in=load_in,
        grad_mode=grad_mode, extra_args=extra_args, ready_timeout_s=600.0 if dev == "cpu" else 1800.0,
        cpus=cpus if dev == "cpu" else (),
    )


# each engine's name as people write it (the published tables call HF Transformers "Transformer")
ENGINE_LABELS: dict[str, str] = {
    "vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "transformers": "HF Transformers", "llamacpp": "llama.cpp",
    "ctranslate2": "CTranslate2", "mlc": "MLC LLM", "exllamav2": "ExLlamaV2",
}
# engines that run on NVIDIA GPUs only
GPU_ONLY: tuple[str, ...] = ("sglang", "tgi", "mlc", "exllamav2")


def describe_spec(spec: EngineSpec) -> str:
    """One line: which engine serves which checkpoint, where, how parallel, with which preset."""
    where = "CPU" if spec.device == "cpu" else f"GPU{'s' if len(spec.gpus) > 1 else ''} {','.join(map(str, spec.gpus))}"
    parallel = f", tensor parallel {spec.tp}" if spec.tp > 1 else ""
    parallel += f", pipeline parallel {spec.pp}" if spec.pp > 1 else ""
    s = spec.setting
    quant = "as the GGUF file says" if spec.model.checkpoint.endswith(".gguf") else spec.model.quant
    engine = ENGINE_LABELS[spec.backend]
    if spec.backend in ("transformers", "ctranslate2"):
        engine += f" (loadgen's {spec.backend} engine)"
    if spec.backend == "exllamav2":
        engine += " (TabbyAPI)"
    preallocates = spec.device == "cuda" and spec.backend in ("vllm", "sglang", "tgi")
    return (
        f"{engine} serving {spec.model.checkpoint} ({quant}) on {where}{parallel}; "
        f"setting {s.name}: max_model_len {s.max_model_len}"
        + (f", gpu_memory_utilization {s.gpu_memory_utilization:g}" if preallocates else "")
        + (", eager" if s.enforce_eager and spec.backend in ("vllm", "sglang") else "")
    )
