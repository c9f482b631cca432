"""``execute``: a scenario end to end, from server to run directory.

scenario -> cells -> (server launched or given) -> per cell: prompts, warmup, schedule,
engine -> records.jsonl (as each request ends) -> summary.json (after every cell).
Progress goes to an ``Observer``; nothing here prints.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from loadgen.engines.preflight import check_models
from loadgen.errors import EngineUnavailable, LaunchError, OutputError, ScenarioError, TargetError, UsageError
from loadgen.load.cell import (
    AbortRule,
    Measuring,
    Window,
    ahead_of_window,
    calibrate,
    measure_window,
    warmup,
)
from loadgen.load.client import ClientConfig, StreamingClient, new_loop
from loadgen.load.connection import CLOSES_AFTER_ANSWER
from loadgen.load.enginecores import EngineCoreSampler
from loadgen.load.limits import connections_needed, ensure_fd_limit
from loadgen.load.prepare import (
    Observer,
    QuietObserver,
    RunResult,
    read_all_sources,
    reopen,
    resolve_model,
    session_seed,
    with_run_seed,
)
from loadgen.load.sampling import GpuSampler, MetricsScraper
from loadgen.load.search import CellQueue, ProbeWatch, make_queues, probe_watch
from loadgen.load.serving import (
    cell_outcome,
    describe_server,
    engine_to_watch,
    exit_status,
    group_cells,
    launch_target,
    name_the_model,
    place_client,
    serve_key,
)
from loadgen.load.stopping import relay, unless_stopped
from loadgen.load.target import model_context, refused_params, too_long
from loadgen.load.workers import WorkerGroup
from loadgen.results.cellstatus import CellStatus, EarlyStop, SearchProbe, ServerInfo
from loadgen.results.provenance import LaunchRecord, Provenance
from loadgen.results.readings import Reading, Scrape
from loadgen.results.records import RequestRecord, read_records
from loadgen.results.rundir import (
    RECORDS,
    SERVER_LOG,
    RunDirWriter,
    assemble_summary,
    build_summary_from_dir,
    cell_summary,
    claim,
)
from loadgen.results.summary import CellSummary, Summary
from loadgen.scenario.matrix import Cell, SearchLine, expand_cells, search_lines
from loadgen.scenario.schema import Scenario
from loadgen.scenario.wire import base_url_problem
from loadgen.servers.cpus import pin, split_cores, usable_cores
from loadgen.servers.launch import STOP_SIGNALS, LaunchedServer, stops_interrupt, tail
from loadgen.workload.payload import api_key, auth_headers
from loadgen.workload.prompts import RequestPool, Sources, Stream, TextCalibration, needs_calibration, prepare_requests

__all__ = ["Observer", "QuietObserver", "RunResult", "execute"]

def execute(
    scenario: Scenario,
    run_dir: Path,
    *,
    base_url: str | None = None,
    observer: Observer | None = None,
    render_report: Callable[[Summary], str] | None = None,
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
    if base_url is not None and base_url != scenario.target.base_url:
        if (why := base_url_problem(base_url)) is not None:
            raise UsageError(f"--base-url {why}")
        # the server measured is the one on record (scenario.resolved.yaml, each cell's server)
        scenario = scenario.model_copy(update={"target": scenario.target.model_copy(update={"base_url": base_url})})
    scenario = with_run_seed(scenario, run_dir if resume else None, obs)
    cells = expand_cells(scenario)
    lines = search_lines(scenario)
    check_models(scenario, scenario.name)
    auth_headers(scenario.target, None)  # a header read from a variable that is not set: said now
    ensure_fd_limit(connections_needed(cells, lines))
    # datasets and traces are read (and checked) before the run directory is touched
    sources = read_all_sources([c.point for c in cells] + [line.point for line in lines],
                               scenario.seed or 0, obs.message)
    lock = claim(run_dir)  # before anything in the directory is read or changed
    try:
        again: list[int] = []
        if resume:
            provenance, finished, again = reopen(scenario, run_dir, retry_failed)
        else:
            provenance, finished = Provenance.new(scenario), set()
        out = RunDirWriter(run_dir, resume=resume, lock=lock)
        for index in again:  # cells measured again lose their old status line (a search may probe others)
            out.cells.write(CellStatus(index, "set-aside"))
        if not resume:
            out.write_scenario(scenario)
        out.write_provenance(provenance)
    except BaseException:
        lock.unlink(missing_ok=True)
        raise
    launched = base_url is None
    n_groups = len(group_cells(cells, launched=launched)) if cells else 0
    n_groups += len({serve_key(line.point) for line in lines}) if launched else int(bool(lines))
    # a plain run ends when its engine dies or the server refuses the scenario; a matrix records
    # the cell and goes on (a dead engine is replaced for the next cells)
    plain = n_groups == 1 and not scenario.matrix_blocks
    run = _Run(scenario, out, provenance, obs, render_report, lines, len(cells), plain=plain)
    run.sources = sources
    queues = make_queues(cells, lines, finished, list(run.entries.values()), launched=launched)
    failure: OutputError | None = None  # a file of the run directory that could not be written
    try:
        for n, queue in enumerate(queues):
            while queue.peek() is not None and not run.stop_requested and run.abort_reason is None:
                run.serve_group(queue, base_url, n, len(queues), single=n_groups == 1 and not finished)
                if plain and run.engine_death is not None:
                    break
    except OutputError as exc:
        failure = exc
    finally:
        try:
            run.close()
            provenance.ended()
            out.write_provenance(provenance)
        except OutputError as exc:  # the disk is still full: said with the first failure
            failure = exc if failure is None else OutputError(f"{failure}; nor could the summary be written")
    if failure is not None:
        lost = run.writer.lost
        raise OutputError(
            f"{failure}. The run stopped there"
            + (f"; {lost} measured requests could not be recorded" if lost else "")
            + f"; everything written before is in {run_dir}"
        )
    if plain and run.engine_death is not None:
        how, log, index = run.engine_death
        raise LaunchError(
            f"the engine {how} during cell {index + 1}; the run directory holds every request measured "
            f"({run_dir}; engine log: {log})",
            tail(log),
        )
    summary = run.summary()
    if run.abort_reason is not None:
        out.write_summary(summary, None)  # report.md already says what was measured
    return RunResult(run_dir, summary, run.stop_requested, run.abort_reason)


class _Run:
    """The state of one ``execute``: open files, summaries so far, the stop flag."""

    def __init__(
        self, scenario: Scenario, out: RunDirWriter, provenance: Provenance, obs: Observer,
        render_report: Callable[[Summary], str] | None, lines: list[SearchLine], n_cells: int, *, plain: bool,
    ) -> None:
        self.lines = lines  # the scenario's searches, expanded once
        self.scenario, self.out, self.provenance, self.obs = scenario, out, provenance, obs
        self.run_dir = run_dir = out.run_dir
        self.render_report, self.n_cells = render_report, n_cells
        assert scenario.seed is not None  # drawn by execute
        # each resumed session draws its prompts anew: the cut cell's first prompts were sent
        # already, and the server would answer them again from its prefix cache
        self.seed: int = session_seed(scenario.seed, provenance.times_resumed)
        self.cache_resets: dict[int, str] = {}  # cell -> how its engine's prefix cache was emptied before it
        self.entries: dict[int, CellSummary] = {
            e.cell: e for e in build_summary_from_dir(run_dir, scenario).cells
        }
        self.writer = out.records
        self.stop_requested = False
        self.abort_reason: str | None = None
        # a plain run (one engine, no matrix) stops at bad input; a matrix fails the cell and goes on
        self.plain = plain
        self.context: int | None = None  # the served model's context length, when the server says
        self.sources: dict[str, Sources] = {}  # datasets and traces read (before the run), by workload
        # request fields the server refused (sent no more once it did)
        self.flags: dict[str, bool | None] = {"ignore_eos": None, "min_tokens": None}
        # (how it exited, its log, the cell it died in) of the last engine that died mid-cell
        self.engine_death: tuple[str, Path, int] | None = None
        self.engine_watch: tuple[int, tuple[int, ...]] | None = None  # (engine pid, its cores)

    def summary(self) -> Summary:
        cells = [self.entries[i] for i in sorted(self.entries)]
        return assemble_summary(
            self.scenario, cells, self.lines, model=self.provenance.model, interrupted=self.stop_requested,
            aborted=self.abort_reason, resumed=self.provenance.times_resumed,
        )

    def write_outputs(self) -> None:
        summary = self.summary()
        self.out.write_summary(summary, self.render_report(summary) if self.render_report is not None else None)

    def finish_cell(
        self, cell: Cell, records: list[RequestRecord], status: str, reason: str | None, server: ServerInfo,
        probe: SearchProbe | None = None, stopped_early: EarlyStop | None = None, records_lost: int = 0,
    ) -> None:
        """Its status line (with a probe's value and early stop), its summary, its warnings."""
        line = CellStatus(
            cell.index, status, reason, server, probe, stopped_early, template_tokens=self.provenance.template_tokens,
            cache_reset=self.cache_resets.get(cell.index), records_lost=records_lost,
        )
        self.out.cells.write(line)
        samples = self.out.samples.samples(cell.index)
        self.entries[cell.index] = cell_summary(cell, records, line, samples)
        self.write_outputs()
        self.obs.cell_finished(cell, self.entries[cell.index])
        load = cell.concurrency if cell.rate is None else cell.rate  # a probe by its load: no count ahead
        where = f"cell {cell.index + 1}/{self.n_cells}" if cell.search is None else f"probe {cell.index + 1} ({load})"
        if status in ("failed", "skipped"):
            self.obs.message(f"{where} {status}: {reason}")
        entry = self.entries[cell.index]
        if (health := entry.client) is not None and health.client_bound:
            what = {"starved": "was client-starved", "saturated": "was client-bound"}.get(
                health.verdict, "had a lagging client"
            )
            self.obs.message(f"warning: {where} {what} ({'; '.join(health.reasons)}): {health.effect}; "
                             f"{health.advice}")
        for warning in entry.warnings:
            self.obs.message(f"warning: {where}: {warning}")

    def serve_group(self, todo: CellQueue, base_url: str | None, n: int, n_groups: int, *, single: bool) -> None:
        """Launch the group's engine (unless given a URL) and run its cells until they are done
        or the engine dies in one (the rest then get a fresh engine: call again)."""
        server: LaunchedServer | None = None
        point = todo.point
        info: LaunchRecord | None = None
        url = base_url
        cores = usable_cores()
        if url is None:
            log = SERVER_LOG if n_groups == 1 else f"server-{n + 1}.log"
            split = split_cores(cores, point.load.client_cpus)
            try:
                server, url, info = launch_target(
                    point, self.run_dir / log, self.provenance, self.out, self.obs.message, split[0] if split else (),
                )
            except (LaunchError, UsageError) as exc:
                # an engine not installed here (or a configuration this machine cannot run) is
                # skipped where the scenario says so; anything else failed
                skip = point.serve is not None and point.serve.skip_unavailable and (
                    isinstance(exc, (EngineUnavailable, UsageError)))
                if single and isinstance(exc, LaunchError) and not skip:
                    raise
                status = "skipped" if skip else "failed"
                reason = str(exc) if skip or isinstance(exc, UsageError) else f"engine did not start: {exc}"
                while (cell := todo.take()) is not None:
                    self.finish_cell(cell, [], status, reason, describe_server(point, None))
                    todo.finished(cell, self.entries[cell.index])
                return
        try:
            if (placed := place_client(point, url, server, self.obs.message)) is not None:
                self.provenance.placed(placed)
            # the engine's cores on this host, watched while each cell runs
            self.engine_watch = engine_to_watch(url, server, placed)
            with asyncio.Runner(loop_factory=new_loop) as runner:
                runner.run(self._run_cells(todo, url, server, info))
        finally:
            pin(0, cores)  # this process may go on (a matrix, a test): its cores back
            if server is not None:
                server.stop()

    async def _run_cells(
        self, todo: CellQueue, base_url: str, server: LaunchedServer | None, info: LaunchRecord | None
    ) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, stop.set)
        point = todo.point
        first = todo.peek()
        assert first is not None
        target, ld = point.target, point.load
        desc = describe_server(point, info)
        try:
            config = ClientConfig(target, base_url, self.provenance.clock_base_ns(), api_key(target),
                                  ld.new_connection_per_request, ld.clock)
            async with StreamingClient(config) as client:
                # a stop is obeyed in every phase: a server that accepts and never answers
                # holds neither the lookup nor the calibration
                found = await unless_stopped(stop, resolve_model(client, base_url, target.model, self.provenance))
                if found is None:
                    return
                model = found
                self.provenance.served_model(model)
                desc = name_the_model(desc, model, self.provenance.models_answer)
                self.context = model_context(self.provenance.models_answer, model)
                if self.plain and self.context is not None:
                    for cell in todo.known():
                        if (why := too_long(cell, self.context)) is not None:
                            raise ScenarioError(f"{self.scenario.name}: {why}")
                self.out.write_provenance(self.provenance)
                calibration = TextCalibration()
                if needs_calibration(point):
                    measured = await unless_stopped(
                        stop, calibrate(client, point, model, self.seed, first.index, self.writer.write))
                    if measured is None:
                        return
                    calibration = measured
                    self.provenance.text_calibration(calibration.overhead, calibration.per_word)
                async with MetricsScraper(base_url, verify=self.scenario.target.verify_tls) as scraper:
                    await self._cells(Measuring(client, scraper, server, model, calibration, desc), todo, stop)
        finally:
            self.stop_requested = self.stop_requested or (stop.is_set() and self.abort_reason is None)
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            stops_interrupt()  # asyncio put SIGTERM and SIGHUP back to their default (exit without cleanup)

    async def _cells(self, m: Measuring, todo: CellQueue, stop: asyncio.Event) -> None:
        """Measure the cells one after another, until they are done or the engine died."""
        server, desc = m.server, m.desc
        while not stop.is_set() and (cell := todo.take()) is not None:
            # the cell's records go to disk only (memory stays flat however long the cell);
            # they are read back from where they start once it ends
            start, lost_before = self.writer.position, self.writer.lost
            point = cell.point
            rule = AbortRule(point, stop)
            # the cell's own stop: the run's, or a probe's early stop
            cell_stop = asyncio.Event()
            relaying = asyncio.create_task(relay(stop, cell_stop))
            watch = probe_watch(cell, cell_stop.set)
            probe: SearchProbe | None = None
            if cell.search is not None:
                value = cell.concurrency if cell.rate is None else cell.rate
                assert value is not None
                probe = SearchProbe(cell.search, float(value))
                self.out.cells.write(CellStatus(cell.index, "started", probe=probe))

            def emit(r: RequestRecord, rule: AbortRule = rule, watch: ProbeWatch | None = watch) -> None:
                self.writer.write(r)
                self.obs.record(r)
                rule.add(r)
                if watch is not None:
                    watch.add(r)

            if self.context is not None and (why := too_long(cell, self.context)) is not None:
                relaying.cancel()
                self.finish_cell(cell, [], "failed", why, desc, probe)
                todo.finished(cell, self.entries[cell.index])
                continue
            interrupted = False
            refused: str | None = None
            try:
                await self._measure(m, cell, emit, cell_stop, watch)
            except TargetError as exc:
                if self.plain:
                    raise
                refused = str(exc)  # a matrix records the cell and goes on
            except OutputError as exc:
                refused = f"stopped: {exc}"  # then raised: the run ends
                raise
            finally:
                relaying.cancel()
                self._connection_habit(m.client)
                records = list(read_records(self.run_dir / RECORDS, start))
                interrupted = stop.is_set() and rule.reason is None
                early = watch.stopped if watch is not None else None
                if refused is not None:
                    lost = self.writer.lost - lost_before  # this cell's records the disk refused
                    self.finish_cell(cell, records, "failed", refused, desc, probe, early, lost)
                elif rule.reason is not None:
                    self.abort_reason = rule.reason
                    self.finish_cell(cell, records, "failed", f"aborted: {rule.reason}", desc, probe, early)
                elif not interrupted:
                    status, reason = cell_outcome(records, server)
                    self.finish_cell(cell, records, status, reason, desc, probe, early)
                elif records:  # measured before the stop: summarised, not finished
                    samples = self.out.samples.samples(cell.index)
                    self.entries[cell.index] = cell_summary(
                        cell, records, CellStatus(cell.index, "interrupted", server=desc), samples
                    )
                    self.write_outputs()
            if not interrupted:
                todo.finished(cell, self.entries[cell.index])
            if server is not None and server.proc is not None and (code := server.proc.poll()) is not None:
                self.engine_death = (exit_status(code), server.log_path, cell.index)
                return

    def _connection_habit(self, client: StreamingClient) -> None:
        """Once the client learned that the server closes its connections after each answer:
        said on the console and in provenance, once."""
        if client.learned_close is not None and self.provenance.closes_connections(client.learned_close):
            self.out.write_provenance(self.provenance)
            self.obs.message(CLOSES_AFTER_ANSWER.format(why=client.learned_close))

    async def _measure(
        self, m: Measuring, cell: Cell, emit: Callable[[RequestRecord], None], stop: asyncio.Event,
        watch: ProbeWatch | None = None,
    ) -> None:
        """One cell with its samples: GPU memory of the engine's processes, the server's /metrics,
        the client's health."""
        client, scraper, server = m.client, m.scraper, m.server
        loop = asyncio.get_running_loop()
        # a sample that cannot be written (from a thread, a timer) stops the cell; raised below
        def sample_failed() -> None:
            loop.call_soon_threadsafe(stop.set)

        self.out.samples.on_failure = sample_failed
        def sampled(values: Reading) -> None:
            self.out.samples.write(cell.index, values)
            if watch is not None and isinstance(values, Scrape):
                watch.scrape(values)

        def started(total: int | None) -> None:
            self.obs.cell_started(cell, total, self.n_cells)

        def making(made: int, total: int) -> None:  # the requests made before the window
            self.obs.preparing(cell, made, total, self.n_cells)

        window = Window(emit, sampled, started, self.obs.message, stop, making)

        gpu = GpuSampler(server.proc.pid, sampled) if server is not None and server.proc else None
        watched = self.engine_watch
        cores = EngineCoreSampler(watched[0], watched[1], sampled) if watched is not None else None

        async def measured_window(workers: WorkerGroup | None) -> None:
            await scraper.reset_peak()
            if gpu is not None:
                gpu.start()
            if cores is not None:
                cores.start()
            # the first scrape before any request is sent: counters over the cell are last minus first
            await scraper.scrape_once(sampled)
            scraping = asyncio.create_task(scraper.run(sampled, first_done=True))
            try:
                await measure_window(m.client, cell, pool, self.seed, window, workers)
            finally:
                scraping.cancel()
                await asyncio.gather(scraping, return_exceptions=True)
                await scraper.scrape_once(sampled)
                if gpu is not None:
                    gpu.stop()
                if cores is not None:
                    cores.stop()

        point = cell.point
        if point.load.reset_cache == "between-cells":
            self.cache_resets[cell.index] = await scraper.reset_prefix_cache()
        sources = self._sources(point)

        def requests(stream: Stream, count: int | None = None, eager: bool = True) -> RequestPool:
            return prepare_requests(cell, m.model, m.calibration, self.seed, stream, count=count,
                                    sources=sources, eager=eager, **self.flags)

        if cell.search is not None:
            await scraper.wait_idle()  # a probe starts on a server done with the one before
        try:
            await warmup(client, cell, requests(Stream.WARMUP, point.load.warmup_requests), emit, stop)
        except TargetError as exc:
            refused = refused_params(str(exc), self.flags)
            if not refused:
                raise
            # a server that refuses ignore_eos / min_tokens is measured without them, and told so once
            self.flags.update(dict.fromkeys(refused, False))
            self.provenance.params_dropped(refused, str(exc))
            self.out.write_provenance(self.provenance)
            self.obs.message(
                f"the server refuses {' and '.join(refused)} ({str(exc)[:160]}); sending requests without: "
                "output lengths are then the model's own choice (see output_tokens_short in the summary)"
            )
            await warmup(client, cell, requests(Stream.WARMUP, point.load.warmup_requests), emit, stop)
        pool = requests(Stream.MEASURED, eager=False)
        async with ahead_of_window(client, cell, pool, self.seed, window) as workers:
            if not stop.is_set():  # (a stop heard while the requests were made: no window to open)
                await measured_window(workers)
        if (failure := self.out.samples.failure) is not None:
            raise failure

    def _sources(self, point: Scenario) -> Sources | None:
        """The cell's dataset or trace (read before the run began)."""
        w = point.workload
        return None if w.source == "generated" else self.sources[w.model_dump_json()]

    def close(self) -> None:
        self.out.close()
        if self.entries:
            self.write_outputs()
