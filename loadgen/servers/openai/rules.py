"""What vLLM checks and fills in on a completion request, for loadgen's own servers: the model
named must be the one served (404), ``max_tokens`` at least 1 and the sampling parameters in
vLLM's bounds (400, in its words), chat without a length
runs to the context's end while completions stop at 16, ``n`` choices, ``stop`` strings,
``echo`` and ``logprobs``; errors in vLLM's body, ``{"error": {message, type, param, code}}``,
so that an OpenAI SDK reads ``e.code`` and ``e.param``."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import orjson

from loadgen.data import RequestBody

# what OpenAI's legacy completions API (and vLLM) generate when a request gives no length
COMPLETIONS_DEFAULT_TOKENS = 16


def error_body(message: str, kind: str = "BadRequestError", code: int = 400, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}})


class RequestRefused(ValueError):
    """A request vLLM would refuse: its status, message, error type and the field at fault."""

    def __init__(self, message: str, code: int = 400, kind: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.code, self.kind, self.param = code, kind, param

    def body(self) -> bytes:
        return error_body(str(self), self.kind, self.code, self.param)


def request_id(chat: bool) -> str:
    """A fresh id per request, in vLLM's forms."""
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, slots=True)
class Ask:
    """The answer a request asks for."""

    max_tokens: int
    n: int = 1
    stop: tuple[str, ...] = ()
    echo: bool = False
    logprobs: int | None = None  # completions: how many alternatives; chat: top_logprobs when logprobs is true


def _int(body: RequestBody, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestRefused(f"{name} must be an integer, got {value!r}.", param=name)
    return value


def ask_of(body: RequestBody, *, chat: bool, served: str, prompt_tokens: int, max_model_len: int) -> Ask:
    """The request's answer as vLLM reads it; RequestRefused where vLLM refuses it."""
    model = body.get("model")
    if model is not None and model != served:
        raise RequestRefused(f"The model `{model}` does not exist. Valid aliases: {served}.", 404, "NotFoundError",
                             "model")
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    asked = _int(body, name)
    if asked is None:
        max_tokens = max_model_len - prompt_tokens if chat else COMPLETIONS_DEFAULT_TOKENS
    elif asked < 1:
        raise RequestRefused(f"max_tokens must be at least 1, got {asked}. (parameter=max_tokens, value={asked})",
                             param="max_tokens")
    elif asked > max_model_len:
        raise RequestRefused(f"max_tokens={asked} cannot be greater than max_model_len={max_model_len}. Please "
                             f"request fewer output tokens. (parameter=max_tokens, value={asked})", param="max_tokens")
    else:
        max_tokens = asked
    if prompt_tokens + max_tokens > max_model_len:
        raise RequestRefused(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion.", param="max_tokens")
    n = _int(body, "n")
    if n is not None and n < 1:
        raise RequestRefused(f"n must be at least 1, got {n}.", param="n")
    check_sampling(body, max_tokens)
    stop = body.get("stop")
    if stop == "" or (isinstance(stop, list) and "" in stop):
        raise RequestRefused("stop cannot contain an empty string.")
    stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop or () if isinstance(s, str) and s)
    if chat:
        logprobs = (_int(body, "top_logprobs") or 0) if body.get("logprobs") else None
    else:
        logprobs = _int(body, "logprobs")
    return Ask(max_tokens, n or 1, stops, bool(body.get("echo")) and not chat, logprobs)


def _number(body: RequestBody, name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestRefused(f"{name} must be a number, got {value!r}.", param=name)
    return float(value)


def _said(message: str, name: str, value: float) -> RequestRefused:
    """A refusal that names its field, worded as vLLM words it (the field and value appended)."""
    return RequestRefused(f"{message} (parameter={name}, value={value})", param=name)


def check_sampling(body: RequestBody, max_tokens: int) -> None:
    """vLLM's checks of the sampling parameters (its SamplingParams), in its order and words:
    RequestRefused (400, BadRequestError) at the first it fails; a float field reads as a float
    (``-1`` is ``-1.0``)."""
    for name in ("presence_penalty", "frequency_penalty"):
        if (v := _number(body, name)) is not None and not -2.0 <= v <= 2.0:
            raise RequestRefused(f"{name} must be in [-2, 2], got {v}.")
    if (v := _number(body, "repetition_penalty")) is not None:
        if not math.isfinite(v):
            raise RequestRefused(f"repetition_penalty must be a finite number, got {v}.")
        if v <= 0.0:
            raise RequestRefused(f"repetition_penalty must be greater than zero, got {v}.")
    if (v := _number(body, "temperature")) is not None:
        if not math.isfinite(v):
            raise _said(f"temperature must be a finite number, got {v}.", "temperature", v)
        if v < 0.0:
            raise _said(f"temperature must be non-negative, got {v}.", "temperature", v)
        if v > 2.0:
            raise _said(f"temperature must be in [0, 2], got {v}.", "temperature", v)
    if (v := _number(body, "top_p")) is not None and not 0.0 < v <= 1.0:
        raise _said(f"top_p must be in (0, 1], got {v}.", "top_p", v)
    if (k := _int(body, "top_k")) is not None and k < -1:
        raise RequestRefused(f"top_k must be 0 (disable), or at least 1, got {k}.")
    if (v := _number(body, "min_p")) is not None and not 0.0 <= v <= 1.0:
        raise RequestRefused(f"min_p must be in [0, 1], got {v}.")
    if (m := _int(body, "min_tokens")) is not None:
        if m < 0:
            raise RequestRefused(f"min_tokens must be greater than or equal to 0, got {m}.")
        if m > max_tokens:
            raise RequestRefused(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {m}.")


def stop_at(words: list[str], stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the first stop string ends in an answer of ``words`` (each a token's text): the
    number of tokens generated when it appeared, and the text before it; None when none does."""
    if not stops:
        return None
    text = ""
    for i, word in enumerate(words, 1):
        text += word
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            at, _ = min(hits)
            return i, text[:at]
    return None
