"""Arrival offsets: when each request should start, computed up front from the seed.

Offsets are seconds from the start of the measured window. The first request starts at 0;
request i starts after i inter-arrival gaps drawn from the chosen process:

- ``constant``: every gap is ``1/rate``.
- ``poisson``: exponential gaps with mean ``1/rate``.
- ``gamma``: gamma gaps with shape ``burstiness`` and mean ``1/rate`` (burstiness 1 is
  poisson; below 1 is burstier, above 1 is more regular), as vLLM's benchmark defines it.
- ``rate=None``: every request is offered at 0 and only the concurrency limit holds them.

vLLM's benchmark paces a known number of requests otherwise (``pacing="vllm-bench"``, what
``bench serve`` uses): a gap is drawn before the first request too, and the offsets are
rescaled so that the last request is sent at ``count / rate``; on a ramp-up each gap is drawn at
the rate of the request it precedes, with no rescaling.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

BLOCK = 4096


@dataclass(frozen=True, slots=True)
class Arrivals:
    """When a cell's requests are due: ``rate`` per second (None: all at once), gaps drawn by
    the ``arrival`` process (with ``burstiness`` for gamma) from ``seed``."""

    rate: float | None
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    pacing: str = "loadgen"
    count: int | None = None  # requests of the window (vLLM's pacing needs it; None: endless)

    def offsets(self) -> Iterator[float]:
        if self.pacing == "vllm-bench" and self.rate is not None and self.count:
            return iter(vllm_offsets(self.count, self.rate, self))
        return iter_offsets(self.rate, arrival=self.arrival, burstiness=self.burstiness, seed=self.seed)

    def at(self, rate: float | None, seed: int) -> Arrivals:
        """The same process at another rate, from another seed (a stage of a staged load)."""
        return replace(self, rate=rate, seed=seed)


def _gaps(rng: np.random.Generator, size: int, rate: float, arrival: str, burstiness: float) -> np.ndarray:
    if arrival == "constant":
        return np.full(size, 1.0 / rate)
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size)
    if arrival == "gamma":
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), size)
    raise ValueError(f"unknown arrival process {arrival!r}")


def iter_offsets(
    rate: float | None,
    *,
    arrival: str = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
) -> Iterator[float]:
    """An endless stream of offsets in seconds; the same seed gives the same stream."""
    if rate is None:
        while True:
            yield 0.0
    if arrival == "constant":
        # i / rate, not a running sum of 1 / rate: the sum drifts below a window's end
        # (ten gaps of 0.1 add up to 0.9999999999999999) and lets one request too many in
        i = 0
        while True:
            yield i / rate
            i += 1
    rng = np.random.default_rng(seed)
    t = 0.0
    while True:
        gaps = _gaps(rng, BLOCK, rate, arrival, burstiness)
        starts = t + np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        t = float(starts[-1] + gaps[-1])
        yield from starts.tolist()


def concurrency_shares(workers: int, concurrency: int | None) -> list[int | None]:
    """Each worker's share of the concurrency: concurrency // W, the remainder going to the
    first workers, so the shares add up to the total (None: unlimited for each). The requests
    follow the streams (``loadgen.workload.share``)."""
    if concurrency is None:
        return [None] * workers
    return [concurrency // workers + (k < concurrency % workers) for k in range(workers)]


def ramp_rate(strategy: str, start: float, end: float, index: int, count: int) -> float:
    """The rate of request ``index`` of ``count`` on a ramp (vLLM's ``--ramp-up-strategy``)."""
    progress = index / max(count - 1, 1)
    if strategy == "linear":
        return start + (end - start) * progress
    return float(start * (end / start) ** progress)


def vllm_offsets(
    count: int, rate: float, arrivals: Arrivals, ramp: tuple[str, float, float] | None = None,
) -> list[float]:
    """vLLM's benchmark pacing of ``count`` requests: offset i is the sum of gaps 0..i (one
    before the first request too), each drawn at request i's rate (``ramp``: strategy, start
    and end rates); without a ramp the offsets are scaled so that the last is ``count / rate``."""
    rng = np.random.default_rng(arrivals.seed)
    gaps = []
    for i in range(count):
        at = ramp_rate(ramp[0], ramp[1], ramp[2], i, count) if ramp is not None else rate
        gaps.append(float(_gaps(rng, 1, at, arrivals.arrival, arrivals.burstiness)[0]))
    offsets = np.cumsum(gaps)
    if ramp is None and offsets[-1] > 0:
        offsets *= (count / rate) / offsets[-1]
    return [float(x) for x in offsets]


def ramp_offsets(count: int, strategy: str, start: float, end: float, arrivals: Arrivals) -> list[float]:
    """Offsets of ``count`` requests whose rate goes from ``start`` to ``end``: the gap before
    request i is drawn (by ``arrivals``' process, from its seed) at request i's rate; the first
    request starts at 0."""
    rng = np.random.default_rng(arrivals.seed)
    out = [0.0]
    for i in range(1, count):
        rate = ramp_rate(strategy, start, end, i, count)
        out.append(out[-1] + float(_gaps(rng, 1, rate, arrivals.arrival, arrivals.burstiness)[0]))
    return out
