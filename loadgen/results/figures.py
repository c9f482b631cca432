"""The parts of a cell's figures that stand alone: a ``Distribution`` of a latency (its
statistics), what the chunks said against usage, reasoning tokens, one time window."""

from __future__ import annotations

from dataclasses import dataclass, fields

from loadgen.data import Unchecked

STAT_KEYS: tuple[str, ...] = ("mean", "min", "max", "std", "p50", "p90", "p95", "p99", "p99.9")


@dataclass(frozen=True, slots=True)
class Distribution:
    """mean, min, max, population std and percentiles of one quantity; all None when empty."""

    mean: float | None = None
    min: float | None = None
    max: float | None = None
    std: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p99_9: float | None = None

    def get(self, stat: str) -> float | None:
        """A statistic by its name in ``summary.json`` (``p99.9`` included)."""
        value: float | None = getattr(self, stat.replace(".", "_"))
        return value

    def to_dict(self) -> dict[str, float | None]:
        return {k: self.get(k) for k in STAT_KEYS}

    @classmethod
    def from_dict(cls, data: Unchecked | None) -> Distribution:
        data = data or {}
        return cls(**{k.replace(".", "_"): data.get(k) for k in STAT_KEYS})


@dataclass(frozen=True, slots=True)
class ChunkDiscrepancy:
    """Requests whose usage disagreed with the tokens counted over their chunks, and by how many."""

    requests: int = 0
    tokens: int = 0


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A reasoning model's thinking in a cell: the requests that thought, their thinking tokens,
    and the time to the first token of the answer (TTFT is the first token of any kind)."""

    requests: int
    reasoning_tokens_total: int
    reasoning_tokens_mean: float
    time_to_answer_s: Distribution

    def to_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "reasoning_tokens_total": self.reasoning_tokens_total,
                "reasoning_tokens_mean": self.reasoning_tokens_mean,
                "time_to_answer_s": self.time_to_answer_s.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> Reasoning | None:
        if not isinstance(data, dict):
            return None
        return cls(int(data["requests"]), int(data["reasoning_tokens_total"]), float(data["reasoning_tokens_mean"]),
                   Distribution.from_dict(data.get("time_to_answer_s")))


@dataclass(frozen=True, slots=True)
class Window:
    """One time window of a cell (seconds from its first send): requests sent and completed in
    it, the mean in flight, TTFT (of the requests sent in it) and ITL (of the tokens that arrived
    in it) at p50 and p99, output tokens/s."""

    start_s: float
    end_s: float
    started: int
    completed: int
    in_flight: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    output_tokens_per_s: float

    def to_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
