"""Distributed load against a server that knows the truth: C streams spread over N processes,
as Locust workers (``loadgen locust --processes N``) and as ``load.workers: N`` of ``loadgen
run``, at each C and N.

The server is ``fastsim`` (benchmarks/fastsim/fastsim.c, built with ``cc`` on first use): TTFT
50 ms, ITL 10 ms, 256 tokens a request, and a ``GET /stats`` of the true time each token left
and of the requests it was sent. Each row prints achieved output tokens/s against the ideal
(C x 256 / 2.6 s), TTFT and ITL p99 against the truth of the same requests, and records lost:
the requests the server took (less the two a process sends to calibrate its text) that have no
record. The goal: |ITL p99 error| < 2 ms and nothing lost at every row the machine's cores can
carry; the rows past that say where it stops.

    python benchmarks/distributed.py [--levels 256,1024,4096] [--workers 1,2,4,8] [--duration 20]
        [--clients locust,run] [--server-cores 1] [--json FILE]

Locust runs closed-loop users for ``--duration`` seconds (the requests in flight at its end are
recorded as cancelled, and left out of the figures); ``loadgen run`` sends each stream's
``--requests-per-stream`` requests. Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_capacity import (  # noqa: E402 - the benchmark beside this one
    ITL_MS,
    OUTPUT,
    TTFT_MS,
    cores,
    figures,
    run_loadgen,
    server_truth,
    start_server,
)

from loadgen.results.records import read_records  # noqa: E402
from loadgen.servers.launch import free_port  # noqa: E402

CALIBRATION = 2  # requests each process sends to calibrate its text before its first measured one


def run_locust(base_url: str, c: int, processes: int, duration: float, client_cores: list[int] | None,
               work: Path) -> tuple[dict[str, Any], int]:
    """``loadgen locust`` headless with C users over ``processes`` processes for ``duration`` s:
    the figures of its answered requests, and how many requests it sent (its records)."""
    scen = work / f"locust-c{c}-p{processes}.yaml"
    scen.write_text(orjson.dumps({
        "name": f"distributed-c{c}",
        "target": {"api": "completions", "model": "auto"},
        "workload": {"input_tokens": 64, "output_tokens": OUTPUT},
    }).decode())
    out = work / f"locust-c{c}-p{processes}"
    extra = ["--processes", str(processes), "--master-bind-port", str(free_port())] if processes > 1 else []
    pin = (lambda: os.sched_setaffinity(0, set(client_cores))) if client_cores else None
    r = subprocess.run([sys.executable, "-m", "loadgen", "locust", "--scenario", str(scen), "--host", base_url,
                        "--headless", "-u", str(c), "-r", str(c), "-t", f"{duration:g}s", "--stop-timeout", "0",
                        "--out", str(out), "--only-summary", *extra],
                       capture_output=True, text=True, preexec_fn=pin)
    if r.returncode not in (0, 1):  # 1: Locust's exit code where requests failed (said in the row)
        raise SystemExit(f"loadgen locust c={c} processes={processes} failed ({r.returncode}): {r.stderr[-2000:]}")
    records = list(read_records(out / "records.jsonl"))
    answered = [x for x in records if x.error != "cancelled"]
    fig = figures(answered)
    summary = orjson.loads((out / "summary.json").read_bytes())
    fig["cpu_s"] = sum((cell.get("client") or {}).get("cpu_s") or 0.0 for cell in summary["cells"])
    return fig, sum(1 for x in records if x.sent_at is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="256,1024,4096", help="concurrency levels, comma separated")
    parser.add_argument("--workers", default="1,2,4,8", help="processes to spread each level over, comma separated")
    parser.add_argument("--clients", default="locust,run", help="locust (its worker processes) and/or run "
                        "(loadgen run's load.workers)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each Locust test")
    parser.add_argument("--requests-per-stream", type=int, default=2, help="loadgen run: requests each stream sends")
    parser.add_argument("--server-cores", type=int, default=1, help="cores (and fastsim threads) for the server")
    parser.add_argument("--json", type=Path, help="write every row as JSON here")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    counts = [int(x) for x in args.workers.split(",")]
    clients = args.clients.split(",")
    have = cores()
    split = len(have) > args.server_cores
    server_cores = have[:args.server_cores] if split else None
    client_cores = have[args.server_cores:] if split else None
    rows: list[dict[str, Any]] = []
    header = ("client", "C", "processes", "tokens/s", "ideal", "share", "TTFT p99", "TTFT p99 err", "ITL p99",
              "ITL p99 err", "answered", "lost")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        proc, base_url = start_server("fastsim", work, server_cores)
        try:
            for c in levels:
                for n in counts:
                    for client in clients:
                        server_truth("fastsim", base_url, reset=True)
                        if client == "locust":
                            fig, sent = run_locust(base_url, c, n, args.duration, client_cores, work)
                            unrecorded = CALIBRATION * n  # each process's calibration, before its records
                        else:
                            fig = run_loadgen(base_url, c, args.requests_per_stream, n, client_cores, work, "auto")
                            # every request it sent is a record, its calibration's included
                            sent = sum(1 for x in read_records(work / f"run-c{c}-auto-w{n}" / "records.jsonl")
                                       if x.sent_at is not None)
                            unrecorded = 0
                        truth = server_truth("fastsim", base_url) or {}
                        ideal = c * OUTPUT / ((TTFT_MS + (OUTPUT - 1) * ITL_MS) / 1e3)
                        row = {**fig, "client": client, "concurrency": c, "processes": n, "ideal_tokens_per_s": ideal,
                               "lost": int(truth.get("requests", 0)) - unrecorded - sent, "true": truth}
                        for m in ("ttft", "itl"):
                            if fig.get(f"{m}_p99") is not None and truth.get(f"{m}_ms", {}).get("count"):
                                row[f"{m}_p99_error_ms"] = fig[f"{m}_p99"] - truth[f"{m}_ms"]["p99"]
                        rows.append(row)
                        print_row(row)
        finally:
            proc.terminate()
            proc.wait()
    print()
    print(f"server: fastsim on cores {server_cores}; clients on {client_cores} ({os.cpu_count()} on the machine); "
          f"TTFT {TTFT_MS:g} ms, ITL {ITL_MS:g} ms, {OUTPUT} tokens a request")
    if args.json:
        args.json.write_bytes(orjson.dumps({"rows": rows}, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def print_row(r: dict[str, Any]) -> None:
    share = r["tokens_per_s"] / r["ideal_tokens_per_s"] * 100
    print(" | ".join([
        r["client"], str(r["concurrency"]), str(r["processes"]), f"{r['tokens_per_s']:,.0f}",
        f"{r['ideal_tokens_per_s']:,.0f}", f"{share:.1f}%", _f(r["ttft_p99"], ".2f"),
        _f(r.get("ttft_p99_error_ms"), "+.2f"), _f(r["itl_p99"], ".2f"), _f(r.get("itl_p99_error_ms"), "+.2f"),
        str(r["requests"] - r["failed"]), str(r["lost"]),
    ]), flush=True)


if __name__ == "__main__":
    main()
