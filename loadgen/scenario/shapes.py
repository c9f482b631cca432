"""Workload shapes of a scenario: length distributions, datasets, shared prefixes, multi-turn
sessions, traces, ramp-up and stages (re-exported by ``loadgen.scenario.schema``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from loadgen.scenario.answer_schema import answer_schema_problem


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_admits_bool(a) for a in get_args(annotation) if not isinstance(a, str | int | float))


class StrictModel(BaseModel):
    """Unknown keys refused; ``true`` is not a number and ``.nan`` / ``.inf`` are not values."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and not _admits_bool(field.annotation):
                raise ValueError(f"expected a number or text, not {str(value).lower()}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number (not .nan or .inf)")
        return value


class _Model(StrictModel):
    pass


# the most tokens a request's prompt or answer may have: ten million, past any model's context
MAX_TOKENS = 10_000_000


class Lengths(_Model):
    """How request lengths spread around the cell's ``input_tokens`` / ``output_tokens``.

    ``fixed``: exactly that; ``uniform``: integers in [floor(n(1-r)), ceil(n(1+r))] (vLLM's
    range ratio r); ``normal``: mean n, ``stdev``; ``lognormal``: median n, ``sigma``;
    ``histogram``: a CSV file of ``length,weight`` rows (n is then ignored). Draws are
    clipped to [``min``, ``max``] and are reproducible from the run's seed.
    """

    kind: Literal["fixed", "uniform", "normal", "lognormal", "histogram"] = "fixed"
    """How lengths are drawn (each kind above)."""
    range_ratio: float = Field(0.0, ge=0, lt=1)
    """`uniform`: lengths within this ratio either side of the cell's length (vLLM's range ratio)."""
    stdev: float = Field(0.0, ge=0)
    """`normal`: the standard deviation, in tokens."""
    sigma: float = Field(0.0, ge=0)
    """`lognormal`: the sigma of the underlying normal."""
    file: Path | None = None
    """`histogram`: a CSV file of `length,weight` rows."""
    min: int = Field(1, ge=1, le=MAX_TOKENS)
    """Draws are clipped to at least this many tokens."""
    max: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """Draws are clipped to at most this many tokens."""

    @model_validator(mode="after")
    def _check(self) -> Lengths:
        if self.kind == "histogram" and self.file is None:
            raise ValueError("kind histogram needs file: a CSV of length,weight rows")
        if self.kind != "histogram" and self.file is not None:
            raise ValueError(f"file is for kind histogram, not {self.kind}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class Dataset(_Model):
    """Prompts from a dataset instead of generated text.

    ``sharegpt``: a JSON list of ``{id, conversations: [{from, value}, ...]}`` sampled as vLLM's
    benchmark does (first turn the prompt, second the answer whose token count is the output
    length; the same length filters; shuffled by the seed unless ``shuffle: false``);
    ``jsonl``: one object per line with ``prompt``, ``messages`` or ``prompt_token_ids`` and
    optionally ``output_tokens``; ``hf``: a Hugging Face dataset (``name`` a hub id or a
    directory written by ``save_to_disk``), its ``column`` the prompt (default: the first of
    prompt, question, instruction, text, input, conversations).
    """

    kind: Literal["sharegpt", "jsonl", "hf"]
    """The dataset's format (each kind above)."""
    path: Path | None = None
    """The dataset file (`sharegpt`, `jsonl`) or a directory written by `save_to_disk` (`hf`)."""
    name: str | None = None
    """`hf`: a Hugging Face hub id."""
    split: str = "train"
    """`hf`: the split read."""
    subset: str | None = None
    """`hf`: the dataset's configuration, where it has several."""
    column: str | None = None
    """`hf`: the column that holds the prompt."""
    shuffle: bool = True
    """Shuffle the entries with the run's seed before they are sent."""
    output_tokens: int | None = Field(None, ge=1)
    """Every request asks for this many tokens, whatever the dataset says."""
    skip_invalid: bool = False
    """Skip entries that cannot be read (and say how many) instead of stopping at the first."""

    @model_validator(mode="after")
    def _check(self) -> Dataset:
        if self.kind in ("sharegpt", "jsonl") and self.path is None:
            raise ValueError(f"dataset kind {self.kind} needs path: the file to read")
        if self.kind == "hf" and self.name is None and self.path is None:
            raise ValueError("dataset kind hf needs name: a hub id or a save_to_disk directory")
        return self


class SharedPrefix(_Model):
    """``prefixes`` shared openings of ``tokens`` tokens; request i opens with prefix i mod N
    and goes on with content of its own (the engine's prefix cache is meant to hit)."""

    prefixes: int = Field(1, ge=1)
    """How many distinct shared openings there are."""
    tokens: int = Field(..., ge=1)
    """Each opening's length in tokens."""


class MultiTurn(_Model):
    """Chat sessions of ``turns`` requests, or the sessions of a JSONL ``file`` (agent sessions:
    system prompt, user messages, tool results, think times); each turn sends the whole history
    with the answers the server gave, ``think_time_s`` after the previous answer, on the
    session's connection. ``num_prompts`` counts sessions; concurrency counts sessions in
    flight; rate starts sessions. ``history: previous-response`` (Responses API) sends each turn
    only what is new, with the previous answer's ``previous_response_id``."""

    turns: int | None = Field(None, ge=1)
    """Requests per generated session."""
    file: Path | None = None
    """A JSONL session file: system prompt, user messages, tool results, think times."""
    think_time_s: float = Field(0.0, ge=0, le=1e7)
    """Seconds between an answer and the next turn of its session."""
    system_tokens: int = Field(0, ge=0)
    """A system prompt of this many tokens opening each generated session (its own content, per session)."""
    history: Literal["full", "previous-response"] = "full"
    """`full` sends the whole conversation each turn; `previous-response` (Responses API) sends what is new
    with `previous_response_id`."""

    @model_validator(mode="after")
    def _one_source(self) -> MultiTurn:
        if (self.turns is None) == (self.file is None):
            raise ValueError("give turns (generated sessions) or file (sessions from a JSONL file), one of the two")
        if self.file is not None and self.system_tokens:
            raise ValueError("a session file gives its own system prompts: drop system_tokens")
        return self


class Trace(_Model):
    """A request trace replayed on its timestamps: JSONL rows of ``timestamp`` (ms),
    ``input_length``, ``output_length`` and optional ``hash_ids`` (the Mooncake layout: equal
    ids are the same block of ``block_tokens`` tokens, so they become equal prompt content)."""

    file: Path
    """The trace's JSONL file."""
    speedup: float = Field(1.0, gt=0)
    """Replay this many times faster than recorded."""
    block_tokens: int = Field(512, ge=1)
    """Tokens per `hash_ids` block."""


class RampUp(_Model):
    """The rate of request i of N goes from ``start_rate`` to ``end_rate`` (linear:
    start + (end - start) * i / (N - 1); exponential: start * (end / start) ** (i / (N - 1))),
    as vLLM's ``--ramp-up-strategy``."""

    strategy: Literal["linear", "exponential"] = "linear"
    """`linear` or `exponential`."""
    start_rate: float = Field(..., gt=0)
    """The first request's rate, requests per second."""
    end_rate: float = Field(..., gt=0)
    """The last request's rate, requests per second."""


class Stage(_Model):
    """One stage of a staged load: ``duration_s`` at a ``rate`` and/or a ``concurrency``."""

    duration_s: float = Field(..., gt=0, le=1e7)
    """The stage's length in seconds."""
    rate: float | None = Field(None, gt=0)
    """Requests per second during the stage."""
    concurrency: int | None = Field(None, ge=1)
    """Requests in flight at most during the stage."""

    @model_validator(mode="after")
    def _check(self) -> Stage:
        if self.rate is None and self.concurrency is None:
            raise ValueError("a stage needs a rate, a concurrency or both")
        return self


# the latencies an SLO may bound, by their scenario key; the figures are in milliseconds
SLO_METRICS: dict[str, str] = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2e_ms": "E2E latency"}


def stat_quantile(stat: str) -> float | None:
    """``p99`` -> 99.0, ``p99.9`` -> 99.9, ``mean`` / ``max`` -> None; ValueError for anything else."""
    if stat in ("mean", "max"):
        return None
    try:
        q = float(stat[1:]) if stat.startswith("p") else float("nan")
    except ValueError:
        q = float("nan")
    if not 0 < q < 100:
        raise ValueError(f"{stat!r} is not a statistic: use p50, p90, p99, p99.9 (any pNN between 0 and 100), "
                         "mean or max")
    return q


class SearchSlo(_Model):
    """What a probe must meet: per latency, statistic -> milliseconds (``ttft_ms: {p99: 300}``),
    and the highest share of failed requests (``error_rate: 0.01``)."""

    ttft_ms: dict[str, float] = Field(default_factory=dict)
    """Time to first token: statistic (`p50`, `p99`, `p99.9`, `mean`, `max`) to its bound, ms."""
    tpot_ms: dict[str, float] = Field(default_factory=dict)
    """Time per output token: statistic to its bound, ms."""
    itl_ms: dict[str, float] = Field(default_factory=dict)
    """Inter-token latency (over pooled gaps): statistic to its bound, ms."""
    e2e_ms: dict[str, float] = Field(default_factory=dict)
    """Whole-request latency: statistic to its bound, ms."""
    error_rate: float | None = Field(None, ge=0, le=1)
    """The highest share of failed requests a probe may have."""

    @model_validator(mode="before")
    @classmethod
    def _stat_names(cls, data: object) -> object:
        # YAML reads `p99.9: 300` as the key "p99.9"; a bare number is not a statistic
        if isinstance(data, dict):
            for key in SLO_METRICS:
                value = data.get(key)
                if value is not None and not isinstance(value, dict):
                    raise ValueError(f"{key}: give a statistic and a bound in ms, e.g. {key}: {{p99: {value}}}")
        return data

    def request_limits(self) -> dict[str, float]:
        """The per-request bounds (TTFT, TPOT, E2E), the tightest given for each, in ms; ITL
        objectives are over pooled gaps and bound no single request."""
        return {m: min(getattr(self, m).values()) for m in ("ttft_ms", "tpot_ms", "e2e_ms") if getattr(self, m)}

    @model_validator(mode="after")
    def _check(self) -> SearchSlo:
        for key in SLO_METRICS:
            for stat, bound in getattr(self, key).items():
                stat_quantile(stat)
                if bound <= 0:
                    raise ValueError(f"{key}.{stat}: the bound must be > 0 ms (got {bound})")
        if not self.bounds() and self.error_rate is None:
            raise ValueError("give at least one objective, e.g. ttft_ms: {p99: 300} or error_rate: 0.01")
        return self

    def bounds(self) -> list[tuple[str, str, float]]:
        """(metric key, statistic, bound in ms) of every latency objective, in a fixed order."""
        return [(key, stat, bound) for key in SLO_METRICS for stat, bound in getattr(self, key).items()]


class Search(_Model):
    """A capacity search: the most concurrency (closed loop) or rate (open loop) in
    [``min``, ``max``] whose probe meets every SLO. Probes double from ``min`` until one breaks
    an SLO (or ``max`` is met), then bisect until the boundary is bracketed to 1 in
    concurrency or to ``rate_tolerance`` (a share, default 5%) in rate. With ``confirm`` N,
    the two probes either side of the boundary are then measured N more times each, a value
    meeting the SLOs only where more than half of its probes did; a changed verdict moves the
    boundary and the search goes on from there."""

    by: Literal["concurrency", "rate"]
    """`concurrency` (closed loop) or `rate` (open loop)."""
    min: float = Field(1.0, gt=0)
    """The first probe's load."""
    max: float = Field(256.0, gt=0)
    """The highest load probed."""
    slo: SearchSlo
    """What a probe must meet."""
    rate_tolerance: float = Field(0.05, gt=0, le=1)
    """A rate search ends when the boundary is bracketed to this share."""
    early_stop: bool = True
    """Stop a probe as soon as it has clearly broken an SLO (or the server's queue keeps growing)."""
    confirm: int = Field(0, ge=0, le=10)
    """Measure the probes either side of the boundary this many more times each."""

    @model_validator(mode="before")
    @classmethod
    def _needs_slo(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("slo") is None:
            raise ValueError("a search needs its objectives: slo: {ttft_ms: {p99: 300}, ...} "
                             "(on the command line: --slo ttft:p99:300)")
        return data

    @model_validator(mode="after")
    def _check(self) -> Search:
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        if self.by == "concurrency" and not (float(self.min).is_integer() and float(self.max).is_integer()):
            raise ValueError(f"a concurrency search needs whole numbers for min and max (got {self.min:g}, "
                             f"{self.max:g})")
        return self


class ResponseFormat(_Model):
    """Structured output: JSON answers (``json_object``), or answers to a JSON Schema
    (``json_schema``, the schema given inline); each answer is checked (``metrics.valid_json``)."""

    model_config = ConfigDict(populate_by_name=True)  # written back as "schema" or "json_schema" alike

    type: Literal["json_object", "json_schema"]
    """`json_object` (any JSON) or `json_schema` (answers to the schema given)."""
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    """The JSON Schema answers must meet (written `schema`)."""
    name: str = Field("answer", min_length=1, max_length=64)
    """The schema's name, sent to the server."""
    strict: bool = True
    """Ask the server to follow the schema strictly."""

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs schema: the JSON Schema of the answer")
        if self.type == "json_object" and self.json_schema is not None:
            raise ValueError("a schema is for type json_schema; json_object takes none")
        if self.json_schema is not None and (problem := answer_schema_problem(self.json_schema)):
            raise ValueError(problem)
        return self


class Report(_Model):
    """How a run's figures over time are cut: windows of ``window_s`` seconds, or ``windows``
    equal windows over each cell (one of the two; default 10 s). A cell is cut in at most
    10,000 windows: a shorter ``window_s`` is widened to its span over 10,000."""

    window_s: float | None = Field(None, ge=0.01, le=86400)
    """Width of the windows the figures over time are cut into, seconds."""
    windows: int | None = Field(None, ge=1, le=10000)
    """Equal windows per cell, instead of `window_s`."""
    noisy_cv: float = Field(0.05, gt=0, le=10)
    """Repeats whose figure varies more than this (coefficient of variation) are flagged as noisy."""

    @model_validator(mode="after")
    def _one(self) -> Report:
        if self.window_s is not None and self.windows is not None:
            raise ValueError("give window_s or windows, not both")
        return self


class Tools(_Model):
    """Tool definitions (OpenAI's ``tools`` array: ``{type: function, function: {name,
    description, parameters}}``) sent with every chat request, from a JSON file or inline, and
    ``tool_choice``: auto, required, none, or the name of a function to call."""

    file: Path | None = None
    """A JSON file holding the `tools` array."""
    definitions: tuple[dict[str, Any], ...] = ()
    """The `tools` array, inline."""
    choice: str = Field("auto", min_length=1)
    """`tool_choice`: `auto`, `required`, `none`, or the name of a function to call."""

    @model_validator(mode="after")
    def _one(self) -> Tools:
        if (self.file is None) == (not self.definitions):
            raise ValueError("give file (a JSON array of tool definitions) or definitions, one of the two")
        return self


class Images(_Model):
    """Images in each chat request: ``count`` synthetic ones of ``width`` x ``height`` (seeded
    noise, PNG), or the files of ``directory`` in turn."""

    count: int = Field(1, ge=1, le=64)
    """Images per request."""
    width: int = Field(256, ge=1, le=8192)
    """Width of each synthetic image, pixels."""
    height: int = Field(256, ge=1, le=8192)
    """Height of each synthetic image, pixels."""
    format: Literal["png"] = "png"
    """The synthetic images' format."""
    directory: Path | None = None
    """A directory of PNG, JPEG or WebP files sent in turn instead of synthetic images."""

