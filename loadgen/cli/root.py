"""The root of the command line: the application, its --version, and the entry point."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from loadgen import __version__
from loadgen.cli.console import out


def _plain_metavars(params: list[Any]) -> None:
    """Help shows what to type, never a Python type: a flag shows nothing after its name, any
    other option without a metavar of its own its name in capitals (``--base-url BASE_URL``)."""
    for param in params:
        if isinstance(param, TyperArgument):
            # an argument's name is its metavar already; its type column would be a Python type
            # and the usage line reads ``RUN_DIR...`` / ``[SCENARIO]``, not ``{RUN_DIRS}...``
            param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]
            param._usage_display_name = _usage_name(param)  # type: ignore[method-assign]
        if not isinstance(param, TyperOption | TyperArgument) or param.metavar is not None:
            continue
        if isinstance(param, TyperOption) and (param.is_flag or param.count):
            param.metavar = ""
        else:
            param.metavar = (param.name or "value").upper()


def _usage_name(param: TyperArgument) -> Callable[[], str]:
    def name() -> str:
        text = param.metavar or (param.name or "value").upper()
        text = text + ("..." if param.nargs != 1 else "")
        return text if param.required else f"[{text}]"
    return name


def flowing(text: str | None) -> str | None:
    """A docstring's paragraphs as running text: the terminal wraps them at its own width (its
    line breaks kept, they cut a paragraph at 80 columns into ragged pieces: "the others wait in
    arrival" / "order."). A paragraph of one line (a command to type) is kept as it is."""
    if text is None:
        return None
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


class _PlainHelp:
    """Plain metavars in a command's help, the --help flag's included; its text flowing."""

    params: list[Any]
    help: str | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _plain_metavars(self.params)
        self.help = flowing(self.help)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        _plain_metavars([option])
        return option


class Command(_PlainHelp, TyperCommand):
    """A loadgen command."""


class Group(_PlainHelp, TyperGroup):
    """The root and ``bench``."""


# ``--set``, as every command that reads a scenario takes it
Overrides = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="KEY=VALUE",
        help="override a scenario key (repeatable), e.g. --set load.concurrency=[1,8] --set seed=1",
    ),
]


app = typer.Typer(
    cls=Group,
    name="loadgen",
    help="Load testing and benchmarking for OpenAI-compatible LLM inference servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        out().print(f"loadgen {__version__}")
        raise typer.Exit()


@app.callback(cls=Group)
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    pass

