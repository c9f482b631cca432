"""The targets a run measures: cells grouped by the engine they need, each group's engine
launched from its ``serve:`` block (or loadgen's simulator), described for the tables, and
how a cell ended when its engine died under it.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadgen.engines.build import build_spec, launch_spec
from loadgen.engines.preflight import engine_info, prepare
from loadgen.engines.registry import SIM, backend_of, engine_named
from loadgen.engines.spec import EngineSpec
from loadgen.errors import LaunchError, UsageError
from loadgen.results.cellstatus import ServerInfo, SettingValues
from loadgen.results.provenance import LaunchRecord, Placement, Provenance
from loadgen.results.records import RequestRecord
from loadgen.results.rundir import RunDirWriter
from loadgen.scenario.matrix import Cell
from loadgen.scenario.redact import redact_secret_flags, redact_url
from loadgen.scenario.schema import Scenario
from loadgen.scenario.serve import Serve
from loadgen.servers.cpus import cores_text, listener_cores, pin, split_cores, usable_cores
from loadgen.servers.launch import LaunchedServer, free_port, shell_line, sim_spec, tail


def group_cells(cells: list[Cell], *, launched: bool) -> list[list[Cell]]:
    """Cells that need the same engine, in order of first appearance (one group if none is launched)."""
    if not launched:
        return [cells]
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(serve_key(cell.point), []).append(cell)
    return list(groups.values())


def serve_key(point: Scenario) -> str:
    """Points with equal keys run on the same engine."""
    assert point.serve is not None
    return point.serve.model_dump_json(exclude={"port"})


def engine_spec(point: Scenario, cpus: tuple[int, ...] = ()) -> EngineSpec:
    """The engine a matrix point's ``serve:`` block names, resolved as ``loadgen serve`` does
    (``cpus``: the cores of a CPU engine)."""
    serve = point.serve
    assert serve is not None
    assert serve.model is not None
    sweep = [c for c in point.load.concurrency if c is not None]
    unlimited = len(sweep) < len(point.load.concurrency)
    if (search := point.load.search) is not None and search.by == "concurrency":
        sweep, unlimited = [int(search.max)], False
    port = serve.port or free_port(serve.host)
    slots = serve.slots
    if slots is None and "slots" in engine_named(serve.backend).options:
        slots = max([*sweep, point.workload.num_prompts if unlimited else 1])
    return build_spec(serve.model_copy(update={"port": port, "slots": slots}), cpus)


def as_keys(text: str) -> str:
    """``loadgen serve``'s words in a scenario's: each of its flags (``--tp``) becomes the
    ``serve:`` key that sets it (``serve.tp``), the key ``--set`` takes; a command quoted in
    backticks is left as it is."""
    def key(m: re.Match[str]) -> str:
        name = m.group(1).replace("-", "_")
        return f"serve.{name}" if name in Serve.model_fields else m.group(0)

    parts = text.split("`")
    return "`".join(p if i % 2 else re.sub(r"(?<![\w-])--([a-z][a-z0-9-]*)", key, p) for i, p in enumerate(parts))


def spec_summary(spec: EngineSpec) -> ServerInfo:
    """The resolved engine configuration a cell ran on, as the tables show it."""
    s = spec.setting
    return ServerInfo(
        backend=spec.backend, launched=True, model=spec.served_name, checkpoint=spec.model.checkpoint,
        quant=spec.model.quant, device=spec.device, gpus=spec.gpus,
        gpu_count=len(spec.gpus) if spec.device == "cuda" else 0, tp=spec.tp, pp=spec.pp, setting=s.name,
        setting_values=SettingValues(s.gpu_memory_utilization, s.max_model_len, s.enforce_eager),
        attn=spec.attn, load_in=spec.load_in, grad_mode=spec.grad_mode,
    )


def launch_target(
    point: Scenario, log_path: Path, provenance: Provenance, out: RunDirWriter, message: Callable[[str], None],
    cpus: tuple[int, ...] = (),
) -> tuple[LaunchedServer, str, LaunchRecord]:
    """Start the simulator or engine of a point's ``serve:`` block, logging to ``log_path``;
    ``cpus``: the cores it gets when it runs on CPU here (the simulator always does). What is
    launched goes into provenance as soon as it is known (the command, then the process id, then
    readiness and the engine's version), each time written through ``out``."""
    assert point.serve is not None
    if point.serve.backend == SIM:
        launch = replace(sim_spec(point.serve), cpus=cpus)
        info = LaunchRecord(SIM, redact_secret_flags(launch.argv))
    else:
        try:
            spec = engine_spec(point, cpus)
            launch = launch_spec(spec)
            if point.serve.ready_timeout_s is not None:
                launch = replace(launch, ready_timeout_s=point.serve.ready_timeout_s)
            if point.load.reset_cache == "between-cells":
                # what the engine needs to serve POST /reset_prefix_cache
                launch = replace(launch, env={**launch.env, **engine_named(spec.backend).reset_cache_env})
            info = prepare(spec, launch, force=point.serve.force)
        except LaunchError as exc:
            raise type(exc)(as_keys(str(exc)), exc.log_tail) from exc
        except UsageError as exc:
            raise type(exc)(as_keys(str(exc))) from exc
        info.spec = spec_summary(spec)
    info.log = log_path.name
    provenance.launched(info)
    out.write_provenance(provenance)
    server = LaunchedServer(launch, log_path, on_wait=message)
    message(f"starting {launch.name}: {shell_line(launch)}")
    t = time.monotonic()

    def spawned(pid: int) -> None:  # on record before readiness, so that no engine goes untraced
        info.pid = pid
        out.write_provenance(provenance)

    base_url = server.start(on_spawn=spawned)
    info.ready_s = round(time.monotonic() - t, 3)
    if launch.name != SIM:
        info.engine = engine_info(base_url)
    out.write_provenance(provenance)
    message(f"{launch.name} ready at {base_url} in {info.ready_s:.1f} s (log: {log_path})")
    return server, base_url, info


def describe_server(point: Scenario, info: LaunchRecord | None) -> ServerInfo:
    """What a table needs to know of a cell's server: engine, model, quantization, GPUs, setting
    (``info``: what the launch recorded of it, in provenance; None: no launch)."""
    serve = point.serve
    if serve is None:
        url = point.target.base_url
        return ServerInfo(base_url=url and redact_url(url), quant=point.target.quant)
    version = info.version if info is not None else None
    if info is not None and info.spec is not None:
        return replace(info.spec, version=version)
    return ServerInfo(
        # an engine's spec says its dtype or quantization; the simulator has none unless declared
        backend=backend_of(serve.backend), launched=True, model=serve.model,
        quant=serve.quant or point.target.quant or (None if serve.backend == SIM else "bf16"),
        setting=serve.setting, tp=serve.tp or 1, attn=serve.attn, load_in=serve.load_in,
        grad_mode=serve.grad_mode, version=version,
    )


def name_the_model(desc: ServerInfo, model: str, models: Any) -> ServerInfo:
    """The server with the model it serves (its ``/v1/models`` id) where the launch did not name
    one, and, for a server loadgen did not start, the engine that list says owns it."""
    if not desc.model:
        desc = replace(desc, model=model)
    data = models.get("data") if isinstance(models, dict) else None
    if desc.backend is None and isinstance(data, list):
        owners = [m.get("owned_by") for m in data if isinstance(m, dict) and m.get("id") == model]
        if owners and isinstance(owners[0], str) and owners[0]:
            desc = replace(desc, owned_by=owners[0])
    return desc


def exit_status(code: int) -> str:
    """How a process ended, in words: 'exited with status 1' / 'was killed by SIGKILL (-9)'."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name} ({code})"
        except ValueError:
            pass
    return f"exited with status {code}"


def cell_outcome(records: list[RequestRecord], server: LaunchedServer | None) -> tuple[str, str | None]:
    """``done``, or ``failed`` with the reason: no request completed, or the engine died."""
    measured = [r for r in records if not r.warmup]
    if server is not None and server.proc is not None and (code := server.proc.poll()) is not None:
        last = tail(server.log_path, 1).strip()
        return "failed", f"the engine {exit_status(code)} during the cell ({last[:200]})"
    if any(r.answered for r in measured):
        return "done", None
    if empty := [r for r in measured if r.ok]:  # streams that ended well and carried no token
        return "failed", f"no request streamed a token ({len(empty)} streams ended without one)"
    failed = [r for r in records if not r.ok]
    if not failed:
        return "failed", "no request was measured"
    detail = Counter(f"{r.error}: {r.error_detail or ''}".strip() for r in failed).most_common(1)[0][0]
    return "failed", f"no request completed ({detail[:300]})"


def is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def place_client(
    point: Scenario, base_url: str, launched: LaunchedServer | None, message: Callable[[str], None]
) -> Placement | None:
    """Pin this process (and the worker processes it will start) away from the engine's cores:
    those loadgen gave an engine it launched, or those of the process listening on a local
    ``base_url``; ``load.client_cpus`` as given wins. Returns what was decided, for provenance
    (None: nothing to separate)."""
    available = usable_cores()
    wanted = point.load.client_cpus
    engine: tuple[int, ...] = ()
    how = ""
    if launched is not None and launched.spec.cpus:
        engine, how = launched.spec.cpus, f"loadgen launched {launched.spec.name} on these cores"
    elif launched is None and is_local(base_url) and (port := urlsplit(base_url).port) is not None:
        found = listener_cores(port)
        if found is not None and found[1] and set(found[1]) < set(available):
            engine, how = found[1], f"the process listening on port {port} (pid {found[0]}) is pinned to these cores"
    if isinstance(wanted, tuple):
        if missing := [c for c in wanted if c not in available]:
            raise UsageError(f"load.client_cpus: core {missing[0]} is not available here (cores {list(available)})")
        client = wanted
    elif engine:
        rest = tuple(c for c in available if c not in engine)
        client = rest[-wanted:] if isinstance(wanted, int) else rest
    elif isinstance(wanted, int) and (split := split_cores(available, wanted)) is not None:
        client = split[1]
    else:
        if launched is not None and len(available) < 2:
            message("engine and client share the only core this process may use: the client may wait for the engine")
        return None
    if not client:
        message(f"no core left for the client beside the engine's {cores_text(engine)}: they share cores")
        return None
    pin(0, client)
    message(f"cores: engine {cores_text(engine) if engine else '-'} | client {cores_text(client)}")
    return Placement(engine, client, how or "load.client_cpus")


def engine_to_watch(base_url: str, launched: LaunchedServer | None, placed: Placement | None
                    ) -> tuple[int, tuple[int, ...]] | None:
    """(pid, cores) of the engine on this host whose cores are its own (pinned there, apart from
    the client's), or None when they are not known."""
    if placed is None or not placed.engine:
        return None
    if launched is not None:
        return (launched.proc.pid, placed.engine) if launched.proc is not None else None
    port = urlsplit(base_url).port
    found = listener_cores(port) if port is not None and is_local(base_url) else None
    return (found[0], placed.engine) if found is not None else None
