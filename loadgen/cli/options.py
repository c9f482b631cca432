"""Command-line options made from a pydantic model's fields, so that each option is declared
once: ``--kv-cache-dtype`` is ``EngineOptions.kv_cache_dtype`` with its description as help.

``options_from(Model)`` turns a command function that takes ``**options`` into one whose
signature lists an option per field (typer reads the signature); the command then builds the
model from what it received.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from loadgen.scenario.serve import flag


def _cli_type(annotation: Any) -> Any:
    """The type typer parses: str, int, float, bool, or one of them repeated (a choice of
    literals is parsed as its type; the model checks the choice, and the help names them)."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _cli_type(args[0]) | None
    if origin is Literal:
        return type(get_args(annotation)[0])
    if origin in (tuple, dict):
        return list[str] | None  # repeated; the command turns the texts into the field's value
    return annotation


def options_from(
    model: type[BaseModel], *, skip: tuple[str, ...] = (), defaults: Mapping[str, Any] | None = None,
    helps: Mapping[str, str] | None = None, metavars: Mapping[str, str] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add one ``--option`` per field of ``model`` (less ``skip``; the flag is ``flag(field)``) to a
    command taking ``**options``; ``defaults``, ``helps`` and ``metavars`` replace a field's own on
    the command line. A list or mapping field is a repeatable option of texts."""
    defaults, helps, metavars = dict(defaults or {}), dict(helps or {}), dict(metavars or {})

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(func)
        hints = get_type_hints(func, include_extras=True)
        params = [
            p.replace(annotation=hints.get(p.name, p.annotation))
            for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        for name, field in model.model_fields.items():
            if name in skip:
                continue
            kind = _cli_type(field.annotation)
            default = defaults.get(name, field.default if field.default is not PydanticUndefined else None)
            if get_origin(field.annotation) in (tuple, dict):
                default = None
            help_text = helps.get(name) or field.description or name.replace("_", " ")
            # a switch gets its "off" form too: one that is on by default can then be turned off
            names = f"{flag(name)}/--no-{flag(name)[2:]}" if kind is bool else flag(name)
            option = typer.Option(names, help=help_text, metavar=metavars.get(name))
            annotation = Annotated[kind, option]  # type: ignore[valid-type]
            hints[name] = annotation
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
        func.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        func.__annotations__ = hints
        return func

    return wrap
