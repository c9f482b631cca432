"""The command line: parse -> load -> run -> render. The one place errors become exit codes.

Exit codes: 0 ok, 1 unexpected loadgen error, 2 bad input, 3 server unusable,
4 aborted by an abort rule, 130 interrupted (the run directory holds what was measured).
"""

from __future__ import annotations

import signal

# the commands register themselves on the application, in the order `loadgen --help` lists them
# isort: off
from loadgen.cli import running, reports, serving  # noqa: F401
# isort: on
from loadgen.cli.root import app

__all__ = ["app", "main"]


def main() -> None:
    # a closed terminal (SIGHUP) stops loadgen as Ctrl-C does: runs finish their directory,
    # engines loadgen launched are stopped
    signal.signal(signal.SIGHUP, signal.default_int_handler)
    app()
