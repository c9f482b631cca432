"""The options that vLLM and the engines that share its option set (SGLang) take, each engine
spelling them its own way (``ServingFlags``)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from loadgen.engines.spec import EngineSpec
from loadgen.results.cellstatus import ServerInfo


@dataclass(frozen=True, slots=True)
class ServingFlags:
    """How one engine spells the shared options."""

    pp: str
    memory: str  # "" where the engine takes no GPU memory fraction
    length: str
    eager: str
    overrides: str
    tools: tuple[str, ...] = ()  # the flags before the tool-call parser's name


def serving_args(spec: EngineSpec, head: list[str], f: ServingFlags, tail: tuple[str, ...] = ()) -> list[str]:
    """``head`` followed by the shared options of ``spec`` as ``f`` spells them, then ``tail``
    and the user's extra arguments."""
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
    if spec.tool_parser and f.tools:
        argv += [*f.tools, spec.tool_parser]
    if spec.rope:
        argv += [f.overrides, json.dumps({"rope_scaling": spec.rope}, separators=(",", ":"))]
    return argv + list(spec.extra_args)


def parallel_settings(server: ServerInfo) -> list[str]:
    """The comparison table's Settings line of an engine that shards tensors."""
    return [f"tensor_parallel_size={server.tp or 1}"]
