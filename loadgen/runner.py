"""``execute``: a scenario end to end, from server to run directory.

scenario -> cells -> (server launched or given) -> per cell: prompts, warmup, schedule,
engine -> records.jsonl (as each request ends) -> summary.json (after every cell).
Progress goes to an ``Observer``; nothing here prints.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson

from loadgen.backends import EngineSpec, build_spec, launch_spec, shell_line
from loadgen.client import StreamingClient
from loadgen.engine import LoadPlan, run_load
from loadgen.engines import engine_info, prepare
from loadgen.errors import LaunchError, ScenarioError, TargetError, UsageError
from loadgen.launcher import LaunchedServer, free_port, sim_spec, tail
from loadgen.matrix import Cell, expand_cells
from loadgen.payload import ENDPOINTS, PreparedRequest, api_key
from loadgen.probes import PROBES, GpuSampler, MetricsScraper, ProbeLog
from loadgen.records import RecordWriter, RequestRecord, read_records
from loadgen.rundir import (
    PROVENANCE,
    RECORDS,
    REPORT,
    SCENARIO,
    SERVER_LOG,
    SUMMARY,
    CellStatusLog,
    assemble_summary,
    base_provenance,
    build_summary_from_dir,
    cell_summary,
    read_cell_status,
    set_aside_records,
    write_json,
)
from loadgen.scenario import Scenario, dump_scenario
from loadgen.schedule import iter_offsets
from loadgen.selfcheck import ClientMonitor
from loadgen.workers import resolve_workers, run_workers, worker_jobs
from loadgen.workload import (
    TextCalibration,
    calibration_from,
    calibration_probes,
    needs_calibration,
    prepare_requests,
)


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
    aborted: str | None = None  # the abort rule that ended the run, in words


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
    resume: bool = False,
    retry_failed: bool = False,
) -> RunResult:
    """Run every cell of ``scenario`` (one engine per distinct ``serve`` configuration, reused
    across its cells) and write ``run_dir``. A cell that fails is recorded with its reason and
    the run goes on; ``resume`` continues a run directory, skipping finished cells."""
    obs = observer or QuietObserver()
    base_url = base_url or scenario.target.base_url
    if base_url is None and scenario.serve is None:
        raise ScenarioError(
            "target.base_url -> no server to measure; give --base-url, target.base_url "
            "or a serve: block"
        )
    cells = expand_cells(scenario)
    if resume:
        provenance, finished = _reopen(scenario, run_dir, retry_failed)
    else:
        if (run_dir / RECORDS).exists():
            raise UsageError(
                f"{run_dir}: already holds a run ({RECORDS}); choose another --out, remove it, "
                "or continue it with --resume"
            )
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SCENARIO).write_text(dump_scenario(scenario))
        provenance = base_provenance(scenario)
        finished = set()
    write_json(run_dir / PROVENANCE, provenance)
    groups = group_cells(cells, launched=base_url is None)
    # a plain run ends when its engine dies or the server refuses the scenario; a matrix records
    # the cell and goes on (a dead engine is replaced for the next cells)
    plain = len(groups) == 1 and not scenario.matrix_blocks
    run = _Run(scenario, run_dir, provenance, obs, render_report, len(cells), plain=plain)
    try:
        for n, group in enumerate(groups):
            todo = [c for c in group if c.index not in finished]
            while todo and not run.stop_requested:
                todo = run.serve_group(todo, base_url, n, len(groups), single=len(groups) == 1 and not finished)
                if plain and run.engine_death is not None:
                    todo = []
    finally:
        run.close()
        provenance["end_wall"] = datetime.now(UTC).isoformat()
        write_json(run_dir / PROVENANCE, provenance)
    if plain and run.engine_death is not None:
        how, log, index = run.engine_death
        raise LaunchError(
            f"the engine {how} during cell {index + 1}; the run directory holds every request measured "
            f"({run_dir}; engine log: {log})",
            tail(log),
        )
    summary = run.summary()
    if run.abort_reason is not None:
        summary["aborted"] = run.abort_reason
        write_json(run_dir / SUMMARY, summary)
    return RunResult(run_dir, summary, run.stop_requested, run.abort_reason)


class AbortRule:
    """``load.abort_on_error_rate``: stops the run once that share of a cell's finished
    measured requests failed (cancelled ones aside), counted from ``abort_min_requests`` on."""

    def __init__(self, point: Scenario, stop: asyncio.Event) -> None:
        self.rate = point.load.abort_on_error_rate
        self.min = point.load.abort_min_requests
        self.stop = stop
        self.finished = 0
        self.failed = 0
        self.reason: str | None = None

    def add(self, r: RequestRecord) -> None:
        if self.rate is None or r.warmup or r.error == "cancelled" or self.reason is not None:
            return
        self.finished += 1
        self.failed += not r.ok
        if self.finished >= self.min and self.failed / self.finished >= self.rate:
            self.reason = (
                f"{self.failed} of {self.finished} requests failed ({self.failed / self.finished:.0%} >= "
                f"load.abort_on_error_rate {self.rate:.0%})"
            )
            self.stop.set()


def group_cells(cells: list[Cell], *, launched: bool) -> list[list[Cell]]:
    """Cells that need the same engine, in order of first appearance (one group if none is launched)."""
    if not launched:
        return [cells]
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        assert cell.point is not None
        assert cell.point.serve is not None
        key = cell.point.serve.model_dump_json(exclude={"port"})
        groups.setdefault(key, []).append(cell)
    return list(groups.values())


def _reopen(scenario: Scenario, run_dir: Path, retry_failed: bool) -> tuple[dict[str, Any], set[int]]:
    """An interrupted run directory to continue: same scenario; records of unfinished cells set aside."""
    if not (run_dir / SCENARIO).is_file():
        raise UsageError(f"{run_dir}: --resume needs an existing run directory (no {SCENARIO} there)")
    if (run_dir / SCENARIO).read_text() != dump_scenario(scenario):
        raise UsageError(
            f"{run_dir}: --resume: the scenario differs from the one this run started with "
            f"({SCENARIO}); resume with the same file and --set values, or start a new run"
        )
    statuses = read_cell_status(run_dir)
    finished = {i for i, s in statuses.items() if s["status"] == "done" or not retry_failed}
    set_aside_records(run_dir, keep=finished)
    provenance: dict[str, Any] = orjson.loads((run_dir / PROVENANCE).read_bytes())
    provenance.setdefault("resumed_wall", []).append(datetime.now(UTC).isoformat())
    return provenance, finished


class _Run:
    """The state of one ``execute``: open files, summaries so far, the stop flag."""

    def __init__(
        self, scenario: Scenario, run_dir: Path, provenance: dict[str, Any], obs: Observer,
        render_report: Callable[[dict[str, Any]], str] | None, n_cells: int, *, plain: bool,
    ) -> None:
        self.scenario, self.run_dir, self.provenance, self.obs = scenario, run_dir, provenance, obs
        self.render_report, self.n_cells = render_report, n_cells
        self.entries: dict[int, dict[str, Any]] = {
            e["cell"]: e for e in build_summary_from_dir(run_dir, scenario)["cells"]
        }
        self.writer = RecordWriter(run_dir / RECORDS)
        self.probes = ProbeLog(run_dir / PROBES)
        self.status = CellStatusLog(run_dir)
        self.stop_requested = False
        self.abort_reason: str | None = None
        # a plain run (one engine, no matrix) stops at bad input; a matrix fails the cell and goes on
        self.plain = plain
        self.context: int | None = None  # the served model's context length, when the server says
        # (how it exited, its log, the cell it died in) of the last engine that died mid-cell
        self.engine_death: tuple[str, Path, int] | None = None

    def summary(self) -> dict[str, Any]:
        cells = [self.entries[i] for i in sorted(self.entries)]
        return assemble_summary(
            self.scenario, cells, model=self.provenance.get("model"), interrupted=self.stop_requested
        )

    def write_outputs(self) -> None:
        summary = self.summary()
        write_json(self.run_dir / SUMMARY, summary)
        if self.render_report is not None:
            (self.run_dir / REPORT).write_text(self.render_report(summary))

    def finish_cell(
        self, cell: Cell, records: list[RequestRecord], status: str, reason: str | None, server: dict[str, Any]
    ) -> None:
        line = {"cell": cell.index, "status": status, "reason": reason, "server": server}
        self.status.write(line)
        samples = self.probes.samples(cell.index)
        self.entries[cell.index] = cell_summary(self.scenario, cell, records, line, samples)
        self.write_outputs()
        self.obs.cell_finished(cell, self.entries[cell.index].get("metrics") or {})
        if status == "failed":
            self.obs.message(f"cell {cell.index + 1}/{self.n_cells} failed: {reason}")
        if (health := self.entries[cell.index].get("client")) and health["client_bound"]:
            self.obs.message(
                f"warning: cell {cell.index + 1}/{self.n_cells} was client-bound ({'; '.join(health['reasons'])}): "
                f"its TTFT / ITL include the client's own delay; {health['advice']}"
            )

    def serve_group(
        self, todo: list[Cell], base_url: str | None, n: int, n_groups: int, *, single: bool
    ) -> list[Cell]:
        """Launch the group's engine (unless given a URL), run its cells; returns the cells left
        when the engine died in one (they get a fresh engine), else []."""
        server: LaunchedServer | None = None
        point = todo[0].point
        assert point is not None
        info: dict[str, Any] = {}
        url = base_url
        if url is None:
            log = SERVER_LOG if n_groups == 1 else f"server-{n + 1}.log"
            try:
                server, url, info = _launch(point, self.run_dir / log, self.provenance, self.obs)
            except LaunchError as exc:
                if single:
                    raise
                for cell in todo:
                    self.finish_cell(cell, [], "failed", f"engine did not start: {exc}", describe_server(point, {}))
                return []
            except UsageError as exc:
                for cell in todo:
                    self.finish_cell(cell, [], "failed", str(exc), describe_server(point, {}))
                return []
        try:
            with asyncio.Runner(loop_factory=_new_loop) as runner:
                return runner.run(self._run_cells(todo, url, server, info))
        finally:
            if server is not None:
                server.stop()

    async def _run_cells(
        self, todo: list[Cell], base_url: str, server: LaunchedServer | None, info: dict[str, Any]
    ) -> list[Cell]:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        point = todo[0].point
        assert point is not None
        target = point.target
        clock_base = self.provenance.setdefault("clock_base_ns", time.perf_counter_ns())
        desc = describe_server(point, info)
        try:
            async with StreamingClient(
                target, base_url, clock_base_ns=clock_base, api_key=api_key(target),
                new_connection_per_request=point.load.new_connection_per_request,
            ) as client:
                model = await _resolve_model(client, base_url, target.model, self.provenance)
                self.provenance["model"] = model
                self.context = model_context(self.provenance.get("server_models"), model)
                if self.plain and self.context is not None:
                    for cell in todo:
                        if (why := too_long(cell, self.context)) is not None:
                            raise ScenarioError(f"{self.scenario.name}: {why}")
                write_json(self.run_dir / PROVENANCE, self.provenance)
                calibration = TextCalibration()
                if needs_calibration(point):
                    calibration = await _calibrate(client, point, model)
                    self.provenance["text_calibration"] = {
                        "overhead": calibration.overhead, "per_word": calibration.per_word,
                    }
                async with MetricsScraper(base_url) as scraper:
                    return await self._cells(client, scraper, todo, server, model, calibration, desc, stop)
        finally:
            self.stop_requested = self.stop_requested or (stop.is_set() and self.abort_reason is None)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _cells(
        self, client: StreamingClient, scraper: MetricsScraper, todo: list[Cell], server: LaunchedServer | None,
        model: str, calibration: TextCalibration, desc: dict[str, Any], stop: asyncio.Event,
    ) -> list[Cell]:
        """Measure the cells one after another; returns those left if the engine died."""
        for k, cell in enumerate(todo):
            if stop.is_set():
                break
            # the cell's records go to disk only (memory stays flat however long the cell);
            # they are read back from where they start once it ends
            start = self.writer.position
            rule = AbortRule(cell.point or self.scenario, stop)

            def emit(r: RequestRecord, rule: AbortRule = rule) -> None:
                self.writer.write(r)
                self.obs.record(r)
                rule.add(r)

            if self.context is not None and (why := too_long(cell, self.context)) is not None:
                self.finish_cell(cell, [], "failed", why, desc)
                continue
            interrupted = False
            refused: str | None = None
            try:
                await self._measure(client, scraper, server, cell, model, calibration, emit, stop)
            except TargetError as exc:
                if self.plain:
                    raise
                refused = str(exc)  # a matrix records the cell and goes on
            finally:
                records = list(read_records(self.run_dir / RECORDS, start))
                interrupted = stop.is_set() and rule.reason is None
                if refused is not None:
                    self.finish_cell(cell, records, "failed", refused, desc)
                elif rule.reason is not None:
                    self.abort_reason = rule.reason
                    self.finish_cell(cell, records, "failed", f"aborted: {rule.reason}", desc)
                elif not interrupted:
                    status, reason = cell_outcome(records, server)
                    self.finish_cell(cell, records, status, reason, desc)
                elif records:  # measured before the stop: summarised, not finished
                    samples = self.probes.samples(cell.index)
                    self.entries[cell.index] = cell_summary(
                        self.scenario, cell, records, {"status": "interrupted", "server": desc}, samples
                    )
                    self.write_outputs()
            if server is not None and server.proc is not None and (code := server.proc.poll()) is not None:
                self.engine_death = (exit_status(code), server.log_path, cell.index)
                return todo[k + 1:]
        return []

    async def _measure(
        self, client: StreamingClient, scraper: MetricsScraper, server: LaunchedServer | None, cell: Cell,
        model: str, calibration: TextCalibration, emit: Callable[[RequestRecord], None], stop: asyncio.Event,
    ) -> None:
        """One cell with its probes: GPU memory of the engine's processes, the server's /metrics."""
        def probe(kind: str) -> Callable[[dict[str, Any]], None]:
            return lambda values: self.probes.write(cell.index, kind, values)

        gpu = GpuSampler(server.proc.pid, probe("gpu")) if server is not None and server.proc else None

        async def measured_window() -> None:
            await scraper.reset_peak()
            if gpu is not None:
                gpu.start()
            # the first scrape is taken before any request is sent: counters over the cell
            # are last minus first, and a request that finished before it would go uncounted
            await scraper.scrape_once(probe("metrics"))
            scraping = asyncio.create_task(scraper.run(probe("metrics"), first_done=True))
            try:
                await _measure_window(client, self.scenario, cell, pool, emit, stop, self.obs, self.n_cells,
                                      probe("client"))
            finally:
                scraping.cancel()
                await asyncio.gather(scraping, return_exceptions=True)
                await scraper.scrape_once(probe("metrics"))
                if gpu is not None:
                    gpu.stop()

        pool = prepare_requests(self.scenario, cell, model, calibration)
        await _warmup(client, cell, pool, emit, stop)
        await measured_window()

    def close(self) -> None:
        self.writer.close()
        self.probes.close()
        self.status.close()
        if self.entries:
            self.write_outputs()


def engine_spec(point: Scenario) -> EngineSpec:
    """The engine a matrix point's ``serve:`` block names, resolved as ``loadgen serve`` does."""
    serve = point.serve
    assert serve is not None
    assert serve.model is not None
    sweep = [c for c in point.load.concurrency if isinstance(c, int)]
    unlimited = len(sweep) < len(point.load.concurrency)
    slots = serve.slots or max([*sweep, point.workload.num_prompts if unlimited else 1])
    return build_spec(
        serve.model, backend=serve.engine, device=serve.device, quant=serve.quant, setting=serve.setting,
        tp=serve.tp, pp=serve.pp, gpus=serve.gpus, host=serve.host, port=serve.port or free_port(serve.host),
        kv_cache_dtype=serve.kv_cache_dtype, load_format=serve.load_format, attn=serve.attn, slots=slots,
        extra_args=serve.extra_args,
    )


def spec_summary(spec: EngineSpec) -> dict[str, Any]:
    """The resolved engine configuration a cell ran on, as the tables show it."""
    s = spec.setting
    return {
        "backend": spec.backend, "model": spec.served_name, "checkpoint": spec.model.checkpoint,
        "quant": spec.model.quant, "device": spec.device, "gpus": list(spec.gpus),
        "gpu_count": len(spec.gpus) if spec.device == "cuda" else 0, "tp": spec.tp, "pp": spec.pp,
        "setting": s.name, "setting_values": {
            "gpu_memory_utilization": s.gpu_memory_utilization, "max_model_len": s.max_model_len,
            "enforce_eager": s.enforce_eager,
        },
        "attn": spec.attn,
    }


def _launch(
    point: Scenario, log_path: Path, provenance: dict[str, Any], obs: Observer
) -> tuple[LaunchedServer, str, dict[str, Any]]:
    """Start the simulator or engine of a point's ``serve:`` block, logging to ``log_path``."""
    assert point.serve is not None
    if point.serve.engine == "sim":
        launch = sim_spec(point.serve)
        info: dict[str, Any] = {"backend": "sim", "argv": list(launch.argv)}
    else:
        spec = engine_spec(point)
        launch = launch_spec(spec)
        if point.serve.ready_timeout_s is not None:
            launch = replace(launch, ready_timeout_s=point.serve.ready_timeout_s)
        info = prepare(spec, launch, force=point.serve.force)
        info["spec"] = spec_summary(spec)
    info["log"] = log_path.name
    provenance["server"] = info
    provenance.setdefault("servers", []).append(info)
    write_json(log_path.parent / PROVENANCE, provenance)
    server = LaunchedServer(launch, log_path)
    obs.message(f"starting {launch.name}: {shell_line(launch)}")
    t = time.monotonic()

    def spawned(pid: int) -> None:  # on record before readiness, so that no engine goes untraced
        info["pid"] = pid
        write_json(log_path.parent / PROVENANCE, provenance)

    base_url = server.start(on_spawn=spawned)
    info["ready_s"] = round(time.monotonic() - t, 3)
    if launch.name != "sim":
        info["engine"] = engine_info(base_url)
    write_json(log_path.parent / PROVENANCE, provenance)
    obs.message(f"{launch.name} ready at {base_url} in {info['ready_s']:.1f} s (log: {log_path})")
    return server, base_url, info


def describe_server(point: Scenario, info: dict[str, Any]) -> dict[str, Any]:
    """What a table needs to know of a cell's server: engine, model, quantization, GPUs, setting."""
    serve = point.serve
    if serve is None:
        return {"backend": None, "base_url": point.target.base_url, "launched": False}
    out: dict[str, Any] = {
        "backend": serve.engine, "model": serve.model, "quant": serve.quant or "bf16",
        "setting": serve.setting, "launched": True,
    }
    spec = info.get("spec")
    if spec:
        out |= spec
    engine = info.get("engine") or {}
    if engine.get("version"):
        out["version"] = engine["version"]
    return out


def model_context(models: Any, model: str) -> int | None:
    """``max_model_len`` of ``model`` in a ``/v1/models`` answer (vLLM, SGLang, loadgen's engines)."""
    if not isinstance(models, dict):
        return None
    for m in models.get("data", []):
        if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
            return int(m["max_model_len"])
    return None


def too_long(cell: Cell, context: int) -> str | None:
    if cell.input_tokens + cell.output_tokens <= context:
        return None
    return (
        f"workload.input_tokens + output_tokens = {cell.input_tokens} + {cell.output_tokens} = "
        f"{cell.input_tokens + cell.output_tokens} exceeds the model's context of {context} tokens "
        "(the server's max_model_len); lower them, or serve the model with a longer context (serve.setting)"
    )


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
    if measured and any(r.ok for r in measured):
        return "done", None
    failed = [r for r in records if not r.ok]
    if not failed:
        return "failed", "no request was measured"
    detail = Counter(f"{r.error}: {r.error_detail or ''}".strip() for r in failed).most_common(1)[0][0]
    return "failed", f"no request completed ({detail[:300]})"


async def _resolve_model(
    client: StreamingClient, base_url: str, wanted: str, provenance: dict[str, Any]
) -> str:
    try:
        models = await client.fetch_models()
    except (httpx.HTTPError, ValueError) as exc:
        reason = (str(exc) or type(exc).__name__).splitlines()[0]  # httpx appends a second line of help
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


async def _calibrate(client: StreamingClient, scenario: Scenario, model: str) -> TextCalibration:
    """Two probes (16 and 48 words) give the template overhead and tokens per word."""
    seen: list[RequestRecord] = []
    points = []
    for words, body in calibration_probes(scenario, model):
        req = PreparedRequest(-1, body, None, 1, warmup=True)
        await client.send(req, -1, time.perf_counter_ns(), seen.append)
        points.append((words, seen[-1].prompt_tokens))
    return calibration_from(points)


async def _warmup(
    client: StreamingClient, cell: Cell, pool: list[PreparedRequest],
    emit: Callable[[RequestRecord], None], stop: asyncio.Event,
) -> None:
    point = cell.point
    assert point is not None
    ld = point.load
    if ld.warmup_requests:
        warm = [replace(pool[i % len(pool)], warmup=True) for i in range(ld.warmup_requests)]
        conc = min(cell.concurrency or len(warm), len(warm))
        plan = LoadPlan(warm, iter_offsets(None), len(warm), conc)
        seen: list[RequestRecord] = []

        def keep(r: RequestRecord) -> None:
            seen.append(r)
            emit(r)

        await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=keep, stop=stop)
        if (why := unusable(seen, point.target.api)) is not None:
            raise TargetError(why)


def unusable(warmup: list[RequestRecord], api: str) -> str | None:
    """Why the server cannot serve this scenario at all, when every warmup request failed in a
    way that no retry mends (refused, 4xx other than 408/429, not an event stream); else None.
    Busy answers (429, 5xx) and timeouts are left to the measured run to count."""
    done = [r for r in warmup if r.error != "cancelled"]
    if not done or any(r.ok for r in done):
        return None
    r = done[0]
    endpoint = ENDPOINTS[api]
    detail = (r.error_detail or "")[:200]
    if r.error == "connect":
        return f"POST {endpoint}: cannot connect ({detail}); is the server running?"
    if r.error == "malformed":
        return f"POST {endpoint}: the answer is not an OpenAI event stream ({detail}); is this the server's /v1 URL?"
    status = r.status or 0
    if r.error == "http_status" and (400 <= status < 500 or status == 501) and status not in (408, 429):
        hint = {
            404: f"does the server serve {endpoint} under this base URL (usually .../v1)?",
            405: f"the server does not take POST {endpoint}; is this the OpenAI-compatible base URL?",
            501: f"the server does not take POST {endpoint}; is this the OpenAI-compatible base URL?",
            401: "set the API key in the variable target.api_key_env names",
            403: "set the API key in the variable target.api_key_env names",
        }.get(status, "the server refuses these requests")
        if "chat template" in detail.lower():
            hint = "the model has no chat template: use target.api: completions"
        return f"POST {endpoint}: HTTP {status}: {detail}; {hint}"
    return None


async def _measure_window(
    client: StreamingClient,
    scenario: Scenario,
    cell: Cell,
    pool: list[PreparedRequest],
    emit: Callable[[RequestRecord], None],
    stop: asyncio.Event,
    obs: Observer,
    n_cells: int,
    health: Callable[[dict[str, Any]], None],
) -> None:
    point = cell.point or scenario
    w, ld = point.workload, point.load
    count = None if ld.duration_s else w.num_prompts
    workers = resolve_workers(ld.workers)
    if cell.concurrency is not None:
        workers = min(workers, cell.concurrency)
    if workers > 1:
        jobs = worker_jobs(
            workers=workers, target=client.target, base_url=client.base_url, api_key=client.api_key,
            new_connection_per_request=client.new_connection_per_request, clock_base_ns=client.clock_base_ns,
            pool=pool, count=count, concurrency=cell.concurrency, rate=cell.rate, arrival=ld.arrival,
            burstiness=ld.burstiness, seed=scenario.seed, duration_s=ld.duration_s,
        )
        obs.cell_started(cell, count, n_cells)
        with quiet_gc():
            await run_workers(jobs, emit=emit, health=health, stop=stop, message=obs.message)
        return
    # the connections the window needs, opened (or topped up) right before it, so TTFT holds
    # no connection setup and no idle keep-alive has expired in between
    await client.open_connections(min(cell.concurrency or w.num_prompts, w.num_prompts))
    obs.cell_started(cell, count, n_cells)
    offsets = iter_offsets(cell.rate, arrival=ld.arrival, burstiness=ld.burstiness, seed=scenario.seed)
    plan = LoadPlan(pool, offsets, count, cell.concurrency, ld.duration_s)
    monitor = ClientMonitor(client.stats, health)
    with quiet_gc():
        monitor.start()
        try:
            await run_load(client, plan, start_ns=time.perf_counter_ns(), emit=emit, stop=stop)
        finally:
            monitor.stop()


@contextmanager
def quiet_gc() -> Iterator[None]:
    """During a measured window: everything allocated before it is frozen out of the
    collector's scans, and young collections run 100 times less often (a full collection
    over a large heap stalls the loop for milliseconds, which lands in TTFT and ITL)."""
    gc.collect()
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(70_000, before[1], before[2])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
