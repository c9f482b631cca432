"""The simulator's Responses API answers (``POST /v1/responses``): each chunk at the time the
chat stream would send it, a message's text or a function call's arguments (where the request's
tools call for one), whole or as events; every answer kept for a later ``previous_response_id``
unless the request says ``store: false``."""

from __future__ import annotations

from typing import Any

from loadgen.data import RequestBody
from loadgen.servers.openai.asgi import hung_up, respond, start_stream
from loadgen.servers.openai.responses import EventWriter, answer_message, response_id, response_usage, whole_response
from loadgen.servers.openai.structured import answer_tokens, tool_call
from loadgen.workload.words import WORDS


async def respond_responses(app: Any, send: Any, body: RequestBody, timing: Any, given: RequestBody, prompt: int,
                            tokens: int, cached: int) -> bool:
    """A Responses API answer of ``tokens`` tokens (its first ``reasoning_tokens`` thinking) to
    ``body`` (the chat request ``given`` amounts to); False when the client hung up."""
    cfg = app.config
    thinking, step = min(cfg.reasoning_tokens, tokens), cfg.tokens_per_chunk
    call = tool_call(body)
    words = [" " + WORDS[i % len(WORDS)] for i in range(thinking)]
    if call is not None:  # the arguments are the answer's tokens (the item names the function)
        words += answer_tokens({"response_format": {"type": "json_schema", "json_schema": {"schema": call[1]}}},
                               tokens - thinking) or []
    else:
        words += app._structured(body, tokens - thinking) or [" " + WORDS[i % len(WORDS)]
                                                              for i in range(thinking, tokens)]
    id_ = response_id()
    usage = response_usage(prompt, tokens, thinking, cached)
    writer = EventWriter(send, cfg.model, id_, call[0] if call is not None else None)
    if not body.get("stream"):
        await app._sleep_until(timing.start + (tokens - 1) * timing.itl)
        app.stats.generation_tokens_total += tokens
        writer.text = words[thinking:]
        item = writer.call("completed")
        await respond(send, 200, whole_response(id_, cfg.model, "".join(words[thinking:]), usage, item))
        _keep(app, given, body, writer)
        return True
    await start_stream(send)
    await writer.opening()
    for start in range(0, tokens, step):
        end = min(start + step, tokens)
        await app._sleep_until(timing.start + (end - 1) * timing.itl)
        if hung_up(send):
            app.stats.requests_aborted += 1
            return False
        await writer.delta("".join(words[start:end]), end <= thinking)
        app.stats.generation_tokens_total += end - start
    await writer.closing(usage)
    _keep(app, given, body, writer)
    return True


def _keep(app: Any, given: RequestBody, body: RequestBody, writer: EventWriter) -> None:
    if given.get("store", True) is not False:
        app.stored.keep(writer.id, body["messages"], answer_message("".join(writer.text), writer.call("completed")))
