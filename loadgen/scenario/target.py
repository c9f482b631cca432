"""Where requests go and how they are sent: the server, its API, the client's time limits and
the sampling parameters (the scenario's ``target`` and ``workload.sampling``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from loadgen.data import RequestBody
from loadgen.scenario.shapes import StrictModel
from loadgen.scenario.wire import base_url_problem, header_problem


class _Model(StrictModel):
    pass


MAX_SECONDS = 1e7  # any duration or time limit: about four months, far past any run


class Timeouts(_Model):
    """Client timeouts in seconds; ``None`` disables one."""

    connect_s: float | None = Field(10.0, gt=0, le=MAX_SECONDS)
    """Seconds to open a connection (TCP and TLS); null waits as long as it takes."""
    first_token_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    """Seconds from sending a request to its first streamed token; null: no limit."""
    between_tokens_s: float | None = Field(120.0, gt=0, le=MAX_SECONDS)
    """Seconds the stream may stay silent between two chunks before the request fails; null: no limit."""
    total_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    """Seconds a whole request may take; null: 600 s plus one second per output token asked for."""


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


class Target(_Model):
    base_url: str | None = None
    """The server's OpenAI-compatible root, e.g. `http://127.0.0.1:8000/v1`; null when `serve` starts the
    server."""
    api: Literal["completions", "chat", "responses", "embeddings"] = "completions"
    """Which endpoint the requests go to: `completions`, `chat`, `responses` (OpenAI's Responses API) or
    `embeddings`."""
    model: str = "auto"
    """The model id sent with each request; `auto` takes the first id of the server's `/v1/models`."""
    quant: str | None = None
    """What the server runs, for the tables (a server does not say), e.g. `awq` or `fp8`."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """The environment variable the API key is read from (sent as a bearer token, never written down)."""
    continuous_usage_stats: bool = True
    """Ask for cumulative usage on every chunk (vLLM, SGLang, the simulator): exact tokens per chunk."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent with every request."""
    extra_body: RequestBody = Field(default_factory=dict)
    """Keys merged into every request body: `chat_template_kwargs`, `top_k`, a server's own extras."""
    max_tokens_param: Literal["auto", "max_tokens", "max_completion_tokens"] = "auto"
    """The output-length field of chat requests: `auto` sends `max_completion_tokens` and `max_tokens`
    (what older servers read); completions always send `max_tokens`."""
    timeouts: Timeouts = Timeouts()
    """Client time limits, in seconds."""
    verify_tls: bool = True
    """Check an https server's certificate; false takes a self-signed one, as `curl --insecure`."""
    request_id_prefix: str | None = None
    """Send `X-Request-Id: <prefix><request number>` with each request, for the server's logs."""

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
    """Sampling temperature; unset leaves the server's default."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Nucleus sampling: the share of probability mass drawn from (0 to 1)."""
    top_k: int | None = None
    """Draw from the k most likely tokens only."""
    min_p: float | None = Field(None, ge=0, le=1)
    """Drop tokens less likely than this share of the most likely one (0 to 1)."""
    repetition_penalty: float | None = Field(None, gt=0)
    """Penalty on tokens already in the prompt or the answer (1: none)."""
    presence_penalty: float | None = None
    """OpenAI's presence penalty."""
    frequency_penalty: float | None = None
    """OpenAI's frequency penalty."""
