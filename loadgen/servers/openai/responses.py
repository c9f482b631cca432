"""OpenAI's Responses API (``POST /v1/responses``) for loadgen's simulator: the request read as
the chat request it amounts to, and the answer written as the Responses API writes it, whole or
as a stream of typed events (``response.created``, ``response.output_item.added``,
``response.content_part.added``, a ``response.output_text.delta`` per chunk, or
``response.reasoning_text.delta`` while a reasoning model thinks, then the ``.done`` events and
``response.completed`` with the usage). The stream ends after ``response.completed``, with no
``[DONE]``."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from loadgen.data import RequestBody
from loadgen.servers.openai.protocol import request_body
from loadgen.servers.openai.rules import RequestRefused


def chat_body(body: RequestBody) -> RequestBody:
    """The chat request a Responses API request amounts to: ``input`` (text, or messages whose
    content is text or ``input_text`` parts) as messages, ``max_output_tokens`` as max_tokens."""
    given = body.get("input")
    if isinstance(given, str):
        messages = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        messages = []
        for item in given:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise ValueError("input: each item needs a role and content")
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise ValueError("input: an item's content must be text or a list of input_text parts")
            messages.append({"role": item["role"], "content": content})
    else:
        raise ValueError("input: give text or a list of messages")
    if isinstance(body.get("instructions"), str):
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    out: RequestBody = {"model": body.get("model"), "messages": messages, "stream": bool(body.get("stream"))}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):  # structured output, as chat asks for it
        out["response_format"] = text["format"]
    return out


def response_id() -> str:
    return f"resp_{uuid.uuid4().hex[:24]}"


def _usage(prompt: int, output: int, reasoning: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + output}


def response_object(
    id_: str, model: str, status: str, text: str | None = None, usage: dict[str, Any] | None = None,
    message_id: str = "",
) -> dict[str, Any]:
    output = [] if text is None else [{
        "id": message_id, "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }]
    return {"id": id_, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
            "output": output, "usage": usage}


def whole_response(model: str, text: str, prompt: int, output: int, reasoning: int, cached: int) -> bytes:
    return orjson.dumps(response_object(response_id(), model, "completed", text,
                                        _usage(prompt, output, reasoning, cached), f"msg_{uuid.uuid4().hex[:24]}"))


class EventWriter:
    """The events of one streamed response, numbered as the API numbers them."""

    def __init__(self, send: Any, model: str) -> None:
        self.send, self.model = send, model
        self.id, self.message = response_id(), f"msg_{uuid.uuid4().hex[:24]}"
        self.sequence = 0
        self.text: list[str] = []

    async def event(self, kind: str, fields: dict[str, Any]) -> None:
        data = orjson.dumps({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        await self.send({"type": "http.response.body", "body": b"event: " + kind.encode() + b"\ndata: " + data
                         + b"\n\n", "more_body": True})

    async def opening(self) -> None:
        await self.event("response.created", {"response": response_object(self.id, self.model, "in_progress")})
        await self.event("response.output_item.added", {"output_index": 0, "item": {
            "id": self.message, "type": "message", "status": "in_progress", "role": "assistant", "content": []}})
        await self.event("response.content_part.added", {"item_id": self.message, "output_index": 0,
                                                         "content_index": 0, "part": {"type": "output_text",
                                                                                      "text": "", "annotations": []}})

    async def delta(self, text: str, reasoning: bool) -> None:
        if reasoning:
            await self.event("response.reasoning_text.delta", {"item_id": self.message, "output_index": 0,
                                                               "content_index": 0, "delta": text})
            return
        self.text.append(text)
        await self.event("response.output_text.delta", {"item_id": self.message, "output_index": 0,
                                                        "content_index": 0, "delta": text, "logprobs": []})

    async def closing(self, prompt: int, output: int, reasoning: int, cached: int) -> None:
        text = "".join(self.text)
        where = {"item_id": self.message, "output_index": 0, "content_index": 0}
        await self.event("response.output_text.done", {**where, "text": text, "logprobs": []})
        await self.event("response.content_part.done", {**where, "part": {"type": "output_text", "text": text,
                                                                            "annotations": []}})
        await self.event("response.output_item.done", {"output_index": 0, "item": response_object(
            self.id, self.model, "completed", text, None, self.message)["output"][0]})
        done = response_object(self.id, self.model, "completed", text, _usage(prompt, output, reasoning, cached),
                               self.message)
        data = orjson.dumps({"type": "response.completed", "sequence_number": self.sequence, "response": done})
        await self.send({"type": "http.response.body", "body": b"event: response.completed\ndata: " + data + b"\n\n",
                         "more_body": False})


def embedding_inputs(raw: bytes, served: str) -> tuple[list[str] | RequestRefused, int]:
    """An embeddings request's texts and their tokens (a word each), or why it is refused."""
    try:
        body = request_body(raw)
    except (ValueError, TypeError) as exc:
        return RequestRefused(str(exc)), 0
    model = body.get("model")
    if model is not None and model != served:
        return RequestRefused(f"The model `{model}` does not exist.", 404, "NotFoundError", "model"), 0
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return RequestRefused("input: give a text or a list of texts", param="input"), 0
    return texts, sum(len(t.split()) for t in texts)


def embedding_answer(model: str, count: int, tokens: int) -> bytes:
    """``count`` vectors of 8 (the same for every input: what is measured is the time)."""
    data = [{"object": "embedding", "index": i, "embedding": [0.125 * (k + 1) for k in range(8)]} for i in range(count)]
    return orjson.dumps({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

