"""What a large input costs before the first request: making a cell's request bodies (they are all
made before the measured window, so that making them costs no measured time), the memory they
hold, and what each client worker process is sent.

    python benchmarks/prepare_pool.py [--prompts 200000] [--input-tokens 128] [--workers 2]

Prints, for the default text prompts: seconds and microseconds per request to make them, the
process's memory per request held (resident set growth, and what Python's allocator traced for
the bodies), what one client worker process (``load.workers``) is sent before it makes its own
share, and how long making that share takes it (the workers make theirs at once, on their own
cores). Asserts nothing.
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
from loadgen.workload.prompts import MAKE_SLICE, PoolShare, TextCalibration, prepare_requests


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
    del pool
    unmade = prepare_requests(cell, "loadgen-sim", TextCalibration(), 0, eager=False)
    sent = pickle.dumps(PoolShare(unmade, 0, args.workers), protocol=pickle.HIGHEST_PROTOCOL)
    share = pickle.loads(sent)
    t0 = time.perf_counter()
    while share.make(MAKE_SLICE):
        pass
    alone = time.perf_counter() - t0
    print(f"each of {args.workers} workers is sent {len(sent) / 1e3:,.1f} kB and makes its {share.total:,} "
          f"requests itself: {alone:.2f} s (worker 0's share, made here)")


if __name__ == "__main__":
    main()
