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
from collections import OrderedDict
from typing import Any

import orjson

from loadgen.data import RequestBody
from loadgen.servers.openai.protocol import request_body
from loadgen.servers.openai.rules import RequestRefused


class Stored:
    """The conversations of stored responses (``store``, OpenAI's default), by response id, for
    a later request's ``previous_response_id``; the oldest dropped past ``limit``."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self.held: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def get(self, id_: str) -> list[dict[str, Any]]:
        if id_ not in self.held:
            raise RequestRefused(f"Response with id '{id_}' not found.", 404, "NotFoundError", "previous_response_id")
        return self.held[id_]

    def keep(self, id_: str, messages: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        self.held[id_] = [*messages, answer]
        while len(self.held) > self.limit:
            self.held.popitem(last=False)


def _item_message(item: object, messages: list[dict[str, Any]]) -> None:
    """One ``input`` item as chat messages: a message, a function call (on the answer before it,
    or an answer of its own) or a function call's output (a tool message)."""
    if not isinstance(item, dict):
        raise ValueError("input: each item must be an object")
    kind = item.get("type")
    if kind == "function_call":
        call = {"id": str(item.get("call_id", "")), "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments", ""))}}
        if messages and messages[-1]["role"] == "assistant":
            messages[-1] = {**messages[-1], "tool_calls": [*messages[-1].get("tool_calls", []), call]}
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        return
    if kind == "function_call_output":
        messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                         "content": str(item.get("output", ""))})
        return
    if not isinstance(item.get("role"), str):
        raise ValueError("input: each item needs a role and content")
    content = item.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise ValueError("input: an item's content must be text or a list of input_text parts")
    messages.append({"role": item["role"], "content": content})


def chat_body(body: RequestBody, stored: Stored | None = None) -> RequestBody:
    """The chat request a Responses API request amounts to: the conversation of
    ``previous_response_id`` (when given), then ``input`` (text, or items: messages whose
    content is text or ``input_text`` parts, function calls and their outputs) as messages;
    ``max_output_tokens`` as max_tokens; flat tool definitions and tool_choice as chat's."""
    given = body.get("input")
    messages: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if isinstance(previous, str) and stored is not None:
        messages = list(stored.get(previous))
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            _item_message(item, messages)
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
    if isinstance(tools := body.get("tools"), list):
        out["tools"] = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                        for t in tools if isinstance(t, dict)]
        choice = body.get("tool_choice", "auto")
        out["tool_choice"] = ({"type": "function", "function": {"name": choice.get("name")}}
                              if isinstance(choice, dict) else choice)
    return out


def response_id() -> str:
    return f"resp_{uuid.uuid4().hex[:24]}"


def response_usage(prompt: int, output: int, reasoning: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": prompt + output}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def response_object(
    id_: str, model: str, status: str, text: str | None = None, usage: dict[str, Any] | None = None,
    message_id: str = "", call: dict[str, Any] | None = None,
) -> dict[str, Any]:
    output = [call] if call is not None else [] if text is None else [{
        "id": message_id, "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }]
    return {"id": id_, "object": "response", "created_at": int(time.time()), "status": status, "model": model,
            "output": output, "usage": usage}


def answer_message(text: str, call: dict[str, Any] | None) -> dict[str, Any]:
    """A response's answer as the chat message a later turn's conversation holds."""
    if call is None:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": "", "tool_calls": [{"id": call["call_id"], "type": "function", "function": {
        "name": call["name"], "arguments": call["arguments"]}}]}


def whole_response(id_: str, model: str, text: str, usage: dict[str, Any], call: dict[str, Any] | None) -> bytes:
    return orjson.dumps(response_object(id_, model, "completed", text, usage, f"msg_{uuid.uuid4().hex[:24]}", call))


class EventWriter:
    """The events of one streamed response, numbered as the API numbers them: a message's text
    deltas, or (``name`` given) a function call's argument deltas, its item added with the first."""

    def __init__(self, send: Any, model: str, id_: str, name: str | None = None) -> None:
        self.send, self.model, self.id, self.name = send, model, id_, name
        self.message = f"fc_{uuid.uuid4().hex[:24]}" if name else f"msg_{uuid.uuid4().hex[:24]}"
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"
        self.sequence = 0
        self.text: list[str] = []

    async def event(self, kind: str, fields: dict[str, Any], more: bool = True) -> None:
        data = orjson.dumps({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        await self.send({"type": "http.response.body", "body": b"event: " + kind.encode() + b"\ndata: " + data
                         + b"\n\n", "more_body": more})

    async def opening(self) -> None:
        await self.event("response.created", {"response": response_object(self.id, self.model, "in_progress")})
        if self.name is not None:  # a function call's item is added with its first arguments
            return
        await self.event("response.output_item.added", {"output_index": 0, "item": {
            "id": self.message, "type": "message", "status": "in_progress", "role": "assistant", "content": []}})
        await self.event("response.content_part.added", {"item_id": self.message, "output_index": 0,
                                                         "content_index": 0, "part": {"type": "output_text",
                                                                                      "text": "", "annotations": []}})

    def call(self, status: str) -> dict[str, Any] | None:
        if self.name is None:
            return None
        return call_item(self.message, self.call_id, self.name, "".join(self.text), status)

    async def delta(self, text: str, reasoning: bool) -> None:
        where = {"item_id": self.message, "output_index": 0}
        if reasoning:
            await self.event("response.reasoning_text.delta", {**where, "content_index": 0, "delta": text})
            return
        if self.name is not None:
            if not self.text:
                await self.event("response.output_item.added", {"output_index": 0, "item": self.call("in_progress")})
            self.text.append(text)
            await self.event("response.function_call_arguments.delta", {**where, "delta": text})
            return
        self.text.append(text)
        await self.event("response.output_text.delta", {**where, "content_index": 0, "delta": text, "logprobs": []})

    async def closing(self, usage: dict[str, Any]) -> None:
        text = "".join(self.text)
        where = {"item_id": self.message, "output_index": 0, "content_index": 0}
        if (call := self.call("completed")) is not None:
            await self.event("response.function_call_arguments.done", {"item_id": self.message, "output_index": 0,
                                                                      "arguments": text})
            await self.event("response.output_item.done", {"output_index": 0, "item": call})
        else:
            await self.event("response.output_text.done", {**where, "text": text, "logprobs": []})
            await self.event("response.content_part.done", {**where, "part": {"type": "output_text", "text": text,
                                                                                "annotations": []}})
            await self.event("response.output_item.done", {"output_index": 0, "item": response_object(
                self.id, self.model, "completed", text, None, self.message)["output"][0]})
        done = response_object(self.id, self.model, "completed", text, usage, self.message, call)
        await self.event("response.completed", {"response": done}, more=False)


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

