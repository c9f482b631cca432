"""Every command's help lists every option it takes, each with a metavar a user can type (no
Python type names) and a line of help."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from loadgen.cli import app

PYTHON_TYPE = re.compile(r"<(?:bool|str|int|float|path|list\[[^\]]*\]|Path|dict)[^>]*>|\{[a-z_]+\}")


def _commands() -> list[tuple[list[str], Any]]:
    root = typer.main.get_command(app)
    found: list[tuple[list[str], Any]] = [([], root)]
    todo = [([], root)]
    while todo:
        path, cmd = todo.pop()
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                found.append(([*path, name], sub))
                todo.append(([*path, name], sub))
    return found


COMMANDS = [(path, cmd) for path, cmd in _commands() if cmd.add_help_option]


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _ in _commands()}
    assert {"run", "report", "compare", "sim", "models", "serve", "setup", "engines", "locust", "bench serve"} <= names


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) or "loadgen" for p, _ in COMMANDS])
def test_help_lists_every_option_with_a_plain_metavar(path: list[str], cmd: Any) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300"}, terminal_width=300)
    assert result.exit_code == 0, result.output
    text = result.output
    assert not PYTHON_TYPE.search(text), PYTHON_TYPE.search(text)
    for param in cmd.params:
        if param.param_type_name == "option":
            if param.hidden:
                continue
            assert any(o in text for o in param.opts), f"{param.opts} missing from `loadgen {' '.join(path)} --help`"
            assert param.help, f"{param.opts} has no help"
            if not param.is_flag:
                # a value's metavar: capitals or a pattern such as BY[:MIN:MAX], never a type
                line = next(line for line in text.splitlines() if line.startswith("│")
                            and param.opts[-1] in line[:40].split())
                assert re.match(r"\s+(-\w\s+)?[A-Z][A-Z_:=\[\].]*\s", line.split(param.opts[-1], 1)[1]), line


def test_repeatable_options_say_so() -> None:
    for path, cmd in COMMANDS:
        for param in cmd.params:
            if param.param_type_name == "option" and param.multiple:
                assert "repeatable" in (param.help or ""), f"loadgen {' '.join(path)} {param.opts}"


def test_locust_help_names_loadgen_options() -> None:
    text = CliRunner().invoke(app, ["locust", "--help"], env={"COLUMNS": "300"}, terminal_width=300).output
    for option in ("--scenario", "--set", "--step-time", "--host", "--out", "--shape"):
        assert option in text


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=[" ".join(p) or "loadgen" for p, _ in COMMANDS])
def test_the_help_text_flows_at_80_columns(path: list[str], cmd: Any) -> None:
    """A paragraph of help fills the narrow terminal's lines: the docstring's own line breaks
    (kept by the help before) cut it into ragged pieces ("the others wait in arrival" / "order.")."""
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    usage = next(i for i, line in enumerate(lines) if "Usage:" in line)
    end = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    prose = "\n".join(line.strip() for line in lines[usage + 1:end]).strip()
    for paragraph in prose.split("\n\n"):
        rows = paragraph.splitlines()
        for row, following in zip(rows, rows[1:], strict=False):
            # a row ends short only where the next word would not have fitted on it
            assert len(row) + 1 + len(following.split()[0]) > 78, (row, following)
