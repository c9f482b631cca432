"""The command line: parse -> load -> run -> render. The one place errors become exit codes.

Exit codes: 0 ok, 1 unexpected loadgen error, 2 bad input, 3 server unusable,
4 aborted by an abort rule, 130 interrupted (the run directory holds what was measured).
"""

from __future__ import annotations

from loadgen.servers.launch import stops_interrupt

# the commands register themselves on the application, in the order `loadgen --help` lists them
# isort: off
from loadgen.cli import running, reports, serving  # noqa: F401
# isort: on
from loadgen.cli.root import app

__all__ = ["app", "main"]


def main() -> None:
    # SIGTERM and a closed terminal (SIGHUP) stop loadgen as Ctrl-C does, in every phase: runs
    # finish their directory, engines loadgen launched are stopped, no half-written file stays
    stops_interrupt()
    app()
