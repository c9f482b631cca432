"""The model catalogue and settings presets shipped in ``loadgen/engines/``.

``resolve_model`` turns an alias (``qwen2-57b``), a catalogued hub id (with or without a
quantization suffix) or anything else (a local path, another hub id) into a ``ModelRef``:
the checkpoint to load, its quantization and what the catalogue knows about it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from loadgen.data import Unchecked
from loadgen.errors import UsageError
from loadgen.servers.tiny import tiny_path

QUANTS: tuple[str, ...] = ("bf16", "fp16", "fp32", "gptq-int8", "gptq-int4", "awq", "fp8")
# hub-id suffix of each published quantized checkpoint
QUANT_SUFFIX: dict[str, str] = {"gptq-int8": "-GPTQ-Int8", "gptq-int4": "-GPTQ-Int4", "awq": "-AWQ"}
# the quantization method an engine is told about (None: the weights are plain)
QUANT_METHOD: dict[str, str | None] = {
    "bf16": None, "fp16": None, "fp32": None, "gptq-int8": "gptq", "gptq-int4": "gptq",
    "awq": "awq", "fp8": "fp8",
}
BYTES_PER_PARAM: dict[str, float] = {
    "bf16": 2, "fp16": 2, "fp32": 4, "gptq-int8": 1, "gptq-int4": 0.5, "awq": 0.5, "fp8": 1,
}
GPU_GIB = 80.0  # the documents' A100 80GB


@dataclass(frozen=True, slots=True)
class ModelEntry:
    alias: str
    hub: str
    params_b: float
    context: int
    long_context: int | None = None
    quants: tuple[str, ...] = ()
    gpus: dict[str, int] = field(default_factory=dict)
    moe: bool = False
    settings: str = "common"
    generated: bool = False  # made by loadgen itself (the tiny model), not downloaded

    def checkpoint(self, quant: str) -> str:
        if quant == "bf16":
            return self.hub
        if quant not in self.quants:
            published = ", ".join(["bf16", *self.quants])
            raise UsageError(f"--quant {quant}: {self.alias} is published as {published}")
        return self.hub + QUANT_SUFFIX[quant]

    def default_gpus(self, quant: str) -> int:
        """The documents' least GPU count, else weights x 1.1 over 80 GB GPUs."""
        if quant in self.gpus:
            return self.gpus[quant]
        weights_gib = self.params_b * BYTES_PER_PARAM.get(quant, 2) * 1.1
        return max(1, math.ceil(weights_gib / GPU_GIB))


@dataclass(frozen=True, slots=True)
class Setting:
    name: str
    gpu_memory_utilization: float
    max_model_len: int
    enforce_eager: bool


@dataclass(frozen=True, slots=True)
class ModelRef:
    """What to launch: ``checkpoint`` is a hub id or a path; ``entry`` is None when uncatalogued."""

    checkpoint: str
    quant: str
    entry: ModelEntry | None


def _read(name: str) -> Any:
    return yaml.safe_load(resources.files("loadgen.engines").joinpath(name).read_text("utf-8"))


@functools.cache
def load_catalogue() -> dict[str, ModelEntry]:
    out = {}
    for alias, d in _read("models.yaml").items():
        out[alias] = ModelEntry(
            alias=alias, hub=d["hub"], params_b=float(d["params_b"]), context=int(d["context"]),
            long_context=d.get("long_context"), quants=tuple(d.get("quant", ())),
            gpus=dict(d.get("gpus", {})), moe=bool(d.get("moe", False)),
            settings=d.get("settings", "common"), generated=bool(d.get("generated", False)),
        )
    return out


@functools.cache
def _settings() -> Unchecked:
    data: Unchecked = _read("settings.yaml")
    return data


def _normalise_setting(name: str) -> str:
    key = name.strip().lower().removeprefix("[").removesuffix("]")
    for prefix in ("setting-", "setting ", "setting"):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    return "default" if key in ("default setting", "default") else key


def resolve_setting(name: str, entry: ModelEntry | None = None) -> Setting:
    """``"2"``, ``"Setting 2"``, ``"64k"``, ``"setting-64k"`` or ``"default"`` -> a ``Setting``."""
    key = _normalise_setting(name)
    groups = _settings()["groups"]
    group = groups.get(entry.settings, {}) if entry else {}
    values = group.get(key) or groups["common"].get(key)
    if values is None:
        names = ", ".join(groups["common"])
        raise UsageError(f"--setting {name!r}: unknown preset; choose one of {names}")
    return Setting(name=key, **values)


def resolve_model(
    name: str, quant: str | None = None, native: tuple[str, ...] = (), backend: str = "",
) -> ModelRef:
    """An alias or catalogued hub id -> its checkpoint for ``quant``; anything else passes through.
    An engine's own quantization (``native``, of the engine ``backend``) is made by that engine
    from the full-precision checkpoint, or names the engine's own format of it."""
    if quant is not None and quant in native:
        base = resolve_model(name, None)
        return ModelRef(base.checkpoint, quant, base.entry)
    if quant is not None and quant not in QUANTS:
        more = f"; {backend}'s own: {', '.join(native)}" if native else ""
        raise UsageError(f"--quant {quant!r}: choose one of {', '.join(QUANTS)}{more}")
    catalogue = load_catalogue()
    entry = catalogue.get(name.lower())
    implied = None
    if entry is None:
        for e in catalogue.values():
            for q in ("bf16", *e.quants):
                if name == e.hub + QUANT_SUFFIX.get(q, ""):
                    entry, implied = e, q
    if entry is None:
        if "/" not in name and not Path(name).expanduser().exists():
            raise UsageError(
                f"model {name!r}: not a catalogue alias (see `loadgen models`), a hub id (org/name) "
                "or a local checkpoint directory"
            )
        return ModelRef(name, quant or "bf16", None)
    if implied is not None and quant is not None and quant != implied:
        raise UsageError(f"--quant {quant}: {name} is the {implied} checkpoint; drop --quant or name {entry.alias}")
    q = quant or implied or "bf16"
    if entry.generated:
        if q != "bf16":
            raise UsageError(f"--quant {q}: {entry.alias} has random full-precision weights only")
        return ModelRef(str(tiny_path()), "auto", entry)
    return ModelRef(entry.checkpoint(q), q, entry)


def rope_scaling(entry: ModelEntry | None, max_model_len: int) -> dict[str, str | float] | None:
    """YaRN rope scaling when the context asked for exceeds the model's native one."""
    if entry is None or max_model_len <= entry.context:
        return None
    if entry.long_context is None or max_model_len > entry.long_context:
        limit = entry.long_context or entry.context
        raise UsageError(
            f"max_model_len {max_model_len}: {entry.alias} supports at most {limit} tokens"
        )
    return {
        "rope_type": "yarn",
        "factor": entry.long_context / entry.context,
        "original_max_position_embeddings": entry.context,
    }
