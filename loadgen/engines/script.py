"""A launch as a standalone shell script (``loadgen serve ... --script``): the exact engine
command, its environment and GPU pinning, runnable without loadgen. The scripts in the
repository's top-level ``servers/`` are these files; a test regenerates each one from the
command on its second line and compares them byte for byte.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from loadgen.servers.launch import LaunchSpec


def _program(argv0: str) -> str:
    """The program as a script on another machine finds it: this interpreter becomes
    ``$PYTHON`` (default python3); other absolute paths their name on ``PATH``."""
    if argv0 == sys.executable:
        return '"${PYTHON:-python3}"'
    if Path(argv0).is_absolute():
        return shlex.quote(Path(argv0).name)
    return shlex.quote(argv0)


def _one_line(text: str) -> str:
    """Text for a ``#`` comment: a line break in an argument would end the comment and run the
    rest as a command, so line breaks are written as ``\\n``."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def launch_script(launch: LaunchSpec, command: str, about: str) -> str:
    """``#!/usr/bin/env bash``, the loadgen command that wrote it, what it starts, the
    environment as exports, then ``exec`` of the engine (extra arguments appended)."""
    lines = [
        "#!/usr/bin/env bash",
        f"# {_one_line(command)}",
        f"# {_one_line(about)}",
        f"# Serves an OpenAI-compatible API at {launch.base_url}; extra arguments go to the engine.",
        "set -euo pipefail",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in launch.env.items()]
    args = " ".join(shlex.quote(a) for a in launch.argv[1:])
    lines.append(f'exec {_program(launch.argv[0])} {args} "$@"')
    return "\n".join(lines) + "\n"
