"""Soak: a steady moderate load against `loadgen sim` for a long time; the client's memory and
open file descriptors, sampled every few seconds, must stay flat once warmed up.

    python benchmarks/soak.py                          # 30 minutes at 20 requests/s
    python benchmarks/soak.py --duration 120 --json runs/soak.json

Prints RSS and file descriptors over time and the growth after warm-up; saves them as JSON.
The client is `loadgen run` itself, in its own process (records go to disk as they complete).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

from loadgen.results.records import read_records
from loadgen.scenario.serve import Serve, SimOptions
from loadgen.servers.launch import LaunchedServer, sim_spec


def soak(duration_s: float, rate: float, interval_s: float, workdir: Path) -> dict[str, object]:
    server = LaunchedServer(sim_spec(Serve(sim=SimOptions(ttft_ms=20, itl_ms=2))), workdir / "sim.log")
    base_url = server.start()
    scenario = workdir / "soak.yaml"
    scenario.write_text(yaml.safe_dump({
        "name": "soak",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": 512, "input_tokens": 128, "output_tokens": 32},
        "load": {"concurrency": 64, "rate": rate, "arrival": "poisson", "duration_s": duration_s,
                 "warmup_requests": 4},
    }))
    run_dir = workdir / "run"
    samples: list[dict[str, float]] = []
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "run", str(scenario), "--out", str(run_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = psutil.Process(proc.pid)
        t0 = time.monotonic()
        while proc.poll() is None:
            try:
                with client.oneshot():
                    samples.append({
                        "t_s": round(time.monotonic() - t0, 1),
                        "rss_mib": client.memory_info().rss / 2**20,
                        "fds": client.num_fds(),
                        "cpu_s": sum(client.cpu_times()[:2]),
                        "records": sum(1 for _ in (run_dir / "records.jsonl").open("rb"))
                        if (run_dir / "records.jsonl").exists() else 0,
                    })
            except psutil.NoSuchProcess:
                break
            time.sleep(interval_s)
        code = proc.wait()
    finally:
        server.stop()
    records = list(read_records(run_dir / "records.jsonl")) if (run_dir / "records.jsonl").exists() else []
    # warm-up: the first 10% of the run (at least 10 s); the end: the last sample inside the window
    window = [s for s in samples if max(10.0, 0.1 * duration_s) <= s["t_s"] <= duration_s]
    rss = [s["rss_mib"] for s in window]
    fds = [s["fds"] for s in window]
    return {
        "duration_s": duration_s, "rate": rate, "exit_code": code, "requests": len(records),
        "failed": sum(1 for r in records if not r.ok and r.error != "cancelled"),
        "rss_mib_after_warmup": {"first": rss[0], "min": min(rss), "max": max(rss), "last": rss[-1]} if rss else None,
        "rss_growth_pct": 100 * (max(rss) - rss[0]) / rss[0] if rss else None,
        "fds_after_warmup": {"min": min(fds), "max": max(fds)} if fds else None,
        "samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of load (default 1800)")
    ap.add_argument("--rate", type=float, default=20.0, help="requests per second (default 20)")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples (default 5)")
    ap.add_argument("--json", type=Path, help="save the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="loadgen-soak-") as tmp:
        result = soak(args.duration, args.rate, args.interval, Path(tmp))
    print(f"{'t (s)':>8} {'RSS MiB':>9} {'fds':>5} {'CPU s':>7} {'records':>8}")
    step = max(1, len(result["samples"]) // 20)  # type: ignore[arg-type]
    for s in result["samples"][::step]:  # type: ignore[index]
        print(f"{s['t_s']:8.0f} {s['rss_mib']:9.1f} {s['fds']:5d} {s['cpu_s']:7.1f} {s['records']:8d}")
    rss = result["rss_mib_after_warmup"]
    print(f"requests {result['requests']} (failed {result['failed']}), exit {result['exit_code']}")
    if rss:
        print(f"RSS after warm-up: first {rss['first']:.1f} MiB, min {rss['min']:.1f}, max {rss['max']:.1f}, "  # type: ignore[index]
              f"last {rss['last']:.1f}: growth {result['rss_growth_pct']:.1f}%")  # type: ignore[index]
        print(f"file descriptors after warm-up: {result['fds_after_warmup']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
