"""`loadgen run` and `loadgen bench serve`: measure, write a run directory, print the tables."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from loadgen.cli.console import err, handles_errors, out, print_summary, print_text
from loadgen.cli.root import Command, Group, Overrides, app
from loadgen.errors import AbortedError, LoadgenError, TargetError, UsageError


@app.command(cls=Command)
@handles_errors
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="scenario YAML file (optional: flags alone describe a plain run)")
    ] = None,
    concurrency: Annotated[
        str | None, typer.Option(metavar="N", help="requests in flight (load.concurrency), e.g. 64 or unlimited")
    ] = None,
    rate: Annotated[float | None, typer.Option(metavar="RPS", help="requests per second (load.rate)")] = None,
    input_len: Annotated[
        int | None, typer.Option(metavar="TOKENS", help="prompt tokens (workload.input_tokens)")
    ] = None,
    output_len: Annotated[
        int | None, typer.Option(metavar="TOKENS", help="output tokens (workload.output_tokens)")
    ] = None,
    num_prompts: Annotated[
        int | None, typer.Option(metavar="N", help="requests per cell (workload.num_prompts)")
    ] = None,
    api: Annotated[
        str | None, typer.Option(metavar="API", help="completions, chat, responses or embeddings (target.api)")
    ] = None,
    model: Annotated[str | None, typer.Option(metavar="ID", help="model id to send (target.model)")] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", metavar="URL", help="server to measure, e.g. http://127.0.0.1:8000/v1")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", metavar="DIR", help="run directory (default runs/NAME-TIME)")
    ] = None,
    overrides: Overrides = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", metavar="RUN_DIR", help="continue this run directory, skipping finished cells"),
    ] = None,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="with --resume: measure failed cells again")
    ] = False,
    search: Annotated[
        str | None, typer.Option(metavar="BY[:MIN:MAX]", help="search the most concurrency or rate meeting the "
                                 "SLOs (load.search), e.g. concurrency:1:256")
    ] = None,
    slo: Annotated[
        list[str] | None, typer.Option(metavar="METRIC:STAT:MS", help="an objective of the search (repeatable): "
                                       "ttft:p99:300, tpot:p99:20, itl:p95:50, e2e:p50:5000, error_rate:0.01")
    ] = None,
    confirm: Annotated[
        int | None, typer.Option(metavar="N", min=0, max=10, help="measure the probes either side of the search's "
                                 "boundary N more times each (load.search.confirm)")
    ] = None,
    repeats: Annotated[
        int | None, typer.Option(metavar="N", min=1, max=100, help="measure each cell N times, each with fresh "
                                 "prompts: figures as means with 95% intervals (load.repeats)")
    ] = None,
) -> None:
    """Run a scenario: measure, write a run directory, print the tables."""
    from loadgen.engines.preflight import check_models
    from loadgen.load.run import execute
    from loadgen.report.progress import ProgressObserver
    from loadgen.report.summary import render_markdown
    from loadgen.report.views import published_tables, render_tables
    from loadgen.results.rundir import default_run_dir
    from loadgen.scenario.loader import load_scenario, parse_scenario
    from loadgen.scenario.matrix import overridden_sets
    from loadgen.scenario.overrides import search_overrides

    flags = {"load.concurrency": concurrency, "load.rate": rate, "workload.input_tokens": input_len,
             "workload.output_tokens": output_len, "workload.num_prompts": num_prompts, "target.api": api,
             "target.model": model, "load.repeats": repeats}
    sets = [f"{k}={v}" for k, v in flags.items() if v is not None] + search_overrides(search, slo or [], confirm)
    sets += list(overrides or [])
    if scenario is None:
        if base_url is None:
            raise UsageError("give a scenario file, or --base-url URL with flags (e.g. --concurrency 64 "
                             "--input-len 1024 --output-len 128 --num-prompts 500)")
        sc = parse_scenario({"name": "run"}, "loadgen run", sets)
    else:
        sc = load_scenario(scenario, sets)
    check_models(sc, str(scenario or "loadgen run"))
    if scenario is not None:
        for line in overridden_sets(sc, sets):
            err().print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)
        if base_url is None:
            gpu_dead_end(sc, scenario, sets)
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
    if summary.kind == "sweep":
        print_summary(summary)
    else:
        print_text(render_tables(published_tables(summary, summary.kind, spread=True), "md"))
        if len({c.server.backend for c in summary.cells}) > 1 and any(c.status == "done" for c in summary.cells):
            # engines side by side: the cross-engine comparison against the first row
            print_text(render_tables(published_tables(summary, "compare", spread=False), "md"))
        from loadgen.report.summary import breakdown_tables

        for cell in summary.cells:
            for table in breakdown_tables(cell):
                print_text(render_tables([table], "md"))
    if summary.capacity:
        from loadgen.report.capacity import write_capacity_plots

        for path in write_capacity_plots(summary, result.run_dir):
            err().print(f"wrote {path}", markup=False, highlight=False)
    for line in self_check_lines(summary):
        err().print(line, markup=False, highlight=False, soft_wrap=True)
    failed = [c for c in summary.cells if c.status == "failed"]
    reasons: dict[str, list[int]] = {}
    for c in failed:  # one line per reason, naming its cells
        reasons.setdefault(str(c.reason), []).append(c.cell + 1)
    for reason, numbers in reasons.items():
        which = f"cell {numbers[0]}" if len(numbers) == 1 else f"cells {', '.join(map(str, numbers))}"
        err().print(f"{which} failed: {reason}", markup=False, highlight=False, soft_wrap=True)
    out().print(f"run directory: {result.run_dir}", markup=False, highlight=False)
    if summary.cells and len(failed) == len(summary.cells) and result.aborted is None and not result.interrupted:
        raise TargetError("no cell completed a request: the server could not serve this scenario (reasons above)")
    if result.aborted is not None:
        raise AbortedError(f"aborted: {result.aborted}; the run directory holds every request measured")
    if result.interrupted:
        err().print("interrupted: the run directory holds every request measured before the stop")
        raise typer.Exit(130)


def self_check_lines(summary: Any) -> list[str]:
    """Short lines when every measured cell's self-check found nothing: the client kept up and, where
    they were watched, the engine's cores had no other program (a problem is its own warning);
    then how soon the client handled the kernel-timed reads, and the reads TCP merged."""
    cells = [c for c in summary.measured if c.client is not None]
    if not cells or any(c.client.client_bound for c in cells):
        return []
    watched = [c.engine_cores for c in cells if c.engine_cores is not None]
    if any(w.starved for w in watched):
        return []
    cores = f"; the engine's cores {','.join(map(str, watched[0].cores))} had no other program" if watched else ""
    lines = [f"self-check ok: the client kept up{cores}"]
    if delays := [c.client.client_delay_ms for c in cells if c.client.client_delay_ms is not None]:
        # the kernel stamped the reads: the client's own delay is measured, and kept out
        lines.append(f"self-check: reads kernel-timed, handled p99 {max(d.p99 for d in delays):.2f} ms after arrival")
        if queued := [c.client.queued_ms_per_s for c in cells if c.client.queued_ms_per_s is not None]:
            # a late read that did not wait for its core was woken late, not crowded out (a line of
            # its own: each fits 80 columns)
            lines.append(f"self-check: the client's thread waited {max(queued):.1f} ms a second for its core")
    merged = [c.client for c in cells if c.client.coalesced is not None]
    if merged:
        share = max(c.coalesced_reads / c.reads for c in merged)
        lines.append(f"self-check: {share:.1%} of reads carried several tokens, which share one time")
    return lines


def gpu_dead_end(sc: Any, scenario: Path, sets: list[str]) -> None:
    """A scenario that would start engines on GPUs, on a machine with none: one reason, and the
    command that runs it on CPU with the tiny model (given only once it is checked to)."""
    from loadgen.engines.nogpu import cpu_sets, gpu_engines
    from loadgen.scenario.loader import load_scenario
    from loadgen.servers.gpus import gpu_count

    engines = gpu_engines(sc, str(scenario))
    if not engines or gpu_count():
        return
    why = f"{scenario}: it starts {'; '.join(engines)}, and this machine has no NVIDIA GPU"
    extra = cpu_sets(sc)
    try:
        cpu = load_scenario(scenario, [*sets, *extra])
        works = not gpu_engines(cpu, str(scenario))
    except LoadgenError:
        works = False
    if not works:
        raise TargetError(why + " (run it where GPUs are)")
    command = "loadgen " + shlex.join([*sys.argv[1:], *(w for s in extra for w in ("--set", s))])
    raise TargetError(f"{why}. The same scenario on CPU, with loadgen's tiny model:\n  {command}")


bench_app = typer.Typer(
    cls=Group, help="vLLM's benchmark command lines, run by loadgen.", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")


@bench_app.command(
    "serve", cls=Command,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
@handles_errors
def bench_serve(ctx: typer.Context) -> None:
    """Take `vllm bench serve`'s command line (e.g. --backend openai --base-url URL --dataset-name
    sharegpt --dataset-path FILE --num-prompts 500 --max-concurrency 32 --save-result) and measure
    it with loadgen; --save-result writes vLLM's result JSON, --save-scenario FILE the scenario."""
    from loadgen.bench.args import parser
    from loadgen.bench.serve import bench_serve as run_bench
    from loadgen.report.progress import ProgressObserver

    if any(a in ("-h", "--help") for a in ctx.args):
        print_text(parser().format_help())
        return
    run_bench(list(ctx.args), print_text, lambda line: err().print(line, markup=False, highlight=False,
                                                                   soft_wrap=True),
              lambda: ProgressObserver(err()))

