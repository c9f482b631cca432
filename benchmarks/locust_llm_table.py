"""The LLM tab's table on Locust's master: how long one refresh of the Total row takes (exact
TTFT / TPOT / ITL / E2E percentiles over every value of the run), for runs of growing size.
It runs on the master's event loop, once per browser poll (every 2 s).

    python benchmarks/locust_llm_table.py
"""

from __future__ import annotations

import time
from array import array

import numpy as np

from loadgen.locust.stats import _Counts, percentiles


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'requests':>9} {'ITL values':>11} {'refresh ms':>11} {'again, unchanged ms':>20}")
    for requests, tokens in ((1_000, 256), (10_000, 256), (40_000, 256)):
        c = _Counts(keep_values=True)
        for name, n in (("ttft", requests), ("tpot", requests), ("e2e", requests), ("itl", requests * (tokens - 1))):
            setattr(c, name, array("d", rng.random(n)))
        t = time.perf_counter()
        percentiles(c)
        first = (time.perf_counter() - t) * 1e3
        t = time.perf_counter()
        percentiles(c)
        again = (time.perf_counter() - t) * 1e3
        print(f"{requests:>9,} {requests * (tokens - 1):>11,} {first:>11.1f} {again:>20.3f}")


if __name__ == "__main__":
    main()
