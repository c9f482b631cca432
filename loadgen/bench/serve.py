"""``loadgen bench serve``: run what a ``vllm bench serve`` command line asks for, print vLLM's
result block, and with ``--save-result`` write vLLM's result JSON with the run directory
beside it (``<result file stem>/``: records, summary, provenance)."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx

from loadgen.bench.args import BenchArgs, ignored, parse
from loadgen.errors import AbortedError, Interrupted, TargetError
from loadgen.load.prepare import QuietObserver
from loadgen.load.run import execute
from loadgen.load.schedule import Arrivals, vllm_offsets
from loadgen.report.progress import ProgressObserver
from loadgen.report.summary import render_markdown, repeats_table
from loadgen.report.tables import render
from loadgen.results.records import read_records
from loadgen.results.rundir import RECORDS, default_run_dir
from loadgen.results.vllm_result import VllmResult, result_text, vllm_result
from loadgen.scenario.loader import parse_scenario, resolve_files
from loadgen.scenario.redact import dump_scenario, header_variables
from loadgen.scenario.schema import Scenario
from loadgen.scenario.wire import redact_url
from loadgen.workload.prompts import needs_calibration


def result_filename(b: BenchArgs, model: str, stamp: str) -> Path:
    """vLLM's file name: ``LABEL-RATEqps[-concurrencyN]-MODEL-DATE.json`` in --result-dir."""
    ns = b.ns
    base = model.split("/")[-1]
    conc = f"-concurrency{ns.max_concurrency}" if ns.max_concurrency is not None else ""
    label = ns.label or ns.backend
    if ns.ramp_up_strategy is not None:
        name = (f"{label}-ramp-up-{ns.ramp_up_strategy}-{ns.ramp_up_start_rps}qps-{ns.ramp_up_end_rps}qps"
                f"{conc}-{base}-{stamp}.json")
    else:
        name = f"{label}-{ns.request_rate}qps{conc}-{base}-{stamp}.json"
    name = ns.result_filename or name
    return Path(ns.result_dir or ".") / name


def header(b: BenchArgs, model: str, stamp: str) -> VllmResult:
    ns = b.ns
    out: VllmResult = {
        "date": stamp, "endpoint_type": ns.backend, "backend": ns.backend, "label": ns.label, "model_id": model,
        "tokenizer_id": ns.tokenizer or ns.model or model, "num_prompts": ns.num_prompts,
    }
    out.update(b.metadata)
    out["request_rate"] = ns.request_rate if ns.request_rate < float("inf") else "inf"
    out["burstiness"] = ns.burstiness
    out["max_concurrency"] = ns.max_concurrency
    if ns.ramp_up_strategy is not None:
        out.update(ramp_up_strategy=ns.ramp_up_strategy, ramp_up_start_rps=ns.ramp_up_start_rps,
                   ramp_up_end_rps=ns.ramp_up_end_rps)
    return out


def scenario_of(b: BenchArgs) -> Scenario:
    """The flags' scenario, its files resolved against the working directory (as vLLM reads them)."""
    sc = parse_scenario(b.scenario, "loadgen bench serve")
    return sc.model_copy(update={"workload": resolve_files(sc.workload, Path.cwd() / "flags")})


def first_gap(sc: Scenario, seed: int | None) -> float:
    """The wait before the first request that vLLM's pacing draws (counted in its duration, as
    vLLM counts it); 0 where requests are not paced (no rate) or a trace sets the times."""
    ld = sc.load
    rate = next(iter(ld.rate), None)
    paced = rate is not None or ld.ramp_up is not None
    if ld.pacing != "vllm-bench" or seed is None or sc.workload.num_prompts < 1 or not paced:
        return 0.0
    arrivals = Arrivals(rate, ld.arrival, ld.burstiness, seed)
    n = sc.workload.num_prompts
    if ld.ramp_up is not None:
        r = ld.ramp_up
        return vllm_offsets(n, r.end_rate, arrivals, (r.strategy, r.start_rate, r.end_rate))[0]
    assert rate is not None
    return vllm_offsets(n, rate, arrivals)[0]


def differences(sc: Scenario) -> list[str]:
    """Where the requests loadgen sends differ from vllm bench serve's, said before the run."""
    out = []
    if sc.target.continuous_usage_stats:
        out.append("each request also asks for continuous_usage_stats (the exact tokens of every chunk, where the "
                   "server sends them); vllm bench serve does not")
    if needs_calibration(sc):
        out.append("2 requests of 1 output token go first to measure the chat template and tokens per word, so "
                   "that text prompts have the exact input length (the server counts them; the result does not)")
    return out


def wait_ready(base_url: str, timeout_s: int, verify: bool, message: Callable[[str], None]) -> None:
    """vLLM's --ready-check-timeout-sec: ask ``GET {base_url}/models`` every 2 s until the
    server answers 200, for at most ``timeout_s`` seconds, saying every 10 s what it waits for."""
    deadline = time.monotonic() + timeout_s
    message(f"waiting up to {timeout_s} s for {redact_url(base_url)} to answer")
    why = "no answer yet"
    said = time.monotonic()
    with httpx.Client(trust_env=False, verify=verify, timeout=httpx.Timeout(5.0)) as http:
        while True:
            try:
                status = http.get(base_url.rstrip("/") + "/models").status_code
                if status == 200:
                    return
                why = f"HTTP {status}"
            except httpx.HTTPError as e:
                why = type(e).__name__
            left = deadline - time.monotonic()
            if left <= 0:
                raise TargetError(f"{redact_url(base_url)} did not answer within --ready-check-timeout-sec "
                                  f"{timeout_s} ({why}); start the server, or give it longer")
            if time.monotonic() - said >= 10:
                message(f"still waiting ({why}), {left:.0f} s left")
                said = time.monotonic()
            time.sleep(min(2.0, left))


def _keep(run_dir: Path, sc: Scenario, message: Callable[[str], None]) -> Path:
    """A scratch run directory whose run ended early is kept where loadgen run would write it."""
    records = run_dir / RECORDS
    if not records.exists() or not records.stat().st_size:  # nothing measured: nothing to keep
        shutil.rmtree(run_dir.parent, ignore_errors=True)
        return run_dir
    kept = default_run_dir(sc)
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(run_dir, kept)
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    message(f"run directory kept, as the run did not finish: {kept}")
    return kept


def bench_serve(
    argv: list[str], show: Callable[[str], None], message: Callable[[str], None],
    progress: Callable[[], ProgressObserver],
) -> VllmResult:
    """Run the benchmark; ``show`` prints the result block, ``message`` a line to stderr,
    ``progress`` makes the progress bar (unless --disable-tqdm). Returns vLLM's result (the last repeat's)."""
    b = parse(argv)
    for line in ignored(argv):
        message(line)
    if not any(arg == "--seed" or arg.startswith("--seed=") for arg in argv):
        message("seed 0 is vllm bench serve's default: the same prompts as every run without --seed "
                "(give --seed N for others)")
    sc = scenario_of(b)
    for line in differences(sc):
        message(line)
    if b.ns.ready_check_timeout_sec > 0:
        wait_ready(b.base_url, b.ns.ready_check_timeout_sec, sc.target.verify_tls, message)
    if b.ns.save_scenario:
        Path(b.ns.save_scenario).write_text(dump_scenario(sc, references=True))
        needs = header_variables(sc)
        message(f"scenario written to {b.ns.save_scenario} (loadgen run {b.ns.save_scenario} measures the same"
                + (f"; it reads its headers from {', '.join(needs)}: set them first)" if needs else ")"))
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    planned = result_filename(b, sc.target.model, stamp) if b.ns.save_result else None
    # vLLM writes nothing without --save-result: the run directory is then a scratch one, removed
    # after a clean end (kept, and said, when the run ends early: it holds what was measured)
    scratch = not b.ns.out and planned is None
    if b.ns.out:
        run_dir = Path(b.ns.out)
    elif planned is not None:
        run_dir = planned.with_suffix("")
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="loadgen-bench-")) / "run"
    bar = None if b.ns.disable_tqdm else progress()
    try:
        result = execute(sc, run_dir, observer=bar or QuietObserver(), render_report=render_markdown)
    except BaseException:
        if scratch:
            _keep(run_dir, sc, message)
        raise
    finally:
        if bar is not None:
            bar.close()
    records = list(read_records(run_dir / RECORDS))
    model = str(result.summary.model or sc.target.model)
    # a result per repeat (each a cell of its own records), vLLM's block printed for each
    results = []
    for cell in sorted({r.cell for r in records}) or [0]:
        data = header(b, model, stamp)
        data.update(vllm_result(
            [r for r in records if r.cell == cell], percentile_metrics=b.percentile_metrics,
            percentiles=b.percentiles, goodput=b.goodput or None, max_concurrency=b.ns.max_concurrency,
            detailed=b.ns.save_detailed, lead_s=first_gap(sc, result.summary.seed), request_rate=b.ns.request_rate,
        ))
        if b.ns.repeats > 1:
            show(f"repeat {cell + 1} of {b.ns.repeats}")
        show(result_text(data, b.percentile_metrics))
        results.append(data)
    if (table := repeats_table(result.summary)) is not None:
        show(render(table, "md"))
    for data in results:
        per_second = data.pop("peak_concurrent_per_second")
        if data["max_concurrent_requests"] != per_second:
            message(f"peak concurrent requests: {data['max_concurrent_requests']} at once; vllm bench serve 0.32 "
                    f"prints {per_second}, the requests running at any time within the same whole second")
    ok = not result.interrupted and result.aborted is None and any(
        r.ok and r.first_token_at is not None for r in records if not r.warmup)
    if b.ns.save_result:
        path = result_filename(b, model, stamp)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not b.ns.out and run_dir != path.with_suffix(""):
            # the file name holds the model the server named (unknown before the run): the run
            # directory takes the same name, so the two lie side by side
            run_dir = run_dir.rename(path.with_suffix(""))
        # one JSON document per repeat, a line each (vLLM's --append-result layout)
        documents = "\n".join(json.dumps(d) for d in results)
        if b.ns.append_result and path.exists() and path.stat().st_size:
            with path.open("a") as f:  # vLLM's --append-result: more JSON documents, after a newline
                f.write("\n" + documents)
        else:
            path.write_text(documents)
        message(f"result: {path} (vLLM's layout); run directory: {run_dir}")
    elif scratch and ok:
        shutil.rmtree(run_dir.parent, ignore_errors=True)
        message("no run directory kept: give --save-result (vLLM's result file and the run directory beside it) "
                "or --out DIR to keep the records")
    elif scratch:
        run_dir = _keep(run_dir, sc, message)
    else:
        message(f"run directory: {run_dir}")
    # the exit codes of loadgen run: 130 stopped, 4 aborted, 3 nothing measured
    if result.interrupted:
        raise Interrupted("interrupted: the run directory holds every request measured before the stop")
    if result.aborted is not None:
        raise AbortedError(f"aborted: {result.aborted}; the run directory holds every request measured")
    if not ok:
        raise TargetError("no request succeeded: the server could not serve this benchmark "
                          "(the failures are in the run directory's records.jsonl)")
    return results[-1]
