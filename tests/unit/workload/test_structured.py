"""Structured output by hand: the request fields each API takes, and the check of an answer."""

from __future__ import annotations

import orjson
import pytest

from loadgen.scenario.loader import parse_scenario
from loadgen.servers.openai.structured import answer_tokens
from loadgen.workload.payload import format_fields, structured_of
from loadgen.workload.structured import valid_json

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
          "required": ["city", "population"]}


def test_each_api_gets_the_format_as_it_asks_for_it() -> None:
    fmt = parse_scenario({"workload": {"response_format": {"type": "json_schema", "schema": SCHEMA}}}
                         ).workload.response_format
    assert fmt is not None
    spec = {"name": "answer", "schema": SCHEMA, "strict": True}
    assert format_fields("chat", fmt) == {"response_format": {"type": "json_schema", "json_schema": spec}}
    assert format_fields("completions", fmt) == {"response_format": {"type": "json_schema", "json_schema": spec}}
    assert format_fields("responses", fmt) == {"text": {"format": {"type": "json_schema", **spec}}}
    plain = parse_scenario({"workload": {"response_format": {"type": "json_object"}}}).workload.response_format
    assert plain is not None
    assert format_fields("chat", plain) == {"response_format": {"type": "json_object"}}
    assert structured_of(plain) == ""
    assert orjson.loads(structured_of(fmt) or "") == SCHEMA


def test_an_answer_is_checked_against_its_schema() -> None:
    schema = orjson.dumps(SCHEMA).decode()
    assert valid_json('{"city": "Lyon", "population": 513275}', schema)
    assert not valid_json('{"city": "Lyon"}', schema)  # a required property missing
    assert not valid_json('{"city": "Lyon", "population": "many"}', schema)  # of the wrong type
    assert not valid_json("Lyon has 513,275 people", schema)
    assert valid_json('{"anything": 1}', "")
    assert not valid_json("[1, 2]", "")  # json_object: an object


@pytest.mark.parametrize("count", [1, 2, 7])
def test_the_simulators_json_is_as_long_as_asked_and_meets_the_schema(count: int) -> None:
    tokens = answer_tokens({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}, count)
    assert tokens is not None
    assert len(tokens) == count
    assert valid_json("".join(tokens), orjson.dumps(SCHEMA).decode())
    assert answer_tokens({}, count) is None
