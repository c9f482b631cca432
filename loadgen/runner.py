"""``execute``: a scenario end to end, from server to run directory.

scenario -> cells -> (server launched or given) -> per cell: prompts, warmup, schedule,
engine -> records.jsonl (as each request ends) -> summary.json (after every cell).
Progress goes to an ``Observer``; nothing here prints.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import numpy as np

from loadgen import __version__
from loadgen.backends import build_spec, launch_spec, shell_line
from loadgen.client import PreparedRequest, StreamingClient
from loadgen.engine import LoadPlan, run_load
from loadgen.engines import engine_info, prepare
from loadgen.errors import ScenarioError, TargetError, UsageError
from loadgen.launcher import LaunchedServer, LaunchSpec, free_port, sim_spec
from loadgen.payload import Prompt, build_payload, encode_payload
from loadgen.records import RecordWriter, RequestRecord
from loadgen.rundir import (
    PROVENANCE,
    RECORDS,
    REPORT,
    SCENARIO,
    SERVER_LOG,
    SUMMARY,
    assemble_summary,
    cell_summary,
    write_json,
)
from loadgen.scenario import Cell, PromptFile, Scenario, dump_scenario, expand_cells
from loadgen.schedule import iter_offsets
from loadgen.workload import TextCalibration, build_prompts, random_words


class Observer(Protocol):
    """What a front end (the CLI's progress bar) is told while a run goes on."""

    def message(self, text: str) -> None: ...
    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None: ...
    def record(self, record: RequestRecord) -> None: ...
    def cell_finished(self, cell: Cell, metrics: dict[str, Any]) -> None: ...


class QuietObserver:
    def message(self, text: str) -> None:
        pass

    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
        pass

    def record(self, record: RequestRecord) -> None:
        pass

    def cell_finished(self, cell: Cell, metrics: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True, slots=True)
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    interrupted: bool


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def execute(
    scenario: Scenario,
    run_dir: Path,
    *,
    base_url: str | None = None,
    observer: Observer | None = None,
    render_report: Callable[[dict[str, Any]], str] | None = None,
) -> RunResult:
    """Run every cell of ``scenario`` and write ``run_dir``; returns the summary."""
    obs = observer or QuietObserver()
    if scenario.load.workers != 1:
        raise UsageError(
            "load.workers: only 1 worker process is supported in this version; set workers: 1"
        )
    base_url = base_url or scenario.target.base_url
    if base_url is None and scenario.serve is None:
        raise ScenarioError(
            "target.base_url -> no server to measure; give --base-url, target.base_url "
            "or a serve: block"
        )
    if (run_dir / RECORDS).exists():
        raise UsageError(
            f"{run_dir}: already holds a run ({RECORDS}); choose another --out or remove it"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SCENARIO).write_text(dump_scenario(scenario))
    provenance: dict[str, Any] = {
        "loadgen_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "user": getpass.getuser(),
        "argv": sys.argv,
        "seed": scenario.seed,
        "start_wall": datetime.now(UTC).isoformat(),
    }
    write_json(run_dir / PROVENANCE, provenance)
    server: LaunchedServer | None = None
    try:
        if base_url is None:
            assert scenario.serve is not None
            server, base_url = _launch(scenario, run_dir, provenance, obs)
        provenance["base_url"] = base_url
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            summary, interrupted = runner.run(
                _run(scenario, run_dir, base_url, provenance, obs, render_report)
            )
    finally:
        if server is not None:
            server.stop()
        provenance["end_wall"] = datetime.now(UTC).isoformat()
        write_json(run_dir / PROVENANCE, provenance)
    return RunResult(run_dir, summary, interrupted)


def _engine_launch(scenario: Scenario) -> tuple[LaunchSpec, dict[str, Any]]:
    """The engine the ``serve:`` block names, checked as ``loadgen serve`` checks it."""
    serve = scenario.serve
    assert serve is not None
    assert serve.model is not None
    sweep = [c for c in scenario.load.concurrency if isinstance(c, int)]
    unlimited = len(sweep) < len(scenario.load.concurrency)
    slots = serve.slots or max([*sweep, scenario.workload.num_prompts if unlimited else 1])
    spec = build_spec(
        serve.model, backend=serve.engine, device=serve.device, quant=serve.quant, setting=serve.setting,
        tp=serve.tp, pp=serve.pp, gpus=serve.gpus, host=serve.host, port=serve.port or free_port(serve.host),
        kv_cache_dtype=serve.kv_cache_dtype, load_format=serve.load_format, attn=serve.attn, slots=slots,
        extra_args=serve.extra_args,
    )
    launch = launch_spec(spec)
    if serve.ready_timeout_s is not None:
        launch = replace(launch, ready_timeout_s=serve.ready_timeout_s)
    return launch, prepare(spec, launch, force=serve.force)


def _launch(
    scenario: Scenario, run_dir: Path, provenance: dict[str, Any], obs: Observer
) -> tuple[LaunchedServer, str]:
    """Start the simulator or engine of the ``serve:`` block; its log goes to the run directory."""
    assert scenario.serve is not None
    if scenario.serve.engine == "sim":
        spec = sim_spec(scenario.serve)
        info: dict[str, Any] = {"backend": "sim", "argv": list(spec.argv)}
    else:
        spec, info = _engine_launch(scenario)
    provenance["server"] = info
    write_json(run_dir / PROVENANCE, provenance)
    server = LaunchedServer(spec, run_dir / SERVER_LOG)
    obs.message(f"starting {spec.name}: {shell_line(spec)}")
    t = time.monotonic()

    def spawned(pid: int) -> None:  # on record before readiness, so that no engine goes untraced
        info["pid"] = pid
        write_json(run_dir / PROVENANCE, provenance)

    base_url = server.start(on_spawn=spawned)
    info["ready_s"] = round(time.monotonic() - t, 3)
    if spec.name != "sim":
        info["engine"] = engine_info(base_url)
    obs.message(f"{spec.name} ready at {base_url} in {info['ready_s']:.1f} s (log: {run_dir / SERVER_LOG})")
    return server, base_url


async def _run(
    scenario: Scenario,
    run_dir: Path,
    base_url: str,
    provenance: dict[str, Any],
    obs: Observer,
    render_report: Callable[[dict[str, Any]], str] | None,
) -> tuple[dict[str, Any], bool]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    target = scenario.target
    api_key = os.environ.get(target.api_key_env) if target.api_key_env else None
    cells = expand_cells(scenario)
    entries: list[dict[str, Any]] = []
    writer = RecordWriter(run_dir / RECORDS)
    clock_base = time.perf_counter_ns()
    provenance["clock_base_ns"] = clock_base

    def summary_now() -> dict[str, Any]:
        return assemble_summary(scenario, entries, model=provenance.get("model"), interrupted=stop.is_set())

    try:
        async with StreamingClient(target, base_url, clock_base_ns=clock_base, api_key=api_key) as client:
            model = await _resolve_model(client, base_url, target.model, provenance)
            provenance["model"] = model
            write_json(run_dir / PROVENANCE, provenance)
            calibration = TextCalibration()
            if _needs_calibration(scenario):
                calibration = await _calibrate(client, scenario, model)
                provenance["text_calibration"] = {
                    "overhead": calibration.overhead, "per_word": calibration.per_word,
                }
            for cell in cells:
                if stop.is_set():
                    break
                records: list[RequestRecord] = []

                def emit(r: RequestRecord, records: list[RequestRecord] = records) -> None:
                    writer.write(r)
                    records.append(r)
                    obs.record(r)

                try:
                    await _run_cell(client, scenario, cell, model, calibration, emit, stop, obs, len(cells))
                finally:
                    # each cell is summarised once, also when the run breaks off inside it
                    if records:
                        entries.append(cell_summary(scenario, cell, records))
                _write_outputs(run_dir, summary_now(), render_report)
                if records:
                    obs.cell_finished(cell, entries[-1]["metrics"])
    finally:
        writer.close()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if writer.count:
            _write_outputs(run_dir, summary_now(), render_report)
    return summary_now(), stop.is_set()


def _write_outputs(
    run_dir: Path, summary: dict[str, Any], render_report: Callable[[dict[str, Any]], str] | None
) -> None:
    write_json(run_dir / SUMMARY, summary)
    if render_report is not None:
        (run_dir / REPORT).write_text(render_report(summary))


async def _resolve_model(
    client: StreamingClient, base_url: str, wanted: str, provenance: dict[str, Any]
) -> str:
    try:
        models = await client.fetch_models()
    except (httpx.HTTPError, ValueError) as exc:
        reason = str(exc) or type(exc).__name__
        if wanted == "auto":
            raise TargetError(
                f"{base_url}/models: cannot list models ({reason}); is an OpenAI-compatible "
                "server running there? (or set target.model to skip the lookup)"
            ) from exc
        provenance["server_models"] = {"error": reason}
        return wanted
    provenance["server_models"] = models
    if wanted != "auto":
        return wanted
    ids = [m.get("id") for m in models["data"] if isinstance(m, dict)]
    if not ids:
        raise TargetError(f"{base_url}/models: the server lists no model; set target.model")
    return str(ids[0])


def _needs_calibration(scenario: Scenario) -> bool:
    w = scenario.workload
    if isinstance(w.prompt, PromptFile):
        return False
    return scenario.target.api == "chat" or w.prompt == "text"


async def _calibrate(client: StreamingClient, scenario: Scenario, model: str) -> TextCalibration:
    """Two probes (16 and 48 words) give the template overhead and tokens per word."""
    rng = np.random.default_rng(scenario.seed)
    seen: list[RequestRecord] = []
    points = []
    for words in (16, 48):
        body = build_payload(
            scenario.target.api, model, Prompt(None, text=random_words(rng, words)), 1,
            sampling=scenario.workload.sampling, ignore_eos=scenario.workload.ignore_eos,
            min_tokens=scenario.workload.min_tokens,
            continuous_usage_stats=scenario.target.continuous_usage_stats,
        )
        req = PreparedRequest(-1, encode_payload(body), None, 1, warmup=True)
        await client.send(req, -1, time.perf_counter_ns(), seen.append)
        if seen[-1].prompt_tokens is None:
            return TextCalibration()
        points.append((words, seen[-1].prompt_tokens))
    (w1, t1), (w2, t2) = points
    per_word = (t2 - t1) / (w2 - w1)
    if per_word <= 0:
        return TextCalibration()
    return TextCalibration(overhead=t1 - per_word * w1, per_word=per_word)


async def _run_cell(
    client: StreamingClient,
    scenario: Scenario,
    cell: Cell,
    model: str,
    calibration: TextCalibration,
    emit: Callable[[RequestRecord], None],
    stop: asyncio.Event,
    obs: Observer,
    n_cells: int,
) -> None:
    w, ld = scenario.workload, scenario.load
    prompts = build_prompts(
        w, cell.input_tokens, api=scenario.target.api, seed=scenario.seed, calibration=calibration
    )
    pool = [
        PreparedRequest(
            cell.index,
            encode_payload(build_payload(
                scenario.target.api, model, p, cell.output_tokens, sampling=w.sampling,
                ignore_eos=w.ignore_eos, min_tokens=w.min_tokens,
                continuous_usage_stats=scenario.target.continuous_usage_stats,
            )),
            p.input_tokens,
            cell.output_tokens,
        )
        for p in prompts
    ]
    # open the connections the measured window needs, so TTFT holds no connection setup
    await client.open_connections(min(cell.concurrency or w.num_prompts, w.num_prompts, 1024))
    if ld.warmup_requests:
        warm = [replace(pool[i % len(pool)], warmup=True) for i in range(ld.warmup_requests)]
        conc = min(cell.concurrency or len(warm), len(warm))
        plan = LoadPlan(warm, iter_offsets(None), len(warm), conc)
        await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=emit, stop=stop)
    count = None if ld.duration_s else w.num_prompts
    obs.cell_started(cell, count, n_cells)
    offsets = iter_offsets(cell.rate, arrival=ld.arrival, burstiness=ld.burstiness, seed=scenario.seed)
    plan = LoadPlan(pool, offsets, count, cell.concurrency, ld.duration_s)
    await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=emit, stop=stop)
