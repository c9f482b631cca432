"""A scenario that launches GPU engines, on a machine without a GPU: said once, before anything
is launched or written, with the ``--set`` keys that run the same scenario on CPU with the
tiny model (and checked to do so), instead of one failed cell per matrix point."""

from __future__ import annotations

from loadgen.engines.build import device_of
from loadgen.engines.catalogue import resolve_model
from loadgen.engines.registry import ENGINES, SIM, engine_named
from loadgen.errors import UsageError
from loadgen.scenario.matrix import points
from loadgen.scenario.schema import AXES, Scenario
from loadgen.scenario.target import Timeouts

# what the CPU command runs: the model loadgen generates, on one process
CPU_MODEL = "tiny"


def gpu_engines(scenario: Scenario, source: str) -> list[str]:
    """``engine model`` of each distinct engine the scenario would start on GPUs (points set to
    be skipped when unavailable left out); [] when it starts none."""
    out: list[str] = []
    for _, point in points(scenario, source):
        serve = point.serve
        if serve is None or serve.backend in (None, SIM) or serve.skip_unavailable:
            continue
        try:
            engine = engine_named(serve.backend)
            ref = resolve_model(serve.model or "", serve.quant, engine.quants, engine.name)
        except UsageError:
            continue  # said by the model check
        if device_of(serve.device, ref, serve.gpus, serve.tp) == "cuda":
            what = f"{engine.name} {serve.model}" + (f" on {serve.tp} GPUs" if (serve.tp or 1) > 1 else " on a GPU")
            if what not in out:
                out.append(what)
    return out


def cpu_sets(scenario: Scenario) -> list[str]:
    """The ``--set`` overrides that run ``scenario`` on CPU with the tiny model: the device, one
    process, the model, a CPU engine where the one named has no CPU build, no quantization the
    tiny model lacks. A matrix axis over one of them is narrowed to the one value."""
    axes = {AXES.get(k, k): k for block in scenario.matrix_blocks for k in block.axes}
    serve = scenario.serve
    cpu_engine = next(e.name for e in ENGINES if e.cpu)
    sets: list[str] = []

    def put(key: str, value: str, needed: bool) -> None:
        if key in axes:
            sets.append(f"matrix.{axes[key]}=[{value}]")
        elif needed:
            sets.append(f"{key}={value}")

    put("serve.device", "cpu", True)
    backends = {p.serve.backend for _, p in points(scenario) if p.serve is not None}
    put("serve.backend", cpu_engine, any(b not in (None, SIM) and not engine_named(b).cpu for b in backends))
    put("serve.model", CPU_MODEL, True)
    put("serve.tp", "1", serve is not None and (serve.tp or 1) > 1)
    put("serve.pp", "1", serve is not None and serve.pp > 1)
    put("serve.gpus", "null", serve is not None and serve.gpus is not None)
    put("serve.quant", "null", serve is not None and serve.quant is not None)
    # a GPU-sized workload on a CPU engine: a request queued behind the others gets its first
    # byte only once the engine reaches it, minutes later (1,000 prompts offered at once lost 860
    # to the 120 s limit between bytes); each request stays bounded by its total time
    if scenario.target.timeouts.between_tokens_s == Timeouts().between_tokens_s:
        sets.append("target.timeouts.between_tokens_s=null")
    return sets
