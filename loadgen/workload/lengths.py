"""Request lengths drawn from a distribution around a cell's nominal length.

Each draw depends only on the run's seed and the request's (cell, stream, index), so a worker
process, a resumed run and the report all see the same length for the same request.
"""

from __future__ import annotations

import csv
import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import MAX_TOKENS, Lengths


@lru_cache(maxsize=16)
def read_histogram(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A ``length,weight`` CSV (a header line is allowed) -> lengths and probabilities."""
    lengths: list[int] = []
    weights: list[float] = []
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the length histogram ({exc.strerror or exc})") from exc
    for lineno, row in enumerate(csv.reader(text.splitlines()), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        try:
            length, weight = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            if lineno == 1:
                continue  # a header
            raise ScenarioError(f"{path}:{lineno}: expected 'length,weight' (an integer and a number)") from None
        if not 1 <= length <= MAX_TOKENS or weight < 0 or not math.isfinite(weight):
            raise ScenarioError(f"{path}:{lineno}: length must be 1 to {MAX_TOKENS:,} and weight >= 0")
        lengths.append(length)
        weights.append(weight)
    total = sum(weights)
    if not lengths or total <= 0:
        raise ScenarioError(f"{path}: the length histogram has no row with a positive weight")
    return np.array(lengths), np.array(weights) / total


def draw(dist: Lengths, nominal: int, rng: np.random.Generator) -> int:
    """One length: ``nominal`` spread as ``dist`` says, clipped to [min, max]."""
    if dist.kind == "fixed":
        n = nominal
    elif dist.kind == "uniform":
        lo = max(math.floor(nominal * (1 - dist.range_ratio)), 1)
        hi = max(math.ceil(nominal * (1 + dist.range_ratio)), 1)
        n = int(rng.integers(lo, hi + 1))
    elif dist.kind == "normal":
        n = round(min(max(rng.normal(nominal, dist.stdev), 0.0), MAX_TOKENS))  # (a huge stdev draws +-inf)
    elif dist.kind == "lognormal":  # (the exponent bounded: e**50 is past any clip, and exp(1000) overflows)
        n = round(min(nominal * math.exp(min(rng.normal(0.0, dist.sigma), 50.0)), MAX_TOKENS))
    else:
        assert dist.file is not None
        lengths, probs = read_histogram(dist.file)
        n = int(rng.choice(lengths, p=probs))
    hi = dist.max if dist.max is not None else min(max(n, dist.min), MAX_TOKENS)
    return int(min(max(n, dist.min), hi))
