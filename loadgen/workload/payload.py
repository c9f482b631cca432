"""The one place that builds request bodies, for both APIs.

Pure functions only: the asyncio client and the Locust user both use them.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote

import orjson

from loadgen.data import RequestBody
from loadgen.errors import UsageError
from loadgen.scenario.shapes import ResponseFormat
from loadgen.scenario.target import Sampling, Target
from loadgen.scenario.wire import ENV_REF, header_problem

Api = Literal["completions", "chat", "responses", "embeddings"]
ENDPOINTS: dict[str, str] = {"completions": "/completions", "chat": "/chat/completions", "responses": "/responses",
                             "embeddings": "/embeddings"}


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request ready to send: its body is serialised before the measured window."""

    cell: int
    body: bytes
    input_tokens: int | None
    max_tokens: int
    warmup: bool = False
    turn: int | None = None  # the turn of a multi-turn session
    # structured output: the answer's JSON Schema as JSON text ("" for any JSON object), checked
    structured: str | None = None
    image_bytes: int = 0  # the images it carries, in bytes (before base64)
    embeddings: int = 0  # an embeddings request: its inputs (its answer is one JSON body, not a stream)
    # a session file's turn: the functions its answer is expected to call (None: not said)
    expect_calls: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt: token ids (completions only), text, or chat messages."""

    input_tokens: int | None
    token_ids: tuple[int, ...] | None = None
    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    images: tuple[str, ...] = ()  # data URLs sent after the text (chat)
    inputs: tuple[str, ...] = ()  # an embeddings request's texts


def api_key(target: Target) -> str | None:
    """The API key, from the environment variable the scenario names (never from the file),
    without the spaces or line break around it that ``echo`` into a file leaves; a key with a
    line break or control character inside is refused without being shown."""
    value = os.environ.get(target.api_key_env) if target.api_key_env else None
    if value is None:
        return None
    key = value.strip()
    if any(ord(c) < 32 or ord(c) == 127 for c in key):
        raise UsageError(
            f"{target.api_key_env}: the API key in this variable holds a line break or control character; "
            "set it to the key alone"
        )
    return key or None


def auth_headers(target: Target, key: str | None) -> dict[str, str]:
    """The headers of every request: JSON, the scenario's own (a value written ``${NAME}`` read
    from that environment variable), and the bearer key."""
    headers = {"Content-Type": "application/json"}
    for name, value in target.headers.items():
        if (ref := ENV_REF.match(value)) is not None:
            value = os.environ.get(ref["name"], "").strip()
            if not value:
                raise UsageError(f"target.headers.{name}: set the variable {ref['name']} (its value is the header's)")
            if (why := header_problem(name, value)) is not None:
                raise UsageError(f"{ref['name']}: {why}")
        headers[name] = value
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def with_basic_auth(headers: dict[str, str], userinfo: str | None) -> dict[str, str]:
    """``user:password`` of a URL sent as HTTP basic auth, as browsers and curl send it, unless
    the headers carry an ``Authorization`` already (a key, or the scenario's own)."""
    if not userinfo or "Authorization" in headers:
        return headers
    return {**headers, "Authorization": "Basic " + base64.b64encode(unquote(userinfo).encode()).decode()}


def build_payload(
    api: Api,
    model: str,
    prompt: Prompt,
    max_tokens: int,
    *,
    sampling: Sampling,
    ignore_eos: bool = True,
    min_tokens: bool = True,
    continuous_usage_stats: bool = True,
    target: Target | None = None,
    response_format: ResponseFormat | None = None,
    tools: tuple[dict[str, object], ...] = (),
    tool_choice: str | dict[str, object] | None = None,
) -> RequestBody:
    """The JSON body of one streaming request with its output length forced; the target's
    ``extra_body`` is merged last (it may set any field, the sampling ones included)."""
    body: RequestBody = {"model": model}
    if api == "embeddings":  # no output and no stream: the texts, and the target's extras
        body["input"] = list(prompt.inputs) or [prompt.text or ""]
        body.update(target.extra_body if target is not None else {})
        return body
    if response_format is not None:
        body.update(format_fields(api, response_format))
    if tools:  # tools and tool_choice, as OpenAI and vLLM take them (flat on the Responses API)
        body["tools"] = [flat_tool(t) for t in tools] if api == "responses" else list(tools)
        if tool_choice is not None:
            body["tool_choice"] = flat_tool(tool_choice) if api == "responses" else tool_choice
    if api == "responses":
        _responses_input(body, prompt, max_tokens)
    elif api == "chat":
        if prompt.messages is not None:
            body["messages"] = list(prompt.messages)
        elif prompt.text is not None and prompt.images:  # the text, then each image as an image_url part
            body["messages"] = [{"role": "user", "content": [{"type": "text", "text": prompt.text}, *(
                {"type": "image_url", "image_url": {"url": url}} for url in prompt.images)]}]
        elif prompt.text is not None:
            body["messages"] = [{"role": "user", "content": prompt.text}]
        else:
            raise ValueError("a chat request needs text or messages, not token ids")
    else:
        if prompt.token_ids is not None:
            body["prompt"] = list(prompt.token_ids)
        elif prompt.text is not None:
            body["prompt"] = prompt.text
        else:
            raise ValueError("a completions request needs token ids or text, not messages")
    param = target.max_tokens_param if target is not None else "auto"
    if api == "chat" and param != "max_tokens":
        body["max_completion_tokens"] = max_tokens
    if api not in ("chat", "responses") or (api == "chat" and param != "max_completion_tokens"):
        body["max_tokens"] = max_tokens
    # vLLM's extras force the length (on the Responses API too; a server without them ignores them)
    if ignore_eos:
        body["ignore_eos"] = True
    if min_tokens:
        body["min_tokens"] = max_tokens
    body["stream"] = True
    if api != "responses":  # the Responses API's usage comes with its last event: no stream options
        options: dict[str, bool] = {"include_usage": True}
        if continuous_usage_stats:
            options["continuous_usage_stats"] = True
        body["stream_options"] = options
    body.update(sampling.model_dump(exclude_none=True))
    if target is not None and target.extra_body:
        body.update(target.extra_body)
    return body


def format_fields(api: Api, fmt: ResponseFormat) -> RequestBody:
    """Structured output as each API asks for it: ``response_format`` (chat and completions, as
    OpenAI and vLLM take it), or the Responses API's ``text.format``."""
    if fmt.type == "json_object":
        spec: RequestBody = {"type": "json_object"}
    else:
        spec = {"type": "json_schema", "name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict}
    if api == "responses":
        return {"text": {"format": spec}}
    if fmt.type == "json_schema":  # chat and completions nest the schema under json_schema
        spec = {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if k != "type"}}
    return {"response_format": spec}


def structured_of(fmt: ResponseFormat | None) -> str | None:
    """What a request's answer is checked against: its schema as JSON text, "" for any JSON
    object, None when no structure was asked for."""
    if fmt is None:
        return None
    return "" if fmt.json_schema is None else orjson.dumps(fmt.json_schema).decode()


def _responses_input(body: RequestBody, prompt: Prompt, max_tokens: int) -> None:
    """OpenAI's Responses API (``POST /v1/responses``): the prompt as ``input`` (text, or the
    conversation's messages), its length as ``max_output_tokens``."""
    if prompt.messages is not None:
        body["input"] = [item for m in prompt.messages for item in response_items(m)]
    elif prompt.text is not None:
        body["input"] = prompt.text
    else:
        raise ValueError("a Responses API request needs text or messages, not token ids")
    body["max_output_tokens"] = max_tokens


def flat_tool(spec: Any) -> Any:
    """A chat tool definition or tool_choice as the Responses API takes it: the function's
    fields beside ``type`` (``{type: function, name, parameters}``); a mode stays as it is."""
    if isinstance(spec, dict) and isinstance(spec.get("function"), dict):
        return {"type": "function", **spec["function"]}
    return spec


def response_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message as Responses API input items: a tool's result is a
    ``function_call_output``; an answer's tool calls are ``function_call`` items after its text."""
    if message.get("role") == "tool":
        return [{"type": "function_call_output", "call_id": message.get("tool_call_id", ""),
                 "output": message.get("content", "")}]
    calls = message.get("tool_calls")
    if not calls:
        return [message]
    items: list[dict[str, Any]] = [{"role": "assistant", "content": message["content"]}] if message.get("content") \
        else []
    return items + [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                     "arguments": c["function"]["arguments"]} for c in calls]


def encode_payload(body: RequestBody) -> bytes:
    # an exact copy: the bytes orjson returns keep the buffer it wrote them in (8 KiB for a body
    # of 800 bytes), and a run holds every body of its pool: 1.8 GB for 200,000 prompts, not 0.2
    return memoryview(orjson.dumps(body)).tobytes()
