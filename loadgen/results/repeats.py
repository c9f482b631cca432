"""A cell measured N times (``load.repeats: N``): each figure as its mean over the repeats, with
a 95% confidence interval from Student's t distribution (N - 1 degrees of freedom: half-width
t * s / sqrt(N), s the repeats' sample standard deviation) and the coefficient of variation
(s / mean). A figure whose CV exceeds the noise threshold (``report.noisy_cv``, 5%) marks the
group as noisy.

The repeats of one cell are its cells with the same parameters but ``repeat``; each drew its
own prompts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadgen.results.intervals import t95

# the figures repeated, as summary.json names them (times in seconds)
FIGURES: tuple[str, ...] = (
    "ttft_s.p50", "ttft_s.p99", "tpot_s.p50", "tpot_s.p99", "itl_s.p50", "itl_s.p99", "e2e_s.p50", "e2e_s.p99",
    "request_throughput", "output_throughput", "goodput",
)
NOISY_CV = 0.05


@dataclass(frozen=True, slots=True)
class Repeated:
    """One figure over the repeats: mean, the 95% interval's half-width, the CV, the values."""

    mean: float
    half_width: float | None  # None: one repeat alone has no interval
    cv: float | None
    values: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "half_width": self.half_width, "cv": self.cv, "values": list(self.values)}


@dataclass(frozen=True, slots=True)
class RepeatGroup:
    """The repeats of one cell: its parameters (``repeat`` aside), the cells, each figure."""

    params: dict[str, Any]
    cells: tuple[int, ...]  # their numbers, from 1
    figures: dict[str, Repeated]
    noisy: tuple[str, ...] = field(default=())  # figures whose CV is above the threshold

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.params, "cells": list(self.cells), "repeats": len(self.cells),
                "interval": "95%, Student's t", "figures": {k: v.to_dict() for k, v in self.figures.items()},
                "noisy": list(self.noisy)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RepeatGroup:
        figures = {k: Repeated(v["mean"], v.get("half_width"), v.get("cv"), tuple(v.get("values") or ()))
                   for k, v in (data.get("figures") or {}).items()}
        return cls(dict(data.get("params") or {}), tuple(data.get("cells") or ()), figures,
                   tuple(data.get("noisy") or ()))


def repeated(values: Sequence[float]) -> Repeated:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Repeated(mean, None, None, tuple(values))
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Repeated(mean, t95(n - 1) * sd / math.sqrt(n), sd / mean if mean else None, tuple(values))


def repeat_groups(
    cells: Sequence[tuple[dict[str, Any], int, dict[str, float | None]]], noisy_cv: float = NOISY_CV,
) -> tuple[RepeatGroup, ...]:
    """The groups of repeated cells, from (params with ``repeat``, cell number, figures) of each
    measured cell; cells without ``repeat`` are not repeats."""
    groups: dict[str, list[tuple[dict[str, Any], int, dict[str, float | None]]]] = {}
    for params, number, found in cells:
        if params.get("repeat") is None:
            continue
        rest = {k: v for k, v in params.items() if k != "repeat"}
        groups.setdefault(repr(sorted(rest.items(), key=lambda kv: kv[0])), []).append((rest, number, found))
    out = []
    for members in groups.values():
        if len(members) < 2:  # one repeat measured (a stopped run): nothing to put an interval on
            continue
        figures: dict[str, Repeated] = {}
        for key in FIGURES:
            values = [v for _, _, f in members if (v := f.get(key)) is not None]
            if len(values) == len(members):  # a figure every repeat has
                figures[key] = repeated([float(v) for v in values])
        noisy = tuple(k for k, r in figures.items() if r.cv is not None and r.cv > noisy_cv)
        out.append(RepeatGroup(members[0][0], tuple(n for _, n, _ in members), figures, noisy))
    return tuple(out)
