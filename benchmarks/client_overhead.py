"""Client overhead and timing fidelity of `loadgen run` against `loadgen sim` on this machine.

For each case it reports TTFT / ITL p50 against the simulator's configured truth, QPS
against what the configuration implies (concurrency / (ttft + (n-1) * itl) for a closed
loop), and the client's CPU time per 1,000 streamed chunks. It also reports how late an
asyncio sleep wakes on this machine, the floor under every timing figure, and how late the
simulator's own chunks left (its error as an instrument).

    python benchmarks/client_overhead.py [--out results.json]

Prints figures; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from loadgen.load.run import execute
from loadgen.results.records import read_records
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.serve import Serve, SimOptions
from loadgen.servers.launch import LaunchedServer, sim_spec

TTFT_S, ITL_S = 0.050, 0.010
CASES = [  # concurrency, prompts, output tokens
    (1, 12, 32),
    (16, 64, 32),
    (64, 256, 32),
    (64, 256, 128),
]


async def sleep_lateness_ms(samples: int = 30) -> float:
    late = []
    for _ in range(samples):
        t = time.perf_counter()
        await asyncio.sleep(0.02)
        late.append((time.perf_counter() - t - 0.02) * 1e3)
    return statistics.median(late)


def sim_lateness(base_url: str) -> tuple[float, float]:
    """The simulator's cumulative (count, sum seconds) of how late its chunks left."""
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False).text
    values = dict(line.split() for line in text.splitlines() if line and line[0] != "#")
    prefix = "loadgen_sim_chunk_lateness_seconds"
    return float(values[f"{prefix}_count"]), float(values[f"{prefix}_sum"])


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(
    base_url: str, sim_pid: int, concurrency: int, prompts: int, output: int, work: Path
) -> dict[str, Any]:
    scenario = parse_scenario({
        "name": f"c{concurrency}-o{output}",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": prompts, "input_tokens": 64, "output_tokens": output},
        "load": {"concurrency": concurrency, "warmup_requests": 2},
    })
    run_dir = work / scenario.name
    before = sim_lateness(base_url)
    sim_cpu = process_cpu_s(sim_pid)
    cpu = time.process_time()
    result = execute(scenario, run_dir)
    cpu = time.process_time() - cpu
    after = sim_lateness(base_url)
    sim_cpu = process_cpu_s(sim_pid) - sim_cpu
    m = result.summary.cells[0].metrics
    assert m is not None
    assert m.request_throughput is not None
    assert m.ttft_s.p50 is not None
    assert m.itl_s.p50 is not None
    chunks = sum(len(r.chunk_tokens) for r in read_records(run_dir / "records.jsonl"))
    implied = concurrency / (TTFT_S + (output - 1) * ITL_S)
    return {
        "concurrency": concurrency, "prompts": prompts, "output_tokens": output,
        "ttft_p50_ms": m.ttft_s.p50 * 1e3, "itl_p50_ms": m.itl_s.p50 * 1e3,
        "qps": m.request_throughput, "qps_implied": implied,
        "qps_error_pct": (m.request_throughput / implied - 1) * 100,
        "client_cpu_s": cpu, "chunks": chunks, "client_cpu_ms_per_1k_chunks": cpu / chunks * 1e6,
        "sim_chunk_lateness_mean_ms": (after[1] - before[1]) / max(after[0] - before[0], 1) * 1e3,
        "sim_cpu_s": sim_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    lateness = asyncio.run(sleep_lateness_ms())
    serve = Serve(sim=SimOptions(ttft_ms=TTFT_S * 1e3, itl_ms=ITL_S * 1e3))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = LaunchedServer(sim_spec(serve), Path(tmp) / "sim.log")
        base_url = server.start()
        try:
            for case in CASES:
                assert server.proc is not None
                rows.append(run_case(base_url, server.proc.pid, *case, Path(tmp)))
        finally:
            server.stop()
    print(f"asyncio.sleep wakes {lateness:.2f} ms late (median) on this machine")
    print(f"sim: TTFT {TTFT_S * 1e3:g} ms, ITL {ITL_S * 1e3:g} ms, 64 input tokens\n")
    header = ("conc", "prompts", "out", "TTFT p50 ms", "ITL p50 ms", "QPS", "implied", "QPS err %",
              "client CPU s", "CPU ms / 1k chunks", "sim late ms", "sim CPU s")
    print(" | ".join(header))
    for r in rows:
        print(" | ".join([
            str(r["concurrency"]), str(r["prompts"]), str(r["output_tokens"]),
            f"{r['ttft_p50_ms']:.2f}", f"{r['itl_p50_ms']:.2f}", f"{r['qps']:.1f}",
            f"{r['qps_implied']:.1f}", f"{r['qps_error_pct']:+.1f}", f"{r['client_cpu_s']:.2f}",
            f"{r['client_cpu_ms_per_1k_chunks']:.0f}", f"{r['sim_chunk_lateness_mean_ms']:.2f}",
            f"{r['sim_cpu_s']:.2f}",
        ]))
    if args.out:
        args.out.write_bytes(orjson.dumps({"sleep_lateness_ms": lateness, "cases": rows}, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
