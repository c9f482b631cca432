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
