"""Structured answers for loadgen's simulator: a request with ``response_format`` (or the
Responses API's ``text.format``) gets JSON of exactly the tokens it is due. The answer's words go
into the first string property the schema requires (or ``answer``); every other required
property gets the plainest value of its type; a schema with no string property gets its JSON as
the last token, after whitespace tokens (JSON allows leading whitespace)."""

from __future__ import annotations

from typing import Any

import orjson

from loadgen.data import RequestBody
from loadgen.workload.words import WORDS

PLAIN: dict[str, Any] = {"string": "", "number": 0, "integer": 0, "boolean": False, "array": [], "object": {},
                         "null": None}
HOLE = "@@loadgen answer@@"  # where the words go: a string no schema default holds


def _schema(fmt: object) -> dict[str, Any] | None:
    """The JSON Schema a response_format asks for ({} for json_object); None: no structure."""
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_object":
        return {}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema", fmt)  # chat nests it; the Responses API does not
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return schema if isinstance(schema, dict) else {}
    return None


def answer_tokens(body: RequestBody, count: int) -> list[str] | None:
    """``count`` tokens whose text is one JSON value meeting the request's format; None when
    the request asks for none."""
    schema = _schema(body.get("response_format"))
    if schema is None:
        return None
    found = schema.get("properties")
    props: dict[str, Any] = found if isinstance(found, dict) else {}
    required = [k for k in schema.get("required", list(props)) if isinstance(k, str)]
    value = {k: PLAIN.get(str((props.get(k) or {}).get("type")), "") for k in required}
    text_key = next((k for k in required if (props.get(k) or {}).get("type") == "string"), None)
    if text_key is None and not props:
        text_key = "answer"
    if text_key is None or count < 2:
        whole = orjson.dumps(value).decode()
        return [" "] * (count - 1) + [whole]
    value[text_key] = HOLE
    before, after = orjson.dumps(value).decode().split(f'"{HOLE}"')
    words = [(" " if i else "") + WORDS[i % len(WORDS)] for i in range(count - 2)]
    return [before + '"', *words, '"' + after]


def tool_call(body: RequestBody) -> tuple[str, dict[str, Any]] | None:
    """The function a chat request with ``tools`` gets called (its name and parameters' schema):
    the one ``tool_choice`` names, else the first; None without tools, with ``tool_choice:
    none``, or with ``auto`` where the last message is not the user's (after a tool's result
    the answer is text, as an agent's model answers once it has what it asked for)."""
    tools = body.get("tools")
    choice = body.get("tool_choice", "auto")
    if not isinstance(tools, list) or not tools or choice == "none":
        return None
    messages = body.get("messages")
    if choice == "auto" and isinstance(messages, list) and messages and isinstance(messages[-1], dict) \
            and messages[-1].get("role") != "user":
        return None
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    wanted = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    function = next((f for f in functions if f.get("name") == wanted), functions[0] if functions else None)
    if function is None or not isinstance(function.get("name"), str):
        return None
    parameters = function.get("parameters")
    return function["name"], parameters if isinstance(parameters, dict) else {}


def call_tokens(name: str, parameters: dict[str, Any], count: int) -> list[str]:
    """``count`` tokens of a tool call: the function's name, then its arguments as JSON meeting
    the parameters' schema (all in one token where only one is due)."""
    if count < 2:
        return [name + "{}"]
    arguments = answer_tokens({"response_format": {"type": "json_schema", "json_schema": {"schema": parameters}}},
                              count - 1)
    return [name, *(arguments or [])]
