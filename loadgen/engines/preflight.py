"""Around an engine launch: checks before it, provenance after it.

``check_models`` resolves every engine and model a scenario names before anything is
launched or written; ``prepare`` runs before the process starts (port, GPUs via NVML, the
engine's program, the tiny model, the engine's own conversion of the checkpoint) so that a
launch that cannot work fails at once with a one-line reason; ``engine_info`` asks the ready
engine what it is.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable

import httpx

from loadgen.engines.build import foreign_option, not_taken
from loadgen.engines.catalogue import resolve_model
from loadgen.engines.hub import unavailable
from loadgen.engines.registry import SIM, engine_named
from loadgen.engines.spec import EngineSpec
from loadgen.errors import EngineUnavailable, LaunchError, ScenarioError, UsageError
from loadgen.results.provenance import EngineSays, LaunchRecord
from loadgen.scenario.matrix import points
from loadgen.scenario.redact import redact_secret_flags
from loadgen.scenario.schema import Scenario
from loadgen.servers.launch import LaunchSpec, check_port, shell_line


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prepare(
    spec: EngineSpec, launch: LaunchSpec, *, force: bool = False, echo: Callable[[str], None] = _stderr,
) -> LaunchRecord:
    """Everything checked (and converted) before launch; returns the engine's provenance so far."""
    info = LaunchRecord(
        spec.backend, redact_secret_flags(launch.argv), shell_line(launch), dict(launch.env), spec.device,
        spec.model.checkpoint, spec.served_name, spec.model.quant, spec.setting.name, spec.tp, spec.pp,
    )
    check_port(launch)  # first: cheaper and clearer than any GPU check
    # GPUs before the program: on a machine without any, that is the reason it cannot run
    if spec.device == "cuda":
        from loadgen.servers.gpus import check_gpus, gpu_count

        try:
            info.gpus = [g.as_dict() for g in check_gpus(spec.gpus, force=force)]
        except LaunchError as exc:
            if not gpu_count():  # no GPU at all: the engine cannot run here
                raise EngineUnavailable(str(exc), exc.log_tail) from exc
            raise
    engine = engine_named(spec.backend)
    if (why := engine.missing(spec, launch)) is not None:
        raise EngineUnavailable(why)
    if spec.model.entry is not None and spec.model.entry.generated:
        from loadgen.servers.tiny import ensure_tiny

        ensure_tiny()
    elif (why := unavailable(spec.model.checkpoint)) is not None:
        raise EngineUnavailable(why)
    if engine.prepare is not None:
        engine.prepare(spec, launch, echo)
    return info


def prepare_container(spec: EngineSpec, launch: LaunchSpec, runtime: str, *, force: bool = False) -> None:
    """Before ``docker run`` / ``podman run``: the runtime is there, the port is free, the tiny
    model exists (it is mounted), the GPUs are free."""
    if shutil.which(runtime) is None:
        raise LaunchError(f"--container {runtime}: {runtime!r} is not on PATH; install it, or drop --container")
    check_port(launch)
    if spec.model.entry is not None and spec.model.entry.generated:
        from loadgen.servers.tiny import ensure_tiny

        ensure_tiny()
    if spec.device == "cuda":
        from loadgen.servers.gpus import check_gpus

        check_gpus(spec.gpus, force=force)


def engine_info(base_url: str) -> EngineSays:
    """What the ready engine says about itself: ``/version`` (vLLM, SGLang, loadgen's engines),
    ``/info`` (TGI), ``/props`` (llama.cpp); the first that answers."""
    root = base_url.removesuffix("/v1")
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        for path in ("/version", "/info", "/props"):
            try:
                r = http.get(root + path)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                try:
                    body = r.json()
                except json.JSONDecodeError:
                    continue
                if isinstance(body, dict):
                    says: EngineSays = {"endpoint": path}
                    says.update((str(k), v) for k, v in body.items() if v is None or isinstance(v, str | int | float))
                    return says
    return {}


def check_models(scenario: Scenario, source: str) -> None:
    """Every engine and model a scenario (or one of its matrix points) names resolves, before
    anything is launched or written."""
    for _, point in points(scenario, source):
        serve = point.serve
        if serve is None or serve.backend == SIM:
            continue
        try:
            engine = engine_named(serve.backend, "serve.backend")
        except UsageError as exc:
            raise ScenarioError(f"{source}: {exc}") from None
        if (option := foreign_option(serve, engine)) is not None:
            raise ScenarioError(f"{source}: serve.{option} -> {not_taken(engine, option)}")
        try:
            resolve_model(serve.model or "", serve.quant, engine.quants, engine.name)
        except UsageError as exc:
            if serve.skip_unavailable:
                continue  # that point is skipped, with the reason, when its turn comes
            raise ScenarioError(f"{source}: serve.model -> {exc}") from None
