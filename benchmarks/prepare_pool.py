"""What a large input costs before the first request: making a cell's request bodies (they are all
made before the measured window, so that making them costs no measured time), the memory they
hold, and what each client worker process is sent.

    python benchmarks/prepare_pool.py [--prompts 200000] [--input-tokens 128] [--workers 2]

Prints, for the default text prompts: seconds and microseconds per request to make them, the
process's memory per request held (resident set growth, and what Python's allocator traced for
the bodies), and the pickled size of one worker's share and of the whole pool. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time
import tracemalloc

import psutil

from loadgen.scenario.matrix import expand_cells
from loadgen.scenario.schema import Scenario
from loadgen.workload.prompts import PoolShare, TextCalibration, prepare_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=200_000)
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    scenario = Scenario.model_validate({"name": "pool", "workload": {"num_prompts": args.prompts,
                                                                     "input_tokens": args.input_tokens}})
    (cell,) = expand_cells(scenario)
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss
    t0 = time.perf_counter()
    pool = prepare_requests(cell, "loadgen-sim", TextCalibration(), 0)
    made = time.perf_counter() - t0
    gc.collect()
    held = proc.memory_info().rss - before
    n = len(pool.ready)
    body = sum(len(r.body) for r in pool.ready) / n
    print(f"{n:,} requests of {args.input_tokens} tokens (bodies of {body:,.0f} bytes): made in {made:.2f} s "
          f"({made / n * 1e6:.1f} us each)")
    print(f"memory held: {held / 1e6:,.0f} MB ({held / n:,.0f} bytes per request)")
    tracemalloc.start()
    sample = prepare_requests(cell, "loadgen-sim", TextCalibration(), 0, count=min(n, 20_000))
    traced = tracemalloc.get_traced_memory()[0] / len(sample.ready)
    tracemalloc.stop()
    print(f"traced by Python's allocator: {traced:,.0f} bytes per request")
    t0 = time.perf_counter()
    share = pickle.dumps(PoolShare(pool, 0, args.workers), protocol=pickle.HIGHEST_PROTOCOL)
    pickled = time.perf_counter() - t0
    whole = len(pickle.dumps(pool, protocol=pickle.HIGHEST_PROTOCOL))
    print(f"sent to each of {args.workers} workers: {len(share) / 1e6:,.1f} MB ({pickled:.2f} s to pickle); "
          f"the whole pool pickled: {whole / 1e6:,.1f} MB")


if __name__ == "__main__":
    main()
