"""Client capacity and timing fidelity: how many concurrent streams one client core sustains.

A calibrated server streams every request at TTFT 50 ms, ITL 10 ms, 256 tokens (100 tokens/s
per stream) and records the true time each token left. For each concurrency C, loadgen runs
C streams back to back (closed loop, ``--requests-per-stream`` each) through ``loadgen run``
exactly as a user would, and the table compares:

- achieved vs ideal output tokens/s (ideal = C x 256 / (TTFT + 255 x ITL));
- reported vs true TTFT, ITL and TPOT (p50, p99; error = reported - true, both from the same
  requests; TPOT is a request's last token less its first, over its tokens less one);
- client CPU seconds per 1,000 tokens (the measured window's CPU time, from summary.json).

The server: ``fastsim`` (benchmarks/fastsim/fastsim.c, compiled with ``cc`` on first use; a thread
per server core, each with its own epoll set, logs every token's true send time), because
``loadgen sim`` (Python) cannot itself hold its schedule at these rates: ``--server sim`` runs the
same levels against it and prints how late its own chunks left. ``--base-url URL`` points the
same runs at any OpenAI-compatible server (no truth then: reported figures and achieved tokens/s
only).

Server and client are pinned to separate cores when the machine has them (server on the first
``--server-cores``, one by default, client on the rest). To see ``load.workers`` scale past what
one server core sends (about 110,000-160,000 tokens/s here), give the server more:
``--server-cores 4 --workers 1,2,4,8 --levels 1024,2048,4096``. ``--client httpx`` runs the same
levels with a minimal client on httpx (the transport loadgen used before), the measurement that
decided the transport.

    python benchmarks/client_capacity.py [--levels 1,16,64,256,512,1024] [--clock kernel,loop] [--reference]
        [--floor] [--workers 1,2,auto] [--server-cores 1] [--json FILE]

Each level runs with each ``--clock``: ``kernel`` times the bytes by the kernel's receive stamps
(and prints the client's own delay, p99 and max ms, which those stamps keep out of the figures),
``loop`` by the event loop's clock. "multi-event reads": the share of reads that carried more
than one token-bearing event (those tokens share one time on either clock). ``--reference`` adds
a row per level for a minimal compiled client (benchmarks/fastsim/refclient.c: epoll, kernel
stamps, no HTTP parser): the floor loadgen is held against. ``--floor`` adds a row for the same
client in Python (benchmarks/fastsim/pyfloor.py: a uvloop loop watching an epoll set of its own,
as loadgen's kernel clock does, and no parsing at all): what any Python client pays a token
before it reads one field of an answer.

Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from loadgen.results.records import read_records
from loadgen.servers.launch import free_port

HERE = Path(__file__).resolve().parent
TTFT_MS, ITL_MS, OUTPUT = 50.0, 10.0, 256
LOADGEN_CLOCKS = ("kernel", "loop", "auto")  # the rest are the reference clients


def cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def build_fastsim(work: Path, name: str = "fastsim") -> Path | None:
    """benchmarks/fastsim/NAME.c compiled (the server, or the reference client ``refclient``)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    exe = work / name
    subprocess.run([cc, "-O2", "-pthread", "-o", str(exe), str(HERE / "fastsim" / f"{name}.c")], check=True)
    return exe


def run_reference(base_url: str, c: int, per_stream: int, client_cores: list[int] | None, work: Path,
                  clock: str = "reference") -> dict[str, Any]:
    """The same closed loop on the minimal compiled client (kernel-stamped reads, no parser), or
    (``clock="python floor"``) on the same client in Python."""
    if clock == "reference":
        exe = build_fastsim(work, "refclient")
        if exe is None:
            raise SystemExit("no C compiler (cc) to build benchmarks/fastsim/refclient.c")
        argv = [str(exe)]
    else:
        argv = [sys.executable, str(HERE / "fastsim" / "pyfloor.py")]
    port = base_url.removesuffix("/v1").rsplit(":", 1)[1]
    pin = (lambda: os.sched_setaffinity(0, set(client_cores))) if client_cores else None
    done = subprocess.run([*argv, port, str(c), str(per_stream), str(OUTPUT)], capture_output=True, check=True,
                          preexec_fn=pin)
    out = orjson.loads(done.stdout)
    ttft, itl, tpot = (np.asarray(out[k]) / 1e3 for k in ("ttft_us", "itl_us", "tpot_us"))
    return {
        "requests": out["requests"], "failed": c * per_stream - out["requests"], "tokens": out["tokens"],
        "tokens_per_s": out["tokens"] / out["span_s"] if out["span_s"] else 0.0,
        "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p99": float(np.percentile(ttft, 99)),
        "itl_p50": float(np.percentile(itl, 50)), "itl_p99": float(np.percentile(itl, 99)),
        "tpot_p50": float(np.percentile(tpot, 50)), "tpot_p99": float(np.percentile(tpot, 99)),
        "cpu_s": out["cpu_s"], "client": None, "clock": clock,
        "multi_event_share": out["multi_event_reads"] / out["reads"] if out["reads"] else None,
    }


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url}: not ready in 30 s")


def start_server(kind: str, work: Path, server_cores: list[int] | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    if kind == "fastsim":
        exe = build_fastsim(work)
        if exe is None:
            raise SystemExit("no C compiler (cc) to build benchmarks/fastsim/fastsim.c; use --server sim")
        # a thread per server core, each pinned to its own
        argv = [str(exe), str(port), str(int(TTFT_MS * 1e3)), str(int(ITL_MS * 1e3)), str(len(server_cores or [0]))]
    else:
        argv = [sys.executable, "-m", "loadgen", "sim", "--port", str(port),
                "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
    pin = (lambda: os.sched_setaffinity(0, set(server_cores))) if server_cores else None
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin)
    wait_ready(f"http://127.0.0.1:{port}/health", proc)
    return proc, f"http://127.0.0.1:{port}/v1"


def server_truth(kind: str, base_url: str, reset: bool = False) -> dict[str, Any] | None:
    root = base_url.removesuffix("/v1")
    if kind == "fastsim":
        return dict(httpx.get(root + "/stats" + ("?reset=1" if reset else ""), trust_env=False).json())
    if kind == "sim":
        text = httpx.get(root + "/metrics", trust_env=False).text
        values = dict(line.split() for line in text.splitlines() if line and line[0] != "#" and "{" not in line)
        p = "loadgen_sim_chunk_lateness_seconds"
        return {"chunks": float(values[f"{p}_count"]), "late_sum_s": float(values[f"{p}_sum"]),
                "late_max_s": float(values[f"{p}_max"])}
    return None


def scenario_yaml(base_url: str, concurrency: int, per_stream: int, workers: int | str, clock: str) -> str:
    return orjson.dumps({
        "name": f"capacity-c{concurrency}",
        "target": {"base_url": base_url, "api": "completions", "model": "auto"},
        "workload": {"num_prompts": concurrency * per_stream, "input_tokens": 64, "output_tokens": OUTPUT},
        "load": {"concurrency": concurrency, "warmup_requests": 0, "workers": workers, "clock": clock},
    }).decode()


def figures(records: list[Any]) -> dict[str, Any]:
    """Reported TTFT / ITL / TPOT percentiles (ms), output tokens and achieved tokens/s from records."""
    records = [r for r in records if not r.warmup and r.request_id >= 0]  # (not the calibration's probes)
    ok = [r for r in records if r.ok]
    ttft = np.array([(r.first_token_at - r.sent_at) * 1e3 for r in ok])
    tpot = np.array([v * 1e3 for r in ok if (v := r.tpot_s) is not None])
    gaps = np.concatenate([np.diff(np.asarray(r.chunk_offsets_s)) * 1e3 for r in ok]) if ok else np.array([])
    tokens = sum(r.output_tokens for r in ok)
    span = max(r.done_at for r in ok) - min(r.sent_at for r in ok) if ok else 0.0
    return {
        "requests": len(records), "failed": len(records) - len(ok), "tokens": tokens,
        "tokens_per_s": tokens / span if span else 0.0,
        "ttft_p50": float(np.percentile(ttft, 50)) if ok else None,
        "ttft_p99": float(np.percentile(ttft, 99)) if ok else None,
        "itl_p50": float(np.percentile(gaps, 50)) if gaps.size else None,
        "itl_p99": float(np.percentile(gaps, 99)) if gaps.size else None,
        "tpot_p50": float(np.percentile(tpot, 50)) if tpot.size else None,
        "tpot_p99": float(np.percentile(tpot, 99)) if tpot.size else None,
    }


def run_loadgen(base_url: str, c: int, per_stream: int, workers: int | str, client_cores: list[int] | None,
                work: Path, clock: str = "auto") -> dict[str, Any]:
    scen = work / f"c{c}-{clock}-w{workers}.yaml"
    scen.write_text(scenario_yaml(base_url, c, per_stream, workers, clock))
    out = work / f"run-c{c}-{clock}-w{workers}"
    pin = (lambda: os.sched_setaffinity(0, set(client_cores))) if client_cores else None
    r = subprocess.run([sys.executable, "-m", "loadgen", "run", str(scen), "--out", str(out)],
                       capture_output=True, text=True, preexec_fn=pin)
    if r.returncode != 0:
        raise SystemExit(f"loadgen run c={c} failed ({r.returncode}): {r.stderr[-2000:]}")
    summary = orjson.loads((out / "summary.json").read_bytes())
    cell = summary["cells"][0]
    records = list(read_records(out / "records.jsonl"))
    fig = figures(records)
    fig["client"] = cell["client"]
    fig["cpu_s"] = cell["client"]["cpu_s"]
    fig["clock"] = cell["client"].get("clock", "loop")
    delay = cell["client"].get("client_delay_ms") or {}
    fig["delay_p99"], fig["delay_max"] = delay.get("p99"), delay.get("max")
    reads = cell["client"]["reads"]
    fig["multi_event_share"] = cell["client"].get("coalesced_reads", 0) / reads if reads else None
    return fig


async def httpx_level(base_url: str, c: int, per_stream: int) -> tuple[list[Any], float]:
    """The same closed loop on httpx: one AsyncClient (one connection) per stream, the body
    read with ``aiter_raw`` and fed to loadgen's stream parser, as loadgen's client did."""
    from loadgen.load.stream import StreamState
    from loadgen.workload.payload import PreparedRequest

    body = orjson.dumps({"model": "loadgen-sim", "prompt": list(range(1, 65)), "max_tokens": OUTPUT,
                         "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    req = PreparedRequest(0, body, 64, OUTPUT)
    url = base_url + "/completions"
    records: list[Any] = []
    base = time.perf_counter_ns()
    clients = [httpx.AsyncClient(trust_env=False, timeout=60) for _ in range(c)]
    await asyncio.gather(*(h.get(base_url + "/models") for h in clients))

    async def stream(http: httpx.AsyncClient) -> None:
        for _ in range(per_stream):
            st = StreamState()
            st.sent_ns = time.perf_counter_ns()
            async with http.stream("POST", url, content=body, headers={"content-type": "application/json"}) as resp:
                st.status = resp.status_code
                async for raw in resp.aiter_raw():
                    st.feed(raw, time.perf_counter_ns())
            outcome = st.end(time.perf_counter_ns())
            records.append(st.record(req, len(records), st.sent_ns, base, *outcome))

    cpu = time.process_time()
    await asyncio.gather(*(stream(h) for h in clients))
    cpu = time.process_time() - cpu
    await asyncio.gather(*(h.aclose() for h in clients))
    return records, cpu


def run_httpx(base_url: str, c: int, per_stream: int) -> dict[str, Any]:
    import uvloop

    records, cpu = uvloop.run(httpx_level(base_url, c, per_stream))
    fig = figures(records)
    fig["cpu_s"] = cpu
    fig["client"] = None
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,16,64,256,512,1024", help="concurrency levels, comma separated")
    parser.add_argument("--requests-per-stream", type=int, default=3)
    parser.add_argument("--server", choices=("fastsim", "sim"), default="fastsim")
    parser.add_argument("--base-url", help="an external OpenAI-compatible server instead (no truth)")
    parser.add_argument("--client", choices=("loadgen", "httpx"), default="loadgen")
    parser.add_argument("--workers", default="1",
                        help="load.workers values to run each level with, comma separated (N or auto): "
                             "with more than one, a scaling line per level and clock")
    parser.add_argument("--clock", default="kernel,loop",
                        help="load.clock values to run each level with, comma separated (kernel, loop, auto)")
    parser.add_argument("--reference", action="store_true",
                        help="run each level on the minimal compiled client too (benchmarks/fastsim/refclient.c)")
    parser.add_argument("--floor", action="store_true",
                        help="run each level on the same minimal client in Python too (benchmarks/fastsim/pyfloor.py: "
                             "no parsing), the floor of any Python client")
    parser.add_argument("--server-cores", type=int, default=1,
                        help="cores (and fastsim threads) for the server, the first ones this process may use; "
                             "the client gets the rest")
    parser.add_argument("--json", type=Path, help="write the table and every figure as JSON here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    counts: list[int | str] = [w if w == "auto" else int(w) for w in args.workers.split(",")]
    have = cores()
    if args.server_cores < 1 or (args.server_cores > 1 and args.server_cores >= len(have)):
        raise SystemExit(f"--server-cores {args.server_cores}: this machine gives {len(have)} cores, and the "
                         "client needs at least one of its own")
    split = len(have) > 1 and not args.base_url
    server_cores = have[:args.server_cores] if split else None
    client_cores = have[args.server_cores:] if split else None
    kind = "external" if args.base_url else args.server
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        proc = None
        if args.base_url:
            base_url = args.base_url.rstrip("/")
        else:
            proc, base_url = start_server(args.server, work, server_cores)
        try:
            clocks = args.clock.split(",") if args.client == "loadgen" else ["loop"]
            if args.reference and not args.base_url:
                clocks.append("reference")
            if args.floor and not args.base_url:
                clocks.append("python floor")
            runs = [(c, clock, w) for c in levels for clock in clocks
                    for w in (counts if clock in LOADGEN_CLOCKS and args.client == "loadgen" else counts[:1])]
            for c, clock, workers in runs:
                before = server_truth(kind, base_url, reset=True)
                if clock in ("reference", "python floor"):
                    fig = run_reference(base_url, c, args.requests_per_stream, client_cores, work, clock)
                elif args.client == "httpx":
                    if client_cores:  # this process is the client
                        os.sched_setaffinity(0, set(client_cores))
                    fig = run_httpx(base_url, c, args.requests_per_stream)
                else:
                    fig = run_loadgen(base_url, c, args.requests_per_stream, workers, client_cores, work, clock)
                truth = server_truth(kind, base_url)
                ideal = c * OUTPUT / ((TTFT_MS + (OUTPUT - 1) * ITL_MS) / 1e3)
                row: dict[str, Any] = {
                    "concurrency": c,
                    "workers": workers if clock in LOADGEN_CLOCKS and args.client == "loadgen" else None,
                    "ideal_tokens_per_s": ideal, **fig,
                    "achieved_share": fig["tokens_per_s"] / ideal if not args.base_url else None,
                    "cpu_s_per_1k_tokens": fig["cpu_s"] / fig["tokens"] * 1e3 if fig["tokens"] else None,
                }
                if kind == "fastsim" and truth:
                    row["true"] = truth
                    for m in ("ttft", "itl", "tpot"):
                        for q in ("p50", "p99"):
                            if fig.get(f"{m}_{q}") is not None and truth[f"{m}_ms"].get("count"):
                                row[f"{m}_{q}_error_ms"] = fig[f"{m}_{q}"] - truth[f"{m}_ms"][q]
                elif kind == "sim" and truth and before:
                    n = truth["chunks"] - before["chunks"]
                    row["sim_late_mean_ms"] = (truth["late_sum_s"] - before["late_sum_s"]) / n * 1e3 if n else None
                    row["sim_late_max_ms"] = truth["late_max_s"] * 1e3
                    row["ttft_p99_error_ms"] = fig["ttft_p99"] - TTFT_MS if fig["ttft_p99"] else None
                    row["itl_p99_error_ms"] = fig["itl_p99"] - ITL_MS if fig["itl_p99"] else None
                    row["tpot_p99_error_ms"] = fig["tpot_p99"] - ITL_MS if fig["tpot_p99"] else None
                rows.append(row)
                print_row(row, kind, header=len(rows) == 1)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait()
    sustained = [r for r in rows if (r.get("achieved_share") or 0) >= 0.95]
    best = max(sustained, key=lambda r: r["concurrency"]) if sustained else None
    print()
    print(f"server: {kind}, pinned to cores {server_cores}; client: {args.client}, workers {args.workers}, "
          f"cores {client_cores} ({os.cpu_count()} on the machine)")
    print(f"TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms, {OUTPUT} tokens per request")
    if best:
        print(f"highest concurrency with >= 95% of ideal tokens/s: {best['concurrency']} "
              f"({best['tokens_per_s']:,.0f} tokens/s)")
    for line in scaling(rows):
        print(line)
    if args.json:
        args.json.write_bytes(orjson.dumps({
            "server": kind, "client": args.client, "workers": args.workers, "server_cores": server_cores,
            "client_cores": client_cores, "ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "output_tokens": OUTPUT,
            "requests_per_stream": args.requests_per_stream, "rows": rows,
            "highest_sustained": best["concurrency"] if best else None,
        }, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def scaling(rows: list[dict[str, Any]]) -> list[str]:
    """Per level and clock run with several worker counts: tokens/s per count, and its multiple
    of the first count's (linear: the multiple is the count's ratio, up to the server's limit)."""
    lines = []
    runs = [r for r in rows if r.get("workers") is not None]
    for c, clock in dict.fromkeys((r["concurrency"], r.get("clock")) for r in runs):
        same = [r for r in runs if r["concurrency"] == c and r.get("clock") == clock]
        if len(same) < 2:
            continue
        first = same[0]["tokens_per_s"]
        parts = [f"workers {r['workers']}: {r['tokens_per_s']:,.0f} tok/s (x{r['tokens_per_s'] / first:.2f}, "
                 f"ITL p99 err {_f(r.get('itl_p99_error_ms'), '+.2f')} ms)" for r in same]
        lines.append(f"scaling, C={c} {clock}: " + "; ".join(parts))
    return lines


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_row(r: dict[str, Any], kind: str, header: bool) -> None:
    cols = ("C", "clock", "workers", "tokens/s", "ideal", "share", "TTFT p50", "TTFT p99", "TTFT p99 err", "ITL p50",
            "ITL p99", "ITL p99 err", "TPOT p50 err", "TPOT p99 err", "CPU s/1k tok", "client delay p99/max",
            "multi-event reads", "failed")
    if header:
        print(" | ".join(cols))
        print(" | ".join("---" for _ in cols))
    print(" | ".join([
        str(r["concurrency"]), r.get("clock", "loop"), _f(r.get("workers"), ""), f"{r['tokens_per_s']:,.0f}",
        f"{r['ideal_tokens_per_s']:,.0f}",
        _f(r["achieved_share"] and r["achieved_share"] * 100, ".1f") + "%",
        _f(r["ttft_p50"], ".2f"), _f(r["ttft_p99"], ".2f"), _f(r.get("ttft_p99_error_ms"), "+.2f"),
        _f(r["itl_p50"], ".2f"), _f(r["itl_p99"], ".2f"), _f(r.get("itl_p99_error_ms"), "+.2f"),
        _f(r.get("tpot_p50_error_ms"), "+.3f"), _f(r.get("tpot_p99_error_ms"), "+.3f"),
        _f(r["cpu_s_per_1k_tokens"], ".3f"),
        f"{_f(r.get('delay_p99'), '.2f')}/{_f(r.get('delay_max'), '.1f')}",
        _f(r.get("multi_event_share") and r["multi_event_share"] * 100, ".1f") + "%", str(r["failed"]),
    ]), flush=True)


if __name__ == "__main__":
    main()
