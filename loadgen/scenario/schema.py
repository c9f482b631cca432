"""The scenario schema: pydantic models with unknown keys rejected, validated once at the edge.

``loadgen.scenario.loader`` reads a file into a ``Scenario``; ``loadgen.scenario.matrix``
expands its matrix and sweeps into cells.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    Field,
    PlainSerializer,
    PlainValidator,
    field_validator,
    model_validator,
)

from loadgen.data import Labels, RequestBody, Unchecked
from loadgen.scenario.serve import Serve
from loadgen.scenario.shapes import (
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


def _sweep(value: Any, *, kind: type, allow: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    """Normalise a scalar-or-list field into a non-empty tuple of positive ``kind`` values."""
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
        out.append(kind(v))
    return tuple(out)


def _scalar_or_list(value: tuple[Any, ...]) -> Any:
    return value[0] if len(value) == 1 else list(value)


_ser = PlainSerializer(_scalar_or_list)
IntSweep = Annotated[tuple[int, ...], PlainValidator(lambda v: _sweep(v, kind=int)), _ser]
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


MAX_SECONDS = 1e7  # any duration or time limit: about four months, far past any run


class Timeouts(_Model):
    """Client timeouts in seconds; ``None`` disables one."""

    connect_s: float | None = Field(10.0, gt=0, le=MAX_SECONDS)
    first_token_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    between_tokens_s: float | None = Field(120.0, gt=0, le=MAX_SECONDS)
    total_s: float | None = Field(None, gt=0, le=MAX_SECONDS)


# a request's total time when the scenario sets none: this, plus PER_TOKEN_S per token asked for
# (a bound no healthy server comes near, that ends a stream that would never end)
DEFAULT_TOTAL_S = 600.0
PER_TOKEN_S = 1.0


def default_total_s(max_tokens: int) -> float:
    return DEFAULT_TOTAL_S + PER_TOKEN_S * max_tokens


def token_limit(max_tokens: int | None) -> int | None:
    """The most output tokens a request of ``max_tokens`` can report: max_tokens and a margin
    (servers that count an end token, a tokenizer's special tokens)."""
    return None if max_tokens is None else max_tokens + max(16, max_tokens // 10)


REDACTED = "<redacted>"
# scheme://user:password@host, and user:password@host without a scheme
_USERINFO = re.compile(r"(?P<scheme>(?:[A-Za-z][A-Za-z0-9+.-]*://)|^)(?P<userinfo>[^/@\s]+)@")


def redact_url(text: str) -> str:
    """A URL (or any text holding URLs) without the user and password parts."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``http://user:pw@host/v1`` -> (``http://host/v1``, ``user:pw``); a URL without them as is."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=hostport)), userinfo


def base_url_problem(url: str) -> str | None:
    """Why ``url`` is not a server's base URL, in words that never repeat its password; None if it is."""
    shown = redact_url(url)
    if not url.startswith(("http://", "https://")):
        return f"must start with http:// or https:// (got {shown!r})"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port out of range
    except ValueError as exc:
        why = "the port must be a number from 1 to 65535" if "port" in str(exc).lower() else f"not a URL ({exc})"
        return f"{shown}: {why}"
    if not parts.hostname:
        return f"{shown}: no host; e.g. http://127.0.0.1:8000/v1"
    if any(c in url for c in "\r\n\t\0 "):
        return f"{shown}: a URL holds no spaces or line breaks"
    return None


# a header value written as ${NAME}: read from that environment variable when requests are made
ENV_REF = re.compile(r"^\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}$")


def header_problem(name: str, value: str) -> str | None:
    """Why a header cannot be sent as given (a line break would add headers of its own)."""
    if any(c in name for c in "\r\n\0:") or not name.strip():
        return f"header name {name!r}: not a header name"
    if any(c in value for c in "\r\n\0"):
        return f"header {name}: its value holds a line break or NUL; give the value alone"
    if value == REDACTED:
        return (f"header {name}: {REDACTED} stands where loadgen wrote down a secret; put the value back, "
                f"or give it with --set target.headers.{name}=VALUE")
    return None


class Target(_Model):
    base_url: str | None = None
    api: Literal["completions", "chat", "responses", "embeddings"] = "completions"
    model: str = "auto"
    # what the server at base_url runs, for the tables (a server does not say): e.g. awq, fp8
    quant: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    # ask for cumulative usage on every chunk (vLLM, SGLang, loadgen sim): exact tokens per chunk
    continuous_usage_stats: bool = True
    headers: dict[str, str] = Field(default_factory=dict)
    # merged into every request body (tools, response_format, chat_template_kwargs, top_k, ...)
    extra_body: RequestBody = Field(default_factory=dict)
    # the output-length field of chat requests: "auto" sends max_completion_tokens (the
    # current OpenAI name) and max_tokens (what older servers read); completions send max_tokens
    max_tokens_param: Literal["auto", "max_tokens", "max_completion_tokens"] = "auto"
    timeouts: Timeouts = Timeouts()
    # check an https server's certificate (false: a self-signed one is taken, as curl --insecure)
    verify_tls: bool = True
    # send "X-Request-Id: <prefix><request number>" with each request (the server logs it)
    request_id_prefix: str | None = None

    @model_validator(mode="after")
    def _check_url(self) -> Target:
        if self.base_url is not None and (why := base_url_problem(self.base_url)) is not None:
            raise ValueError(f"base_url {why}")
        for name, value in self.headers.items():
            if (why := header_problem(name, value)) is not None:
                raise ValueError(why)
        if self.request_id_prefix is not None and (why := header_problem("X-Request-Id", self.request_id_prefix)):
            raise ValueError(f"request_id_prefix: {why}")
        return self


class Sampling(_Model):
    """Sampling parameters sent with every request; unset ones are left to the server."""

    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class PromptFile(_Model):
    """A JSONL file, one object per line: ``prompt`` (text), ``prompt_token_ids`` or ``messages``."""

    file: Path


class Workload(_Model):
    num_prompts: int = Field(200, gt=0, le=10_000_000)
    input_tokens: IntSweep = (128,)
    output_tokens: IntSweep = (64,)
    ignore_eos: bool = True
    # send min_tokens = max_tokens as well (vLLM, SGLang); off for servers that reject it
    min_tokens: bool = True
    # text as clients send it (default), token ids (completions; skips the server's tokenizer),
    # or a JSONL file; "random-tokens" is the former name of token-ids
    prompt: Literal["text", "token-ids"] | PromptFile = "text"
    sampling: Sampling = Sampling()
    # half-open range [lo, hi) of token ids drawn for token-ids prompts
    token_id_range: tuple[int, int] = (1000, 5000)
    # how lengths spread around input_tokens / output_tokens (default: exactly those)
    input_dist: Lengths = Lengths()
    output_dist: Lengths = Lengths()
    dataset: Dataset | None = None
    shared_prefix: SharedPrefix | None = None
    # structured output: JSON answers, checked per request (the length is then the model's own)
    response_format: ResponseFormat | None = None
    # tool definitions sent with chat requests (the length is then the model's own)
    tools: Tools | None = None
    images: Images | None = None  # images in each chat request, as data URLs
    batch_size: int = Field(1, ge=1, le=4096)  # target.api embeddings: inputs per request
    multi_turn: MultiTurn | None = None
    trace: Trace | None = None
    # a tokenizer (tokenizer.json, a model directory or a hub id) that counts dataset lengths;
    # default: the served model's when loadgen knows where it is
    tokenizer: str | None = None

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
    rate: RateSweep = (None,)
    arrival: Literal["poisson", "constant", "gamma"] = "poisson"
    burstiness: float = Field(1.0, gt=0)
    # how an open loop of num_prompts is paced: "loadgen" sends the first request at 0 and keeps
    # the gaps drawn; "vllm-bench" (what bench serve uses) waits a drawn gap before the first too and
    # rescales the gaps so the last send falls at num_prompts / rate, as vLLM's benchmark does
    pacing: Literal["loadgen", "vllm-bench"] = "loadgen"
    warmup_requests: int = Field(1, ge=0)
    duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    # end the run early (exit 4) once this share of a cell's finished requests failed ...
    abort_on_error_rate: float | None = Field(None, gt=0, le=1)
    # ... counted from this many finished requests on
    abort_min_requests: int = Field(20, ge=1)
    # client processes sharing the schedule ("auto": one per core this process may run on)
    workers: int | Literal["auto"] = 1
    # open a fresh connection for every request (TTFT then includes TCP/TLS setup); by default
    # connections are opened before the measured window and kept alive
    new_connection_per_request: bool = False
    clock: Literal["auto", "kernel", "loop"] = "auto"  # bytes timed by the kernel's receive stamp, or the loop
    # empty the engine's prefix cache before each cell (vLLM POST /reset_prefix_cache, SGLang
    # POST /flush_cache); "never" leaves it, and the server's own counters say what it served
    reset_cache: Literal["never", "between-cells"] = "never"
    # the cores the client runs on: a number of cores (taken from the highest) or a list of
    # core ids; None: when the engine runs on this host, the cores it does not use
    client_cpus: int | tuple[int, ...] | None = None
    # the rate rising over the requests of a cell (instead of a fixed rate)
    ramp_up: RampUp | None = None
    # stages run back to back in one cell, each for its duration (instead of one rate/concurrency)
    stages: tuple[Stage, ...] = ()
    # a capacity search: probes chosen one after another until the SLO boundary is bracketed
    search: Search | None = None
    # each cell measured this many times, each time with fresh prompts (figures with 95% intervals)
    repeats: int = Field(1, ge=1, le=100)
    # a pause before each repeat after the first (the server's queues and clocks settle)
    cooldown_s: float = Field(0.0, ge=0, le=3600)

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
    tpot_ms: float | None = Field(None, gt=0)
    e2e_ms: float | None = Field(None, gt=0)

    def limits(self) -> dict[str, float]:
        """The per-request bounds given, in ms (what ``RequestRecord.meets`` checks)."""
        return {k: v for k in ("ttft_ms", "tpot_ms", "e2e_ms") if (v := getattr(self, k)) is not None}


class Override(_Model):
    """Matrix points matching ``when`` (axis -> value or list of values) get ``set`` applied."""

    when: Labels  # the matrix values a point must have
    set: Unchecked  # scenario keys (dotted) -> values


class Matrix(_Model):
    """Axes (an alias such as ``model`` or a dotted scenario key) -> values; every combination
    is a point, minus ``exclude`` matches, with ``overrides`` applied."""

    axes: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    exclude: tuple[Labels, ...] = ()
    overrides: tuple[Override, ...] = ()

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
    name: str = "run"
    # single-stream: batch 1, num_prompts repeats (default 3) of output_tokens (default 2048);
    # throughput: every prompt offered at once unless a rate is given; sweep: as written
    kind: Literal["sweep", "single-stream", "throughput"] = "sweep"
    # single-stream speed: output tokens / request time (Qwen2, Qwen2.5), or (prompt + output) / time
    speed: Literal["output", "total"] = "output"
    # free text for the tables' Note column (usually set per matrix point by an override)
    note: str = ""
    # one block, or a list of blocks whose points are concatenated (tables whose rows do not
    # form one product, such as a model measured at two GPU counts)
    matrix: Matrix | tuple[Matrix, ...] | None = None

    @property
    def matrix_blocks(self) -> tuple[Matrix, ...]:
        if self.matrix is None:
            return ()
        return self.matrix if isinstance(self.matrix, tuple) else (self.matrix,)
    target: Target = Target()
    workload: Workload = Workload()
    load: Load = Load()
    slo: Slo | None = None
    serve: Serve | None = None
    report: Report = Report()
    # prompts and arrivals are drawn from it; None: a fresh seed per run (recorded in the run
    # directory), so that no request repeats a prompt of an earlier run that a server may cache
    seed: int | None = Field(None, ge=0, lt=2**63)

    @model_validator(mode="after")
    def _kind_defaults(self) -> Scenario:
        w, ld = self.workload, self.load
        if w.images is not None and self.target.api != "chat":
            raise ValueError("workload.images are sent with chat requests: set target.api: chat")
        if w.tools is not None and self.target.api not in ("chat", "responses"):
            raise ValueError("workload.tools are sent with chat requests: set target.api: chat (or responses)")
        if w.multi_turn is not None and self.target.api == "completions":
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


