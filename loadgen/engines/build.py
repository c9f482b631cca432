"""From what a user asked for to what is launched: ``build_spec`` resolves and cross-checks an
``EngineOptions`` (``loadgen serve``'s flags, or a scenario's ``serve:`` block) against the
engine's declaration and the model catalogue; ``launch_spec`` is the engine's command line for
it; ``describe_spec`` says in one line what that launch is."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from loadgen.engines.catalogue import ModelRef, Setting, resolve_model, resolve_setting, rope_scaling
from loadgen.engines.engine import Engine
from loadgen.engines.registry import ENGINES, engine_named
from loadgen.engines.spec import EngineSpec, parse_gpus
from loadgen.errors import UsageError
from loadgen.scenario.serve import ENGINE_SPECIFIC, EngineOptions, flag
from loadgen.servers.gpus import gpu_count
from loadgen.servers.launch import LaunchSpec

DEFAULT_SLOTS = 16
DEFAULT_PORT = 8000  # loadgen serve's; a run gives its engine a free port


def device_of(device: str, ref: ModelRef, gpus: str | None, tp: int | None) -> str:
    """``auto``: a GPU engine, except the tiny model on a machine without a GPU, which runs on CPU."""
    if device != "auto":
        return device
    if gpus is not None or (tp or 1) > 1 or ref.entry is None or not ref.entry.generated:
        return "cuda"
    return "cuda" if gpu_count() else "cpu"


def foreign_option(options: EngineOptions, engine: Engine) -> str | None:
    """An engine-specific option given to an engine that does not declare it, or None."""
    chosen = options.chosen()
    return next((o for o in ENGINE_SPECIFIC if o in chosen and o not in engine.options), None)


def not_taken(engine: Engine, option: str) -> str:
    """Why ``option`` is refused, naming the engines that take it."""
    takers = ", ".join(e.name for e in ENGINES if option in e.options)
    return f"{engine.label} ({engine.name}) has no such option; the engines that take it: {takers}"


def engine_options(model: str, **values: Any) -> EngineOptions:
    """``EngineOptions`` from flag values (None: not given), or a one-line error naming the flag."""
    given = {k: v for k, v in values.items() if v is not None}
    try:
        return EngineOptions(model=model, **given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "model"
        why = first["msg"]
        if first["type"] == "literal_error":
            expected = str(first.get("ctx", {}).get("expected", ""))
            why = "choose one of " + expected.replace("'", "").replace(" or ", ", ")
        raise UsageError(f"{flag(name)} {given.get(name)!r}: {why}") from None


def build_spec(options: EngineOptions, cpus: tuple[int, ...] = ()) -> EngineSpec:
    """Resolve and cross-check everything ``loadgen serve`` was told (``cpus``: a CPU engine's cores)."""
    engine = engine_named(options.backend)
    if options.model is None:
        raise UsageError("an engine needs a model: a catalogue alias (see `loadgen models`), hub id or path")
    if (option := foreign_option(options, engine)) is not None:
        raise UsageError(f"{flag(option)}: {not_taken(engine, option)}")
    tp, pp, gpus = options.tp, options.pp, options.gpus
    ref = resolve_model(options.model, options.quant, engine.quants, engine.name)
    dev = device_of(options.device, ref, gpus, tp)
    placed: tuple[int, ...] | None
    if dev == "cpu":
        if gpus is not None or (tp or 1) > 1 or pp > 1:
            raise UsageError("--device cpu: drop --gpus, --tp and --pp (a CPU engine runs as one process)")
        if not engine.cpu:
            on_cpu = ", ".join(e.name for e in ENGINES if e.cpu)
            raise UsageError(f"--backend {engine.name}: no CPU build; on CPU use one of {on_cpu}")
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
    preset = resolve_setting(options.setting or "default", ref.entry)
    if options.setting is None and ref.entry is not None:
        # the default preset never asks for more context than the model has natively
        length = min(preset.max_model_len, ref.entry.context)
        preset = Setting(preset.name, preset.gpu_memory_utilization, length, preset.enforce_eager)
    served = ref.entry.alias if ref.entry else ref.checkpoint
    return EngineSpec(
        backend=engine.name, model=ref, served_name=served, host=options.host,
        port=DEFAULT_PORT if options.port is None else options.port,
        device=dev, gpus=placed, tp=tp, pp=pp, setting=preset, rope=rope_scaling(ref.entry, preset.max_model_len),
        kv_cache_dtype=options.kv_cache_dtype, load_format=options.load_format, tool_parser=options.tool_parser,
        attn=options.attn,
        slots=options.slots or DEFAULT_SLOTS, load_in=options.load_in, grad_mode=options.grad_mode,
        extra_args=options.extra_args, ready_timeout_s=600.0 if dev == "cpu" else 1800.0,
        cpus=cpus if dev == "cpu" else (),
    )


def launch_spec(spec: EngineSpec) -> LaunchSpec:
    """The engine's command line and environment for ``spec``, on its cores, with its readiness."""
    engine = engine_named(spec.backend)
    launch = engine.command(spec)
    return replace(launch, cpus=spec.cpus, name=engine.name, ready_paths=engine.ready_paths)


def describe_spec(spec: EngineSpec) -> str:
    """One line: which engine serves which checkpoint, where, how parallel, with which preset."""
    engine = engine_named(spec.backend)
    where = "CPU" if spec.device == "cpu" else f"GPU{'s' if len(spec.gpus) > 1 else ''} {','.join(map(str, spec.gpus))}"
    parallel = f", tensor parallel {spec.tp}" if spec.tp > 1 else ""
    parallel += f", pipeline parallel {spec.pp}" if spec.pp > 1 else ""
    s = spec.setting
    quant = "as the GGUF file says" if spec.model.checkpoint.endswith(".gguf") else spec.model.quant
    label = f"{engine.label} {engine.about}".strip()
    preallocates = spec.device == "cuda" and engine.preallocates
    return (
        f"{label} serving {spec.model.checkpoint} ({quant}) on {where}{parallel}; "
        f"setting {s.name}: max_model_len {s.max_model_len}"
        + (f", gpu_memory_utilization {s.gpu_memory_utilization:g}" if preallocates else "")
        + (", eager" if s.enforce_eager and engine.uses_eager else "")
    )
