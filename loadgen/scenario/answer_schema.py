"""The JSON Schema a structured answer is checked against (``workload.response_format.schema``),
checked before a run: a valid Draft 2020-12 schema, whole in itself. A scenario file may come
from someone else, so a schema never makes the load host fetch anything: ``$ref`` may point only
into the schema (``#/$defs/NAME``), and the validator is built with a registry that retrieves
nothing (jsonschema would otherwise fetch an ``http://`` reference)."""

from __future__ import annotations

from typing import Any

REF_KEYS = ("$ref", "$dynamicRef")
MAX_NODES = 100_000  # a schema's objects and lists; far past any real answer's schema


def answer_validator(schema: Any) -> Any:
    """A Draft 2020-12 validator of ``schema`` whose references resolve inside it, or not at all."""
    import jsonschema
    from referencing import Registry
    from referencing.exceptions import NoSuchResource

    def retrieve(uri: str) -> Any:
        raise NoSuchResource(uri)

    registry: Any = Registry(retrieve=retrieve)  # type: ignore[call-arg]  # (attrs names it _retrieve)
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _outside_refs(schema: Any) -> str | None:
    """The first reference that points outside the schema, walked without recursion."""
    stack, seen = [schema], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return None  # (the size is the loader's business; nothing past this is fetched either)
        if isinstance(node, dict):
            for key in REF_KEYS:
                ref = node.get(key)
                if isinstance(ref, str) and not ref.startswith("#"):
                    return ref
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def answer_schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot check answers, in a phrase naming the fix; None where it can."""
    import jsonschema
    from referencing.exceptions import Unresolvable

    ref = _outside_refs(schema)
    if ref is not None:
        return (f"schema: $ref {ref!r} points outside the schema, and loadgen fetches nothing; "
                "put the definition under $defs and refer to it as #/$defs/NAME")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(map(str, exc.path))
        return f"schema{'.' + where if where else ''}: not a JSON Schema ({exc.message})"
    except RecursionError:
        return "schema: nested too deep to check"
    validator = answer_validator(schema)
    try:  # a reference that resolves to nothing, or to itself without end, shows on any value
        values: tuple[object, ...] = ({}, [], "", 0, None)
        for value in values:
            validator.is_valid(value)
    except Unresolvable as exc:
        pointer = getattr(getattr(exc, "_wrapped", exc), "ref", None)  # jsonschema wraps referencing's error
        named = f"#{pointer}" if isinstance(pointer, str) and not pointer.startswith("#") else pointer
        return f"schema: $ref {named!r} names nothing in the schema; define it under $defs"
    except RecursionError:
        return "schema: its $ref leads back to itself without end; give the reference something to check"
    return None
