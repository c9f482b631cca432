"""``EngineSpec``: everything ``loadgen serve`` (or a scenario's ``serve:`` block) was told,
resolved and cross-checked (``loadgen.engines.build``): the checkpoint and quantization from the
catalogue, the settings preset, the device, GPU placement and parallelism. Each engine's module
turns a spec into its real command line.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.engines.catalogue import ModelRef, Setting
from loadgen.errors import UsageError

DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


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
    rope: dict[str, str | float] | None = None  # the rope_scaling entry of the model config, when asked for
    kv_cache_dtype: str | None = None
    load_format: str | None = None
    tool_parser: str | None = None  # tool calls parsed out of the answers (tool_choice auto, required, named)
    # engine-specific options (``EngineOptions``; each engine declares those it takes)
    attn: str = "sdpa"
    load_in: str | None = None
    grad_mode: str = "inference_mode"
    slots: int = 16
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
