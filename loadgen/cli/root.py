"""The root of the command line: the application, its --version, and the entry point."""

from __future__ import annotations

from typing import Annotated

import typer

from loadgen import __version__
from loadgen.cli.console import out

app = typer.Typer(
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


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")
    ] = False,
) -> None:
    pass

