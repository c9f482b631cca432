"""Request and response bodies of ``/v1/completions`` and ``/v1/chat/completions`` as an
OpenAI-compatible server writes them (vLLM's shapes: a role-only first chat delta, usage in
a last chunk with empty choices, cumulative usage per chunk on request)."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from loadgen.data import RequestBody
from loadgen.servers.openai.rules import Ask, error_body


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def models_list(name: str, created: int, max_model_len: int) -> bytes:
    """The ``/v1/models`` answer of a server that serves one model."""
    return orjson.dumps({"object": "list", "data": [{
        "id": name, "object": "model", "created": created, "owned_by": "loadgen", "max_model_len": max_model_len,
    }]})


def error(message: str, kind: str = "BadRequestError", code: int = 400) -> bytes:
    """An error body as vLLM writes it (``{"error": {message, type, param, code}}``)."""
    return error_body(message, kind, code)


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
    completion_tokens: int, words: list[str] | None = None, ask: Ask | None = None, cached: int | None = None,
    tool_call: tuple[str, str] | None = None,
) -> bytes:
    """A non-streamed answer: ``ask.n`` choices holding the whole text (with log-probabilities of
    ``words`` when asked), and the usage of them all."""
    n = ask.n if ask is not None else 1
    logprobs = ask.logprobs if ask is not None else None
    choices = []
    for index in range(n):
        choice: dict[str, object] = {"index": index, "finish_reason": finish}
        if finish == "stop" and ask is not None and ask.stop:
            choice["stop_reason"] = next((s for s in ask.stop if s), None)
        if chat and tool_call is not None:  # the answer calls a function (name, arguments)
            choice["message"] = {"role": "assistant", "content": None, "tool_calls": [{
                "id": f"call_{id_[-16:]}", "type": "function",
                "function": {"name": tool_call[0], "arguments": tool_call[1]}}]}
            choice["finish_reason"] = "tool_calls"
            choice["logprobs"] = None
        elif chat:
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = None if logprobs is None else {"content": [
                {"token": w, "logprob": -1.0, "bytes": list(w.encode()),
                 "top_logprobs": [{"token": w, "logprob": -1.0, "bytes": list(w.encode())}][:logprobs]}
                for w in words or ()]}
        else:
            choice["text"] = text
            choice["logprobs"] = None if logprobs is None else {
                "text_offset": [sum(len(x) for x in (words or [])[:i]) for i in range(len(words or []))],
                "token_logprobs": [-1.0 for _ in words or ()], "tokens": list(words or ()),
                "top_logprobs": [{w: -1.0} if logprobs else {} for w in words or ()],
            }
        choices.append(choice)
    total = usage(prompt_tokens, completion_tokens * n)
    return orjson.dumps({
        "id": id_, "object": object_name(chat, streamed=False), "created": created, "model": model,
        "choices": choices,
        "usage": {**total, "prompt_tokens_details": None if cached is None else {"cached_tokens": cached}},
    })
