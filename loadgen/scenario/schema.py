"""The scenario schema: pydantic models with unknown keys rejected, validated once at the edge.

``loadgen.scenario.loader`` reads a file into a ``Scenario``; ``loadgen.scenario.matrix``
expands its matrix and sweeps into cells.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PlainSerializer,
    PlainValidator,
    field_validator,
    model_validator,
)

from loadgen.data import Labels, Unchecked
from loadgen.scenario.serve import Serve
from loadgen.scenario.shapes import (
    MAX_TOKENS,
    Dataset,
    Images,
    Lengths,
    MultiTurn,
    RampUp,
    Report,
    ResponseFormat,
    Search,
    SharedPrefix,
    Stage,
    StrictModel,
    Tools,
    Trace,
)
from loadgen.scenario.target import MAX_SECONDS, Sampling, Target


def _sweep(value: Any, *, kind: type, allow: tuple[Any, ...] = (), most: float | None = None) -> tuple[Any, ...]:
    """Normalise a scalar-or-list field into a non-empty tuple of positive ``kind`` values (at most ``most``)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError("must not be an empty list")
    out = []
    what = "a positive integer" if kind is int else "a positive number"
    extra = "".join(" or null" if a is None else f" or {a!r}" for a in allow)
    for v in values:
        if v in allow:
            out.append(v)
            continue
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"must be {what}{extra}, or a list of them (got {v!r})")
        if kind is int and not float(v).is_integer():
            raise ValueError(f"must be {what}{extra}, or a list of them (got {v!r})")
        if v <= 0:
            raise ValueError(f"must be {what}{extra}, or a list of them (got {v!r})")
        if most is not None and v > most:
            raise ValueError(f"must be at most {most:,} (got {v!r})")
        out.append(kind(v))
    return tuple(out)


def _scalar_or_list(value: tuple[Any, ...]) -> Any:
    return value[0] if len(value) == 1 else list(value)


_ser = PlainSerializer(_scalar_or_list)
IntSweep = Annotated[tuple[int, ...], PlainValidator(lambda v: _sweep(v, kind=int, most=MAX_TOKENS)), _ser]
UNLIMITED = "unlimited"  # how a file says "no concurrency limit"; None inside loadgen


def _concurrency(value: Any) -> tuple[int | None, ...]:
    return tuple(None if c is None else c for c in _sweep(value, kind=int, allow=(UNLIMITED, None)))


# each value a concurrency, or None for unlimited: read from and written as "unlimited", here only
ConcurrencySweep = Annotated[
    tuple[int | None, ...],
    PlainValidator(lambda v: tuple(None if c == UNLIMITED else c for c in _concurrency(v))),
    PlainSerializer(lambda v: _scalar_or_list(tuple(UNLIMITED if c is None else c for c in v))),
]
RateSweep = Annotated[
    tuple[float | None, ...],
    PlainValidator(lambda v: _sweep(v, kind=float, allow=(None,))),
    _ser,
]




class _Model(StrictModel):
    pass


class PromptFile(_Model):
    """A JSONL file, one object per line: ``prompt`` (text), ``prompt_token_ids`` or ``messages``."""

    file: Path
    """The JSONL file, relative to the scenario file."""


class Workload(_Model):
    num_prompts: int = Field(200, gt=0, le=10_000_000)
    """Requests measured in each cell (sessions, for multi-turn workloads)."""
    input_tokens: IntSweep = (128,)
    """Prompt length in tokens, or a list of them (one cell per value)."""
    output_tokens: IntSweep = (64,)
    """Tokens asked for per request, or a list of them (one cell per value)."""
    ignore_eos: bool = True
    """Ask the server to go on past its end token, so each answer is as long as asked."""
    min_tokens: bool = True
    """Send `min_tokens` equal to the tokens asked for as well (vLLM, SGLang); false for servers that
    reject it."""
    prompt: Literal["text", "token-ids"] | PromptFile = "text"
    """Text as clients send it (`text`), token-id lists on `/v1/completions` (`token-ids`, which skip the
    server's tokenizer), or a JSONL file (`{file: prompts.jsonl}`)."""
    sampling: Sampling = Sampling()
    """Sampling parameters sent with every request."""
    token_id_range: tuple[int, int] = (1000, 5000)
    """The half-open range `[lo, hi)` token-ids prompts draw their ids from."""
    input_dist: Lengths = Lengths()
    """How prompt lengths spread around `input_tokens` (default: exactly it)."""
    output_dist: Lengths = Lengths()
    """How output lengths spread around `output_tokens` (default: exactly it)."""
    dataset: Dataset | None = None
    """Prompts from a dataset (ShareGPT, JSONL, Hugging Face) instead of generated text."""
    shared_prefix: SharedPrefix | None = None
    """Openings shared between requests, so that the engine's prefix cache is meant to hit."""
    response_format: ResponseFormat | None = None
    """Structured output: JSON answers, each checked (the answer's length is then the model's own)."""
    tools: Tools | None = None
    """Tool definitions sent with chat and Responses requests (the answer's length is then the model's
    own)."""
    images: Images | None = None
    """Images sent with each chat request, as data URLs."""
    batch_size: int = Field(1, ge=1, le=4096)
    """Inputs per request on the embeddings API."""
    multi_turn: MultiTurn | None = None
    """Multi-turn chat sessions, generated or from a session file."""
    trace: Trace | None = None
    """A request trace replayed on its timestamps."""
    tokenizer: str | None = None
    """A tokenizer (`tokenizer.json`, a model directory or a hub id) that counts dataset lengths; default:
    the served model's, where loadgen knows where it is."""

    @field_validator("prompt", mode="before")
    @classmethod
    def _former_names(cls, v: Any) -> Any:
        return "token-ids" if v == "random-tokens" else v

    @model_validator(mode="after")
    def _check_range(self) -> Workload:
        lo, hi = self.token_id_range
        if not 0 <= lo < hi:
            raise ValueError(f"token_id_range must be [lo, hi) with 0 <= lo < hi (got {[lo, hi]})")
        sources = [k for k in ("dataset", "trace") if getattr(self, k) is not None]
        if isinstance(self.prompt, PromptFile):
            sources.append("prompt.file")
        if len(sources) > 1:
            raise ValueError(f"give one prompt source, not {' and '.join(sources)}")
        if self.multi_turn is not None and (sources or self.prompt == "token-ids"):
            raise ValueError("multi_turn sessions are made of generated chat text: drop dataset, trace and prompt")
        if self.shared_prefix is not None and (sources or self.prompt == "token-ids"):
            raise ValueError("shared_prefix applies to generated text prompts: drop dataset, trace and prompt")
        return self

    @property
    def shares_content(self) -> bool:
        """Whether requests are meant to share prompt content (a prefix cache may serve them)."""
        return self.source != "generated" or self.shared_prefix is not None or self.multi_turn is not None

    @property
    def source(self) -> str:
        """Where prompts come from, in a word."""
        if self.trace is not None:
            return "trace"
        if self.multi_turn is not None and self.multi_turn.file is not None:
            return "sessions"
        if self.dataset is not None:
            return self.dataset.kind
        if isinstance(self.prompt, PromptFile):
            return "jsonl"
        return "generated"


class Load(_Model):
    concurrency: ConcurrencySweep = (1,)
    """Requests in flight at most: a number, `unlimited`, or a list (one cell per value)."""
    rate: RateSweep = (None,)
    """Requests per second of an open loop; null offers every request at once; a list makes one cell per
    value."""
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    """How an open loop's gaps are drawn: `poisson`, `constant` or `gamma`."""
    burstiness: float = Field(1.0, gt=0)
    """The gamma distribution's shape for `arrival: gamma` (1 is Poisson; lower is burstier)."""
    pacing: Literal["loadgen", "vllm-bench"] = "loadgen"
    """How an open loop is paced: `loadgen` sends the first request at 0 and keeps the drawn gaps; `vllm-
    bench` waits a drawn gap first and rescales the gaps so the last send falls at num_prompts / rate,
    as vLLM's benchmark does."""
    warmup_requests: int = Field(1, ge=0)
    """Requests sent before each cell, recorded with `warmup: true` and left out of the figures."""
    duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    """Stop sending new requests after this many seconds of a cell."""
    abort_on_error_rate: float | None = Field(None, gt=0, le=1)
    """End the run early (exit 4) once this share of a cell's finished requests failed."""
    abort_min_requests: int = Field(20, ge=1)
    """The finished requests counted before `abort_on_error_rate` applies."""
    workers: int | Literal["auto"] = 1
    """Client processes sharing the schedule; `auto`: one per core this process may run on."""
    new_connection_per_request: bool = False
    """Open a fresh connection for every request (TTFT then includes TCP and TLS setup); by default
    connections are opened before the measured window and kept alive."""
    clock: Literal["auto", "kernel", "loop"] = "auto"
    """What times a token's bytes: the kernel's receive stamp (`kernel`), the event loop (`loop`), or the
    kernel's where available (`auto`)."""
    reset_cache: Literal["never", "between-cells"] = "never"
    """`between-cells` empties the engine's prefix cache before each cell (vLLM, SGLang); `never` leaves
    it, and the server's counters say what it served."""
    client_cpus: int | tuple[int, ...] | None = None
    """The cores the client runs on: a number of cores (taken from the highest) or a list of core ids;
    null: the cores a local engine does not use."""
    ramp_up: RampUp | None = None
    """The rate rising over the requests of a cell, instead of a fixed rate."""
    stages: tuple[Stage, ...] = ()
    """Stages run back to back in one cell, each for its duration."""
    search: Search | None = None
    """A capacity search: probes chosen one after another until the SLO boundary is bracketed."""
    repeats: int = Field(1, ge=1, le=100)
    """Measure each cell this many times, each with fresh prompts (figures then carry 95% intervals)."""
    cooldown_s: float = Field(0.0, ge=0, le=3600)
    """A pause, in seconds, before each repeat after the first."""

    @model_validator(mode="after")
    def _check_workers(self) -> Load:
        if self.repeats > 1 and self.search is not None:
            raise ValueError("a search measures again with search.confirm: drop load.repeats")
        if self.ramp_up is not None and self.stages:
            raise ValueError("give ramp_up or stages, not both")
        if (self.ramp_up is not None or self.stages) and any(r is not None for r in self.rate):
            raise ValueError("ramp_up and stages set the rate themselves: drop load.rate")
        if self.stages and self.duration_s is not None:
            raise ValueError("stages have their own durations: drop load.duration_s")
        if self.search is not None:
            if self.ramp_up is not None or self.stages:
                raise ValueError("search chooses each probe's load: drop ramp_up and stages")
            if self.search.by == "concurrency" and self.concurrency != (1,):
                raise ValueError("search by concurrency sets load.concurrency itself: drop load.concurrency")
            if any(r is not None for r in self.rate):
                raise ValueError(
                    "search by rate sets load.rate itself: drop load.rate" if self.search.by == "rate"
                    else "a concurrency search is closed loop: drop load.rate"
                )
            if len(self.concurrency) > 1:
                raise ValueError("a rate search takes one load.concurrency cap (or none)")
        if isinstance(self.workers, int) and self.workers < 1:
            raise ValueError(f"workers must be >= 1 or 'auto' (got {self.workers})")
        cpus = self.client_cpus
        if isinstance(cpus, int) and cpus < 1:
            raise ValueError(f"client_cpus must be a number of cores >= 1 or a list of core ids (got {cpus})")
        if isinstance(cpus, tuple) and (not cpus or any(c < 0 for c in cpus)):
            raise ValueError("client_cpus: give at least one core id, each >= 0")
        return self


class Slo(_Model):
    """Service-level objectives in milliseconds; any given enables goodput."""

    ttft_ms: float | None = Field(None, gt=0)
    """The most time to first token a request may take, ms."""
    tpot_ms: float | None = Field(None, gt=0)
    """The most time per output token a request may average after its first, ms."""
    e2e_ms: float | None = Field(None, gt=0)
    """The most time a whole request may take, ms."""

    def limits(self) -> dict[str, float]:
        """The per-request bounds given, in ms (what ``RequestRecord.meets`` checks)."""
        return {k: v for k in ("ttft_ms", "tpot_ms", "e2e_ms") if (v := getattr(self, k)) is not None}


class Override(_Model):
    """Matrix points matching ``when`` (axis -> value or list of values) get ``set`` applied."""

    when: Labels
    """The matrix values a point must have (axis: value or list of values)."""
    set: Unchecked
    """Scenario keys (dotted) and the values they take at those points."""


class Matrix(_Model):
    """Axes (an alias such as ``model`` or a dotted scenario key) -> values; every combination
    is a point, minus ``exclude`` matches, with ``overrides`` applied."""

    axes: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    """Axis (an alias such as `model`, or a dotted scenario key) to its values; written directly under
    `matrix:`."""
    exclude: tuple[Labels, ...] = ()
    """Points left out: each a map of axis to value(s) a point must match."""
    overrides: tuple[Override, ...] = ()
    """Keys set at the points that match a rule."""

    @model_validator(mode="before")
    @classmethod
    def _collect_axes(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "axes" in data:
            return data
        axes = {k: (v if isinstance(v, list) else [v]) for k, v in data.items() if k not in ("exclude", "overrides")}
        return {"axes": axes, **{k: data[k] for k in ("exclude", "overrides") if k in data}}

    @model_validator(mode="after")
    def _check(self) -> Matrix:
        for axis, values in self.axes.items():
            if axis not in AXES and axis.split(".")[0] not in SWEEP_SECTIONS:
                raise ValueError(
                    f"matrix.{axis}: unknown axis; use one of {', '.join(AXES)} or a dotted key such as serve.tp"
                )
            if not values:
                raise ValueError(f"matrix.{axis}: give at least one value")
        for rule in (*self.exclude, *(o.when for o in self.overrides)):
            unknown = [k for k in rule if k not in self.axes]
            if unknown:
                raise ValueError(
                    f"matrix: {unknown[0]!r} in exclude/overrides is not an axis of this matrix "
                    f"({', '.join(self.axes)})"
                )
        return self


# short axis names -> the scenario key they set
AXES: dict[str, str] = {
    "model": "serve.model", "quant": "serve.quant", "backend": "serve.backend", "engine": "serve.backend",
    "device": "serve.device", "setting": "serve.setting", "tp": "serve.tp", "pp": "serve.pp",
    "gpus": "serve.gpus", "attn": "serve.attn", "kv_cache_dtype": "serve.kv_cache_dtype",
    "load_in": "serve.load_in", "grad_mode": "serve.grad_mode",
    "input_tokens": "workload.input_tokens", "output_tokens": "workload.output_tokens",
    "num_prompts": "workload.num_prompts", "concurrency": "load.concurrency", "rate": "load.rate",
    "note": "note",
}
SWEEP_SECTIONS = ("serve", "workload", "load", "target", "note", "sampling")
# serve keys that may be written as a list, each value becoming a matrix axis
SERVE_LIST_KEYS = ("model", "backend", "quant", "setting", "tp", "attn", "device", "kv_cache_dtype")


class Scenario(_Model):
    name: str = Field("run", min_length=1, max_length=200)
    """One line of text that titles the tables, report.md and the terminal's lines."""
    kind: Literal["sweep", "single-stream", "throughput"] = "sweep"
    """`sweep`: as written; `single-stream`: batch 1, 3 prompts of 2,048 output tokens unless set;
    `throughput`: every prompt offered at once unless a rate is given."""
    speed: Literal["output", "total"] = "output"
    """Single-stream speed: output tokens per request time (`output`), or prompt and output tokens per
    request time (`total`)."""
    note: str = ""
    """Free text for the tables' Note column (usually set per matrix point by an override)."""
    matrix: Matrix | tuple[Matrix, ...] | None = None
    """Axes whose every combination is a point, or a list of such blocks whose points are concatenated."""

    @field_validator("name")
    @classmethod
    def _one_line(cls, name: str) -> str:
        if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
            raise ValueError("give one line of text, without line breaks or control characters")
        return name

    @property
    def matrix_blocks(self) -> tuple[Matrix, ...]:
        if self.matrix is None:
            return ()
        return self.matrix if isinstance(self.matrix, tuple) else (self.matrix,)
    target: Target = Target()
    """The server and the API the requests go to."""
    workload: Workload = Workload()
    """What each request asks for."""
    load: Load = Load()
    """How requests are offered: concurrency, rate, search, repeats."""
    slo: Slo | None = None
    """Per-request objectives; any given enables goodput."""
    serve: Serve | None = None
    """The server `loadgen run` starts itself and stops afterwards (the simulator or an engine)."""
    report: Report = Report()
    """How the figures over time are cut, and when repeats are flagged as noisy."""
    seed: int | None = Field(None, ge=0, lt=2**63)
    """Prompts and arrivals are drawn from it; null: a fresh seed per run (recorded in the run directory),
    so that no request repeats a prompt of an earlier run that a server may have cached."""

    @model_validator(mode="after")
    def _kind_defaults(self) -> Scenario:
        w, ld = self.workload, self.load
        if w.images is not None and self.target.api != "chat":
            raise ValueError("workload.images are sent with chat requests: set target.api: chat")
        if w.tools is not None and self.target.api not in ("chat", "responses"):
            raise ValueError("workload.tools are sent with chat requests: set target.api: chat (or responses)")
        if w.multi_turn is not None and self.target.api in ("completions", "embeddings"):
            raise ValueError("workload.multi_turn sends conversations: set target.api: chat (or responses)")
        if w.multi_turn is not None and w.multi_turn.history != "full" and self.target.api != "responses":
            raise ValueError("multi_turn.history previous-response is the Responses API's: set target.api: responses")
        if self.kind == "single-stream":
            if any(c != 1 for c in ld.concurrency) or any(r is not None for r in ld.rate):
                raise ValueError(
                    "kind single-stream runs at batch 1: drop load.concurrency and load.rate (or set concurrency: 1)"
                )
            update: dict[str, object] = {}
            if "num_prompts" not in w.model_fields_set:
                update["num_prompts"] = 3
            if "output_tokens" not in w.model_fields_set:
                update["output_tokens"] = (2048,)
            if update:
                object.__setattr__(self, "workload", w.model_copy(update=update))
        if ld.search is not None:
            if self.kind == "single-stream":
                raise ValueError("kind single-stream runs at batch 1: a search needs kind sweep or throughput")
            if w.trace is not None:
                raise ValueError("a trace sets its own arrival times: a search cannot probe it")
            if ld.search.by == "rate" and "concurrency" not in ld.model_fields_set:
                object.__setattr__(self, "load", ld.model_copy(update={"concurrency": (None,)}))
            return self  # the search sets each probe's load: no kind default applies
        if self.kind == "throughput" and "concurrency" not in ld.model_fields_set:
            object.__setattr__(self, "load", ld.model_copy(update={"concurrency": (None,)}))
        return self


