"""The reference pages of the docs, written from the code itself: every scenario key from the
scenario models (each field's docstring, or its ``description=``), every command and option from
the command line's own definitions. ``python -m loadgen.cli.reference docs/reference`` writes
them; a test fails when the committed pages differ from what this writes.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
import typing
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, PlainValidator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

GENERATED = "<!-- written by `python -m loadgen.cli.reference docs/reference`: edit the code, not this page -->"


# -- the scenario ----------------------------------------------------------------------------------
@cache
def _docstrings(cls: type) -> dict[str, str]:
    """A class's attribute docstrings: the string literal right under each annotated field."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for stmt, after in zip(body, body[1:], strict=False):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            out[stmt.target.id] = inspect.cleandoc(after.value.value)
    return out


def description(model: type[BaseModel], name: str) -> str | None:
    """What a field is for: its ``description=``, or the docstring under it in its class or a base."""
    field = model.model_fields[name]
    if field.description:
        return " ".join(field.description.split())
    for cls in model.__mro__:
        if isinstance(cls, type) and issubclass(cls, BaseModel) and name in _docstrings(cls):
            return " ".join(_docstrings(cls)[name].split())
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []
    stack = [annotation]
    while stack:
        t = stack.pop()
        if isinstance(t, type) and issubclass(t, BaseModel):
            out.append(t)
        else:
            stack.extend(reversed(typing.get_args(t)))
    return out


def sections(root: type[BaseModel]) -> list[tuple[str, type[BaseModel], list[str]]]:
    """Each model under ``root`` once, depth first: (its first key, the model, every key it sits at)."""
    order: list[type[BaseModel]] = []
    places: dict[type[BaseModel], list[str]] = {}

    def walk(model: type[BaseModel], key: str) -> None:
        seen = model in places
        if key not in places.setdefault(model, []):
            places[model].append(key)
        if seen:
            return
        order.append(model)
        for name, field in model.model_fields.items():
            for sub in _models_in(field.annotation):
                walk(sub, f"{key}.{field.alias or name}" if key else field.alias or name)

    walk(root, "")
    return [(places[m][0], m, places[m]) for m in order]


def _type_name(annotation: Any, field: FieldInfo | None = None) -> str:
    sweep = field is not None and any(isinstance(m, PlainValidator) for m in field.metadata)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if sweep and origin is tuple:
        inner = " or ".join(_type_name(a) for a in typing.get_args(args[0]) or (args[0],))
        return f"{inner}, or a list of them"
    if origin is Literal:
        names = [f"`{a}`" for a in args]
        return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (", or null" if type(None) in args else "")
    if origin is tuple:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    simple: dict[Any, str] = {int: "integer", float: "number", str: "text", bool: "true or false",
                               Path: "path", type(None): "null", Any: "any"}
    return simple.get(annotation) or str(getattr(annotation, "__name__", annotation))


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if value == "":
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return _yaml(value[0]) if len(value) == 1 else "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}" if not value else "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}" if abs(value) < 1e6 else f"{value:.0e}"
    return str(value)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{_yaml(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def scenario_page() -> str:
    from loadgen.scenario.schema import Scenario

    out = [GENERATED, "", "# Scenario file", "",
           "Every key a scenario file may hold, with its type, its default and what it does. Unknown keys "
           "are refused, naming the file and the key. Any key can be set from the command line with "
           "`--set dotted.key=value` (the value read as YAML).", ""]
    for key, model, keys in sections(Scenario):
        title = f"`{key}`" if key else "The top level"
        out += [f"## {title}", ""]
        if len(keys) > 1:
            out += ["Also at " + ", ".join(f"`{k}`" for k in keys[1:]) + ".", ""]
        if doc := model.__dict__.get("__doc__"):  # its own, not a base's
            out += [" ".join(inspect.cleandoc(doc).replace("``", "`").split()), ""]
        out += ["| key | type | default | what it does |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            shown = field.alias or name
            out.append(f"| `{shown}` | {_cell(_type_name(field.annotation, field))} | {_cell(_default(field))} "
                       f"| {_cell(description(model, name) or '')} |")
        out.append("")
    return "\n".join(out)


def missing_descriptions() -> list[str]:
    """Every scenario key without a description (a test keeps this empty)."""
    from loadgen.scenario.schema import Scenario

    return [f"{key or 'top level'}: {name}" for key, model, _ in sections(Scenario)
            for name in model.model_fields if not description(model, name)]


# -- the command line ------------------------------------------------------------------------------
def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    out = [(path, command)]
    for name, sub in getattr(command, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            out += _commands(sub, [*path, name])
    return out


def _option_row(param: Any) -> str:
    names = ", ".join(f"`{n}`" for n in (*param.opts, *param.secondary_opts))
    metavar = param.metavar or ""
    if param.param_type_name == "argument":
        names = f"`{metavar or (param.name or '').upper()}`"
        metavar = ""
    help_text = " ".join((getattr(param, "help", None) or "").split())
    default = param.default
    shown = ""
    hidden = default is None or default is False or default in ((), []) or callable(default)
    if not hidden and getattr(param, "show_default", True) is not False:
        shown = f"`{_yaml(default)}`"
    required = " (required)" if param.required else ""
    return f"| {names}{' ' + _cell(metavar) if metavar else ''}{required} | {_cell(help_text)} | {_cell(shown)} |"


def cli_page() -> str:
    import typer

    from loadgen.cli import app

    root = typer.main.get_command(app)
    out = [GENERATED, "", "# Command line", "",
           "Every command and option, as `loadgen COMMAND --help` gives them. Exit codes: 0 done, "
           "1 an unexpected error in loadgen, 2 bad input, 3 the server unusable, 4 ended by an abort "
           "rule, 130 interrupted (the run directory holds what was measured).", ""]
    for path, command in _commands(root, ["loadgen"])[1:]:
        if getattr(command, "commands", None):
            out += [f"## `{' '.join(path)}`", "", " ".join((command.help or "").split()), ""]
            continue
        out += [f"## `{' '.join(path)}`", ""]
        for paragraph in (command.help or "").strip().split("\n\n"):
            if paragraph.startswith("loadgen "):  # a command to type
                out += ["```", paragraph, "```", ""]
            elif paragraph:
                out += [" ".join(paragraph.split()), ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            out += ["| option | what it does | default |", "|---|---|---|"]
            out += [_option_row(p) for p in params]
            out.append("")
    return "\n".join(out)


PAGES = {"scenario.md": scenario_page, "cli.md": cli_page}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m loadgen.cli.reference DIRECTORY\n")
        return 2
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    for name, page in PAGES.items():
        (directory / name).write_text(page())
        print(directory / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
