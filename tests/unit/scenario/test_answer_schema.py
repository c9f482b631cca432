"""An answer's JSON Schema is checked before a run and resolves its references inside itself:
a scenario file from someone else never makes the load host fetch anything."""

from __future__ import annotations

import socket

import pytest
from referencing.exceptions import Unresolvable

from loadgen.scenario.answer_schema import answer_schema_problem, answer_validator

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_a_schema_that_refers_out_fetches_nothing_even_past_the_check() -> None:
    """The validator itself, given a reference to a listening address: it raises, and nobody
    connected (jsonschema alone would GET it)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/x.json"
    try:
        with pytest.raises(Unresolvable):
            answer_validator({"$ref": url}).is_valid({"city": "Paris"})
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert answer_schema_problem({"$ref": url}) is not None


@pytest.mark.parametrize(("schema", "problem"), [
    (CITY, None),
    ({"$defs": {"c": CITY}, "$ref": "#/$defs/c"}, None),
    ({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}, None),  # a tree
    ({"properties": {"a": {"$ref": "other.json#/x"}}}, "schema: $ref 'other.json#/x' points outside the schema"),
    ({"$ref": "#/$defs/c"}, "schema: $ref '#/$defs/c' names nothing in the schema; define it under $defs"),
    ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "schema: its $ref leads back to itself"),
    ({"type": "object", "required": "city"}, "schema.required: not a JSON Schema ('city' is not of type 'array')"),
])
def test_what_can_check_answers_and_what_cannot(schema: object, problem: str | None) -> None:
    got = answer_schema_problem(schema)
    assert (got is None) if problem is None else (got is not None and got.startswith(problem)), got



def test_a_reference_inside_the_schema_checks_as_its_definition() -> None:
    validator = answer_validator({"$defs": {"c": CITY}, "$ref": "#/$defs/c"})
    assert validator.is_valid({"city": "Paris"})
    assert not validator.is_valid({"city": 5})
    assert not validator.is_valid({})
