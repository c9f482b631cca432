"""Whether a structured answer is what was asked for: JSON that parses, and, where a JSON Schema
was given, valid against it (Draft 2020-12, through the jsonschema package)."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from loadgen.scenario.answer_schema import answer_validator


@functools.lru_cache(maxsize=16)
def _validator(schema: str) -> Any:
    return answer_validator(orjson.loads(schema))  # (references inside the schema only; nothing fetched)


def valid_json(answer: str, schema: str) -> bool:
    """``answer`` parses as JSON (an object where no schema is given) and, with ``schema`` (JSON
    text; "" for none), is valid against it."""
    try:
        value = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return False
    if not schema:
        return isinstance(value, dict)
    return bool(_validator(schema).is_valid(value))
