"""The typed results of a run: ``Summary`` -> ``CellSummary`` -> ``CellMetrics`` -> ``Distribution``.

``summary.json`` is ``Summary.to_dict()``; ``Summary.from_dict`` reads it back, including files
written before ``schema_version`` existed (version 1: the same keys, without the version). All
times are seconds; renderers convert. A cell's server is a ``ServerInfo``; what the server's
metrics and GPU memory samples report, and a cell's parameters, stay plain mappings: their keys
depend on the engine and on the matrix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from loadgen.data import Labels, Unchecked
from loadgen.results.cellstatus import AppliedUsers, ServerInfo
from loadgen.results.clienthealth import ClientHealth
from loadgen.results.enginecores import EngineCores
from loadgen.results.figures import ChunkDiscrepancy, Distribution, Reasoning, Window
from loadgen.results.probe import CapacityAnswer, ProbeResult
from loadgen.results.repeats import RepeatGroup
from loadgen.results.samples import Energy, GpuMemory, ServerMetrics
from loadgen.results.toolcalls import ToolCalls
from loadgen.scenario.target import DEFAULT_TOTAL_S, PER_TOKEN_S, Timeouts, default_total_s, token_limit

SCHEMA_VERSION = 2


@dataclass(frozen=True, slots=True)
class Breakdown:
    """A cell's figures over the requests of one turn (multi-turn sessions) or one stage (a
    staged load), with the prefix-cache hit rate from the server's per-answer cached tokens."""

    by: str  # turn | stage
    value: int
    metrics: CellMetrics
    cached_tokens_total: int | None
    prefix_cache_hit_rate: float | None

    def to_dict(self) -> dict[str, object]:
        return {self.by: self.value, **self.metrics.to_dict(), "cached_tokens_total": self.cached_tokens_total,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate}

    @classmethod
    def from_dict(cls, by: str, data: Unchecked) -> Breakdown:
        return cls(by, int(data[by]), CellMetrics.from_dict(data), data.get("cached_tokens_total"),
                   data.get("prefix_cache_hit_rate"))


@dataclass(frozen=True, slots=True)
class SteadyState:
    """The cell's steady window (the ramp-in and the drain cut, by the rule in ``rule``) and
    its figures over the requests sent in it."""

    start_s: float
    end_s: float
    rule: str
    metrics: CellMetrics

    def to_dict(self) -> dict[str, object]:
        return {"start_s": self.start_s, "end_s": self.end_s, "rule": self.rule, **self.metrics.to_dict()}

    @classmethod
    def from_dict(cls, data: object) -> SteadyState | None:
        if not isinstance(data, dict):
            return None
        return cls(float(data["start_s"]), float(data["end_s"]), str(data["rule"]), CellMetrics.from_dict(data))


_DISTRIBUTIONS = (
    "ttft_s", "ttft_from_schedule_s", "tpot_s", "itl_s", "e2e_s", "send_lag_s", "slot_wait_s", "speed_tokens_per_s",
    "speed_total_tokens_per_s",
)


@dataclass(frozen=True, slots=True)
class CellMetrics:
    """The figures of one cell, from its measured (non-warmup) records."""

    requests: int
    completed: int
    failed: int
    cancelled: int
    failures_by_class: dict[str, int]
    throughput_over: str
    duration_s: float
    request_throughput: float | None
    output_throughput: float | None
    total_token_throughput: float | None
    prompt_tokens_total: int
    output_tokens_total: int
    token_count_source: str | None
    prompt_tokens_checked: int
    prompt_tokens_mismatched: int
    prompt_tokens_drift_mean: float | None
    output_tokens_short: int
    chunk_token_discrepancy: ChunkDiscrepancy
    ttft_s: Distribution
    ttft_from_schedule_s: Distribution
    tpot_s: Distribution
    itl_s: Distribution
    e2e_s: Distribution
    send_lag_s: Distribution
    slot_wait_s: Distribution
    speed_tokens_per_s: Distribution
    speed_total_tokens_per_s: Distribution
    # with SLOs: the objectives (ms), the share of measured requests meeting all, and goodput
    slo: dict[str, float] | None = None
    slo_attained: float | None = None
    goodput: float | None = None
    # present only where they apply: a reasoning model's thinking (tokens, time to the first
    # answer token), figures per turn of multi-turn sessions, figures per stage of a staged load
    reasoning: Reasoning | None = None
    turns: tuple[Breakdown, ...] | None = None
    stages: tuple[Breakdown, ...] | None = None
    # requests sent again on a new connection: the server closed a kept-alive one before any
    # byte of the answer (a request that never reached it); their times are the first attempt's
    connection_retries: int = 0
    # the load as it ran: the most requests in flight at once, and the time-weighted mean from
    # the first request sent to the last one ended (a label says what was set, these what ran)
    peak_in_flight: int = 0
    mean_in_flight: float | None = None
    valid_json: float | None = None  # structured output: the share of answers that parsed and met the schema
    json_cut: int | None = None  # of the answers that did not: those that reached max_tokens (cut, not malformed)
    tool_calls: ToolCalls | None = None  # workload.tools: the answers that called a tool
    image_bytes_total: int = 0  # workload.images: the bytes of the images the cell's requests sent
    embeddings_per_s: float | None = None  # target.api embeddings: vectors returned per second
    # over time: the cell in windows of report.window_s, and its steady window's figures
    windows: tuple[Window, ...] = ()
    steady_state: SteadyState | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("slo", "slo_attained", "goodput") and self.slo is None:
                continue  # without SLOs these keys are absent, as they always were
            if f.name in ("reasoning", "turns", "stages", "steady_state", "tool_calls") and value is None:
                continue
            if (f.name in ("windows", "image_bytes_total") and not value) or (
                    f.name in ("valid_json", "json_cut", "embeddings_per_s") and value is None):
                continue
            if isinstance(value, Distribution):
                value = value.to_dict()
            elif isinstance(value, ChunkDiscrepancy):
                value = {"requests": value.requests, "tokens": value.tokens}
            elif f.name in ("turns", "stages", "windows"):
                value = [b.to_dict() for b in value]
            elif isinstance(value, (Reasoning, SteadyState, ToolCalls)):
                value = value.to_dict()
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> CellMetrics:
        values: Unchecked = {f.name: data.get(f.name) for f in fields(cls)}
        for name in _DISTRIBUTIONS:
            values[name] = Distribution.from_dict(data.get(name))
        values["chunk_token_discrepancy"] = ChunkDiscrepancy(**(data.get("chunk_token_discrepancy") or {}))
        values["failures_by_class"] = dict(data.get("failures_by_class") or {})
        values["reasoning"] = Reasoning.from_dict(data.get("reasoning"))
        values["connection_retries"] = int(data.get("connection_retries") or 0)
        values["peak_in_flight"] = int(data.get("peak_in_flight") or 0)
        values["windows"] = tuple(Window(**w) for w in data.get("windows") or ())
        values["steady_state"] = SteadyState.from_dict(data.get("steady_state"))
        values["tool_calls"] = ToolCalls.from_dict(data.get("tool_calls"))
        for by, name in (("turn", "turns"), ("stage", "stages")):
            if (groups := data.get(name)) is not None:
                values[name] = tuple(Breakdown.from_dict(by, g) for g in groups)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class EngineGap:
    """One metric as the client read it against the engine's own figure (its histogram's
    increase over the cell, in its /metrics): the means, the gap (client minus engine, ms) and
    the gap as a share of the engine's figure, with what each side counted (the client its completed
    requests; the engine its histogram's observations: requests, or token gaps for ITL)."""

    metric: str  # ttft | tpot | itl | e2e
    client_ms: float
    engine_ms: float
    gap_ms: float
    gap_share: float | None
    client_count: int
    engine_count: int

    def to_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Unchecked) -> EngineGap:
        share = data.get("gap_share")
        return cls(str(data["metric"]), float(data["client_ms"]), float(data["engine_ms"]), float(data["gap_ms"]),
                   None if share is None else float(share), int(data["client_count"]), int(data["engine_count"]))


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """What ended one request of the cell at the latest (seconds; None: no such bound): the
    connection, the first token, the longest silence, the whole request (its rule when the
    scenario set none), and how many output tokens past which a stream is ended as overrun
    (for the cell's output length)."""

    connect_s: float | None
    first_token_s: float | None
    idle_s: float | None
    total_s: float
    total_rule: str
    overrun_after_tokens: int

    @classmethod
    def of(cls, timeouts: Timeouts, output_tokens: int) -> RequestBounds:
        total_set = timeouts.total_s is not None
        return cls(
            connect_s=timeouts.connect_s, first_token_s=timeouts.first_token_s, idle_s=timeouts.between_tokens_s,
            total_s=timeouts.total_s if timeouts.total_s is not None else default_total_s(output_tokens),
            total_rule="target.timeouts.total_s" if total_set
            else f"{DEFAULT_TOTAL_S:g} s + {PER_TOKEN_S:g} s per token asked",
            overrun_after_tokens=token_limit(output_tokens) or 0,
        )

    def to_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> RequestBounds | None:
        if not isinstance(data, dict):
            return None  # a run directory written before bounds were recorded
        return cls(
            connect_s=data.get("connect_s"), first_token_s=data.get("first_token_s"), idle_s=data.get("idle_s"),
            total_s=float(data["total_s"]), total_rule=str(data.get("total_rule", "")),
            overrun_after_tokens=int(data.get("overrun_after_tokens", 0)),
        )


SHORT_OF_LOAD = 0.10  # a closed loop's peak in flight this far below its concurrency: said, and drawn as ran


def short_of_load(concurrency: object, metrics: CellMetrics | None, open_loop: bool = False) -> int | None:
    """The peak in flight of a closed loop that fell more than ``SHORT_OF_LOAD`` short of its
    ``concurrency``; None otherwise."""
    if open_loop or not isinstance(concurrency, int) or metrics is None or not metrics.peak_in_flight:
        return None
    peak = metrics.peak_in_flight
    return peak if peak < (1 - SHORT_OF_LOAD) * concurrency else None


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One measured point: its parameters, how it ended, the server it ran on and its figures."""

    cell: int
    params: Labels
    status: str  # done | failed | interrupted
    reason: str | None
    note: str
    server: ServerInfo
    metrics: CellMetrics | None
    server_metrics: ServerMetrics | None = None
    gpu_memory: GpuMemory = field(default_factory=lambda: GpuMemory(False, "no GPU samples"))
    client: ClientHealth | None = None
    # the witness: the share of prompt tokens the server answered from its prefix cache during
    # the cell (its own counters), None where it exports none; and the cache reset before it
    server_prefix_cache_hit_rate: float | None = None
    cache_reset: str | None = None
    warnings: tuple[str, ...] = ()
    # a capacity search's probe: its value, figures against the objectives, the verdict
    probe: ProbeResult | None = None
    records_lost: int = 0  # measured requests whose record could not be written (written when any)
    request_bounds: RequestBounds | None = None  # the default bounds every request of the cell had
    # the client's figures against the engine's own, where the engine exports latency histograms
    engine_gap: tuple[EngineGap, ...] = ()
    # the engine's cores on this host while the cell ran (None: not known, or not watched)
    engine_cores: EngineCores | None = None
    users: AppliedUsers | None = None  # a Locust test's users as they ran (None: any other cell)
    energy: Energy | None = None  # GPU and CPU energy over the cell, where loadgen launched the engine

    @property
    def open_loop(self) -> bool:
        return self.params.get("rate") is not None or self.params.get("schedule") is not None

    @property
    def concurrency_ran(self) -> int | None:
        """The most requests in flight, where a closed loop's cell fell more than
        ``SHORT_OF_LOAD`` short of its concurrency (32 prompts at concurrency 64 ran 32 at
        most); None where it ran as set, or has no concurrency to fall short of."""
        return short_of_load(self.params.get("concurrency"), self.metrics, self.open_loop)

    @property
    def number(self) -> int:
        """The cell as users see it numbered, in messages, tables and charts alike: from 1
        (``cell`` is its index in the files, from 0)."""
        return self.cell + 1

    @property
    def ending(self) -> str:
        """How a cell without figures ended, in words: its status and why."""
        if self.reason:
            return f"{self.status}: {self.reason}"
        if self.status == "interrupted":
            return "interrupted before any request was measured"
        return self.status

    def to_dict(self) -> dict[str, object]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["server"] = self.server.to_dict()
        out["client"] = None if self.client is None else self.client.to_dict()
        out["server_metrics"] = None if self.server_metrics is None else self.server_metrics.to_dict()
        out["gpu_memory"] = self.gpu_memory.to_dict()
        out["metrics"] = None if self.metrics is None else self.metrics.to_dict()
        out["warnings"] = list(self.warnings)
        out["request_bounds"] = None if self.request_bounds is None else self.request_bounds.to_dict()
        out["engine_gap"] = [g.to_dict() for g in self.engine_gap]
        if self.engine_cores is not None:
            out["engine_cores"] = self.engine_cores.to_dict()
        else:
            del out["engine_cores"]
        out["energy"] = None if self.energy is None else self.energy.to_dict()
        if self.users is None:
            del out["users"]
        else:
            out["users"] = asdict(self.users)
        if self.probe is None:
            del out["probe"]
        else:
            out["probe"] = self.probe.to_dict()
        if not self.records_lost:
            del out["records_lost"]
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> CellSummary:
        metrics = data.get("metrics")
        return cls(
            cell=int(data["cell"]), params=dict(data.get("params") or {}), status=str(data.get("status")),
            reason=data.get("reason"), note=data.get("note") or "", server=ServerInfo.from_dict(data.get("server")),
            metrics=None if metrics is None else CellMetrics.from_dict(metrics),
            server_metrics=ServerMetrics.from_dict(data.get("server_metrics")),
            gpu_memory=GpuMemory.from_dict(data.get("gpu_memory")),
            client=ClientHealth.from_dict(data.get("client")),
            server_prefix_cache_hit_rate=data.get("server_prefix_cache_hit_rate"),
            cache_reset=data.get("cache_reset"), warnings=tuple(data.get("warnings") or ()),
            probe=ProbeResult.from_dict(data.get("probe")), records_lost=int(data.get("records_lost") or 0),
            request_bounds=RequestBounds.from_dict(data.get("request_bounds")),
            engine_gap=tuple(EngineGap.from_dict(g) for g in data.get("engine_gap") or ()),
            engine_cores=EngineCores.from_dict(data["engine_cores"]) if data.get("engine_cores") else None,
            users=AppliedUsers.from_dict(data.get("users")), energy=Energy.from_dict(data.get("energy")),
        )


@dataclass(frozen=True, slots=True)
class Summary:
    """``summary.json``: the scenario's name and kind, the model served, and every cell."""

    scenario: str
    kind: str  # sweep | single-stream | throughput
    speed: str  # output | total: which single-stream speed the tables show
    model: str | None
    interrupted: bool
    cells: tuple[CellSummary, ...]
    aborted: str | None = None  # the abort rule that ended the run, in words
    seed: int | None = None  # what the prompts and arrivals were drawn from
    # capacity searches: their answers, in the order the scenario gives them
    capacity: tuple[CapacityAnswer, ...] = ()
    resumed: int = 0  # how many times the run was continued (--resume) after a stop
    # load.repeats: each repeated cell's figures as a mean with its 95% interval
    repeats: tuple[RepeatGroup, ...] = ()
    schema_version: int = SCHEMA_VERSION

    @property
    def records_lost(self) -> int:
        """Measured requests whose record could not be written (a full or read-only disk), over
        the cells the summary holds: a cell measured again after a resume holds none of its first try's."""
        return sum(c.records_lost for c in self.cells)

    @property
    def measured(self) -> tuple[CellSummary, ...]:
        """The cells with figures."""
        return tuple(c for c in self.cells if c.metrics is not None)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "schema_version": self.schema_version, "scenario": self.scenario, "kind": self.kind,
            "speed": self.speed, "model": self.model, "seed": self.seed, "interrupted": self.interrupted,
            "cells": [c.to_dict() for c in self.cells],
        }
        if self.aborted is not None:
            out["aborted"] = self.aborted
        if self.records_lost:
            out["records_lost"] = self.records_lost
        if self.resumed:
            out["resumed"] = self.resumed
        if self.capacity:
            # one search: its answer; a search per matrix point: a list of them
            answers = [c.to_dict() for c in self.capacity]
            out["capacity"] = answers[0] if len(answers) == 1 else answers
        if self.repeats:
            out["repeats"] = [g.to_dict() for g in self.repeats]
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> Summary:
        return cls(
            scenario=str(data.get("scenario")), kind=str(data.get("kind", "sweep")),
            speed=str(data.get("speed", "output")), model=data.get("model"),
            interrupted=bool(data.get("interrupted", False)),
            cells=tuple(CellSummary.from_dict(c) for c in data.get("cells", [])), aborted=data.get("aborted"),
            seed=data.get("seed"),
            capacity=tuple(CapacityAnswer.from_dict(c) for c in _listed(data.get("capacity"))),
            resumed=int(data.get("resumed") or 0),
            repeats=tuple(RepeatGroup.from_dict(g) for g in data.get("repeats") or ()),
            schema_version=int(data.get("schema_version", 1)),
        )


def _listed(value: object) -> list[Any]:
    """``capacity``: one search's answer, or a list of them (none: absent)."""
    if not value:
        return []
    return value if isinstance(value, list) else [value]
