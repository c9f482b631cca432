"""The ``loadgen`` command's entry: the command line is imported under a Ctrl-C guard, so that an
interrupt in its first half second (while it loads) ends as one later does: "interrupted", exit
130, no traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from loadgen.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    run()
