"""The console: where output goes, how errors become exit codes."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from loadgen.errors import LaunchError, LoadgenError

if TYPE_CHECKING:
    from loadgen.results.summary import Summary

F = TypeVar("F", bound=Callable[..., Any])


# control characters shown as what they are (\x1b) instead of acted on: a server's error text or
# model name may carry escape sequences that would recolour, retitle or clear the terminal
VISIBLE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0)) if chr(c) not in "\n\t"}


class _Console(Console):
    """Rich's console, printing no control character it did not put there itself (its own
    styles and cursor moves are segments' styles and controls, never their text)."""

    def _render_buffer(self, buffer: Any) -> str:
        return super()._render_buffer(
            seg if seg.control else seg._replace(text=seg.text.translate(VISIBLE)) for seg in buffer)


@functools.cache
def _console(stderr: bool) -> Console:
    # piped output is never wrapped or squeezed: a wide fixed layout instead of rich's 80-column fallback
    stream = sys.stderr if stderr else sys.stdout
    return _Console(stderr=stderr, width=None if stream.isatty() else 400)


def out() -> Console:
    return _console(False)


def err() -> Console:
    return _console(True)


def handles_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except LoadgenError as exc:
            # user text is printed as it is: no Rich markup, so "[transformers]" stays in the message
            err().print(Text.assemble(("error:", "bold red"), " ", str(exc)), highlight=False, soft_wrap=True)
            if isinstance(exc, LaunchError) and exc.log_tail:
                err().print("--- log tail ---", style="dim")
                err().print(exc.log_tail, markup=False, highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err().print("interrupted", highlight=False)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def print_summary(summary: Summary) -> None:
    # (the renderers are imported here: a command that prints no table starts without them)
    from loadgen.report.summary import console_tables

    for item in console_tables(summary, out().width):
        if isinstance(item, str):
            print_text(item)  # a line of figures is never wrapped: it may go to a file or a pipe
        else:
            out().print(item, highlight=False)



def print_text(text: str) -> None:
    out().print(text, markup=False, highlight=False, soft_wrap=True)
