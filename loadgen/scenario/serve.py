"""What a run launches: an engine (``EngineOptions``, also ``loadgen serve``'s options) or
loadgen's simulator (``SimOptions``, also ``loadgen sim``'s options), each option declared once
here; the scenario's ``serve:`` block is a ``Serve``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from loadgen.scenario.shapes import StrictModel

# what `loadgen sim` can inject, by kind
FAULTS: dict[str, str] = {
    "http_429": "429 Too Many Requests with Retry-After, before any token",
    "http_500": "500 Internal Server Error, before any token",
    "http_503": "503 Service Unavailable with Retry-After, before any token",
    "reset": "the connection reset (RST) before the response headers",
    "stream_cut": "the connection reset halfway through the tokens (no end of body)",
    "stall": "no chunk for stall_s seconds halfway through, then the rest",
    "malformed_json": "a chunk of broken JSON halfway through",
    "missing_prefix": "every token chunk sent without its 'data:' prefix, then [DONE]",
    "no_done": "a complete stream (finish_reason set) that ends without [DONE]",
    "usage_mismatch": "a final usage chunk claiming one token more than the chunks carried",
    "usage_huge": "a final usage chunk claiming a billion output tokens",
    "wrong_types": "a chunk whose choices is a number, halfway through",
    "overrun": "tokens without end, past max_tokens, until the client hangs up (no usage per chunk)",
    "slow_ttft": "the first token slow_ttft_s seconds later than configured",
}


class SimOptions(StrictModel):
    """loadgen's simulator: ``loadgen sim``'s options (each field is its ``--flag``) and a
    scenario's ``serve.sim`` block."""

    ttft_ms: float = Field(50.0, ge=0, description="time to first token, ms")
    itl_ms: float = Field(10.0, ge=0, description="time between tokens, ms")
    tokens_per_chunk: int = Field(1, ge=1, description="tokens per streamed chunk")
    model: str = Field("loadgen-sim", description="model id served")
    max_model_len: int = Field(1_000_000, ge=2, description="context length: longer requests get 400")
    faults: dict[str, float] = Field(
        default_factory=dict,
        description="inject KIND=RATE (repeatable), the rates adding up to at most 1: " + " ".join(FAULTS),
    )
    fault_seed: int = Field(0, description="seed of the per-request fault draw")
    retry_after_s: int = Field(1, ge=0, description="Retry-After of injected 429 / 503")
    stall_s: float = Field(2.0, gt=0, description="length of an injected stall, s")
    slow_ttft_ms: float = Field(500.0, ge=0, description="extra first-token delay of slow_ttft, ms")
    crash_after: int | None = Field(None, ge=1, description="exit abruptly when this many requests have arrived")
    # the simulator reads the variable's value from its environment
    api_key_env: str | None = Field(
        None, description="require 'Authorization: Bearer $VAR' on completions (401 otherwise)"
    )
    reasoning_tokens: int = Field(
        0, ge=0, description="stream the first N tokens of a chat answer as delta.reasoning_content"
    )
    image_tokens: int = Field(64, ge=0, le=100_000, description="prompt tokens each image of a chat message counts")
    structured_output: bool = Field(
        True, description="answer JSON to a request's response_format (false: plain text, as a server without it)"
    )
    reject_params: tuple[str, ...] = Field(
        (), description="answer 400 to requests carrying FIELD (repeatable), e.g. --reject-param ignore_eos"
    )
    # capacity: at most max_seqs served at once (the rest queue); ITL grows by itl_per_seq_us
    # per other request served; the first token waits prefill_per_token_us per prompt token
    max_seqs: int | None = Field(None, ge=1, description="serve at most N requests at once; the rest queue")
    itl_per_seq_us: float = Field(0.0, ge=0, description="ITL added per other request being served, us")
    prefill_per_token_us: float = Field(0.0, ge=0, description="first-token delay per prompt token, us")
    embedding_per_token_us: float = Field(
        20.0, ge=0, description="an embeddings answer's time per input token, us (after --ttft-ms)")
    # run-to-run noise: each request's ITL times a factor drawn from a normal of mean 1
    jitter: float = Field(0.0, ge=0, le=0.5, description="each request's ITL times a normal draw of mean 1 and this "
                          "standard deviation (a share, e.g. 0.02)")
    jitter_seed: int = Field(0, description="seed of the per-request jitter draw")

    @model_validator(mode="after")
    def _check_faults(self) -> SimOptions:
        for kind, rate in self.faults.items():
            if kind not in FAULTS:
                raise ValueError(f"unknown fault {kind!r}; choose from {', '.join(FAULTS)}")
            if not 0 <= rate <= 1:
                raise ValueError(f"fault {kind}={rate:g}: a rate is between 0 and 1")
        if sum(self.faults.values()) > 1 + 1e-9:
            raise ValueError("fault rates add up to more than 1")
        return self

    # the simulator keeps time in seconds
    @property
    def ttft_s(self) -> float:
        return self.ttft_ms / 1e3

    @property
    def itl_s(self) -> float:
        return self.itl_ms / 1e3

    @property
    def slow_ttft_s(self) -> float:
        return self.slow_ttft_ms / 1e3

    @property
    def itl_per_seq_s(self) -> float:
        return self.itl_per_seq_us / 1e6

    @property
    def prefill_per_token_s(self) -> float:
        return self.prefill_per_token_us / 1e6

    def argv(self) -> list[str]:
        """The options that differ from their defaults, as ``loadgen sim``'s flags."""
        out: list[str] = []
        for name in type(self).model_fields:
            value, default = getattr(self, name), type(self).model_fields[name].get_default(call_default_factory=True)
            if value == default:
                continue
            name_ = flag(name)
            if isinstance(value, dict):
                out += [x for kind, rate in value.items() for x in (name_, f"{kind}={rate:g}")]
            elif isinstance(value, tuple):
                out += [x for item in value for x in (name_, str(item))]
            elif isinstance(value, bool):  # a switch: on, or its "off" form
                out.append(name_ if value else f"--no-{name_[2:]}")
            else:
                out += [name_, f"{value:g}" if isinstance(value, float) else str(value)]
        return out


# flags named otherwise than their field (one of many values each)
SIM_FLAGS: dict[str, str] = {"faults": "--fault", "reject_params": "--reject-param"}


def flag(option: str) -> str:
    """An option's command-line flag: ``--kv-cache-dtype`` for ``kv_cache_dtype`` (``--fault``
    for the simulator's ``faults``, one fault each)."""
    return SIM_FLAGS.get(option, "--" + option.replace("_", "-"))


# the choices of loadgen's transformers engine, shared with its own command line (servers/hfserve.py)
Attention = Literal["sdpa", "eager", "flash_attention_2"]
LoadIn = Literal["8bit", "4bit"]
GradMode = Literal["inference_mode", "no_grad"]


class EngineOptions(StrictModel):
    """An engine launch, as ``loadgen serve`` takes it (each field is its ``--flag``) and as a
    scenario's ``serve:`` block holds it: one declaration of each option. Which engine takes
    which of the engine-specific options, and the engine names, are declared by the engines
    themselves (``loadgen engines``), and checked before anything is launched."""

    model: str | None = Field(None, description="catalogue alias (see `loadgen models`), hub id or path")
    backend: str | None = Field(
        None, description="the engine (see `loadgen engines`); a model without one gets the first engine listed"
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto", description="auto | cuda | cpu (auto: GPU, but the tiny model on CPU without one)"
    )
    quant: str | None = Field(None, description="bf16 | gptq-int8 | gptq-int4 | awq | fp8, or the engine's own")
    setting: str | None = Field(None, description="settings preset: default, 1..5, 64k")
    gpus: str | None = Field(None, description="GPU indices for CUDA_VISIBLE_DEVICES, e.g. 0,1")
    tp: int | None = Field(None, ge=1, description="tensor parallel size (default: the GPUs given)")
    pp: int = Field(1, ge=1, description="pipeline parallel size")
    kv_cache_dtype: str | None = Field(None, description="KV-cache dtype, e.g. fp8")
    load_format: str | None = Field(None, description="e.g. dummy: random weights of the real architecture")
    attn: Attention = Field(
        "sdpa", description="attention implementation: sdpa | eager | flash_attention_2"
    )
    load_in: LoadIn | None = Field(
        None, description="load the weights 8bit or 4bit (bitsandbytes)"
    )
    grad_mode: GradMode = Field(
        "inference_mode", description="inference_mode (default) or no_grad"
    )
    slots: int | None = Field(
        None, ge=1,
        description="parallel slots of an engine that fixes them at start, at least the concurrency "
        "(default 16; in a run, the highest concurrency)",
    )
    tool_parser: str | None = Field(
        None, description="parse tool calls out of the answers with this parser, e.g. hermes (needed for "
        "workload.tools on engines that parse them)",
    )
    extra_args: tuple[str, ...] = Field((), description="more arguments for the engine, as its own flags")
    host: str = Field("127.0.0.1", description="address the engine binds")
    port: int | None = Field(None, ge=0, le=65535, description="port the engine listens on (default: a free one)")
    force: bool = Field(False, description="launch on GPUs that already hold memory")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus_text(cls, v: Any) -> Any:
        if isinstance(v, list):
            return ",".join(str(x) for x in v)
        return str(v) if isinstance(v, int) else v

    def chosen(self) -> dict[str, object]:
        """The options given a value other than their default."""
        return {k: v for k in self.model_fields_set if (v := getattr(self, k)) != type(self).model_fields[k].default}


# the engine-specific options: an engine takes those it declares (``Engine.options``)
ENGINE_SPECIFIC: tuple[str, ...] = ("kv_cache_dtype", "load_format", "attn", "load_in", "grad_mode", "slots",
                                     "tool_parser")


class Serve(EngineOptions):
    """How ``loadgen run`` starts the server itself (and stops it afterwards).

    ``backend: sim`` (the default without a model) starts loadgen's simulator; an engine is
    resolved exactly as ``loadgen serve`` resolves its options.
    """

    skip_unavailable: bool = False
    """Record a matrix point whose engine is not installed or cannot run on this machine as skipped, with
    the reason, instead of failed."""
    ready_timeout_s: float | None = Field(None, gt=0)
    """Seconds to wait for the server to be ready; default: 60 for the simulator, 600 for a CPU engine,
    1,800 on GPUs."""
    sim: SimOptions = SimOptions()
    """The simulator's options, with `backend: sim`."""

    @model_validator(mode="after")
    def _check_backend(self) -> Serve:
        if self.backend is None and self.model is None:
            object.__setattr__(self, "backend", "sim")
        if self.backend == "sim" and self.model is not None:
            raise ValueError("the simulator takes no model; set backend to an engine (see `loadgen engines`)")
        if self.backend not in (None, "sim") and self.model is None:
            raise ValueError(f"backend {self.backend} needs a model: a catalogue alias (tiny, ...), hub id or path")
        return self
