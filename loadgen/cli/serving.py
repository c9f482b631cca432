"""The servers: `loadgen sim`, `models`, `serve`, `setup` and `locust`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from loadgen.cli.console import err, handles_errors, out, print_text
from loadgen.cli.options import options_from
from loadgen.cli.root import Command, Overrides, app
from loadgen.errors import LaunchError, UsageError
from loadgen.scenario.serve import EngineOptions, SimOptions, flag


@app.command(cls=Command)
@handles_errors
@options_from(SimOptions, metavars={"faults": "KIND=RATE", "reject_params": "FIELD",
                                                     "max_seqs": "N", "itl_per_seq_us": "US",
                                                     "prefill_per_token_us": "US"})
def sim(
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = 8100,
    **sim_options: Any,
) -> None:
    """Run the calibrated simulator: token i leaves at arrival + ttft + i * itl.

    With a capacity: at most --max-seqs requests are served at once, the others wait in arrival
    order. A request admitted at s while k others are served sends token i at
    s + ttft + prompt_tokens * prefill_per_token + i * (itl + k * itl_per_seq); its TTFT includes
    the wait from arrival to s.
    """
    from pydantic import ValidationError

    from loadgen.servers.sim import serve_sim

    values = {k: v for k, v in sim_options.items() if v is not None}
    faults: dict[str, float] = {}
    for text in values.pop("faults", None) or []:
        kind, sep, rate = text.partition("=")
        try:
            faults[kind] = faults.get(kind, 0.0) + (float(rate) if sep else 1.0)
        except ValueError:
            raise UsageError(f"--fault {text!r}: expected KIND=RATE, e.g. --fault http_503=0.1") from None
    try:
        options = SimOptions(**values, faults=faults)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "faults"
        raise UsageError(f"{flag(name)}: {first['msg'].removeprefix('Value error, ')}") from None
    api_key = os.environ.get(options.api_key_env) if options.api_key_env else None
    api_key = api_key.strip() if api_key is not None else None  # as a client reads it: no line break
    if options.api_key_env and api_key is None:
        raise UsageError(f"--api-key-env {options.api_key_env}: the variable is not set")
    capacity = "" if options.max_seqs is None else f", at most {options.max_seqs} at once"
    if options.itl_per_seq_us:
        capacity += f", +{options.itl_per_seq_us:g} us itl per other request"
    if options.prefill_per_token_us:
        capacity += f", +{options.prefill_per_token_us:g} us per prompt token"
    err().print(
        f"loadgen sim on http://{host}:{port}/v1 (ttft {options.ttft_ms:g} ms, itl {options.itl_ms:g} ms{capacity})"
    )
    serve_sim(options, api_key, host, port)


@app.command(cls=Command)
@handles_errors
def models() -> None:
    """The model catalogue: aliases, hub ids, context, published quantizations, default GPUs."""
    from loadgen.engines.catalogue import load_catalogue
    from loadgen.report.narrow import fit_text
    from loadgen.report.tables import Table

    rows = []
    for alias, e in load_catalogue().items():
        context = f"{e.context}" + (f" ({e.long_context} YaRN)" if e.long_context else "")
        gpus = "CPU" if e.generated else "/".join(  # the generated tiny model runs on CPU, needs no GPU
            str(e.default_gpus(q)) if q == "bf16" or q in e.quants else "-"
            for q in ("bf16", "gptq-int8", "gptq-int4", "awq")
        )
        params = f"{e.params_b:g}B" + (" MoE" if e.moe else "")
        rows.append((alias, e.hub, params, context, ", ".join(["bf16", *e.quants]), gpus))
    headers = ("alias", "hub id (bf16)", "params", "context", "quantizations", "GPUs bf16/int8/int4/awq")
    # a narrow terminal gets a block per model: an alias or hub id is never broken
    for item in fit_text(Table(headers, tuple(rows), title="loadgen model catalogue"), out().width):
        out().print(item, highlight=False)


def _engine_help() -> dict[str, str]:
    """The help of the options whose words come from the engines' declarations."""
    from loadgen.engines.registry import DEFAULT, ENGINES
    from loadgen.scenario.serve import ENGINE_SPECIFIC, EngineOptions

    helps = {"backend": " | ".join(e.name for e in ENGINES) + " (see loadgen engines)"}
    for option in ENGINE_SPECIFIC:
        takers = ", ".join(e.name for e in ENGINES if option in e.options)
        helps[option] = f"{EngineOptions.model_fields[option].description} (engines: {takers})"
    helps["backend"] += f"; default {DEFAULT.name}"
    helps["port"] = "port the engine listens on"
    return helps


@app.command(cls=Command, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handles_errors
@options_from(EngineOptions, skip=("model", "extra_args"), defaults={"port": 8000}, helps=_engine_help())
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="catalogue alias (see `loadgen models`), hub id or path")],
    cpus: Annotated[
        str, typer.Option(help="a CPU engine's cores: auto (all but the last, left to the client), all, or e.g. 0-2")
    ] = "auto",
    container: Annotated[
        str | None,
        typer.Option("--container", metavar="RUNTIME", help="docker | podman: run the engine's official image instead"),
    ] = None,
    print_argv: Annotated[
        bool, typer.Option("--print-argv", help="with --container: print the engine's argv inside the image (JSON)")
    ] = False,
    log: Annotated[Path | None, typer.Option(help="engine log file (default runs/serve-MODEL-TIME.log)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the command and env; start nothing")] = False,
    script: Annotated[
        bool, typer.Option("--script", help="print a standalone shell script of the launch (command, env, GPUs)")
    ] = False,
    **flags: Any,
) -> None:
    """Launch an engine with the right flags, wait until it is ready, stop it on Ctrl-C.

    Extra engine arguments go after `--`. An engine-specific option names the engines that
    take it.
    """
    import json
    import shlex
    from datetime import datetime

    from loadgen.engines.build import build_spec, describe_spec, engine_options, launch_spec
    from loadgen.engines.containers import container_argv, container_launch
    from loadgen.engines.preflight import engine_info, prepare, prepare_container
    from loadgen.engines.script import launch_script
    from loadgen.scenario.redact import redact_argv
    from loadgen.servers.cpus import cores_text, engine_cores
    from loadgen.servers.launch import LaunchedServer, serve_foreground, shell_line, tail
    from loadgen.servers.tiny import ensure_tiny

    options = engine_options(model, **flags, extra_args=tuple(ctx.args))
    spec = build_spec(options, engine_cores(cpus) if not (script or print_argv) else ())
    if print_argv:
        if container is None:
            raise UsageError("--print-argv: prints the engine's command inside its image; add --container docker")
        if spec.model.entry is not None and spec.model.entry.generated:
            ensure_tiny()  # the container mounts it (compose: the shared cache volume)
        print_text(json.dumps(container_argv(spec)))
        return
    launch = container_launch(spec, container) if container is not None else launch_spec(spec)
    if script:
        argv = [a for a in sys.argv[1:] if a != "--script"]
        sys.stdout.write(launch_script(launch, shlex.join(["loadgen", *redact_argv(argv)]), describe_spec(spec)))
        return
    if dry_run:
        print_text(shlex.join(launch.argv) if container is not None else shell_line(launch))
        return
    if container is not None:
        prepare_container(spec, launch, container, force=options.force)
    else:
        prepare(spec, launch, force=options.force)
    log_path = log or Path("runs") / f"serve-{spec.served_name.replace('/', '_')}-{datetime.now():%Y%m%d-%H%M%S}.log"
    err().print(f"starting: {shell_line(launch)}\nlog: {log_path}", markup=False, highlight=False, soft_wrap=True)
    if launch.cpus:
        err().print(
            f"cores: engine {cores_text(launch.cpus)}; a loadgen run on this host takes the others", highlight=False
        )

    def ready(url: str, seconds: float) -> None:
        what = " ".join(x for x in (launch.name, str(engine_info(url).get("version", ""))) if x)
        out().print(f"{url}  ({what}, ready in {seconds:.1f} s; Ctrl-C stops it)", markup=False, highlight=False)

    def waiting(line: str) -> None:
        err().print(line, markup=False, highlight=False, soft_wrap=True)

    stopped, code = serve_foreground(LaunchedServer(launch, log_path, on_wait=waiting), ready)
    if not stopped:
        raise LaunchError(f"{launch.name} exited with status {code} (log: {log_path})", tail(log_path))


def _setups() -> str:
    from loadgen.engines.registry import ENGINES

    return " | ".join(e.setup.name for e in ENGINES if e.setup is not None)


@app.command(cls=Command)
@handles_errors
def setup(
    engine: Annotated[str, typer.Argument(metavar="ENGINE", help=_setups())],
) -> None:
    """Install an engine loadgen launches (one time): vLLM's CPU build in its own environment,
    llama.cpp built from source, or CTranslate2."""
    from loadgen.engines.registry import ENGINES

    def echo(line: str) -> None:
        err().print(line, markup=False, highlight=False, soft_wrap=True)

    for e in ENGINES:
        if e.setup is not None and e.setup.name == engine:
            e.setup.run(echo)
            return
    raise UsageError(f"setup {engine!r}: loadgen installs {_setups().replace(' | ', ', ')} (see loadgen engines)")


@app.command(cls=Command)
@handles_errors
def engines() -> None:
    """Every engine: installed here or not, how to install it, the hardware it needs."""
    from loadgen.engines.listing import engines as all_engines
    from loadgen.report.narrow import fit_text
    from loadgen.report.tables import Table

    rows = tuple(
        (e.name or "-", e.label, ("yes: " if e.installed else "no: ") + e.detail, e.install, e.hardware)
        for e in all_engines()
    )
    table = Table(("backend", "engine", "here", "install", "hardware"), rows,
                  title="engines (loadgen serve MODEL --backend NAME)")
    # a narrow terminal gets a block per engine: an install command is never broken inside a word
    for item in fit_text(table, out().width):
        out().print(item, highlight=False)


@app.command(
    cls=Command,
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
        Path | None, typer.Option("--out", metavar="DIR",
                                  help="also write loadgen's run directory (records.jsonl, summary.json)")
    ] = None,
    scenario: Annotated[
        str | None, typer.Option("--scenario", metavar="FILE",
                                 help="the scenario (required): workload, API, timeouts, e.g. scenarios/chat.yaml")
    ] = None,
    overrides: Overrides = None,
    step_time: Annotated[
        float | None, typer.Option("--step-time", metavar="SECONDS",
                                   help="with --shape: seconds per step (default: load.duration_s, else 60)")
    ] = None,
    host: Annotated[
        str | None, typer.Option("--host", "-H", metavar="URL",
                                 help="server's base URL (default: target.base_url), e.g. http://127.0.0.1:8000/v1")
    ] = None,
) -> None:
    """Locust with loadgen's LLM user: web UI on 127.0.0.1:8089, headless, or master/worker.

    loadgen locust --scenario scenarios/chat.yaml --host http://127.0.0.1:8000/v1
    """
    from loadgen.locust.cli import locust_command, locustfile, run_child

    if print_locustfile:
        out().print(str(locustfile(shape)), highlight=False, soft_wrap=True)
        return
    args = list(ctx.args)
    for name, value in (("--scenario", scenario), ("--step-time", step_time), ("--host", host)):
        if value is not None:
            args += [name, str(value)]
    for item in overrides or []:
        args += ["--set", item]
    cmd, plan = locust_command(args, shape=shape, out=out_dir)
    host = next((cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i] in ("--host", "-H")), None)
    if host is not None:
        # as loadgen run: a server on this host pinned to cores of its own leaves Locust's
        # processes the others, so that neither slows the other (load.client_cpus chooses)
        from loadgen.load.serving import place_client

        place_client(plan.scenario, host, None,
                     lambda line: err().print(f"loadgen: {line}", markup=False, highlight=False, soft_wrap=True))
    raise typer.Exit(run_child(cmd))

