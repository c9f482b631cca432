"""Matrix expansion: a scenario -> its points (one per matrix combination) -> cells.

A point is the scenario with one value of each matrix axis set (and the matching overrides
applied), validated like any scenario. Each point's workload / load sweeps (input and output
tokens, concurrency, rate) then give its cells. Cells are numbered in file order across the
whole matrix; the runner groups them by the engine they need.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from loadgen.data import Labels
from loadgen.errors import ScenarioError
from loadgen.scenario.overrides import apply_overrides, format_validation_error
from loadgen.scenario.redact import redact_labels
from loadgen.scenario.schema import AXES, UNLIMITED, Matrix, Scenario
from loadgen.scenario.shapes import Search


@dataclass(frozen=True, slots=True)
class Cell:
    """One concrete measurement; ``concurrency=None`` is unlimited, ``rate=None`` all at once.

    ``point`` is the scenario of this cell's matrix point (the scenario itself when there is
    no matrix); ``labels`` are the matrix values that made it, by axis name.
    """

    index: int
    input_tokens: int
    output_tokens: int
    concurrency: int | None
    rate: float | None
    point: Scenario = field(compare=False, repr=False)
    labels: tuple[tuple[str, Any], ...] = ()
    # a search's probe: the search it belongs to (its index among the scenario's searches)
    search: int | None = None
    # load.repeats > 1: which time this cell's parameters are measured (from 1)
    repeat: int | None = None

    @property
    def schedule(self) -> str | None:
        """An open-loop schedule other than ``load.rate``, in words: a trace's timestamps, a
        ramp-up or stages (None: the rate, or a closed loop when there is none)."""
        w, ld = self.point.workload, self.point.load
        if w.trace is not None and w.multi_turn is None:
            return "trace timestamps"
        if ld.ramp_up is not None:
            return f"ramp-up {ld.ramp_up.start_rate:g} to {ld.ramp_up.end_rate:g}/s"
        if ld.stages and any(st.rate is not None for st in ld.stages):
            return f"{len(ld.stages)} stages"
        return None

    @property
    def in_flight_max(self) -> int:
        """The most requests the cell can have in flight: its concurrency, or (unlimited) every prompt."""
        return self.concurrency or self.point.workload.num_prompts

    @property
    def open_loop(self) -> bool:
        """Requests sent on a schedule (a rate, a trace, a ramp, stages), not as slots free up."""
        return self.rate is not None or self.schedule is not None

    def params(self) -> Labels:
        out = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "concurrency": UNLIMITED if self.concurrency is None else self.concurrency,
            "rate": self.rate,
        }
        w = self.point.workload
        out["num_prompts"] = w.num_prompts
        # where lengths come from a dataset or trace, the cell's nominal lengths say nothing
        if w.source != "generated":
            out["workload"] = w.source
        elif w.multi_turn is not None:
            out["workload"] = f"multi-turn x{w.multi_turn.turns}"
        if (schedule := self.schedule) is not None:
            out["schedule"] = schedule
        for axis, value in redact_labels(dict(self.labels)).items():
            out.setdefault(axis, value)
        if self.repeat is not None:
            out["repeat"] = self.repeat
        return out


def _matches(labels: Labels, rule: Labels) -> bool:
    return all(labels[k] in (v if isinstance(v, list) else [v]) for k, v in rule.items())


def points(scenario: Scenario, source: str = "<scenario>") -> list[tuple[Labels, Scenario]]:
    """Every matrix point as (axis -> value, its scenario); one point when there is no matrix."""
    blocks = [m for m in scenario.matrix_blocks if m.axes]
    if not blocks:
        return [({}, scenario)]
    base = scenario.model_dump(mode="json", exclude={"matrix"}, exclude_unset=True)
    return [p for matrix in blocks for p in _block_points(matrix, base, source)]


def _block_points(matrix: Matrix, base: Labels, source: str) -> list[tuple[Labels, Scenario]]:
    out = []
    names = list(matrix.axes)
    for combo in itertools.product(*matrix.axes.values()):
        labels = dict(zip(names, combo, strict=True))
        if any(_matches(labels, rule) for rule in matrix.exclude):
            continue
        values = {AXES.get(k, k): v for k, v in labels.items()}
        for rule in matrix.overrides:
            if _matches(labels, rule.when):
                values |= {AXES.get(k, k): v for k, v in rule.set.items()}
        data = apply_overrides(_copy(base), [], values)
        try:
            point = Scenario.model_validate(data)
        except ValidationError as exc:
            where = ", ".join(f"{k}={v}" for k, v in labels.items())
            raise ScenarioError(format_validation_error(f"{source} (matrix point {where})", exc)) from exc
        out.append((labels, point))
    return out


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def expand_cells(scenario: Scenario, source: str = "<scenario>") -> list[Cell]:
    """One cell per matrix point and combination of its swept values, in file order (a point
    with a search has no cells of its own: its probes are chosen as the search goes)."""
    cells: list[Cell] = []
    for labels, point in points(scenario, source):
        w, ld = point.workload, point.load
        if ld.search is not None:
            continue
        for inp, out, conc, rate in itertools.product(w.input_tokens, w.output_tokens, ld.concurrency, ld.rate):
            for k in range(ld.repeats):  # each repeat a cell of its own, with its own prompts
                cells.append(Cell(
                    len(cells), inp, out, conc, rate, point,
                    tuple(labels.items()), repeat=k + 1 if ld.repeats > 1 else None,
                ))
    return cells


@dataclass(frozen=True, slots=True)
class SearchLine:
    """One capacity search: a matrix point at one input and output length."""

    index: int
    point: Scenario = field(compare=False, repr=False)
    labels: tuple[tuple[str, Any], ...]
    input_tokens: int
    output_tokens: int

    @property
    def search(self) -> Search:
        assert self.point.load.search is not None
        return self.point.load.search

    def probe(self, index: int, value: float) -> Cell:
        """The cell that probes ``value`` (a concurrency, or a rate under the point's concurrency cap)."""
        conc: int | None
        rate: float | None
        if self.search.by == "concurrency":
            conc, rate = int(value), None
        else:
            cap = self.point.load.concurrency[0]
            conc, rate = cap, value
        return Cell(index, self.input_tokens, self.output_tokens, conc, rate, self.point, self.labels, self.index)


def search_lines(scenario: Scenario, source: str = "<scenario>") -> list[SearchLine]:
    """Every search of a scenario: one per matrix point with a search and length combination."""
    lines: list[SearchLine] = []
    for labels, point in points(scenario, source):
        if point.load.search is None:
            continue
        for inp, out in itertools.product(point.workload.input_tokens, point.workload.output_tokens):
            lines.append(SearchLine(len(lines), point, tuple(labels.items()), inp, out))
    return lines


def overridden_sets(scenario: Scenario, sets: list[str]) -> list[str]:
    """Why each ``--set KEY=VALUE`` that a matrix axis replaces in its cells changes nothing there."""
    out: list[str] = []
    for text in sets:
        key, _, value = text.partition("=")
        key = key.strip()
        for block in scenario.matrix_blocks:
            for axis, values in block.axes.items():
                if AXES.get(axis, axis) == key and key != f"matrix.{axis}":
                    shown = ", ".join(str(v) for v in values)
                    out.append(f"--set {text}: the matrix axis {axis} ({shown}) sets {key} in each of its cells; "
                               f"to run only {value.strip()}: --set 'matrix.{axis}=[{value.strip()}]'")
    return out
