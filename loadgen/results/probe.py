"""A capacity search in ``summary.json``: each probe's verdict (``ProbeResult``, a cell's
``probe``) and each search's answer (``CapacityAnswer``, the summary's ``capacity``), with the
probes it rests on (``ProbeRow``). ``loadgen.results.capacity`` computes them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from loadgen.data import Labels, Unchecked
from loadgen.results.cellstatus import EarlyStop

# a search's objectives as its scenario gives them: metric -> statistic -> ms, and error_rate -> share
Objectives = dict[str, float | dict[str, float]]


def _early(data: object) -> EarlyStop | None:
    if not isinstance(data, dict):
        return None
    return EarlyStop(str(data.get("objective")), str(data.get("reason")))


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe's figures against its search's objectives, and the verdict."""

    search: int
    by: str  # concurrency | rate
    value: float
    # objective ("ttft_ms.p99", "error_rate") -> the probe's figure (None: none could be computed)
    figures: dict[str, float | None]
    broken: tuple[str, ...]  # the objectives it broke
    meets_slo: bool
    stopped_early: EarlyStop | None
    goodput: float | None  # requests/s meeting every per-request bound
    # the first wave of a closed loop (its first C requests, sent at once) left out of the figures
    ramp_left_out: int = 0
    # objective -> 95% interval of its figure ([low, high]; None: no figure)
    ranges: dict[str, tuple[float, float] | None] = field(default_factory=dict)
    # percentile objectives whose interval's upper end is the slowest request's (too few requests)
    at_edge: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["broken"] = list(self.broken)
        out["ranges"] = {k: None if v is None else list(v) for k, v in self.ranges.items()}
        out["at_edge"] = list(self.at_edge)
        return out

    @classmethod
    def from_dict(cls, data: object) -> ProbeResult | None:
        if not isinstance(data, dict):
            return None
        return cls(
            search=int(data["search"]), by=str(data.get("by", "concurrency")), value=float(data["value"]),
            figures=dict(data.get("figures") or {}), broken=tuple(data.get("broken") or ()),
            meets_slo=bool(data.get("meets_slo")), stopped_early=_early(data.get("stopped_early")),
            goodput=data.get("goodput"), ramp_left_out=int(data.get("ramp_left_out") or 0),
            ranges={str(k): None if v is None else (float(v[0]), float(v[1]))
                    for k, v in (data.get("ranges") or {}).items()},
            at_edge=tuple(data.get("at_edge") or ()),
        )


@dataclass(frozen=True, slots=True)
class ProbeRow:
    """A probe as its search's answer lists it."""

    cell: int
    value: float
    meets_slo: bool
    figures: dict[str, float | None]
    broken: tuple[str, ...]
    stopped_early: EarlyStop | None
    status: str
    request_throughput: float | None
    output_throughput: float | None
    goodput: float | None

    @classmethod
    def from_dict(cls, data: Unchecked) -> ProbeRow:
        return cls(
            cell=int(data["cell"]), value=float(data["value"]), meets_slo=bool(data.get("meets_slo")),
            figures=dict(data.get("figures") or {}), broken=tuple(data.get("broken") or ()),
            stopped_early=_early(data.get("stopped_early")), status=str(data.get("status")),
            request_throughput=data.get("request_throughput"), output_throughput=data.get("output_throughput"),
            goodput=data.get("goodput"),
        )


@dataclass(frozen=True, slots=True)
class CapacityAnswer:
    """One search's answer: the most load meeting every objective, what binds above it, and
    the probes measured, in probe order."""

    search: int
    # the matrix values of the search's point, and its lengths (keys: the matrix's axes)
    labels: Labels
    by: str
    min: float
    max: float
    slo: Objectives  # the objectives as the scenario gives them (metric -> statistic -> ms; error_rate)
    max_meeting_slo: float | None
    limiting_slo: tuple[str, ...]
    binds_at: float | None
    complete: bool
    goodput: float | None
    request_throughput: float | None
    output_throughput: float | None
    answer: str  # in words
    probes: tuple[ProbeRow, ...]
    # how close the answer's probe came to its tightest objective, in words ("" without an answer)
    margin: str = ""
    # where the answer likely lies, judged on the probes' 95% intervals: [low, high] (None without an answer)
    likely: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["limiting_slo"] = list(self.limiting_slo)
        out["probes"] = [{**asdict(p), "broken": list(p.broken)} for p in self.probes]
        out["likely"] = None if self.likely is None else list(self.likely)
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> CapacityAnswer:
        return cls(
            search=int(data.get("search", 0)), labels=dict(data.get("labels") or {}), by=str(data.get("by")),
            min=float(data.get("min") or 0), max=float(data.get("max") or 0), slo=dict(data.get("slo") or {}),
            max_meeting_slo=data.get("max_meeting_slo"), limiting_slo=tuple(data.get("limiting_slo") or ()),
            binds_at=data.get("binds_at"), complete=bool(data.get("complete")), goodput=data.get("goodput"),
            request_throughput=data.get("request_throughput"), output_throughput=data.get("output_throughput"),
            answer=str(data.get("answer", "")), probes=tuple(ProbeRow.from_dict(p) for p in data.get("probes") or ()),
            margin=str(data.get("margin") or ""),
            likely=None if not data.get("likely") else (float(data["likely"][0]), float(data["likely"][1])),
        )
