"""Request and response bodies of ``/v1/completions`` and ``/v1/chat/completions`` as an
OpenAI-compatible server writes them (vLLM's shapes: a role-only first chat delta, usage in
a last chunk with empty choices, cumulative usage per chunk on request)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from loadgen.data import RequestBody


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def models_list(name: str, created: int, max_model_len: int) -> bytes:
    """The ``/v1/models`` answer of a server that serves one model."""
    return orjson.dumps({"object": "list", "data": [{
        "id": name, "object": "model", "created": created, "owned_by": "loadgen", "max_model_len": max_model_len,
    }]})


def error(message: str, kind: str = "BadRequestError") -> bytes:
    return orjson.dumps({"object": "error", "message": message, "type": kind})


def request_body(raw: bytes) -> RequestBody:
    """The JSON object of a request; ``ValueError`` (a 400) for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


def max_tokens_of(body: RequestBody) -> int:
    """``max_completion_tokens`` (the chat API's current name), else ``max_tokens``, else 16."""
    value = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    if value < 1:
        raise ValueError("max_tokens must be >= 1")
    return value


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """``stream_options``: a final usage chunk, and cumulative usage on every chunk."""

    include_usage: bool
    continuous: bool

    @classmethod
    def of(cls, body: RequestBody) -> StreamOptions:
        options = body.get("stream_options") or {}
        include = bool(options.get("include_usage"))
        return cls(include, include and bool(options.get("continuous_usage_stats")))


def object_name(chat: bool, streamed: bool) -> str:
    if chat:
        return "chat.completion.chunk" if streamed else "chat.completion"
    return "text_completion"


def whole_answer(
    *, chat: bool, id_: str, created: int, model: str, text: str, finish: str | None, prompt_tokens: int,
    completion_tokens: int,
) -> bytes:
    """A non-streamed answer: one choice holding the whole text, and its usage."""
    choice: dict[str, object] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice |= {"text": text, "logprobs": None}
    return orjson.dumps({
        "id": id_, "object": object_name(chat, streamed=False), "created": created, "model": model,
        "choices": [choice], "usage": usage(prompt_tokens, completion_tokens),
    })
